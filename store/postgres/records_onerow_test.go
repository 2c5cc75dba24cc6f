package postgres_test

import (
	"context"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/drivertest"
	"github.com/warden-go/warden/recordlock"
	"github.com/warden-go/warden/store/postgres"
)

// The tests of this file hold a record lock to naming one row, whatever
// the table became after the driver first read it: an adversarial review
// locked two rows with one Lock, and gave one record to two holders,
// through tables whose id column had stopped being unique.

const rlLockCols = `, locked_until timestamptz(3), locked_by text, lock_token bigint`

// rawTables makes tables named after the test (name_1, name_2 … in the
// order of stmts' %[n]s) and drops them, children first, when it ends.
func rawTables(t *testing.T, n int, stmts string) (*pgxpool.Pool, []string) {
	t.Helper()
	drivertest.ServerURL(t, "postgres", "WARDEN_TEST_POSTGRES_URL")
	pool, err := recordsPool()
	if err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("rlt_one_%d_%d", time.Now().UnixNano()%1e9, rltSeq.Add(1))
	var names []any
	var plain []string
	for i := range n {
		names = append(names, pgx.Identifier{fmt.Sprintf("%s_%d", base, i+1)}.Sanitize())
		plain = append(plain, fmt.Sprintf("%s_%d", base, i+1))
	}
	t.Cleanup(func() {
		for i := n - 1; i >= 0; i-- {
			_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+names[i].(string)+` CASCADE`)
		}
	})
	if _, err := pool.Exec(context.Background(), fmt.Sprintf(stmts, names...)); err != nil {
		t.Fatal(err)
	}
	return pool, plain
}

func oneRowLocker(t *testing.T, pool *pgxpool.Pool, table string) *recordlock.Locker[recordlock.SQL] {
	t.Helper()
	rt, err := postgres.Records(pool, table, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := recordlock.New(rt, &recordlock.Options{NoAutoExtend: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// wantSeveralRows checks that err says the id names several rows (or,
// once the driver read the table again, that its id column is not
// unique, or that the table has inheritance children).
func wantSeveralRows(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), "several rows have this id") && !strings.Contains(err.Error(), "neither the primary key nor alone in a unique index") &&
		!strings.Contains(err.Error(), "inheritance children") {
		t.Errorf("%s: %v, want an error saying several rows have the id", what, err)
	}
}

// TestRecordsInheritanceChildSharesID: a row with the id of a held record
// appears in an inheritance child (SELECT and UPDATE on the parent read
// the children too). Another Locker's Lock must not take it: that would
// be two holders of one record. Claim and Lock fail saying why, and write
// nothing.
//
// (A table that has inheritance children when the driver first reads it
// is refused outright: TestRecordsInheritanceParentRefused.)
func TestRecordsInheritanceChildSharesID(t *testing.T) {
	pool, tb := rawTables(t, 2, `CREATE TABLE %[1]s (id bigint PRIMARY KEY, status text NOT NULL DEFAULT 'todo'`+rlLockCols+`);
INSERT INTO %[1]s (id) VALUES (1)`)
	ctx := rlCtx(t)
	a, b := oneRowLocker(t, pool, tb[0]), oneRowLocker(t, pool, tb[0])
	held, err := a.Lock(ctx, 1, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Lock(ctx, 1, 5*time.Second); err == nil { // b reads the table now
		t.Fatal("b locked record 1 while a holds it")
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{tb[1]}.Sanitize()+` () INHERITS (`+pgx.Identifier{tb[0]}.Sanitize()+`);
INSERT INTO `+pgx.Identifier{tb[1]}.Sanitize()+` (id) VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if k, err := b.Lock(ctx, 1, 5*time.Second); err == nil {
		t.Errorf("a second Locker got record 1 (token %d) while token %d holds it", k.Token(), held.Token())
	} else {
		wantSeveralRows(t, "Lock", err)
	}
	_, err = b.Claim(ctx, recordlock.SQL{Where: "status = $1", Args: []any{"todo"}}, 5*time.Second)
	wantSeveralRows(t, "Claim", err)
	if n := rlCount(t, pool, tb[1], "locked_by IS NOT NULL"); n != 0 {
		t.Errorf("the child's row was locked")
	}
}

// TestRecordsUniqueDroppedAfterFirstUse: the table lost its primary key
// after the driver read it, and two rows now share an id. Lock, Claim
// and ForceRelease of that id change neither row.
func TestRecordsUniqueDroppedAfterFirstUse(t *testing.T) {
	pool, tb := rawTables(t, 1, `CREATE TABLE %[1]s (id bigint CONSTRAINT rlt_one_pk PRIMARY KEY, status text NOT NULL DEFAULT 'todo'`+rlLockCols+`);
INSERT INTO %[1]s (id) VALUES (1)`)
	ctx := rlCtx(t)
	l := oneRowLocker(t, pool, tb[0])
	k, err := l.Lock(ctx, 1, 5*time.Second) // the first call read the table
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Release(ctx); err != nil {
		t.Fatal(err)
	}
	q := pgx.Identifier{tb[0]}.Sanitize()
	if _, err := pool.Exec(ctx, `ALTER TABLE `+q+` DROP CONSTRAINT rlt_one_pk; DELETE FROM `+q+`; INSERT INTO `+q+` (id) VALUES (2), (2)`); err != nil {
		t.Fatal(err)
	}
	_, err = l.Lock(ctx, 2, 5*time.Second)
	wantSeveralRows(t, "Lock", err)
	_, err = l.Claim(ctx, recordlock.SQL{}, 5*time.Second)
	wantSeveralRows(t, "Claim", err)
	if n := rlCount(t, pool, tb[0], "locked_by IS NOT NULL OR lock_token IS NOT NULL"); n != 0 {
		t.Errorf("%d rows locked", n)
	}
	// An operator's forced release of one holding does not clear both.
	if _, err := pool.Exec(ctx, `UPDATE `+q+` SET locked_by = 'x', locked_until = now() + interval '1 hour', lock_token = 1`); err != nil {
		t.Fatal(err)
	}
	rt, err := postgres.Records(pool, tb[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _, _ = rt.ForceRelease(ctx, int64(2))
	if n := rlCount(t, pool, tb[0], "locked_by IS NOT NULL"); n != 2 {
		t.Errorf("ForceRelease of a shared id cleared %d of 2 holdings", 2-n)
	}
}

// TestRecordsUniqueIndexOtherCollation: the id column compares by a
// case-insensitive collation while its unique index uses "C": 'abc' and
// 'ABC' are two rows the index lets in but one id for the column's
// equality. Lock("abc") locks neither.
func TestRecordsUniqueIndexOtherCollation(t *testing.T) {
	drivertest.ServerURL(t, "postgres", "WARDEN_TEST_POSTGRES_URL")
	pool, err := recordsPool()
	if err != nil {
		t.Fatal(err)
	}
	ctx := rlCtx(t)
	coll := fmt.Sprintf("rlt_ci_%d", rltSeq.Add(1))
	if _, err := pool.Exec(ctx, `CREATE COLLATION `+coll+` (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`); err != nil {
		t.Skipf("the server has no ICU collations to build the case: %v", err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP COLLATION IF EXISTS `+coll) })
	_, tb := rawTables(t, 1, `CREATE TABLE %[1]s (id text COLLATE `+coll+` NOT NULL`+rlLockCols+`);
CREATE UNIQUE INDEX ON %[1]s (id COLLATE "C");
INSERT INTO %[1]s (id) VALUES ('abc'), ('ABC')`)
	l := oneRowLocker(t, pool, tb[0])
	_, err = l.Lock(ctx, "abc", 5*time.Second)
	wantSeveralRows(t, `Lock("abc")`, err)
	if n := rlCount(t, pool, tb[0], "locked_by IS NOT NULL"); n != 0 {
		t.Errorf("%d rows locked", n)
	}
}

// sneakyInt and sneakyText are ids of integer and string kinds whose pgx
// encoding methods answer another value than the one they hold.
type sneakyInt int64

func (sneakyInt) Int64Value() (pgtype.Int8, error) { return pgtype.Int8{Int64: 2, Valid: true}, nil }

type sneakyText string

func (sneakyText) TextValue() (pgtype.Text, error) { return pgtype.Text{String: "b", Valid: true}, nil }

// wrapSneaky is a Valuer whose Value is a sneakyInt.
type wrapSneaky int64

func (w wrapSneaky) Value() (sqldriver.Value, error) { return sneakyInt(w), nil }

// uuidByte is a byte type of the user's; [16]uuidByte is a uuid id.
type uuidByte uint8

// TestRecordsIDBoundAsItsValue: an id is bound as the value it holds, not
// as its type's pgx encoding methods answer: sneakyInt(1) locks row 1,
// sneakyText("a") row "a", and a Valuer whose Value is a sneakyInt the
// row of the value it holds. A [16] array of a byte type of the user's is
// a uuid (it panicked in the binding).
func TestRecordsIDBoundAsItsValue(t *testing.T) {
	pool, tb := rawTables(t, 2, `CREATE TABLE %[1]s (id bigint PRIMARY KEY`+rlLockCols+`);
INSERT INTO %[1]s (id) VALUES (1), (2);
CREATE TABLE %[2]s (id text PRIMARY KEY`+rlLockCols+`);
INSERT INTO %[2]s (id) VALUES ('a'), ('b')`)
	ctx := rlCtx(t)
	for _, c := range []struct {
		table    string
		id       any
		row, not any
	}{{tb[0], sneakyInt(1), int64(1), int64(2)}, {tb[1], sneakyText("a"), "a", "b"}, {tb[0], wrapSneaky(1), int64(1), int64(2)}} {
		l := oneRowLocker(t, pool, c.table)
		if _, err := l.Lock(ctx, c.id, 5*time.Second); err != nil {
			t.Fatalf("Lock(%#v): %v", c.id, err)
		}
		if n := rlCount(t, pool, c.table, "id = $1 AND locked_by IS NOT NULL", c.row); n != 1 {
			t.Errorf("Lock(%#v) did not lock row %v", c.id, c.row)
		}
		if n := rlCount(t, pool, c.table, "id = $1 AND locked_by IS NOT NULL", c.not); n != 0 {
			t.Errorf("Lock(%#v) locked row %v", c.id, c.not)
		}
		if _, err := pool.Exec(ctx, `UPDATE `+pgx.Identifier{c.table}.Sanitize()+` SET locked_by = NULL, locked_until = NULL`); err != nil {
			t.Fatal(err)
		}
	}
	_, ut := rawTables(t, 1, `CREATE TABLE %[1]s (id uuid PRIMARY KEY`+rlLockCols+`);
INSERT INTO %[1]s (id) VALUES ('01000000-0000-0000-0000-000000000000')`)
	if _, err := oneRowLocker(t, pool, ut[0]).Lock(ctx, [16]uuidByte{1}, 5*time.Second); err != nil {
		t.Errorf("Lock([16]uuidByte) on a uuid id: %v", err)
	}
}

// TestRecordsInheritanceParentRefused: a table with inheritance children
// (whose rows its statements read, outside its unique index) is refused
// on first use, even with no id shared yet; a partitioned table, whose
// unique index covers every partition, is not.
func TestRecordsInheritanceParentRefused(t *testing.T) {
	pool, tb := rawTables(t, 4, `CREATE TABLE %[1]s (id bigint PRIMARY KEY`+rlLockCols+`);
CREATE TABLE %[2]s () INHERITS (%[1]s);
INSERT INTO %[1]s (id) VALUES (1);
CREATE TABLE %[3]s (id bigint PRIMARY KEY`+rlLockCols+`) PARTITION BY RANGE (id);
CREATE TABLE %[4]s PARTITION OF %[3]s FOR VALUES FROM (0) TO (100);
INSERT INTO %[3]s (id) VALUES (1)`)
	ctx := rlCtx(t)
	_, err := oneRowLocker(t, pool, tb[0]).Lock(ctx, 1, 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "inheritance children") {
		t.Errorf("Lock on an inheritance parent: %v, want an error saying it has inheritance children", err)
	}
	if n := rlCount(t, pool, tb[0], "locked_by IS NOT NULL"); n != 0 {
		t.Errorf("%d rows locked", n)
	}
	if _, err := oneRowLocker(t, pool, tb[2]).Lock(ctx, 1, 5*time.Second); err != nil {
		t.Errorf("Lock on a partitioned table: %v", err)
	}
}

// TestRecordsIDColumnTypesRefused: id columns whose values the server
// rounds or cuts on comparison (float8: 2^53+1 is 2^53; name: 63 bytes)
// are refused on first use; a bytea id column takes []byte only (a
// string would be read as bytea's text form: "\\x41" is "A").
func TestRecordsIDColumnTypesRefused(t *testing.T) {
	pool, tb := rawTables(t, 3, `CREATE TABLE %[1]s (id float8 PRIMARY KEY`+rlLockCols+`);
INSERT INTO %[1]s (id) VALUES (9007199254740992);
CREATE TABLE %[2]s (id name PRIMARY KEY`+rlLockCols+`);
CREATE TABLE %[3]s (id bytea PRIMARY KEY`+rlLockCols+`);
INSERT INTO %[3]s (id) VALUES ('A')`)
	ctx := rlCtx(t)
	for _, c := range []struct {
		table string
		id    any
	}{{tb[0], int64(9007199254740993)}, {tb[1], "a"}} {
		_, err := oneRowLocker(t, pool, c.table).Lock(ctx, c.id, 5*time.Second)
		if err == nil || !strings.Contains(err.Error(), "rounds or cuts") {
			t.Errorf("Lock(%#v) on table %s: %v, want the id column refused", c.id, c.table, err)
		}
	}
	if n := rlCount(t, pool, tb[0], "locked_by IS NOT NULL"); n != 0 {
		t.Errorf("float8 table: %d rows locked", n)
	}
	l := oneRowLocker(t, pool, tb[2])
	if _, err := l.Lock(ctx, `\x41`, 5*time.Second); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Lock(string) on a bytea id: %v, want ErrInvalidArgument", err)
	}
	if n := rlCount(t, pool, tb[2], "locked_by IS NOT NULL"); n != 0 {
		t.Errorf("bytea table: %d rows locked by a string", n)
	}
	if _, err := l.Lock(ctx, []byte("A"), 5*time.Second); err != nil {
		t.Errorf("Lock([]byte) on a bytea id: %v", err)
	}
}

// flipValuer answers first with one value, then with another: the value
// judged must be the value bound. (Its later value, a slice of ints,
// panicked in the binding.)
type flipValuer struct {
	n     *int
	first sqldriver.Value
	later any
}

func (f flipValuer) Value() (sqldriver.Value, error) {
	*f.n++
	if *f.n == 1 {
		return f.first, nil
	}
	return f.later, nil
}

type panicValuer struct{}

func (panicValuer) Value() (sqldriver.Value, error) { panic("boom") }

// TestRecordsValuersCalledOnce: a Valuer is called once per call and
// that value judged and bound, so one that changes its answer cannot slip
// an unchecked value in (nor make the binding panic); a Claim argument
// whose Value panics is an error, not a panic.
func TestRecordsValuersCalledOnce(t *testing.T) {
	pool, tb := rawTables(t, 1, `CREATE TABLE %[1]s (id bytea PRIMARY KEY, s text`+rlLockCols+`);
INSERT INTO %[1]s (id, s) VALUES ('x', 'todo')`)
	ctx := rlCtx(t)
	rt, err := postgres.Records(pool, tb[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, later := range []any{[]int{1}, [3]int{1, 2, 3}, [16]string{}} {
		n := 0
		_, found, err := rt.Get(ctx, flipValuer{&n, []byte("x"), later})
		if err != nil || !found {
			t.Errorf("Get(a Valuer answering x, then %T): found %v, %v; want the row x", later, found, err)
		}
	}
	_, _, err = rt.Claim(ctx, recordlock.SQL{Where: "s = $1", Args: []any{panicValuer{}}}, "o", time.Second)
	if !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Claim with an Arg whose Value panics: %v, want ErrInvalidArgument", err)
	}
}

// TestRecordsDomainOverDomainRefused: a domain over a domain over float8
// is float8 for the refusal of lossy id types; one over int is accepted.
func TestRecordsDomainOverDomainRefused(t *testing.T) {
	drivertest.ServerURL(t, "postgres", "WARDEN_TEST_POSTGRES_URL")
	pool, err := recordsPool()
	if err != nil {
		t.Fatal(err)
	}
	ctx := rlCtx(t)
	d := fmt.Sprintf("rlt_dom_%d", rltSeq.Add(1))
	if _, err := pool.Exec(ctx, `CREATE DOMAIN `+d+`_f1 AS float8; CREATE DOMAIN `+d+`_f2 AS `+d+`_f1;
CREATE DOMAIN `+d+`_i1 AS bigint CHECK (VALUE > 0); CREATE DOMAIN `+d+`_i2 AS `+d+`_i1`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP DOMAIN IF EXISTS `+d+`_f2, `+d+`_f1, `+d+`_i2, `+d+`_i1 CASCADE`)
	})
	_, tb := rawTables(t, 2, `CREATE TABLE %[1]s (id `+d+`_f2 PRIMARY KEY`+rlLockCols+`);
INSERT INTO %[1]s (id) VALUES (9007199254740992);
CREATE TABLE %[2]s (id `+d+`_i2 PRIMARY KEY`+rlLockCols+`);
INSERT INTO %[2]s (id) VALUES (1)`)
	_, err = oneRowLocker(t, pool, tb[0]).Lock(ctx, int64(9007199254740993), 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "rounds or cuts") {
		t.Errorf("Lock on a domain over a domain over float8: %v, want the id column refused", err)
	}
	if _, err := oneRowLocker(t, pool, tb[1]).Lock(ctx, 1, 5*time.Second); err != nil {
		t.Errorf("Lock on a domain over a domain over bigint: %v", err)
	}
	if _, err := oneRowLocker(t, pool, tb[1]).Lock(ctx, "1", 5*time.Second); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf(`Lock("1") on a domain over a domain over bigint: %v, want ErrInvalidArgument`, err)
	}
}
