package mysql

import "strings"

// The SQL of the store. NOW is the database clock, fixed for the duration
// of one statement; EXP(?) is NOW plus ? microseconds (NULL stays NULL).
//
// Several upserts report their outcome in the session variable
// @warden_out, which the store reads on the same connection right after
// (store.outcome): the VALUES list sets it for a new row, the first
// assignment of the ON DUPLICATE KEY UPDATE clause for an existing one. It
// does not depend on the affected-rows semantics (CLIENT_FOUND_ROWS), nor
// on LAST_INSERT_ID, which an AUTO_INCREMENT column of an adopted table
// overrides whenever a row is inserted. In an ON DUPLICATE KEY UPDATE
// clause the assignments run left to right and see the values assigned
// before them; each clause below either computes its condition from
// columns not yet assigned or from @warden_out. UPDATE statements, which
// never insert, report a match through LAST_INSERT_ID(1) in the OK packet
// (store.marked), 0 when no row matched.
//
// Locks, circuits and cache entries are keyed by `key` alone (see
// newLayout); their statements also accept the rows of go-go-scope's
// adapters, whose namespace column is empty.
type queries struct {
	lockAcquire, lockAcquireN, lockRead, lockReleaseN, lockLeaveN                             string
	lockRow, lockRowLive, lockRefresh, lockRelease, lockForce, lockGet, lockList              string
	circDelete                                                                                string
	cacheGet, cacheSet, cacheSetIfAbsent, cacheDelete, cacheHas, cacheClear, cacheKeys        string
	cacheClearDead                                                                            string
	idemClaim, idemClaimRow, idemRow, idemExtend, idemComplete, idemAbandon, idemGet, idemSet string
	idemDelete, idemList                                                                      string
	cpFenceSave, cpInsert, cpFence, cpLoad, cpLatest, cpList, cpNth, cpCleanup, cpDelete      string
	cpTasks, cpFenceLock, cpMaxToken, cpLoadOut                                               string
}

const (
	nowSQL = "UTC_TIMESTAMP(3)"
	expSQL = "TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(3))"
	// tokenSQL: the token base, from the database clock in microseconds
	// µs: (µs DIV 1000) × 4096 + (µs MOD 1000) × 4096 DIV 1000, about 4.1
	// per microsecond. It is never below driver.TokenBase of the same
	// instant (ms × 4096), so tokens stored before stay below new ones, and
	// a row another program deleted and warden recreated at least a
	// microsecond later starts above every token the old row handed out.
	// Exact integer arithmetic, far from overflow.
	tokenSQL = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 * 4096 + " +
		"TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) MOD 1000 * 4096 DIV 1000)"
)

const (
	lockCols = "owner, token, acquired_at, expires_at, released_at"
	// released: a row warden released keeps expires_at <= released_at; a
	// row the go-go-scope adapter took over since (it sets owner and
	// expires_at only) is live again.
	releasedSQL = "(released_at IS NOT NULL AND expires_at <= released_at)"
	idemCols    = "`key`, status, owner, fingerprint, result, created_at, expires_at"
	cpCols      = "task_id, sequence, TSREAD, progress, data, data_bin, estimated_time_remaining, token"
	// jsonVal stores a value in the JSON column when the value argument
	// (given as a string, or NULL when it is not UTF-8 JSON) is valid JSON
	// to the server, and in the _bin column otherwise: JSONVAL(?, ?) and
	// BINVAL(?, ?) take the JSON string and the bytes.
	jsonVal = "IF(JSON_VALID(?) <=> 1, ?, NULL)"
	binVal  = "IF(JSON_VALID(?) <=> 1, NULL, ?)"
)

// buildQueries renders the statements for tables t; cpMillis: the
// checkpoints' timestamp column holds Unix milliseconds (go-go-scope's
// BIGINT) rather than a DATETIME(3).
func buildQueries(t Tables, cpMillis bool) queries {
	tsNow, tsRead := nowSQL, "`timestamp`"
	if cpMillis {
		tsNow = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)"
		tsRead = "CAST(TIMESTAMPADD(MICROSECOND, `timestamp` * 1000, TIMESTAMP'1970-01-01 00:00:00') AS DATETIME(3))"
	}
	r := strings.NewReplacer(
		"{L}", "`"+t.Locks+"`", "{C}", "`"+t.Circuits+"`", "{K}", "`"+t.Cache+"`",
		"{I}", "`"+t.Idempotency+"`", "{P}", "`"+t.Checkpoints+"`", "{F}", "`"+t.CheckpointTasks+"`",
		"TSNOW", tsNow, "TSREAD", tsRead, "RELEASED", releasedSQL, "JSONVAL", jsonVal, "BINVAL", binVal,
		"NOW", nowSQL, "EXP(?)", expSQL, "TOKENBASE", tokenSQL)
	sub := r.Replace
	var q queries
	const key = "namespace = ? AND `key` = ?"
	// kkey: a key of the locks, circuits or cache tables.
	const kkey = "(namespace = ? OR namespace = '') AND `key` = ?"
	const kns = "(namespace = ? OR namespace = '')"

	// ----- locks
	// free: no live holding, or owner holds it. same: owner's live holding.
	// A new holder's token is one more than the row's, and never below
	// the clock's token base (tokenSQL, finer than a millisecond): rows
	// the go-go-scope adapter inserted have token 0, and it deletes the
	// rows warden keeps, even live ones (forceRelease).
	//
	// Hand-off (handoff.go): a release that woke a waiter queued on the
	// key's named lock records the waiter's session in handoff; while
	// that session still holds the named lock, and for handoffGrace at
	// most, the released row is reserved for it: an acquire from another
	// session does not take it. The reservation is computed once, into
	// @warden_t by the first assignment (IS_USED_LOCK could change between
	// two evaluations), together with free.
	free := "(RELEASED OR expires_at <= NOW OR owner = VALUES(owner))"
	same := "(NOT RELEASED AND expires_at > NOW AND owner = VALUES(owner))"
	reserved := "(RELEASED AND handoff IS NOT NULL AND NOT (handoff <=> CONNECTION_ID()) AND IS_USED_LOCK(?) <=> handoff" +
		" AND released_at > TIMESTAMPADD(MICROSECOND, -?, NOW))"
	// The acquire proposes a new row with INSERT … SELECT, so that
	// lockAcquireN can take the key's named lock (GET_LOCK(name, 0), never
	// waiting) in the same statement, before the row is decided.
	// Arguments: namespace, key, owner, ttl µs, [name for GET_LOCK], name,
	// grace µs.
	acquire := func(gate string) string {
		return sub(`INSERT INTO {L} (namespace, ` + "`key`" + `, owner, token, created_at, acquired_at, expires_at, released_at, handoff, updated_at)
SELECT ?, ?, ?, TOKENBASE, NOW, NOW, EXP(?), NULL, NULL, NOW FROM DUAL` + gate + `
ON DUPLICATE KEY UPDATE
	token = IF((@warden_t := (` + free + ` AND NOT ` + reserved + `)), IF(` + same + `, token, GREATEST(token + 1, TOKENBASE)), token),
	acquired_at = IF(@warden_t AND NOT ` + same + `, NOW, acquired_at),
	owner = IF(@warden_t, VALUES(owner), owner),
	expires_at = IF(@warden_t, VALUES(expires_at), expires_at),
	released_at = IF(@warden_t, NULL, released_at),
	handoff = IF(@warden_t, NULL, handoff),
	updated_at = IF(@warden_t, NOW, updated_at)`)
	}
	q.lockAcquire = acquire("")
	// The gate leaves GET_LOCK's answer in @warden_n (1: taken, 0: busy)
	// for lockRead, on the same connection.
	q.lockAcquireN = acquire(" WHERE (@warden_n := GET_LOCK(?, 0)) IS NOT NULL")
	// lockRead reads the row after a gated acquire on the connection that
	// made it, with whether the gate took the key's named lock. (Reading
	// IS_USED_LOCK, or releasing the named lock here, made this read a
	// third slower on MariaDB 10.11; a user variable costs nothing.)
	// Arguments: namespace, key.
	q.lockRead = sub(`SELECT ` + lockCols + `, NOT RELEASED AND expires_at > NOW, @warden_n FROM {L} WHERE ` + kkey)
	// lockReleaseN ends a holding and releases the key's named lock in one
	// statement, on the holding's connection; handoff takes the session
	// the server granted the named lock to (the first waiter), if any.
	// Arguments: name, name, namespace, key, owner, token.
	q.lockReleaseN = sub(`UPDATE {L} SET released_at = NOW, expires_at = LEAST(expires_at, NOW),
	handoff = IF(RELEASE_LOCK(?) <=> 1, IS_USED_LOCK(?), NULL), updated_at = NOW
WHERE ` + kkey + ` AND owner = ? AND token = ? AND NOT RELEASED`)
	// lockLeaveN: a waiter giving up its turn passes a reservation made
	// for it on to the next waiter, releasing the named lock in the same
	// statement (which changes nothing when the row is not reserved for
	// this session: the caller then releases the named lock itself).
	// Arguments: name, name, namespace, key.
	q.lockLeaveN = sub(`UPDATE {L} SET handoff = IF(RELEASE_LOCK(?) <=> 1, IS_USED_LOCK(?), NULL)
WHERE ` + kkey + ` AND RELEASED AND handoff <=> CONNECTION_ID()`)
	q.lockRow = sub(`SELECT ` + lockCols + ` FROM {L} WHERE ` + kkey)
	q.lockRowLive = sub(`SELECT ` + lockCols + `, NOT RELEASED AND expires_at > NOW FROM {L} WHERE ` + kkey)
	// Refresh and Extend may leave a row unchanged (same expiry within a
	// millisecond), so they report a match through LAST_INSERT_ID(1)
	// instead of the affected rows, which would then be 0 without
	// CLIENT_FOUND_ROWS.
	q.lockRefresh = sub(`UPDATE {L} SET expires_at = EXP(?), updated_at = IF(LAST_INSERT_ID(1) = 1, NOW, NOW)
WHERE ` + kkey + ` AND owner = ? AND token = ? AND NOT RELEASED AND expires_at > NOW`)
	q.lockRelease = sub(`UPDATE {L} SET released_at = NOW, expires_at = LEAST(expires_at, NOW), handoff = NULL, updated_at = NOW
WHERE ` + kkey + ` AND owner = ? AND token = ? AND NOT RELEASED`)
	q.lockForce = sub(`UPDATE {L} SET released_at = NOW, expires_at = LEAST(expires_at, NOW), handoff = NULL, updated_at = NOW
WHERE ` + kkey + ` AND NOT RELEASED AND expires_at > NOW`)
	q.lockGet = sub(`SELECT ` + lockCols + ` FROM {L} WHERE ` + kkey + ` AND NOT RELEASED AND expires_at > NOW`)
	q.lockList = sub("SELECT `key`, " + lockCols + ` FROM {L} WHERE ` + kns + ` AND %s AND ` + likeCond("`key`") +
		" AND NOT RELEASED AND expires_at > NOW ORDER BY `key`")

	// ----- circuits (the other statements are built in circuits.go)
	q.circDelete = sub(`DELETE FROM {C} WHERE ` + kkey)

	// ----- cache
	// A value is in value (JSON, which go-go-scope reads and writes) or
	// in value_bin (any other bytes), the other column NULL; go-go-scope
	// writes value only, so a non-NULL value is always the current one.
	live := "(expires_at IS NULL OR expires_at > NOW)"
	q.cacheGet = sub(`SELECT value, value_bin, expires_at FROM {K} WHERE ` + kkey + ` AND ` + live)
	q.cacheSet = sub(`INSERT INTO {K} (namespace, ` + "`key`" + `, value, value_bin, expires_at, updated_at) VALUES (?, ?, JSONVAL, BINVAL, EXP(?), NOW)
ON DUPLICATE KEY UPDATE value = VALUES(value), value_bin = VALUES(value_bin), expires_at = VALUES(expires_at), updated_at = VALUES(updated_at)`)
	q.cacheSetIfAbsent = sub(`INSERT INTO {K} (namespace, ` + "`key`" + `, value, value_bin, expires_at, updated_at)
VALUES (IF((@warden_out := 1) = 1, ?, NULL), ?, JSONVAL, BINVAL, EXP(?), NOW)
ON DUPLICATE KEY UPDATE
	value = IF((@warden_out := (expires_at IS NOT NULL AND expires_at <= NOW)), VALUES(value), value),
	value_bin = IF(@warden_out = 1, VALUES(value_bin), value_bin),
	expires_at = IF(@warden_out = 1, VALUES(expires_at), expires_at),
	updated_at = IF(@warden_out = 1, VALUES(updated_at), updated_at)`)
	q.cacheDelete = sub(`DELETE FROM {K} WHERE ` + kkey + ` AND ` + live)
	q.cacheHas = sub(`SELECT 1 FROM {K} WHERE ` + kkey + ` AND ` + live)
	q.cacheClear = sub(`DELETE FROM {K} WHERE ` + kns + ` AND %s AND ` + live)
	q.cacheClearDead = sub(`DELETE FROM {K} WHERE ` + kns + ` AND %s`)
	q.cacheKeys = sub("SELECT `key` FROM {K} WHERE " + kns + " AND %s AND " + likeCond("`key`") + ` AND ` + live + " ORDER BY `key`")

	// ----- idempotency
	// The first assignment computes the outcome from the old row:
	// 1 claimed (lapsed completed), 2 taken over (lapsed pending),
	// 5 renewed (owner's own pending claim), 3 in progress, 4 completed;
	// a new row reports 1 from the VALUES list.
	q.idemClaim = sub(`INSERT INTO {I} (namespace, ` + "`key`" + `, status, owner, fingerprint, result, created_at, expires_at, updated_at)
VALUES (IF((@warden_out := 1) = 1, ?, NULL), ?, 'pending', ?, ?, NULL, NOW, EXP(?), NOW)
ON DUPLICATE KEY UPDATE
	status = IF((@warden_out := CASE
		WHEN expires_at IS NOT NULL AND expires_at <= NOW THEN IF(status = 'pending', 2, 1)
		WHEN status = 'pending' AND owner = VALUES(owner) THEN 5
		WHEN status = 'pending' THEN 3
		ELSE 4 END) <= 2, 'pending', status),
	owner = IF(@warden_out <= 2, VALUES(owner), owner),
	fingerprint = IF(@warden_out <= 2, VALUES(fingerprint), fingerprint),
	result = IF(@warden_out <= 2, NULL, result),
	created_at = IF(@warden_out <= 2, NOW, created_at),
	expires_at = IF(@warden_out IN (1, 2, 5), VALUES(expires_at), expires_at),
	updated_at = IF(@warden_out IN (1, 2, 5), NOW, updated_at)`)
	q.idemRow = sub(`SELECT ` + idemCols + ` FROM {I} WHERE ` + key)
	q.idemClaimRow = sub(`SELECT @warden_out, ` + idemCols + ` FROM {I} WHERE ` + key)
	q.idemExtend = sub(`UPDATE {I} SET expires_at = EXP(?), updated_at = IF(LAST_INSERT_ID(1) = 1, NOW, NOW) WHERE ` + key + ` AND status = 'pending' AND owner = ?`)
	q.idemComplete = sub(`UPDATE {I} SET status = 'completed', result = ?, expires_at = EXP(?), updated_at = NOW
WHERE ` + key + ` AND status = 'pending' AND owner = ?`)
	q.idemAbandon = sub(`DELETE FROM {I} WHERE ` + key + ` AND status = 'pending' AND owner = ?`)
	q.idemGet = sub(`SELECT ` + idemCols + ` FROM {I} WHERE ` + key + ` AND ` + live)
	q.idemSet = sub(`INSERT INTO {I} (namespace, ` + "`key`" + `, status, owner, fingerprint, result, created_at, expires_at, updated_at)
VALUES (?, ?, 'completed', NULL, NULL, ?, NOW, EXP(?), NOW)
ON DUPLICATE KEY UPDATE status = 'completed', owner = NULL, fingerprint = NULL, result = VALUES(result),
	created_at = VALUES(created_at), expires_at = VALUES(expires_at), updated_at = VALUES(updated_at)`)
	q.idemDelete = sub(`DELETE FROM {I} WHERE ` + key + ` AND ` + live)
	q.idemList = sub(`SELECT ` + idemCols + ` FROM {I} WHERE namespace = ? AND %s AND ` + likeCond("`key`") + ` AND ` + live + " ORDER BY `key`")

	// ----- checkpoints
	// Save: the fence row's upsert decides (@warden_out: the new
	// sequence, 0 if refused), then the checkpoint is inserted, in one
	// transaction. A task without a fence row starts from its
	// checkpoints' highest sequence and token. The next sequence is also
	// past the highest in the checkpoints table: go-go-scope's adapter
	// inserts checkpoints without touching the fence row.
	q.cpFenceSave = sub(`INSERT INTO {F} (namespace, task_id, fence_token, last_sequence, updated_at)
VALUES (?, ?,
	GREATEST(?, (SELECT COALESCE(MAX(token), 0) FROM {P} WHERE namespace = ? AND task_id = ?)),
	(@warden_out := (SELECT COALESCE(MAX(sequence), 0) FROM {P} WHERE namespace = ? AND task_id = ?) + 1), NOW)
ON DUPLICATE KEY UPDATE
	last_sequence = IF(? = 0 OR ? >= fence_token,
		(@warden_out := GREATEST(last_sequence, (SELECT COALESCE(MAX(sequence), 0) FROM {P} WHERE namespace = ? AND task_id = ?)) + 1),
		last_sequence + (@warden_out := 0)),
	updated_at = IF(@warden_out > 0, NOW, updated_at),
	fence_token = IF(@warden_out > 0, GREATEST(fence_token, ?), fence_token)`)
	// The checkpoint takes the sequence the fence row's upsert left in
	// @warden_out, and is not inserted when that refused (0).
	q.cpInsert = sub(`INSERT INTO {P} (namespace, id, task_id, sequence, ` + "`timestamp`" + `, progress, data, data_bin, estimated_time_remaining, token)
SELECT ?, CONCAT(?, ':', @warden_out), ?, @warden_out, TSNOW, ?, JSONVAL, BINVAL, ?, ? FROM DUAL WHERE @warden_out > 0`)
	// Fence: @warden_out is 1 if accepted, 0 if the fence is greater.
	q.cpFence = sub(`INSERT INTO {F} (namespace, task_id, fence_token, last_sequence, updated_at)
VALUES (?, ?, ? + (@warden_out := 1) - 1,
	(SELECT COALESCE(MAX(sequence), 0) FROM {P} WHERE namespace = ? AND task_id = ?), NOW)
ON DUPLICATE KEY UPDATE
	updated_at = IF(VALUES(fence_token) > fence_token, NOW, updated_at),
	fence_token = IF((@warden_out := (VALUES(fence_token) >= fence_token)), VALUES(fence_token), fence_token)`)
	const task = "namespace = ? AND task_id = ?"
	q.cpLoad = sub(`SELECT ` + cpCols + ` FROM {P} WHERE ` + task + ` AND sequence = ?`)
	q.cpLoadOut = sub(`SELECT ` + cpCols + ` FROM {P} WHERE ` + task + ` AND sequence = @warden_out`)
	q.cpLatest = sub(`SELECT ` + cpCols + ` FROM {P} WHERE ` + task + ` ORDER BY sequence DESC LIMIT 1`)
	q.cpList = sub(`SELECT ` + cpCols + ` FROM {P} WHERE ` + task + ` ORDER BY sequence`)
	// Fenced deletions lock the task's fence row (so that a Fence or a
	// save waits for them) and compare its token; a task without one is
	// fenced by its checkpoints' highest token, as a save would be.
	q.cpFenceLock = sub(`SELECT fence_token FROM {F} WHERE ` + task + ` FOR UPDATE`)
	q.cpMaxToken = sub(`SELECT COALESCE(MAX(token), 0) FROM {P} WHERE ` + task)
	q.cpNth = sub(`SELECT sequence FROM {P} WHERE ` + task + ` ORDER BY sequence DESC LIMIT 1 OFFSET ?`)
	q.cpCleanup = sub(`DELETE FROM {P} WHERE ` + task + ` AND sequence <= ?`)
	q.cpDelete = sub(`DELETE FROM {P} WHERE ` + task)
	q.cpTasks = sub(`SELECT DISTINCT task_id FROM {P} WHERE namespace = ? AND %s AND ` + likeCond("task_id") + ` ORDER BY task_id`)

	return q
}
