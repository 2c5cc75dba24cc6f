package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	mysqldrv "github.com/go-sql-driver/mysql"
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

// MaxRecordIDBytes is the longest string record id RecordTable accepts.
const MaxRecordIDBytes = driver.MaxKeyBytes

const (
	// recordAttempts bounds the loops of Lock and ForceRelease, which
	// repeat when the record changed between their read and their
	// conditional update: each repetition means another caller made
	// progress, so the bound is reached only under pathological churn.
	recordAttempts = 100
	// recordDeadlocks bounds the repetitions of a statement or a Claim
	// transaction that InnoDB rolled back (deadlock, lock wait timeout).
	recordDeadlocks = 20
)

// RecordOptions configure a RecordTable. nil or the zero value gives the
// defaults. Column names must be plain identifiers (letters, digits and
// underscores, not starting with a digit, at most 64 characters).
type RecordOptions struct {
	// IDColumn is the column that identifies a record: an integer or
	// string column that is the primary key or has a unique index of
	// its own. "": "id".
	IDColumn string
	// UntilColumn holds a holding's expiry, DATETIME(3) in UTC (NULL: not
	// locked). "": "locked_until".
	UntilColumn string
	// OwnerColumn holds the holder (NULL: not locked). "": "locked_by".
	OwnerColumn string
	// TokenColumn holds the last fencing token issued for the record,
	// BIGINT (NULL: never locked). "": "lock_token".
	TokenColumn string
}

// RecordTable is the MySQL/MariaDB driver of package recordlock: locks
// kept in three columns of the rows of one of the program's own InnoDB
// tables, on the program's own *sql.DB. Create it with Records; pass it to
// recordlock.New.
//
// The database clock decides every expiry inside the statement that
// writes or tests it (UTC_TIMESTAMP(3)); the session's time_zone does not
// matter, and neither do the DSN's parseTime and clientFoundRows.
//
// Ids are int, int8 … int64, uint … uint64 (up to math.MaxInt64) for an
// integer id column, non-empty UTF-8 strings of at most MaxRecordIDBytes
// for a CHAR/VARCHAR/BINARY/VARBINARY one: an id of the other kind is
// refused, because MySQL would convert to compare ("1 OR 1=1" = 1, and 0 =
// every string that does not start with a digit). A string id matches as
// the column's collation compares. Ids read from the table (Claim, List)
// are int64 or string.
//
// Its methods are safe for concurrent use.
type RecordTable struct {
	db                       *sql.DB
	table                    string
	idCol, untilCol, ownCol  string
	tokCol                   string
	indexName                string
	clearedName              string // the (holder, expiry) index Migrate adds
	qState, qLock, qExtend   string
	qRelease, qForce, qList  string
	qClaimHead, qClaimFree   string
	qClaimLapsed, qClaimPick string
	qClaimHeadCleared        string
	qClaimCleared            string
	qUpdateClaimed           string

	checkMu  sync.Mutex
	checked  bool   // the table was checked
	kind     idKind // set when checked
	tokLimit int64  // set when checked: the token column's largest value
	tokType  string // set when checked: the token column's type
	// set when checked: the name of an index on (holder, expiry), which
	// Claim's third search reads; "" if the table has none.
	clearedIdx string
}

var _ driver.Records[recordlock.SQL] = (*RecordTable)(nil)

// idKind is the kind of id the id column takes.
type idKind int

const (
	kindUnknown idKind = iota
	kindInt
	kindString
)

// Records returns the record-lock driver over table, an InnoDB table of
// db's current database (db is a handle of github.com/go-sql-driver/mysql;
// FOR UPDATE SKIP LOCKED, which Claim uses, needs MySQL 8.0 or MariaDB
// 10.6). The table must have the lock columns (see Migrate); they are
// checked, with the id column's type and uniqueness, on first use. db
// stays the caller's: RecordTable never closes it.
func Records(db *sql.DB, table string, opts *RecordOptions) (*RecordTable, error) {
	if db == nil {
		return nil, fmt.Errorf("mysql: Records: nil *sql.DB: %w", warden.ErrInvalidArgument)
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
	if !identRe.MatchString(table) {
		return nil, fmt.Errorf("mysql: Records: table name %.80q is not a plain identifier: %w", table, warden.ErrInvalidArgument)
	}
	seen := map[string]bool{}
	for _, c := range []string{o.IDColumn, o.UntilColumn, o.OwnerColumn, o.TokenColumn} {
		if !identRe.MatchString(c) {
			return nil, fmt.Errorf("mysql: Records: column name %.80q is not a plain identifier: %w", c, warden.ErrInvalidArgument)
		}
		if seen[strings.ToLower(c)] {
			return nil, fmt.Errorf("mysql: Records: column %q named twice: %w", c, warden.ErrInvalidArgument)
		}
		seen[strings.ToLower(c)] = true
	}
	t := &RecordTable{db: db, table: table, idCol: o.IDColumn, untilCol: o.UntilColumn, ownCol: o.OwnerColumn, tokCol: o.TokenColumn}
	t.indexName = "warden_" + t.untilCol
	if len(t.indexName) > 64 {
		t.indexName = t.indexName[:64]
	}
	t.clearedName = "warden_" + t.ownCol + "_cleared"
	if len(t.clearedName) > 64 || strings.EqualFold(t.clearedName, t.indexName) {
		t.clearedName = "warden_cleared"
	}
	return t, nil
}

// epoch is the DATETIME of Unix time 0: times convert to and from Unix
// milliseconds by DATETIME arithmetic, which the session's time zone does
// not affect (UNIX_TIMESTAMP and FROM_UNIXTIME would apply it).
const epoch = "TIMESTAMP'1970-01-01 00:00:00'"

// msOf is the Unix milliseconds of a DATETIME(3) expression.
func msOf(expr string) string {
	return "TIMESTAMPDIFF(MICROSECOND, " + epoch + ", " + expr + ") DIV 1000"
}

// fromMs is the DATETIME(3) of a Unix-milliseconds expression.
func fromMs(expr string) string {
	return "TIMESTAMPADD(MICROSECOND, (" + expr + ") * 1000, " + epoch + ")"
}

// buildQueries writes the statements with the quoted names. keep lists
// the table's columns that MySQL would set by itself on every update (ON
// UPDATE CURRENT_TIMESTAMP): every UPDATE assigns them their own value,
// which stops that, so that a lock never changes them.
func (t *RecordTable) buildQueries(keep []string) {
	var k strings.Builder
	for _, c := range keep {
		k.WriteString(", " + qi(c) + " = " + qi(c))
	}
	r := strings.NewReplacer("{keep}", k.String(), "{T}", qi(t.table), "{id}", qi(t.idCol), "{until}", qi(t.untilCol),
		"{by}", qi(t.ownCol), "{tok}", qi(t.tokCol))
	now := msOf("UTC_TIMESTAMP(3)")
	// Free: no holder (NULL, or the empty string another program may
	// write), no expiry, or an expiry passed — the complement of
	// RecordLock.Live.
	free := `({by} IS NULL OR {by} = '' OR {until} IS NULL OR {until} <= UTC_TIMESTAMP(3))`
	// id, holder, expiry (ms), token (NULL: never locked), clock (ms).
	state := `{id}, {by}, ` + msOf("{until}") + `, {tok}, ` + now
	t.qState = r.Replace(`SELECT ` + state + ` FROM {T} WHERE {id} = ?`)
	// The new expiry goes through LAST_INSERT_ID(expr), which the OK
	// packet reports: 0 when no row matched (the function is then not
	// evaluated), the expiry in ms otherwise — whatever the affected-rows
	// flavour, and even when the expiry did not change. An UPDATE never
	// inserts, so an AUTO_INCREMENT id cannot take its place.
	newUntil := fromMs(`LAST_INSERT_ID(` + now + ` + ?)`)
	t.qLock = r.Replace(`UPDATE {T} SET {by} = ?, {until} = ` + newUntil + `, {tok} = ?{keep}
WHERE {id} = ? AND {tok} <=> ? AND ` + free)
	// GREATEST: an extension never moves the expiry earlier (one that
	// reaches the server after a later, longer one); LAST_INSERT_ID
	// reports the expiry written.
	extUntil := fromMs(`LAST_INSERT_ID(GREATEST(` + msOf("{until}") + `, ` + now + ` + ?))`)
	t.qExtend = r.Replace(`UPDATE {T} SET {until} = ` + extUntil + `{keep}
WHERE {id} = ? AND {by} = ? AND {tok} = ? AND {until} > UTC_TIMESTAMP(3)`)
	t.qRelease = r.Replace(`UPDATE {T} SET {by} = NULL, {until} = NULL{keep} WHERE {id} = ? AND {by} = ? AND {tok} = ?`)
	t.qForce = r.Replace(`UPDATE {T} SET {by} = NULL, {until} = NULL{keep} WHERE {id} = ? AND {by} <=> ? AND {tok} <=> ?`)
	// The live holdings: a holder another program set to '' holds nothing.
	t.qList = r.Replace(`SELECT ` + state + ` FROM {T} WHERE {by} IS NOT NULL AND {by} <> '' AND {until} > UTC_TIMESTAMP(3) ORDER BY {id} LIMIT ?`)
	// Claim's candidates: the first record without an expiry, the first
	// lapsed one, the first whose holder another program cleared (NULL or
	// '') while leaving an expiry ahead (the program's condition on lines
	// of its own, so that a trailing comment or OR stays inside its
	// parentheses), then the first of them in the filter's order. The
	// third reads the (holder, expiry) index, forced: its two ranges hold
	// only such rows, where the (expiry, id) index would give it every
	// live holding.
	t.qClaimHead = r.Replace(`SELECT {id}, {tok}, ` + now + ` FROM {T} WHERE (
`)
	t.qClaimFree = r.Replace(`
) AND {until} IS NULL ORDER BY %s LIMIT 1 FOR UPDATE SKIP LOCKED`)
	t.qClaimLapsed = r.Replace(`
) AND {until} <= UTC_TIMESTAMP(3) ORDER BY %s LIMIT 1 FOR UPDATE SKIP LOCKED`)
	t.qClaimPick = r.Replace(`SELECT {id} FROM {T} WHERE {id} IN (%s) ORDER BY %s LIMIT 1`)
	t.qClaimHeadCleared, t.qClaimCleared = t.claimCleared()
	// Only while the row is still free: the candidate already holds its
	// lock, so this changes nothing for a filter that keeps to its
	// parentheses, and one that escapes them (an unbalanced ")") cannot
	// take a row whose lock is live.
	t.qUpdateClaimed = r.Replace(`UPDATE {T} SET {by} = ?, {until} = ` + fromMs("?") + `, {tok} = ?{keep} WHERE {id} = ? AND ` + free)
}

// claimCleared returns the head and the tail of Claim's third search,
// through the index t.clearedIdx ("" when the table has none).
func (t *RecordTable) claimCleared() (string, string) {
	if t.clearedIdx == "" {
		return "", ""
	}
	r := strings.NewReplacer("{T}", qi(t.table), "{id}", qi(t.idCol), "{until}", qi(t.untilCol), "{by}", qi(t.ownCol), "{tok}", qi(t.tokCol))
	return r.Replace(`SELECT {id}, {tok}, ` + msOf("UTC_TIMESTAMP(3)") + ` FROM {T} FORCE INDEX (` + qi(t.clearedIdx) + `) WHERE (
`), r.Replace(`
) AND ({by} IS NULL OR {by} = '') AND {until} > UTC_TIMESTAMP(3) ORDER BY %s LIMIT 1 FOR UPDATE SKIP LOCKED`)
}

// Backend returns "mysql".
func (t *RecordTable) Backend() string { return "mysql" }

// Table returns the table's name.
func (t *RecordTable) Table() string { return t.table }

// CheckID accepts the id types of RecordTable; the error wraps
// warden.ErrInvalidArgument. Once the table was checked (on first use),
// it also refuses an id of the other kind than the id column's.
func (t *RecordTable) CheckID(id any) error {
	v, err := bindRecordID(id)
	if err != nil {
		return err
	}
	t.checkMu.Lock()
	k := t.kind
	t.checkMu.Unlock()
	return t.kindOK(k, v)
}

// bindRecordID returns id as it is bound: an int64 or a string.
func bindRecordID(id any) (any, error) {
	switch v := id.(type) {
	case string:
		switch {
		case v == "":
			return nil, fmt.Errorf("mysql: empty record id: %w", warden.ErrInvalidArgument)
		case len(v) > MaxRecordIDBytes:
			return nil, fmt.Errorf("mysql: record id %.40q… of %d bytes: the limit is %d: %w", v, len(v), MaxRecordIDBytes, warden.ErrInvalidArgument)
		case !utf8.ValidString(v):
			return nil, fmt.Errorf("mysql: record id %.40q is not valid UTF-8: %w", v, warden.ErrInvalidArgument)
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
			return nil, fmt.Errorf("mysql: record id %d exceeds the BIGINT range: %w", v, warden.ErrInvalidArgument)
		}
		return int64(v), nil
	case uint64:
		if v > math.MaxInt64 {
			return nil, fmt.Errorf("mysql: record id %d exceeds the BIGINT range: %w", v, warden.ErrInvalidArgument)
		}
		return int64(v), nil
	}
	return nil, fmt.Errorf("mysql: record id of type %T: ids are integers or strings: %w", id, warden.ErrInvalidArgument)
}

func (t *RecordTable) kindOK(k idKind, v any) error {
	_, isInt := v.(int64)
	switch {
	case k == kindInt && !isInt:
		return fmt.Errorf("mysql: record id %.40q: the id column %s of %s is an integer column: ids are integers (MySQL would convert the string to a number): %w",
			v, qi(t.idCol), qi(t.table), warden.ErrInvalidArgument)
	case k == kindString && isInt:
		return fmt.Errorf("mysql: record id %d: the id column %s of %s is a string column: ids are strings (MySQL would convert every row's id to a number): %w",
			v, qi(t.idCol), qi(t.table), warden.ErrInvalidArgument)
	}
	return nil
}

// bind checks id (and, on first use, the table) and returns it as bound.
func (t *RecordTable) bind(ctx context.Context, id any) (any, error) {
	v, err := bindRecordID(id)
	if err != nil {
		return nil, err
	}
	if err := t.check(ctx); err != nil {
		return nil, err
	}
	if err := t.kindOK(t.kind, v); err != nil {
		return nil, err
	}
	return v, nil
}

// rawState is a record's lock columns as stored.
type rawState struct {
	id    any
	owner sql.NullString
	until sql.NullInt64 // ms
	token sql.NullInt64
	now   int64 // ms
}

func (s rawState) rec() driver.RecordLock {
	r := driver.RecordLock{ID: s.id, Owner: s.owner.String, Token: s.token.Int64, Now: time.UnixMilli(s.now).UTC()}
	if s.until.Valid {
		r.Until = time.UnixMilli(s.until.Int64).UTC()
	}
	return r
}

func (s rawState) live() bool {
	return s.owner.String != "" && s.until.Valid && s.until.Int64 > s.now
}

func (t *RecordTable) scanState(r rowScanner) (rawState, error) {
	var s rawState
	var idInt int64
	var idStr []byte
	dest := any(&idStr)
	if t.kind == kindInt {
		dest = &idInt
	}
	if err := r.Scan(dest, &s.owner, &s.until, &s.token, &s.now); err != nil {
		return s, err
	}
	if t.kind == kindInt {
		s.id = idInt
	} else {
		s.id = string(idStr)
	}
	return s, nil
}

// state reads record id's lock columns: one SELECT.
func (t *RecordTable) state(ctx context.Context, id any) (rawState, bool, error) {
	var s rawState
	err := t.retry(ctx, "read", func() error {
		var err error
		s, err = t.scanState(t.db.QueryRowContext(ctx, t.qState, id))
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return s, false, nil
	}
	if err != nil {
		return s, false, t.fail(ctx, "read", err)
	}
	return s, true, nil
}

// Lock implements driver.Records: a SELECT of the record (missing or
// locked: done, one round trip), then an UPDATE conditional on the token
// read and the record still free, which sets holder, expiry (the
// database's clock + d) and token + 1. If the record changed in between,
// it starts over.
func (t *RecordTable) Lock(ctx context.Context, id any, owner string, d time.Duration) (driver.RecordLock, bool, bool, error) {
	v, err := t.bind(ctx, id)
	if err != nil {
		return driver.RecordLock{}, false, false, err
	}
	for range recordAttempts {
		s, found, err := t.state(ctx, v)
		if err != nil || !found {
			return driver.RecordLock{}, false, false, err
		}
		if s.live() {
			return s.rec(), true, false, nil
		}
		if err := t.tokenLimit(s.id, s.token.Int64); err != nil {
			return driver.RecordLock{}, false, false, t.fail(ctx, "lock", err)
		}
		token := s.token.Int64 + 1
		var until int64
		err = t.retry(ctx, "lock", func() error {
			res, err := t.db.ExecContext(ctx, t.qLock, owner, driver.Millis(d), token, v, s.token)
			if err != nil {
				return err
			}
			until, err = res.LastInsertId()
			return err
		})
		if err != nil {
			return driver.RecordLock{}, false, false, t.fail(ctx, "lock", err)
		}
		if until > 0 {
			return driver.RecordLock{ID: s.id, Owner: owner, Token: token, Until: time.UnixMilli(until).UTC(),
				Now: time.UnixMilli(until - driver.Millis(d)).UTC()}, true, true, nil
		}
	}
	return driver.RecordLock{}, false, false, t.gaveUp("lock")
}

// Extend implements driver.Records: one conditional UPDATE; if refused,
// one SELECT of the record's state.
func (t *RecordTable) Extend(ctx context.Context, id any, owner string, token int64, d time.Duration) (driver.RecordLock, bool, bool, error) {
	v, err := t.bind(ctx, id)
	if err != nil {
		return driver.RecordLock{}, false, false, err
	}
	var until int64
	err = t.retry(ctx, "extend", func() error {
		res, err := t.db.ExecContext(ctx, t.qExtend, driver.Millis(d), v, owner, token)
		if err != nil {
			return err
		}
		until, err = res.LastInsertId()
		return err
	})
	if err != nil {
		return driver.RecordLock{}, false, false, t.fail(ctx, "extend", err)
	}
	if until > 0 {
		return driver.RecordLock{ID: v, Owner: owner, Token: token, Until: time.UnixMilli(until).UTC(),
			Now: time.UnixMilli(until - driver.Millis(d)).UTC()}, true, true, nil
	}
	s, found, err := t.state(ctx, v)
	if err != nil || !found {
		return driver.RecordLock{}, false, false, err
	}
	return s.rec(), true, false, nil
}

// Release implements driver.Records: one UPDATE.
func (t *RecordTable) Release(ctx context.Context, id any, owner string, token int64) (bool, error) {
	v, err := t.bind(ctx, id)
	if err != nil {
		return false, err
	}
	var n int64
	err = t.retry(ctx, "release", func() error {
		res, err := t.db.ExecContext(ctx, t.qRelease, v, owner, token)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return false, t.fail(ctx, "release", err)
	}
	// The update sets the holder from a value to NULL, so a match is a
	// change under either affected-rows flavour.
	return n > 0, nil
}

// ForceRelease implements driver.Records: a SELECT, then an UPDATE that
// clears holder and expiry only if holder and token are still those read
// (repeated if they changed in between).
func (t *RecordTable) ForceRelease(ctx context.Context, id any) (driver.RecordLock, bool, error) {
	v, err := t.bind(ctx, id)
	if err != nil {
		return driver.RecordLock{}, false, err
	}
	for range recordAttempts {
		s, found, err := t.state(ctx, v)
		if err != nil || !found {
			return driver.RecordLock{}, false, err
		}
		if !s.owner.Valid && !s.until.Valid {
			return s.rec(), true, nil
		}
		var n int64
		err = t.retry(ctx, "force release", func() error {
			res, err := t.db.ExecContext(ctx, t.qForce, v, s.owner, s.token)
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
			return s.rec(), true, nil
		}
	}
	return driver.RecordLock{}, false, t.gaveUp("force release")
}

// Get implements driver.Records: one SELECT.
func (t *RecordTable) Get(ctx context.Context, id any) (driver.RecordLock, bool, error) {
	v, err := t.bind(ctx, id)
	if err != nil {
		return driver.RecordLock{}, false, err
	}
	s, found, err := t.state(ctx, v)
	if err != nil || !found {
		return driver.RecordLock{}, false, err
	}
	return s.rec(), true, nil
}

// Claim implements driver.Records with one READ COMMITTED transaction:
//
//	SELECT id, token, now FROM t WHERE (<filter.Where>) AND expiry IS NULL
//	  ORDER BY <filter.OrderBy> LIMIT 1 FOR UPDATE SKIP LOCKED
//	SELECT id, token, now FROM t WHERE (<filter.Where>) AND expiry <= UTC_TIMESTAMP(3)
//	  ORDER BY <filter.OrderBy> LIMIT 1 FOR UPDATE SKIP LOCKED
//	SELECT id, token, now FROM t FORCE INDEX (holder, expiry) WHERE (<filter.Where>)
//	  AND (holder IS NULL OR holder = '') AND expiry > UTC_TIMESTAMP(3)
//	  ORDER BY <filter.OrderBy> LIMIT 1 FOR UPDATE SKIP LOCKED
//	SELECT id FROM t WHERE id IN (?, …) ORDER BY <filter.OrderBy> LIMIT 1   -- only if two or three found one
//	UPDATE t SET holder = ?, expiry = now + d, token = token + 1 WHERE id = ?
//	COMMIT
//
// The first record without an expiry and the first lapsed one are found
// through the (expiry, id) index (or the program's index that starts with
// its filter's columns and the expiry), and the first whose holder another
// program cleared (NULL or the empty string) while leaving an expiry
// ahead through the (holder(1), expiry) index, whose two ranges hold only
// such rows — so a claim does not read the records others hold; the first
// of them in the filter's order is taken. A table without the second
// index (migrated before it existed) has no third search: such a row
// waits for its expiry to pass. The locking reads skip rows other claims are taking (SKIP
// LOCKED) and hold the ones they return until COMMIT, so no other claim
// or Lock can take them in between; READ COMMITTED takes no gap locks.
// The expiry is the database's clock read by the SELECT plus d. A
// transaction InnoDB rolls back (deadlock, lock wait timeout) is
// repeated, up to 20 times. filter.Where uses ? placeholders bound to
// filter.Args, exactly as many, none of which may be a sql.NamedArg, and
// OrderBy none (see checkFilter); "" matches every record.
// filter.OrderBy "" orders by the id column.
func (t *RecordTable) Claim(ctx context.Context, filter recordlock.SQL, owner string, d time.Duration) (driver.RecordLock, bool, error) {
	if err := checkFilter(filter); err != nil {
		return driver.RecordLock{}, false, err
	}
	if err := t.check(ctx); err != nil {
		return driver.RecordLock{}, false, err
	}
	where := filter.Where
	if strings.TrimSpace(where) == "" {
		where = "TRUE"
	}
	order := filter.OrderBy
	if strings.TrimSpace(order) == "" {
		order = qi(t.idCol)
	}
	qs := []string{
		t.qClaimHead + where + fmt.Sprintf(t.qClaimFree, order),
		t.qClaimHead + where + fmt.Sprintf(t.qClaimLapsed, order),
	}
	t.checkMu.Lock()
	if t.clearedIdx != "" {
		qs = append(qs, t.qClaimHeadCleared+where+fmt.Sprintf(t.qClaimCleared, order))
	}
	t.checkMu.Unlock()
	var rec driver.RecordLock
	var claimed bool
	claim := func() error {
		claimed = false
		tx, err := t.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return err
		}
		defer tx.Rollback()
		var cands []claimCandidate
		for i, q := range qs {
			c, ok, err := t.candidate(ctx, tx, q, filter.Args)
			if err != nil {
				var me *mysqldrv.MySQLError
				if i == 2 && errors.As(err, &me) && me.Number == 1176 {
					// The (holder, expiry) index was dropped since the
					// table was checked: go on without the third search.
					t.checkMu.Lock()
					t.clearedIdx = ""
					t.checkMu.Unlock()
					qs = qs[:2]
					return errClaimAgain
				}
				return err
			}
			if ok {
				cands = append(cands, c)
			}
		}
		var c claimCandidate
		switch len(cands) {
		case 0:
			return tx.Commit()
		case 1:
			c = cands[0]
		default:
			ids := make([]any, len(cands))
			for i, c := range cands {
				ids[i] = c.id
			}
			var first []byte
			q := fmt.Sprintf(t.qClaimPick, strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", "), order)
			if err := tx.QueryRowContext(ctx, q, ids...).Scan(&first); err != nil {
				return err
			}
			c = cands[0]
			for _, cand := range cands {
				if string(first) == fmt.Sprint(cand.id) {
					c = cand
				}
			}
		}
		if err := t.tokenLimit(c.id, c.token.Int64); err != nil {
			return err // rolled back: nothing written
		}
		until := c.now + driver.Millis(d)
		res, err := tx.ExecContext(ctx, t.qUpdateClaimed, owner, until, c.token.Int64+1, c.id)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("mysql: claim: the update of the record read matched %d rows (%v)", n, err)
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		rec = driver.RecordLock{ID: c.id, Owner: owner, Token: c.token.Int64 + 1, Until: time.UnixMilli(until).UTC(), Now: time.UnixMilli(c.now).UTC()}
		claimed = true
		return nil
	}
	err := t.retry(ctx, "claim", claim)
	if errors.Is(err, errClaimAgain) { // at most once: qs has two searches now
		err = t.retry(ctx, "claim", claim)
	}
	if err != nil {
		return driver.RecordLock{}, false, t.fail(ctx, "claim", err)
	}
	return rec, claimed, nil
}

// errClaimAgain is Claim's signal to run its transaction again, without
// the third search, whose index was dropped.
var errClaimAgain = errors.New("mysql: claim: the (holder, expiry) index is gone")

// tokenLimit refuses, before anything is written, a record whose token
// is the largest value of the token column's type: the next token would
// not fit (Go's int64 would wrap to a negative token; an INT column would
// refuse it in strict mode and clamp it otherwise, so that two holdings
// would share a token).
func (t *RecordTable) tokenLimit(id any, token int64) error {
	if token < t.tokLimit {
		return nil
	}
	return fmt.Errorf("record %v: its token column %s holds %d, the largest value of its type (%s): no greater fencing token can be issued, so the record cannot be locked until the column is reset or widened (nothing was written)",
		id, qi(t.tokCol), token, t.tokType)
}

// checkFilter refuses, before any I/O and with an error wrapping
// warden.ErrInvalidArgument, a Claim filter whose placeholders the
// server, go-sql-driver and Args would not agree on: Where must hold
// exactly len(Args) ?, read as the server reads them (mysqlParams),
// OrderBy none (it is also placed in the statement that orders two
// candidates by their ids), and no Arg may be a sql.NamedArg (the driver
// has no named parameters).
func checkFilter(f recordlock.SQL) error { return filterRules.Check(f) }

// filterRules is how the store reads a Claim filter (see checkFilter).
var filterRules = sqlfilter.Store{
	Name:       "mysql",
	Count:      mysqlParams,
	OrderByWhy: "it is also placed in the statement that orders two candidates by id",
	CountWhy:   "an extra ? would bind one of the driver's own parameters",
	NamedWhy:   "go-sql-driver has no named parameters",
}

// mysqlParams counts the ? placeholders of an SQL fragment of the
// program's as MySQL and MariaDB read it: string literals '…' and "…"
// (a quote doubled inside, a backslash escaping the next character) and
// `…` names (a backquote doubled), comments (# and "-- " to the end of
// the line, /* … */) are passed over. The count must not depend on what
// the server cannot be asked ahead: a backslash whose reading changes it
// (NO_BACKSLASH_ESCAPES makes it a plain character in literals, and
// ANSI_QUOTES makes "…" a name, in which it is one too) is refused, and
// so are executable comments /*! … */ and /*M! … */, whose text runs as
// SQL on some servers and versions. So are the two corners where
// go-sql-driver's interpolateParams, which substitutes ? in the client
// by its own reading, reads otherwise than the server — "/*/", which it
// takes for a whole comment, and -- before a control character other than
// a tab or a line break, which it does not take for a comment — since a
// value it put where the server reads a comment could close the comment
// and run as SQL. A fragment that ends inside a literal, a name or a /*
// comment is refused, and, unless lineComment, one that ends in a # or --
// comment (Where stands on lines of its own, OrderBy does not).
func mysqlParams(s string, lineComment bool) (int, error) {
	n, err := mysqlParamsAs(s, lineComment, true)
	n2, err2 := mysqlParamsAs(s, lineComment, false)
	switch {
	case err != nil:
		return 0, err
	case err2 != nil || n != n2:
		return 0, errors.New("a backslash in a literal changes where the literal ends with the session's sql_mode (NO_BACKSLASH_ESCAPES, ANSI_QUOTES): pass the value as an Arg")
	}
	return n, nil
}

// mysqlParamsAs is mysqlParams with backslashes read as escapes in
// literals or not.
func mysqlParamsAs(s string, lineComment, backslash bool) (int, error) {
	n := 0
	for i := 0; i < len(s); {
		switch c := s[i]; {
		case c == '\'' || c == '"' || c == '`':
			j := i + 1
			for {
				if j >= len(s) {
					what := "string literal"
					if c == '`' {
						what = "quoted name"
					}
					return 0, fmt.Errorf("unterminated %s at byte %d", what, i)
				}
				switch {
				case s[j] == '\\' && backslash && c != '`':
					j += 2
					continue
				case s[j] == c && j+1 < len(s) && s[j+1] == c: // doubled
					j += 2
					continue
				case s[j] == c:
				default:
					j++
					continue
				}
				break
			}
			i = j + 1
		case c == '#' || c == '-' && strings.HasPrefix(s[i:], "--") && (i+2 == len(s) || s[i+2] <= ' ' || s[i+2] == 0x7f):
			if c == '-' && i+2 < len(s) && s[i+2] != ' ' && s[i+2] != '\t' && s[i+2] != '\n' && s[i+2] != '\r' {
				return 0, fmt.Errorf("-- before the control character %q at byte %d: go-sql-driver's interpolateParams would not read it as a comment", s[i+2], i)
			}
			k := strings.IndexByte(s[i:], '\n')
			if k < 0 {
				if !lineComment {
					return 0, fmt.Errorf("a comment at byte %d runs to the end, over the statement's text after it", i)
				}
				return n, nil
			}
			i += k + 1
		case c == '/' && strings.HasPrefix(s[i:], "/*"):
			switch rest := s[i+2:]; {
			case strings.HasPrefix(rest, "!"), strings.HasPrefix(rest, "M!"):
				return 0, fmt.Errorf("executable comment at byte %d: its text runs as SQL on some servers and versions", i)
			case strings.HasPrefix(rest, "/"):
				return 0, fmt.Errorf("a comment opening /*/ at byte %d: go-sql-driver's interpolateParams would read it as a whole comment", i)
			}
			k := strings.Index(s[i+2:], "*/")
			if k < 0 {
				return 0, fmt.Errorf("unterminated /* comment at byte %d", i)
			}
			i += k + 4
		case c == '?':
			n++
			i++
		default:
			i++
		}
	}
	return n, nil
}

// claimCandidate is a record a claim's locking read returned.
type claimCandidate struct {
	id    any
	token sql.NullInt64
	now   int64
}

// candidate runs one of Claim's locking reads.
func (t *RecordTable) candidate(ctx context.Context, tx *sql.Tx, q string, args []any) (claimCandidate, bool, error) {
	var c claimCandidate
	var idInt int64
	var idStr []byte
	dest := any(&idStr)
	if t.kind == kindInt {
		dest = &idInt
	}
	err := tx.QueryRowContext(ctx, q, args...).Scan(dest, &c.token, &c.now)
	if errors.Is(err, sql.ErrNoRows) {
		return c, false, nil
	}
	if err != nil {
		return c, false, skipLockedHint(err)
	}
	c.id = idInt
	if t.kind != kindInt {
		c.id = string(idStr)
	}
	return c, true, nil
}

// skipLockedHint adds to a syntax error that the server may not know
// SKIP LOCKED.
func skipLockedHint(err error) error {
	var me *mysqldrv.MySQLError
	if errors.As(err, &me) && me.Number == 1064 {
		return fmt.Errorf("%w (Claim uses FOR UPDATE SKIP LOCKED: MySQL 8.0 or MariaDB 10.6 and later; or the filter is not valid SQL)", err)
	}
	return err
}

// List implements driver.Records: one SELECT of the live holdings (the
// expiry index finds them), in id order.
func (t *RecordTable) List(ctx context.Context, limit int) ([]driver.RecordLock, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("mysql: List limit %d: want > 0: %w", limit, warden.ErrInvalidArgument)
	}
	if err := t.check(ctx); err != nil {
		return nil, err
	}
	var out []driver.RecordLock
	err := t.retry(ctx, "list", func() error {
		out = out[:0]
		rows, err := t.db.QueryContext(ctx, t.qList, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			s, err := t.scanState(rows)
			if err != nil {
				return err
			}
			out = append(out, s.rec())
		}
		return rows.Err()
	})
	if err != nil {
		return nil, t.fail(ctx, "list", err)
	}
	return out, nil
}

// Migration returns the statement Migrate runs on a table without the
// lock columns, for programs that migrate by hand: one ALTER TABLE adding
// three NULL columns (MariaDB 10.3+ and MySQL 8.0 add them in place
// without copying the table), an index on (expiry, id) and one on
// (holder(1), expiry). Claim finds, through the first, the first record
// without an expiry in id order and the first lapsed one, and through the
// second the first whose holder another program cleared (NULL or the
// empty string: a one-character prefix tells them from every holder
// warden writes) while leaving an expiry ahead, so it does not read the
// records others hold; List finds the live holdings through the first. For a Claim filter and order of your
// own, add an index on the filter's columns, then the expiry, then the
// order's — for "status = ? ORDER BY priority, id": (status, locked_until,
// priority, id).
func (t *RecordTable) Migration() string {
	parts := t.migrationParts()
	return "ALTER TABLE " + qi(t.table) + " " + strings.Join(parts[:], ", ")
}

func (t *RecordTable) migrationParts() [5]string {
	return [5]string{
		"ADD COLUMN " + qi(t.untilCol) + " DATETIME(3) NULL",
		"ADD COLUMN " + qi(t.ownCol) + " VARCHAR(600) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
		"ADD COLUMN " + qi(t.tokCol) + " BIGINT NULL",
		"ADD INDEX " + qi(t.indexName) + " (" + qi(t.untilCol) + ", " + qi(t.idCol) + ")",
		"ADD INDEX " + qi(t.clearedName) + " (" + qi(t.ownCol) + "(1), " + qi(t.untilCol) + ")",
	}
}

// Migrate adds the lock columns and the indexes the table lacks (see
// Migration), in one ALTER TABLE; it is idempotent and safe to run from
// several processes at once. Other columns and rows are left as
// they are.
func (t *RecordTable) Migrate(ctx context.Context) error {
	parts := t.migrationParts()
	for attempt := 0; ; attempt++ {
		cols, err := t.columns(ctx)
		if err != nil {
			return t.fail(ctx, "migrate", err)
		}
		if len(cols) == 0 {
			return fmt.Errorf("mysql: migrate: no table %s in the current database", qi(t.table))
		}
		var todo []string
		for i, c := range []string{t.untilCol, t.ownCol, t.tokCol} {
			if _, ok := cols[strings.ToLower(c)]; !ok {
				todo = append(todo, parts[i])
			}
		}
		var indexed int
		err = t.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.STATISTICS a
JOIN information_schema.STATISTICS b ON b.TABLE_SCHEMA = a.TABLE_SCHEMA AND b.TABLE_NAME = a.TABLE_NAME AND b.INDEX_NAME = a.INDEX_NAME
WHERE a.TABLE_SCHEMA = DATABASE() AND a.TABLE_NAME = ? AND a.SEQ_IN_INDEX = 1 AND b.SEQ_IN_INDEX = 2
AND LOWER(a.COLUMN_NAME) = LOWER(?) AND LOWER(b.COLUMN_NAME) = LOWER(?)`, t.table, t.untilCol, t.idCol).Scan(&indexed)
		if err != nil {
			return t.fail(ctx, "migrate", err)
		}
		if indexed == 0 {
			todo = append(todo, parts[3])
		}
		cleared, err := t.clearedIndex(ctx)
		if err != nil {
			return t.fail(ctx, "migrate", err)
		}
		if cleared == "" {
			todo = append(todo, parts[4])
		}
		if len(todo) == 0 {
			t.migrated(cleared)
			return nil
		}
		_, err = t.db.ExecContext(ctx, "ALTER TABLE "+qi(t.table)+" "+strings.Join(todo, ", "))
		var me *mysqldrv.MySQLError
		// 1060 duplicate column, 1061 duplicate key name: another process
		// migrated meanwhile.
		if errors.As(err, &me) && (me.Number == 1060 || me.Number == 1061) && attempt < 3 {
			continue
		}
		if err == nil && cleared == "" {
			t.migrated(t.clearedName)
		}
		return t.fail(ctx, "migrate", err)
	}
}

// migrated lets Claim use the (holder, expiry) index name from now on,
// if the table was checked without one.
func (t *RecordTable) migrated(name string) {
	t.checkMu.Lock()
	defer t.checkMu.Unlock()
	if t.checked && t.clearedIdx == "" {
		t.clearedIdx = name
		t.qClaimHeadCleared, t.qClaimCleared = t.claimCleared()
	}
}

// clearedIndex returns the name of an index of the table that starts with
// the holder and the expiry (Migration's, or the program's), or "".
func (t *RecordTable) clearedIndex(ctx context.Context) (string, error) {
	var name sql.NullString
	err := t.db.QueryRowContext(ctx, `SELECT MIN(a.INDEX_NAME) FROM information_schema.STATISTICS a
JOIN information_schema.STATISTICS b ON b.TABLE_SCHEMA = a.TABLE_SCHEMA AND b.TABLE_NAME = a.TABLE_NAME AND b.INDEX_NAME = a.INDEX_NAME
WHERE a.TABLE_SCHEMA = DATABASE() AND a.TABLE_NAME = ? AND a.SEQ_IN_INDEX = 1 AND b.SEQ_IN_INDEX = 2
AND LOWER(a.COLUMN_NAME) = LOWER(?) AND LOWER(b.COLUMN_NAME) = LOWER(?)`, t.table, t.ownCol, t.untilCol).Scan(&name)
	return name.String, err
}

// recordCol is a column of the table, as information_schema describes it.
type recordCol struct {
	name      string
	dataType  string
	precision sql.NullInt64
	extra     string
	colType   string // COLUMN_TYPE: "bigint(20) unsigned"
}

func (t *RecordTable) columns(ctx context.Context) (map[string]recordCol, error) {
	rows, err := t.db.QueryContext(ctx, `SELECT COLUMN_NAME, DATA_TYPE, DATETIME_PRECISION, EXTRA, COLUMN_TYPE FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`, t.table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]recordCol{}
	for rows.Next() {
		var name, typ, extra, colType []byte
		var c recordCol
		if err := rows.Scan(&name, &typ, &c.precision, &extra, &colType); err != nil {
			return nil, err
		}
		c.name, c.dataType, c.extra = string(name), strings.ToLower(string(typ)), strings.ToLower(string(extra))
		c.colType = strings.ToLower(string(colType))
		out[strings.ToLower(string(name))] = c
	}
	return out, rows.Err()
}

// check verifies, once, that the table has the lock columns with the
// types the statements need, and that the id column is an integer or
// string column with a unique index of its own (the primary key or
// another); it learns the id's kind and the columns MySQL updates by
// itself, and writes the statements.
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
		return fmt.Errorf("mysql: records: no table %s in the current database", qi(t.table))
	}
	id, ok := cols[strings.ToLower(t.idCol)]
	if !ok {
		return fmt.Errorf("mysql: records: table %s has no id column %s", qi(t.table), qi(t.idCol))
	}
	var kind idKind
	switch id.dataType {
	case "tinyint", "smallint", "mediumint", "int", "integer", "bigint":
		kind = kindInt
	case "char", "varchar", "binary", "varbinary":
		kind = kindString
	default:
		return fmt.Errorf("mysql: records: the id column %s of %s is %s: ids must be an integer or CHAR/VARCHAR/BINARY/VARBINARY column", qi(t.idCol), qi(t.table), id.dataType)
	}
	var missing []string
	for _, c := range []string{t.untilCol, t.ownCol, t.tokCol} {
		if _, ok := cols[strings.ToLower(c)]; !ok {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("mysql: records: table %s lacks the lock columns %s: run RecordTable.Migrate, or the statement of Migration", qi(t.table), strings.Join(missing, ", "))
	}
	if u := cols[strings.ToLower(t.untilCol)]; u.dataType != "datetime" || u.precision.Int64 < 3 {
		return fmt.Errorf("mysql: records: the expiry column %s of %s is %s(%d): it must be DATETIME(3) (a TIMESTAMP would be converted by the session's time zone)", qi(t.untilCol), qi(t.table), u.dataType, u.precision.Int64)
	}
	tok := cols[strings.ToLower(t.tokCol)]
	unsigned := strings.Contains(tok.colType, "unsigned")
	switch tok.dataType {
	case "int", "integer":
		t.tokLimit, t.tokType = math.MaxInt32, "INT"
		if unsigned {
			t.tokLimit, t.tokType = math.MaxUint32, "INT UNSIGNED"
		}
	case "bigint":
		t.tokLimit, t.tokType = math.MaxInt64, "BIGINT" // BIGINT UNSIGNED too: the token is an int64
	default:
		return fmt.Errorf("mysql: records: the token column %s of %s is %s: it must be BIGINT", qi(t.tokCol), qi(t.table), tok.dataType)
	}
	var unique int
	err = t.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM (SELECT INDEX_NAME FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND NON_UNIQUE = 0
GROUP BY INDEX_NAME HAVING COUNT(*) = 1 AND MAX(LOWER(COLUMN_NAME)) = LOWER(?) AND MAX(SUB_PART) IS NULL) AS u`, t.table, t.idCol).Scan(&unique)
	if err != nil {
		return t.fail(ctx, "reading the table's indexes", err)
	}
	if unique == 0 {
		return fmt.Errorf("mysql: records: the id column %s of %s is not unique: make it the primary key or give it a unique index of its own", qi(t.idCol), qi(t.table))
	}
	var keep []string
	for _, c := range cols {
		if strings.Contains(c.extra, "on update") && !slices.Contains([]string{strings.ToLower(t.untilCol), strings.ToLower(t.ownCol), strings.ToLower(t.tokCol)}, strings.ToLower(c.name)) {
			keep = append(keep, c.name)
		}
	}
	slices.Sort(keep)
	t.clearedIdx, err = t.clearedIndex(ctx)
	if err != nil {
		return t.fail(ctx, "reading the table's indexes", err)
	}
	t.buildQueries(keep)
	t.kind = kind
	t.checked = true
	return nil
}

// retry runs f, repeating it when InnoDB rolled it back (deadlock, lock
// wait timeout), at most recordDeadlocks times.
func (t *RecordTable) retry(ctx context.Context, op string, f func() error) error {
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil || !retryable(err) || ctx.Err() != nil {
			return err
		}
		if attempt >= recordDeadlocks {
			return fmt.Errorf("gave up after %d deadlocks or lock wait timeouts: %w", attempt, err)
		}
		tm := time.NewTimer(time.Duration(1+rand.N(attempt)) * time.Millisecond)
		select {
		case <-ctx.Done():
			tm.Stop()
			return ctx.Err()
		case <-tm.C:
		}
	}
}

// gaveUp is the error of a loop that reached recordAttempts.
func (t *RecordTable) gaveUp(op string) error {
	return fmt.Errorf("mysql: %s on %s: gave up after %d attempts: the record kept changing between the statements", op, qi(t.table), recordAttempts)
}

// fail wraps err, or returns ctx's error when ctx ended.
func (t *RecordTable) fail(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if e := ctxErr(ctx, err); e != err {
		return e
	}
	return fmt.Errorf("mysql: %s on %s: %w", op, qi(t.table), err)
}
