package sqlite

import (
	"fmt"
	"strings"
)

// queries holds the SQL of every operation, built once per store from the
// configured table names.
type queries struct {
	lockAcquire, lockHolder, lockRefresh, lockRelease, lockForce, lockGet, lockList string

	circFailure, circFailureGen, circSuccess, circSuccessGen, circProbe, circGet, circSet, circDelete, circList string

	cacheGet, cacheSet, cacheSetIfAbsent, cacheDelete, cacheHas, cacheClear, cacheKeys string

	idemGet, idemGetAny, idemInsert, idemReclaim, idemRenew, idemExtend, idemComplete,
	idemAbandon, idemSet, idemDelete, idemList string

	cpFenceSave, cpInsert, cpFence, cpFenceOf, cpLoad, cpLatest, cpList, cpCleanup, cpDeleteAll, cpTasks string

	purgeCache, purgeIdem, purgeLocks, purgeFences, purgeEvents string

	evSeq, evRead string
}

// sub replaces the table placeholders {L} {C} {K} {I} {P} {F} {E} by the
// quoted table names.
func sub(c config, s string) string {
	return strings.NewReplacer(
		"{L}", quote(c.locks),
		"{C}", quote(c.circuits),
		"{K}", quote(c.cache),
		"{I}", quote(c.idempotency),
		"{P}", quote(c.checkpoints),
		"{F}", quote(c.cpTasks),
		"{E}", quote(c.events),
	).Replace(s)
}

const lockCols = `owner, token, acquired_at, expires_at`
const circCols = `key, state, failure_count, last_failure_time, last_success_time, opened_at, probe_owner, probe_until, version, updated_at`
const idemCols = `key, status, owner, fingerprint, result, created_at, expires_at`
const cpCols = `task_id, sequence, timestamp, progress, data, estimated_time_remaining, token`

func buildQueries(c config, lg legacy) queries {
	var q queries

	// ----- locks
	// A live holding: not released and not expired. The same owner on a
	// live holding keeps its token and acquisition time; every other
	// acquisition is a new holding with the next token.
	q.lockAcquire = sub(c, `INSERT INTO {L} (namespace, key, owner, token, created_at, acquired_at, expires_at, released_at, updated_at)
VALUES (:ns, :key, :owner, :base, :now, :now, :exp, NULL, :now)
ON CONFLICT (namespace, key) DO UPDATE SET
	token = CASE
		WHEN {L}.released_at IS NULL AND {L}.expires_at > :now AND {L}.owner = :owner THEN {L}.token
		WHEN {L}.token IS NULL THEN :base
		ELSE {L}.token + 1 END,
	acquired_at = CASE
		WHEN {L}.released_at IS NULL AND {L}.expires_at > :now AND {L}.owner = :owner THEN COALESCE({L}.acquired_at, :now)
		ELSE :now END,
	owner = :owner,
	expires_at = :exp,
	released_at = NULL,
	updated_at = :now
WHERE {L}.released_at IS NOT NULL OR {L}.expires_at IS NULL OR {L}.expires_at <= :now OR {L}.owner = :owner
RETURNING `+lockCols)
	q.lockHolder = sub(c, `SELECT `+lockCols+` FROM {L} WHERE namespace = :ns AND key = :key`)
	q.lockRefresh = sub(c, `UPDATE {L} SET expires_at = :exp, updated_at = :now
WHERE namespace = :ns AND key = :key AND owner = :owner AND token = :token AND released_at IS NULL AND expires_at > :now
RETURNING `+lockCols)
	q.lockRelease = sub(c, `UPDATE {L} SET released_at = :now, expires_at = min(expires_at, :now), updated_at = :now
WHERE namespace = :ns AND key = :key AND owner = :owner AND token = :token AND released_at IS NULL`)
	q.lockForce = sub(c, `UPDATE {L} SET released_at = :now, expires_at = min(expires_at, :now), updated_at = :now
WHERE namespace = :ns AND key = :key AND released_at IS NULL AND expires_at > :now`)
	q.lockGet = sub(c, `SELECT `+lockCols+` FROM {L} WHERE namespace = :ns AND key = :key AND released_at IS NULL AND expires_at > :now`)
	q.lockList = sub(c, `SELECT key, `+lockCols+` FROM {L} WHERE namespace = ? AND %s AND key GLOB ? AND released_at IS NULL AND expires_at > ? ORDER BY key`)

	// ----- circuits
	// Unknown states (written by someone else) count as closed. Outcomes
	// carry a generation (:gen; -1 for any): a present circuit's is
	// COALESCE(opened_at, 0), an absent one's 0. For generations -1 and 0
	// the outcome is an upsert whose update applies only to its generation;
	// for a generation above 0 the circuit must exist, and it is a plain
	// update of that generation. Either way, an outcome of another
	// generation changes nothing and returns no row.
	failSet := `
	state = CASE
		WHEN {C}.state IN ('open', 'half-open') THEN 'open'
		WHEN {C}.failure_count + 1 >= :th THEN 'open'
		ELSE 'closed' END,
	opened_at = CASE
		WHEN {C}.state = 'open' THEN {C}.opened_at
		WHEN {C}.state = 'half-open' OR {C}.failure_count + 1 >= :th THEN :now
		ELSE {C}.opened_at END,
	probe_owner = CASE WHEN {C}.state = 'open' OR {C}.state = 'half-open' OR {C}.failure_count + 1 >= :th THEN NULL ELSE {C}.probe_owner END,
	probe_until = CASE WHEN {C}.state = 'open' OR {C}.state = 'half-open' OR {C}.failure_count + 1 >= :th THEN NULL ELSE {C}.probe_until END,
	failure_count = {C}.failure_count + 1,
	last_failure_time = :now,
	version = {C}.version + 1,
	updated_at = :now`
	successSet := `
	state = CASE WHEN {C}.state = 'open' THEN 'open' ELSE 'closed' END,
	failure_count = CASE WHEN {C}.state = 'open' THEN {C}.failure_count ELSE 0 END,
	probe_owner = CASE WHEN {C}.state = 'open' THEN {C}.probe_owner ELSE NULL END,
	probe_until = CASE WHEN {C}.state = 'open' THEN {C}.probe_until ELSE NULL END,
	last_success_time = :now,
	version = {C}.version + 1,
	updated_at = :now`
	genUpsert := "\nWHERE :gen < 0 OR COALESCE({C}.opened_at, 0) = :gen\nRETURNING " + circCols
	genUpdate := "\nWHERE namespace = :ns AND key = :key AND opened_at = :gen\nRETURNING " + circCols
	q.circFailure = sub(c, `INSERT INTO {C} (namespace, key, state, failure_count, last_failure_time, last_success_time, opened_at, probe_owner, probe_until, version, updated_at)
VALUES (:ns, :key, CASE WHEN :th <= 1 THEN 'open' ELSE 'closed' END, 1, :now, NULL, CASE WHEN :th <= 1 THEN :now END, NULL, NULL, 1, :now)
ON CONFLICT (namespace, key) DO UPDATE SET`+failSet+genUpsert)
	q.circFailureGen = sub(c, `UPDATE {C} SET`+failSet+genUpdate)
	q.circSuccess = sub(c, `INSERT INTO {C} (namespace, key, state, failure_count, last_failure_time, last_success_time, opened_at, probe_owner, probe_until, version, updated_at)
VALUES (:ns, :key, 'closed', 0, NULL, :now, NULL, NULL, NULL, 1, :now)
ON CONFLICT (namespace, key) DO UPDATE SET`+successSet+genUpsert)
	q.circSuccessGen = sub(c, `UPDATE {C} SET`+successSet+genUpdate)
	q.circProbe = sub(c, `UPDATE {C} SET
	state = 'half-open', probe_owner = :owner, probe_until = :until, version = version + 1, updated_at = :now
WHERE namespace = :ns AND key = :key AND (
	(state = 'open' AND COALESCE(opened_at, 0) + :openfor <= :now)
	OR (state = 'half-open' AND (probe_owner IS NULL OR probe_owner = :owner OR COALESCE(probe_until, 0) <= :now)))
RETURNING `+circCols)
	q.circGet = sub(c, `SELECT `+circCols+` FROM {C} WHERE namespace = :ns AND key = :key`)
	q.circSet = sub(c, `INSERT INTO {C} (namespace, key, state, failure_count, last_failure_time, last_success_time, opened_at, probe_owner, probe_until, version, updated_at)
VALUES (:ns, :key, :state, 0, NULL, NULL, CASE WHEN :state = 'open' THEN :now END, NULL, NULL, 1, :now)
ON CONFLICT (namespace, key) DO UPDATE SET
	state = :state,
	failure_count = CASE WHEN :state = 'closed' THEN 0 ELSE {C}.failure_count END,
	opened_at = CASE WHEN :state = 'open' THEN :now ELSE {C}.opened_at END,
	probe_owner = NULL,
	probe_until = NULL,
	version = {C}.version + 1,
	updated_at = :now
RETURNING `+circCols)
	q.circDelete = sub(c, `DELETE FROM {C} WHERE namespace = :ns AND key = :key`)
	q.circList = sub(c, `SELECT `+circCols+` FROM {C} WHERE namespace = ? AND %s AND key GLOB ? ORDER BY key`)

	// ----- cache
	live := `(expires_at IS NULL OR expires_at > :now)`
	q.cacheGet = sub(c, `SELECT value, expires_at FROM {K} WHERE namespace = :ns AND key = :key AND `+live)
	q.cacheSet = sub(c, `INSERT INTO {K} (namespace, key, value, expires_at, updated_at) VALUES (:ns, :key, :value, :exp, :now)
ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at, updated_at = excluded.updated_at`)
	q.cacheSetIfAbsent = sub(c, `INSERT INTO {K} (namespace, key, value, expires_at, updated_at) VALUES (:ns, :key, :value, :exp, :now)
ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at, updated_at = excluded.updated_at
WHERE {K}.expires_at IS NOT NULL AND {K}.expires_at <= :now`)
	q.cacheDelete = sub(c, `DELETE FROM {K} WHERE namespace = :ns AND key = :key RETURNING `+live)
	q.cacheHas = sub(c, `SELECT 1 FROM {K} WHERE namespace = :ns AND key = :key AND `+live)
	q.cacheClear = sub(c, `DELETE FROM {K} WHERE namespace = ? AND %s RETURNING (expires_at IS NULL OR expires_at > ?)`)
	q.cacheKeys = sub(c, `SELECT key FROM {K} WHERE namespace = ? AND %s AND key GLOB ? AND (expires_at IS NULL OR expires_at > ?) ORDER BY key`)

	// ----- idempotency
	// With a go-go-scope table, its NOT NULL "value" column gets the
	// result as text ('null' while pending).
	valCol, valIns, valClaim, valDone := "", "", "", ""
	if lg.idemValue {
		valCol = ", value"
		valIns = ", 'null'"
		valClaim = ", value = 'null'"
		valDone = ", value = CAST(:result AS TEXT)"
	}
	q.idemGet = sub(c, `SELECT `+idemCols+` FROM {I} WHERE namespace = :ns AND key = :key AND `+live)
	q.idemGetAny = sub(c, `SELECT `+idemCols+` FROM {I} WHERE namespace = :ns AND key = :key`)
	q.idemInsert = sub(c, `INSERT INTO {I} (namespace, key, status, owner, fingerprint, result, created_at, expires_at, updated_at`+valCol+`)
VALUES (:ns, :key, 'pending', :owner, :fp, NULL, :now, :exp, :now`+valIns+`)
RETURNING `+idemCols)
	q.idemReclaim = sub(c, `UPDATE {I} SET status = 'pending', owner = :owner, fingerprint = :fp, result = NULL,
	created_at = :now, expires_at = :exp, updated_at = :now`+valClaim+`
WHERE namespace = :ns AND key = :key
RETURNING `+idemCols)
	q.idemRenew = sub(c, `UPDATE {I} SET expires_at = :exp, updated_at = :now WHERE namespace = :ns AND key = :key
RETURNING `+idemCols)
	q.idemExtend = sub(c, `UPDATE {I} SET expires_at = :exp, updated_at = :now
WHERE namespace = :ns AND key = :key AND status = 'pending' AND owner = :owner`)
	q.idemComplete = sub(c, `UPDATE {I} SET status = 'completed', result = :result, expires_at = :exp, updated_at = :now`+valDone+`
WHERE namespace = :ns AND key = :key AND status = 'pending' AND owner = :owner`)
	q.idemAbandon = sub(c, `DELETE FROM {I} WHERE namespace = :ns AND key = :key AND status = 'pending' AND owner = :owner`)
	setVal := ""
	if lg.idemValue {
		setVal = ", CAST(:result AS TEXT)"
	}
	q.idemSet = sub(c, `INSERT INTO {I} (namespace, key, status, owner, fingerprint, result, created_at, expires_at, updated_at`+valCol+`)
VALUES (:ns, :key, 'completed', NULL, NULL, :result, :now, :exp, :now`+setVal+`)
ON CONFLICT (namespace, key) DO UPDATE SET status = 'completed', owner = NULL, fingerprint = NULL, result = excluded.result,
	created_at = excluded.created_at, expires_at = excluded.expires_at, updated_at = excluded.updated_at`+strings.ReplaceAll(valDone, ":result", "excluded.result"))
	q.idemDelete = sub(c, `DELETE FROM {I} WHERE namespace = :ns AND key = :key RETURNING `+live)
	q.idemList = sub(c, `SELECT `+idemCols+` FROM {I} WHERE namespace = ? AND %s AND key GLOB ? AND (expires_at IS NULL OR expires_at > ?) ORDER BY key`)

	// ----- checkpoints
	// A save first updates the task's fence row — refused when the token
	// is below the fence, else raising the fence and taking the next
	// sequence — then inserts the checkpoint, in one IMMEDIATE
	// transaction. A task without a fence row starts from its
	// checkpoints' highest sequence and token (m), and the sequence never
	// falls behind a checkpoint written by another program either. The
	// SELECT's WHERE clause also keeps SQLite from reading ON CONFLICT as
	// a join constraint.
	cpMax := `(SELECT
	COALESCE((SELECT sequence FROM {P} WHERE namespace = :ns AND task_id = :task ORDER BY sequence DESC LIMIT 1), 0) AS seq,
	COALESCE((SELECT max(token) FROM {P} WHERE namespace = :ns AND task_id = :task), 0) AS tok) AS m`
	q.cpFenceSave = sub(c, `INSERT INTO {F} (namespace, task_id, fence_token, last_sequence, updated_at)
SELECT :ns, :task, max(:token, m.tok), m.seq + 1, :now FROM `+cpMax+`
WHERE :token = 0 OR :token >= m.tok
ON CONFLICT (namespace, task_id) DO UPDATE SET
	fence_token = max({F}.fence_token, :token),
	last_sequence = max({F}.last_sequence + 1, excluded.last_sequence),
	updated_at = :now
WHERE :token = 0 OR :token >= {F}.fence_token
RETURNING last_sequence`)
	q.cpInsert = sub(c, `INSERT INTO {P} (namespace, id, task_id, sequence, timestamp, progress, data, estimated_time_remaining, token)
VALUES (:ns, :task || ':' || :seq, :task, :seq, :now, :progress, :data, :eta, :token)
RETURNING `+cpCols)
	// Fence raises the fence (an equal token changes nothing).
	q.cpFence = sub(c, `INSERT INTO {F} (namespace, task_id, fence_token, last_sequence, updated_at)
SELECT :ns, :task, :token, m.seq, :now FROM `+cpMax+`
WHERE :token >= m.tok
ON CONFLICT (namespace, task_id) DO UPDATE SET
	fence_token = :token,
	updated_at = CASE WHEN :token > {F}.fence_token THEN :now ELSE {F}.updated_at END
WHERE :token >= {F}.fence_token
RETURNING 1`)
	// The task's fence, for fenced deletions (a task without a fence row
	// is fenced by its checkpoints' highest token, as a save would be).
	q.cpFenceOf = sub(c, `SELECT COALESCE(
	(SELECT fence_token FROM {F} WHERE namespace = :ns AND task_id = :task),
	(SELECT max(token) FROM {P} WHERE namespace = :ns AND task_id = :task), 0)`)
	q.cpLoad = sub(c, `SELECT `+cpCols+` FROM {P} WHERE namespace = :ns AND task_id = :task AND sequence = :seq`)
	q.cpLatest = sub(c, `SELECT `+cpCols+` FROM {P} WHERE namespace = :ns AND task_id = :task ORDER BY sequence DESC LIMIT 1`)
	q.cpList = sub(c, `SELECT `+cpCols+` FROM {P} WHERE namespace = :ns AND task_id = :task ORDER BY sequence`)
	q.cpCleanup = sub(c, `DELETE FROM {P} WHERE namespace = :ns AND task_id = :task AND sequence <=
	(SELECT sequence FROM {P} WHERE namespace = :ns AND task_id = :task ORDER BY sequence DESC LIMIT 1 OFFSET :keep)`)
	q.cpDeleteAll = sub(c, `DELETE FROM {P} WHERE namespace = :ns AND task_id = :task`)
	q.cpTasks = sub(c, `SELECT DISTINCT task_id FROM {P} WHERE namespace = ? AND %s AND task_id GLOB ? ORDER BY task_id`)

	// ----- purge
	q.purgeCache = sub(c, `DELETE FROM {K} WHERE namespace = ? AND %s AND expires_at IS NOT NULL AND expires_at <= ?`)
	q.purgeIdem = sub(c, `DELETE FROM {I} WHERE namespace = ? AND %s AND expires_at IS NOT NULL AND expires_at <= ?`)
	// A released holding's expires_at is its release time, so expires_at
	// is when every idle record became idle.
	q.purgeLocks = sub(c, `DELETE FROM {L} WHERE namespace = ? AND %s AND expires_at <= ?`)
	// A fence row goes once its task has no checkpoint and its fence has
	// not changed for the lock retention.
	q.purgeFences = sub(c, `DELETE FROM {F} WHERE namespace = ? AND %s AND updated_at <= ?
	AND NOT EXISTS (SELECT 1 FROM {P} WHERE {P}.namespace = {F}.namespace AND {P}.task_id = {F}.task_id)`)
	// Events go by insertion order: all but the eventWindow newest.
	q.purgeEvents = sub(c, `DELETE FROM {E} WHERE id <= (SELECT COALESCE(MAX(id), 0) FROM {E}) - ?`)

	// ----- events
	q.evSeq = fmt.Sprintf(`SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = '%s'), 0)`, c.events)
	q.evRead = sub(c, `SELECT id, kind, namespace, key, owner, token, at, data FROM {E} WHERE id > ? ORDER BY id LIMIT ?`)
	return q
}
