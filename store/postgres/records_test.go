package postgres_test

import (
	"context"
	sqldriver "database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/drivertest"
	"github.com/warden-go/warden/recordlock"
	"github.com/warden-go/warden/recordlock/recordlocktest"
	"github.com/warden-go/warden/store/postgres"
)

// The record-lock tests run on tables of their own (named rl_… by the
// suite, rlt_… here), dropped when each test ends.

var (
	recPoolOnce sync.Once
	recPool     *pgxpool.Pool
	recPoolErr  error
)

// recordsPool is the process's pool for the record-lock tests (also in
// the suite's child processes, hence from the environment, not a
// *testing.T).
func recordsPool() (*pgxpool.Pool, error) {
	recPoolOnce.Do(func() {
		u := os.Getenv("WARDEN_TEST_POSTGRES_URL")
		if u == "" {
			recPoolErr = errors.New("WARDEN_TEST_POSTGRES_URL is not set")
			return
		}
		cfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			recPoolErr = err
			return
		}
		cfg.MaxConns = 24
		recPool, recPoolErr = pgxpool.NewWithConfig(context.Background(), cfg)
	})
	return recPool, recPoolErr
}

// recordsHarness is the conformance harness over a user table whose id
// column has type idType ("text" or "bigint"): id, status, rank, note,
// the lock columns added by Migrate, and the partial index on (status,
// rank, id) WHERE locked_by IS NULL that the documentation tells a user
// to make for the filter it claims with.
func recordsHarness(idType string) recordlocktest.Harness[recordlock.SQL] {
	id := func(n int) any { return fmt.Sprintf("rec-%06d", n) }
	hostile := []any{"x' OR '1'='1", "rec-000001' OR '1'='1", "' OR TRUE --", "%", "rec-%", "rec-00000_", "*", ".*",
		"rec-000001 ", "REC-000001", `rec-000001\`, "rec-000001; DROP TABLE x", int64(1)}
	if idType == "bigint" {
		id = func(n int) any { return int64(n) }
		hostile = []any{"1 OR 1=1", "1; DROP TABLE x", "' OR TRUE --", "%", "*", int64(-1), int64(0), int64(math.MaxInt64)}
	}
	q := func(table string) string { return pgx.Identifier{table}.Sanitize() }
	return recordlocktest.Harness[recordlock.SQL]{
		Name: "postgres-" + idType,
		Create: func(ctx context.Context, table string, rows []recordlocktest.Row) error {
			pool, err := recordsPool()
			if err != nil {
				return err
			}
			if _, err := pool.Exec(ctx, `CREATE TABLE `+q(table)+` (id `+idType+` PRIMARY KEY, status text NOT NULL, rank integer NOT NULL, note text NOT NULL)`); err != nil {
				return err
			}
			src := make([][]any, len(rows))
			for i, r := range rows {
				src[i] = []any{id(r.N), r.Status, r.Rank, r.Note}
			}
			if _, err := pool.CopyFrom(ctx, pgx.Identifier{table}, []string{"id", "status", "rank", "note"}, pgx.CopyFromRows(src)); err != nil {
				return err
			}
			rt, err := postgres.Records(pool, table, nil)
			if err != nil {
				return err
			}
			if err := rt.Migrate(ctx); err != nil {
				return err
			}
			if _, err := pool.Exec(ctx, `CREATE INDEX ON `+q(table)+` (status, rank, id) WHERE locked_by IS NULL`); err != nil {
				return err
			}
			_, err = pool.Exec(ctx, `ANALYZE `+q(table))
			return err
		},
		Drop: func(ctx context.Context, table string) error {
			pool, err := recordsPool()
			if err != nil {
				return err
			}
			_, err = pool.Exec(ctx, `DROP TABLE IF EXISTS `+q(table))
			return err
		},
		Open: func(_ context.Context, table string) (driver.Records[recordlock.SQL], func(), error) {
			pool, err := recordsPool()
			if err != nil {
				return nil, nil, err
			}
			rt, err := postgres.Records(pool, table, nil)
			return rt, func() {}, err
		},
		ID: id,
		Read: func(ctx context.Context, table string, id any) (recordlocktest.Row, bool, error) {
			pool, err := recordsPool()
			if err != nil {
				return recordlocktest.Row{}, false, err
			}
			var r recordlocktest.Row
			err = pool.QueryRow(ctx, `SELECT status, rank, note FROM `+q(table)+` WHERE id = $1`, id).Scan(&r.Status, &r.Rank, &r.Note)
			if errors.Is(err, pgx.ErrNoRows) {
				return r, false, nil
			}
			return r, err == nil, err
		},
		SetNote: func(ctx context.Context, table string, id any, note string) error {
			pool, err := recordsPool()
			if err != nil {
				return err
			}
			_, err = pool.Exec(ctx, `UPDATE `+q(table)+` SET note = $2 WHERE id = $1`, id, note)
			return err
		},
		Count: func(ctx context.Context, table string) (int, error) {
			pool, err := recordsPool()
			if err != nil {
				return 0, err
			}
			var n int
			err = pool.QueryRow(ctx, `SELECT count(*) FROM `+q(table)).Scan(&n)
			return n, err
		},
		ByStatus: func(status string) recordlock.SQL {
			return recordlock.SQL{Where: "status = $1", Args: []any{status}, OrderBy: "rank, id"}
		},
		HostileIDs: hostile,
	}
}

// recordsIDTypeEnv tells the suite's child processes which harness the
// parent runs (they inherit the environment).
const recordsIDTypeEnv = "WARDEN_TEST_POSTGRES_RECORDS_ID"

// recordsChildHarness is the harness of TestMain's recordlocktest.Child.
func recordsChildHarness() recordlocktest.Harness[recordlock.SQL] {
	if os.Getenv(recordsIDTypeEnv) == "bigint" {
		return recordsHarness("bigint")
	}
	return recordsHarness("text")
}

// TestRecordsSuite runs recordlocktest's conformance suite over a text
// and a bigint id column.
func TestRecordsSuite(t *testing.T) {
	drivertest.ServerURL(t, "postgres", "WARDEN_TEST_POSTGRES_URL")
	t.Run("text", func(t *testing.T) {
		t.Setenv(recordsIDTypeEnv, "text")
		recordlocktest.Run(t, recordsHarness("text"))
	})
	t.Run("bigint", func(t *testing.T) {
		t.Setenv(recordsIDTypeEnv, "bigint")
		recordlocktest.Run(t, recordsHarness("bigint"))
	})
}

// ---------------------------------------------------------------------------
// Focused tests.

var rltSeq atomic.Int64

// rlTable creates a table (id idType primary key, status, rank, note)
// holding rows 1..n (status "todo", rank n−i+1, note "note i"), migrated
// by Records; it is dropped when the test ends.
func rlTable(t *testing.T, idType string, n int) (*pgxpool.Pool, *postgres.RecordTable, string) {
	t.Helper()
	drivertest.ServerURL(t, "postgres", "WARDEN_TEST_POSTGRES_URL")
	pool, err := recordsPool()
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("rlt_%d_%d", time.Now().UnixNano()%1e9, rltSeq.Add(1))
	h := recordsHarness(idType)
	ctx := context.Background()
	rows := make([]recordlocktest.Row, n)
	for i := range rows {
		rows[i] = recordlocktest.Row{N: i + 1, Status: "todo", Rank: n - i, Note: fmt.Sprintf("note %d", i+1)}
	}
	if err := h.Create(ctx, name, rows); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Drop(context.Background(), name); err != nil {
			t.Error(err)
		}
	})
	rt, err := postgres.Records(pool, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pool, rt, name
}

func rlCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// rlCount returns count(*) of table where cond.
func rlCount(t *testing.T, pool *pgxpool.Pool, table, cond string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()+` WHERE `+cond, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// userRows returns the user's columns of every row, as text, by id.
func userRows(t *testing.T, pool *pgxpool.Pool, table string) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id::text, format('%s|%s|%s', status, rank, note) FROM `+pgx.Identifier{table}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var v [2]string
		return v, r.Scan(&v[0], &v[1])
	})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, v := range out {
		m[v[0]] = v[1]
	}
	return m
}

// TestRecordsLockSemantics drives Lock, Extend, Release, ForceRelease
// and Get through their outcomes on one row.
func TestRecordsLockSemantics(t *testing.T) {
	pool, rt, name := rlTable(t, "text", 3)
	ctx := rlCtx(t)
	id := "rec-000002"
	const d = time.Minute

	rec, found, acquired, err := rt.Lock(ctx, id, "a", d)
	if err != nil || !found || !acquired {
		t.Fatalf("Lock: %+v, found %v, acquired %v, %v", rec, found, acquired, err)
	}
	if rec.ID != id || rec.Owner != "a" || rec.Token != 1 || !rec.Live() {
		t.Errorf("Lock: %+v; want id %q, owner a, token 1, live", rec, id)
	}
	// The expiry is the server clock of the statement plus d, to the ms.
	if rec.Until.Sub(rec.Now) != d || rec.Now.Truncate(time.Millisecond) != rec.Now || rec.Until.Location() != time.UTC {
		t.Errorf("Lock: until %v, now %v: want until = now + %v exactly, whole ms, UTC", rec.Until, rec.Now, d)
	}

	other, found, acquired, err := rt.Lock(ctx, id, "b", d)
	if err != nil || !found || acquired || other.Owner != "a" || other.Token != 1 || !other.Until.Equal(rec.Until) {
		t.Fatalf("Lock of a locked row: %+v, found %v, acquired %v, %v; want a's holding", other, found, acquired, err)
	}
	// The holder locking again is refused too: a lock is not reentrant.
	if _, _, acquired, err := rt.Lock(ctx, id, "a", d); err != nil || acquired {
		t.Errorf("Lock by the holder: acquired %v, %v; want refused", acquired, err)
	}

	for _, c := range []struct {
		owner string
		token int64
	}{{"b", 1}, {"a", 2}, {"a", 0}} {
		got, found, ok, err := rt.Extend(ctx, id, c.owner, c.token, 2*d)
		if err != nil || !found || ok || got.Owner != "a" || !got.Until.Equal(rec.Until) {
			t.Errorf("Extend(%s, %d): %+v, found %v, ok %v, %v; want refused, a's holding unchanged", c.owner, c.token, got, found, ok, err)
		}
	}
	ext, found, ok, err := rt.Extend(ctx, id, "a", 1, 2*d)
	if err != nil || !found || !ok || ext.Until.Sub(ext.Now) != 2*d || ext.Token != 1 || ext.Owner != "a" {
		t.Fatalf("Extend: %+v, found %v, ok %v, %v; want until = now + %v", ext, found, ok, err, 2*d)
	}

	for _, c := range []struct {
		owner string
		token int64
	}{{"b", 1}, {"a", 2}} {
		if ok, err := rt.Release(ctx, id, c.owner, c.token); err != nil || ok {
			t.Errorf("Release(%s, %d): %v, %v; want refused", c.owner, c.token, ok, err)
		}
	}
	if ok, err := rt.Release(ctx, id, "a", 1); err != nil || !ok {
		t.Fatalf("Release: %v, %v", ok, err)
	}
	if ok, err := rt.Release(ctx, id, "a", 1); err != nil || ok {
		t.Errorf("second Release: %v, %v; want refused", ok, err)
	}
	got, found, err := rt.Get(ctx, id)
	if err != nil || !found || got.Owner != "" || !got.Until.IsZero() || got.Token != 1 || got.Live() {
		t.Fatalf("Get after Release: %+v, %v, %v; want no holder, no expiry, token 1 kept", got, found, err)
	}
	if n := rlCount(t, pool, name, `locked_by IS NULL AND locked_until IS NULL AND lock_token = 1 AND id = $1`, id); n != 1 {
		t.Errorf("after Release the row's lock columns are not NULL, NULL, 1")
	}
	// Extend after Release: refused, even with the right owner and token.
	if _, _, ok, err := rt.Extend(ctx, id, "a", 1, d); err != nil || ok {
		t.Errorf("Extend after Release: %v, %v; want refused", ok, err)
	}

	// b locks; ForceRelease clears it and answers what it cleared.
	b, _, acquired, err := rt.Lock(ctx, id, "b", d)
	if err != nil || !acquired || b.Token != 2 {
		t.Fatalf("Lock after Release: %+v, %v, %v; want token 2", b, acquired, err)
	}
	was, found, err := rt.ForceRelease(ctx, id)
	if err != nil || !found || was.Owner != "b" || was.Token != 2 || !was.Until.Equal(b.Until) {
		t.Fatalf("ForceRelease: %+v, %v, %v; want b's holding", was, found, err)
	}
	if ok, err := rt.Release(ctx, id, "b", 2); err != nil || ok {
		t.Errorf("Release after ForceRelease: %v, %v; want refused", ok, err)
	}
	// ForceRelease of an unlocked row writes nothing (the row version,
	// xmin, stays).
	var xmin1, xmin2 string
	if err := pool.QueryRow(ctx, `SELECT xmin::text FROM `+name+` WHERE id = $1`, id).Scan(&xmin1); err != nil {
		t.Fatal(err)
	}
	if was, found, err := rt.ForceRelease(ctx, id); err != nil || !found || was.Owner != "" || was.Token != 2 {
		t.Errorf("ForceRelease of an unlocked row: %+v, %v, %v", was, found, err)
	}
	if err := pool.QueryRow(ctx, `SELECT xmin::text FROM `+name+` WHERE id = $1`, id).Scan(&xmin2); err != nil {
		t.Fatal(err)
	}
	if xmin1 != xmin2 {
		t.Errorf("ForceRelease of an unlocked row wrote it (xmin %s → %s)", xmin1, xmin2)
	}

	// List: live locks in id order.
	for _, i := range []string{"rec-000003", "rec-000001"} {
		if _, _, ok, err := rt.Lock(ctx, i, "c", d); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	if _, _, ok, err := rt.Lock(ctx, id, "c", time.Millisecond); err != nil || !ok {
		t.Fatal(ok, err)
	}
	waitDead(t, rt, id)
	live, err := rt.List(ctx, 10)
	if err != nil || len(live) != 2 || live[0].ID != "rec-000001" || live[1].ID != "rec-000003" || !live[0].Live() {
		t.Errorf("List: %+v, %v; want rec-000001 and rec-000003 (the expired one left out)", live, err)
	}
	if live, err := rt.List(ctx, 1); err != nil || len(live) != 1 {
		t.Errorf("List(1): %d, %v", len(live), err)
	}
	if _, err := rt.List(ctx, 0); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("List(0): %v, want ErrInvalidArgument", err)
	}
}

// waitDead waits until the store's clock says id's holding has ended.
func waitDead(t *testing.T, rt *postgres.RecordTable, id any) driver.RecordLock {
	t.Helper()
	ctx := rlCtx(t)
	for {
		rec, found, err := rt.Get(ctx, id)
		if err != nil || !found {
			t.Fatalf("Get(%v): %v, %v", id, found, err)
		}
		if !rec.Live() {
			return rec
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the holding of %v never expired", id)
		case <-time.After(time.Millisecond):
		}
	}
}

// TestRecordsMissingID: every call on an id no row has answers not
// found and writes nothing.
func TestRecordsMissingID(t *testing.T) {
	pool, rt, name := rlTable(t, "text", 3)
	ctx := rlCtx(t)
	before := userRows(t, pool, name)
	const missing = "rec-000999"
	if _, found, acquired, err := rt.Lock(ctx, missing, "a", time.Minute); err != nil || found || acquired {
		t.Errorf("Lock: found %v, acquired %v, %v", found, acquired, err)
	}
	if _, found, ok, err := rt.Extend(ctx, missing, "a", 1, time.Minute); err != nil || found || ok {
		t.Errorf("Extend: found %v, ok %v, %v", found, ok, err)
	}
	if ok, err := rt.Release(ctx, missing, "a", 1); err != nil || ok {
		t.Errorf("Release: %v, %v", ok, err)
	}
	if _, found, err := rt.ForceRelease(ctx, missing); err != nil || found {
		t.Errorf("ForceRelease: %v, %v", found, err)
	}
	if _, found, err := rt.Get(ctx, missing); err != nil || found {
		t.Errorf("Get: %v, %v", found, err)
	}
	if _, claimed, err := rt.Claim(ctx, recordlock.SQL{Where: "id = $1", Args: []any{missing}}, "a", time.Minute); err != nil || claimed {
		t.Errorf("Claim of the missing id: %v, %v", claimed, err)
	}
	after := userRows(t, pool, name)
	if len(after) != 3 || fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("rows after calls on a missing id: %v, want %v", after, before)
	}
	if n := rlCount(t, pool, name, `locked_by IS NOT NULL OR locked_until IS NOT NULL OR lock_token IS NOT NULL`); n != 0 {
		t.Errorf("%d rows have lock columns set after calls on a missing id", n)
	}
}

// waitBlocked waits until a statement on table waits for a lock.
func waitBlocked(t *testing.T, pool *pgxpool.Pool, table string) {
	t.Helper()
	ctx := rlCtx(t)
	for {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
  AND wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%' AND query LIKE '%warden_%'`, table).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the statement never waited for the row")
		case <-time.After(time.Millisecond):
		}
	}
}

// TestRecordsUserColumnsUntouched: a user column changed during the lock
// — also by a transaction that commits while Lock waits for its row —
// keeps its new value through Lock, Extend, Release, Claim and
// ForceRelease, which write only the three lock columns.
func TestRecordsUserColumnsUntouched(t *testing.T) {
	pool, rt, name := rlTable(t, "text", 4)
	ctx := rlCtx(t)
	before := userRows(t, pool, name)

	// Another program's transaction changes row 1's note and holds the
	// row while Lock waits for it.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `UPDATE `+name+` SET note = 'edited during the wait' WHERE id = 'rec-000001'`); err != nil {
		t.Fatal(err)
	}
	type lockResult struct {
		rec      driver.RecordLock
		acquired bool
		err      error
	}
	done := make(chan lockResult, 1)
	go func() {
		rec, _, acquired, err := rt.Lock(ctx, "rec-000001", "a", time.Minute)
		done <- lockResult{rec, acquired, err}
	}()
	waitBlocked(t, pool, name)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil || !res.acquired {
		t.Fatalf("Lock after the wait: %v, %v", res.acquired, res.err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+name+` SET note = 'edited while locked', status = 'doing', rank = 100 WHERE id = 'rec-000001'`); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := rt.Extend(ctx, "rec-000001", "a", res.rec.Token, time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	c, claimed, err := rt.Claim(ctx, recordlock.SQL{Where: "status = $1", Args: []any{"todo"}, OrderBy: "rank, id"}, "b", time.Minute)
	if err != nil || !claimed {
		t.Fatal(claimed, err)
	}
	if ok, err := rt.Release(ctx, "rec-000001", "a", res.rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, _, err := rt.ForceRelease(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	after := userRows(t, pool, name)
	before["rec-000001"] = "doing|100|edited while locked"
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("user columns after lock, extend, claim, release, force release:\n%v\nwant\n%v", after, before)
	}
}

// TestRecordsLockReportsHolderAfterWait: a Lock that waited for a
// concurrent transaction that took the lock answers that holder (the
// row's newest version, not the statement's snapshot).
func TestRecordsLockReportsHolderAfterWait(t *testing.T) {
	pool, rt, name := rlTable(t, "text", 1)
	ctx := rlCtx(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `UPDATE `+name+` SET locked_by = 'other', locked_until = clock_timestamp() + interval '1 hour', lock_token = 41`); err != nil {
		t.Fatal(err)
	}
	type lockResult struct {
		rec             driver.RecordLock
		found, acquired bool
		err             error
	}
	done := make(chan lockResult, 1)
	go func() {
		rec, found, acquired, err := rt.Lock(ctx, "rec-000001", "a", time.Minute)
		done <- lockResult{rec, found, acquired, err}
	}()
	waitBlocked(t, pool, name)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil || !res.found || res.acquired || res.rec.Owner != "other" || res.rec.Token != 41 || !res.rec.Live() {
		t.Errorf("Lock behind another holder's commit: %+v, found %v, acquired %v, %v; want refused naming other, token 41", res.rec, res.found, res.acquired, res.err)
	}
}

// TestRecordsHostileIDs: ids that read as SQL or patterns match no row;
// ids of a type the column does not take are refused, not a panic.
func TestRecordsHostileIDs(t *testing.T) {
	ctx := rlCtx(t)
	for _, c := range []struct {
		idType string
		ids    []any
	}{
		{"text", []any{"x' OR '1'='1", "rec-000001' OR '1'='1", "' OR TRUE --", "%", "rec-%", "rec-00000_", "*", "rec-000001 ", "REC-000001", "rec-000001;", `rec-000001\`, "$1"}},
		{"bigint", []any{"1 OR 1=1", "1; DROP TABLE x", "%", "*", "' OR TRUE --", int64(-1), int64(0)}},
	} {
		t.Run(c.idType, func(t *testing.T) {
			pool, rt, name := rlTable(t, c.idType, 3)
			for _, id := range c.ids {
				_, found, acquired, err := rt.Lock(ctx, id, "evil", time.Minute)
				if found || acquired {
					t.Errorf("Lock(%#v) matched a row", id)
				}
				if err != nil && !errors.Is(err, warden.ErrInvalidArgument) {
					t.Errorf("Lock(%#v): %v; want not found or ErrInvalidArgument", id, err)
				}
				if _, found, err := rt.ForceRelease(ctx, id); found || err != nil && !errors.Is(err, warden.ErrInvalidArgument) {
					t.Errorf("ForceRelease(%#v): %v, %v", id, found, err)
				}
			}
			if n := rlCount(t, pool, name, `locked_by IS NOT NULL OR lock_token IS NOT NULL`); n != 0 {
				t.Errorf("%d rows locked by hostile ids", n)
			}
			if n := rlCount(t, pool, name, `true`); n != 3 {
				t.Errorf("%d rows after hostile ids, want 3", n)
			}
		})
	}
	// A value of the wrong type for the column: a clear error matching
	// ErrInvalidArgument — the driver's for a plain string, pgx's or the
	// server's, wrapped, for a Valuer.
	_, rt, _ := rlTable(t, "bigint", 1)
	_, _, _, err := rt.Lock(ctx, "abc", "a", time.Minute)
	if !errors.Is(err, warden.ErrInvalidArgument) || !strings.Contains(err.Error(), "ids are integers") {
		t.Errorf("Lock(\"abc\") on a bigint id: %v", err)
	}
	_, _, _, err = rt.Lock(ctx, textValuer("abc"), "a", time.Minute)
	if !errors.Is(err, warden.ErrInvalidArgument) || !strings.Contains(err.Error(), "does not fit column id") {
		t.Errorf("Lock(textValuer(\"abc\")) on a bigint id: %v", err)
	}
	_, rtText, _ := rlTable(t, "text", 1)
	_, _, err = rtText.Get(ctx, int64(1))
	if !errors.Is(err, warden.ErrInvalidArgument) || !strings.Contains(err.Error(), "int64") {
		t.Errorf("Get(int64) on a text id: %v", err)
	}
	long := strings.Repeat("9", 500)
	_, _, err = rt.Get(ctx, long)
	if !errors.Is(err, warden.ErrInvalidArgument) || len(err.Error()) > 400 {
		t.Errorf("Get(500 nines) on a bigint id: %v (%d bytes); want ErrInvalidArgument, cut short", err, len(err.Error()))
	}
}

// TestRecordsCheckID checks the ids the driver takes and refuses before
// any I/O.
func TestRecordsCheckID(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // never connects
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rt, err := postgres.Records(pool, "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	type orderID string
	type seq int32
	var nilValuer *nullValuer
	for _, id := range []any{"a", strings.Repeat("x", 512), orderID("o-1"), int64(-5), 7, seq(3), uint64(math.MaxInt64), uint8(1),
		[]byte{0}, [16]byte{1}, time.Unix(1, 0), textValuer("v")} {
		if err := rt.CheckID(id); err != nil {
			t.Errorf("CheckID(%#v): %v", id, err)
		}
	}
	for _, id := range []any{nil, "", strings.Repeat("x", 513), "a\x00b", "\xff", orderID(""), uint64(math.MaxInt64 + 1), uint(math.MaxUint),
		[]byte{}, make([]byte, 513), []int{1}, map[string]any{"$ne": 1}, struct{ A int }{1}, 1.5, true, new(int64), time.Time{},
		[4]byte{}, textValuer(""), nullValuer{}, nilValuer, floatValuer(1)} {
		err := rt.CheckID(id)
		if !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("CheckID(%#v): %v, want ErrInvalidArgument", id, err)
		} else if len(err.Error()) > 300 {
			t.Errorf("CheckID: message of %d bytes, want the id cut short", len(err.Error()))
		}
		if _, _, _, err := rt.Lock(context.Background(), id, "a", time.Minute); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Lock(%#v): %v, want ErrInvalidArgument before any I/O", id, err)
		}
	}
}

type textValuer string

func (v textValuer) Value() (sqldriver.Value, error) { return string(v), nil }

type nullValuer struct{}

func (nullValuer) Value() (sqldriver.Value, error) { return nil, nil }

type floatValuer float64

func (v floatValuer) Value() (sqldriver.Value, error) { return float64(v), nil }

// TestRecordsHostileFilter: Claim's filter values are bound, so values
// that read as SQL or patterns match nothing.
func TestRecordsHostileFilter(t *testing.T) {
	pool, rt, name := rlTable(t, "text", 3)
	ctx := rlCtx(t)
	for _, v := range []string{"x' OR '1'='1", "todo' OR 'a'='a", "%", "todo%", "' OR 1=1 --", "todo\x00", "todo'); DELETE FROM " + name + "; --"} {
		rec, claimed, err := rt.Claim(ctx, recordlock.SQL{Where: "status = $1", Args: []any{v}}, "evil", time.Minute)
		if claimed {
			t.Errorf("Claim(status = %q) claimed %v", v, rec.ID)
		}
		if err != nil && !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Claim(status = %q): %v", v, err)
		}
	}
	if n := rlCount(t, pool, name, `locked_by IS NOT NULL`); n != 0 {
		t.Errorf("%d rows claimed by hostile filter values", n)
	}
	if n := rlCount(t, pool, name, `true`); n != 3 {
		t.Errorf("%d rows after hostile filter values, want 3", n)
	}
}

// TestRecordsClaimArgs: the filter's placeholders are $1..$n and the
// driver's come after; a filter ending in a line comment or using OR
// stays inside its parentheses; the order is the filter's.
func TestRecordsClaimArgs(t *testing.T) {
	pool, rt, name := rlTable(t, "text", 10)
	ctx := rlCtx(t)
	if _, err := pool.Exec(ctx, `UPDATE `+name+` SET status = 'done' WHERE id IN ('rec-000001', 'rec-000002')`); err != nil {
		t.Fatal(err)
	}
	f := recordlock.SQL{Where: "status = $1 AND rank >= $2 AND note <> $3", Args: []any{"todo", 5, "note 4"}, OrderBy: "rank DESC, id"}
	// rank = 11 − i: rank ≥ 5 → rows 1..6; todo → 3..6; note 4 out → 3, 5, 6.
	var got []any
	for {
		rec, claimed, err := rt.Claim(ctx, f, "w", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if !claimed {
			break
		}
		if rec.Owner != "w" || rec.Token != 1 || rec.Until.Sub(rec.Now) != time.Minute {
			t.Errorf("claimed %+v", rec)
		}
		got = append(got, rec.ID)
	}
	if fmt.Sprint(got) != "[rec-000003 rec-000005 rec-000006]" {
		t.Errorf("claimed %v, want rec-000003 rec-000005 rec-000006 in rank order", got)
	}
	// OR inside the filter cannot reach past the lock condition, and a
	// trailing comment cannot cut the statement.
	rec, claimed, err := rt.Claim(ctx, recordlock.SQL{Where: "status = 'todo' OR true -- any row", OrderBy: "id"}, "x", time.Minute)
	if err != nil || !claimed || rec.ID != "rec-000001" {
		t.Fatalf("Claim(OR true --): %+v, %v, %v; want rec-000001, the first unlocked row", rec, claimed, err)
	}
	for range 10 {
		if _, _, err := rt.Claim(ctx, recordlock.SQL{Where: "true OR true -- x"}, "x", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if n := rlCount(t, pool, name, `lock_token > 1`); n != 0 {
		t.Errorf("%d rows claimed twice while locked", n)
	}
	// Default order: the id.
	if _, err := pool.Exec(ctx, `UPDATE `+name+` SET locked_by = NULL, locked_until = NULL`); err != nil {
		t.Fatal(err)
	}
	rec, claimed, err = rt.Claim(ctx, recordlock.SQL{}, "y", time.Minute)
	if err != nil || !claimed || rec.ID != "rec-000001" {
		t.Errorf("Claim(all): %+v, %v, %v; want rec-000001", rec, claimed, err)
	}
	// A filter naming more parameters than it has Args would bind the
	// driver's own (owner, duration): refused before any I/O. $n in a
	// literal, a quoted name, a comment or an identifier is no parameter.
	for _, w := range []string{"status = $1 AND note = $2", "status = $1 OR rank = $3"} {
		if _, claimed, err := rt.Claim(ctx, recordlock.SQL{Where: w, Args: []any{"todo"}}, "z", time.Minute); !errors.Is(err, warden.ErrInvalidArgument) || claimed {
			t.Errorf("Claim(%q) with one Arg: %v, %v; want ErrInvalidArgument", w, claimed, err)
		}
	}
	if _, _, err := rt.Claim(ctx, recordlock.SQL{Where: "status = $1", OrderBy: "rank <-> $2"}, "z", time.Minute); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Claim with $2 in OrderBy and no Args: %v; want ErrInvalidArgument", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+name+` SET locked_by = NULL, locked_until = NULL, note = 'x$2' WHERE id = 'rec-000009'`); err != nil {
		t.Fatal(err)
	}
	rec, claimed, err = rt.Claim(ctx, recordlock.SQL{Where: "status = $1 AND note = 'x$2' AND \"note\" <> 'a$3b' /* $4 */ -- $5\n AND note$1 IS NULL", Args: []any{"todo"}}, "z", time.Minute)
	if err == nil || errors.Is(err, warden.ErrInvalidArgument) {
		// note$1 is a column name the table does not have: the server
		// says so; the placeholder check let it through.
		t.Errorf("Claim with $n in literals, names and comments: %v, %v, %v; want the server's unknown-column error", rec, claimed, err)
	}
	rec, claimed, err = rt.Claim(ctx, recordlock.SQL{Where: "status = $1 AND note = 'x$2' /* $4 */ -- $5", Args: []any{"todo"}}, "z", time.Minute)
	if err != nil || !claimed || rec.ID != "rec-000009" {
		t.Errorf("Claim with $n in a literal and comments: %+v, %v, %v; want rec-000009", rec, claimed, err)
	}
}

// TestRecordsClaimEachOnce: 8 goroutines claim from 500 rows until none
// is left; each row goes to exactly one of them.
func TestRecordsClaimEachOnce(t *testing.T) {
	const n, workers = 500, 8
	pool, rt, name := rlTable(t, "bigint", n)
	ctx := rlCtx(t)
	var mu sync.Mutex
	got := map[int64]string{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("w%d", w)
			for {
				rec, claimed, err := rt.Claim(ctx, recordlock.SQL{Where: "status = $1", Args: []any{"todo"}, OrderBy: "rank, id"}, owner, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if !claimed {
					return
				}
				mu.Lock()
				id := rec.ID.(int64)
				if prev, twice := got[id]; twice {
					t.Errorf("row %d claimed by %s and %s", id, prev, owner)
				}
				got[id] = owner
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(got) != n {
		t.Errorf("%d rows claimed, want %d", len(got), n)
	}
	if m := rlCount(t, pool, name, `lock_token = 1 AND locked_by IS NOT NULL AND locked_until > clock_timestamp()`); m != n {
		t.Errorf("%d rows hold one live claim with token 1, want %d", m, n)
	}
}

// TestRecordsExpiredClaimable: a row whose lock has expired on the
// server's clock is claimable (and lockable) at once, with the next
// token, and the old holder can no longer extend it.
func TestRecordsExpiredClaimable(t *testing.T) {
	_, rt, _ := rlTable(t, "text", 2)
	ctx := rlCtx(t)
	old, _, ok, err := rt.Lock(ctx, "rec-000002", "old", time.Millisecond)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, _, ok, err := rt.Lock(ctx, "rec-000001", "other", time.Hour); err != nil || !ok {
		t.Fatal(ok, err)
	}
	waitDead(t, rt, "rec-000002")
	rec, claimed, err := rt.Claim(ctx, recordlock.SQL{}, "new", time.Minute)
	if err != nil || !claimed || rec.ID != "rec-000002" || rec.Token != old.Token+1 || rec.Owner != "new" {
		t.Fatalf("Claim after expiry: %+v, %v, %v; want rec-000002, token %d", rec, claimed, err, old.Token+1)
	}
	if _, _, ok, err := rt.Extend(ctx, "rec-000002", "old", old.Token, time.Minute); err != nil || ok {
		t.Errorf("Extend by the expired holder: %v, %v; want refused", ok, err)
	}
	// An expired holding cannot be extended even before anyone takes it.
	k, _, _, err := rt.Lock(ctx, "rec-000001", "x", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_ = k
	if _, _, ok, err := rt.Lock(ctx, "rec-000002", "new", time.Minute); err != nil || ok {
		t.Errorf("Lock of a claimed row: %v, %v; want refused", ok, err)
	}
	if ok, err := rt.Release(ctx, "rec-000002", "new", rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	lk, _, ok, err := rt.Lock(ctx, "rec-000002", "exp", time.Millisecond)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	waitDead(t, rt, "rec-000002")
	if _, found, ok, err := rt.Extend(ctx, "rec-000002", "exp", lk.Token, time.Minute); err != nil || !found || ok {
		t.Errorf("Extend of an expired holding: %v, %v, %v; want refused", found, ok, err)
	}
	// Release of an expired holding by its holder still clears it.
	if ok, err := rt.Release(ctx, "rec-000002", "exp", lk.Token); err != nil || !ok {
		t.Errorf("Release of an expired holding: %v, %v; want ok", ok, err)
	}
}

// TestRecordsTokens: tokens strictly increase through locks, claims,
// releases and forced releases, and continue above a token another
// program wrote.
func TestRecordsTokens(t *testing.T) {
	pool, rt, name := rlTable(t, "text", 1)
	ctx := rlCtx(t)
	var prev int64
	next := func(rec driver.RecordLock, how string) {
		t.Helper()
		if rec.Token <= prev {
			t.Errorf("%s: token %d after %d", how, rec.Token, prev)
		}
		prev = rec.Token
	}
	for i := range 12 {
		var rec driver.RecordLock
		var ok bool
		var err error
		if i%2 == 0 {
			rec, _, ok, err = rt.Lock(ctx, "rec-000001", "a", time.Minute)
		} else {
			rec, ok, err = rt.Claim(ctx, recordlock.SQL{}, "b", time.Minute)
		}
		if err != nil || !ok {
			t.Fatal(i, ok, err)
		}
		next(rec, fmt.Sprint("round ", i))
		if i%3 == 0 {
			_, _, err = rt.ForceRelease(ctx, "rec-000001")
		} else {
			_, err = rt.Release(ctx, "rec-000001", rec.Owner, rec.Token)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE `+name+` SET lock_token = 1000`); err != nil {
		t.Fatal(err)
	}
	rec, _, ok, err := rt.Lock(ctx, "rec-000001", "a", time.Minute)
	if err != nil || !ok || rec.Token != 1001 {
		t.Errorf("Lock after another program set the token to 1000: %+v, %v, %v; want token 1001", rec, ok, err)
	}
}

// rlTracer counts round trips (queries and prepares) and keeps the SQL
// of each query.
type rlTracer struct {
	mu   sync.Mutex
	n    int
	sql  []string
	args []any // of the last query
}

func (c *rlTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	c.n++
	c.sql = append(c.sql, d.SQL)
	c.args = d.Args
	c.mu.Unlock()
	return ctx
}

func (c *rlTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *rlTracer) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return ctx
}

func (c *rlTracer) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

func (c *rlTracer) take() (int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, s := c.n, c.sql
	c.n, c.sql = 0, nil
	return n, s
}

// tracedPool returns a one-connection pool whose tracer counts round
// trips.
func tracedPool(t *testing.T) (*pgxpool.Pool, *rlTracer) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(drivertest.ServerURL(t, "postgres", "WARDEN_TEST_POSTGRES_URL"))
	if err != nil {
		t.Fatal(err)
	}
	tr := &rlTracer{}
	cfg.ConnConfig.Tracer = tr
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, tr
}

// TestRecordsRoundTrips: every primitive is one round trip on a warm
// connection (pgx prepares a statement once per connection; each
// operation runs once unmeasured first).
func TestRecordsRoundTrips(t *testing.T) {
	_, _, name := rlTable(t, "text", 4)
	pool, tr := tracedPool(t)
	rt, err := postgres.Records(pool, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := rlCtx(t)
	f := recordlock.SQL{Where: "status = $1", Args: []any{"todo"}, OrderBy: "rank, id"}
	var tok int64
	ops := []struct {
		name string
		f    func(id string) error
	}{
		{"Lock", func(id string) error {
			rec, _, ok, err := rt.Lock(ctx, id, "a", time.Minute)
			if err == nil && !ok {
				err = errors.New("not acquired")
			}
			tok = rec.Token
			return err
		}},
		{"Lock (refused)", func(id string) error {
			_, _, ok, err := rt.Lock(ctx, id, "b", time.Minute)
			if err == nil && ok {
				err = errors.New("acquired")
			}
			return err
		}},
		{"Extend", func(id string) error {
			_, _, ok, err := rt.Extend(ctx, id, "a", tok, time.Minute)
			if err == nil && !ok {
				err = errors.New("not extended")
			}
			return err
		}},
		{"Get", func(id string) error { _, _, err := rt.Get(ctx, id); return err }},
		{"List", func(string) error { _, err := rt.List(ctx, 10); return err }},
		{"Release", func(id string) error {
			ok, err := rt.Release(ctx, id, "a", tok)
			if err == nil && !ok {
				err = errors.New("not released")
			}
			return err
		}},
		{"ForceRelease", func(id string) error { _, _, err := rt.ForceRelease(ctx, id); return err }},
		{"Claim", func(string) error {
			_, ok, err := rt.Claim(ctx, f, "c", time.Minute)
			if err == nil && !ok {
				err = errors.New("nothing claimed")
			}
			return err
		}},
	}
	for round, id := range []string{"rec-000001", "rec-000002"} {
		for _, op := range ops {
			tr.take()
			if err := op.f(id); err != nil {
				t.Fatalf("%s: %v", op.name, err)
			}
			if n, _ := tr.take(); round == 1 && n != 1 {
				t.Errorf("%s: %d round trips, want 1", op.name, n)
			}
		}
	}
}

// TestRecordsClaimDoesNotScan: with most rows held, a Claim reads a
// handful of rows, not the held ones ahead of the first free row in the
// filter's order — through the migration's indexes (default order) or
// the user's partial index (its own filter), with statistics from before
// the rows were held and after. The statement Claim sent is run again
// under EXPLAIN ANALYZE (rolled back), and the rows its scans produced or
// filtered out are counted.
func TestRecordsClaimDoesNotScan(t *testing.T) {
	const n, held = 3000, 2000
	_, shared, name := rlTable(t, "text", n)
	pool, tr := tracedPool(t)
	rt, err := postgres.Records(pool, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := rlCtx(t)
	byStatus := recordlock.SQL{Where: "status = $1", Args: []any{"todo"}, OrderBy: "rank, id"}
	for range held / 2 {
		for _, f := range []recordlock.SQL{byStatus, {}} {
			if _, ok, err := shared.Claim(ctx, f, "h", time.Hour); err != nil || !ok {
				t.Fatal(ok, err)
			}
		}
	}
	lapse := 0
	scanned := func(f recordlock.SQL) (int, string) {
		t.Helper()
		// A few lapsed holdings among the held rows, in both orders.
		lapse++
		if _, err := pool.Exec(ctx, `UPDATE `+name+` SET locked_until = now() - interval '1 minute' WHERE id IN ($1, $2)`,
			fmt.Sprintf("rec-%06d", 100*lapse), fmt.Sprintf("rec-%06d", n-100*lapse)); err != nil {
			t.Fatal(err)
		}
		tr.take()
		if _, ok, err := rt.Claim(ctx, f, "probe", time.Minute); err != nil || !ok {
			t.Fatal(ok, err)
		}
		tr.mu.Lock()
		stmt, args := tr.sql[len(tr.sql)-1], tr.args
		tr.mu.Unlock()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		var plan []map[string]any
		if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+stmt, args...).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		total := 0
		var walk func(node map[string]any)
		walk = func(node map[string]any) {
			if typ, _ := node["Node Type"].(string); strings.HasSuffix(typ, "Scan") && typ != "CTE Scan" {
				rows, _ := node["Actual Rows"].(float64)
				loops, _ := node["Actual Loops"].(float64)
				removed, _ := node["Rows Removed by Filter"].(float64)
				total += int(rows*loops + removed)
			}
			for _, sub := range []string{"Plans"} {
				children, _ := node[sub].([]any)
				for _, c := range children {
					walk(c.(map[string]any))
				}
			}
		}
		walk(plan[0]["Plan"].(map[string]any))
		b, _ := json.MarshalIndent(plan, "", " ")
		return total, string(b)
	}
	for _, stats := range []string{"stale", "fresh"} {
		if stats == "fresh" {
			if _, err := pool.Exec(ctx, `ANALYZE `+name); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range []struct {
			what string
			f    recordlock.SQL
		}{{"default order", recordlock.SQL{}}, {"status filter", byStatus}} {
			rows, plan := scanned(c.f)
			t.Logf("%s statistics, %s: %d rows read", stats, c.what, rows)
			if rows > 50 {
				t.Errorf("%s statistics, %s: a Claim read %d rows with %d of %d held; plan:\n%s", stats, c.what, rows, held, n, plan)
			}
		}
	}
}

// TestRecordsMigrate: Migrate adds nullable lock columns and the index to
// a plain table without touching its rows, changes nothing the second
// time, reuses a user's index, refuses lock columns of other types and
// missing tables before changing anything, and Migration's SQL does the
// same by hand.
func TestRecordsMigrate(t *testing.T) {
	drivertest.ServerURL(t, "postgres", "WARDEN_TEST_POSTGRES_URL")
	pool, tr := tracedPool(t)
	ctx := rlCtx(t)
	name := fmt.Sprintf("rlt_mig_%d", time.Now().UnixNano()%1e9)
	q := pgx.Identifier{name}.Sanitize()
	drop := func() {
		if _, err := pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+q); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(drop)
	mk := func(extra string) {
		t.Helper()
		drop()
		if _, err := pool.Exec(ctx, `CREATE TABLE `+q+` (id bigint PRIMARY KEY, note text NOT NULL`+extra+`);
INSERT INTO `+q+` (id, note) SELECT g, 'n' || g FROM generate_series(1, 50) g`); err != nil {
			t.Fatal(err)
		}
	}
	describe := func() string {
		t.Helper()
		var s string
		err := pool.QueryRow(ctx, `SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod) || CASE WHEN attnotnull THEN ' not null' ELSE '' END || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), ''), ', ' ORDER BY attnum)
  || ' | ' || (SELECT string_agg(pg_get_indexdef(indexrelid), '; ' ORDER BY indexrelid) FROM pg_index WHERE indrelid = $1::regclass)
FROM pg_attribute LEFT JOIN pg_attrdef d ON d.adrelid = attrelid AND d.adnum = attnum WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`, q).Scan(&s)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	rt, err := postgres.Records(pool, name, nil)
	if err != nil {
		t.Fatal(err)
	}

	mk("")
	rowsBefore := userRows2(t, pool, q)
	if err := rt.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	got := describe()
	want := "id bigint not null, note text not null, locked_until timestamp(3) with time zone, locked_by text, lock_token bigint | " +
		"CREATE UNIQUE INDEX " + name + "_pkey ON public." + name + " USING btree (id); " +
		"CREATE INDEX " + name + "_locked_until_idx ON public." + name + " USING btree (locked_until) WHERE (locked_by IS NOT NULL); " +
		"CREATE INDEX " + name + "_id_unlocked_idx ON public." + name + " USING btree (id) WHERE (locked_by IS NULL); " +
		"CREATE INDEX " + name + "_locked_by_cleared_idx ON public." + name + " USING btree (id) WHERE ((locked_by = ''::text) OR ((locked_by IS NOT NULL) AND (locked_until IS NULL)))"
	if got != want {
		t.Errorf("after Migrate:\n%s\nwant\n%s", got, want)
	}
	if r := userRows2(t, pool, q); r != rowsBefore {
		t.Errorf("Migrate changed the rows")
	}
	if n := rlCount(t, pool, name, `locked_until IS NOT NULL OR locked_by IS NOT NULL OR lock_token IS NOT NULL`); n != 0 {
		t.Errorf("%d rows have lock values after Migrate", n)
	}
	tr.take()
	if err := rt.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	_, stmts := tr.take()
	for _, s := range stmts {
		if u := strings.ToUpper(s); strings.Contains(u, "ALTER") || strings.Contains(u, "CREATE") {
			t.Errorf("second Migrate ran %q", s)
		}
	}
	if describe() != want {
		t.Errorf("second Migrate changed the table: %s", describe())
	}

	// By hand: Migration's SQL, twice, gives the same table; Migrate
	// after it changes nothing.
	mk("")
	for range 2 {
		if _, err := pool.Exec(ctx, rt.Migration()); err != nil {
			t.Fatalf("Migration(): %v\n%s", err, rt.Migration())
		}
	}
	if describe() != want {
		t.Errorf("after Migration():\n%s\nwant\n%s", describe(), want)
	}
	tr.take()
	if err := rt.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, stmts := tr.take(); strings.Contains(strings.Join(stmts, ";"), "ALTER") {
		t.Errorf("Migrate after Migration() altered the table")
	}

	// An invalid index of one of its names (a failed CONCURRENTLY build):
	// refused, with advice.
	mk("")
	if _, err := pool.Exec(ctx, rt.Migration()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE pg_index SET indisvalid = false WHERE indexrelid = $1::regclass`, pgx.Identifier{name + "_id_unlocked_idx"}.Sanitize()); err != nil {
		t.Logf("cannot mark an index invalid (not a superuser?): %v", err)
	} else if err := rt.Migrate(ctx); err == nil || !strings.Contains(err.Error(), "is invalid") {
		t.Errorf("Migrate beside an invalid index: %v", err)
	}

	// Lock columns of another type: refused, nothing changed.
	for _, extra := range []string{", locked_until text", ", locked_by integer", ", lock_token text", ", locked_until timestamp"} {
		mk(extra)
		before := describe()
		err := rt.Migrate(ctx)
		if err == nil || !strings.Contains(err.Error(), "column") {
			t.Errorf("Migrate with%s: %v; want refused naming the column", extra, err)
		}
		if describe() != before {
			t.Errorf("Migrate with%s changed the table before refusing", extra)
		}
	}

	// Concurrent Migrates of one table take turns.
	mk("")
	shared, err := recordsPool()
	if err != nil {
		t.Fatal(err)
	}
	rt2, err := postgres.Records(shared, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rt2.Migrate(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if describe() != want {
		t.Errorf("after concurrent Migrates:\n%s\nwant\n%s", describe(), want)
	}

	// A missing table or id column: an error, nothing created.
	missing, err := postgres.Records(pool, name+"_missing", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := missing.Migrate(ctx); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Migrate of a missing table: %v", err)
	}
	noID, err := postgres.Records(pool, name, &postgres.RecordOptions{IDColumn: "uid"})
	if err != nil {
		t.Fatal(err)
	}
	if err := noID.Migrate(ctx); err == nil || !strings.Contains(err.Error(), `no id column "uid"`) {
		t.Errorf("Migrate without the id column: %v", err)
	}
	notUnique, err := postgres.Records(pool, name, &postgres.RecordOptions{IDColumn: "note"})
	if err != nil {
		t.Fatal(err)
	}
	before := describe()
	if err := notUnique.Migrate(ctx); err == nil || !strings.Contains(err.Error(), "neither the primary key nor alone in a unique index") {
		t.Errorf("Migrate with a non-unique id column: %v", err)
	}
	if describe() != before {
		t.Errorf("Migrate with a non-unique id column changed the table")
	}
}

func userRows2(t *testing.T, pool *pgxpool.Pool, q string) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), `SELECT string_agg(id || ':' || note, ',' ORDER BY id) FROM `+q).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRecordsOptions: names are quoted (a schema, table and columns that
// need quoting work, and cannot inject SQL), empty or duplicate names are
// refused, and ids of uuid and integer columns come back in a form the
// driver takes again.
func TestRecordsOptions(t *testing.T) {
	pool, err := recordsPool()
	if err != nil {
		t.Skip(err)
	}
	drivertest.ServerURL(t, "postgres", "WARDEN_TEST_POSTGRES_URL")
	ctx := rlCtx(t)
	for _, c := range []struct {
		table string
		o     *postgres.RecordOptions
	}{
		{"", nil}, {"t", &postgres.RecordOptions{IDColumn: "x", UntilColumn: "x"}}, {strings.Repeat("t", 64), nil},
		{"t", &postgres.RecordOptions{Schema: "a\x00b"}}, {"t", &postgres.RecordOptions{OwnerColumn: "lock_token"}},
	} {
		if _, err := postgres.Records(pool, c.table, c.o); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Records(%q, %+v): %v, want ErrInvalidArgument", c.table, c.o, err)
		}
	}
	if _, err := postgres.Records(nil, "t", nil); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Records(nil pool): %v", err)
	}

	schema := fmt.Sprintf(`rl "odd" %d`, time.Now().UnixNano()%1e9)
	table := `Jobs"; DROP TABLE x; --`
	qs, qt := pgx.Identifier{schema}.Sanitize(), pgx.Identifier{schema, table}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+qs+`; CREATE TABLE `+qt+` ("Job Id" uuid PRIMARY KEY, "state" text)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP SCHEMA `+qs+` CASCADE`) })
	if _, err := pool.Exec(ctx, `INSERT INTO `+qt+` VALUES ('00000000-0000-0000-0000-000000000001', 'new'), ('00000000-0000-0000-0000-000000000002', 'new')`); err != nil {
		t.Fatal(err)
	}
	rt, err := postgres.Records(pool, table, &postgres.RecordOptions{Schema: schema, IDColumn: "Job Id", UntilColumn: "Until'", OwnerColumn: "By \"who\"", TokenColumn: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	if rt.Table() != schema+"."+table || rt.Backend() != "postgres" {
		t.Errorf("Table %q, Backend %q", rt.Table(), rt.Backend())
	}
	if err := rt.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rt.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	rec, claimed, err := rt.Claim(ctx, recordlock.SQL{Where: `"state" = $1`, Args: []any{"new"}}, "w", time.Minute)
	if err != nil || !claimed {
		t.Fatal(claimed, err)
	}
	want := [16]byte{15: 1}
	if rec.ID != want {
		t.Fatalf("claimed id %#v, want %#v", rec.ID, want)
	}
	if err := rt.CheckID(rec.ID); err != nil {
		t.Errorf("CheckID of the id Claim returned: %v", err)
	}
	if _, _, ok, err := rt.Extend(ctx, rec.ID, "w", rec.Token, time.Minute); err != nil || !ok {
		t.Errorf("Extend with the claimed id: %v, %v", ok, err)
	}
	if ok, err := rt.Release(ctx, rec.ID, "w", rec.Token); err != nil || !ok {
		t.Errorf("Release with the claimed id: %v, %v", ok, err)
	}
	// A uuid as a string, and a string that is no uuid.
	if _, found, ok, err := rt.Lock(ctx, "00000000-0000-0000-0000-000000000002", "s", time.Minute); err != nil || !found || !ok {
		t.Errorf("Lock with a uuid string: %v, %v, %v", found, ok, err)
	}
	if _, _, _, err := rt.Lock(ctx, "x' OR '1'='1", "s", time.Minute); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Lock with a non-uuid string on a uuid column: %v", err)
	}
	live, err := rt.List(ctx, 10)
	if err != nil || len(live) != 1 || live[0].Owner != "s" {
		t.Errorf("List: %+v, %v", live, err)
	}

	// Integer kinds on a bigint column; Claim returns int64.
	_, bt, _ := rlTable(t, "bigint", 3)
	for i, id := range []any{int32(1), uint16(2), 3} {
		if _, found, ok, err := bt.Lock(ctx, id, "i", time.Minute); err != nil || !found || !ok {
			t.Errorf("Lock(%T %v): %v, %v, %v", id, id, found, ok, err)
		}
		if _, _, err := bt.ForceRelease(ctx, int64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	rec, _, err = bt.Claim(ctx, recordlock.SQL{OrderBy: "id DESC"}, "c", time.Minute)
	if err != nil || rec.ID != int64(3) {
		t.Errorf("Claim on bigint: %#v, %v; want int64(3)", rec.ID, err)
	}
}

// TestRecordsIDFamily: an id of the other family than the id column's is
// refused before any write, where PostgreSQL would convert it and lock
// another row ("01", " 1" and []byte("1") read as the bigint 1; 1 as the
// text "1"). Integers of any width still reach a bigint row, and a
// Valuer is bound as its Value says.
func TestRecordsIDFamily(t *testing.T) {
	ctx := rlCtx(t)
	pool, rt, name := rlTable(t, "bigint", 3)
	for _, id := range []any{"01", " 1", "1", []byte("1"), [16]byte{1}} {
		if _, _, _, err := rt.Lock(ctx, id, "a", time.Minute); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("bigint column: Lock(%#v): %v, want ErrInvalidArgument", id, err)
		}
		if err := rt.CheckID(id); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("bigint column: CheckID(%#v) after first use: %v, want ErrInvalidArgument", id, err)
		}
	}
	if n := rlCount(t, pool, name, "locked_by IS NOT NULL"); n != 0 {
		t.Fatalf("%d rows locked by refused ids", n)
	}
	for _, id := range []any{int32(1), uint8(2), int64(3)} {
		if _, found, ok, err := rt.Lock(ctx, id, "a", time.Minute); err != nil || !found || !ok {
			t.Errorf("bigint column: Lock(%#v) = found %v, acquired %v, %v", id, found, ok, err)
		}
	}

	pool, rt, name = rlTable(t, "text", 2)
	for _, id := range []any{1, int64(1), []byte("rec-000001")} {
		if _, _, _, err := rt.Lock(ctx, id, "a", time.Minute); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("text column: Lock(%#v): %v, want ErrInvalidArgument", id, err)
		}
	}
	if _, found, ok, err := rt.Lock(ctx, textValuer("rec-000001"), "a", time.Minute); err != nil || !found || !ok {
		t.Errorf("text column: Lock(textValuer) = found %v, acquired %v, %v", found, ok, err)
	}
	if n := rlCount(t, pool, name, "locked_by IS NOT NULL"); n != 1 {
		t.Errorf("%d rows locked, want the one the Valuer named", n)
	}
}

// TestRecordsIDNotUnique: a table whose id column is not unique (no
// primary key, no unique index of its own) is refused on first use, as
// Migrate refuses it: a lock would name every row with the id.
func TestRecordsIDNotUnique(t *testing.T) {
	drivertest.ServerURL(t, "postgres", "WARDEN_TEST_POSTGRES_URL")
	pool, err := recordsPool()
	if err != nil {
		t.Fatal(err)
	}
	ctx := rlCtx(t)
	name := fmt.Sprintf("rlt_nu_%d_%d", time.Now().UnixNano()%1e9, rltSeq.Add(1))
	q := pgx.Identifier{name}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+q+` (id text, k int, locked_until timestamptz(3), locked_by text, lock_token bigint, UNIQUE (id, k));
INSERT INTO `+q+` (id, k) VALUES ('a', 1), ('a', 2)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+q) })
	rt, err := postgres.Records(pool, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // refused every call, not only the first
		_, _, _, err = rt.Lock(ctx, "a", "x", time.Minute)
		if err == nil || !strings.Contains(err.Error(), "unique") {
			t.Errorf("Lock on a non-unique id column: %v, want an error saying it is not unique", err)
		}
	}
	if _, _, err := rt.Claim(ctx, recordlock.SQL{}, "x", time.Minute); err == nil {
		t.Error("Claim on a non-unique id column: no error")
	}
	if n := rlCount(t, pool, name, "locked_by IS NOT NULL"); n != 0 {
		t.Errorf("%d rows locked", n)
	}
}
