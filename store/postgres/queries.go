package postgres

import (
	"strconv"
	"strings"
)

// The SQL of the store. Every statement that decides on expiry reads the
// database clock once, in the CTE n (t: clock_timestamp() truncated to
// milliseconds), and compares and writes with that one value.
//
// Statements that must return the current record whether or not they
// changed it first lock the row in the CTE cur (SELECT … FOR UPDATE, which
// under READ COMMITTED waits for a concurrent writer and returns the
// newest version), then upsert or update it in the CTE up, and return up's
// row if there is one, else cur's. An insert that lost a race to a
// concurrent first insert (cur empty, up empty) returns no row; the
// caller runs the statement again.
//
// Lock and circuit changes call pg_notify from a CTE of the same
// statement, so the notification is sent when, and only when, the change
// commits.
type queries struct {
	lockAcquire, lockRefresh, lockRelease, lockForce, lockGet, lockList     string
	circOutcome, circTrip, circProbes                                       string
	circGet, circSet, circDelete, circList                                  string
	cacheGet, cacheSet, cacheSetIfAbsent, cacheDelete, cacheHas, cacheClear string
	cacheKeys                                                               string
	idemClaim, idemRow, idemExtend, idemComplete, idemAbandon, idemGet      string
	idemSet, idemDelete, idemList                                           string
	cpSave, cpFence, cpFenceLock, cpMaxToken, cpLoad, cpLatest, cpList      string
	cpCleanup, cpDelete, cpTasks                                            string
	purgeCache, purgeIdem, purgeLocks, purgeFences                          string
}

const (
	nowSQL = "date_trunc('milliseconds', clock_timestamp())"
	// withNow fixes the statement's time: n.t in milliseconds, n.c the
	// same instant in microseconds.
	withNow = "WITH " + nowCTE + ") c)"
	// nowCTE is the n of withNow, its clock read in a subquery that the
	// caller closes (and may give a FROM clause first).
	nowCTE = "n AS MATERIALIZED (SELECT date_trunc('milliseconds', c.c) AS t, c.c FROM (SELECT clock_timestamp() AS c"
	// withKeyLockNow is withNow read only once the statement holds a
	// transaction-scoped advisory lock on the record's key (in warden's
	// own two-key space, class advisoryClass): two acquires of one key
	// read their clocks in the order they write, so a holding that began
	// and ended — and whose row another program deleted — while an
	// acquire waited cannot have a token above the one that acquire
	// writes.
	withKeyLockNow = "WITH g AS MATERIALIZED (SELECT pg_advisory_xact_lock(" + advisoryClass + ", hashtext($1::text || $2::text))), " +
		nowCTE + " FROM g) c)"
	// advisoryClass is the first key of warden's advisory locks ("ward").
	advisoryClass = "2002874980"
	// tokenSQL is driver.TokenBaseMicro of n.c: Unix ms × 4096 plus the
	// microseconds within the millisecond × 4096 / 1000.
	tokenSQL = "(floor(extract(epoch FROM n.t) * 1000)::bigint * 4096 + (extract(microseconds FROM n.c)::bigint % 1000) * 4096 / 1000)"
)

// ms renders a parameter of whole milliseconds as an interval.
func ms(p string) string { return "(" + p + "::bigint * interval '1 millisecond')" }

// epochMS renders a timestamptz expression as Unix milliseconds.
func epochMS(e string) string { return "floor(extract(epoch FROM " + e + ") * 1000)::bigint" }

const (
	lockCols = "owner, token, acquired_at, expires_at"
	circCols = "key, state, failure_count, last_failure_time, last_success_time, opened_at, probe_owner, probe_until, version, updated_at, " +
		"successes, total_failures, consecutive_successes, interval_start, probes, probe_epoch"
	idemCols = "key, status, owner, fingerprint, result, created_at, expires_at"
	cpCols   = "task_id, sequence, \"timestamp\", progress, data, estimated_time_remaining, token"
	keyEq    = "namespace = $1::text AND key = $2::text"
)

// listQuery is a page of a listing: after the key range ($2, $3), the
// LIKE pattern ($4) and the last key of the previous page ($5).
func listQuery(cols, table, col, extra string) string {
	return "SELECT " + cols + " FROM " + table + " WHERE namespace = $1::text AND " + col + " >= $2::text AND (" + col +
		" < $3::text OR $3::text = '') AND " + col + " LIKE $4::text ESCAPE '!' AND " + col + " > $5::text" + extra +
		" ORDER BY " + col + " LIMIT " + strconv.Itoa(listPage)
}

// buildQueries renders the statements for the tables t (ident quotes and
// qualifies a table name) and the NOTIFY channel.
func buildQueries(t Tables, ident func(string) string, channel string) queries {
	sub := strings.NewReplacer("CHAN", "'"+channel+"'", "TOKENBASE", tokenSQL).Replace
	L, C, K, I, P, F := ident(t.Locks), ident(t.Circuits), ident(t.Cache), ident(t.Idempotency), ident(t.Checkpoints), ident(t.CheckpointTasks)
	var q queries
	// ----- locks
	// A holding is live while expires_at is in the future; Release moves
	// expires_at back to the release time, so released rows are not live.
	q.lockAcquire = sub(withKeyLockNow + `,
cur AS MATERIALIZED (SELECT ` + lockCols + ` FROM ` + L + ` WHERE ` + keyEq + ` FOR UPDATE),
up AS (
	INSERT INTO ` + L + ` AS l (namespace, key, owner, token, created_at, acquired_at, expires_at, released_at, updated_at)
	SELECT $1::text, $2::text, $3::text, TOKENBASE, n.t, n.t, n.t + ` + ms("$4") + `, NULL, n.t FROM n LEFT JOIN cur ON true
	ON CONFLICT (namespace, key) DO UPDATE SET
		token = CASE WHEN l.expires_at > EXCLUDED.created_at THEN l.token ELSE GREATEST(l.token + 1, EXCLUDED.token) END,
		acquired_at = CASE WHEN l.expires_at > EXCLUDED.created_at THEN l.acquired_at ELSE EXCLUDED.created_at END,
		owner = EXCLUDED.owner,
		expires_at = EXCLUDED.expires_at,
		released_at = NULL,
		updated_at = EXCLUDED.created_at
	WHERE l.expires_at <= EXCLUDED.created_at OR (l.owner = EXCLUDED.owner AND l.released_at IS NULL)
	RETURNING l.owner, l.token, l.acquired_at, l.expires_at
),
ev AS (
	SELECT pg_notify(CHAN, json_build_object('e', 'a', 'n', $1::text, 'k', $2::text, 'o', up.owner, 't', up.token,
		'at', ` + epochMS("up.acquired_at") + `)::text)
	FROM up WHERE NOT EXISTS (SELECT 1 FROM cur, n WHERE cur.expires_at > n.t)
)
SELECT owner, token, acquired_at, expires_at, true, (SELECT count(*) FROM ev) FROM up
UNION ALL
SELECT owner, token, acquired_at, expires_at, false, 0 FROM cur WHERE NOT EXISTS (SELECT 1 FROM up)`)
	q.lockRefresh = sub(withNow + `
UPDATE ` + L + ` AS l SET expires_at = n.t + ` + ms("$5") + `, updated_at = n.t FROM n
WHERE l.namespace = $1::text AND l.key = $2::text AND l.owner = $3::text AND l.token = $4::bigint
	AND l.released_at IS NULL AND l.expires_at > n.t
RETURNING l.owner, l.token, l.acquired_at, l.expires_at`)
	release := func(cond string) string {
		return sub(withNow + `,
up AS (
	UPDATE ` + L + ` AS l SET released_at = n.t, expires_at = LEAST(l.expires_at, n.t), updated_at = n.t FROM n
	WHERE l.namespace = $1::text AND l.key = $2::text AND ` + cond + `
	RETURNING l.owner, l.token, n.t AS at
),
ev AS (
	SELECT pg_notify(CHAN, json_build_object('e', 'r', 'n', $1::text, 'k', $2::text, 'o', up.owner, 't', up.token,
		'at', ` + epochMS("up.at") + `)::text) FROM up
)
SELECT (SELECT count(*) FROM up), (SELECT count(*) FROM ev)`)
	}
	q.lockRelease = release("l.owner = $3::text AND l.token = $4::bigint AND l.released_at IS NULL")
	q.lockForce = release("l.released_at IS NULL AND l.expires_at > n.t")
	q.lockGet = `SELECT ` + lockCols + ` FROM ` + L + ` WHERE ` + keyEq + ` AND expires_at > ` + nowSQL
	q.lockList = listQuery("key, "+lockCols, L, "key", " AND expires_at > "+nowSQL)

	// ----- circuits
	// Changes lock the row (cur), compute the new record from it (absent:
	// closed, version 0) and upsert it under a version check, so a row
	// another caller inserted after the statement's snapshot is never
	// overwritten from stale values (the statement then returns no row and
	// runs again). The generation of an outcome ($4, -1 for any) is a
	// present circuit's opened_at in Unix milliseconds (0 if NULL), an
	// absent one's 0; an outcome of another generation changes nothing,
	// and so does a probe's outcome ($9: its probe epoch, 0 for other
	// calls) once the circuit's probe_epoch has moved on.
	circIns := `INSERT INTO ` + C + ` AS c (namespace, key, state, failure_count, last_failure_time, last_success_time,
		opened_at, probe_owner, probe_until, version, updated_at, successes, total_failures, consecutive_successes,
		interval_start, probes, probe_epoch)`
	circRet := "c.key, c.state, c.failure_count, c.last_failure_time, c.last_success_time, c.opened_at, c.probe_owner, " +
		"c.probe_until, c.version, c.updated_at, c.successes, c.total_failures, c.consecutive_successes, c.interval_start, c.probes, " +
		"c.probe_epoch"
	cur := `cur AS MATERIALIZED (SELECT ` + circCols + ` FROM ` + C + ` WHERE ` + keyEq + ` FOR UPDATE)`
	ev := `ev AS (
	SELECT pg_notify(CHAN, json_build_object('e', 'c', 'n', $1::text, 'k', up.key, 's', up.state, 'f', up.failure_count,
		'lf', ` + epochMS("up.last_failure_time") + `, 'ls', ` + epochMS("up.last_success_time") + `,
		'oa', ` + epochMS("up.opened_at") + `, 'po', up.probe_owner, 'pu', ` + epochMS("up.probe_until") + `,
		'v', up.version, 'u', ` + epochMS("up.updated_at") + `, 'sc', up.successes, 'tf', up.total_failures,
		'cs', up.consecutive_successes, 'is', ` + epochMS("up.interval_start") + `, 'pr', up.probes,
		'pe', up.probe_epoch)::text) FROM up
)`
	tail := `
SELECT ` + circCols + `, (SELECT count(*) FROM ev) FROM up
UNION ALL
SELECT ` + circCols + `, 0 FROM cur WHERE NOT EXISTS (SELECT 1 FROM up)`
	// RecordOutcome: $3 kind (0 none, 1 success, 2 failure), $4
	// generation, $5 successes, $6 threshold, $7 close-after, $8 interval
	// (milliseconds, 0: none), $9 probe epoch (0: none). The steps of driver.Circuits.RecordOutcome,
	// one CTE each: b the current record (no row: another generation), i
	// the closed state's counting period and batch of successes, k whether
	// the call opens or closes the circuit, v the new record.
	q.circOutcome = sub(withNow + `,
` + cur + `,
b AS (
	SELECT n.t, COALESCE(cur.state, 'closed') AS state, COALESCE(cur.failure_count, 0) AS failures,
		cur.last_failure_time AS lf, cur.last_success_time AS ls, cur.opened_at AS oa, cur.probe_owner AS po,
		cur.probe_until AS pu, COALESCE(cur.version, 0) AS version, COALESCE(cur.successes, 0) AS succ,
		COALESCE(cur.total_failures, 0) AS tf, COALESCE(cur.consecutive_successes, 0) AS cs, cur.interval_start AS ist,
		COALESCE(cur.probes, 0) AS probes, COALESCE(cur.probe_epoch, 0) AS pe
	FROM n LEFT JOIN cur ON true
	WHERE ($4::bigint < 0 OR COALESCE(` + epochMS("cur.opened_at") + `, 0) = $4::bigint)
		AND ($9::bigint = 0 OR COALESCE(cur.probe_epoch, 0) = $9::bigint)
),
i AS (
	SELECT b.t, b.state, b.lf, b.ls, b.oa, b.po, b.pu, b.version, b.probes, b.pe,
		CASE WHEN r.reset THEN 0 ELSE b.failures END AS failures,
		CASE WHEN r.reset THEN 0 ELSE b.succ END + CASE WHEN b.state = 'closed' THEN $5::bigint ELSE 0 END AS succ,
		CASE WHEN r.reset THEN 0 ELSE b.tf END AS tf,
		CASE WHEN r.reset THEN 0 ELSE b.cs END AS cs,
		CASE WHEN b.state = 'closed' AND $8::bigint > 0 AND (b.ist IS NULL OR r.reset) THEN b.t ELSE b.ist END AS ist
	FROM b, LATERAL (SELECT b.state = 'closed' AND $8::bigint > 0 AND b.ist IS NOT NULL
		AND b.ist + ` + ms("$8") + ` <= b.t AS reset) r
),
k AS (
	SELECT i.*,
		($3::int = 2 AND (i.state = 'half-open' OR (i.state = 'closed' AND $6::bigint > 0 AND i.failures + 1 >= $6::bigint))) AS opens,
		($3::int = 1 AND i.state = 'half-open' AND i.cs + 1 >= GREATEST($7::bigint, 1)) AS closes,
		CASE WHEN i.state = 'half-open' AND i.pu > i.t AND i.probes > 0 THEN i.probes ELSE 0 END AS live
	FROM i
),
v AS (
	SELECT t, version, pe,
		CASE WHEN opens THEN 'open' WHEN closes THEN 'closed' ELSE state END AS state,
		CASE WHEN closes THEN 0 WHEN $3::int = 2 THEN failures + 1 WHEN $3::int = 1 AND state = 'closed' THEN 0
			ELSE failures END AS failures,
		CASE WHEN $3::int = 2 THEN t ELSE lf END AS lf,
		CASE WHEN $3::int = 1 THEN t ELSE ls END AS ls,
		CASE WHEN opens THEN t WHEN closes THEN NULL ELSE oa END AS oa,
		CASE WHEN opens OR closes THEN NULL ELSE po END AS po,
		CASE WHEN opens OR closes THEN NULL ELSE pu END AS pu,
		CASE WHEN opens OR closes THEN 0 WHEN $3::int = 1 AND state = 'half-open' THEN GREATEST(live - 1, 0)
			ELSE probes END AS probes,
		CASE WHEN opens OR closes THEN 0 WHEN $3::int = 1 AND state IN ('closed', 'half-open') THEN succ + 1
			ELSE succ END AS succ,
		CASE WHEN opens OR closes THEN 0 WHEN $3::int = 2 AND state = 'closed' THEN tf + 1 ELSE tf END AS tf,
		CASE WHEN opens OR closes THEN 0 WHEN $3::int = 2 AND state = 'closed' THEN 0
			WHEN $3::int = 1 AND state IN ('closed', 'half-open') THEN cs + 1 ELSE cs END AS cs,
		CASE WHEN closes THEN t ELSE ist END AS ist
	FROM k
),
up AS (
	` + circIns + `
	SELECT $1::text, $2::text, v.state, v.failures, v.lf, v.ls, v.oa, v.po, v.pu, v.version + 1, v.t, v.succ, v.tf,
		v.cs, v.ist, v.probes, v.pe FROM v
	ON CONFLICT (namespace, key) DO UPDATE SET
		state = EXCLUDED.state, failure_count = EXCLUDED.failure_count, last_failure_time = EXCLUDED.last_failure_time,
		last_success_time = EXCLUDED.last_success_time, opened_at = EXCLUDED.opened_at,
		probe_owner = EXCLUDED.probe_owner, probe_until = EXCLUDED.probe_until, version = EXCLUDED.version,
		updated_at = EXCLUDED.updated_at, successes = EXCLUDED.successes, total_failures = EXCLUDED.total_failures,
		consecutive_successes = EXCLUDED.consecutive_successes, interval_start = EXCLUDED.interval_start,
		probes = EXCLUDED.probes, probe_epoch = EXCLUDED.probe_epoch
	WHERE c.version = EXCLUDED.version - 1
	RETURNING ` + circRet + `
),
` + ev + tail)
	// Trip: $3 version.
	q.circTrip = sub(withNow + `,
` + cur + `,
up AS (
	UPDATE ` + C + ` AS c SET state = 'open', opened_at = n.t, probe_owner = NULL, probe_until = NULL, probes = 0,
		successes = 0, total_failures = 0, consecutive_successes = 0, version = c.version + 1, updated_at = n.t
	FROM n LEFT JOIN cur ON true
	WHERE c.namespace = $1::text AND c.key = $2::text AND c.state = 'closed' AND c.version = $3::bigint
	RETURNING ` + circRet + `
),
` + ev + tail)
	// TryProbes: $3 owner, $4 openFor, $5 lease (milliseconds), $6
	// maxProbes. The first slot from open, or after every slot lapsed,
	// begins a new set (probe_epoch + 1).
	liveProbes := "(CASE WHEN c.probe_until > n.t AND c.probes > 0 THEN c.probes ELSE 0 END)"
	mine := "(c.probe_owner = $3::text AND c.probe_until > n.t)"
	q.circProbes = sub(withNow + `,
` + cur + `,
up AS (
	UPDATE ` + C + ` AS c SET state = 'half-open',
		probe_epoch = CASE WHEN c.state = 'open' OR COALESCE(c.probe_until, 'epoch') <= n.t THEN c.probe_epoch + 1
			ELSE c.probe_epoch END,
		successes = CASE WHEN c.state = 'open' THEN 0 ELSE c.successes END,
		total_failures = CASE WHEN c.state = 'open' THEN 0 ELSE c.total_failures END,
		consecutive_successes = CASE WHEN c.state = 'open' THEN 0 ELSE c.consecutive_successes END,
		probes = CASE WHEN c.state = 'open' THEN 1 WHEN ` + mine + ` THEN GREATEST(` + liveProbes + `, 1) ELSE ` + liveProbes + ` + 1 END,
		probe_owner = $3::text, probe_until = n.t + ` + ms("$5") + `, version = c.version + 1, updated_at = n.t
	FROM n LEFT JOIN cur ON true
	WHERE c.namespace = $1::text AND c.key = $2::text AND (
		(c.state = 'open' AND COALESCE(c.opened_at, 'epoch') + ` + ms("$4") + ` <= n.t)
		OR (c.state = 'half-open' AND (` + mine + ` OR ` + liveProbes + ` < $6::bigint)))
	RETURNING ` + circRet + `
),
` + ev + tail)
	q.circGet = `SELECT ` + circCols + ` FROM ` + C + ` WHERE ` + keyEq
	q.circSet = sub(withNow + `,
up AS (
	` + circIns + `
	SELECT $1::text, $2::text, $3::text, 0, NULL, NULL, CASE WHEN $3::text = 'open' THEN n.t END, NULL, NULL, 1, n.t,
		0, 0, 0, CASE WHEN $3::text = 'closed' THEN n.t END, 0, 1 FROM n
	ON CONFLICT (namespace, key) DO UPDATE SET
		failure_count = CASE WHEN EXCLUDED.state = 'closed' THEN 0 ELSE c.failure_count END,
		opened_at = CASE EXCLUDED.state WHEN 'open' THEN EXCLUDED.updated_at WHEN 'closed' THEN NULL ELSE c.opened_at END,
		interval_start = CASE WHEN EXCLUDED.state = 'closed' THEN EXCLUDED.updated_at ELSE c.interval_start END,
		state = EXCLUDED.state,
		probe_owner = NULL, probe_until = NULL, probes = 0, probe_epoch = c.probe_epoch + 1,
		successes = 0, total_failures = 0, consecutive_successes = 0,
		version = c.version + 1,
		updated_at = EXCLUDED.updated_at
	RETURNING ` + circRet + `
),
` + ev + `
SELECT ` + circCols + `, (SELECT count(*) FROM ev) FROM up`)
	q.circDelete = sub(withNow + `,
d AS (DELETE FROM ` + C + ` WHERE ` + keyEq + ` RETURNING key),
ev AS (SELECT pg_notify(CHAN, json_build_object('e', 'd', 'n', $1::text, 'k', d.key, 'u', ` + epochMS("n.t") + `)::text) FROM d, n)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM ev)`)
	q.circList = listQuery(circCols, C, "key", "")

	// ----- cache
	live := "(expires_at IS NULL OR expires_at > " + nowSQL + ")"
	q.cacheGet = `SELECT value, expires_at FROM ` + K + ` WHERE ` + keyEq + ` AND ` + live
	q.cacheSet = withNow + `
INSERT INTO ` + K + ` AS c (namespace, key, value, expires_at, updated_at)
SELECT $1::text, $2::text, $3::bytea, n.t + ` + ms("$4") + `, n.t FROM n
ON CONFLICT (namespace, key) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at, updated_at = EXCLUDED.updated_at`
	q.cacheSetIfAbsent = q.cacheSet + `
WHERE c.expires_at IS NOT NULL AND c.expires_at <= EXCLUDED.updated_at
RETURNING 1`
	q.cacheDelete = `DELETE FROM ` + K + ` WHERE ` + keyEq + ` AND ` + live
	q.cacheHas = `SELECT 1 FROM ` + K + ` WHERE ` + keyEq + ` AND ` + live
	q.cacheClear = withNow + `,
d AS (DELETE FROM ` + K + ` WHERE namespace = $1::text AND key >= $2::text AND (key < $3::text OR $3::text = '') RETURNING expires_at)
SELECT count(*) FILTER (WHERE d.expires_at IS NULL OR d.expires_at > n.t) FROM d, n`
	q.cacheKeys = listQuery("key", K, "key", " AND "+live)

	// ----- idempotency
	idemRet := "i.key, i.status, i.owner, i.fingerprint, i.result, i.created_at, i.expires_at"
	lapsed := "i.expires_at IS NOT NULL AND i.expires_at <= EXCLUDED.created_at"
	// Outcomes: 1 claimed (new, lapsed completed, or owner's own pending
	// claim renewed), 2 taken over (lapsed pending), 3 in progress, 4
	// completed.
	q.idemClaim = withNow + `,
cur AS MATERIALIZED (SELECT ` + idemCols + ` FROM ` + I + ` WHERE ` + keyEq + ` FOR UPDATE),
up AS (
	INSERT INTO ` + I + ` AS i (namespace, key, status, owner, fingerprint, result, created_at, expires_at, updated_at)
	SELECT $1::text, $2::text, 'pending', $3::text, $4::bytea, NULL, n.t, n.t + ` + ms("$5") + `, n.t FROM n LEFT JOIN cur ON true
	ON CONFLICT (namespace, key) DO UPDATE SET
		status = 'pending',
		owner = EXCLUDED.owner,
		fingerprint = CASE WHEN ` + lapsed + ` THEN EXCLUDED.fingerprint ELSE i.fingerprint END,
		result = NULL,
		created_at = CASE WHEN ` + lapsed + ` THEN EXCLUDED.created_at ELSE i.created_at END,
		expires_at = EXCLUDED.expires_at,
		updated_at = EXCLUDED.created_at
	WHERE (` + lapsed + `) OR (i.status = 'pending' AND i.owner = EXCLUDED.owner)
	RETURNING ` + idemRet + `
)
SELECT CASE WHEN c.status = 'pending' AND c.expires_at IS NOT NULL AND c.expires_at <= n.t THEN 2 ELSE 1 END,
	up.key, up.status, up.owner, up.fingerprint, up.result, up.created_at, up.expires_at
FROM up CROSS JOIN n LEFT JOIN cur c ON true
UNION ALL
SELECT CASE WHEN c.status = 'pending' THEN 3 ELSE 4 END, ` + idemCols + ` FROM cur c WHERE NOT EXISTS (SELECT 1 FROM up)`
	q.idemRow = `SELECT ` + idemCols + ` FROM ` + I + ` WHERE ` + keyEq
	q.idemExtend = withNow + `
UPDATE ` + I + ` AS i SET expires_at = n.t + ` + ms("$4") + `, updated_at = n.t FROM n
WHERE i.namespace = $1::text AND i.key = $2::text AND i.status = 'pending' AND i.owner = $3::text`
	q.idemComplete = withNow + `
UPDATE ` + I + ` AS i SET status = 'completed', result = $4::bytea, expires_at = n.t + ` + ms("$5") + `, updated_at = n.t FROM n
WHERE i.namespace = $1::text AND i.key = $2::text AND i.status = 'pending' AND i.owner = $3::text`
	q.idemAbandon = `DELETE FROM ` + I + ` WHERE ` + keyEq + ` AND status = 'pending' AND owner = $3::text`
	q.idemGet = `SELECT ` + idemCols + ` FROM ` + I + ` WHERE ` + keyEq + ` AND ` + live
	q.idemSet = withNow + `
INSERT INTO ` + I + ` AS i (namespace, key, status, owner, fingerprint, result, created_at, expires_at, updated_at)
SELECT $1::text, $2::text, 'completed', NULL, NULL, $3::bytea, n.t, n.t + ` + ms("$4") + `, n.t FROM n
ON CONFLICT (namespace, key) DO UPDATE SET status = 'completed', owner = NULL, fingerprint = NULL, result = EXCLUDED.result,
	created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at, updated_at = EXCLUDED.updated_at`
	q.idemDelete = `DELETE FROM ` + I + ` WHERE ` + keyEq + ` AND ` + live
	q.idemList = listQuery(idemCols, I, "key", " AND "+live)

	// ----- checkpoints
	// Save: the fence row's upsert decides (refused: no row) and assigns
	// the sequence, holding the fence row's lock until the statement
	// commits, so concurrent savers of a task queue; the checkpoint is
	// inserted by the same statement. A task without a fence row starts
	// from its checkpoints' highest sequence and token.
	// $1 ns, $2 task, $3 token, $4 progress, $5 data, $6 eta (ms or NULL).
	const task = "namespace = $1::text AND task_id = $2::text"
	q.cpSave = withNow + `,
f AS (
	INSERT INTO ` + F + ` AS f (namespace, task_id, fence_token, last_sequence, updated_at)
	SELECT $1::text, $2::text, GREATEST($3::bigint, (SELECT COALESCE(MAX(token), 0) FROM ` + P + ` WHERE ` + task + `)),
		(SELECT COALESCE(MAX(sequence), 0) FROM ` + P + ` WHERE ` + task + `) + 1, n.t FROM n
	ON CONFLICT (namespace, task_id) DO UPDATE SET
		last_sequence = f.last_sequence + 1,
		fence_token = GREATEST(f.fence_token, $3::bigint),
		updated_at = EXCLUDED.updated_at
	WHERE $3::bigint = 0 OR $3::bigint >= f.fence_token
	RETURNING f.last_sequence
),
ins AS (
	INSERT INTO ` + P + ` (namespace, id, task_id, sequence, "timestamp", progress, data, estimated_time_remaining, token)
	SELECT $1::text, $2::text || ':' || f.last_sequence, $2::text, f.last_sequence, ` + epochMS("n.t") + `,
		$4::double precision, $5::bytea, $6::bigint, $3::bigint
	FROM f, n
	RETURNING ` + cpCols + `
)
SELECT ` + cpCols + ` FROM ins`
	// Fence: a row if accepted.
	q.cpFence = withNow + `
INSERT INTO ` + F + ` AS f (namespace, task_id, fence_token, last_sequence, updated_at)
SELECT $1::text, $2::text, $3::bigint, (SELECT COALESCE(MAX(sequence), 0) FROM ` + P + ` WHERE ` + task + `), n.t FROM n
ON CONFLICT (namespace, task_id) DO UPDATE SET
	updated_at = CASE WHEN EXCLUDED.fence_token > f.fence_token THEN EXCLUDED.updated_at ELSE f.updated_at END,
	fence_token = EXCLUDED.fence_token
WHERE EXCLUDED.fence_token >= f.fence_token
RETURNING 1`
	q.cpFenceLock = `SELECT fence_token FROM ` + F + ` WHERE ` + task + ` FOR UPDATE`
	q.cpMaxToken = `SELECT COALESCE(MAX(token), 0) FROM ` + P + ` WHERE ` + task
	q.cpLoad = `SELECT ` + cpCols + ` FROM ` + P + ` WHERE ` + task + ` AND sequence = $3::bigint`
	q.cpLatest = `SELECT ` + cpCols + ` FROM ` + P + ` WHERE ` + task + ` ORDER BY sequence DESC LIMIT 1`
	q.cpList = `SELECT ` + cpCols + ` FROM ` + P + ` WHERE ` + task + ` ORDER BY sequence`
	q.cpCleanup = `DELETE FROM ` + P + ` WHERE ` + task + ` AND sequence <= (SELECT sequence FROM ` + P + ` WHERE ` + task +
		` ORDER BY sequence DESC OFFSET $3::bigint LIMIT 1)`
	q.cpDelete = `DELETE FROM ` + P + ` WHERE ` + task
	q.cpTasks = "SELECT DISTINCT task_id FROM " + P + " WHERE namespace = $1::text AND task_id >= $2::text AND (task_id < $3::text OR $3::text = '')" +
		" AND task_id LIKE $4::text ESCAPE '!' AND task_id > $5::text ORDER BY task_id LIMIT " + strconv.Itoa(listPage)

	// ----- purge: batches of at most purgeBatch rows, by ctid.
	batch := func(table, cond string) string {
		return `DELETE FROM ` + table + ` WHERE ctid = ANY(ARRAY(SELECT ctid FROM ` + table + ` WHERE ` + cond + ` LIMIT ` + strconv.Itoa(purgeBatch) + `))`
	}
	q.purgeCache = batch(K, "namespace = $1::text AND key >= $2::text AND (key < $3::text OR $3::text = '') AND expires_at <= "+nowSQL)
	q.purgeIdem = batch(I, "namespace = $1::text AND expires_at <= "+nowSQL)
	q.purgeLocks = batch(L, "namespace = $1::text AND key >= $2::text AND (key < $3::text OR $3::text = '') AND expires_at <= "+
		nowSQL+" - "+ms("$4"))
	q.purgeFences = batch(F, "namespace = $1::text AND updated_at <= "+nowSQL+" - "+ms("$2")+
		" AND NOT EXISTS (SELECT 1 FROM "+P+" p WHERE p.namespace = "+F+".namespace AND p.task_id = "+F+".task_id)")
	return q
}

// purgeBatch is the most rows one purge statement deletes.
const purgeBatch = 1000
