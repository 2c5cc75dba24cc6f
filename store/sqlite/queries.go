package sqlite

import (
	"fmt"
	"strings"
)

// queries holds the SQL of every operation, built once per store from the
// configured table names.
type queries struct {
	lockAcquire, lockHolder, lockRefresh, lockRelease, lockForce, lockGet, lockList string

	circOutcome, circOutcomeGen, circTrip, circProbe, circGet, circSet, circDelete, circList string

	cacheGet, cacheSet, cacheSetIfAbsent, cacheDelete, cacheHas, cacheClear, cacheKeys string

	idemGet, idemGetAny, idemInsert, idemReclaim, idemRenew, idemExtend, idemComplete,
	idemAbandon, idemSet, idemDelete, idemList string

	cpFenceSave, cpInsert, cpFence, cpFenceOf, cpLoad, cpLatest, cpList, cpCleanup, cpDeleteAll, cpTasks string

	purgeCache, purgeIdem, purgeLocks, purgeFences, purgeEvents string

	evSeq, evRead string

	watchRenew, watchSet, watchDelete, watchPrune string

	turnJoin, turnPrune, turnRenew, turnLeave, turnState, purgeTurns string
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
		"{W}", quote(c.watchers),
		"{T}", quote(c.turns),
	).Replace(s)
}

const lockCols = `owner, token, acquired_at, expires_at`
const circCols = `key, state, failure_count, last_failure_time, last_success_time, opened_at, probe_owner, probe_until, version, updated_at, ` +
	`successes, total_failures, consecutive_successes, interval_start, probes, probe_epoch`
const idemCols = `key, status, owner, fingerprint, result, created_at, expires_at`
const cpCols = `task_id, sequence, timestamp, progress, data, estimated_time_remaining, token`

func buildQueries(c config, lg legacy) queries {
	var q queries

	// ----- locks
	// The row applies to an acquire when owner holds it, live, or when it
	// is free (released, expired) and not reserved for a queued waiter
	// (turns.go): for turnGrace after the row became free — its
	// expires_at, which a release sets to the release time — only the
	// first of the key's live waiters (lowest seq) may take it. Without
	// the waiters' table (a read-only file from an older warden) nothing
	// is reserved.
	reserved := `0`
	if !lg.noTurns {
		reserved = reservedFor("{L}")
	}
	acquirable := `({L}.released_at IS NULL AND {L}.expires_at > :now AND {L}.owner = :owner)
	OR (({L}.released_at IS NOT NULL OR {L}.expires_at IS NULL OR {L}.expires_at <= :now) AND NOT ` + reserved + `)`
	// A live holding: not released and not expired. The same owner on a
	// live holding keeps its token and acquisition time; every other
	// acquisition is a new holding with the next token, never below the
	// clock's token base (another program sharing the table, such as
	// go-go-scope's adapter, may have rewritten the row with token 0).
	q.lockAcquire = sub(c, `INSERT INTO {L} (namespace, key, owner, token, created_at, acquired_at, expires_at, released_at, updated_at)
VALUES (:ns, :key, :owner, :base, :now, :now, :exp, NULL, :now)
ON CONFLICT (namespace, key) DO UPDATE SET
	token = CASE
		WHEN {L}.released_at IS NULL AND {L}.expires_at > :now AND {L}.owner = :owner THEN {L}.token
		WHEN {L}.token IS NULL THEN :base
		ELSE max({L}.token + 1, :base) END,
	acquired_at = CASE
		WHEN {L}.released_at IS NULL AND {L}.expires_at > :now AND {L}.owner = :owner THEN COALESCE({L}.acquired_at, :now)
		ELSE :now END,
	owner = :owner,
	expires_at = :exp,
	released_at = NULL,
	updated_at = :now
WHERE `+acquirable+`
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
	// for a generation above 0 (or a probe's outcome) the circuit must
	// exist, and it is a plain update of that generation. A probe's
	// outcome carries its slot's probe epoch (:pe, 0 for other calls) and
	// applies only while it is the circuit's. Either way, an outcome of
	// another generation or probe epoch changes nothing and returns no
	// row.
	// RecordOutcome is one statement: :kind is 2 for a failure, 1 for a
	// success, 0 for successes alone (:b, batched); :th the threshold (0:
	// never by count), :ca the successes that close a half-open circuit,
	// :iv the counting interval in ms (0: none). Every expression sees the
	// row as it was (SQLite evaluates SET against the old row).
	closed := `{C}.state NOT IN ('open', 'half-open')`
	over := `(:iv > 0 AND {C}.interval_start IS NOT NULL AND {C}.interval_start + :iv <= :now)`
	kept := func(col string) string { return `(CASE WHEN ` + over + ` THEN 0 ELSE {C}.` + col + ` END)` }
	opens := `(:kind = 2 AND ({C}.state = 'half-open' OR (` + closed + ` AND :th > 0 AND ` + kept("failure_count") + ` + 1 >= :th)))`
	closes := `(:kind = 1 AND {C}.state = 'half-open' AND {C}.consecutive_successes + 1 >= MAX(:ca, 1))`
	outcomeSet := `
	state = CASE WHEN ` + opens + ` THEN 'open' WHEN ` + closes + ` THEN 'closed' WHEN ` + closed + ` THEN 'closed' ELSE {C}.state END,
	failure_count = CASE
		WHEN :kind = 2 AND ` + closed + ` THEN ` + kept("failure_count") + ` + 1
		WHEN :kind = 2 THEN {C}.failure_count + 1
		WHEN ` + closes + ` OR (:kind = 1 AND ` + closed + `) THEN 0
		WHEN ` + closed + ` THEN ` + kept("failure_count") + `
		ELSE {C}.failure_count END,
	successes = CASE
		WHEN ` + opens + ` OR ` + closes + ` THEN 0
		WHEN ` + closed + ` THEN ` + kept("successes") + ` + :b + (:kind = 1)
		WHEN {C}.state = 'half-open' AND :kind = 1 THEN {C}.successes + 1
		ELSE {C}.successes END,
	total_failures = CASE
		WHEN ` + opens + ` OR ` + closes + ` THEN 0
		WHEN ` + closed + ` THEN ` + kept("total_failures") + ` + (:kind = 2)
		ELSE {C}.total_failures END,
	consecutive_successes = CASE
		WHEN ` + opens + ` OR ` + closes + ` OR (:kind = 2 AND ` + closed + `) THEN 0
		WHEN ` + closed + ` THEN ` + kept("consecutive_successes") + ` + (:kind = 1)
		WHEN {C}.state = 'half-open' AND :kind = 1 THEN {C}.consecutive_successes + 1
		ELSE {C}.consecutive_successes END,
	interval_start = CASE
		WHEN ` + closes + ` THEN :now
		WHEN ` + opens + ` THEN {C}.interval_start
		WHEN ` + closed + ` AND :iv > 0 AND ({C}.interval_start IS NULL OR ` + over + `) THEN :now
		ELSE {C}.interval_start END,
	probes = CASE
		WHEN ` + opens + ` OR ` + closes + ` THEN 0
		WHEN {C}.state = 'half-open' AND :kind = 1 THEN
			CASE WHEN COALESCE({C}.probe_until, 0) > :now AND {C}.probes >= 1 THEN {C}.probes - 1 ELSE 0 END
		ELSE {C}.probes END,
	opened_at = CASE WHEN ` + opens + ` THEN :now WHEN ` + closes + ` THEN NULL ELSE {C}.opened_at END,
	probe_owner = CASE WHEN ` + opens + ` OR ` + closes + ` THEN NULL ELSE {C}.probe_owner END,
	probe_until = CASE WHEN ` + opens + ` OR ` + closes + ` THEN NULL ELSE {C}.probe_until END,
	last_failure_time = CASE WHEN :kind = 2 THEN :now ELSE {C}.last_failure_time END,
	last_success_time = CASE WHEN :kind = 1 THEN :now ELSE {C}.last_success_time END,
	version = {C}.version + 1,
	updated_at = :now`
	// Successes alone change only a closed circuit.
	applies := ` AND NOT (:kind = 0 AND {C}.state IN ('open', 'half-open'))`
	epoch := ` AND (:pe = 0 OR {C}.probe_epoch = :pe)`
	genUpsert := "\nWHERE (:gen < 0 OR COALESCE({C}.opened_at, 0) = :gen)" + epoch + applies + "\nRETURNING " + circCols
	genUpdate := "\nWHERE namespace = :ns AND key = :key AND (:gen < 0 OR COALESCE(opened_at, 0) = :gen)" + epoch + applies + "\nRETURNING " + circCols
	insOpens := `(:kind = 2 AND :th = 1)`
	q.circOutcome = sub(c, `INSERT INTO {C} (namespace, key, state, failure_count, last_failure_time, last_success_time, opened_at, probe_owner, probe_until, version, updated_at,
	successes, total_failures, consecutive_successes, interval_start, probes)
VALUES (:ns, :key, CASE WHEN `+insOpens+` THEN 'open' ELSE 'closed' END, (:kind = 2), CASE WHEN :kind = 2 THEN :now END,
	CASE WHEN :kind = 1 THEN :now END, CASE WHEN `+insOpens+` THEN :now END, NULL, NULL, 1, :now,
	CASE WHEN `+insOpens+` THEN 0 ELSE :b + (:kind = 1) END, CASE WHEN `+insOpens+` THEN 0 ELSE (:kind = 2) END, (:kind = 1),
	CASE WHEN :iv > 0 AND NOT `+insOpens+` THEN :now END, 0)
ON CONFLICT (namespace, key) DO UPDATE SET`+outcomeSet+genUpsert)
	q.circOutcomeGen = sub(c, `UPDATE {C} SET`+outcomeSet+genUpdate)
	q.circTrip = sub(c, `UPDATE {C} SET
	state = 'open', opened_at = :now, probe_owner = NULL, probe_until = NULL, probes = 0,
	successes = 0, total_failures = 0, consecutive_successes = 0, version = version + 1, updated_at = :now
WHERE namespace = :ns AND key = :key AND state NOT IN ('open', 'half-open') AND version = :v
RETURNING `+circCols)
	// A probe slot: open and due → half-open, the first slot; half-open
	// with every slot lapsed → the first slot; the newest slot's holder →
	// its slot again; a free slot among live ones → one more. A first slot
	// begins a new set of slots (probe_epoch + 1).
	q.circProbe = sub(c, `UPDATE {C} SET
	probe_epoch = CASE WHEN state = 'open' OR COALESCE(probe_until, 0) <= :now THEN probe_epoch + 1 ELSE probe_epoch END,
	probes = CASE
		WHEN state = 'open' OR COALESCE(probe_until, 0) <= :now THEN 1
		WHEN probe_owner = :owner THEN MAX(probes, 1)
		ELSE probes + 1 END,
	successes = CASE WHEN state = 'open' THEN 0 ELSE successes END,
	total_failures = CASE WHEN state = 'open' THEN 0 ELSE total_failures END,
	consecutive_successes = CASE WHEN state = 'open' THEN 0 ELSE consecutive_successes END,
	state = 'half-open', probe_owner = :owner, probe_until = :until, version = version + 1, updated_at = :now
WHERE namespace = :ns AND key = :key AND (
	(state = 'open' AND COALESCE(opened_at, 0) + :openfor <= :now)
	OR (state = 'half-open' AND (COALESCE(probe_until, 0) <= :now OR probe_owner = :owner OR probes < :max)))
RETURNING `+circCols)
	q.circGet = sub(c, `SELECT `+circCols+` FROM {C} WHERE namespace = :ns AND key = :key`)
	q.circSet = sub(c, `INSERT INTO {C} (namespace, key, state, failure_count, last_failure_time, last_success_time, opened_at, probe_owner, probe_until, version, updated_at,
	successes, total_failures, consecutive_successes, interval_start, probes, probe_epoch)
VALUES (:ns, :key, :state, 0, NULL, NULL, CASE WHEN :state = 'open' THEN :now END, NULL, NULL, 1, :now,
	0, 0, 0, CASE WHEN :state = 'closed' THEN :now END, 0, 1)
ON CONFLICT (namespace, key) DO UPDATE SET
	state = :state,
	successes = 0, total_failures = 0, consecutive_successes = 0, probes = 0, probe_epoch = {C}.probe_epoch + 1,
	interval_start = CASE WHEN :state = 'closed' THEN :now ELSE {C}.interval_start END,
	failure_count = CASE WHEN :state = 'closed' THEN 0 ELSE {C}.failure_count END,
	opened_at = CASE WHEN :state = 'open' THEN :now WHEN :state = 'closed' THEN NULL ELSE {C}.opened_at END,
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

	// ----- watchers (namespace, kind, id, expiry): renew pushes a live
	// registration's expiry forward and changes nothing once it lapsed;
	// set (re)creates it; prune deletes every lapsed registration.
	q.watchRenew = sub(c, `UPDATE {W} SET expires_at = :exp WHERE namespace = :ns AND kind = :kind AND id = :id AND expires_at > :now`)
	q.watchSet = sub(c, `INSERT INTO {W} (namespace, kind, id, expires_at) VALUES (:ns, :kind, :id, :exp)
	ON CONFLICT (namespace, kind, id) DO UPDATE SET expires_at = excluded.expires_at`)
	q.watchDelete = sub(c, `DELETE FROM {W} WHERE namespace = :ns AND kind = :kind AND id = :id`)
	q.watchPrune = sub(c, `DELETE FROM {W} WHERE expires_at <= :now`)

	// ----- waiters' queues (turns.go): join puts owner at the end of
	// key's queue (again, if its entry lapsed), renew pushes a live
	// entry's expiry forward, state reads what a waiter waits for: the
	// row live, its expires_at, and whether it is reserved for another
	// waiter.
	q.turnJoin = sub(c, `INSERT INTO {T} (namespace, key, owner, seq, expires_at)
VALUES (:ns, :key, :owner, (SELECT COALESCE(max(seq), 0) + 1 FROM {T} WHERE namespace = :ns AND key = :key), :exp)
ON CONFLICT (namespace, key, owner) DO UPDATE SET seq = excluded.seq, expires_at = excluded.expires_at`)
	q.turnPrune = sub(c, `DELETE FROM {T} WHERE namespace = :ns AND key = :key AND expires_at <= :now`)
	q.turnRenew = sub(c, `UPDATE {T} SET expires_at = :exp WHERE namespace = :ns AND key = :key AND owner = :owner AND expires_at > :now`)
	q.turnLeave = sub(c, `DELETE FROM {T} WHERE namespace = :ns AND key = :key AND owner = :owner`)
	q.turnState = sub(c, `SELECT COALESCE({L}.released_at IS NULL AND {L}.expires_at > :now, 0), COALESCE({L}.expires_at, 0), `+reserved+`
FROM {L} WHERE namespace = :ns AND key = :key`)
	q.purgeTurns = sub(c, `DELETE FROM {T} WHERE namespace = ? AND %s AND expires_at <= ?`)
	return q
}

// reservedFor is the condition that the free lock row l (the table's name
// or alias) is reserved for a waiter other than :owner: it became free
// (its expires_at) less than turnGrace ago, and the key's queue has a
// live entry of another owner ahead of :owner's live entry (ahead of
// everyone, when :owner has none). The first live waiter is never
// refused; a waiter that died stops counting when its entry lapses.
func reservedFor(l string) string {
	return fmt.Sprintf(`(COALESCE(%[1]s.expires_at, 0) > :now - %[2]d AND EXISTS (SELECT 1 FROM {T} AS t
	WHERE t.namespace = :ns AND t.key = :key AND t.owner <> :owner AND t.expires_at > :now
	AND t.seq < COALESCE((SELECT m.seq FROM {T} AS m WHERE m.namespace = :ns AND m.key = :key AND m.owner = :owner AND m.expires_at > :now), 9223372036854775807)))`,
		l, turnGrace.Milliseconds())
}
