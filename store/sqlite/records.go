package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
	"weak"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/sqlfilter"
	"github.com/warden-go/warden/recordlock"
)

// Defaults of RecordOptions.
const (
	DefaultRecordIDColumn    = "id"
	DefaultRecordUntilColumn = "locked_until"
	DefaultRecordOwnerColumn = "locked_by"
	DefaultRecordTokenColumn = "lock_token"
)

// MaxRecordIDBytes is the longest text record id RecordTable accepts.
const MaxRecordIDBytes = driver.MaxKeyBytes

// recordAttempts bounds the loops of Lock and ForceRelease, which repeat
// when the record changed between their statements (a holding released
// or taken in between): each repetition means another caller made
// progress, so the bound is reached only under pathological churn.
const recordAttempts = 100

// RecordOptions configure a RecordTable. nil or the zero value gives the
// defaults. Column names must be plain SQL identifiers (letters, digits
// and underscores, not starting with a digit).
type RecordOptions struct {
	// IDColumn is the column that identifies a record: the table's
	// INTEGER PRIMARY KEY or another column with a unique index of its
	// own. "": "id".
	IDColumn string
	// UntilColumn holds a holding's expiry, an INTEGER of Unix
	// milliseconds (NULL: not locked). "": "locked_until".
	UntilColumn string
	// OwnerColumn holds the holder, TEXT (NULL: not locked).
	// "": "locked_by".
	OwnerColumn string
	// TokenColumn holds the last fencing token issued for the record, an
	// INTEGER (NULL: never locked). "": "lock_token".
	TokenColumn string
	// BusyTimeout is how long a call keeps retrying while another
	// connection or process holds SQLite's write lock (SQLITE_BUSY),
	// beside whatever busy_timeout the handle's connections have.
	// 0: DefaultBusyTimeout (5 seconds).
	BusyTimeout time.Duration
}

// RecordTable is the SQLite driver of package recordlock: locks kept in
// three columns of the rows of one of the program's own tables, on the
// program's own *sql.DB. Create it with Records; pass it to recordlock.New.
//
// The clock is the process's (time.Now, Unix milliseconds), read when the
// statement is about to run and passed to it: SQLite runs inside the
// process, and the processes sharing a database file share the machine's
// clock. Every write is one statement in autocommit mode, which takes
// SQLite's write lock before it reads; SQLITE_BUSY is retried until
// RecordOptions.BusyTimeout. Writers of this process on one *sql.DB queue
// in the process first, so SQLite's busy handler only arbitrates between
// processes.
//
// Ids are int, int8 … int64, uint … uint64 (up to math.MaxInt64) or
// non-empty UTF-8 strings of at most MaxRecordIDBytes, always bound as
// parameters. Ids read from the table (Claim, List) are int64 for INTEGER
// values and string for TEXT values.
//
// Its methods are safe for concurrent use.
type RecordTable struct {
	db                       *sql.DB
	table                    string
	idCol, untilCol, ownCol  string
	tokCol                   string
	busy                     time.Duration
	gate                     chan struct{}
	qLock, qGet, qExtend     string
	qRelease, qForce, qList  string
	qForceRead               string
	qClaim, qClaimNoCleared  string
	qMigrateIndex, indexName string
	qMigrateCleared          string
	clearedIndex             string

	checkMu sync.Mutex
	checked bool   // the table was checked
	kind    idKind // set when checked
	cleared bool   // set when checked: the table has clearedIndex
}

var _ driver.Records[recordlock.SQL] = (*RecordTable)(nil)

// Records returns the record-lock driver over table, a table of db (a
// handle of modernc.org/sqlite, which this package registers as
// "sqlite"; SQLite 3.35 or later for RETURNING). The table must have the
// lock columns (see Migrate); they are checked, with the id column's
// uniqueness, on first use. db stays the caller's: RecordTable never
// closes it.
func Records(db *sql.DB, table string, opts *RecordOptions) (*RecordTable, error) {
	if db == nil {
		return nil, fmt.Errorf("sqlite: Records: nil *sql.DB: %w", warden.ErrInvalidArgument)
	}
	var o RecordOptions
	if opts != nil {
		o = *opts
	}
	def := func(p *string, d string) {
		if *p == "" {
			*p = d
		}
	}
	def(&o.IDColumn, DefaultRecordIDColumn)
	def(&o.UntilColumn, DefaultRecordUntilColumn)
	def(&o.OwnerColumn, DefaultRecordOwnerColumn)
	def(&o.TokenColumn, DefaultRecordTokenColumn)
	if !identRe.MatchString(table) || strings.HasPrefix(strings.ToLower(table), "sqlite_") {
		return nil, fmt.Errorf("sqlite: Records: table name %.80q is not a plain SQL identifier: %w", table, warden.ErrInvalidArgument)
	}
	seen := map[string]bool{}
	for _, c := range []string{o.IDColumn, o.UntilColumn, o.OwnerColumn, o.TokenColumn} {
		if !identRe.MatchString(c) {
			return nil, fmt.Errorf("sqlite: Records: column name %.80q is not a plain SQL identifier: %w", c, warden.ErrInvalidArgument)
		}
		if seen[strings.ToLower(c)] {
			return nil, fmt.Errorf("sqlite: Records: column %q named twice: %w", c, warden.ErrInvalidArgument)
		}
		seen[strings.ToLower(c)] = true
	}
	switch {
	case o.BusyTimeout < 0:
		return nil, fmt.Errorf("sqlite: Records: negative BusyTimeout: %w", warden.ErrInvalidArgument)
	case o.BusyTimeout == 0:
		o.BusyTimeout = DefaultBusyTimeout
	}
	t := &RecordTable{db: db, table: table, idCol: o.IDColumn, untilCol: o.UntilColumn, ownCol: o.OwnerColumn,
		tokCol: o.TokenColumn, busy: o.BusyTimeout, gate: writeGate(db)}
	t.buildQueries()
	return t, nil
}

// buildQueries writes the statements with the quoted names.
func (t *RecordTable) buildQueries() {
	t.clearedIndex = t.table + "_" + t.ownCol + "_cleared_idx"
	r := strings.NewReplacer("{T}", quote(t.table), "{id}", quote(t.idCol), "{until}", quote(t.untilCol),
		"{by}", quote(t.ownCol), "{tok}", quote(t.tokCol), "{cleared}", quote(t.clearedIndex))
	// Free: no holder (NULL, or the empty string another program may
	// write), no expiry, or an expiry passed — the complement of
	// RecordLock.Live.
	free := `({by} IS NULL OR {by} = '' OR {until} IS NULL OR {until} <= :now)`
	state := `{id}, {by}, {until}, COALESCE({tok}, 0)`
	// The next token: 1 for a record never locked, the token + 1 below
	// the INTEGER limit. At the limit (or a token that is not an integer,
	// which only another program writes) the statement fails before it
	// writes anything — SQLite would otherwise compute a REAL, write it,
	// and fail only when the RETURNING row is read — with an error that
	// carries tokenLimitMark and the id (an invalid JSON path is an error
	// whose message quotes the path; it depends on the row, so SQLite
	// evaluates it only in that branch).
	nextToken := `CASE WHEN {tok} IS NULL THEN 1 WHEN typeof({tok}) = 'integer' AND {tok} < 9223372036854775807 THEN {tok} + 1
ELSE json_extract('{}', '` + tokenLimitMark + `' || {id}) END`
	t.qLock = r.Replace(`UPDATE {T} SET {by} = :owner, {until} = :until, {tok} = ` + nextToken + `
WHERE {id} = :id AND typeof({id}) = :idtype AND ` + free + `
RETURNING ` + state)
	t.qGet = r.Replace(`SELECT ` + state + ` FROM {T} WHERE {id} = :id AND typeof({id}) = :idtype`)
	// MAX: an extension never moves the expiry earlier (one that reaches
	// the database after a later, longer one).
	t.qExtend = r.Replace(`UPDATE {T} SET {until} = MAX({until}, :until)
WHERE {id} = :id AND typeof({id}) = :idtype AND {by} = :owner AND {tok} = :token AND {until} > :now
RETURNING ` + state)
	t.qRelease = r.Replace(`UPDATE {T} SET {by} = NULL, {until} = NULL
WHERE {id} = :id AND typeof({id}) = :idtype AND {by} = :owner AND {tok} = :token`)
	t.qForce = r.Replace(`UPDATE {T} SET {by} = NULL, {until} = NULL
WHERE {id} = :id AND typeof({id}) = :idtype AND {by} IS :by AND {until} IS :until AND {tok} IS :token`)
	t.qForceRead = r.Replace(`SELECT {by}, {until}, {tok} FROM {T} WHERE {id} = :id AND typeof({id}) = :idtype`)
	t.qList = r.Replace(`SELECT ` + state + ` FROM {T} WHERE {by} IS NOT NULL AND {until} > :now ORDER BY {id} LIMIT :limit`)
	// Claim's candidates, each the first in the filter's order of the
	// free records of one kind, found through an index that holds no live
	// holding: without an expiry (the rows without one come first in the
	// (expiry, id) index, in id order); with an expiry but a holder
	// another program cleared (NULL or ''), through the partial index of
	// Migration, which holds only them; lapsed (a range of the (expiry,
	// id) index). Then the first of the candidates in the filter's order.
	// A program's index that starts with its filter's columns and the
	// expiry serves the first and the last as well. The program's
	// condition comes first in the text, once per candidate and before
	// any of the driver's parameters, so that its ? placeholders are
	// parameters 1 … kn, bound to its Args k times; the driver's own
	// parameters are named. %[1]s is the condition, %[2]s the order.
	free1 := r.Replace(`WITH warden_free AS (SELECT {id} AS id FROM {T} WHERE (
%[1]s
) AND {until} IS NULL ORDER BY %[2]s LIMIT 1),
`)
	cleared := r.Replace(`warden_cleared AS (SELECT {id} AS id FROM {T} INDEXED BY {cleared} WHERE (
%[1]s
) AND {until} IS NOT NULL AND ({by} IS NULL OR {by} = '') ORDER BY %[2]s LIMIT 1),
`)
	lapsed := `warden_lapsed AS (SELECT {id} AS id FROM {T} WHERE (
%[1]s
) AND {until} <= :now ORDER BY %[2]s LIMIT 1),
warden_pick AS (SELECT {id} AS id FROM {T} WHERE {id} IN (SELECT id FROM warden_free UNION ALL SELECT id FROM warden_lapsed{more}) ORDER BY %[2]s LIMIT 1)
UPDATE {T} SET {by} = :owner, {until} = :until, {tok} = ` + nextToken + `
WHERE {id} = (SELECT id FROM warden_pick) AND ` + free + `
RETURNING ` + state
	t.qClaim = free1 + cleared + r.Replace(strings.Replace(lapsed, "{more}", " UNION ALL SELECT id FROM warden_cleared", 1))
	t.qClaimNoCleared = free1 + r.Replace(strings.Replace(lapsed, "{more}", "", 1))
	t.indexName = t.table + "_" + t.untilCol + "_idx"
	t.qMigrateIndex = r.Replace(`CREATE INDEX IF NOT EXISTS ` + quote(t.indexName) + ` ON {T} ({until}, {id})`)
	t.qMigrateCleared = r.Replace(`CREATE INDEX IF NOT EXISTS {cleared} ON {T} ({until}) WHERE {until} IS NOT NULL AND ({by} IS NULL OR {by} = '')`)
}

// Backend returns "sqlite".
func (t *RecordTable) Backend() string { return "sqlite" }

// Table returns the table's name.
func (t *RecordTable) Table() string { return t.table }

// CheckID accepts the id types of RecordTable; the error wraps
// warden.ErrInvalidArgument. Once the table was checked (on first use),
// it also refuses strings for an id column of INTEGER affinity and
// integers for one of TEXT affinity.
func (t *RecordTable) CheckID(id any) error {
	v, err := bindID(id)
	if err != nil {
		return err
	}
	t.checkMu.Lock()
	k := t.kind
	t.checkMu.Unlock()
	return t.kindOK(k, v)
}

// idKind is what the id column's affinity lets an id be.
type idKind int

const (
	kindAny  idKind = iota // BLOB, NUMERIC or REAL affinity: either (compared with their type)
	kindInt                // INTEGER affinity: integers only
	kindText               // TEXT affinity: strings only
)

// affinity returns the idKind of a column declared with type decl, by
// SQLite's affinity rules.
func affinity(decl string) idKind {
	d := strings.ToUpper(decl)
	switch {
	case strings.Contains(d, "INT"):
		return kindInt
	case strings.Contains(d, "CHAR"), strings.Contains(d, "CLOB"), strings.Contains(d, "TEXT"):
		return kindText
	}
	return kindAny
}

// kindOK refuses an id (bound form v) the id column cannot hold: a string
// compared with an INTEGER column would be converted to a number when it
// looks like one ("1", " 1", "1e0" would all find record 1).
func (t *RecordTable) kindOK(k idKind, v any) error {
	_, isInt := v.(int64)
	switch {
	case k == kindInt && !isInt:
		return fmt.Errorf("sqlite: record id %.40q: the id column %s of %s is INTEGER: ids are integers: %w", v, quote(t.idCol), quote(t.table), warden.ErrInvalidArgument)
	case k == kindText && isInt:
		return fmt.Errorf("sqlite: record id %d: the id column %s of %s is TEXT: ids are strings: %w", v, quote(t.idCol), quote(t.table), warden.ErrInvalidArgument)
	}
	return nil
}

// idArgs checks id (and, on first use, the table) and returns the id's
// two parameters: :id, and :idtype, the storage class it must have, so
// that a value of another type never matches by conversion.
func (t *RecordTable) idArgs(ctx context.Context, id any) ([]any, error) {
	v, err := bindID(id)
	if err != nil {
		return nil, err
	}
	if err := t.check(ctx); err != nil {
		return nil, err
	}
	if err := t.kindOK(t.kind, v); err != nil {
		return nil, err
	}
	typ := "text"
	if _, ok := v.(int64); ok {
		typ = "integer"
	}
	return []any{sql.Named("id", v), sql.Named("idtype", typ)}, nil
}

// bindID returns id as it is bound: an int64 or a string.
func bindID(id any) (any, error) {
	switch v := id.(type) {
	case string:
		switch {
		case v == "":
			return nil, fmt.Errorf("sqlite: empty record id: %w", warden.ErrInvalidArgument)
		case len(v) > MaxRecordIDBytes:
			return nil, fmt.Errorf("sqlite: record id %.40q… of %d bytes: the limit is %d: %w", v, len(v), MaxRecordIDBytes, warden.ErrInvalidArgument)
		case !utf8.ValidString(v):
			return nil, fmt.Errorf("sqlite: record id %.40q is not valid UTF-8: %w", v, warden.ErrInvalidArgument)
		}
		return v, nil
	case int:
		return int64(v), nil
	case int8:
		return int64(v), nil
	case int16:
		return int64(v), nil
	case int32:
		return int64(v), nil
	case int64:
		return v, nil
	case uint8:
		return int64(v), nil
	case uint16:
		return int64(v), nil
	case uint32:
		return int64(v), nil
	case uint:
		if uint64(v) > math.MaxInt64 {
			return nil, fmt.Errorf("sqlite: record id %d exceeds SQLite's INTEGER range: %w", v, warden.ErrInvalidArgument)
		}
		return int64(v), nil
	case uint64:
		if v > math.MaxInt64 {
			return nil, fmt.Errorf("sqlite: record id %d exceeds SQLite's INTEGER range: %w", v, warden.ErrInvalidArgument)
		}
		return int64(v), nil
	}
	return nil, fmt.Errorf("sqlite: record id of type %T: ids are integers or strings: %w", id, warden.ErrInvalidArgument)
}

// Lock implements driver.Records: one UPDATE … RETURNING that applies
// only to a free record; if it returns nothing, one read tells a missing
// record from a locked one. A read that finds the record free (released
// in between) starts over.
func (t *RecordTable) Lock(ctx context.Context, id any, owner string, d time.Duration) (driver.RecordLock, bool, bool, error) {
	ida, err := t.idArgs(ctx, id)
	if err != nil {
		return driver.RecordLock{}, false, false, err
	}
	for range recordAttempts {
		var rec driver.RecordLock
		var got bool
		err := t.write(ctx, func() error {
			now := nowMs()
			var err error
			rec, got, err = t.queryState(ctx, now, t.qLock, ida[0], ida[1], sql.Named("owner", owner),
				sql.Named("now", now), sql.Named("until", now+driver.Millis(d)))
			return err
		})
		if err != nil {
			return driver.RecordLock{}, false, false, t.fail(ctx, "lock", t.tokenLimit(err))
		}
		if got {
			return rec, true, true, nil
		}
		rec, found, err := t.get(ctx, ida)
		if err != nil || !found {
			return rec, false, false, err
		}
		if rec.Live() {
			return rec, true, false, nil
		}
	}
	return driver.RecordLock{}, false, false, t.gaveUp("lock")
}

// Extend implements driver.Records: one UPDATE … RETURNING; if refused,
// one read of the record's state.
func (t *RecordTable) Extend(ctx context.Context, id any, owner string, token int64, d time.Duration) (driver.RecordLock, bool, bool, error) {
	ida, err := t.idArgs(ctx, id)
	if err != nil {
		return driver.RecordLock{}, false, false, err
	}
	var rec driver.RecordLock
	var ok bool
	err = t.write(ctx, func() error {
		now := nowMs()
		var err error
		rec, ok, err = t.queryState(ctx, now, t.qExtend, ida[0], ida[1], sql.Named("owner", owner),
			sql.Named("token", token), sql.Named("now", now), sql.Named("until", now+driver.Millis(d)))
		return err
	})
	if err != nil {
		return driver.RecordLock{}, false, false, t.fail(ctx, "extend", err)
	}
	if ok {
		return rec, true, true, nil
	}
	rec, found, err := t.get(ctx, ida)
	return rec, found, false, err
}

// Release implements driver.Records: one UPDATE.
func (t *RecordTable) Release(ctx context.Context, id any, owner string, token int64) (bool, error) {
	ida, err := t.idArgs(ctx, id)
	if err != nil {
		return false, err
	}
	var n int64
	err = t.write(ctx, func() error {
		res, err := t.db.ExecContext(ctx, t.qRelease, ida[0], ida[1], sql.Named("owner", owner), sql.Named("token", token))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return false, t.fail(ctx, "release", err)
	}
	return n > 0, nil
}

// ForceRelease implements driver.Records: a read, then an UPDATE that
// clears the lock columns only if they still hold what was read
// (repeated if they changed in between).
func (t *RecordTable) ForceRelease(ctx context.Context, id any) (driver.RecordLock, bool, error) {
	ida, err := t.idArgs(ctx, id)
	if err != nil {
		return driver.RecordLock{}, false, err
	}
	for range recordAttempts {
		var owner sql.NullString
		var until, tok sql.NullInt64
		var now int64
		err := t.retry(ctx, func() error {
			now = nowMs()
			return t.db.QueryRowContext(ctx, t.qForceRead, ida[0], ida[1]).Scan(&owner, &until, &tok)
		})
		if errors.Is(err, sql.ErrNoRows) {
			return driver.RecordLock{}, false, nil
		}
		if err != nil {
			return driver.RecordLock{}, false, t.fail(ctx, "force release", err)
		}
		rec := driver.RecordLock{ID: ida[0].(sql.NamedArg).Value, Owner: owner.String, Until: nullMsTime(until), Token: tok.Int64, Now: msTime(now)}
		if !owner.Valid && !until.Valid {
			return rec, true, nil
		}
		var n int64
		err = t.write(ctx, func() error {
			res, err := t.db.ExecContext(ctx, t.qForce, ida[0], ida[1], sql.Named("by", owner),
				sql.Named("until", until), sql.Named("token", tok))
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		})
		if err != nil {
			return driver.RecordLock{}, false, t.fail(ctx, "force release", err)
		}
		if n > 0 {
			return rec, true, nil
		}
	}
	return driver.RecordLock{}, false, t.gaveUp("force release")
}

// Get implements driver.Records: one SELECT.
func (t *RecordTable) Get(ctx context.Context, id any) (driver.RecordLock, bool, error) {
	ida, err := t.idArgs(ctx, id)
	if err != nil {
		return driver.RecordLock{}, false, err
	}
	return t.get(ctx, ida)
}

func (t *RecordTable) get(ctx context.Context, ida []any) (driver.RecordLock, bool, error) {
	var rec driver.RecordLock
	var found bool
	err := t.retry(ctx, func() error {
		var err error
		now := nowMs()
		rec, found, err = t.queryState(ctx, now, t.qGet, ida[0], ida[1])
		return err
	})
	if err != nil {
		return driver.RecordLock{}, false, t.fail(ctx, "get", err)
	}
	return rec, found, nil
}

// Claim implements driver.Records with one statement (see
// ClaimStatement): the first record that matches filter and has no
// expiry, the first whose expiry passed and the first whose holder
// another program cleared are found through indexes that hold no live
// holding; the first of them in the filter's order is locked as Lock
// does. The statement runs under SQLite's write lock from its first read,
// so no other writer can take the record in between. filter.Where uses
// plain ? placeholders, as many as filter.Args, none of which may be a
// sql.NamedArg; OrderBy uses none (see checkFilter); "" matches every
// record. filter.OrderBy "" orders by the id column.
func (t *RecordTable) Claim(ctx context.Context, filter recordlock.SQL, owner string, d time.Duration) (driver.RecordLock, bool, error) {
	if err := checkFilter(filter); err != nil {
		return driver.RecordLock{}, false, err
	}
	if err := t.check(ctx); err != nil {
		return driver.RecordLock{}, false, err
	}
	q, wheres := t.claimStatement(filter)
	var rec driver.RecordLock
	var got bool
	err := t.write(ctx, func() error {
		now := nowMs()
		args := make([]any, 0, wheres*len(filter.Args)+3)
		for range wheres {
			args = append(args, filter.Args...)
		}
		args = append(args, sql.Named("owner", owner), sql.Named("now", now), sql.Named("until", now+driver.Millis(d)))
		var err error
		rec, got, err = t.queryState(ctx, now, q, args...)
		return err
	})
	if err != nil {
		return driver.RecordLock{}, false, t.fail(ctx, "claim", t.tokenLimit(err))
	}
	return rec, got, nil
}

// checkFilter refuses, before any I/O and with an error wrapping
// warden.ErrInvalidArgument, a Claim filter whose parameters could bind
// the driver's own: Claim's statement holds Where once per candidate
// search and binds Args as many times by position, then its own
// parameters by name (:owner, :now, :until), and modernc.org/sqlite binds
// a parameter by its number whatever its style — a ? beyond Args, a ?NNN
// or a :name (@name, $name, #name) would take one of the driver's values
// — and a sql.NamedArg called now, until or owner would replace one. So
// Where may use only ?, exactly len(Args) of them, OrderBy none, and no
// Arg may be a sql.NamedArg.
func checkFilter(f recordlock.SQL) error { return filterRules.Check(f) }

// filterRules is how the store reads a Claim filter (see checkFilter).
var filterRules = sqlfilter.Store{
	Name:       "sqlite",
	Count:      sqlParams,
	OrderByWhy: "its placeholders would bind the Args meant for Where, or the driver's own parameters",
	CountWhy:   "an extra ? would bind one of the driver's own parameters",
	NamedWhy:   "named parameters are refused (the driver's own are named, and a name of the filter's would replace them)",
}

// sqlParams reads an SQL fragment of the program's as SQLite's tokenizer
// does — string literals '…' and quoted identifiers "…" and `…` (each
// with its quote doubled inside) and […], comments (-- to the end of the
// line, /* … */) and identifiers are passed over — and counts its ?
// parameters. It refuses the other parameter forms, which bind by number
// or by name: ?NNN, :name, @name, $name, #name. It also refuses a
// fragment that ends inside a literal, a quoted identifier or a /*
// comment, which would swallow the statement's text after it; and,
// unless lineComment, inside a -- comment (Where stands on lines of its
// own, OrderBy does not).
func sqlParams(s string, lineComment bool) (int, error) {
	n := 0
	for i := 0; i < len(s); {
		switch c := s[i]; {
		case c == '\'' || c == '"' || c == '`':
			j := i + 1
			for {
				k := strings.IndexByte(s[j:], c)
				if k < 0 {
					what := "string literal"
					if c != '\'' {
						what = "quoted identifier"
					}
					return 0, fmt.Errorf("unterminated %s at byte %d", what, i)
				}
				j += k + 1
				if j < len(s) && s[j] == c { // doubled: the quote itself
					j++
					continue
				}
				break
			}
			i = j
		case c == '[':
			k := strings.IndexByte(s[i+1:], ']')
			if k < 0 {
				return 0, fmt.Errorf("unterminated quoted identifier at byte %d", i)
			}
			i += k + 2
		case c == '-' && strings.HasPrefix(s[i:], "--"):
			k := strings.IndexByte(s[i:], '\n')
			if k < 0 {
				if !lineComment {
					return 0, fmt.Errorf("a -- comment at byte %d runs to the end, over the statement's text after it", i)
				}
				return n, nil
			}
			i += k + 1
		case c == '/' && strings.HasPrefix(s[i:], "/*"):
			k := strings.Index(s[i+2:], "*/")
			if k < 0 {
				return 0, fmt.Errorf("unterminated /* comment at byte %d", i)
			}
			i += k + 4
		case c == '?':
			if i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9' {
				return 0, fmt.Errorf("numbered parameter %s at byte %d: use ?, bound to Args in order", paramAt(s, i), i)
			}
			n++
			i++
		case c == ':' || c == '@' || c == '$' || c == '#':
			if i+1 < len(s) && sqliteIDChar(s[i+1]) {
				return 0, fmt.Errorf("named parameter %s at byte %d: use ?, bound to Args in order", paramAt(s, i), i)
			}
			i++
		case sqliteIDChar(c): // an identifier, a keyword or a number
			for i < len(s) && sqliteIDChar(s[i]) {
				i++
			}
		default:
			i++
		}
	}
	return n, nil
}

// sqliteIDChar reports a byte SQLite allows inside an identifier.
func sqliteIDChar(c byte) bool {
	return c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// paramAt returns the parameter starting at s[i], cut short, for messages.
func paramAt(s string, i int) string {
	j := i + 1
	for j < len(s) && j < i+32 && sqliteIDChar(s[j]) {
		j++
	}
	return strconv.Quote(s[i:j])
}

// ClaimStatement returns the statement Claim runs for filter, to read
// its plan (EXPLAIN QUERY PLAN) when choosing an index for a filter of
// your own. Its parameters: filter.Args three times, then :owner, :now
// and :until (Unix milliseconds) — twice, without the third search
// (warden_cleared), when the table lacks Migration's partial index of
// records whose holder another program cleared (known once the driver
// checked the table, on first use).
func (t *RecordTable) ClaimStatement(filter recordlock.SQL) string {
	q, _ := t.claimStatement(filter)
	return q
}

// claimStatement returns Claim's statement for filter and how many times
// it holds filter.Where.
func (t *RecordTable) claimStatement(filter recordlock.SQL) (string, int) {
	where := filter.Where
	if strings.TrimSpace(where) == "" {
		where = "1"
	}
	order := filter.OrderBy
	if strings.TrimSpace(order) == "" {
		order = quote(t.idCol)
	}
	t.checkMu.Lock()
	cleared := t.cleared || !t.checked
	t.checkMu.Unlock()
	if cleared {
		return fmt.Sprintf(t.qClaim, where, order), 3
	}
	return fmt.Sprintf(t.qClaimNoCleared, where, order), 2
}

// List implements driver.Records: one SELECT of the live holdings (the
// lock index finds them), in id order.
func (t *RecordTable) List(ctx context.Context, limit int) ([]driver.RecordLock, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("sqlite: List limit %d: want > 0: %w", limit, warden.ErrInvalidArgument)
	}
	if err := t.check(ctx); err != nil {
		return nil, err
	}
	var out []driver.RecordLock
	err := t.retry(ctx, func() error {
		out = out[:0]
		now := nowMs()
		rows, err := t.db.QueryContext(ctx, t.qList, sql.Named("now", now), sql.Named("limit", limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			rec, err := scanState(rows, now)
			if err != nil {
				return err
			}
			out = append(out, rec)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		return rows.Close()
	})
	if err != nil {
		return nil, t.fail(ctx, "list", err)
	}
	return out, nil
}

// queryState runs a statement returning at most one row of state columns
// (id, holder, expiry, token) and reads it to the end: a write's commit
// happens at its last step, and its error (SQLITE_BUSY: rolled back)
// must not be missed.
func (t *RecordTable) queryState(ctx context.Context, now int64, q string, args ...any) (driver.RecordLock, bool, error) {
	rows, err := t.db.QueryContext(ctx, q, args...)
	if err != nil {
		return driver.RecordLock{}, false, err
	}
	defer rows.Close()
	var rec driver.RecordLock
	n := 0
	for rows.Next() {
		if rec, err = scanState(rows, now); err != nil {
			return driver.RecordLock{}, false, err
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return driver.RecordLock{}, false, err
	}
	if err := rows.Close(); err != nil {
		return driver.RecordLock{}, false, err
	}
	if n > 1 {
		return driver.RecordLock{}, false, fmt.Errorf("sqlite: %d rows of %s have that id: the id column must be unique", n, quote(t.table))
	}
	return rec, n == 1, nil
}

func scanState(r rowScanner, now int64) (driver.RecordLock, error) {
	var id any
	var owner sql.NullString
	var until sql.NullInt64
	var tok int64
	if err := r.Scan(&id, &owner, &until, &tok); err != nil {
		return driver.RecordLock{}, err
	}
	switch v := id.(type) {
	case int64, string:
	case []byte:
		id = string(v)
	default:
		return driver.RecordLock{}, fmt.Errorf("sqlite: a record id of type %T: ids must be INTEGER or TEXT values", id)
	}
	return driver.RecordLock{ID: id, Owner: owner.String, Until: nullMsTime(until), Token: tok, Now: msTime(now)}, nil
}

// Migration returns the statements Migrate runs on a table without the
// lock columns, for programs that migrate by hand: three ADD COLUMNs
// (NULL in every existing row, which SQLite adds without rewriting the
// table), an index on (expiry, id) and a partial index on the expiry of
// the rows whose holder another program cleared (NULL or empty) while
// leaving an expiry — rows no lock call writes, so the index is empty
// but for those. Claim finds, through the first index, the first record
// without an expiry in id order and the first lapsed one, and through
// the second the first cleared one, so it does not read the records
// others hold; List finds the live holdings through the first. For a
// Claim filter and order of your own, add an index on the filter's
// columns, then the expiry, then the order's — for "status = ? ORDER BY
// priority, id": (status, locked_until, priority, id).
func (t *RecordTable) Migration() string {
	return strings.Join(append(t.addColumns(), t.qMigrateIndex, t.qMigrateCleared), ";\n") + ";"
}

func (t *RecordTable) addColumns() []string {
	return []string{
		`ALTER TABLE ` + quote(t.table) + ` ADD COLUMN ` + quote(t.untilCol) + ` INTEGER`,
		`ALTER TABLE ` + quote(t.table) + ` ADD COLUMN ` + quote(t.ownCol) + ` TEXT`,
		`ALTER TABLE ` + quote(t.table) + ` ADD COLUMN ` + quote(t.tokCol) + ` INTEGER`,
	}
}

// Migrate adds the lock columns and the indexes the table lacks (see
// Migration); it is idempotent and safe to run from several
// processes at once. Other columns and rows are left as they are.
func (t *RecordTable) Migrate(ctx context.Context) error {
	stmts := t.addColumns()
	for attempt := 0; ; attempt++ {
		cols, err := t.columns(ctx)
		if err != nil {
			return t.fail(ctx, "migrate", err)
		}
		if len(cols) == 0 {
			return fmt.Errorf("sqlite: migrate: no table %s", quote(t.table))
		}
		var todo []string
		for i, c := range []string{t.untilCol, t.ownCol, t.tokCol} {
			if _, ok := cols[strings.ToLower(c)]; !ok {
				todo = append(todo, stmts[i])
			}
		}
		todo = append(todo, t.qMigrateIndex, t.qMigrateCleared)
		var dup bool
		for _, s := range todo {
			err := t.write(ctx, func() error {
				_, err := t.db.ExecContext(ctx, s)
				return err
			})
			if err != nil && strings.Contains(err.Error(), "duplicate column name") && attempt < 3 {
				dup = true // another process added it meanwhile
				break
			}
			if err != nil {
				return t.fail(ctx, "migrate", err)
			}
		}
		if !dup {
			t.checkMu.Lock()
			t.cleared = true // the index exists now
			t.checkMu.Unlock()
			return nil
		}
	}
}

// columns returns the table's columns (lower-cased name → declared type
// and primary key position).
func (t *RecordTable) columns(ctx context.Context) (map[string]recordCol, error) {
	out := map[string]recordCol{}
	err := t.retry(ctx, func() error {
		clear(out)
		rows, err := t.db.QueryContext(ctx, `SELECT name, type, pk FROM pragma_table_info(?)`, t.table)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name, typ string
			var pk int
			if err := rows.Scan(&name, &typ, &pk); err != nil {
				return err
			}
			out[strings.ToLower(name)] = recordCol{typ: typ, pk: pk}
		}
		return rows.Err()
	})
	return out, err
}

type recordCol struct {
	typ string
	pk  int
}

// check verifies, once, that the table has the lock columns and that the
// id column is unique (the table's only primary key column, or the only
// column of a unique index without a WHERE).
func (t *RecordTable) check(ctx context.Context) error {
	t.checkMu.Lock()
	defer t.checkMu.Unlock()
	if t.checked {
		return nil
	}
	cols, err := t.columns(ctx)
	if err != nil {
		return t.fail(ctx, "reading the table's columns", err)
	}
	if len(cols) == 0 {
		return fmt.Errorf("sqlite: records: no table %s", quote(t.table))
	}
	id, ok := cols[strings.ToLower(t.idCol)]
	if !ok {
		return fmt.Errorf("sqlite: records: table %s has no id column %s", quote(t.table), quote(t.idCol))
	}
	var missing []string
	for _, c := range []string{t.untilCol, t.ownCol, t.tokCol} {
		if _, ok := cols[strings.ToLower(c)]; !ok {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("sqlite: records: table %s lacks the lock columns %s: run RecordTable.Migrate, or the statements of Migration", quote(t.table), strings.Join(missing, ", "))
	}
	pks := 0
	for _, c := range cols {
		if c.pk > 0 {
			pks++
		}
	}
	unique := id.pk > 0 && pks == 1
	if !unique {
		unique, err = t.uniqueIndex(ctx)
		if err != nil {
			return t.fail(ctx, "reading the table's indexes", err)
		}
	}
	if !unique {
		return fmt.Errorf("sqlite: records: the id column %s of %s is not unique: make it the primary key or give it a unique index of its own", quote(t.idCol), quote(t.table))
	}
	// Claim's third search needs Migration's partial index (INDEXED BY:
	// without it the search would read every live holding).
	var cleared int
	err = t.retry(ctx, func() error {
		return t.db.QueryRowContext(ctx, `SELECT count(*) FROM pragma_index_list(:t) AS il
WHERE lower(il.name) = lower(:n) AND il.partial
AND (SELECT group_concat(lower(name)) FROM pragma_index_info(il.name)) = lower(:c)`,
			sql.Named("t", t.table), sql.Named("n", t.clearedIndex), sql.Named("c", t.untilCol)).Scan(&cleared)
	})
	if err != nil {
		return t.fail(ctx, "reading the table's indexes", err)
	}
	t.cleared = cleared > 0
	t.kind = affinity(id.typ)
	t.checked = true
	return nil
}

// uniqueIndex reports whether a unique, non-partial index has the id
// column as its only column.
func (t *RecordTable) uniqueIndex(ctx context.Context) (bool, error) {
	var n int
	err := t.retry(ctx, func() error {
		return t.db.QueryRowContext(ctx, `SELECT count(*) FROM pragma_index_list(:t) AS il
WHERE il."unique" AND NOT il.partial
AND (SELECT count(*) FROM pragma_index_info(il.name)) = 1
AND (SELECT lower(name) FROM pragma_index_info(il.name)) = lower(:c)`, sql.Named("t", t.table), sql.Named("c", t.idCol)).Scan(&n)
	})
	return n > 0, err
}

// tokenLimitMark starts the JSON path of the error Lock's and Claim's
// statements raise, before writing, for a record whose token is at the
// INTEGER limit (or is not an integer); the record's id follows it.
const tokenLimitMark = "warden-token-limit:"

// tokenLimit turns that error into a clear one; other errors pass.
func (t *RecordTable) tokenLimit(err error) error {
	msg := err.Error()
	i := strings.Index(msg, tokenLimitMark)
	if i < 0 {
		return err
	}
	// The message quotes the path: '…', a quote in it doubled.
	var id strings.Builder
	for s, j := msg[i+len(tokenLimitMark):], 0; j < len(s) && id.Len() < 80; j++ {
		if s[j] == '\'' {
			if j+1 < len(s) && s[j+1] == '\'' {
				j++
			} else {
				break
			}
		}
		id.WriteByte(s[j])
	}
	return fmt.Errorf("record %s: its token column %s holds %d (the INTEGER limit) or a value that is not an integer: no greater fencing token can be issued, so the record cannot be locked until the column is reset (nothing was written)",
		id.String(), quote(t.tokCol), int64(math.MaxInt64))
}

// gaveUp is the error of a loop that reached recordAttempts.
func (t *RecordTable) gaveUp(op string) error {
	return fmt.Errorf("sqlite: %s on %s: gave up after %d attempts: the record kept changing between the statements", op, quote(t.table), recordAttempts)
}

// fail wraps err, or returns ctx's error when ctx ended.
func (t *RecordTable) fail(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if e := ctx.Err(); e != nil {
		return e
	}
	return fmt.Errorf("sqlite: %s on %s: %w", op, quote(t.table), err)
}

// write runs f as the only writer on t's *sql.DB in this process,
// retrying SQLITE_BUSY.
func (t *RecordTable) write(ctx context.Context, f func() error) error {
	select {
	case t.gate <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-t.gate }()
	return t.retry(ctx, f)
}

// retry runs f until it succeeds or fails otherwise than with
// SQLITE_BUSY (a statement that got it did nothing: an autocommit write
// whose commit is refused is rolled back), ctx ends or the busy timeout
// passes.
func (t *RecordTable) retry(ctx context.Context, f func() error) error {
	var deadline time.Time
	for {
		err := f()
		if err == nil || !busyErr(err) || ctx.Err() != nil {
			return err
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(t.busy)
		}
		if now.After(deadline) {
			return fmt.Errorf("still busy after %v (RecordOptions.BusyTimeout): %w", t.busy, err)
		}
		tm := time.NewTimer(200*time.Microsecond + rand.N(800*time.Microsecond))
		select {
		case <-ctx.Done():
			tm.Stop()
			return ctx.Err()
		case <-tm.C:
		}
	}
}

// busyErr reports SQLITE_BUSY or SQLITE_LOCKED, from modernc.org/sqlite
// or, by its message, another driver.
func busyErr(err error) bool {
	if isBusy(err) {
		return true
	}
	s := err.Error()
	return strings.Contains(s, "database is locked") || strings.Contains(s, "database table is locked")
}

// gatesByDB holds one writer gate per *sql.DB, dropped when the handle is
// garbage.
var gatesByDB sync.Map // weak.Pointer[sql.DB] → chan struct{}

func writeGate(db *sql.DB) chan struct{} {
	key := weak.Make(db)
	if g, ok := gatesByDB.Load(key); ok {
		return g.(chan struct{})
	}
	g, loaded := gatesByDB.LoadOrStore(key, make(chan struct{}, 1))
	if !loaded {
		runtime.AddCleanup(db, func(k weak.Pointer[sql.DB]) { gatesByDB.Delete(k) }, key)
	}
	return g.(chan struct{})
}
