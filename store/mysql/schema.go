package mysql

import (
	"context"
	"fmt"
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
// reports whether an existing column of type typ (information_schema
// COLUMN_TYPE, lower case, integer display widths removed) holds what the
// store writes; fill is the value given to NULLs when the column must
// become NOT NULL.
type column struct {
	name, decl string
	fits       func(typ string) bool
	fill       string
}

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

func binCol(name string, n int, null bool) column {
	decl := fmt.Sprintf("VARBINARY(%d) NOT NULL", n)
	if null {
		decl = fmt.Sprintf("VARBINARY(%d) NULL", n)
	}
	if name == "namespace" {
		decl += " DEFAULT ''"
	}
	return column{name, decl, func(t string) bool { b, l := parseType(t); return b == "varbinary" && l >= n }, "''"}
}

func timeCol(name string, null bool) column {
	decl := "DATETIME(3) NOT NULL"
	if null {
		decl = "DATETIME(3) NULL"
	}
	return column{name, decl, func(t string) bool { b, l := parseType(t); return b == "datetime" && l >= 3 }, "'1970-01-01 00:00:00.000'"}
}

func intCol(name string, null bool) column {
	decl := "BIGINT NOT NULL DEFAULT 0"
	if null {
		decl = "BIGINT NULL"
	}
	return column{name, decl, func(t string) bool { b, _ := parseType(t); return b == "bigint" }, "0"}
}

func blobCol(name string, null bool, kinds ...string) column {
	decl := "LONGBLOB NOT NULL"
	if null {
		decl = "LONGBLOB NULL"
	}
	if len(kinds) == 0 {
		kinds = []string{"longblob"}
	}
	return column{name, decl, func(t string) bool {
		b, _ := parseType(t)
		for _, k := range kinds {
			if b == k {
				return true
			}
		}
		return false
	}, "''"}
}

func textCol(name string, n int, def string) column {
	decl := fmt.Sprintf("VARCHAR(%d) NOT NULL", n)
	fill := "''"
	if def != "" {
		decl += " DEFAULT " + def
		fill = def
	}
	return column{name, decl, func(t string) bool {
		b, l := parseType(t)
		return (b == "varchar" || b == "char") && l >= n || b == "text" || b == "mediumtext" || b == "longtext"
	}, fill}
}

// newLayout returns the store's tables under the configured names.
func newLayout(t Tables) []tableDef {
	ns := binCol("namespace", 64, false)
	key := binCol("key", 600, false)
	nk := []string{"namespace", "key"}
	return []tableDef{
		{name: t.Locks, pk: nk, cols: []column{ns, key,
			binCol("owner", 512, true), intCol("token", false),
			timeCol("created_at", false), timeCol("acquired_at", false), timeCol("expires_at", false),
			timeCol("released_at", true), timeCol("updated_at", false)}},
		{name: t.Circuits, pk: nk, cols: []column{ns, key,
			textCol("state", 16, "'closed'"), intCol("failure_count", false),
			timeCol("last_failure_time", true), timeCol("last_success_time", true), timeCol("opened_at", true),
			binCol("probe_owner", 512, true), timeCol("probe_until", true),
			intCol("version", false), timeCol("updated_at", false)}},
		{name: t.Cache, pk: nk, indexes: map[string]string{"expires_at_idx": "expires_at"}, cols: []column{ns, key,
			blobCol("value", false), timeCol("expires_at", true), timeCol("updated_at", false)}},
		{name: t.Idempotency, pk: nk, indexes: map[string]string{"expires_at_idx": "expires_at"}, cols: []column{ns, key,
			textCol("status", 16, ""), binCol("owner", 512, true), blobCol("fingerprint", true, "blob", "mediumblob", "longblob"),
			blobCol("result", true), timeCol("created_at", false), timeCol("expires_at", true), timeCol("updated_at", false)}},
		{name: t.Checkpoints, pk: []string{"namespace", "task_id", "sequence"}, cols: []column{ns,
			binCol("id", 640, false), binCol("task_id", 600, false), intCol("sequence", false),
			timeCol("timestamp", false),
			{"progress", "DOUBLE NOT NULL DEFAULT 0", func(t string) bool { b, _ := parseType(t); return b == "double" }, "0"},
			blobCol("data", false), intCol("estimated_time_remaining", true), intCol("token", false)}},
		{name: t.CheckpointTasks, pk: []string{"namespace", "task_id"}, cols: []column{ns,
			binCol("task_id", 600, false), intCol("fence_token", false), intCol("last_sequence", false),
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
	nullable bool
	hasDef   bool
	defNow   bool // the default is CURRENT_TIMESTAMP
	autoInc  bool
}

var displayWidthRe = regexp.MustCompile(`^((?:tiny|small|medium|big)?int)\(\d+\)`)

// plan inspects one table and returns the statements that bring it to the
// layout (none when it already is).
func (s *store) plan(ctx context.Context, td tableDef) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT IS NOT NULL, LOWER(COALESCE(COLUMN_DEFAULT, '')), EXTRA
		FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`, td.name)
	if err != nil {
		return nil, err
	}
	have := map[string]existingCol{}
	for rows.Next() {
		var name, typ, nullable, def, extra string
		var hasDef bool
		if err := rows.Scan(&name, &typ, &nullable, &hasDef, &def, &extra); err != nil {
			rows.Close()
			return nil, err
		}
		typ = displayWidthRe.ReplaceAllString(strings.ToLower(typ), "$1")
		have[strings.ToLower(name)] = existingCol{typ, nullable == "YES", hasDef, strings.HasPrefix(def, "current_timestamp"), strings.Contains(strings.ToLower(extra), "auto_increment")}
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
			decl := c.decl
			if c.notNull() && strings.HasPrefix(decl, "DATETIME") {
				// Existing rows get the epoch, not a zero date (which
				// strict servers with NO_ZERO_DATE refuse).
				decl += " DEFAULT " + c.fill
			}
			alter = append(alter, "ADD COLUMN "+qi(c.name)+" "+decl)
		case strings.HasPrefix(c.decl, "DATETIME") && strings.Contains(e.typ, "int"):
			// Numbers (epoch milliseconds?) would not convert to times.
			return nil, fmt.Errorf("column %s is %s, not a date and time: convert it to DATETIME(3) in UTC yourself", c.name, e.typ)
		case !c.fits(e.typ) || e.nullable == c.notNull():
			if e.nullable && c.notNull() {
				stmts = append(stmts, fmt.Sprintf("UPDATE %s SET %s = %s WHERE %s IS NULL", qi(td.name), qi(c.name), c.fill, qi(c.name)))
			}
			decl := c.decl
			if e.hasDef && c.notNull() && strings.HasPrefix(decl, "DATETIME") {
				// Keep a default others' inserts may rely on.
				if e.defNow {
					decl += " DEFAULT CURRENT_TIMESTAMP(3)"
				} else {
					decl += " DEFAULT " + c.fill
				}
			}
			alter = append(alter, "MODIFY COLUMN "+qi(c.name)+" "+decl)
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
	if idx["PRIMARY"] != strings.Join(td.pk, ",") {
		if autoInc != "" && !indexedFirst(idx, autoInc) {
			// An AUTO_INCREMENT column must stay the first column of a key.
			alter = append(alter, "ADD UNIQUE KEY "+qi(autoInc+"_uniq")+" ("+qi(autoInc)+")")
		}
		if _, ok := idx["PRIMARY"]; ok {
			alter = append(alter, "DROP PRIMARY KEY")
		}
		alter = append(alter, "ADD PRIMARY KEY ("+qlist(strings.Join(td.pk, ","))+")")
	}
	// A unique index of others without the namespace would make one
	// namespace's upsert meet another's row: it goes.
	for name, cols := range uniq {
		if name != "PRIMARY" && !slices.Contains(strings.Split(cols, ","), "namespace") &&
			(autoInc == "" || !slices.Contains(strings.Split(cols, ","), autoInc)) {
			alter = append(alter, "DROP INDEX "+qi(name))
		}
	}
	for name, cols := range td.indexes {
		if _, ok := idx[name]; !ok {
			alter = append(alter, "ADD KEY "+qi(name)+" ("+qlist(cols)+")")
		}
	}
	if len(alter) > 0 {
		stmts = append(stmts, "ALTER TABLE "+qi(td.name)+" "+strings.Join(alter, ", "))
	}
	return stmts, nil
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
// adapter created — to the store's layout: missing columns are added
// (NOT NULL ones with a default), columns too narrow for what the store
// writes are widened (keys and owners to VARBINARY, times to DATETIME(3),
// values to LONGBLOB), other NOT NULL columns without a default become
// NULL-able, and the primary key and indexes are set. It is idempotent,
// and safe to run from several processes at once.
func (s *store) Migrate(ctx context.Context) error {
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
