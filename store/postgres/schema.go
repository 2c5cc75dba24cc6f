package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The schema is described as data so that Migrate can both create missing
// tables and bring tables created by others (go-go-scope's PostgreSQL
// adapter) to the layout: add missing columns, convert columns whose type
// converts without loss, set the primary key and add missing indexes —
// after checking every table, and refusing before anything changes when a
// column cannot be converted.

// colKind is what a column holds; it decides which existing types fit
// and how others convert.
type colKind int

const (
	kText   colKind = iota + 1 // text COLLATE "C"
	kTime                      // timestamptz(3)
	kBigint                    // bigint
	kBytes                     // bytea
	kDouble                    // double precision
)

// column is one column of the layout.
type column struct {
	name    string
	kind    colKind
	notNull bool
	def     string // default, "" for none
}

func (c column) typ() string {
	switch c.kind {
	case kText:
		return `text COLLATE "C"`
	case kTime:
		return "timestamptz(3)"
	case kBigint:
		return "bigint"
	case kBytes:
		return "bytea"
	default:
		return "double precision"
	}
}

func (c column) decl() string {
	d := pgx.Identifier{c.name}.Sanitize() + " " + c.typ()
	if c.def != "" {
		d += " DEFAULT " + c.def
	}
	if c.notNull {
		d += " NOT NULL"
	}
	return d
}

// fill is the value given to NULLs when an existing column becomes NOT
// NULL.
func (c column) fill() string {
	if c.def != "" {
		return c.def
	}
	switch c.kind {
	case kTime:
		return "'epoch'"
	case kBigint, kDouble:
		return "0"
	case kBytes:
		return "''::bytea"
	}
	return "''"
}

// tableDef is one table of the layout.
type tableDef struct {
	name    string
	cols    []column
	pk      []string
	indexes [][]string // secondary indexes, by columns
}

const nowDefault = "date_trunc('milliseconds', clock_timestamp())"

func newLayout(t Tables) []tableDef {
	ns := column{"namespace", kText, true, "''"}
	key := column{"key", kText, true, ""}
	tm := func(name string, notNull bool) column {
		if notNull {
			return column{name, kTime, true, nowDefault}
		}
		return column{name, kTime, false, ""}
	}
	nk := []string{"namespace", "key"}
	nsExp := [][]string{{"namespace", "expires_at"}}
	return []tableDef{
		{name: t.Locks, pk: nk, indexes: nsExp, cols: []column{ns, key,
			{"owner", kText, true, "''"}, {"token", kBigint, true, "0"},
			tm("created_at", true), tm("acquired_at", true), tm("expires_at", true),
			tm("released_at", false), tm("updated_at", true)}},
		{name: t.Circuits, pk: nk, cols: []column{ns, key,
			{"state", kText, true, "'closed'"}, {"failure_count", kBigint, true, "0"},
			tm("last_failure_time", false), tm("last_success_time", false), tm("opened_at", false),
			{"probe_owner", kText, false, ""}, tm("probe_until", false),
			{"version", kBigint, true, "0"}, tm("updated_at", true),
			{"successes", kBigint, true, "0"}, {"total_failures", kBigint, true, "0"},
			{"consecutive_successes", kBigint, true, "0"}, tm("interval_start", false), {"probes", kBigint, true, "0"},
			{"probe_epoch", kBigint, true, "0"}}},
		{name: t.Cache, pk: nk, indexes: nsExp, cols: []column{ns, key,
			{"value", kBytes, true, ""}, tm("expires_at", false), tm("updated_at", true)}},
		{name: t.Idempotency, pk: nk, indexes: nsExp, cols: []column{ns, key,
			{"status", kText, true, ""}, {"owner", kText, false, ""}, {"fingerprint", kBytes, false, ""},
			{"result", kBytes, false, ""}, tm("created_at", true), tm("expires_at", false), tm("updated_at", true)}},
		{name: t.Checkpoints, pk: []string{"namespace", "task_id", "sequence"}, cols: []column{ns,
			{"id", kText, true, ""}, {"task_id", kText, true, ""}, {"sequence", kBigint, true, ""},
			{"timestamp", kBigint, true, "0"}, {"progress", kDouble, true, "0"}, {"data", kBytes, true, "''::bytea"},
			{"estimated_time_remaining", kBigint, false, ""}, {"token", kBigint, true, "0"}}},
		{name: t.CheckpointTasks, pk: []string{"namespace", "task_id"}, cols: []column{ns,
			{"task_id", kText, true, ""}, {"fence_token", kBigint, true, "0"}, {"last_sequence", kBigint, true, "0"},
			tm("updated_at", true)}},
	}
}

// qcols quotes a column list.
func qcols(cols []string) string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = pgx.Identifier{c}.Sanitize()
	}
	return strings.Join(out, ", ")
}

// indexName is the name of a secondary index of the layout.
func indexName(table string, cols []string) string {
	n := table
	if len(n) > 40 {
		n = n[:40]
	}
	return n + "_" + strings.Join(cols, "_") + "_idx"
}

// existingCol is a column as the catalog describes it.
type existingCol struct {
	typ       string // information_schema data_type
	collation string
	nullable  bool
	hasDef    bool
}

// existingIndex is a primary key or unique index of a table.
type existingIndex struct {
	name       string
	constraint string // the constraint's name, "" for a plain unique index
	primary    bool
	cols       []string
}

// plan inspects one table and returns the statements that bring it to the
// layout (none when it already is), or why it cannot be adopted.
func (s *store) plan(ctx context.Context, q querier, td tableDef) ([]string, error) {
	tbl := s.ident(td.name)
	rows, err := q.query(ctx, `SELECT column_name, data_type, COALESCE(collation_name, ''), is_nullable = 'YES', column_default IS NOT NULL
		FROM information_schema.columns WHERE table_schema = COALESCE(NULLIF($1, ''), current_schema()) AND table_name = $2
		ORDER BY ordinal_position`, s.schema, td.name)
	if err != nil {
		return nil, err
	}
	have := map[string]existingCol{}
	var order []string
	for rows.Next() {
		var name string
		var e existingCol
		if err := rows.Scan(&name, &e.typ, &e.collation, &e.nullable, &e.hasDef); err != nil {
			rows.Close()
			return nil, err
		}
		have[name] = e
		order = append(order, name)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(have) == 0 {
		parts := make([]string, 0, len(td.cols)+1)
		for _, c := range td.cols {
			parts = append(parts, c.decl())
		}
		parts = append(parts, "PRIMARY KEY ("+qcols(td.pk)+")")
		stmts := []string{"CREATE TABLE IF NOT EXISTS " + tbl + " (" + strings.Join(parts, ", ") + ")"}
		for _, ix := range td.indexes {
			stmts = append(stmts, "CREATE INDEX IF NOT EXISTS "+pgx.Identifier{indexName(td.name, ix)}.Sanitize()+" ON "+tbl+" ("+qcols(ix)+")")
		}
		return stmts, nil
	}

	var pre, alter, post []string
	want := map[string]bool{}
	for _, c := range td.cols {
		want[c.name] = true
		qc := pgx.Identifier{c.name}.Sanitize()
		e, ok := have[c.name]
		if !ok {
			if c.notNull && c.def == "" {
				// A key column the table lacks: nothing to fill it with.
				return nil, refusal{fmt.Errorf("table %s has no column %s, and existing rows cannot be given one", td.name, c.name)}
			}
			alter = append(alter, "ADD COLUMN "+c.decl())
			continue
		}
		conv, err := convert(c, e)
		if err != nil {
			return nil, refusal{fmt.Errorf("table %s: %w", td.name, err)}
		}
		if conv != "" {
			alter = append(alter, "ALTER COLUMN "+qc+" TYPE "+c.typ()+conv)
		}
		if c.notNull && e.nullable {
			pre = append(pre, "UPDATE "+tbl+" SET "+qc+" = "+c.fill()+" WHERE "+qc+" IS NULL")
			alter = append(alter, "ALTER COLUMN "+qc+" SET NOT NULL")
		} else if !c.notNull && !e.nullable {
			alter = append(alter, "ALTER COLUMN "+qc+" DROP NOT NULL")
		}
		if c.def != "" && !e.hasDef {
			alter = append(alter, "ALTER COLUMN "+qc+" SET DEFAULT "+c.def)
		}
	}
	// Columns of others that the store does not write must accept its
	// inserts: NOT NULL without a default becomes NULL-able.
	for _, name := range order {
		if e := have[name]; !want[name] && !e.nullable && !e.hasDef {
			alter = append(alter, "ALTER COLUMN "+pgx.Identifier{name}.Sanitize()+" DROP NOT NULL")
		}
	}

	idx, err := s.uniqueIndexes(ctx, q, td.name)
	if err != nil {
		return nil, err
	}
	hasPK := false
	for _, ix := range idx {
		switch {
		case ix.primary && slices.Equal(ix.cols, td.pk):
			hasPK = true
		case ix.primary || !slices.Contains(ix.cols, "namespace"):
			// Another primary key, or a unique index without the
			// namespace, would make one namespace's upsert meet
			// another's row: it goes.
			if ix.constraint != "" {
				alter = append(alter, "DROP CONSTRAINT "+pgx.Identifier{ix.constraint}.Sanitize())
			} else {
				pre = append(pre, "DROP INDEX "+s.ident(ix.name))
			}
		}
	}
	if !hasPK {
		alter = append(alter, "ADD PRIMARY KEY ("+qcols(td.pk)+")")
	}
	for _, ix := range td.indexes {
		post = append(post, "CREATE INDEX IF NOT EXISTS "+pgx.Identifier{indexName(td.name, ix)}.Sanitize()+" ON "+tbl+" ("+qcols(ix)+")")
	}
	stmts := pre
	if len(alter) > 0 {
		stmts = append(stmts, "ALTER TABLE "+tbl+" "+strings.Join(alter, ", "))
	}
	return append(stmts, post...), nil
}

// convert returns the USING clause (or " " for a plain type change) that
// turns the existing column e into c, "" if it fits already, or an error
// if it does not convert without loss.
func convert(c column, e existingCol) (string, error) {
	bad := func() (string, error) {
		return "", fmt.Errorf("column %s is %s and does not convert to %s: convert or rename it yourself", c.name, e.typ, c.typ())
	}
	qc := pgx.Identifier{c.name}.Sanitize()
	switch c.kind {
	case kText:
		switch e.typ {
		case "text":
			if e.collation == "C" {
				return "", nil
			}
			return " ", nil
		case "character varying", "character":
			return " ", nil
		}
		return bad()
	case kTime:
		switch e.typ {
		case "timestamp with time zone":
			return "", nil
		case "timestamp without time zone":
			// go-go-scope writes UTC (ISO strings) into these columns.
			return " USING " + qc + " AT TIME ZONE 'UTC'", nil
		}
		return bad()
	case kBigint:
		switch e.typ {
		case "bigint":
			return "", nil
		case "integer", "smallint":
			return " ", nil
		}
		return bad()
	case kBytes:
		switch e.typ {
		case "bytea":
			return "", nil
		case "jsonb", "json", "text", "character varying":
			// The JSON text, as UTF-8: what warden's JSON codec reads.
			return " USING convert_to(" + qc + "::text, 'UTF8')", nil
		}
		return bad()
	case kDouble:
		switch e.typ {
		case "double precision":
			return "", nil
		case "real", "integer", "smallint", "bigint", "numeric":
			return " ", nil
		}
		return bad()
	}
	return bad()
}

// uniqueIndexes returns a table's primary key and unique indexes.
func (s *store) uniqueIndexes(ctx context.Context, q querier, table string) ([]existingIndex, error) {
	rows, err := q.query(ctx, `SELECT ic.relname, COALESCE(con.conname, ''), i.indisprimary,
		string_agg(a.attname::text, ',' ORDER BY k.ord)
		FROM pg_index i
		JOIN pg_class ic ON ic.oid = i.indexrelid
		JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, ord) ON true
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid
		WHERE i.indrelid = $1::regclass AND i.indisunique
		GROUP BY ic.relname, con.conname, i.indisprimary`, s.ident(table))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []existingIndex
	for rows.Next() {
		var ix existingIndex
		var cols string
		if err := rows.Scan(&ix.name, &ix.constraint, &ix.primary, &cols); err != nil {
			return nil, err
		}
		ix.cols = strings.Split(cols, ",")
		out = append(out, ix)
	}
	return out, rows.Err()
}

// Migrate implements driver.Migrator: it creates the tables that are
// missing and brings existing ones — such as those go-go-scope's
// PostgreSQL adapter created — to the store's layout: missing columns are
// added, columns are converted where that loses nothing (text keys to
// the "C" collation, timestamp to timestamptz read as UTC, integer to
// bigint, JSON values to their UTF-8 bytes), other columns' NOT NULL
// without a default is dropped, and the primary key and indexes are set.
// Every table is inspected first: if one cannot be adopted, Migrate
// returns why and changes nothing. It runs in one transaction under an
// advisory lock, so it is idempotent and safe to run from several
// processes at once.
func (s *store) Migrate(ctx context.Context) error {
	return s.wrapMigrate(ctx, s.inTxRaw(ctx, func(tx txn) error {
		if _, err := tx.exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('warden-migrate:' || COALESCE(NULLIF($1, ''), current_schema())))", s.schema); err != nil {
			return err
		}
		if s.schema != "" {
			if _, err := tx.exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{s.schema}.Sanitize()); err != nil {
				return err
			}
		}
		var all []string
		var refused []error
		for _, td := range s.layout {
			stmts, err := s.plan(ctx, tx, td)
			var r refusal
			if errors.As(err, &r) {
				refused = append(refused, r.err)
				continue
			}
			if err != nil {
				return err
			}
			all = append(all, stmts...)
		}
		if len(refused) > 0 {
			return &adoptError{errors.Join(refused...)}
		}
		for _, st := range all {
			if _, err := tx.exec(ctx, st); err != nil {
				return fmt.Errorf("%s: %w", firstWords(st), err)
			}
		}
		return nil
	}))
}

// refusal is a reason why a table cannot be adopted.
type refusal struct{ err error }

func (r refusal) Error() string { return r.err.Error() }

// adoptError says why existing tables cannot be adopted.
type adoptError struct{ err error }

func (e *adoptError) Error() string {
	return "the existing tables cannot be adopted (nothing was changed): " + e.err.Error()
}
func (e *adoptError) Unwrap() error { return e.err }

func (s *store) wrapMigrate(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if e := ctxErr(ctx, err); e != err {
		return e
	}
	return fmt.Errorf("postgres: migrate: %w", err)
}

// inTxRaw is inTx without the error wrapping.
func (s *store) inTxRaw(ctx context.Context, f func(tx txn) error) error {
	return retry(ctx, func() error {
		tx, err := s.db.begin(ctx)
		if err != nil {
			return err
		}
		if err := f(tx); err != nil {
			_ = tx.rollback(context.WithoutCancel(ctx))
			return err
		}
		return tx.commit(ctx)
	})
}

// firstWords is the start of a statement, for messages.
func firstWords(st string) string {
	if len(st) > 60 {
		return st[:60] + "…"
	}
	return st
}
