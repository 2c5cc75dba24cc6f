package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// eventWindow is how many of the newest events the events table keeps:
// events are pruned by insertion order (id), never by their time, which
// is the time of what they report (an expiry can be long past when the
// takeover that reports it happens). A watcher that falls further behind
// than this many events gets EventsLost.
const eventWindow = 16384

// querier is what *sql.DB, *sql.Conn and *sql.Tx have in common.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// column is one column warden reads or writes. decl is its declaration in
// CREATE TABLE; add is the declaration used to add it to an existing table
// (ALTER TABLE … ADD COLUMN cannot add a NOT NULL column without default).
type column struct {
	name, decl, add string
}

// tableDef describes one table of the layout.
type tableDef struct {
	name   string
	cols   []column
	suffix string // table constraints after the columns
	unique string // columns (comma-separated) that must be unique: upserts use ON CONFLICT on them; "" for none
}

// indexDef is one index; triggerDef one trigger.
type indexDef struct{ name, sql string }
type triggerDef struct {
	name, sql string
	// replace: a trigger of this name whose definition differs from sql
	// (an earlier version's) is dropped and created again. Other triggers
	// are only created when missing.
	replace bool
}

// layout is the complete schema for a configuration.
type layout struct {
	tables   []tableDef
	indexes  []indexDef
	triggers []triggerDef
}

func quote(name string) string { return `"` + name + `"` }

// nsDecl declares the namespace column: the store's prefix, which makes
// namespaces exact (prefix "a" with key "bk" and prefix "ab" with key "k"
// store the same key text, in different namespaces).
const nsDecl = "TEXT NOT NULL DEFAULT ''"

func newLayout(c config) layout {
	L, C, K, I, P, F, E, W, T := c.locks, c.circuits, c.cache, c.idempotency, c.checkpoints, c.cpTasks, c.events, c.watchers, c.turns
	var l layout
	l.tables = []tableDef{
		{name: L, unique: "namespace,key", suffix: "PRIMARY KEY (namespace, key)", cols: []column{
			{"namespace", nsDecl, nsDecl},
			{"key", "TEXT NOT NULL", ""},
			{"owner", "TEXT", "TEXT"},
			{"expires_at", "INTEGER NOT NULL", "INTEGER"},
			{"created_at", "INTEGER NOT NULL", "INTEGER"},
			{"acquired_at", "INTEGER NOT NULL", "INTEGER"},
			{"token", "INTEGER NOT NULL", "INTEGER"},
			{"released_at", "INTEGER", "INTEGER"},
			{"updated_at", "INTEGER NOT NULL", "INTEGER"},
		}},
		{name: C, unique: "namespace,key", suffix: "PRIMARY KEY (namespace, key)", cols: []column{
			{"namespace", nsDecl, nsDecl},
			{"key", "TEXT NOT NULL", ""},
			{"state", "TEXT NOT NULL", "TEXT NOT NULL DEFAULT 'closed'"},
			{"failure_count", "INTEGER NOT NULL DEFAULT 0", "INTEGER NOT NULL DEFAULT 0"},
			{"last_failure_time", "INTEGER", "INTEGER"},
			{"last_success_time", "INTEGER", "INTEGER"},
			{"opened_at", "INTEGER", "INTEGER"},
			{"probe_owner", "TEXT", "TEXT"},
			{"probe_until", "INTEGER", "INTEGER"},
			{"version", "INTEGER NOT NULL DEFAULT 0", "INTEGER NOT NULL DEFAULT 0"},
			{"updated_at", "INTEGER NOT NULL", "INTEGER"},
			// The counts (breaker gobreaker parity); rows of writers that
			// do not keep them read 0.
			{"successes", "INTEGER NOT NULL DEFAULT 0", "INTEGER NOT NULL DEFAULT 0"},
			{"total_failures", "INTEGER NOT NULL DEFAULT 0", "INTEGER NOT NULL DEFAULT 0"},
			{"consecutive_successes", "INTEGER NOT NULL DEFAULT 0", "INTEGER NOT NULL DEFAULT 0"},
			{"interval_start", "INTEGER", "INTEGER"},
			{"probes", "INTEGER NOT NULL DEFAULT 0", "INTEGER NOT NULL DEFAULT 0"},
			// The current set of probe slots (driver.CircuitRecord.ProbeEpoch).
			{"probe_epoch", "INTEGER NOT NULL DEFAULT 0", "INTEGER NOT NULL DEFAULT 0"},
		}},
		{name: K, unique: "namespace,key", suffix: "PRIMARY KEY (namespace, key)", cols: []column{
			{"namespace", nsDecl, nsDecl},
			{"key", "TEXT NOT NULL", ""},
			{"value", "BLOB NOT NULL", "BLOB"},
			{"expires_at", "INTEGER", "INTEGER"},
			{"updated_at", "INTEGER NOT NULL", "INTEGER"},
		}},
		{name: I, unique: "namespace,key", suffix: "PRIMARY KEY (namespace, key)", cols: []column{
			{"namespace", nsDecl, nsDecl},
			{"key", "TEXT NOT NULL", ""},
			{"status", "TEXT NOT NULL", "TEXT NOT NULL DEFAULT 'completed'"},
			{"owner", "TEXT", "TEXT"},
			{"fingerprint", "TEXT", "TEXT"},
			{"result", "BLOB", "BLOB"},
			{"created_at", "INTEGER NOT NULL", "INTEGER"},
			{"expires_at", "INTEGER", "INTEGER"},
			{"updated_at", "INTEGER NOT NULL", "INTEGER"},
		}},
		{name: P, unique: "namespace,id", suffix: "PRIMARY KEY (namespace, id)", cols: []column{
			{"namespace", nsDecl, nsDecl},
			{"id", "TEXT NOT NULL", ""},
			{"task_id", "TEXT NOT NULL", "TEXT"},
			{"sequence", "INTEGER NOT NULL", "INTEGER"},
			{"timestamp", "INTEGER NOT NULL", "INTEGER"},
			{"progress", "REAL NOT NULL DEFAULT 0", "REAL NOT NULL DEFAULT 0"},
			{"data", "BLOB", "BLOB"},
			{"estimated_time_remaining", "INTEGER", "INTEGER"},
			{"token", "INTEGER NOT NULL DEFAULT 0", "INTEGER NOT NULL DEFAULT 0"},
		}},
		// One row per task: its checkpoint fence, which outlives the
		// task's checkpoints. A task with checkpoints but no row (a
		// database from before this table, or checkpoints written by
		// another program) starts from its checkpoints' highest sequence
		// and token: the statements that create a row read them.
		{name: F, unique: "namespace,task_id", suffix: "PRIMARY KEY (namespace, task_id)", cols: []column{
			{"namespace", nsDecl, nsDecl},
			{"task_id", "TEXT NOT NULL", ""},
			{"fence_token", "INTEGER NOT NULL DEFAULT 0", "INTEGER NOT NULL DEFAULT 0"},
			{"last_sequence", "INTEGER NOT NULL DEFAULT 0", "INTEGER NOT NULL DEFAULT 0"},
			{"updated_at", "INTEGER NOT NULL", "INTEGER"},
		}},
		{name: E, cols: []column{
			{"id", "INTEGER PRIMARY KEY AUTOINCREMENT", ""},
			{"kind", "TEXT NOT NULL", ""},
			{"namespace", "TEXT NOT NULL", ""},
			{"key", "TEXT NOT NULL", ""},
			{"owner", "TEXT", ""},
			{"token", "INTEGER", ""},
			{"at", "INTEGER NOT NULL", ""},
			{"data", "TEXT", ""},
		}},
		// The live watchers: one row per store that watches a namespace's
		// lock or circuit events (kind 'lock' or 'circuit'), kept while it
		// watches, its expiry pushed forward by its watcher goroutine. The
		// event triggers write only while a row of the namespace and kind
		// has not expired.
		{name: W, unique: "namespace,kind,id", suffix: "PRIMARY KEY (namespace, kind, id)", cols: []column{
			{"namespace", "TEXT NOT NULL", ""},
			{"kind", "TEXT NOT NULL", ""},
			{"id", "TEXT NOT NULL", ""},
			{"expires_at", "INTEGER NOT NULL", ""},
		}},
		// The queues of lock waiters (turns.go): one row per owner waiting
		// for a key in WaitLock, in the order of seq, kept while it waits
		// (its expiry pushed forward) and deleted when it acquires or
		// gives up. Warden's own table: the lock table's layout, shared
		// with go-go-scope, is unchanged.
		{name: T, unique: "namespace,key,owner", suffix: "PRIMARY KEY (namespace, key, owner)", cols: []column{
			{"namespace", "TEXT NOT NULL", ""},
			{"key", "TEXT NOT NULL", ""},
			{"owner", "TEXT NOT NULL", ""},
			{"seq", "INTEGER NOT NULL", ""},
			{"expires_at", "INTEGER NOT NULL", ""},
		}},
	}

	l.indexes = []indexDef{
		{L + "_expires_at_idx", fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (expires_at)`, quote(L+"_expires_at_idx"), quote(L))},
		{K + "_expires_at_idx", fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (expires_at)`, quote(K+"_expires_at_idx"), quote(K))},
		{I + "_expires_at_idx", fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (expires_at)`, quote(I+"_expires_at_idx"), quote(I))},
		{P + "_task_seq_idx", fmt.Sprintf(`CREATE UNIQUE INDEX IF NOT EXISTS %s ON %s (namespace, task_id, sequence)`, quote(P+"_task_seq_idx"), quote(P))},
	}

	// Lock events: a new holding (insert, or an update that changes the
	// token), the end of the previous holding when it was taken over
	// after expiring, and a release. A refresh or a re-acquire by the
	// live holder changes neither token nor released_at: no event. Every
	// event trigger fires only while the namespace has a live watcher of
	// the kind (watched): a store nobody watches writes no event.
	evCols := fmt.Sprintf(`INSERT INTO %s (kind, namespace, key, owner, token, at, data)`, quote(E))
	lockWatched := watched(W, "NEW", "lock")
	l.triggers = []triggerDef{
		{name: L + "_warden_ev_ins", sql: fmt.Sprintf(`CREATE TRIGGER IF NOT EXISTS %s AFTER INSERT ON %s
WHEN NEW.released_at IS NULL AND %s
BEGIN
	%s VALUES ('acquired', NEW.namespace, NEW.key, NEW.owner, NEW.token, COALESCE(NEW.acquired_at, NEW.updated_at, 0), NULL);
END`, quote(L+"_warden_ev_ins"), quote(L), lockWatched, evCols), replace: true},
		{name: L + "_warden_ev_upd", sql: fmt.Sprintf(`CREATE TRIGGER IF NOT EXISTS %s AFTER UPDATE ON %s
WHEN (NEW.token IS NOT OLD.token OR (OLD.released_at IS NULL AND NEW.released_at IS NOT NULL)) AND %s
BEGIN
	%s SELECT 'expired', OLD.namespace, OLD.key, OLD.owner, OLD.token, COALESCE(OLD.expires_at, 0), NULL
		WHERE NEW.token IS NOT OLD.token AND OLD.released_at IS NULL;
	%s SELECT 'released', NEW.namespace, NEW.key, NEW.owner, NEW.token, COALESCE(NEW.released_at, 0), NULL
		WHERE NEW.token IS OLD.token AND OLD.released_at IS NULL AND NEW.released_at IS NOT NULL;
	%s SELECT 'acquired', NEW.namespace, NEW.key, NEW.owner, NEW.token, COALESCE(NEW.acquired_at, NEW.updated_at, 0), NULL
		WHERE NEW.token IS NOT OLD.token AND NEW.released_at IS NULL;
END`, quote(L+"_warden_ev_upd"), quote(L), lockWatched, evCols, evCols, evCols), replace: true},
	}

	// Circuit events carry a JSON snapshot of the new record.
	snap := `json_object('state', NEW.state, 'failures', NEW.failure_count,
		'last_failure', NEW.last_failure_time, 'last_success', NEW.last_success_time,
		'opened_at', NEW.opened_at, 'probe_owner', NEW.probe_owner, 'probe_until', NEW.probe_until,
		'version', NEW.version, 'updated_at', NEW.updated_at,
		'successes', NEW.successes, 'total_failures', NEW.total_failures,
		'consecutive_successes', NEW.consecutive_successes, 'interval_start', NEW.interval_start, 'probes', NEW.probes,
		'probe_epoch', NEW.probe_epoch)`
	sqlNow := `CAST(unixepoch('subsec') * 1000 AS INTEGER)`
	l.triggers = append(l.triggers,
		triggerDef{name: C + "_warden_ev_ins", sql: fmt.Sprintf(`CREATE TRIGGER IF NOT EXISTS %s AFTER INSERT ON %s
WHEN %s
BEGIN
	%s VALUES ('circuit', NEW.namespace, NEW.key, NEW.probe_owner, NEW.version, COALESCE(NEW.updated_at, %s), %s);
END`, quote(C+"_warden_ev_ins"), quote(C), watched(W, "NEW", "circuit"), evCols, sqlNow, snap), replace: true},
		triggerDef{name: C + "_warden_ev_upd", sql: fmt.Sprintf(`CREATE TRIGGER IF NOT EXISTS %s AFTER UPDATE ON %s
WHEN (NEW.version IS NOT OLD.version OR NEW.state IS NOT OLD.state OR NEW.failure_count IS NOT OLD.failure_count
	OR NEW.probe_owner IS NOT OLD.probe_owner OR NEW.probe_until IS NOT OLD.probe_until) AND %s
BEGIN
	%s VALUES ('circuit', NEW.namespace, NEW.key, NEW.probe_owner, NEW.version, COALESCE(NEW.updated_at, %s), %s);
END`, quote(C+"_warden_ev_upd"), quote(C), watched(W, "NEW", "circuit"), evCols, sqlNow, snap), replace: true},
		triggerDef{name: C + "_warden_ev_del", sql: fmt.Sprintf(`CREATE TRIGGER IF NOT EXISTS %s AFTER DELETE ON %s
WHEN %s
BEGIN
	%s VALUES ('circuit-deleted', OLD.namespace, OLD.key, NULL, NULL, %s, NULL);
END`, quote(C+"_warden_ev_del"), quote(C), watched(W, "OLD", "circuit"), evCols, sqlNow), replace: true},
		// Pruning: each new event deletes up to 8 of the oldest events
		// that have fallen out of the window of the eventWindow newest
		// (by id: an event's "at" is the time of what it reports, which
		// for an expiry can be long before the event was written). At
		// most 8 rows are deleted, so the cost per event is constant; as
		// each event adds one, the table shrinks back to the window after
		// an upgrade. The trigger replaces the earlier time-based one of
		// the same name (replace).
		triggerDef{name: E + "_warden_prune", sql: fmt.Sprintf(`CREATE TRIGGER IF NOT EXISTS %s AFTER INSERT ON %s
BEGIN
	DELETE FROM %s WHERE id IN (
		SELECT id FROM %s WHERE id <= NEW.id - %d ORDER BY id LIMIT 8);
END`, quote(E+"_warden_prune"), quote(E), quote(E), quote(E), eventWindow), replace: true},
	)
	return l
}

// watched is the condition of an event trigger on a row of table alias
// row (NEW or OLD): the row's namespace has a watcher of kind ('lock' or
// 'circuit') in the watchers table w whose expiry has not passed. The
// clock is julianday('now') in Unix milliseconds, which every SQLite
// version has (a go-go-scope program writing the table runs the trigger
// too); a watcher's expiry is far longer than any difference between the
// clocks of processes on one host.
func watched(w, row, kind string) string {
	return fmt.Sprintf(`EXISTS (SELECT 1 FROM %s WHERE namespace = %s.namespace AND kind = '%s'
	AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))`, quote(w), row, kind)
}

func (t tableDef) createSQL() string {
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE TABLE IF NOT EXISTS %s (\n", quote(t.name))
	for i, c := range t.cols {
		if i > 0 {
			b.WriteString(",\n")
		}
		fmt.Fprintf(&b, "\t%s %s", c.name, c.decl)
	}
	if t.suffix != "" {
		b.WriteString(",\n\t" + t.suffix)
	}
	b.WriteString("\n)")
	return b.String()
}

// legacy records what an existing table needs beyond warden's own layout.
type legacy struct {
	// idemValue: the idempotency table has a NOT NULL "value" column
	// without default (the go-go-scope layout); inserts must fill it.
	idemValue bool
	// noTurns: the waiters' table is missing, in a file opened read-only
	// (written by a warden from before it): the store cannot wait in the
	// queue (it cannot acquire either), and its statements do not read
	// the table.
	noTurns bool
}

// inspection is what inspect found missing in the database.
type inspection struct {
	missingTables  []tableDef
	missingCols    map[string][]column // by table
	missingUnique  map[string]string   // table → columns lacking a unique index
	missingIndex   []indexDef
	missingTrigger []triggerDef
	staleTrigger   []triggerDef // replace triggers defined otherwise
	legacy         legacy
}

func (in inspection) current() bool {
	return len(in.missingTables) == 0 && len(in.missingCols) == 0 && len(in.missingUnique) == 0 &&
		len(in.missingIndex) == 0 && len(in.missingTrigger) == 0 && len(in.staleTrigger) == 0
}

// without returns in as if table were not missing.
func (in inspection) without(table string) inspection {
	var keep []tableDef
	for _, t := range in.missingTables {
		if t.name != table {
			keep = append(keep, t)
		}
	}
	in.missingTables = keep
	return in
}

// lacks reports whether table is missing.
func (in inspection) lacks(table string) bool {
	for _, t := range in.missingTables {
		if t.name == table {
			return true
		}
	}
	return false
}

// sameSQL reports whether two CREATE statements are the same definition:
// SQLite keeps a statement's text in sqlite_master without its
// IF NOT EXISTS, and whitespace does not count.
func sameSQL(a, b string) bool {
	norm := func(s string) string {
		f := strings.Fields(s)
		if len(f) >= 5 && strings.EqualFold(f[0], "CREATE") && strings.EqualFold(f[2], "IF") &&
			strings.EqualFold(f[3], "NOT") && strings.EqualFold(f[4], "EXISTS") {
			f = append(f[:2], f[5:]...)
		}
		return strings.Join(f, " ")
	}
	return norm(a) == norm(b)
}

type colInfo struct {
	notNull    bool
	hasDefault bool
	pk         bool
}

func tableColumns(ctx context.Context, q querier, table string) (map[string]colInfo, error) {
	rows, err := q.QueryContext(ctx, "SELECT name, \"notnull\", dflt_value IS NOT NULL, pk FROM pragma_table_info(?)", table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols := map[string]colInfo{}
	for rows.Next() {
		var name string
		var nn, def bool
		var pk int
		if err := rows.Scan(&name, &nn, &def, &pk); err != nil {
			return nil, err
		}
		cols[strings.ToLower(name)] = colInfo{notNull: nn, hasDefault: def, pk: pk > 0}
	}
	return cols, rows.Err()
}

// hasUnique reports whether table has a unique index (or primary key) on
// exactly the columns cols (comma-separated, in order).
func hasUnique(ctx context.Context, q querier, table, cols string) (bool, error) {
	var n int
	err := q.QueryRowContext(ctx, `SELECT count(*) FROM pragma_index_list(?) AS il
		WHERE il."unique" = 1
		AND (SELECT group_concat(lower(name), ',') FROM (SELECT name FROM pragma_index_info(il.name) ORDER BY seqno)) = lower(?)`, table, cols).Scan(&n)
	return n > 0, err
}

// inspect compares the database with the layout.
func inspect(ctx context.Context, q querier, l layout, idemTable string) (inspection, error) {
	in := inspection{missingCols: map[string][]column{}, missingUnique: map[string]string{}}
	for _, t := range l.tables {
		cols, err := tableColumns(ctx, q, t.name)
		if err != nil {
			return in, err
		}
		if len(cols) == 0 {
			in.missingTables = append(in.missingTables, t)
			continue
		}
		known := map[string]bool{}
		for _, c := range t.cols {
			known[c.name] = true
			if _, ok := cols[c.name]; !ok {
				if c.add == "" {
					return in, fmt.Errorf("sqlite: table %s lacks column %s, which cannot be added: drop or rename the table", t.name, c.name)
				}
				in.missingCols[t.name] = append(in.missingCols[t.name], c)
			}
		}
		for name, ci := range cols {
			if known[name] || !ci.notNull || ci.hasDefault || ci.pk {
				continue
			}
			if t.name == idemTable && name == "value" {
				in.legacy.idemValue = true
				continue
			}
			return in, fmt.Errorf("sqlite: table %s has a NOT NULL column %s without default that warden cannot fill", t.name, name)
		}
		if t.unique != "" {
			ok, err := hasUnique(ctx, q, t.name, t.unique)
			if err != nil {
				return in, err
			}
			if !ok {
				in.missingUnique[t.name] = t.unique
			}
		}
	}
	have := map[string]string{} // name → CREATE statement
	rows, err := q.QueryContext(ctx, "SELECT name, COALESCE(sql, '') FROM sqlite_master WHERE type IN ('index', 'trigger')")
	if err != nil {
		return in, err
	}
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			rows.Close()
			return in, err
		}
		have[name] = def
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return in, err
	}
	for _, ix := range l.indexes {
		if _, ok := have[ix.name]; !ok {
			in.missingIndex = append(in.missingIndex, ix)
		}
	}
	for _, tr := range l.triggers {
		def, ok := have[tr.name]
		switch {
		case !ok:
			in.missingTrigger = append(in.missingTrigger, tr)
		case tr.replace && !sameSQL(def, tr.sql):
			in.staleTrigger = append(in.staleTrigger, tr)
		}
	}
	return in, nil
}

// schemaCurrent checks, reading only, whether the schema is complete, so
// that opening a ready database never takes the write lock.
func (s *store) schemaCurrent(ctx context.Context) (bool, legacy, error) {
	in, err := inspect(ctx, s.db, newLayout(s.cfg), s.cfg.idempotency)
	if err != nil {
		return false, legacy{}, ctxErr(ctx, err)
	}
	if s.cfg.readOnly && in.lacks(s.cfg.turns) {
		// A file of a warden from before the waiters' table, opened
		// read-only: readable all the same (nothing read-only uses it).
		in = in.without(s.cfg.turns)
		in.legacy.noTurns = true
	}
	return in.current(), in.legacy, nil
}

// migrate creates what is missing, in one IMMEDIATE transaction, so that
// processes opening a new file at the same time do it once.
func (s *store) migrate(ctx context.Context) (legacy, error) {
	l := newLayout(s.cfg)
	var lg legacy
	err := s.tx(ctx, func(tx *sql.Tx) error {
		in, err := inspect(ctx, tx, l, s.cfg.idempotency)
		if err != nil {
			return err
		}
		lg = in.legacy
		var stmts []string
		for _, t := range in.missingTables {
			stmts = append(stmts, t.createSQL())
		}
		for table, cols := range in.missingCols {
			for _, c := range cols {
				stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s %s", quote(table), c.name, c.add))
			}
		}
		for table, col := range in.missingUnique {
			name := table + "_" + strings.ReplaceAll(col, ",", "_") + "_uidx"
			stmts = append(stmts, fmt.Sprintf("CREATE UNIQUE INDEX IF NOT EXISTS %s ON %s (%s)", quote(name), quote(table), strings.ReplaceAll(col, ",", ", ")))
		}
		for _, ix := range in.missingIndex {
			stmts = append(stmts, ix.sql)
		}
		for _, tr := range in.missingTrigger {
			stmts = append(stmts, tr.sql)
		}
		for _, tr := range in.staleTrigger {
			stmts = append(stmts, "DROP TRIGGER IF EXISTS "+quote(tr.name), tr.sql)
		}
		for _, st := range stmts {
			if _, err := tx.ExecContext(ctx, st); err != nil {
				return fmt.Errorf("sqlite: migrate: %w", err)
			}
		}
		return nil
	})
	return lg, err
}
