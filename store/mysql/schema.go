package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The schema is described as data so that Migrate can both create missing
// tables and bring tables created by others (go-go-scope's MySQL adapter)
// up to the layout: add missing columns, widen columns whose type cannot
// hold what the store writes, set the primary key and add missing indexes.

// column is one column of the layout. decl is its full declaration; fits
// reports whether an existing column (its information_schema COLUMN_TYPE,
// lower case, integer display widths removed, and its collation) holds
// what the store writes; fill is the value given to NULLs when the column
// must become NOT NULL.
type column struct {
	name, decl string
	fits       func(e existingCol) bool
	fill       string
}

// hasDefault reports whether the layout declares a default.
func (c column) hasDefault() bool { return strings.Contains(c.decl, "DEFAULT") }

// notNull reports whether the layout declares the column NOT NULL.
func (c column) notNull() bool { return strings.Contains(c.decl, "NOT NULL") }

// tableDef is one table of the layout.
type tableDef struct {
	name    string
	cols    []column
	pk      []string          // primary key columns, in order
	indexes map[string]string // index name → columns (comma-separated)
}

var typeRe = regexp.MustCompile(`^([a-z]+)(?:\((\d+)(?:,\d+)?\))?`)

// parseType splits "varbinary(600)" into ("varbinary", 600); n is -1 when
// the type has no length.
func parseType(typ string) (string, int) {
	m := typeRe.FindStringSubmatch(typ)
	if m == nil {
		return typ, -1
	}
	if m[2] == "" {
		return m[1], -1
	}
	n, _ := strconv.Atoi(m[2])
	return m[1], n
}

// strCol is a key, owner or namespace column: UTF-8 text under a binary
// NO PAD collation (coll), so that values are compared and ordered by code
// point (which is UTF-8 byte order), trailing spaces count, and clients
// such as mysql2 read them as strings.
func strCol(name string, n int, null bool, coll string) column {
	decl := fmt.Sprintf("VARCHAR(%d) CHARACTER SET utf8mb4 COLLATE %s", n, coll)
	if null {
		decl += " NULL"
	} else {
		decl += " NOT NULL"
	}
	if name == "namespace" {
		decl += " DEFAULT ''"
	}
	return column{name, decl, func(e existingCol) bool {
		b, l := parseType(e.typ)
		return b == "varchar" && l >= n && e.coll == coll
	}, "''"}
}

// nowDefault is the default of NOT NULL time columns: the database clock
// in UTC, so that rows inserted by others without them (go-go-scope's
// adapters name only key, owner and expires_at) get a time, whatever the
// session time zone.
const nowDefault = "(UTC_TIMESTAMP(3))"

func timeCol(name string, null bool) column {
	decl := "DATETIME(3) NOT NULL DEFAULT " + nowDefault
	if null {
		decl = "DATETIME(3) NULL"
	}
	return column{name, decl, func(e existingCol) bool { b, l := parseType(e.typ); return b == "datetime" && l >= 3 }, nowDefault}
}

// isDateTime reports whether a COLUMN_TYPE is a date and time.
func isDateTime(typ string) bool {
	b, _ := parseType(strings.ToLower(typ))
	return b == "datetime" || b == "timestamp"
}

func intCol(name string, null bool) column {
	decl := "BIGINT NOT NULL DEFAULT 0"
	if null {
		decl = "BIGINT NULL"
	}
	return column{name, decl, func(e existingCol) bool { b, _ := parseType(e.typ); return b == "bigint" }, "0"}
}

func blobCol(name string, null bool, kinds ...string) column {
	decl := "LONGBLOB NOT NULL"
	if null {
		decl = "LONGBLOB NULL"
	}
	if len(kinds) == 0 {
		kinds = []string{"longblob"}
	}
	return column{name, decl, func(e existingCol) bool {
		b, _ := parseType(e.typ)
		return slices.Contains(kinds, b)
	}, "''"}
}

// jsonCol is a value column that go-go-scope's adapters read and write as
// JSON: it holds the values that are JSON text, and its companion
// LONGBLOB column name+"_bin" the others. An existing LONGBLOB (the
// layout of earlier warden releases) or JSON/LONGTEXT column is kept.
func jsonCol(name string) column {
	return column{name, "JSON NULL", func(e existingCol) bool {
		b, _ := parseType(e.typ)
		return b == "json" || b == "longtext" || b == "longblob"
	}, "NULL"}
}

func textCol(name string, n int, def string) column {
	decl := fmt.Sprintf("VARCHAR(%d) NOT NULL", n)
	fill := "''"
	if def != "" {
		decl += " DEFAULT " + def
		fill = def
	}
	return column{name, decl, func(e existingCol) bool {
		b, l := parseType(e.typ)
		return (b == "varchar" || b == "char") && l >= n || b == "text" || b == "mediumtext" || b == "longtext"
	}, fill}
}

// newLayout returns the store's tables under the configured names, with
// key columns under collation coll.
//
// Locks, circuits and cache entries are keyed by `key` alone, as in
// go-go-scope's layout: the stored key already starts with the prefix and
// a kind tag, so it is unique across namespaces, and a row another
// program inserts (namespace ”) is the same row as warden's. The
// namespace column there is kept for listings and Purge of older rows.
func newLayout(t Tables, coll string) []tableDef {
	ns := strCol("namespace", 64, false, coll)
	key := strCol("key", 600, false, coll)
	owner := strCol("owner", 512, true, coll)
	nk := []string{"namespace", "key"}
	k := []string{"key"}
	exp := map[string]string{"expires_at_idx": "expires_at"}
	return []tableDef{
		{name: t.Locks, pk: k, indexes: exp, cols: []column{ns, key,
			owner, intCol("token", false),
			timeCol("created_at", false), timeCol("acquired_at", false), timeCol("expires_at", false),
			timeCol("released_at", true), timeCol("updated_at", false),
			// The session a release handed the key to (handoff.go).
			intCol("handoff", true)}},
		{name: t.Circuits, pk: k, cols: []column{ns, key,
			textCol("state", 16, "'closed'"), intCol("failure_count", false),
			timeCol("last_failure_time", true), timeCol("last_success_time", true), timeCol("opened_at", true),
			strCol("probe_owner", 512, true, coll), timeCol("probe_until", true),
			intCol("version", false), timeCol("updated_at", false),
			// The breaker's counts; rows of writers that do not keep them
			// read 0.
			intCol("successes", false), intCol("total_failures", false), intCol("consecutive_successes", false),
			timeCol("interval_start", true), intCol("probes", false),
			// The current set of probe slots (driver.CircuitRecord.ProbeEpoch);
			// rows of writers that do not keep it read 0.
			intCol("probe_epoch", false)}},
		{name: t.Cache, pk: k, indexes: exp, cols: []column{ns, key,
			jsonCol("value"), blobCol("value_bin", true), timeCol("expires_at", true), timeCol("updated_at", false)}},
		{name: t.Idempotency, pk: nk, indexes: exp, cols: []column{ns, key,
			textCol("status", 16, ""), owner, blobCol("fingerprint", true, "blob", "mediumblob", "longblob"),
			blobCol("result", true), timeCol("created_at", false), timeCol("expires_at", true), timeCol("updated_at", false)}},
		{name: t.Checkpoints, pk: []string{"namespace", "task_id", "sequence"}, cols: []column{ns,
			strCol("id", 640, false, coll), strCol("task_id", 600, false, coll), intCol("sequence", false),
			// Unix milliseconds, as go-go-scope's adapter declares and
			// writes it (it inserts numbers, which a DATETIME column
			// refuses); the DATETIME(3) of earlier warden releases is kept
			// (the store reads the column's type when it opens, see
			// buildQueries).
			{"timestamp", "BIGINT NOT NULL", func(e existingCol) bool {
				b, l := parseType(e.typ)
				return b == "datetime" && l >= 3 || b == "bigint"
			}, "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)"},
			{"progress", "DOUBLE NOT NULL DEFAULT 0", func(e existingCol) bool { b, _ := parseType(e.typ); return b == "double" }, "0"},
			jsonCol("data"), blobCol("data_bin", true), intCol("estimated_time_remaining", true), intCol("token", false)}},
		{name: t.CheckpointTasks, pk: []string{"namespace", "task_id"}, cols: []column{ns,
			strCol("task_id", 600, false, coll), intCol("fence_token", false), intCol("last_sequence", false),
			timeCol("updated_at", false)}},
	}
}

func qi(name string) string { return "`" + name + "`" }

func qlist(cols string) string {
	var out []string
	for _, c := range strings.Split(cols, ",") {
		out = append(out, qi(c))
	}
	return strings.Join(out, ", ")
}

// createSQL is the CREATE TABLE statement of a table of the layout.
func (td tableDef) createSQL() string {
	var parts []string
	for _, c := range td.cols {
		parts = append(parts, qi(c.name)+" "+c.decl)
	}
	parts = append(parts, "PRIMARY KEY ("+qlist(strings.Join(td.pk, ","))+")")
	for name, cols := range td.indexes {
		parts = append(parts, "KEY "+qi(name)+" ("+qlist(cols)+")")
	}
	return "CREATE TABLE IF NOT EXISTS " + qi(td.name) + " (" + strings.Join(parts, ", ") +
		") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
}

// existingCol is a column as information_schema describes it.
type existingCol struct {
	typ      string
	coll     string // collation name, "" for non-text columns
	nullable bool
	hasDef   bool
	autoInc  bool
}

var displayWidthRe = regexp.MustCompile(`^((?:tiny|small|medium|big)?int)\(\d+\)`)

// baseOf is the type family a declaration or COLUMN_TYPE names (JSON is
// LONGTEXT on MariaDB).
func baseOf(typ string) string {
	b, _ := parseType(strings.ToLower(typ))
	if b == "longtext" {
		return "json"
	}
	return b
}

// keptDecl is the declaration that keeps an existing column's type (which
// fits the layout although it is not the layout's own) while changing its
// nullability or default to the layout's.
func keptDecl(c column, e existingCol) string {
	typ := e.typ
	if baseOf(typ) == "json" {
		typ = "JSON"
	}
	decl := typ + " NULL"
	if c.notNull() {
		decl = typ + " NOT NULL"
		if c.hasDefault() && baseOf(c.decl) == baseOf(typ) {
			decl += " DEFAULT " + c.fill
		}
	}
	return decl
}

// plan inspects one table and returns the statements that bring it to the
// layout (none when it already is). It changes nothing: a table it cannot
// adopt is refused with an error naming the table and column, before any
// table is altered.
func (s *store) plan(ctx context.Context, td tableDef) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT COLUMN_NAME, COLUMN_TYPE, COALESCE(COLLATION_NAME, ''), IS_NULLABLE, COLUMN_DEFAULT IS NOT NULL, EXTRA
		FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`, td.name)
	if err != nil {
		return nil, err
	}
	have := map[string]existingCol{}
	for rows.Next() {
		var name, typ, coll, nullable, extra string
		var hasDef bool
		if err := rows.Scan(&name, &typ, &coll, &nullable, &hasDef, &extra); err != nil {
			rows.Close()
			return nil, err
		}
		typ = displayWidthRe.ReplaceAllString(strings.ToLower(typ), "$1")
		// (MariaDB reports the default of a NULL-able column without one
		// as 'NULL': hasDef is only consulted for NOT NULL columns.)
		have[strings.ToLower(name)] = existingCol{typ, strings.ToLower(coll), nullable == "YES", hasDef, strings.Contains(strings.ToLower(extra), "auto_increment")}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(have) == 0 {
		return []string{td.createSQL()}, nil
	}

	var stmts, alter []string
	want := map[string]bool{}
	for _, c := range td.cols {
		want[c.name] = true
		e, ok := have[c.name]
		switch {
		case !ok:
			alter = append(alter, "ADD COLUMN "+qi(c.name)+" "+c.decl)
		case !c.fits(e) && strings.HasPrefix(c.decl, "DATETIME") && strings.Contains(e.typ, "int"):
			// Numbers (epoch milliseconds?) would not convert to times.
			return nil, fmt.Errorf("table %s column %s is %s, not a date and time: convert it to DATETIME(3) in UTC yourself", td.name, c.name, e.typ)
		case !c.fits(e) && !strings.HasPrefix(c.decl, "DATETIME") && isDateTime(e.typ) && c.fits(existingCol{typ: "datetime(3)"}):
			// A date and time of lower precision where the layout holds
			// numbers but also reads DATETIME(3) (the checkpoints'
			// timestamp): widened, not converted to a number.
			tc := timeCol(c.name, !c.notNull())
			if e.nullable && c.notNull() {
				stmts = append(stmts, fmt.Sprintf("UPDATE %s SET %s = %s WHERE %s IS NULL", qi(td.name), qi(c.name), tc.fill, qi(c.name)))
			}
			alter = append(alter, "MODIFY COLUMN "+qi(c.name)+" "+tc.decl)
		case !c.fits(e):
			if e.nullable && c.notNull() {
				stmts = append(stmts, fmt.Sprintf("UPDATE %s SET %s = %s WHERE %s IS NULL", qi(td.name), qi(c.name), c.fill, qi(c.name)))
			}
			alter = append(alter, "MODIFY COLUMN "+qi(c.name)+" "+c.decl)
		case e.nullable == c.notNull() || c.notNull() && c.hasDefault() && !e.hasDef && baseOf(c.decl) == baseOf(e.typ):
			// (A kept column of another type, such as go-go-scope's BIGINT
			// timestamp, keeps having no default: its writers set it.)
			if e.nullable && c.notNull() {
				stmts = append(stmts, fmt.Sprintf("UPDATE %s SET %s = %s WHERE %s IS NULL", qi(td.name), qi(c.name), c.fill, qi(c.name)))
			}
			alter = append(alter, "MODIFY COLUMN "+qi(c.name)+" "+keptDecl(c, e))
		}
	}
	// Columns of others that the store does not write must accept its
	// inserts: NOT NULL without a default becomes NULL-able.
	var autoInc string
	for name, e := range have {
		if e.autoInc {
			autoInc = name
		}
		if !want[name] && !e.nullable && !e.hasDef && !e.autoInc {
			alter = append(alter, "MODIFY COLUMN "+qi(name)+" "+e.typ+" NULL")
		}
	}

	idx, uniq, err := s.indexes(ctx, td.name)
	if err != nil {
		return nil, err
	}
	pk := strings.Join(td.pk, ",")
	if idx["PRIMARY"] != pk {
		if err := s.checkUnique(ctx, td, have); err != nil {
			return nil, err
		}
		if autoInc != "" && !indexedFirst(idx, autoInc) {
			// An AUTO_INCREMENT column must stay the first column of a key.
			alter = append(alter, "ADD UNIQUE KEY "+qi(autoInc+"_uniq")+" ("+qi(autoInc)+")")
		}
		if _, ok := idx["PRIMARY"]; ok {
			alter = append(alter, "DROP PRIMARY KEY")
		}
		alter = append(alter, "ADD PRIMARY KEY ("+qlist(pk)+")")
	}
	// A unique index of others that does not include the primary key
	// would make one row's upsert meet another's row: it goes (but one
	// holding an AUTO_INCREMENT column must stay).
	for name, cols := range uniq {
		cs := strings.Split(cols, ",")
		covers := true
		for _, p := range td.pk {
			covers = covers && slices.Contains(cs, p)
		}
		if name != "PRIMARY" && !covers && (autoInc == "" || !slices.Contains(cs, autoInc)) {
			alter = append(alter, "DROP INDEX "+qi(name))
		}
	}
	for name, cols := range td.indexes {
		if !slices.Contains(slices.Collect(maps.Values(idx)), cols) {
			alter = append(alter, "ADD KEY "+qi(name)+" ("+qlist(cols)+")")
		}
	}
	if len(alter) > 0 {
		stmts = append(stmts, "ALTER TABLE "+qi(td.name)+" "+strings.Join(alter, ", "))
	}
	return stmts, nil
}

// checkUnique refuses a new primary key that the rows already in the
// table would violate (the ALTER would fail half-way through a Migrate).
// Columns the table lacks are added with one value for all rows and are
// left out of the check.
func (s *store) checkUnique(ctx context.Context, td tableDef, have map[string]existingCol) error {
	var cols []string
	for _, p := range td.pk {
		if _, ok := have[p]; ok {
			cols = append(cols, p)
		}
	}
	if len(cols) == 0 {
		return nil
	}
	var one int
	err := s.db.QueryRowContext(ctx, "SELECT 1 FROM "+qi(td.name)+" GROUP BY "+qlist(strings.Join(cols, ","))+
		" HAVING COUNT(*) > 1 LIMIT 1").Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("table %s: several rows share column(s) %s, which become its primary key: remove the duplicates first", td.name, strings.Join(cols, ", "))
}

// indexedFirst reports whether col is the first column of some index
// other than the primary key.
func indexedFirst(idx map[string]string, col string) bool {
	for name, cols := range idx {
		if first, _, _ := strings.Cut(cols, ","); name != "PRIMARY" && first == col {
			return true
		}
	}
	return false
}

// indexes returns a table's indexes, all and the unique ones: name →
// columns (lower case, comma-separated, in order).
func (s *store) indexes(ctx context.Context, table string) (idx, uniq map[string]string, err error) {
	rows, err := s.db.QueryContext(ctx, `SELECT INDEX_NAME, LOWER(COLUMN_NAME), NON_UNIQUE = 0 FROM information_schema.STATISTICS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY INDEX_NAME, SEQ_IN_INDEX`, table)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	idx, uniq = map[string]string{}, map[string]string{}
	for rows.Next() {
		var name, col string
		var unique bool
		if err := rows.Scan(&name, &col, &unique); err != nil {
			return nil, nil, err
		}
		if idx[name] != "" {
			col = idx[name] + "," + col
		}
		idx[name] = col
		if unique {
			uniq[name] = col
		}
	}
	return idx, uniq, rows.Err()
}

// Migrate implements driver.Migrator: it creates the tables that are
// missing and brings existing ones — such as those go-go-scope's MySQL
// adapter created in connect() — to the store's layout: missing columns
// are added (NOT NULL ones with a default, so that others' inserts that
// do not name them work), columns too narrow for what the store writes are
// widened (keys and owners to VARCHAR under a binary NO PAD collation,
// times to DATETIME(3)), JSON values and go-go-scope's BIGINT checkpoint
// timestamps are kept, other NOT NULL columns without a default become
// NULL-able, and the primary key and indexes are set. Every table is
// inspected before any is altered: what cannot be adopted (a time column
// holding numbers, rows that the new primary key would make duplicates)
// is refused with an error naming the table and column, and nothing is
// changed. It is idempotent, and safe to run from several processes at
// once.
func (s *store) Migrate(ctx context.Context) error {
	// Every table is inspected before any is altered, so that a table
	// that cannot be adopted leaves the database as it was.
	for _, td := range s.layout {
		if _, err := s.plan(ctx, td); err != nil {
			return ctxErr(ctx, fmt.Errorf("mysql: migrate: %w", err))
		}
	}
	for _, td := range s.layout {
		if err := s.migrateTable(ctx, td); err != nil {
			return ctxErr(ctx, fmt.Errorf("mysql: migrate %s: %w", td.name, err))
		}
	}
	return nil
}

// migrateTable plans and runs the table's changes. When a statement fails
// because another process changed the table at the same time, the table is
// inspected again.
func (s *store) migrateTable(ctx context.Context, td tableDef) error {
	var last error
	for range 3 {
		stmts, err := s.plan(ctx, td)
		if err != nil {
			return err
		}
		if len(stmts) == 0 {
			return nil
		}
		if last = s.execAll(ctx, stmts); last == nil {
			return nil
		}
		if ctx.Err() != nil {
			return last
		}
	}
	return last
}

func (s *store) execAll(ctx context.Context, stmts []string) error {
	for _, q := range stmts {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return nil
}
