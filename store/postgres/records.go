package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/warden-go/warden"
	wdriver "github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/recordlock"
)

// Record locks (package recordlock) on the user's own table: three
// columns of each row hold the row's lock (expiry, holder, last fencing
// token). Every call is one statement, so one round trip; expiry is
// decided by the server's clock: now() (the statement's start), cut to
// milliseconds (see clockSQL). A statement that waits for a row lock
// decides with the clock of its start, a little behind: that can only
// keep a holding live a little longer, never end one early.

// Default lock columns of RecordOptions.
const (
	DefaultRecordIDColumn    = "id"
	DefaultRecordUntilColumn = "locked_until"
	DefaultRecordOwnerColumn = "locked_by"
	DefaultRecordTokenColumn = "lock_token"
)

// MaxRecordIDBytes is the longest string or []byte id CheckID accepts.
const MaxRecordIDBytes = 512

// RecordOptions configure Records. nil or the zero value gives the
// defaults.
type RecordOptions struct {
	// Schema is the table's schema. "": the table name is unqualified and
	// found through the connection's search_path.
	Schema string
	// IDColumn is the table's id column (usually its primary key, or a
	// column with a unique index: a lock is taken on the one row it
	// names). "": "id".
	IDColumn string
	// UntilColumn holds the lock's expiry (timestamptz). "": "locked_until".
	UntilColumn string
	// OwnerColumn holds the holder (text; NULL when unlocked). "":
	// "locked_by".
	OwnerColumn string
	// TokenColumn holds the last fencing token issued for the row
	// (bigint; NULL: never locked). "": "lock_token".
	TokenColumn string
}

// RecordTable is the PostgreSQL driver of package recordlock: record
// locks kept in three columns of the rows of the user's own table. Pass
// it to recordlock.New. Its methods are safe for concurrent use; it
// holds no connection of its own (every call takes one from the pool for
// one statement).
//
// Ids are bound as parameters of the id column's type: strings, integers
// (int, int8 … int64, uint … uint64 up to math.MaxInt64, and named types
// of these kinds), []byte, [16]byte (uuid), time.Time, and values that
// implement database/sql/driver.Valuer (google/uuid, pgtype.UUID,
// pgtype.Numeric …) whose Value is one of these. On first use the driver
// reads the id column's type; from then on an id of the other family is
// refused before any I/O: for a numeric column (smallint, integer,
// bigint, numeric) ids are integers, since PostgreSQL would read "01",
// " 1" or []byte("1") as the row 1; for a string column (text, varchar,
// char) ids are strings, not integers or []byte. A Valuer is bound as
// its Value says and not judged so. A value pgx cannot bind to the
// column's type ("abc" for a uuid) is refused by pgx or the server. Both
// errors wrap warden.ErrInvalidArgument. Claim and List return ids as pgx decodes the
// column (string for text, int64 for bigint, int32 for integer,
// [16]byte for uuid, pgtype.Numeric for numeric); each is accepted back.
//
// The first call also checks the table: its id column must exist and be
// the primary key or alone in a unique index (a lock names one row);
// a table that is not so is refused with an error saying why, as Migrate
// refuses it.
//
// A record is locked only while its holder is non-empty and its expiry
// is ahead (driver.RecordLock.Live): a row another program cleared by
// hand — holder set to NULL or the empty string, or expiry to NULL, the other column
// left — is free to Lock, Claim, Get and List alike.
type RecordTable struct {
	pool             *pgxpool.Pool
	name             string // schema.table, for messages
	idCol            string
	untilCol, byCol  string
	tokenCol         string
	qt               string // quoted, qualified table
	qid, qu, qb, qk  string // quoted columns
	heldIdx, freeIdx string // the migration's index names (raw)
	clearedIdx       string
	lockQ, extendQ   string
	releaseQ, forceQ string
	getQ, listQ      string

	checkMu sync.Mutex
	checked bool   // the table was checked (see check)
	kind    idKind // set when checked: the id column's family
	cleared bool   // set when checked: the table has clearedIdx
}

// idKind is the family of the id column's type, which decides the ids
// the driver takes.
type idKind int

const (
	kindAny   idKind = iota // uuid, bytea, timestamps …: what pgx binds
	kindInt                 // numeric types: integers only
	kindText                // string types: strings only
	kindBytes               // bytea: []byte only (a string would be read as bytea's text form)
)

var _ wdriver.Records[recordlock.SQL] = (*RecordTable)(nil)

// maxIdent is PostgreSQL's identifier length limit (NAMEDATALEN - 1).
const maxIdent = 63

func checkIdent(what, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("postgres: Records: empty %s: %w", what, warden.ErrInvalidArgument)
	case len(name) > maxIdent:
		return fmt.Errorf("postgres: Records: %s %.20q… is longer than PostgreSQL's %d bytes: %w", what, name, maxIdent, warden.ErrInvalidArgument)
	case strings.ContainsRune(name, 0) || !utf8.ValidString(name):
		return fmt.Errorf("postgres: Records: %s %q is not valid UTF-8 without NUL: %w", what, name, warden.ErrInvalidArgument)
	}
	return nil
}

// Records returns the record-lock driver over table (in opts.Schema, or
// found through the search_path) on pool, which stays the caller's. It
// does no I/O: call Migrate (or run Migration by hand) once to add the
// lock columns and the indexes Claim reads.
func Records(pool *pgxpool.Pool, table string, opts *RecordOptions) (*RecordTable, error) {
	if pool == nil {
		return nil, fmt.Errorf("postgres: Records: nil pool: %w", warden.ErrInvalidArgument)
	}
	var o RecordOptions
	if opts != nil {
		o = *opts
	}
	def := func(s *string, d string) {
		if *s == "" {
			*s = d
		}
	}
	def(&o.IDColumn, DefaultRecordIDColumn)
	def(&o.UntilColumn, DefaultRecordUntilColumn)
	def(&o.OwnerColumn, DefaultRecordOwnerColumn)
	def(&o.TokenColumn, DefaultRecordTokenColumn)
	if err := checkIdent("table", table); err != nil {
		return nil, err
	}
	if o.Schema != "" {
		if err := checkIdent("schema", o.Schema); err != nil {
			return nil, err
		}
	}
	cols := map[string]string{}
	for _, c := range []struct{ what, name string }{
		{"IDColumn", o.IDColumn}, {"UntilColumn", o.UntilColumn}, {"OwnerColumn", o.OwnerColumn}, {"TokenColumn", o.TokenColumn},
	} {
		if err := checkIdent(c.what, c.name); err != nil {
			return nil, err
		}
		if prev, dup := cols[c.name]; dup {
			return nil, fmt.Errorf("postgres: Records: %s and %s are both %q: %w", prev, c.what, c.name, warden.ErrInvalidArgument)
		}
		cols[c.name] = c.what
	}
	r := &RecordTable{
		pool:  pool,
		idCol: o.IDColumn, untilCol: o.UntilColumn, byCol: o.OwnerColumn, tokenCol: o.TokenColumn,
	}
	qi := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	r.name, r.qt = table, qi(table)
	if o.Schema != "" {
		r.name, r.qt = o.Schema+"."+table, pgx.Identifier{o.Schema, table}.Sanitize()
	}
	r.qid, r.qu, r.qb, r.qk = qi(o.IDColumn), qi(o.UntilColumn), qi(o.OwnerColumn), qi(o.TokenColumn)
	r.heldIdx = recordIndexName(table, o.UntilColumn)
	r.freeIdx = recordIndexName(table, o.IDColumn+"_unlocked")
	if r.freeIdx == r.heldIdx { // an expiry column called <id>_unlocked
		r.freeIdx = recordIndexName(table, o.IDColumn+"_free")
	}
	r.clearedIdx = recordIndexName(table, o.OwnerColumn+"_cleared")
	if r.clearedIdx == r.heldIdx || r.clearedIdx == r.freeIdx {
		r.clearedIdx = recordIndexName(table, o.OwnerColumn+"_by_hand")
	}
	r.build()
	return r, nil
}

// recordIndexName is a migration's index name: <table>_<what>_idx, or, past
// PostgreSQL's 63 bytes, a cut of it with a hash of the whole, so that
// two long table names never share one (CREATE INDEX IF NOT EXISTS would
// then skip the second table's index).
func recordIndexName(table, what string) string {
	n := table + "_" + what + "_idx"
	if len(n) <= maxIdent {
		return n
	}
	h := fnv.New32a()
	h.Write([]byte(n))
	cut := n[:maxIdent-13]
	for !utf8.ValidString(cut) {
		cut = cut[:len(cut)-1]
	}
	return fmt.Sprintf("%s_%08x_idx", cut, h.Sum32())
}

// clockSQL is the store's clock in every statement: the start of the
// statement's transaction — each call is a statement of its own, so the
// statement's start — cut to milliseconds. now() is fixed for the whole
// statement, so every comparison and write of one statement uses one
// value, and it is a stable function: the planner estimates a comparison
// with it from the column's statistics, which lets Claim's search for
// lapsed holdings use their index (a value computed in the statement,
// such as a CTE over clock_timestamp(), is unknown to the planner).
const clockSQL = `date_trunc('milliseconds', now())`

// build writes the statements. Those that change a row whose current
// state they must also answer (Lock, Extend, ForceRelease) first lock the
// row in a CTE (SELECT … FOR NO KEY UPDATE, which under READ COMMITTED
// waits for a concurrent writer and returns the row's newest version)
// and update through a join with it: the update then re-evaluates its
// condition on that newest version, and the answer when it does not
// update is the row as it is, not as the statement's snapshot saw it.
// FOR NO KEY UPDATE, the lock an UPDATE of non-key columns takes, does
// not block other tables' foreign-key checks on the row.
func (r *RecordTable) build() {
	T, I, U, B, K, N := r.qt, r.qid, r.qu, r.qb, r.qk, clockSQL
	cur := `warden_cur AS MATERIALIZED (SELECT ` + I + ` AS warden_id, ` + B + ` AS warden_by, ` + U + ` AS warden_until, ` + K + ` AS warden_token
    FROM ` + T + ` WHERE ` + I + ` = $1 FOR NO KEY UPDATE)`
	ret := `RETURNING ` + T + `.` + I + `, ` + T + `.` + B + `, ` + T + `.` + U + `, ` + T + `.` + K
	answer := `SELECT true, *, ` + N + ` FROM warden_new
UNION ALL
SELECT false, warden_id, warden_by, warden_until, warden_token, ` + N + ` FROM warden_cur WHERE NOT EXISTS (SELECT FROM warden_new)`

	// $1 id, $2 owner, $3 duration in ms. Free: no holder (NULL, or the
	// empty string another program may write), no expiry, or an expiry
	// passed — the complement of RecordLock.Live.
	r.lockQ = `WITH ` + cur + `,
  warden_new AS (UPDATE ` + T + ` SET ` + B + ` = $2::text, ` + U + ` = ` + N + ` + $3::bigint * interval '1 millisecond', ` + K + ` = ` + r.nextToken(`SELECT count(*) FROM warden_cur`) + `
    FROM warden_cur WHERE ` + T + `.` + I + ` = warden_cur.warden_id
      AND (` + T + `.` + B + ` IS NULL OR ` + T + `.` + B + ` = '' OR ` + T + `.` + U + ` IS NULL OR ` + T + `.` + U + ` <= ` + N + `)
    ` + ret + `)
` + answer

	// $1 id, $2 owner, $3 token, $4 duration in ms.
	// GREATEST: an extension never moves the expiry earlier (one that
	// reaches the server after a later, longer one).
	r.extendQ = `WITH ` + cur + `,
  warden_new AS (UPDATE ` + T + ` SET ` + U + ` = GREATEST(` + T + `.` + U + `, ` + N + ` + $4::bigint * interval '1 millisecond')
    FROM warden_cur WHERE ` + T + `.` + I + ` = warden_cur.warden_id
      AND ` + T + `.` + B + ` = $2::text AND ` + T + `.` + K + ` = $3::bigint AND ` + T + `.` + U + ` > ` + N + `
      AND (SELECT count(*) FROM warden_cur) = 1
    ` + ret + `)
` + answer

	// $1 id, $2 owner, $3 token. Expired or not; the token stays.
	r.releaseQ = `UPDATE ` + T + ` SET ` + B + ` = NULL, ` + U + ` = NULL WHERE ` + I + ` = $1 AND ` + B + ` = $2::text AND ` + K + ` = $3::bigint
  AND (SELECT count(*) FROM ` + T + ` warden_dup WHERE warden_dup.` + I + ` = $1) = 1`

	// $1 id. Writes only when there is something to clear; answers the
	// state it found.
	r.forceQ = `WITH ` + cur + `,
  warden_new AS (UPDATE ` + T + ` SET ` + B + ` = NULL, ` + U + ` = NULL
    FROM warden_cur WHERE ` + T + `.` + I + ` = warden_cur.warden_id AND (` + T + `.` + B + ` IS NOT NULL OR ` + T + `.` + U + ` IS NOT NULL)
      AND (SELECT count(*) FROM warden_cur) = 1
    RETURNING 1)
SELECT warden_id, warden_by, warden_until, warden_token, ` + N + ` FROM warden_cur`

	// $1 id.
	r.getQ = `SELECT ` + I + `, ` + B + `, ` + U + `, ` + K + `, ` + N + ` FROM ` + T + ` WHERE ` + I + ` = $1`

	// $1 limit. Through the index of holdings: the live ones (a holder
	// another program set to '' holds nothing).
	r.listQ = `SELECT ` + I + `, ` + B + `, ` + U + `, ` + K + `, ` + N + ` FROM ` + T + `
WHERE ` + B + ` IS NOT NULL AND ` + B + ` <> '' AND ` + U + ` > ` + N + ` ORDER BY ` + I + ` LIMIT $1`
}

// nextToken is the new token a holding takes: 1 for a row never locked,
// the token + 1 below the token column's limit (Migrate accepts bigint
// and integer columns; smallint by hand). At the limit the statement
// fails before it writes anything — PostgreSQL would fail anyway, on the
// overflow, but with an error Lock and Claim could not tell from a bad id
// or filter value — with an error that carries tokenLimitMark and the
// row's id: the text does not convert to bigint, and the server's message
// quotes it (it depends on the row, so the planner cannot evaluate it
// ahead of the branch).
//
// rows is an SQL expression counting the rows that have the record's id:
// anything but 1 fails the statement the same way, with an error that
// carries duplicateIDMark — a lock must name one row, and a table whose
// id column stopped being unique (a dropped constraint, an inheritance
// child, a unique index with another collation than the column's) could
// otherwise lock two rows, or hand one id to two holders.
func (r *RecordTable) nextToken(rows string) string {
	T, I, K := r.qt, r.qid, r.qk
	tok := `COALESCE(` + T + `.` + K + `, 0)`
	return `CASE WHEN (` + rows + `) <> 1 THEN ('` + duplicateIDMark + `' || ` + T + `.` + I + `::text)::bigint
    WHEN ` + tok + ` < CASE pg_typeof(` + T + `.` + K + `) WHEN 'smallint'::regtype THEN 32767 WHEN 'integer'::regtype THEN 2147483647 ELSE 9223372036854775807 END
    THEN ` + tok + ` + 1 ELSE ('` + tokenLimitMark + `' || ` + T + `.` + I + `::text)::bigint END`
}

// tokenLimitMark and duplicateIDMark start the texts whose conversion
// fails in nextToken.
const (
	tokenLimitMark  = "warden-token-limit:"
	duplicateIDMark = "warden-duplicate-id:"
)

// tokenLimit turns the error nextToken raises into a clear one, naming
// the record; other errors pass.
func (r *RecordTable) tokenLimit(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "22P02" {
		return err
	}
	// The message quotes the text: "…" in English, other marks in other
	// languages (lc_messages).
	if i := strings.Index(pe.Message, duplicateIDMark); i >= 0 {
		id := strings.TrimRight(pe.Message[i+len(duplicateIDMark):], `"'»«”“„›‹」`)
		r.recheck()
		return fmt.Errorf("postgres: %s: record %s: several rows have this id: the id column %s is not unique (make it the primary key or give it a unique index of its own, with the column's collation; an inheritance child's rows count too), so the record cannot be locked (nothing was written)",
			r.name, cut(id), r.idCol)
	}
	i := strings.Index(pe.Message, tokenLimitMark)
	if i < 0 {
		return err
	}
	id := strings.TrimRight(pe.Message[i+len(tokenLimitMark):], `"'»«”“„›‹」`)
	return fmt.Errorf("postgres: %s: record %s: its token column %s is at the largest value of its type: no greater fencing token can be issued, so the record cannot be locked until the column is reset or widened to bigint (nothing was written)",
		r.name, cut(id), r.tokenCol)
}

// claimQuery builds Claim's statement for a filter with n arguments: the
// filter's placeholders are $1..$n, the owner and the duration $n+1 and
// $n+2.
//
// The first unlocked row in the filter's order is the first of three
// candidates, each found through an index that holds no live lock, so
// that a claim does not walk past the rows others hold:
//
//   - warden_free: the first matching row without a holder (never locked,
//     or released), through the migration's partial index (id) WHERE
//     locked_by IS NULL, or a user's partial index on the filter's and
//     order's columns with the same WHERE;
//   - warden_lapsed: the first matching row whose holding has expired,
//     through the partial index of holdings (their expiry) WHERE
//     locked_by IS NOT NULL, read from its start up to now;
//   - warden_cleared: the first matching row another program cleared by
//     hand while leaving the other column — an empty holder (any expiry),
//     or a holder with no expiry — through the migration's partial index
//     (id) WHERE the holder is empty or set without an expiry
//     (clearedPred), which no call of warden's writes into, so it is
//     empty but for those rows. On a table without that index (migrated
//     before it
//     existed: cleared is false) there is no such search — any other plan
//     would read the live holdings (the planner walks the id index past
//     them rather than the index of holdings for the NULL expiries) — and
//     those rows are passed over: until its expiry passes for a row whose
//     holder is empty, for good for a row with a holder and no expiry
//     (Lock takes it; ForceRelease, warden record release, clears it).
//
// Each takes its row lock with SKIP LOCKED: a row another claim's
// statement is taking is passed over, not waited for, and a row taken by
// a claim that committed after this statement's snapshot is rechecked on
// its new version (READ COMMITTED) and passed over. The update takes the
// first of the (at most three) candidates in the filter's order.
func (r *RecordTable) claimQuery(f recordlock.SQL, cleared bool) string {
	T, I, U, B, K, N := r.qt, r.qid, r.qu, r.qb, r.qk, clockSQL
	where := strings.TrimSpace(f.Where)
	if where == "" {
		where = "TRUE"
	}
	order := strings.TrimSpace(f.OrderBy)
	if order == "" {
		order = I
	}
	// The filter goes on lines of its own, in parentheses, so that a
	// trailing -- comment or an OR stays inside.
	filter := "(\n" + where + "\n)"
	orderBy := "ORDER BY " + order + "\n"
	n := len(f.Args)
	// The UPDATE takes the picked row only if it is still free, whatever
	// the filter did: the pick already holds the row's lock, so this
	// changes nothing for a filter that keeps to its parentheses, and a
	// filter that escapes them (an unbalanced ")") cannot hand out a row
	// whose lock is live.
	free := B + ` IS NULL OR ` + U + ` <= ` + N
	third, thirdID := "", ""
	if cleared {
		free += ` OR ` + r.clearedPred()
		third = `warden_cleared AS MATERIALIZED (SELECT ` + I + ` AS warden_id FROM ` + T + ` WHERE ` + r.clearedPred() + ` AND ` + filter + `
` + orderBy + `LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED),
`
		thirdID = `
  UNION ALL SELECT warden_id FROM warden_cleared`
	}
	return `WITH warden_free AS MATERIALIZED (SELECT ` + I + ` AS warden_id FROM ` + T + ` WHERE ` + B + ` IS NULL AND ` + filter + `
` + orderBy + `LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED),
warden_lapsed AS MATERIALIZED (SELECT ` + I + ` AS warden_id FROM ` + T + ` WHERE ` + B + ` IS NOT NULL AND ` + U + ` <= ` + N + ` AND ` + filter + `
` + orderBy + `LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED),
` + third + `warden_pick AS MATERIALIZED (SELECT ` + I + ` AS warden_id FROM ` + T + ` WHERE ` + I + ` IN (SELECT warden_id FROM warden_free UNION ALL SELECT warden_id FROM warden_lapsed` + thirdID + `)
` + orderBy + `LIMIT 1)
UPDATE ` + T + ` SET ` + B + ` = $` + strconv.Itoa(n+1) + `::text, ` + U + ` = ` + N + ` + $` + strconv.Itoa(n+2) + `::bigint * interval '1 millisecond', ` + K + ` = ` + r.nextToken(`SELECT count(*) FROM `+T+` warden_dup WHERE warden_dup.`+I+` = warden_pick.warden_id`) + `
FROM warden_pick WHERE ` + T + `.` + I + ` = warden_pick.warden_id AND (` + free + `)
RETURNING ` + T + `.` + I + `, ` + T + `.` + B + `, ` + T + `.` + U + `, ` + T + `.` + K + `, ` + N + `
`
}

// maxPlaceholder returns the greatest $n placeholder in an SQL fragment
// (0 if none), reading it as PostgreSQL's lexer does (with
// standard_conforming_strings on, the default since 9.1, which pgx's own
// quoting requires too): string literals '…' (a quote doubled inside),
// escape strings E'…' (a backslash escapes the next character, a quote
// doubled too; a continuation after a newline stays an escape string),
// dollar-quoted strings $tag$…$tag$, quoted identifiers "…", comments
// (-- to the end of the line, /* … */ nested) and identifiers ($ inside
// one, as in a$1, is no placeholder) are passed over. It guards Claim
// against a filter that names more parameters than it has Args, which
// would otherwise bind the driver's own (the owner, the duration). A
// fragment that ends inside a literal, a quoted identifier or a /*
// comment — whose end the server would find in the driver's text after
// it — is an error.
func maxPlaceholder(s string) (int, error) {
	top := 0
	for i := 0; i < len(s); {
		switch c := s[i]; {
		case c == '\'':
			j, err := endQuoted(s, i+1, '\'', false)
			if err != nil {
				return 0, fmt.Errorf("unterminated string literal at byte %d", i)
			}
			i = j
		case c == '"':
			j, err := endQuoted(s, i+1, '"', false)
			if err != nil {
				return 0, fmt.Errorf("unterminated quoted identifier at byte %d", i)
			}
			i = j
		case c == '-' && strings.HasPrefix(s[i:], "--"):
			i = endLine(s, i)
		case c == '/' && strings.HasPrefix(s[i:], "/*"):
			j, err := endComment(s, i)
			if err != nil {
				return 0, err
			}
			i = j
		case c == '$':
			j := i + 1
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				j++
			}
			if j > i+1 { // $n
				n, err := strconv.Atoi(s[i+1 : j])
				if err != nil { // beyond int: beyond any Args
					n = math.MaxInt
				}
				top = max(top, n)
				i = j
				continue
			}
			if tag, ok := dollarTag(s[i:]); ok {
				k := strings.Index(s[i+len(tag):], tag)
				if k < 0 {
					return 0, fmt.Errorf("unterminated dollar-quoted string %s at byte %d", tag, i)
				}
				i += 2*len(tag) + k
				continue
			}
			i++
		case identStart(c):
			j := i + 1
			for j < len(s) && (identStart(s[j]) || s[j] >= '0' && s[j] <= '9' || s[j] == '$') {
				j++
			}
			if j == i+1 && (c == 'E' || c == 'e') && j < len(s) && s[j] == '\'' {
				k, err := endQuoted(s, j+1, '\'', true)
				if err != nil {
					return 0, fmt.Errorf("unterminated escape string at byte %d", i)
				}
				j = k
			}
			i = j
		case c >= '0' && c <= '9': // a number: digits, ., e, x, _
			for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.' || s[i] == '_' || s[i] >= 'a' && s[i] <= 'z' || s[i] >= 'A' && s[i] <= 'Z') {
				i++
			}
		default:
			i++
		}
	}
	return top, nil
}

// identStart reports a byte that starts a PostgreSQL identifier.
func identStart(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// endQuoted returns the index after the quote q that closes the quoted
// text starting at s[i] (just after the opening quote), a doubled quote
// standing for itself; with escapes (E'…'), a backslash escapes the next
// byte, and a string followed by white space holding a newline and
// another quote goes on, as the server reads it.
func endQuoted(s string, i int, q byte, escapes bool) (int, error) {
	for i < len(s) {
		switch s[i] {
		case '\\':
			if escapes {
				i += 2
				continue
			}
		case q:
			if i+1 < len(s) && s[i+1] == q {
				i += 2
				continue
			}
			if escapes {
				if k, ok := continuation(s, i+1); ok {
					i = k + 1
					continue
				}
			}
			return i + 1, nil
		}
		i++
	}
	return 0, errors.New("unterminated")
}

// continuation reports whether s[i:] is white space with a newline (and
// -- comments) then a quote — a string constant continued — and returns
// the quote's index.
func continuation(s string, i int) (int, bool) {
	newline := false
	for i < len(s) {
		switch c := s[i]; {
		case c == '\n' || c == '\r':
			newline = true
			i++
		case c == ' ' || c == '\t' || c == '\f' || c == '\v':
			i++
		case c == '-' && newline && strings.HasPrefix(s[i:], "--"):
			i = endLine(s, i)
		case c == '\'' && newline:
			return i, true
		default:
			return 0, false
		}
	}
	return 0, false
}

// endLine returns the index after the newline that ends the -- comment
// at s[i] (or len(s)).
func endLine(s string, i int) int {
	if k := strings.IndexAny(s[i:], "\n\r"); k >= 0 {
		return i + k + 1
	}
	return len(s)
}

// endComment returns the index after the */ that closes the /* comment
// at s[i], comments nesting as PostgreSQL's do.
func endComment(s string, i int) (int, error) {
	depth := 0
	for j := i; j+1 < len(s); {
		switch {
		case s[j] == '/' && s[j+1] == '*':
			depth++
			j += 2
		case s[j] == '*' && s[j+1] == '/':
			depth--
			j += 2
			if depth == 0 {
				return j, nil
			}
		default:
			j++
		}
	}
	return 0, fmt.Errorf("unterminated /* comment at byte %d", i)
}

// dollarTag returns the opening tag ($$ or $name$) of a dollar-quoted
// string at the start of s.
func dollarTag(s string) (string, bool) {
	for j := 1; j < len(s); j++ {
		c := s[j]
		switch {
		case c == '$':
			return s[:j+1], true
		case identStart(c), j > 1 && c >= '0' && c <= '9':
		default:
			return "", false
		}
	}
	return "", false
}

// checkClaimArgs refuses Args pgx would not bind as values: a
// pgx.QueryRewriter (pgx.NamedArgs, pgx.StrictNamedArgs …) rewrites the
// whole statement and all its arguments — the driver's owner and
// duration included — and a QueryExecMode or QueryResultFormats is taken
// as an option of the query, shifting the arguments after it.
func checkClaimArgs(args []any) error {
	for i, a := range args {
		// A Valuer is called (and its Value, if a Valuer too, a few levels
		// down) so that one that fails or panics is an error here, not a
		// panic inside pgx.
		for depth, x := 0, a; depth < 4; depth++ {
			vr, ok := x.(driver.Valuer)
			if !ok {
				break
			}
			val, err := callValue(vr)
			if err != nil {
				return fmt.Errorf("Args[%d] (%T): its Value failed: %v: %w", i, a, err, warden.ErrInvalidArgument)
			}
			x = val
		}
		switch a.(type) {
		case pgx.QueryRewriter:
			return fmt.Errorf("Args[%d] is a %T, a pgx.QueryRewriter: it would rewrite the driver's statement and parameters; use $1 … $n placeholders: %w", i, a, warden.ErrInvalidArgument)
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			return fmt.Errorf("Args[%d] is a %T, which pgx takes as an option of the query, not a value: %w", i, a, warden.ErrInvalidArgument)
		}
	}
	return nil
}

// Backend implements driver.Records.
func (r *RecordTable) Backend() string { return "postgres" }

// Table implements driver.Records: the table's name, schema-qualified if
// RecordOptions.Schema is set.
func (r *RecordTable) Table() string { return r.name }

// showRecordID formats an id for messages, cut short.
func showRecordID(id any) string {
	s := fmt.Sprintf("%v", id)
	if _, ok := id.(string); ok {
		s = fmt.Sprintf("%q", id)
	}
	if len(s) > 64 {
		s = s[:61] + "..."
	}
	return s
}

var (
	timeType   = reflect.TypeFor[time.Time]()
	valuerType = reflect.TypeFor[driver.Valuer]()
)

// CheckID implements driver.Records: see RecordTable for the accepted
// ids. Refused: nil, "" and empty []byte, strings and []byte over
// MaxRecordIDBytes, strings that are not valid UTF-8 or hold NUL (no
// PostgreSQL text can), integers above math.MaxInt64, the zero time,
// pointers, floats, bools, maps, other slices and arrays, other structs,
// and Valuers whose Value is NULL or itself refused.
func (r *RecordTable) CheckID(id any) error {
	if err := checkRecordID(id, 0); err != nil {
		return err
	}
	r.checkMu.Lock()
	k := r.kind
	r.checkMu.Unlock()
	return r.kindOK(k, id)
}

// kindOK refuses a plain id of the other family than the id column's
// (see RecordTable). A driver.Valuer is the caller's typed value and is
// bound as its Value says: it is not judged here.
func (r *RecordTable) kindOK(k idKind, id any) error {
	if _, ok := id.(driver.Valuer); ok || k == kindAny {
		return nil
	}
	isInt, isText, isBytes := false, false, false
	switch reflect.TypeOf(id).Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		isInt = true
	case reflect.String:
		isText = true
	case reflect.Slice:
		isBytes = true
	}
	switch {
	case k == kindInt && !isInt:
		return fmt.Errorf("postgres: %s: record id %s (%T): the id column %s is numeric: ids are integers (the server would read a string as a number): %w",
			r.name, showRecordID(id), id, r.idCol, warden.ErrInvalidArgument)
	case k == kindText && !isText:
		return fmt.Errorf("postgres: %s: record id %s (%T): the id column %s holds strings: ids are strings: %w",
			r.name, showRecordID(id), id, r.idCol, warden.ErrInvalidArgument)
	case k == kindBytes && !isBytes:
		return fmt.Errorf("postgres: %s: record id %s (%T): the id column %s is bytea: ids are []byte (a string would be read as bytea's text form): %w",
			r.name, showRecordID(id), id, r.idCol, warden.ErrInvalidArgument)
	}
	return nil
}

// ready checks id, and, on first use, the table (see check), and then id
// against the id column's type. It returns the value to bind (see bound).
//
// A Valuer's Value is called once here, and that one result is judged and
// bound: a Valuer whose Value changes between calls cannot have one value
// checked and another bound.
func (r *RecordTable) ready(ctx context.Context, id any) (any, error) {
	v := id
	if vr, ok := id.(driver.Valuer); ok {
		val, err := callValue(vr)
		switch {
		case err != nil:
			return nil, badID(id, "its Value failed: "+err.Error())
		case val == nil:
			return nil, badID(id, "its Value is NULL")
		}
		if err := checkRecordID(val, 1); err != nil {
			return nil, badID(id, "its Value: "+err.Error())
		}
		v = val
	} else if err := checkRecordID(id, 0); err != nil {
		return nil, err
	}
	if err := r.check(ctx); err != nil {
		return nil, err
	}
	r.checkMu.Lock()
	k := r.kind
	r.checkMu.Unlock()
	if err := r.kindOK(k, id); err != nil {
		return nil, err
	}
	return bound(v), nil
}

// bound is the value bound for an id that CheckID accepted: a Valuer's
// Value, and a value of a named integer or string type as the plain
// int64, uint64 or string it holds — pgx would otherwise bind through
// the type's own encoding methods (Int64Value, TextValue …), which may
// name another value than the one CheckID judged. Other ids ([]byte,
// [16]byte, time.Time) are bound as they are.
//
// id is a value checkRecordID accepted (for a Valuer, its Value); bound
// looks at kinds again all the same, so that no value reaches a
// conversion that would panic.
func bound(id any) any {
	switch v := reflect.ValueOf(id); v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return int64(v.Uint()) // CheckID refused values above math.MaxInt64
	case reflect.String:
		return v.String()
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return v.Bytes()
		}
	case reflect.Array: // [16] of a byte kind, a uuid
		if v.Len() == 16 && v.Type().Elem().Kind() == reflect.Uint8 {
			var u [16]byte
			for i := range u {
				u[i] = byte(v.Index(i).Uint())
			}
			return u
		}
	}
	return id // time.Time: checkRecordID accepts no other struct
}

func badID(id any, why string) error {
	return fmt.Errorf("postgres: record id %s (%T): %s: %w", showRecordID(id), id, why, warden.ErrInvalidArgument)
}

func checkRecordID(id any, depth int) error {
	if id == nil {
		return badID(id, "nil")
	}
	v := reflect.ValueOf(id)
	t := v.Type()
	if t == timeType {
		if id.(time.Time).IsZero() {
			return badID(id, "the zero time")
		}
		return nil
	}
	if t.Kind() == reflect.Pointer {
		return badID(id, "a pointer: pass the value")
	}
	if t.Implements(valuerType) && depth == 0 {
		val, err := callValue(id.(driver.Valuer))
		if err != nil {
			return badID(id, "its Value failed: "+err.Error())
		}
		if val == nil {
			return badID(id, "its Value is NULL")
		}
		if err := checkRecordID(val, depth+1); err != nil {
			return badID(id, "its Value: "+err.Error())
		}
		return nil
	}
	switch t.Kind() {
	case reflect.String:
		s := v.String()
		switch {
		case s == "":
			return badID(id, "empty")
		case len(s) > MaxRecordIDBytes:
			return badID(id, fmt.Sprintf("%d bytes, over %d", len(s), MaxRecordIDBytes))
		case !utf8.ValidString(s) || strings.ContainsRune(s, 0):
			return badID(id, "not valid UTF-8 without NUL (PostgreSQL text cannot hold it; use []byte for a bytea column)")
		}
		return nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		if v.Uint() > math.MaxInt64 {
			return badID(id, "above the largest bigint")
		}
		return nil
	case reflect.Slice:
		if t.Elem().Kind() != reflect.Uint8 {
			return badID(id, "a slice other than []byte")
		}
		switch n := v.Len(); {
		case n == 0:
			return badID(id, "empty")
		case n > MaxRecordIDBytes:
			return badID(id, fmt.Sprintf("%d bytes, over %d", n, MaxRecordIDBytes))
		}
		return nil
	case reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 && t.Len() == 16 {
			return nil // a uuid
		}
		return badID(id, "an array other than [16]byte (uuid)")
	}
	return badID(id, "an unsupported type")
}

// callValue calls a Valuer, turning a panic (a nil receiver inside an
// interface) into an error.
func callValue(v driver.Valuer) (val driver.Value, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panicked: %v", p)
		}
	}()
	return v.Value()
}

// fail wraps a statement's error: the context's error if it ended; a
// value pgx or the server could not bind to its column's type (pgx's
// encoding error, or SQLSTATE class 22, data exception: "abc" for a
// bigint id, a NUL in a text value) as warden.ErrInvalidArgument — the id
// (id != nil) or Claim's filter arguments; otherwise the driver's error,
// prefixed.
func (r *RecordTable) fail(ctx context.Context, id any, err error) error {
	if err == nil {
		return nil
	}
	if e := ctxErr(ctx, err); e != err {
		return e
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "42") || pe.Code == "0A000") {
		// An undefined column or operator, a plan whose types changed: the
		// table is not what the first call read; the next call reads it
		// again.
		r.recheck()
	}
	if errors.As(err, &pe) && strings.HasPrefix(pe.Code, "22") || strings.Contains(err.Error(), "failed to encode args[") {
		if id != nil {
			return &unfitError{fmt.Sprintf("postgres: %s: record id %s (%T) does not fit column %s: %v: %s", r.name, showRecordID(id), id, r.idCol, warden.ErrInvalidArgument, cut(err.Error())), err}
		}
		return &unfitError{fmt.Sprintf("postgres: %s: Claim's filter: %v: %s", r.name, warden.ErrInvalidArgument, cut(err.Error())), err}
	}
	return fmt.Errorf("postgres: %s: %w", r.name, err)
}

// unfitError is a value refused for its column's type. Its message cuts
// the driver's short (the server quotes the value it refused); it matches
// warden.ErrInvalidArgument and the driver's error.
type unfitError struct {
	msg string
	err error
}

func (e *unfitError) Error() string   { return e.msg }
func (e *unfitError) Unwrap() []error { return []error{warden.ErrInvalidArgument, e.err} }

// cut shortens a message to 200 bytes.
func cut(s string) string {
	if len(s) <= 200 {
		return s
	}
	s = s[:197]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "..."
}

// lockRow is the scan target of a row's lock state.
type lockRow struct {
	id    any
	by    sql.NullString
	until sql.NullTime
	token sql.NullInt64
	now   time.Time
}

func (l *lockRow) dest() []any { return []any{&l.id, &l.by, &l.until, &l.token, &l.now} }

func (l *lockRow) rec() wdriver.RecordLock {
	return wdriver.RecordLock{ID: l.id, Owner: l.by.String, Until: utc(l.until), Token: l.token.Int64, Now: l.now.UTC().Truncate(time.Millisecond)}
}

// one runs a statement answering at most one row; found is false if it
// answered none.
func (r *RecordTable) one(ctx context.Context, id any, q string, args []any, dest ...any) (bool, error) {
	err := retry(ctx, func() error { return r.pool.QueryRow(ctx, q, args...).Scan(dest...) })
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, r.fail(ctx, id, err)
}

// Lock implements driver.Records in one statement: lock the row, read
// the clock, update it where unlocked, answer the new or current state.
func (r *RecordTable) Lock(ctx context.Context, id any, owner string, d time.Duration) (rec wdriver.RecordLock, found, acquired bool, err error) {
	arg, err := r.ready(ctx, id)
	if err != nil {
		return rec, false, false, err
	}
	var row lockRow
	found, err = r.one(ctx, id, r.lockQ, []any{arg, owner, wdriver.Millis(d)}, append([]any{&acquired}, row.dest()...)...)
	if !found || err != nil {
		return rec, false, false, r.tokenLimit(err)
	}
	return row.rec(), true, acquired, nil
}

// Extend implements driver.Records in one statement.
func (r *RecordTable) Extend(ctx context.Context, id any, owner string, token int64, d time.Duration) (rec wdriver.RecordLock, found, ok bool, err error) {
	arg, err := r.ready(ctx, id)
	if err != nil {
		return rec, false, false, err
	}
	var row lockRow
	found, err = r.one(ctx, id, r.extendQ, []any{arg, owner, token, wdriver.Millis(d)}, append([]any{&ok}, row.dest()...)...)
	if !found || err != nil {
		return rec, false, false, err
	}
	return row.rec(), true, ok, nil
}

// Release implements driver.Records in one conditional UPDATE.
func (r *RecordTable) Release(ctx context.Context, id any, owner string, token int64) (bool, error) {
	arg, err := r.ready(ctx, id)
	if err != nil {
		return false, err
	}
	var n int64
	err = retry(ctx, func() error {
		tag, err := r.pool.Exec(ctx, r.releaseQ, arg, owner, token)
		n = tag.RowsAffected()
		return err
	})
	return n > 0, r.fail(ctx, id, err)
}

// ForceRelease implements driver.Records in one statement; a row with
// nothing to clear is not written.
func (r *RecordTable) ForceRelease(ctx context.Context, id any) (wdriver.RecordLock, bool, error) {
	arg, err := r.ready(ctx, id)
	if err != nil {
		return wdriver.RecordLock{}, false, err
	}
	var row lockRow
	found, err := r.one(ctx, id, r.forceQ, []any{arg}, row.dest()...)
	if !found || err != nil {
		return wdriver.RecordLock{}, false, err
	}
	return row.rec(), true, nil
}

// Get implements driver.Records in one SELECT.
func (r *RecordTable) Get(ctx context.Context, id any) (wdriver.RecordLock, bool, error) {
	arg, err := r.ready(ctx, id)
	if err != nil {
		return wdriver.RecordLock{}, false, err
	}
	var row lockRow
	found, err := r.one(ctx, id, r.getQ, []any{arg}, row.dest()...)
	if !found || err != nil {
		return wdriver.RecordLock{}, false, err
	}
	return row.rec(), true, nil
}

// Claim implements driver.Records in one statement:
//
//	WITH clock, pick AS (SELECT id FROM t
//	    WHERE (unlocked at clock) AND (filter.Where)
//	    ORDER BY filter.OrderBy LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED)
//	UPDATE t SET locked_by = owner, locked_until = clock + d, lock_token = COALESCE(lock_token, 0) + 1
//	FROM pick WHERE t.id = pick.id RETURNING …
//
// filter.Where's placeholders are $1..$len(Args); the owner and the
// duration are numbered after them. A $k beyond len(Args) (found as the
// server's lexer reads the filter: see maxPlaceholder), a filter that
// ends inside a literal or comment, and an Arg pgx would not bind as a
// value (see checkClaimArgs) are refused with warden.ErrInvalidArgument
// before any I/O. A row another claimer holds (locked
// by its statement, not yet committed) is skipped, not waited for, and a
// row another claimer has just taken is rechecked on its new version and
// passed over.
func (r *RecordTable) Claim(ctx context.Context, filter recordlock.SQL, owner string, d time.Duration) (wdriver.RecordLock, bool, error) {
	for _, part := range []struct{ name, sql string }{{"Where", filter.Where}, {"OrderBy", filter.OrderBy}} {
		n, err := maxPlaceholder(part.sql)
		if err != nil {
			return wdriver.RecordLock{}, false, fmt.Errorf("postgres: %s: Claim's filter: %s: %v: %w", r.name, part.name, err, warden.ErrInvalidArgument)
		}
		if n > len(filter.Args) {
			return wdriver.RecordLock{}, false, fmt.Errorf("postgres: %s: Claim's filter: %s uses $%d but there are %d Args (the driver's own parameters come after them): %w",
				r.name, part.name, n, len(filter.Args), warden.ErrInvalidArgument)
		}
	}
	if err := checkClaimArgs(filter.Args); err != nil {
		return wdriver.RecordLock{}, false, fmt.Errorf("postgres: %s: Claim's filter: %w", r.name, err)
	}
	args := make([]any, 0, len(filter.Args)+2)
	args = append(args, filter.Args...)
	args = append(args, owner, wdriver.Millis(d))
	var row lockRow
	if err := r.check(ctx); err != nil {
		return wdriver.RecordLock{}, false, err
	}
	r.checkMu.Lock()
	cleared := r.cleared
	r.checkMu.Unlock()
	found, err := r.one(ctx, nil, r.claimQuery(filter, cleared), args, row.dest()...)
	if !found || err != nil {
		return wdriver.RecordLock{}, false, r.tokenLimit(err)
	}
	return row.rec(), true, nil
}

// List implements driver.Records: the rows whose lock is live, in id
// order, at most limit. It reads through the index on the expiry column
// (the live locks), then sorts them by id.
func (r *RecordTable) List(ctx context.Context, limit int) ([]wdriver.RecordLock, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("postgres: %s: List: limit %d: %w", r.name, limit, warden.ErrInvalidArgument)
	}
	var out []wdriver.RecordLock
	err := retry(ctx, func() error {
		out = out[:0]
		rows, err := r.pool.Query(ctx, r.listQ, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var row lockRow
			if err := rows.Scan(row.dest()...); err != nil {
				return err
			}
			out = append(out, row.rec())
		}
		return rows.Err()
	})
	if err != nil {
		return nil, r.fail(ctx, nil, err)
	}
	return out, nil
}

// Migration returns the statements that add the lock columns (nullable,
// without defaults: adding them rewrites no row and changes no existing
// value) and Claim's three partial indexes, for users who migrate by hand:
//
//   - <table>_<until>_idx ON (locked_until) WHERE locked_by IS NOT NULL:
//     the holdings (live or lapsed) by expiry, for Claim's lapsed
//     candidate and for List;
//   - <table>_<id>_unlocked_idx ON (id) WHERE locked_by IS NULL: the rows
//     without a holder in id order, for Claim's free candidate in the
//     default order. A Claim with a filter and order of its own is served
//     by an index of the user's on those columns with the same WHERE,
//     such as CREATE INDEX ON jobs (status, priority, id) WHERE locked_by
//     IS NULL;
//   - <table>_<by>_cleared_idx ON (id) WHERE the holder is empty, or set
//     while the expiry is NULL (see clearedPred): the rows another program
//     cleared by hand while leaving the other column, which warden never
//     writes — an empty index but for those — for Claim's third
//     candidate. A Claim that runs before the index exists (it looks
//     once) passes those rows over: one whose holder is empty until its
//     expiry passes, one with a holder and no expiry for good (Lock takes
//     it; ForceRelease clears it).
//
// All statements are idempotent. On a large table that is written to,
// build the indexes with CREATE INDEX CONCURRENTLY instead (outside a
// transaction): plain CREATE INDEX blocks writes while it runs.
func (r *RecordTable) Migration() string {
	return `ALTER TABLE ` + r.qt + `
  ADD COLUMN IF NOT EXISTS ` + r.qu + ` timestamptz(3),
  ADD COLUMN IF NOT EXISTS ` + r.qb + ` text,
  ADD COLUMN IF NOT EXISTS ` + r.qk + ` bigint;
` + r.createHeld() + `;
` + r.createFree() + `;
` + r.createCleared() + `;
`
}

func (r *RecordTable) createHeld() string {
	return `CREATE INDEX IF NOT EXISTS ` + pgx.Identifier{r.heldIdx}.Sanitize() + ` ON ` + r.qt + ` (` + r.qu + `) WHERE ` + r.qb + ` IS NOT NULL`
}

// clearedPred is the WHERE of the partial index of rows another program
// cleared by hand (see claimQuery); Claim's search repeats it word for
// word, so that the planner matches the index.
func (r *RecordTable) clearedPred() string {
	return `(` + r.qb + ` = '' OR (` + r.qb + ` IS NOT NULL AND ` + r.qu + ` IS NULL))`
}

func (r *RecordTable) createCleared() string {
	return `CREATE INDEX IF NOT EXISTS ` + pgx.Identifier{r.clearedIdx}.Sanitize() + ` ON ` + r.qt + ` (` + r.qid + `) WHERE ` + r.clearedPred()
}

// recheck makes the next call read the table again (see check).
func (r *RecordTable) recheck() {
	r.checkMu.Lock()
	r.checked = false
	r.checkMu.Unlock()
}

// check reads, once, what the driver needs to know of the table (one
// round trip on the first call; remembered once the table exists — while
// it does not, the statements fail on their own and nothing is
// remembered): the id column's type family (see RecordTable), that the id
// column is the primary key or alone in a unique index, and whether the
// table has the partial index of rows cleared by hand (see claimQuery).
// A table whose id column is missing or not unique is refused, every
// call, with an error saying why.
func (r *RecordTable) check(ctx context.Context) error {
	r.checkMu.Lock()
	defer r.checkMu.Unlock()
	if r.checked {
		return nil
	}
	var (
		table, column, unique, index, children bool
		category, typ, typtype                 string
		typOID                                 uint32
	)
	err := retry(ctx, func() error {
		return r.pool.QueryRow(ctx, `SELECT c.oid IS NOT NULL, a.attnum IS NOT NULL, COALESCE(t.typcategory::text, ''), COALESCE(t.typname::text, ''),
  COALESCE(t.typtype::text, ''), COALESCE(t.oid, 0::oid),
  EXISTS (SELECT FROM pg_index i WHERE i.indrelid = c.oid AND i.indisunique AND i.indisvalid AND i.indnkeyatts = 1
    AND i.indkey[0] = a.attnum AND i.indpred IS NULL AND i.indexprs IS NULL),
  EXISTS (SELECT FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid WHERE i.indrelid = c.oid AND x.relname = $3 AND i.indisvalid),
  EXISTS (SELECT FROM pg_inherits h JOIN pg_class p ON p.oid = h.inhparent WHERE h.inhparent = c.oid AND p.relkind <> 'p')
FROM (SELECT to_regclass($1) AS oid) c
LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_type t ON t.oid = a.atttypid`, r.qt, r.idCol, r.clearedIdx).Scan(&table, &column, &category, &typ, &typtype, &typOID, &unique, &index, &children)
	})
	if err == nil && typtype == "d" {
		// A domain, perhaps over another: its values are its base type's.
		err = retry(ctx, func() error {
			return r.pool.QueryRow(ctx, `WITH RECURSIVE chain(base, name, depth) AS (
  SELECT typbasetype, typname::text, 0 FROM pg_type WHERE oid = $1
  UNION ALL
  SELECT t.typbasetype, t.typname::text, chain.depth + 1 FROM chain JOIN pg_type t ON t.oid = chain.base WHERE chain.base <> 0 AND chain.depth < 64)
SELECT name FROM chain WHERE base = 0`, typOID).Scan(&typ)
		})
	}
	if err != nil {
		return r.fail(ctx, nil, err)
	}
	switch {
	case !table:
		return nil
	case !column:
		return fmt.Errorf("postgres: records: table %s has no id column %q", r.name, r.idCol)
	case !unique:
		return fmt.Errorf("postgres: records: the id column %q of %s is neither the primary key nor alone in a unique index: a lock must name one row", r.idCol, r.name)
	case children:
		return fmt.Errorf("postgres: records: table %s has inheritance children: statements on it read their rows too, and its unique index does not cover them, so a lock could name several rows (declarative partitioning keeps one unique index over all partitions; or give each table a RecordTable of its own)", r.name)
	}
	switch typ {
	case "float4", "float8", "name", "char":
		// Ids the server would round (floats), cut (name: 63 bytes) or
		// reduce to one byte ("char"): a lock could name a row whose id is
		// not the one asked for.
		return fmt.Errorf("postgres: records: the id column %q of %s is of type %s, whose values the server rounds or cuts on comparison: use an integer, numeric, text, varchar, uuid or bytea id", r.idCol, r.name, typ)
	case "bytea":
		r.kind = kindBytes
	default:
		switch category {
		case "N":
			r.kind = kindInt
		case "S":
			r.kind = kindText
		default:
			r.kind = kindAny
		}
	}
	r.checked, r.cleared = true, index
	return nil
}

func (r *RecordTable) createFree() string {
	return `CREATE INDEX IF NOT EXISTS ` + pgx.Identifier{r.freeIdx}.Sanitize() + ` ON ` + r.qt + ` (` + r.qid + `) WHERE ` + r.qb + ` IS NULL`
}

// migrateLockKey is the first key of the advisory lock Migrate takes (the
// second is a hash of the table's name), so that concurrent migrations
// of one table take turns.
const migrateLockKey = 2002874981

// Migrate adds the lock columns and the indexes of Migration where they
// are missing, in one transaction under an advisory lock (concurrent
// Migrates take turns). It never creates the table. Before changing
// anything it refuses, with an error naming the cause: a missing table
// or id column; an id column that is neither the primary key nor alone
// in a unique index (a lock must name one row); lock columns of another
// type (the expiry must be timestamptz, the holder text or varchar, the
// token bigint or integer); an invalid index of one of Migration's names
// (left by a failed CREATE INDEX CONCURRENTLY: drop it). A table already
// migrated costs three small queries (in one transaction) and no
// change: no ALTER TABLE or CREATE INDEX runs, so no lock that would
// block the table's writers is taken.
func (r *RecordTable) Migrate(ctx context.Context) error {
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		var reg sql.NullString
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1)::text`, r.qt).Scan(&reg); err != nil {
			return err
		}
		if !reg.Valid {
			return fmt.Errorf("table %s does not exist (recordlock locks the rows of an existing table and never creates one)", r.name)
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, migrateLockKey, reg.String); err != nil {
			return err
		}
		types := map[string]string{}
		valid := map[string]bool{}
		unique := map[string]bool{}
		rows, err := tx.Query(ctx, `SELECT 'column', a.attname::text, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'index', c.relname::text, i.indisvalid::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass
UNION ALL
SELECT 'unique', a.attname::text, '' FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
WHERE i.indrelid = $1::regclass AND i.indisunique AND i.indisvalid AND i.indnkeyatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL`, reg.String)
		if err != nil {
			return err
		}
		for rows.Next() {
			var kind, name, v string
			if err := rows.Scan(&kind, &name, &v); err != nil {
				rows.Close()
				return err
			}
			switch kind {
			case "column":
				types[name] = v
			case "index":
				valid[name] = v == "true"
			default:
				unique[name] = true
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if _, ok := types[r.idCol]; !ok {
			return fmt.Errorf("table %s has no id column %q", r.name, r.idCol)
		}
		if !unique[r.idCol] {
			return fmt.Errorf("table %s: the id column %q is neither the primary key nor alone in a unique index: a lock must name one row", r.name, r.idCol)
		}
		var add []string
		for _, c := range []struct {
			name, decl, want string
			fits             func(string) bool
		}{
			{r.untilCol, r.qu + " timestamptz(3)", "timestamptz", func(t string) bool {
				return strings.HasPrefix(t, "timestamp") && strings.HasSuffix(t, "with time zone")
			}},
			{r.byCol, r.qb + " text", "text or varchar", func(t string) bool { return t == "text" || strings.HasPrefix(t, "character varying") }},
			{r.tokenCol, r.qk + " bigint", "bigint or integer", func(t string) bool { return t == "bigint" || t == "integer" }},
		} {
			t, ok := types[c.name]
			switch {
			case !ok:
				add = append(add, "ADD COLUMN IF NOT EXISTS "+c.decl)
			case !c.fits(t):
				return fmt.Errorf("table %s: column %q is %s, not %s", r.name, c.name, t, c.want)
			}
		}
		var create []string
		for _, ix := range []struct{ name, stmt string }{{r.heldIdx, r.createHeld()}, {r.freeIdx, r.createFree()}, {r.clearedIdx, r.createCleared()}} {
			v, ok := valid[ix.name]
			switch {
			case !ok:
				create = append(create, ix.stmt)
			case !v:
				return fmt.Errorf("table %s: index %q is invalid (a failed CREATE INDEX CONCURRENTLY?): drop it and migrate again", r.name, ix.name)
			}
		}
		if len(add) > 0 {
			if _, err := tx.Exec(ctx, `ALTER TABLE `+r.qt+` `+strings.Join(add, ", ")); err != nil {
				return err
			}
		}
		for _, stmt := range create {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("postgres: migrate record locks of %s: %w", r.name, err)
	}
	r.checkMu.Lock()
	r.checked = false // read the table again on the next call
	r.checkMu.Unlock()
	return nil
}
