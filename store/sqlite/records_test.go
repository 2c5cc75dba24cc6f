package sqlite_test

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/recordlock"
	"github.com/warden-go/warden/recordlock/recordlocktest"
	"github.com/warden-go/warden/store/sqlite"
	sqlitelib "modernc.org/sqlite"
)

// The record-lock harness works in child processes too: it finds the
// database file and the id type in the environment, which the parent test
// sets before running the suite.
const (
	recordsDBEnv  = "WARDEN_TEST_SQLITE_RECORDS_DB"
	recordsIDsEnv = "WARDEN_TEST_SQLITE_RECORDS_IDS" // "int" or "text"
)

// recordDSN is how a program would open its own database: WAL and a busy
// timeout, nothing of warden's. synchronous=NORMAL is the program's choice
// of durability (a commit may be lost on power failure, never torn); the
// records' locking is the same at FULL, only each commit's fsync slower.
func recordDSN(path string) string {
	return "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)"
}

var recordDBs = struct {
	sync.Mutex
	m map[string]*sql.DB
}{m: map[string]*sql.DB{}}

// recordsDB returns the process's handle on the harness's database file.
func recordsDB() (*sql.DB, error) {
	path := os.Getenv(recordsDBEnv)
	if path == "" {
		return nil, errors.New(recordsDBEnv + " is not set")
	}
	recordDBs.Lock()
	defer recordDBs.Unlock()
	if db := recordDBs.m[path]; db != nil {
		return db, nil
	}
	db, err := sql.Open("sqlite", recordDSN(path))
	if err != nil {
		return nil, err
	}
	recordDBs.m[path] = db
	return db, nil
}

// createRecordTable makes a program's table of rows, as the program
// would, then adds the lock columns with Migrate and the index its claims
// by status need.
func createRecordTable(ctx context.Context, db *sql.DB, name string, intIDs bool, rows []recordlocktest.Row) error {
	idDecl := "id TEXT PRIMARY KEY"
	if intIDs {
		idDecl = "id INTEGER PRIMARY KEY"
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+name+` (`+idDecl+`, status TEXT NOT NULL, rank INTEGER NOT NULL, note TEXT NOT NULL)`); err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, r := range rows {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+name+` (id, status, rank, note) VALUES (?, ?, ?, ?)`,
			recordID(intIDs, r.N), r.Status, r.Rank, r.Note); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	rt, err := sqlite.Records(db, name, nil)
	if err != nil {
		return err
	}
	if err := rt.Migrate(ctx); err != nil {
		return err
	}
	// The program's index for its claims by status in rank order: the
	// filter's column, the expiry, the order's columns.
	_, err = db.ExecContext(ctx, `CREATE INDEX `+name+`_status ON `+name+` (status, locked_until, rank, id)`)
	return err
}

func recordID(intIDs bool, n int) any {
	if intIDs {
		return int64(n)
	}
	return fmt.Sprintf("rec-%06d", n)
}

func byStatus(status string) recordlock.SQL {
	return recordlock.SQL{Where: "status = ?", Args: []any{status}, OrderBy: "rank, id"}
}

// recordHarness is the suite's harness on the database named by
// recordsDBEnv, with INTEGER or TEXT ids.
func recordHarness(intIDs bool) recordlocktest.Harness[recordlock.SQL] {
	name := "sqlite-text-ids"
	hostile := []any{"x' OR '1'='1", "%", "1 OR 1=1", "rec-%", "rec-00000?", "rec-*", "*", "rec-000001' --",
		"REC-000001", "rec-000001 ", int64(1), 0, []byte("rec-000001"), 1.0}
	if intIDs {
		name = "sqlite-int-ids"
		hostile = []any{"1", " 1", "1.0", "1e0", "1 OR 1=1", "x' OR '1'='1", "%", "*", "0 OR 1", 1.0, int64(1) << 40, -1}
	}
	return recordlocktest.Harness[recordlock.SQL]{
		Name: name,
		Create: func(ctx context.Context, table string, rows []recordlocktest.Row) error {
			db, err := recordsDB()
			if err != nil {
				return err
			}
			return createRecordTable(ctx, db, table, intIDs, rows)
		},
		Drop: func(ctx context.Context, table string) error {
			db, err := recordsDB()
			if err != nil {
				return err
			}
			_, err = db.ExecContext(ctx, `DROP TABLE `+table)
			return err
		},
		Open: func(_ context.Context, table string) (driver.Records[recordlock.SQL], func(), error) {
			db, err := recordsDB()
			if err != nil {
				return nil, nil, err
			}
			rt, err := sqlite.Records(db, table, nil)
			return rt, func() {}, err
		},
		ID: func(n int) any { return recordID(intIDs, n) },
		Read: func(ctx context.Context, table string, id any) (recordlocktest.Row, bool, error) {
			db, err := recordsDB()
			if err != nil {
				return recordlocktest.Row{}, false, err
			}
			var r recordlocktest.Row
			err = db.QueryRowContext(ctx, `SELECT status, rank, note FROM `+table+` WHERE id = ?`, id).Scan(&r.Status, &r.Rank, &r.Note)
			if errors.Is(err, sql.ErrNoRows) {
				return r, false, nil
			}
			return r, err == nil, err
		},
		SetNote: func(ctx context.Context, table string, id any, note string) error {
			db, err := recordsDB()
			if err != nil {
				return err
			}
			_, err = db.ExecContext(ctx, `UPDATE `+table+` SET note = ? WHERE id = ?`, note, id)
			return err
		},
		Count: func(ctx context.Context, table string) (int, error) {
			db, err := recordsDB()
			if err != nil {
				return 0, err
			}
			var n int
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM `+table).Scan(&n)
			return n, err
		},
		ByStatus:   byStatus,
		HostileIDs: hostile,
	}
}

// recordsChild runs this process as a child of the suite's
// multi-process checks if the suite started it so (TestMain calls it
// first); otherwise it returns at once.
func recordsChild() {
	if cfg, ok := os.LookupEnv(claimChildEnv); ok {
		os.Exit(runClaimChild(cfg))
	}
	recordlocktest.Child(recordHarness(os.Getenv(recordsIDsEnv) == "int"))
}

// claimChildEnv holds the configuration of a child process of
// TestRecordsClaimProcesses, as JSON.
const claimChildEnv = "WARDEN_TEST_SQLITE_RECORDS_CLAIM_CHILD"

type claimChildConfig struct {
	DSN, Table, Dir string
	ID, Goroutines  int
}

// claimed is one claim a child made.
type claimed struct {
	ID    string
	Token int64
	Owner string
}

// runClaimChild claims records with several goroutines until none is
// left, releasing nothing, and writes what it claimed to Dir.
func runClaimChild(js string) int {
	var cfg claimChildConfig
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := sql.Open("sqlite", cfg.DSN)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer db.Close()
	rt, err := sqlite.Records(db, cfg.Table, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	_ = os.WriteFile(filepath.Join(cfg.Dir, fmt.Sprintf("ready-%d", cfg.ID)), nil, 0o600)
	for {
		if _, err := os.Stat(filepath.Join(cfg.Dir, "go")); err == nil {
			break
		}
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "no go")
			return 2
		}
		time.Sleep(time.Millisecond)
	}
	var mu sync.Mutex
	var out []claimed
	var errs []string
	var wg sync.WaitGroup
	for g := range cfg.Goroutines {
		owner := fmt.Sprintf("p%d-g%d", cfg.ID, g)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				rec, ok, err := rt.Claim(ctx, byStatus("todo"), owner, time.Hour)
				mu.Lock()
				if err != nil {
					errs = append(errs, err.Error())
				} else if ok {
					out = append(out, claimed{ID: fmt.Sprint(rec.ID), Token: rec.Token, Owner: rec.Owner})
				}
				mu.Unlock()
				if err != nil || !ok {
					return
				}
			}
		}()
	}
	wg.Wait()
	b, _ := json.Marshal(map[string]any{"claims": out, "errors": errs})
	if err := os.WriteFile(filepath.Join(cfg.Dir, fmt.Sprintf("result-%d.json", cfg.ID)), b, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}

// TestRecordsSuite runs recordlock's conformance suite (goroutines and
// two child processes on one file) with TEXT and with INTEGER ids.
func TestRecordsSuite(t *testing.T) {
	for _, ids := range []string{"text", "int"} {
		t.Run(ids, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "records.db")
			t.Setenv(recordsDBEnv, path)
			t.Setenv(recordsIDsEnv, ids)
			t.Cleanup(func() {
				recordDBs.Lock()
				if db := recordDBs.m[path]; db != nil {
					db.Close()
					delete(recordDBs.m, path)
				}
				recordDBs.Unlock()
			})
			recordlocktest.Run(t, recordHarness(ids == "int"))
		})
	}
}

// ---------------------------------------------------------------------------
// Focused tests, on the driver itself.

// recordFixture is a new database file with one table of n rows (status
// "todo", rank n−i+1) and the lock columns, and a driver over it.
type recordFixture struct {
	path  string
	db    *sql.DB
	table string
	rt    *sqlite.RecordTable
}

func newRecordFixture(t *testing.T, n int, intIDs bool) *recordFixture {
	t.Helper()
	path := filepath.Join(t.TempDir(), "records.db")
	db := openRecordDB(t, recordDSN(path))
	rows := make([]recordlocktest.Row, n)
	for i := range rows {
		rows[i] = recordlocktest.Row{N: i + 1, Status: "todo", Rank: n - i, Note: fmt.Sprintf("note %d", i+1)}
	}
	if err := createRecordTable(context.Background(), db, "jobs", intIDs, rows); err != nil {
		t.Fatal(err)
	}
	rt, err := sqlite.Records(db, "jobs", nil)
	if err != nil {
		t.Fatal(err)
	}
	return &recordFixture{path: path, db: db, table: "jobs", rt: rt}
}

func (f *recordFixture) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := f.db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func openRecordDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// rowsOf returns every column of every row, the lock columns apart, as
// text.
func (f *recordFixture) userRows(t *testing.T) []string {
	t.Helper()
	rows, err := f.db.Query(`SELECT id, status, rank, note FROM jobs ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id, status, note any
		var rank any
		if err := rows.Scan(&id, &status, &rank, &note); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%v|%v|%v|%v", id, status, rank, note))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRecordsLockExtendRelease(t *testing.T) {
	ctx := context.Background()
	f := newRecordFixture(t, 3, false)
	rt, id := f.rt, "rec-000002"

	rec, found, ok, err := rt.Lock(ctx, id, "a", time.Minute)
	if err != nil || !found || !ok {
		t.Fatalf("Lock: %+v %v %v %v", rec, found, ok, err)
	}
	if rec.ID != id || rec.Owner != "a" || rec.Token != 1 || rec.Until.Sub(rec.Now) != time.Minute || !rec.Live() {
		t.Fatalf("Lock returned %+v; want owner a, token 1, until now+1m", rec)
	}
	// Stored as Unix milliseconds.
	var until int64
	if err := f.db.QueryRow(`SELECT locked_until FROM jobs WHERE id = ?`, id).Scan(&until); err != nil || until != rec.Until.UnixMilli() {
		t.Fatalf("locked_until column = %d (%v), want %d (Unix ms)", until, err, rec.Until.UnixMilli())
	}

	other, found, ok, err := rt.Lock(ctx, id, "b", time.Minute)
	if err != nil || !found || ok || other.Owner != "a" || other.Token != 1 || !other.Until.Equal(rec.Until) {
		t.Fatalf("Lock of a locked record: %+v %v %v %v; want not acquired, holder a", other, found, ok, err)
	}
	// The same owner does not get it twice either.
	if _, _, ok, err := rt.Lock(ctx, id, "a", time.Minute); err != nil || ok {
		t.Fatalf("second Lock by the holder: ok %v, %v; want refused", ok, err)
	}

	if _, found, ok, err := rt.Extend(ctx, id, "a", 2, time.Hour); err != nil || !found || ok {
		t.Fatalf("Extend with a wrong token: found %v ok %v %v", found, ok, err)
	}
	if _, found, ok, err := rt.Extend(ctx, id, "b", 1, time.Hour); err != nil || !found || ok {
		t.Fatalf("Extend by another owner: found %v ok %v %v", found, ok, err)
	}
	ext, found, ok, err := rt.Extend(ctx, id, "a", 1, time.Hour)
	if err != nil || !found || !ok || ext.Until.Sub(ext.Now) != time.Hour || ext.Token != 1 {
		t.Fatalf("Extend: %+v %v %v %v", ext, found, ok, err)
	}

	if ok, err := rt.Release(ctx, id, "b", 1); err != nil || ok {
		t.Fatalf("Release by another owner: %v %v", ok, err)
	}
	if ok, err := rt.Release(ctx, id, "a", 2); err != nil || ok {
		t.Fatalf("Release with a wrong token: %v %v", ok, err)
	}
	if ok, err := rt.Release(ctx, id, "a", 1); err != nil || !ok {
		t.Fatalf("Release: %v %v", ok, err)
	}
	if ok, err := rt.Release(ctx, id, "a", 1); err != nil || ok {
		t.Fatalf("second Release: %v %v; want false", ok, err)
	}
	got, found, err := rt.Get(ctx, id)
	if err != nil || !found || got.Owner != "" || !got.Until.IsZero() || got.Token != 1 || got.Live() {
		t.Fatalf("Get after Release: %+v %v %v; want no holder, no expiry, token 1 kept", got, found, err)
	}
	var by, untilNull sql.NullString
	if err := f.db.QueryRow(`SELECT locked_by, locked_until FROM jobs WHERE id = ?`, id).Scan(&by, &untilNull); err != nil || by.Valid || untilNull.Valid {
		t.Fatalf("after Release the columns hold %v, %v (%v); want NULL, NULL", by, untilNull, err)
	}
	if _, _, ok, err := rt.Extend(ctx, id, "a", 1, time.Hour); err != nil || ok {
		t.Fatalf("Extend after Release: %v %v; want refused", ok, err)
	}

	rec2, _, ok, err := rt.Lock(ctx, id, "b", time.Minute)
	if err != nil || !ok || rec2.Token != 2 {
		t.Fatalf("Lock after Release: %+v %v %v; want token 2", rec2, ok, err)
	}

	// An expired holding: Extend refused, Release by its holder still
	// clears it, and anyone may Lock it.
	if _, err := f.db.Exec(`UPDATE jobs SET locked_until = locked_until - 120000 WHERE id = ?`, id); err != nil {
		t.Fatal(err)
	}
	if got, _, err := rt.Get(ctx, id); err != nil || got.Live() || got.Owner != "b" {
		t.Fatalf("Get of an expired holding: %+v %v", got, err)
	}
	if _, _, ok, err := rt.Extend(ctx, id, "b", 2, time.Minute); err != nil || ok {
		t.Fatalf("Extend of an expired holding: %v %v; want refused", ok, err)
	}
	rec3, _, ok, err := rt.Lock(ctx, id, "c", time.Minute)
	if err != nil || !ok || rec3.Token != 3 || rec3.Owner != "c" {
		t.Fatalf("Lock of an expired holding: %+v %v %v", rec3, ok, err)
	}
	if _, err := f.db.Exec(`UPDATE jobs SET locked_until = locked_until - 120000 WHERE id = ?`, id); err != nil {
		t.Fatal(err)
	}
	if ok, err := rt.Release(ctx, id, "c", 3); err != nil || !ok {
		t.Fatalf("Release of an expired holding by its holder: %v %v; want true", ok, err)
	}

	// An empty holder (another program's) with a future expiry is no
	// holding: Lock takes it at once.
	f.exec(t, `UPDATE jobs SET locked_by = '', locked_until = ? WHERE id = ?`, time.Now().Add(time.Hour).UnixMilli(), id)
	if rec, _, ok, err := rt.Lock(ctx, id, "c", time.Minute); err != nil || !ok || rec.Token != 4 {
		t.Fatalf("Lock of a record with an empty holder: %+v %v %v", rec, ok, err)
	}
	if ok, err := rt.Release(ctx, id, "c", 4); err != nil || !ok {
		t.Fatal(ok, err)
	}

	// ForceRelease returns what it cleared.
	rec4, _, ok, err := rt.Lock(ctx, id, "d", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	was, found, err := rt.ForceRelease(ctx, id)
	if err != nil || !found || was.Owner != "d" || was.Token != rec4.Token || !was.Until.Equal(rec4.Until) {
		t.Fatalf("ForceRelease: %+v %v %v; want d's holding", was, found, err)
	}
	if got, _, err := rt.Get(ctx, id); err != nil || got.Owner != "" || got.Token != rec4.Token {
		t.Fatalf("after ForceRelease: %+v %v", got, err)
	}
	if ok, err := rt.Release(ctx, id, "d", rec4.Token); err != nil || ok {
		t.Fatalf("Release after ForceRelease: %v %v; want false", ok, err)
	}
	if was, found, err := rt.ForceRelease(ctx, id); err != nil || !found || was.Owner != "" {
		t.Fatalf("ForceRelease of a free record: %+v %v %v", was, found, err)
	}
	if _, found, err := rt.ForceRelease(ctx, "rec-999999"); err != nil || found {
		t.Fatalf("ForceRelease of a missing record: %v %v", found, err)
	}
}

func TestRecordsMissingIDCreatesNothing(t *testing.T) {
	ctx := context.Background()
	f := newRecordFixture(t, 3, false)
	before := f.userRows(t)
	for _, id := range []any{"rec-000004", "rec-999999", "missing"} {
		rec, found, ok, err := f.rt.Lock(ctx, id, "a", time.Minute)
		if err != nil || found || ok {
			t.Errorf("Lock(%v) of a missing record: %+v %v %v %v; want not found", id, rec, found, ok, err)
		}
		if _, found, ok, err := f.rt.Extend(ctx, id, "a", 1, time.Minute); err != nil || found || ok {
			t.Errorf("Extend(%v): %v %v %v", id, found, ok, err)
		}
		if ok, err := f.rt.Release(ctx, id, "a", 1); err != nil || ok {
			t.Errorf("Release(%v): %v %v", id, ok, err)
		}
		if _, found, err := f.rt.Get(ctx, id); err != nil || found {
			t.Errorf("Get(%v): %v %v", id, found, err)
		}
	}
	if after := f.userRows(t); !slices.Equal(before, after) {
		t.Errorf("rows changed by calls on missing ids:\nbefore %v\nafter  %v", before, after)
	}
	var n, locked int
	if err := f.db.QueryRow(`SELECT count(*), count(locked_by) FROM jobs`).Scan(&n, &locked); err != nil || n != 3 || locked != 0 {
		t.Errorf("%d rows, %d locked (%v); want 3, 0", n, locked, err)
	}
}

func TestRecordsUserColumnsUntouched(t *testing.T) {
	ctx := context.Background()
	f := newRecordFixture(t, 5, false)
	rt := f.rt
	rec, _, ok, err := rt.Lock(ctx, "rec-000001", "a", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	// Another program edits the locked row meanwhile.
	if _, err := f.db.Exec(`UPDATE jobs SET note = 'edited', status = 'busy' WHERE id = 'rec-000001'`); err != nil {
		t.Fatal(err)
	}
	before := f.userRows(t)
	if _, _, ok, err := rt.Extend(ctx, "rec-000001", "a", rec.Token, time.Hour); err != nil || !ok {
		t.Fatal(ok, err)
	}
	c, ok, err := rt.Claim(ctx, byStatus("todo"), "b", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, err := rt.Release(ctx, "rec-000001", "a", rec.Token); err != nil {
		t.Fatal(err)
	}
	if _, _, err := rt.ForceRelease(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := rt.Lock(ctx, "rec-000003", "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if after := f.userRows(t); !slices.Equal(before, after) {
		t.Errorf("user columns changed by lock calls:\nbefore %v\nafter  %v", before, after)
	}
}

func TestRecordsHostileIDsAndFilters(t *testing.T) {
	ctx := context.Background()
	for _, intIDs := range []bool{false, true} {
		f := newRecordFixture(t, 3, intIDs)
		h := recordHarness(intIDs)
		ids := append(slices.Clone(h.HostileIDs), "x' OR '1'='1", "%", "1 OR 1=1")
		for _, id := range ids {
			_, found, ok, err := f.rt.Lock(ctx, id, "a", time.Minute)
			if ok || found {
				t.Errorf("int ids %v: Lock(%#v) matched a record", intIDs, id)
			}
			if err != nil && !errors.Is(err, warden.ErrInvalidArgument) {
				t.Errorf("int ids %v: Lock(%#v): %v; want not found or ErrInvalidArgument", intIDs, id, err)
			}
		}
		for _, v := range []string{"x' OR '1'='1", "todo' OR 'a'='a", "%", "todo%", "' OR 1=1 --", "1 OR 1=1", "TODO", "todo "} {
			if rec, ok, err := f.rt.Claim(ctx, byStatus(v), "a", time.Minute); ok || err != nil {
				t.Errorf("Claim(status = %q): claimed %v (%v): the value widened the match", v, rec.ID, err)
			}
		}
		var locked int
		if err := f.db.QueryRow(`SELECT count(locked_by) FROM jobs`).Scan(&locked); err != nil || locked != 0 {
			t.Errorf("%d rows locked after hostile ids and filters (%v)", locked, err)
		}
	}
}

// TestRecordsIDKinds: ids of the wrong kind for the id column are refused
// (a string on an INTEGER column would be converted to a number), before
// and after the driver learnt the column's type.
func TestRecordsIDKinds(t *testing.T) {
	ctx := context.Background()
	fi := newRecordFixture(t, 2, true)
	if err := fi.rt.CheckID("1"); err != nil {
		t.Errorf("CheckID(\"1\") before first use: %v; the column type is not known yet", err)
	}
	if _, _, _, err := fi.rt.Lock(ctx, "1", "a", time.Minute); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Lock(\"1\") on INTEGER ids: %v; want ErrInvalidArgument", err)
	}
	if err := fi.rt.CheckID("1"); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("CheckID(\"1\") on INTEGER ids: %v; want ErrInvalidArgument", err)
	}
	for _, id := range []any{1, int8(1), int32(1), uint(1), uint64(1), int64(1)} {
		rec, _, ok, err := fi.rt.Lock(ctx, id, "a", time.Minute)
		if err != nil {
			t.Errorf("Lock(%T 1): %v", id, err)
		}
		if ok && rec.ID != int64(1) {
			t.Errorf("Lock(%T 1) returned id %#v, want int64(1)", id, rec.ID)
		}
	}
	ft := newRecordFixture(t, 2, false)
	if _, _, _, err := ft.rt.Lock(ctx, 1, "a", time.Minute); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Lock(1) on TEXT ids: %v; want ErrInvalidArgument", err)
	}
	for _, id := range []any{nil, "", 1.5, []byte("x"), true, uint64(1) << 63, strings.Repeat("x", sqlite.MaxRecordIDBytes+1), "\xff"} {
		err := ft.rt.CheckID(id)
		if !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("CheckID(%.20v): %v; want ErrInvalidArgument", id, err)
		} else if len(err.Error()) > 200 {
			t.Errorf("CheckID of a long id: message of %d bytes", len(err.Error()))
		}
	}
	// A NUMERIC column holds integers and the texts that do not look
	// like numbers, and SQLite converts a text that does when comparing:
	// the storage class must match as well as the value.
	db := openRecordDB(t, recordDSN(filepath.Join(t.TempDir(), "any.db")))
	if _, err := db.Exec(`CREATE TABLE anyid (id NUMERIC UNIQUE, v); INSERT INTO anyid (id) VALUES (1), ('two')`); err != nil {
		t.Fatal(err)
	}
	rt, err := sqlite.Records(db, "anyid", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id    any
		found bool
	}{{"1", false}, {" 1", false}, {"1.0", false}, {int64(1), true}, {"two", true}, {2, false}} {
		if _, found, _, err := rt.Lock(ctx, c.id, "a", time.Minute); err != nil || found != c.found {
			t.Errorf("NUMERIC column: Lock(%#v) found %v (%v), want %v", c.id, found, err, c.found)
		}
	}
}

// TestRecordsClaimEachOnce: 8 workers, each on its own *sql.DB (so that
// SQLite's write lock, not the process's queue, arbitrates) claim 500
// records; each is handed to exactly one.
func TestRecordsClaimEachOnce(t *testing.T) {
	ctx := context.Background()
	const n, workers = 500, 8
	f := newRecordFixture(t, n, false)
	var mu sync.Mutex
	got := map[any]int{}
	var wg sync.WaitGroup
	for w := range workers {
		db := openRecordDB(t, recordDSN(f.path))
		rt, err := sqlite.Records(db, "jobs", nil)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				rec, ok, err := rt.Claim(ctx, byStatus("todo"), fmt.Sprintf("w%d", w), time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					return
				}
				if rec.Owner != fmt.Sprintf("w%d", w) || rec.Token != 1 || !rec.Live() {
					t.Errorf("claimed %+v", rec)
				}
				mu.Lock()
				got[rec.ID]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for i := 1; i <= n; i++ {
		if c := got[recordID(false, i)]; c != 1 {
			t.Errorf("record %d claimed %d times", i, c)
		}
	}
	if len(got) != n {
		t.Errorf("%d distinct records claimed, want %d", len(got), n)
	}
}

// TestRecordsBusyRetried: in WAL mode without busy_timeout every
// contended write gets SQLITE_BUSY at once, and with the rollback journal
// readers and writers exclude each other: the driver's own retry absorbs
// SQLITE_BUSY, with every call kind running at once on separate handles.
func TestRecordsBusyRetried(t *testing.T) {
	for _, c := range []struct{ name, params, mode string }{
		{"wal-no-busy-timeout", "?_pragma=journal_mode(WAL)", "wal"},
		{"rollback-journal", "?_pragma=busy_timeout(5000)", "delete"},
	} {
		t.Run(c.name, func(t *testing.T) { busyRetried(t, c.params, c.mode) })
	}
}

func busyRetried(t *testing.T, params, mode string) {
	ctx := context.Background()
	const n, workers = 200, 6
	dsn := "file:" + filepath.Join(t.TempDir(), "plain.db") + params
	setup := openRecordDB(t, dsn)
	rows := make([]recordlocktest.Row, n)
	for i := range rows {
		rows[i] = recordlocktest.Row{N: i + 1, Status: "todo", Rank: i}
	}
	if err := createRecordTable(ctx, setup, "jobs", true, rows); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := setup.QueryRow(`PRAGMA journal_mode`).Scan(&got); err != nil || got != mode {
		t.Fatalf("journal_mode %q (%v), want %s", got, err, mode)
	}
	var mu sync.Mutex
	claims := map[any]int{}
	var wg sync.WaitGroup
	for w := range workers {
		db := openRecordDB(t, dsn)
		rt, err := sqlite.Records(db, "jobs", nil)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("w%d", w)
			for {
				rec, ok, err := rt.Claim(ctx, recordlock.SQL{}, owner, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					return
				}
				if _, _, ok, err := rt.Extend(ctx, rec.ID, owner, rec.Token, time.Minute); err != nil || !ok {
					t.Errorf("Extend: %v %v", ok, err)
				}
				if _, _, err := rt.Get(ctx, rec.ID); err != nil {
					t.Error(err)
				}
				if _, _, _, err := rt.Lock(ctx, rec.ID, owner, time.Minute); err != nil {
					t.Error(err)
				}
				if _, err := rt.List(ctx, 5); err != nil {
					t.Error(err)
				}
				mu.Lock()
				claims[rec.ID]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(claims) != n {
		t.Errorf("%d records claimed, want %d", len(claims), n)
	}
	for id, c := range claims {
		if c != 1 {
			t.Errorf("record %v claimed %d times", id, c)
		}
	}
}

// TestRecordsClaimProcesses: two processes × 4 goroutines claim 1000
// records of one file; every record is claimed once, with token 1, by the
// holder the table names (nothing is released: the claims stay).
func TestRecordsClaimProcesses(t *testing.T) {
	const n, procs, goroutines = 1000, 2, 4
	f := newRecordFixture(t, n, false)
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	var outs []*strings.Builder
	for i := range procs {
		js, _ := json.Marshal(claimChildConfig{DSN: recordDSN(f.path), Table: f.table, Dir: dir, ID: i, Goroutines: goroutines})
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), claimChildEnv+"="+string(js))
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, &out)
	}
	deadline := time.Now().Add(time.Minute)
	for ready := 0; ready < procs; {
		ready = 0
		for i := range procs {
			if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("ready-%d", i))); err == nil {
				ready++
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("children not ready")
		}
		time.Sleep(time.Millisecond)
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	got := map[string][]claimed{}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v\n%s", i, err, outs[i])
		}
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("result-%d.json", i)))
		if err != nil {
			t.Fatal(err)
		}
		var res struct {
			Claims []claimed
			Errors []string
		}
		if err := json.Unmarshal(b, &res); err != nil {
			t.Fatal(err)
		}
		for _, e := range res.Errors {
			t.Errorf("child %d: %s", i, e)
		}
		if len(res.Claims) == 0 {
			t.Errorf("child %d claimed nothing", i)
		}
		for _, c := range res.Claims {
			got[c.ID] = append(got[c.ID], c)
		}
	}
	holders := map[string]string{}
	rows, err := f.db.Query(`SELECT id, locked_by, lock_token FROM jobs`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, by string
		var tok int64
		if err := rows.Scan(&id, &by, &tok); err != nil {
			t.Fatal(err)
		}
		holders[id] = fmt.Sprintf("%s/%d", by, tok)
	}
	rows.Close()
	for i := 1; i <= n; i++ {
		id := recordID(false, i).(string)
		cs := got[id]
		if len(cs) != 1 {
			t.Errorf("record %s claimed %d times: %+v", id, len(cs), cs)
			continue
		}
		if cs[0].Token != 1 || holders[id] != cs[0].Owner+"/1" {
			t.Errorf("record %s: claimed %+v, the table says %s", id, cs[0], holders[id])
		}
	}
}

// visits counts the calls of the SQL function rl_visit(x), which returns
// true: in a Claim filter it counts the rows the claim's searches read.
var visits atomic.Int64

var registerVisit = sync.OnceValue(func() error {
	return sqlitelib.RegisterScalarFunction("rl_visit", 1, func(*sqlitelib.FunctionContext, []sqldriver.Value) (sqldriver.Value, error) {
		visits.Add(1)
		return int64(1), nil
	})
})

// TestRecordsClaimDoesNotScan: with 2 000 of 3 000 records held, a
// Claim reads a few rows, not the held ones — through the (expiry, id)
// index for the default order, through the program's (status, expiry,
// rank, id) index for its filter — and, with lapsed holdings, about as
// many rows as there are lapsed holdings.
func TestRecordsClaimDoesNotScan(t *testing.T) {
	if err := registerVisit(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n, held = 3000, 2000
	for _, c := range []struct {
		name   string
		filter recordlock.SQL
	}{
		{"default-order", recordlock.SQL{Where: "rl_visit(id)"}},
		{"status-by-rank", recordlock.SQL{Where: "status = ? AND rl_visit(id)", Args: []any{"todo"}, OrderBy: "rank, id"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newRecordFixture(t, n, true) // opened after registerVisit: has rl_visit
			for range held {
				if _, ok, err := f.rt.Claim(ctx, c.filter, "holder", time.Hour); err != nil || !ok {
					t.Fatal(ok, err)
				}
			}
			for i := range 5 {
				visits.Store(0)
				if _, ok, err := f.rt.Claim(ctx, c.filter, "probe", time.Hour); err != nil || !ok {
					t.Fatal(ok, err)
				}
				v := visits.Load()
				t.Logf("claim %d with %d of %d records held: %d rows read", i, held, n, v)
				if v > 4 {
					t.Errorf("claim %d with %d of %d records held read %d rows; want a few", i, held, n, v)
				}
			}
			// 10 lapsed holdings: each claim reads them (and takes the
			// first in order), not the live ones.
			f.exec(t, `UPDATE jobs SET locked_until = 1 WHERE id IN (SELECT id FROM jobs WHERE locked_by = 'holder' ORDER BY id DESC LIMIT 10)`)
			visits.Store(0)
			if _, ok, err := f.rt.Claim(ctx, c.filter, "probe", time.Hour); err != nil || !ok {
				t.Fatal(ok, err)
			}
			v := visits.Load()
			t.Logf("claim with 10 lapsed holdings: %d rows read", v)
			if v > 15 {
				t.Errorf("claim with 10 lapsed holdings read %d rows; want about 11", v)
			}
			// Every record held: an empty claim reads none of them.
			f.exec(t, `UPDATE jobs SET locked_by = 'holder', locked_until = 1e15`)
			visits.Store(0)
			if _, ok, err := f.rt.Claim(ctx, c.filter, "probe", time.Hour); err != nil || ok {
				t.Fatal(ok, err)
			}
			if v := visits.Load(); v > 0 {
				t.Errorf("an empty claim with every record held read %d rows; want none", v)
			}
			// A holder another program cleared, its expiry left ahead:
			// found through the partial index, not among the holdings.
			f.exec(t, `UPDATE jobs SET locked_by = NULL WHERE id = 1500`)
			f.exec(t, `UPDATE jobs SET locked_by = '' WHERE id = 2500`)
			order := []int64{1500, 2500} // by id
			if c.filter.OrderBy != "" {
				order = []int64{2500, 1500} // by rank, n − id + 1
			}
			for _, want := range order {
				visits.Store(0)
				rec, ok, err := f.rt.Claim(ctx, c.filter, "probe", time.Hour)
				if err != nil || !ok || rec.ID != want {
					t.Fatalf("claim with a cleared holder: %+v %v %v; want %d", rec, ok, err, want)
				}
				v := visits.Load()
				t.Logf("claim of a cleared holder with every other record held: %d rows read", v)
				if v > 4 {
					t.Errorf("claim of a cleared holder with every other record held read %d rows; want a few", v)
				}
			}
		})
	}
}

func TestRecordsExpiredClaimableAtOnce(t *testing.T) {
	ctx := context.Background()
	f := newRecordFixture(t, 3, false)
	rt := f.rt
	// Hold all three, then let rec-000002's holding expire (its expiry
	// set one millisecond into the past, as the clock would).
	var held []driver.RecordLock
	for range 3 {
		rec, ok, err := rt.Claim(ctx, recordlock.SQL{}, "a", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		held = append(held, rec)
	}
	if _, ok, err := rt.Claim(ctx, recordlock.SQL{}, "b", time.Minute); err != nil || ok {
		t.Fatalf("Claim with every record held: %v %v", ok, err)
	}
	if _, err := f.db.Exec(`UPDATE jobs SET locked_until = ? WHERE id = 'rec-000002'`, time.Now().UnixMilli()-1); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := rt.Claim(ctx, recordlock.SQL{}, "b", time.Minute)
	if err != nil || !ok || rec.ID != "rec-000002" || rec.Token != held[1].Token+1 || rec.Owner != "b" {
		t.Fatalf("Claim after an expiry: %+v %v %v; want rec-000002, token %d, owner b", rec, ok, err, held[1].Token+1)
	}
	// An expiry exactly at the clock is expired (locked while expiry > now).
	if _, err := f.db.Exec(`UPDATE jobs SET locked_until = ? WHERE id = 'rec-000003'`, time.Now().UnixMilli()); err != nil {
		t.Fatal(err)
	}
	if rec, ok, err := rt.Claim(ctx, recordlock.SQL{}, "c", time.Minute); err != nil || !ok || rec.ID != "rec-000003" {
		t.Fatalf("Claim of a holding expiring now: %+v %v %v", rec, ok, err)
	}
	// A holder without expiry is not a holding.
	if _, err := f.db.Exec(`UPDATE jobs SET locked_until = NULL WHERE id = 'rec-000001'`); err != nil {
		t.Fatal(err)
	}
	if rec, ok, err := rt.Claim(ctx, recordlock.SQL{}, "c", time.Minute); err != nil || !ok || rec.ID != "rec-000001" {
		t.Fatalf("Claim of a record with a holder and no expiry: %+v %v %v", rec, ok, err)
	}
}

func TestRecordsTokensIncrease(t *testing.T) {
	ctx := context.Background()
	f := newRecordFixture(t, 1, true)
	rt := f.rt
	var prev int64
	for i := range 30 {
		owner := fmt.Sprintf("o%d", i%3)
		var rec driver.RecordLock
		var ok bool
		var err error
		if i%2 == 0 {
			rec, _, ok, err = rt.Lock(ctx, 1, owner, time.Minute)
		} else {
			rec, ok, err = rt.Claim(ctx, recordlock.SQL{Where: "id = ?", Args: []any{1}}, owner, time.Minute)
		}
		if err != nil || !ok {
			t.Fatalf("round %d: %v %v", i, ok, err)
		}
		if rec.Token != prev+1 {
			t.Fatalf("round %d: token %d after %d; want one more", i, rec.Token, prev)
		}
		prev = rec.Token
		switch i % 3 {
		case 0:
			_, err = rt.Release(ctx, 1, owner, rec.Token)
		case 1:
			_, _, err = rt.ForceRelease(ctx, 1)
		case 2: // expires
			_, err = f.db.Exec(`UPDATE jobs SET locked_until = locked_until - 60000`)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestRecordsClaimFilter: the filter's ? placeholders bind to its Args,
// and its order decides; ? inside literals, quoted names and comments is
// none; the other parameter forms, a count of ? other than len(Args),
// placeholders in OrderBy, sql.NamedArg values and fragments that end
// inside a literal or comment are refused before any I/O.
func TestRecordsClaimFilter(t *testing.T) {
	ctx := context.Background()
	f := newRecordFixture(t, 6, true)
	if _, err := f.db.Exec(`UPDATE jobs SET status = 'done' WHERE id IN (2, 4)`); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		filter recordlock.SQL
		want   int64
	}{
		{recordlock.SQL{}, 1},
		{recordlock.SQL{OrderBy: "id DESC"}, 6},
		{recordlock.SQL{Where: "status = ? AND rank < ?", Args: []any{"todo", 5}}, 3},
		{recordlock.SQL{Where: "status = ? AND id <> ?", Args: []any{"done", 2}}, 4},
		{recordlock.SQL{Where: "status = ?", Args: []any{"todo"}, OrderBy: "rank"}, 6},
		{recordlock.SQL{Where: "note LIKE ? ESCAPE '!'", Args: []any{"note 5"}}, 5},
		// ? and the other parameter forms inside literals, quoted names
		// and comments are text; a trailing -- comment stays inside.
		{recordlock.SQL{Where: "status = ? AND note <> 'a?b ?1 :x @y $z #w' AND \"note\" <> 'it''s ?' /* ? :now */ AND [rank] <> -1 AND `id` <> 0 -- ? :until", Args: []any{"done"}}, 2},
		{recordlock.SQL{Where: "status <> 'x''?' AND rank = ? -- ?\n OR id = ?", Args: []any{99, 3}}, 3},
		{recordlock.SQL{Where: "status = ?", Args: []any{"todo"}, OrderBy: "CASE note WHEN 'note ?' THEN 0 ELSE 1 END /* ? */, id DESC"}, 6},
	}
	for _, c := range cases {
		rec, ok, err := f.rt.Claim(ctx, c.filter, "a", time.Minute)
		if err != nil || !ok || rec.ID != c.want {
			t.Errorf("Claim(%+v) = %v %v %v; want id %d", c.filter, rec.ID, ok, err, c.want)
			continue
		}
		if _, err := f.rt.Release(ctx, rec.ID, "a", rec.Token); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := f.rt.Claim(ctx, recordlock.SQL{Where: "no_such_column = 1"}, "a", time.Minute); err == nil {
		t.Error("Claim with a bad filter: no error")
	}
	for _, c := range []struct {
		filter recordlock.SQL
		says   string
	}{
		{recordlock.SQL{Where: "status = ? OR rank < ?", Args: []any{"todo"}}, "2 ? placeholders and there are 1 Args"},
		{recordlock.SQL{Where: "rank < ?"}, "1 ? placeholders and there are 0 Args"},
		{recordlock.SQL{Args: []any{"todo"}}, "0 ? placeholders and there are 1 Args"},
		{recordlock.SQL{Where: "status = 'todo'", Args: []any{1}}, "0 ? placeholders"},
		{recordlock.SQL{Where: "status = ?1", Args: []any{"todo"}}, `numbered parameter "?1"`},
		{recordlock.SQL{Where: "status = ? OR rank < ?3", Args: []any{"todo", 1}}, `numbered parameter "?3"`},
		{recordlock.SQL{Where: "status = :s", Args: []any{"todo"}}, `named parameter ":s"`},
		{recordlock.SQL{Where: "rank < :now"}, `named parameter ":now"`},
		{recordlock.SQL{Where: "status = @s", Args: []any{"todo"}}, `named parameter "@s"`},
		{recordlock.SQL{Where: "status = $s", Args: []any{"todo"}}, `named parameter "$s"`},
		{recordlock.SQL{Where: "status = #s", Args: []any{"todo"}}, `named parameter "#s"`},
		{recordlock.SQL{Where: "status = ?", Args: []any{sql.Named("s", "todo")}}, "sql.NamedArg"},
		{recordlock.SQL{Where: "status = ?", Args: []any{&sql.NamedArg{Name: "now", Value: 1}}}, "sql.NamedArg"},
		{recordlock.SQL{Where: "status = ?", Args: []any{"todo"}, OrderBy: "rank < ?"}, "OrderBy has 1 ?"},
		{recordlock.SQL{Where: "status = ?", Args: []any{"todo"}, OrderBy: "rank, :now"}, "OrderBy"},
		{recordlock.SQL{Where: "status = ?", Args: []any{"todo"}, OrderBy: "rank -- the order"}, "runs to the end"},
		{recordlock.SQL{Where: "status = 'todo) OR (1", Args: nil}, "unterminated string literal"},
		{recordlock.SQL{Where: "status = ? /* ", Args: []any{"todo"}}, "unterminated /* comment"},
		{recordlock.SQL{Where: `"status = ?`, Args: []any{"todo"}}, "unterminated quoted identifier"},
		{recordlock.SQL{Where: "[status = ?", Args: []any{"todo"}}, "unterminated quoted identifier"},
		{recordlock.SQL{Where: "`status", Args: nil}, "unterminated quoted identifier"},
	} {
		_, ok, err := f.rt.Claim(ctx, c.filter, "a", time.Minute)
		if ok || !errors.Is(err, warden.ErrInvalidArgument) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Claim(%+v) = %v, %v; want ErrInvalidArgument saying %q", c.filter, ok, err, c.says)
		}
	}
	var locked int
	if err := f.db.QueryRow(`SELECT count(locked_by) FROM jobs`).Scan(&locked); err != nil || locked != 0 {
		t.Errorf("%d rows locked after the refused filters (%v)", locked, err)
	}
}

func TestRecordsList(t *testing.T) {
	ctx := context.Background()
	f := newRecordFixture(t, 5, true)
	for _, id := range []int{4, 2, 5} {
		if _, _, ok, err := f.rt.Lock(ctx, id, "a", time.Minute); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	if _, err := f.db.Exec(`UPDATE jobs SET locked_until = 1 WHERE id = 5`); err != nil {
		t.Fatal(err)
	}
	got, err := f.rt.List(ctx, 10)
	if err != nil || len(got) != 2 || got[0].ID != int64(2) || got[1].ID != int64(4) || !got[0].Live() {
		t.Fatalf("List = %+v, %v; want the live holdings 2 and 4, in id order", got, err)
	}
	if got, err := f.rt.List(ctx, 1); err != nil || len(got) != 1 {
		t.Fatalf("List(1) = %+v, %v", got, err)
	}
	if _, err := f.rt.List(ctx, 0); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("List(0): %v", err)
	}
}

func TestRecordsMigrate(t *testing.T) {
	ctx := context.Background()
	db := openRecordDB(t, recordDSN(filepath.Join(t.TempDir(), "m.db")))
	if _, err := db.Exec(`CREATE TABLE jobs (id INTEGER PRIMARY KEY, name TEXT NOT NULL DEFAULT 'x');
		INSERT INTO jobs (id, name) VALUES (1, 'one'), (2, 'two')`); err != nil {
		t.Fatal(err)
	}
	rt, err := sqlite.Records(db, "jobs", &sqlite.RecordOptions{UntilColumn: "lease_until", OwnerColumn: "lease_by", TokenColumn: "lease_token"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := rt.Lock(ctx, 1, "a", time.Minute); err == nil || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Lock before Migrate: %v; want an error that says to migrate", err)
	}
	// Several at once, as processes starting together would.
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rt.Migrate(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if err := rt.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var cols []string
	rows, err := db.Query(`SELECT name || ' ' || type || ' ' || "notnull" || ' ' || coalesce(dflt_value, 'NULL') FROM pragma_table_info('jobs') ORDER BY cid`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		cols = append(cols, c)
	}
	rows.Close()
	want := []string{"id INTEGER 0 NULL", "name TEXT 1 'x'", "lease_until INTEGER 0 NULL", "lease_by TEXT 0 NULL", "lease_token INTEGER 0 NULL"}
	if !slices.Equal(cols, want) {
		t.Errorf("columns after Migrate: %q, want %q", cols, want)
	}
	var idx []string
	rows, err = db.Query(`SELECT il.name || ' ' || il.partial || ' ' || (SELECT group_concat(name) FROM pragma_index_info(il.name))
FROM pragma_index_list('jobs') il ORDER BY il.name`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		idx = append(idx, c)
	}
	rows.Close()
	// The (expiry, id) index, and the partial index of the rows whose
	// holder another program cleared while leaving an expiry.
	if want := []string{"jobs_lease_by_cleared_idx 1 lease_until", "jobs_lease_until_idx 0 lease_until,id"}; !slices.Equal(idx, want) {
		t.Errorf("indexes after Migrate: %q, want %q", idx, want)
	}
	if rec, _, ok, err := rt.Lock(ctx, 1, "a", time.Minute); err != nil || !ok || rec.Token != 1 {
		t.Fatalf("Lock after Migrate: %+v %v %v", rec, ok, err)
	}

	// Migration's statements do the same by hand.
	db2 := openRecordDB(t, recordDSN(filepath.Join(t.TempDir(), "m2.db")))
	if _, err := db2.Exec(`CREATE TABLE jobs (id TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	rt2, err := sqlite.Records(db2, "jobs", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db2.Exec(rt2.Migration()); err != nil {
		t.Fatalf("running Migration():\n%s\n%v", rt2.Migration(), err)
	}
	if err := rt2.Migrate(ctx); err != nil {
		t.Fatalf("Migrate after Migration(): %v", err)
	}
	if _, err := db2.Exec(`INSERT INTO jobs (id) VALUES ('a')`); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := rt2.Lock(ctx, "a", "o", time.Minute); err != nil || !ok {
		t.Fatalf("Lock after Migration(): %v %v", ok, err)
	}
}

func TestRecordsTableChecks(t *testing.T) {
	ctx := context.Background()
	db := openRecordDB(t, recordDSN(filepath.Join(t.TempDir(), "c.db")))
	if _, err := db.Exec(`CREATE TABLE dup (id TEXT, locked_until INTEGER, locked_by TEXT, lock_token INTEGER);
		CREATE TABLE uniq (k INTEGER PRIMARY KEY, id TEXT, locked_until INTEGER, locked_by TEXT, lock_token INTEGER);
		CREATE UNIQUE INDEX uniq_id ON uniq (id);
		CREATE TABLE pair (a TEXT, id TEXT, locked_until INTEGER, locked_by TEXT, lock_token INTEGER, PRIMARY KEY (a, id));
		INSERT INTO uniq (id) VALUES ('x')`); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"dup", "pair"} {
		rt, err := sqlite.Records(db, table, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, _, err := rt.Lock(ctx, "x", "a", time.Minute); err == nil || !strings.Contains(err.Error(), "not unique") {
			t.Errorf("%s: Lock: %v; want an error about the id column not being unique", table, err)
		}
	}
	rt, err := sqlite.Records(db, "uniq", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := rt.Lock(ctx, "x", "a", time.Minute); err != nil || !ok {
		t.Errorf("a unique index on the id column: Lock: %v %v", ok, err)
	}
	rt, err = sqlite.Records(db, "nosuch", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := rt.Get(ctx, "x"); err == nil {
		t.Error("Get on a missing table: no error")
	}
	for _, c := range []struct {
		table string
		opts  *sqlite.RecordOptions
	}{
		{"jobs; DROP TABLE uniq", nil},
		{`"jobs"`, nil},
		{"sqlite_master", nil},
		{"", nil},
		{"jobs", &sqlite.RecordOptions{IDColumn: "id) OR (1"}},
		{"jobs", &sqlite.RecordOptions{UntilColumn: "a b"}},
		{"jobs", &sqlite.RecordOptions{OwnerColumn: "locked_until"}},
		{"jobs", &sqlite.RecordOptions{BusyTimeout: -1}},
	} {
		if _, err := sqlite.Records(db, c.table, c.opts); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Records(%q, %+v): %v; want ErrInvalidArgument", c.table, c.opts, err)
		}
	}
	if _, err := sqlite.Records(nil, "jobs", nil); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Records(nil db): %v", err)
	}
}
