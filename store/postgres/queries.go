package postgres

import "strings"

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
	circFailure, circFailureGen, circSuccess, circSuccessGen, circProbe     string
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
	nowSQL   = "date_trunc('milliseconds', clock_timestamp())"
	withNow  = "WITH n AS MATERIALIZED (SELECT " + nowSQL + " AS t)"
	tokenSQL = "(floor(extract(epoch FROM n.t) * 1000)::bigint * 4096)"
)

// ms renders a parameter of whole milliseconds as an interval.
func ms(p string) string { return "(" + p + "::bigint * interval '1 millisecond')" }

// epochMS renders a timestamptz expression as Unix milliseconds.
func epochMS(e string) string { return "floor(extract(epoch FROM " + e + ") * 1000)::bigint" }

const (
	lockCols  = "owner, token, acquired_at, expires_at"
	circCols  = "key, state, failure_count, last_failure_time, last_success_time, opened_at, probe_owner, probe_until, version, updated_at"
	idemCols  = "key, status, owner, fingerprint, result, created_at, expires_at"
	cpCols    = "task_id, sequence, \"timestamp\", progress, data, estimated_time_remaining, token"
	keyEq     = "namespace = $1::text AND key = $2::text"
	listLimit = "500"
)

// listQuery is a page of a listing: after the key range ($2, $3), the
// LIKE pattern ($4) and the last key of the previous page ($5).
func listQuery(cols, table, col, extra string) string {
	return "SELECT " + cols + " FROM " + table + " WHERE namespace = $1::text AND " + col + " >= $2::text AND (" + col +
		" < $3::text OR $3::text = '') AND " + col + " LIKE $4::text ESCAPE '!' AND " + col + " > $5::text" + extra +
		" ORDER BY " + col + " LIMIT " + listLimit
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
	q.lockAcquire = sub(withNow + `,
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
	// An outcome carries a generation ($gen, -1 for any): a present
	// circuit's is opened_at in Unix milliseconds (0 if NULL), an absent
	// one's 0. For generations -1 and 0 the outcome is an upsert whose
	// update applies only to the right generation; for a generation above
	// 0 the circuit must exist: an update of that generation.
	circIns := `INSERT INTO ` + C + ` AS c (namespace, key, state, failure_count, last_failure_time, last_success_time, opened_at, probe_owner, probe_until, version, updated_at)`
	circRet := "c.key, c.state, c.failure_count, c.last_failure_time, c.last_success_time, c.opened_at, c.probe_owner, c.probe_until, c.version, c.updated_at"
	cur := `cur AS MATERIALIZED (SELECT ` + circCols + ` FROM ` + C + ` WHERE ` + keyEq + ` FOR UPDATE)`
	ev := `ev AS (
	SELECT pg_notify(CHAN, json_build_object('e', 'c', 'n', $1::text, 'k', up.key, 's', up.state, 'f', up.failure_count,
		'lf', ` + epochMS("up.last_failure_time") + `, 'ls', ` + epochMS("up.last_success_time") + `,
		'oa', ` + epochMS("up.opened_at") + `, 'po', up.probe_owner, 'pu', ` + epochMS("up.probe_until") + `,
		'v', up.version, 'u', ` + epochMS("up.updated_at") + `)::text) FROM up
)`
	tail := `
SELECT ` + circCols + `, (SELECT count(*) FROM ev) FROM up
UNION ALL
SELECT ` + circCols + `, 0 FROM cur WHERE NOT EXISTS (SELECT 1 FROM up)`
	// genOK and gen compare the generation parameter G.
	genOK := "(G::bigint < 0 OR COALESCE(" + epochMS("c.opened_at") + ", 0) = G::bigint)"
	opens := "(c.state IN ('open', 'half-open') OR c.failure_count + 1 >= $3::bigint)"
	failSet := `opened_at = CASE WHEN c.state = 'open' THEN c.opened_at WHEN c.state = 'half-open' OR c.failure_count + 1 >= $3::bigint THEN n.t ELSE c.opened_at END,
		probe_owner = CASE WHEN ` + opens + ` THEN NULL ELSE c.probe_owner END,
		probe_until = CASE WHEN ` + opens + ` THEN NULL ELSE c.probe_until END,
		state = CASE WHEN ` + opens + ` THEN 'open' ELSE 'closed' END,
		failure_count = c.failure_count + 1,
		last_failure_time = n.t,
		version = c.version + 1,
		updated_at = n.t`
	successSet := `failure_count = CASE WHEN c.state = 'open' THEN c.failure_count ELSE 0 END,
		probe_owner = CASE WHEN c.state = 'open' THEN c.probe_owner END,
		probe_until = CASE WHEN c.state = 'open' THEN c.probe_until END,
		state = CASE WHEN c.state = 'open' THEN 'open' ELSE 'closed' END,
		last_success_time = n.t,
		version = c.version + 1,
		updated_at = n.t`
	// In an ON CONFLICT clause n is not in scope: EXCLUDED.updated_at is
	// n.t there.
	excl := strings.NewReplacer("n.t", "EXCLUDED.updated_at")
	upsert := func(values, set, g string) string {
		return strings.ReplaceAll(sub(withNow+`,
`+cur+`,
up AS (
	`+circIns+`
	SELECT `+values+` FROM n LEFT JOIN cur ON true WHERE G::bigint <= 0
	ON CONFLICT (namespace, key) DO UPDATE SET
		`+excl.Replace(set)+`
	WHERE `+genOK+`
	RETURNING `+circRet+`
),
`+ev+tail), "G::", g+"::")
	}
	update := func(set, where, g string) string {
		return strings.ReplaceAll(sub(withNow+`,
`+cur+`,
up AS (
	UPDATE `+C+` AS c SET
		`+set+`
	FROM n LEFT JOIN cur ON true
	WHERE c.namespace = $1::text AND c.key = $2::text AND `+where+`
	RETURNING `+circRet+`
),
`+ev+tail), "G::", g+"::")
	}
	gen := "G::bigint > 0 AND " + epochMS("c.opened_at") + " = G::bigint"
	// RecordFailure: $3 threshold, $4 generation. RecordSuccess: $3
	// generation.
	q.circFailure = upsert(`$1::text, $2::text, CASE WHEN $3::bigint <= 1 THEN 'open' ELSE 'closed' END, 1, n.t, NULL,
		CASE WHEN $3::bigint <= 1 THEN n.t END, NULL, NULL, 1, n.t`, failSet, "$4")
	q.circFailureGen = update(failSet, gen, "$4")
	q.circSuccess = upsert(`$1::text, $2::text, 'closed', 0, NULL, n.t, NULL, NULL, NULL, 1, n.t`, successSet, "$3")
	q.circSuccessGen = update(successSet, gen, "$3")
	// TryProbe: $3 owner, $4 openFor, $5 lease (milliseconds).
	q.circProbe = sub(withNow + `,
` + cur + `,
up AS (
	UPDATE ` + C + ` AS c SET state = 'half-open', probe_owner = $3::text, probe_until = n.t + ` + ms("$5") + `,
		version = c.version + 1, updated_at = n.t
	FROM n LEFT JOIN cur ON true
	WHERE c.namespace = $1::text AND c.key = $2::text AND (
		(c.state = 'open' AND COALESCE(c.opened_at, 'epoch') + ` + ms("$4") + ` <= n.t)
		OR (c.state = 'half-open' AND (c.probe_owner IS NULL OR c.probe_owner = $3::text OR COALESCE(c.probe_until, 'epoch') <= n.t)))
	RETURNING ` + circRet + `
),
` + ev + tail)
	q.circGet = `SELECT ` + circCols + ` FROM ` + C + ` WHERE ` + keyEq
	q.circSet = sub(withNow + `,
up AS (
	` + circIns + `
	SELECT $1::text, $2::text, $3::text, 0, NULL, NULL, CASE WHEN $3::text = 'open' THEN n.t END, NULL, NULL, 1, n.t FROM n
	ON CONFLICT (namespace, key) DO UPDATE SET
		failure_count = CASE WHEN EXCLUDED.state = 'closed' THEN 0 ELSE c.failure_count END,
		opened_at = CASE WHEN EXCLUDED.state = 'open' THEN EXCLUDED.updated_at ELSE c.opened_at END,
		state = EXCLUDED.state,
		probe_owner = NULL,
		probe_until = NULL,
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
		" AND task_id LIKE $4::text ESCAPE '!' AND task_id > $5::text ORDER BY task_id LIMIT " + listLimit

	// ----- purge: batches of at most purgeBatch rows, by ctid.
	batch := func(table, cond string) string {
		return `DELETE FROM ` + table + ` WHERE ctid = ANY(ARRAY(SELECT ctid FROM ` + table + ` WHERE ` + cond + ` LIMIT ` + purgeBatch + `))`
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
const purgeBatch = "1000"
