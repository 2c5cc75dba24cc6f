package mysql_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/recordlock"
	"github.com/warden-go/warden/recordlock/recordlocktest"
	"github.com/warden-go/warden/store/mysql"
)

// The record-lock harness works in child processes too: it reaches the
// server through WARDEN_TEST_MYSQL_URL and finds the id type in the
// environment, which the parent test sets before running the suite.
const recordsIDsEnv = "WARDEN_TEST_MYSQL_RECORDS_IDS" // "int" or "text"

// recordConfig is the go-sql-driver configuration of the test server as a
// program would write it: none of the settings warden's store makes
// (no parseTime, clientFoundRows, interpolateParams or time zone).
func recordConfig() (*mysqldrv.Config, error) {
	raw := os.Getenv("WARDEN_TEST_MYSQL_URL")
	if raw == "" {
		return nil, errors.New("WARDEN_TEST_MYSQL_URL is not set")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	cfg := mysqldrv.NewConfig()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.TrimPrefix(u.Path, "/")
	if u.Port() == "" {
		cfg.Addr += ":3306"
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	return cfg, nil
}

var recordDB struct {
	sync.Mutex
	db *sql.DB
}

// recordsDB returns the process's handle on the test server.
func recordsDB() (*sql.DB, error) {
	recordDB.Lock()
	defer recordDB.Unlock()
	if recordDB.db != nil {
		return recordDB.db, nil
	}
	cfg, err := recordConfig()
	if err != nil {
		return nil, err
	}
	conn, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	recordDB.db = sql.OpenDB(conn)
	recordDB.db.SetMaxIdleConns(32)
	return recordDB.db, nil
}

// createRecordTable makes a program's table of rows, as the program
// would, then adds the lock columns with Migrate and the index its claims
// by status need. String ids are compared
// byte for byte (utf8mb4_bin); integer ids are an AUTO_INCREMENT key.
func createRecordTable(ctx context.Context, db *sql.DB, name string, intIDs bool, rows []recordlocktest.Row) error {
	idDecl := "id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY"
	if intIDs {
		idDecl = "id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY"
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+name+` (`+idDecl+`, status VARCHAR(32) NOT NULL, `+"`rank`"+` INT NOT NULL, note TEXT NOT NULL) ENGINE=InnoDB`); err != nil {
		return err
	}
	for len(rows) > 0 {
		chunk := rows[:min(len(rows), 500)]
		rows = rows[len(chunk):]
		q := `INSERT INTO ` + name + ` (id, status, ` + "`rank`" + `, note) VALUES ` + strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?),", len(chunk)), ",")
		var args []any
		for _, r := range chunk {
			args = append(args, recordID(intIDs, r.N), r.Status, r.Rank, r.Note)
		}
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			return err
		}
	}
	rt, err := mysql.Records(db, name, nil)
	if err != nil {
		return err
	}
	if err := rt.Migrate(ctx); err != nil {
		return err
	}
	// The program's index for its claims by status in rank order: the
	// filter's column, the expiry, the order's columns.
	_, err = db.ExecContext(ctx, `CREATE INDEX by_status ON `+name+` (status, locked_until, `+"`rank`"+`, id)`)
	return err
}

func recordID(intIDs bool, n int) any {
	if intIDs {
		return int64(n)
	}
	return fmt.Sprintf("rec-%06d", n)
}

func byStatus(status string) recordlock.SQL {
	return recordlock.SQL{Where: "status = ?", Args: []any{status}, OrderBy: "`rank`, id"}
}

// recordHarness is the suite's harness on the test server, with string or
// integer ids.
func recordHarness(intIDs bool) recordlocktest.Harness[recordlock.SQL] {
	name := "mysql-string-ids"
	// 0 would equal every string id that does not start with a digit,
	// were it compared with the string column.
	hostile := []any{"x' OR '1'='1", "%", "1 OR 1=1", "rec-%", "rec-00000_", "rec-*", "*", "rec-000001' -- ",
		"REC-000001", int64(0), 0, 1, []byte("rec-000001"), 1.0}
	if intIDs {
		name = "mysql-int-ids"
		// Each equals 1 (or 0) to MySQL when compared with an integer.
		hostile = []any{"1", " 1", "1.0", "1e0", "1 OR 1=1", "1abc", "x' OR '1'='1", "%", "*", "0x1", 1.0, int64(1) << 40, -1}
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
			_, err = db.ExecContext(ctx, `DROP TABLE IF EXISTS `+table)
			return err
		},
		Open: func(_ context.Context, table string) (driver.Records[recordlock.SQL], func(), error) {
			db, err := recordsDB()
			if err != nil {
				return nil, nil, err
			}
			rt, err := mysql.Records(db, table, nil)
			return rt, func() {}, err
		},
		ID: func(n int) any { return recordID(intIDs, n) },
		Read: func(ctx context.Context, table string, id any) (recordlocktest.Row, bool, error) {
			db, err := recordsDB()
			if err != nil {
				return recordlocktest.Row{}, false, err
			}
			var r recordlocktest.Row
			err = db.QueryRowContext(ctx, `SELECT status, `+"`rank`"+`, note FROM `+table+` WHERE id = ?`, id).Scan(&r.Status, &r.Rank, &r.Note)
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
			err = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+table).Scan(&n)
			return n, err
		},
		ByStatus:   byStatus,
		HostileIDs: hostile,
	}
}

// recordsChild runs this process as a child of a multi-process record
// check if one started it so (TestMain calls it first); otherwise it
// returns at once.
func recordsChild() {
	if cfg, ok := os.LookupEnv(claimChildEnv); ok {
		os.Exit(runClaimChild(cfg))
	}
	recordlocktest.Child(recordHarness(os.Getenv(recordsIDsEnv) == "int"))
}

// TestRecordsSuite runs recordlock's conformance suite (goroutines and
// two child processes) with string and with integer ids.
func TestRecordsSuite(t *testing.T) {
	serverURL(t, "")
	for _, ids := range []string{"text", "int"} {
		t.Run(ids, func(t *testing.T) {
			t.Setenv(recordsIDsEnv, ids)
			recordlocktest.Run(t, recordHarness(ids == "int"))
		})
	}
}

// ---------------------------------------------------------------------------
// Focused tests, on the driver itself.

type recordFixture struct {
	db    *sql.DB
	table string
	rt    *mysql.RecordTable
}

// testDB opens a handle on the test server; edit adjusts the
// configuration.
func testDB(t *testing.T, edit func(*mysqldrv.Config)) *sql.DB {
	t.Helper()
	serverURL(t, "")
	cfg, err := recordConfig()
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(cfg)
	}
	conn, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { db.Close() })
	return db
}

func tableName(prefix string) string {
	var b [4]byte
	_, _ = crand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// newRecordFixture makes a table of n rows (status "todo", rank n−i+1,
// note "note i") with the lock columns, dropped when the test ends.
func newRecordFixture(t *testing.T, db *sql.DB, n int, intIDs bool) *recordFixture {
	t.Helper()
	if db == nil {
		db = testDB(t, nil)
	}
	name := tableName("rlt_")
	rows := make([]recordlocktest.Row, n)
	for i := range rows {
		rows[i] = recordlocktest.Row{N: i + 1, Status: "todo", Rank: n - i, Note: fmt.Sprintf("note %d", i+1)}
	}
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + name) })
	if err := createRecordTable(context.Background(), db, name, intIDs, rows); err != nil {
		t.Fatal(err)
	}
	rt, err := mysql.Records(db, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &recordFixture{db: db, table: name, rt: rt}
}

func (f *recordFixture) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := f.db.Exec(strings.ReplaceAll(q, "{T}", f.table), args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// userRows returns every user column of every row, as text.
func (f *recordFixture) userRows(t *testing.T) []string {
	t.Helper()
	rows, err := f.db.Query(`SELECT CONCAT_WS('|', id, status, ` + "`rank`" + `, note) FROM ` + f.table + ` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRecordsLockExtendRelease runs the call semantics on handles
// configured in several ways: the statements must not depend on
// parseTime, clientFoundRows, interpolateParams, the session time zone,
// or on getting a fresh connection (LAST_INSERT_ID of an earlier
// statement on the same connection must not count).
func TestRecordsLockExtendRelease(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*mysqldrv.Config)
		one  bool
	}{
		{"plain", nil, false},
		{"one-connection", nil, true},
		{"store-like", func(c *mysqldrv.Config) {
			c.ParseTime, c.ClientFoundRows, c.InterpolateParams = true, true, true
			c.Params = map[string]string{"time_zone": "'+05:00'"}
		}, true},
		{"local-time-zone", func(c *mysqldrv.Config) {
			c.Params = map[string]string{"time_zone": "'-09:30'", "sql_mode": "''"}
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			db := testDB(t, c.edit)
			if c.one {
				db.SetMaxOpenConns(1)
			}
			lockExtendRelease(t, newRecordFixture(t, db, 3, false))
		})
	}
}

func lockExtendRelease(t *testing.T, f *recordFixture) {
	ctx := context.Background()
	rt, id := f.rt, "rec-000002"

	rec, found, ok, err := rt.Lock(ctx, id, "a", time.Minute)
	if err != nil || !found || !ok {
		t.Fatalf("Lock: %+v %v %v %v", rec, found, ok, err)
	}
	if rec.ID != id || rec.Owner != "a" || rec.Token != 1 || rec.Until.Sub(rec.Now) != time.Minute || !rec.Live() {
		t.Fatalf("Lock returned %+v; want owner a, token 1, until now+1m", rec)
	}
	// Stored in UTC, decided by the database's clock.
	var storedMs, skewMs int64
	err = f.db.QueryRow(`SELECT TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', locked_until) DIV 1000,
		TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(3), locked_until) DIV 1000 FROM `+f.table+` WHERE id = ?`, id).Scan(&storedMs, &skewMs)
	if err != nil || storedMs != rec.Until.UnixMilli() || skewMs > 60_000 || skewMs < 50_000 {
		t.Fatalf("locked_until = %d ms, %d ms after UTC_TIMESTAMP (%v); want %d, about a minute", storedMs, skewMs, err, rec.Until.UnixMilli())
	}

	other, found, ok, err := rt.Lock(ctx, id, "b", time.Minute)
	if err != nil || !found || ok || other.Owner != "a" || other.Token != 1 || !other.Until.Equal(rec.Until) {
		t.Fatalf("Lock of a locked record: %+v %v %v %v; want not acquired, holder a", other, found, ok, err)
	}
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
	// The same expiry again (same millisecond or not): still reported.
	if _, _, ok, err := rt.Extend(ctx, id, "a", 1, time.Hour); err != nil || !ok {
		t.Fatalf("second Extend: %v %v", ok, err)
	}
	// A refused Extend right after a granted one, on the same connection
	// when the pool has one: LAST_INSERT_ID must not carry over.
	if _, _, ok, err := rt.Extend(ctx, id, "a", 7, time.Hour); err != nil || ok {
		t.Fatalf("Extend with a wrong token after a granted one: %v %v; want refused", ok, err)
	}
	if got, _, err := rt.Get(ctx, id); err != nil || got.Owner != "a" || got.Token != 1 || got.Until.Sub(got.Now) < 59*time.Minute {
		t.Fatalf("Get after Extend: %+v %v", got, err)
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
	var nulls int
	if err := f.db.QueryRow(`SELECT (locked_by IS NULL) + (locked_until IS NULL) FROM `+f.table+` WHERE id = ?`, id).Scan(&nulls); err != nil || nulls != 2 {
		t.Fatalf("after Release: %d of holder and expiry NULL (%v), want 2", nulls, err)
	}
	if _, _, ok, err := rt.Extend(ctx, id, "a", 1, time.Hour); err != nil || ok {
		t.Fatalf("Extend after Release: %v %v; want refused", ok, err)
	}

	rec2, _, ok, err := rt.Lock(ctx, id, "b", time.Minute)
	if err != nil || !ok || rec2.Token != 2 {
		t.Fatalf("Lock after Release: %+v %v %v; want token 2", rec2, ok, err)
	}

	// An expired holding: Extend refused, anyone may Lock it, and its
	// holder's Release still clears it.
	f.exec(t, `UPDATE {T} SET locked_until = locked_until - INTERVAL 2 MINUTE WHERE id = ?`, id)
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
	f.exec(t, `UPDATE {T} SET locked_until = locked_until - INTERVAL 2 MINUTE WHERE id = ?`, id)
	if ok, err := rt.Release(ctx, id, "c", 3); err != nil || !ok {
		t.Fatalf("Release of an expired holding by its holder: %v %v; want true", ok, err)
	}

	// An empty holder (another program's) with a future expiry is no
	// holding: Lock takes it at once.
	f.exec(t, `UPDATE {T} SET locked_by = '', locked_until = UTC_TIMESTAMP(3) + INTERVAL 1 HOUR WHERE id = ?`, id)
	if rec, _, ok, err := rt.Lock(ctx, id, "c", time.Minute); err != nil || !ok || rec.Token != 4 {
		t.Fatalf("Lock of a record with an empty holder: %+v %v %v", rec, ok, err)
	}
	if ok, err := rt.Release(ctx, id, "c", 4); err != nil || !ok {
		t.Fatal(ok, err)
	}

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
	for _, intIDs := range []bool{false, true} {
		f := newRecordFixture(t, nil, 3, intIDs)
		before := f.userRows(t)
		for _, n := range []int{4, 999999, 0} {
			id := recordID(intIDs, n)
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
		if err := f.db.QueryRow(`SELECT COUNT(*), COUNT(locked_by) FROM `+f.table).Scan(&n, &locked); err != nil || n != 3 || locked != 0 {
			t.Errorf("%d rows, %d locked (%v); want 3, 0", n, locked, err)
		}
	}
}

// TestRecordsUserColumnsUntouched: lock calls change nothing but the lock
// columns, not even a column MySQL would update by itself (ON UPDATE
// CURRENT_TIMESTAMP).
func TestRecordsUserColumnsUntouched(t *testing.T) {
	ctx := context.Background()
	f := newRecordFixture(t, nil, 5, false)
	f.exec(t, `ALTER TABLE {T} ADD COLUMN changed DATETIME(6) NOT NULL DEFAULT '2000-01-01 00:00:00' ON UPDATE CURRENT_TIMESTAMP(6)`)
	rt, err := mysql.Records(f.db, f.table, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec, _, ok, err := rt.Lock(ctx, "rec-000001", "a", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	// Another program edits the locked row meanwhile.
	f.exec(t, `UPDATE {T} SET note = 'edited', status = 'busy', changed = '2001-01-01 00:00:00' WHERE id = 'rec-000001'`)
	snapshot := func() []string {
		rows, err := f.db.Query(`SELECT CONCAT_WS('|', id, status, ` + "`rank`" + `, note, changed) FROM ` + f.table + ` ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		return out
	}
	before := snapshot()
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
	if after := snapshot(); !slices.Equal(before, after) {
		t.Errorf("user columns changed by lock calls:\nbefore %v\nafter  %v", before, after)
	}
}

func TestRecordsHostileIDsAndFilters(t *testing.T) {
	ctx := context.Background()
	for _, intIDs := range []bool{false, true} {
		f := newRecordFixture(t, nil, 3, intIDs)
		h := recordHarness(intIDs)
		for _, id := range h.HostileIDs {
			_, found, ok, err := f.rt.Lock(ctx, id, "a", time.Minute)
			if ok || found {
				t.Errorf("int ids %v: Lock(%#v) matched a record", intIDs, id)
			}
			if err != nil && !errors.Is(err, warden.ErrInvalidArgument) {
				t.Errorf("int ids %v: Lock(%#v): %v; want not found or ErrInvalidArgument", intIDs, id, err)
			}
		}
		for _, v := range []string{"x' OR '1'='1", "todo' OR 'a'='a", "%", "todo%", "' OR 1=1 -- ", "1 OR 1=1", "todo\\", "todo\x00"} {
			if rec, ok, err := f.rt.Claim(ctx, byStatus(v), "a", time.Minute); ok || err != nil {
				t.Errorf("Claim(status = %q): claimed %v (%v): the value widened the match", v, rec.ID, err)
			}
		}
		// A number compared with the status column would be compared as
		// a number: the filter's own values are the program's to type.
		var locked int
		if err := f.db.QueryRow(`SELECT COUNT(locked_by) FROM ` + f.table).Scan(&locked); err != nil || locked != 0 {
			t.Errorf("%d rows locked after hostile ids and filters (%v)", locked, err)
		}
	}
}

// TestRecordsIDKinds: an id of the other kind than the id column is
// refused, before MySQL could convert it to compare.
func TestRecordsIDKinds(t *testing.T) {
	ctx := context.Background()
	fi := newRecordFixture(t, nil, 2, true)
	if _, _, _, err := fi.rt.Lock(ctx, "1", "a", time.Minute); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Lock(\"1\") on integer ids: %v; want ErrInvalidArgument", err)
	}
	if err := fi.rt.CheckID("1"); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("CheckID(\"1\") on integer ids after first use: %v; want ErrInvalidArgument", err)
	}
	for _, id := range []any{1, int8(1), int32(1), uint(1), uint64(1), int64(1)} {
		rec, found, _, err := fi.rt.Lock(ctx, id, "a", time.Minute)
		if err != nil || !found || rec.ID != int64(1) {
			t.Errorf("Lock(%T 1): %+v %v %v", id, rec, found, err)
		}
	}
	ft := newRecordFixture(t, nil, 2, false)
	if err := ft.rt.CheckID(0); err != nil {
		t.Errorf("CheckID(0) before first use: %v; the column type is not known yet", err)
	}
	if _, _, _, err := ft.rt.Lock(ctx, 0, "a", time.Minute); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Lock(0) on string ids: %v; want ErrInvalidArgument", err)
	}
	for _, id := range []any{nil, "", 1.5, []byte("x"), true, uint64(1) << 63, strings.Repeat("x", mysql.MaxRecordIDBytes+1), "\xff"} {
		err := ft.rt.CheckID(id)
		if !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("CheckID(%.20v): %v; want ErrInvalidArgument", id, err)
		} else if len(err.Error()) > 250 {
			t.Errorf("CheckID of a long id: message of %d bytes", len(err.Error()))
		}
	}
}

// TestRecordsClaimEachOnce: 8 workers claim 500 records; each is handed
// to exactly one.
func TestRecordsClaimEachOnce(t *testing.T) {
	ctx := context.Background()
	const n, workers = 500, 8
	f := newRecordFixture(t, nil, n, false)
	var mu sync.Mutex
	got := map[any]int{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("w%d", w)
			for {
				rec, ok, err := f.rt.Claim(ctx, byStatus("todo"), owner, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					return
				}
				if rec.Owner != owner || rec.Token != 1 || !rec.Live() || rec.Until.Sub(rec.Now) != time.Minute {
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

// TestRecordsClaimBesideLocks: claims, locks, extensions and releases on
// the same records at once never give one record to two holders at once.
func TestRecordsClaimBesideLocks(t *testing.T) {
	ctx := context.Background()
	const n = 20
	f := newRecordFixture(t, nil, n, true)
	var holders [n + 1]atomic.Int32
	var overlaps atomic.Int32
	var wg sync.WaitGroup
	stop := time.Now().Add(3 * time.Second)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("w%d", w)
			for i := 0; time.Now().Before(stop); i++ {
				var rec driver.RecordLock
				var ok bool
				var err error
				if w%2 == 0 {
					rec, ok, err = f.rt.Claim(ctx, recordlock.SQL{}, owner, time.Minute)
				} else {
					rec, _, ok, err = f.rt.Lock(ctx, int64(1+(i*7+w)%n), owner, time.Minute)
				}
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					continue
				}
				id := rec.ID.(int64)
				if holders[id].Add(1) != 1 {
					overlaps.Add(1)
				}
				if _, _, ok, err := f.rt.Extend(ctx, id, owner, rec.Token, time.Minute); err != nil || !ok {
					t.Errorf("Extend: %v %v", ok, err)
				}
				holders[id].Add(-1)
				if ok, err := f.rt.Release(ctx, id, owner, rec.Token); err != nil || !ok {
					t.Errorf("Release: %v %v", ok, err)
				}
			}
		}()
	}
	wg.Wait()
	if overlaps.Load() != 0 {
		t.Errorf("%d times a record had two holders", overlaps.Load())
	}
}

// handlerReads returns the rows the session has read so far (the
// Handler_read_* counters).
func handlerReads(t *testing.T, conn *sql.Conn) int64 {
	t.Helper()
	rows, err := conn.QueryContext(context.Background(), `SHOW SESSION STATUS LIKE 'Handler_read%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var sum int64
	for rows.Next() {
		var name string
		var v int64
		if err := rows.Scan(&name, &v); err != nil {
			t.Fatal(err)
		}
		sum += v
	}
	return sum
}

// TestRecordsClaimDoesNotScan: with 2 000 of 3 000 records held, a
// Claim reads a few rows (InnoDB's handler counters), not the held ones —
// through the (expiry, id) index for the default order, through the
// program's (status, expiry, rank, id) index for its filter — and, with
// lapsed holdings, about as many rows as there are lapsed holdings.
func TestRecordsClaimDoesNotScan(t *testing.T) {
	ctx := context.Background()
	const n, held = 3000, 2000
	for _, c := range []struct {
		name   string
		filter recordlock.SQL
	}{
		{"default-order", recordlock.SQL{}},
		{"status-by-rank", byStatus("todo")},
	} {
		t.Run(c.name, func(t *testing.T) {
			db := testDB(t, nil)
			db.SetMaxOpenConns(1)
			f := newRecordFixture(t, db, n, true)
			for range held {
				if _, ok, err := f.rt.Claim(ctx, c.filter, "holder", time.Hour); err != nil || !ok {
					t.Fatal(ok, err)
				}
			}
			if _, err := db.Exec(`ANALYZE TABLE ` + f.table); err != nil {
				t.Fatal(err)
			}
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			base := handlerReads(t, conn)
			base = handlerReads(t, conn) - base // what reading the counters reads
			conn.Close()
			reads := func() int64 {
				conn, err := db.Conn(ctx) // the only connection: the claim's
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				return handlerReads(t, conn)
			}
			for i := range 5 {
				before := reads()
				if _, ok, err := f.rt.Claim(ctx, c.filter, "probe", time.Hour); err != nil || !ok {
					t.Fatal(ok, err)
				}
				v := reads() - before - base
				t.Logf("claim %d with %d of %d records held: %d rows read", i, held, n, v)
				if v > 12 {
					t.Errorf("claim %d with %d of %d records held read %d rows; want a few", i, held, n, v)
				}
			}
			f.exec(t, `UPDATE {T} SET locked_until = '2001-01-01' WHERE locked_by = 'holder' ORDER BY id DESC LIMIT 10`)
			before := reads()
			if _, ok, err := f.rt.Claim(ctx, c.filter, "probe", time.Hour); err != nil || !ok {
				t.Fatal(ok, err)
			}
			v := reads() - before - base
			t.Logf("claim with 10 lapsed holdings: %d rows read", v)
			if v > 30 {
				t.Errorf("claim with 10 lapsed holdings read %d rows; want about a dozen", v)
			}
		})
	}
}

func TestRecordsExpiredClaimableAtOnce(t *testing.T) {
	ctx := context.Background()
	f := newRecordFixture(t, nil, 3, false)
	rt := f.rt
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
	f.exec(t, `UPDATE {T} SET locked_until = UTC_TIMESTAMP(3) - INTERVAL 1000 MICROSECOND WHERE id = 'rec-000002'`)
	rec, ok, err := rt.Claim(ctx, recordlock.SQL{}, "b", time.Minute)
	if err != nil || !ok || rec.ID != "rec-000002" || rec.Token != held[1].Token+1 || rec.Owner != "b" {
		t.Fatalf("Claim after an expiry: %+v %v %v; want rec-000002, token %d, owner b", rec, ok, err, held[1].Token+1)
	}
	// A holder without expiry is not a holding.
	f.exec(t, `UPDATE {T} SET locked_until = NULL WHERE id = 'rec-000001'`)
	if rec, ok, err := rt.Claim(ctx, recordlock.SQL{}, "c", time.Minute); err != nil || !ok || rec.ID != "rec-000001" {
		t.Fatalf("Claim of a record with a holder and no expiry: %+v %v %v", rec, ok, err)
	}
	f.exec(t, `UPDATE {T} SET locked_until = UTC_TIMESTAMP(3) - INTERVAL 1000 MICROSECOND WHERE id = 'rec-000003'`)
	if rec, _, ok, err := rt.Lock(ctx, "rec-000003", "c", time.Minute); err != nil || !ok || rec.Token != held[2].Token+1 {
		t.Fatalf("Lock of an expired holding: %+v %v %v", rec, ok, err)
	}
}

func TestRecordsTokensIncrease(t *testing.T) {
	ctx := context.Background()
	f := newRecordFixture(t, nil, 1, true)
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
			_, err = f.db.Exec(`UPDATE ` + f.table + ` SET locked_until = locked_until - INTERVAL 1 HOUR`)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestRecordsClaimFilter(t *testing.T) {
	ctx := context.Background()
	f := newRecordFixture(t, nil, 6, true)
	f.exec(t, `UPDATE {T} SET status = 'done' WHERE id IN (2, 4)`)
	cases := []struct {
		filter recordlock.SQL
		want   int64
	}{
		{recordlock.SQL{}, 1},
		{recordlock.SQL{OrderBy: "id DESC"}, 6},
		{recordlock.SQL{Where: "status = ? AND `rank` < ?", Args: []any{"todo", 5}}, 3},
		{recordlock.SQL{Where: "status = ? AND id <> ?", Args: []any{"done", 2}}, 4},
		{recordlock.SQL{Where: "status = ?", Args: []any{"todo"}, OrderBy: "`rank`"}, 6},
		{recordlock.SQL{Where: "note LIKE ?", Args: []any{"note 5"}}, 5},
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
}

func TestRecordsList(t *testing.T) {
	ctx := context.Background()
	f := newRecordFixture(t, nil, 5, true)
	for _, id := range []int{4, 2, 5} {
		if _, _, ok, err := f.rt.Lock(ctx, id, "a", time.Minute); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	f.exec(t, `UPDATE {T} SET locked_until = '2001-01-01' WHERE id = 5`)
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

// TestRecordsRoundTrips documents and checks the round trips of each call
// (interpolateParams=true; without it each statement with arguments also
// prepares).
func TestRecordsRoundTrips(t *testing.T) {
	serverURL(t, "")
	ctx := context.Background()
	cfg, err := recordConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.InterpolateParams = true
	inner, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := new(atomic.Int64)
	db := sql.OpenDB(countingConnector{inner, n})
	t.Cleanup(func() { db.Close() })
	f := newRecordFixture(t, db, 3, false)
	rt := f.rt
	if _, _, err := rt.Get(ctx, "rec-000001"); err != nil { // the first call checks the table
		t.Fatal(err)
	}
	count := func(name string, want int64, fn func() error) {
		t.Helper()
		n.Store(0)
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := n.Load(); got != want {
			t.Errorf("%s: %d round trips, want %d", name, got, want)
		}
	}
	var rec driver.RecordLock
	count("Lock (free)", 2, func() (err error) { rec, _, _, err = rt.Lock(ctx, "rec-000001", "a", time.Minute); return })
	count("Lock (locked)", 1, func() error { _, _, _, err := rt.Lock(ctx, "rec-000001", "b", time.Minute); return err })
	count("Lock (missing)", 1, func() error { _, _, _, err := rt.Lock(ctx, "nope", "b", time.Minute); return err })
	count("Extend", 1, func() error { _, _, _, err := rt.Extend(ctx, "rec-000001", "a", rec.Token, time.Minute); return err })
	count("Extend (refused)", 2, func() error { _, _, _, err := rt.Extend(ctx, "rec-000001", "b", rec.Token, time.Minute); return err })
	count("Get", 1, func() error { _, _, err := rt.Get(ctx, "rec-000001"); return err })
	count("List", 1, func() error { _, err := rt.List(ctx, 10); return err })
	count("Release", 1, func() error { _, err := rt.Release(ctx, "rec-000001", "a", rec.Token); return err })
	count("Claim", 7, func() error { _, _, err := rt.Claim(ctx, byStatus("todo"), "a", time.Minute); return err })
	count("Claim (nothing)", 6, func() error { _, _, err := rt.Claim(ctx, byStatus("none"), "a", time.Minute); return err })
	f.exec(t, `UPDATE {T} SET locked_by = 'gone', locked_until = '2001-01-01' WHERE id = 'rec-000001'`)
	count("Claim (a free and a lapsed candidate)", 8, func() error { _, _, err := rt.Claim(ctx, recordlock.SQL{}, "a", time.Minute); return err })
	count("ForceRelease", 2, func() error { _, _, err := rt.ForceRelease(ctx, "rec-000003"); return err })
	count("ForceRelease (free)", 1, func() error { _, _, err := rt.ForceRelease(ctx, "rec-000003"); return err })
}

func TestRecordsMigrate(t *testing.T) {
	ctx := context.Background()
	db := testDB(t, nil)
	name := tableName("rlm_")
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + name) })
	if _, err := db.Exec(`CREATE TABLE ` + name + ` (id INT NOT NULL PRIMARY KEY, title VARCHAR(20) NOT NULL DEFAULT 'x') ENGINE=InnoDB`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO ` + name + ` VALUES (1, 'one'), (2, 'two')`); err != nil {
		t.Fatal(err)
	}
	rt, err := mysql.Records(db, name, &mysql.RecordOptions{UntilColumn: "lease_until", OwnerColumn: "lease_by", TokenColumn: "lease_token"})
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
	rows, err := db.Query(`SELECT CONCAT_WS(' ', COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, IFNULL(COLUMN_DEFAULT, 'NULL')) FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION`, name)
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
	want := []string{"id int(11) NO NULL", "title varchar(20) NO 'x'", "lease_until datetime(3) YES NULL", "lease_by varchar(600) YES NULL", "lease_token bigint(20) YES NULL"}
	if !slices.Equal(cols, want) {
		t.Errorf("columns after Migrate: %q, want %q", cols, want)
	}
	// The (expiry, id) index and the (holder(1), expiry) one.
	var idx string
	if err := db.QueryRow(`SELECT GROUP_CONCAT(CONCAT(INDEX_NAME, ' ', SEQ_IN_INDEX, ' ', COLUMN_NAME, ' ', IFNULL(SUB_PART, '-')) ORDER BY INDEX_NAME, SEQ_IN_INDEX SEPARATOR ', ')
FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND INDEX_NAME <> 'PRIMARY'`, name).Scan(&idx); err != nil ||
		idx != "warden_lease_by_cleared 1 lease_by 1, warden_lease_by_cleared 2 lease_until -, warden_lease_until 1 lease_until -, warden_lease_until 2 id -" {
		t.Errorf("indexes: %q (%v)", idx, err)
	}
	if rec, _, ok, err := rt.Lock(ctx, 1, "a", time.Minute); err != nil || !ok || rec.Token != 1 {
		t.Fatalf("Lock after Migrate: %+v %v %v", rec, ok, err)
	}

	// Migration's statement does the same by hand.
	name2 := tableName("rlm_")
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + name2) })
	if _, err := db.Exec(`CREATE TABLE ` + name2 + ` (id VARCHAR(10) NOT NULL PRIMARY KEY) ENGINE=InnoDB`); err != nil {
		t.Fatal(err)
	}
	rt2, err := mysql.Records(db, name2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(rt2.Migration()); err != nil {
		t.Fatalf("running Migration():\n%s\n%v", rt2.Migration(), err)
	}
	if err := rt2.Migrate(ctx); err != nil {
		t.Fatalf("Migrate after Migration(): %v", err)
	}
	if _, err := db.Exec(`INSERT INTO ` + name2 + ` (id) VALUES ('a')`); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := rt2.Lock(ctx, "a", "o", time.Minute); err != nil || !ok {
		t.Fatalf("Lock after Migration(): %v %v", ok, err)
	}
}

func TestRecordsTableChecks(t *testing.T) {
	ctx := context.Background()
	db := testDB(t, nil)
	lock := ", locked_until DATETIME(3) NULL, locked_by VARCHAR(600) NULL, lock_token BIGINT NULL"
	tables := map[string]string{
		"dup":    `(id VARCHAR(10) NOT NULL` + lock + `, KEY (id))`,
		"prefix": `(k INT PRIMARY KEY, id VARCHAR(100) NOT NULL` + lock + `, UNIQUE KEY (id(5)))`,
		"pair":   `(a INT NOT NULL, id VARCHAR(10) NOT NULL` + lock + `, PRIMARY KEY (a, id))`,
		"uniq":   `(k INT PRIMARY KEY, id VARCHAR(10) NOT NULL` + lock + `, UNIQUE KEY (id))`,
		"ts":     `(id INT PRIMARY KEY, locked_until TIMESTAMP(3) NULL, locked_by VARCHAR(600) NULL, lock_token BIGINT NULL)`,
		"dec":    `(id DECIMAL(10,0) PRIMARY KEY` + lock + `)`,
	}
	names := map[string]string{}
	for k, decl := range tables {
		names[k] = tableName("rlc_" + k + "_")
		t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + names[k]) })
		if _, err := db.Exec(`CREATE TABLE ` + names[k] + ` ` + decl + ` ENGINE=InnoDB`); err != nil {
			t.Fatal(k, err)
		}
	}
	for k, want := range map[string]string{"dup": "not unique", "prefix": "not unique", "pair": "not unique", "ts": "DATETIME(3)", "dec": "decimal"} {
		rt, err := mysql.Records(db, names[k], nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := rt.Get(ctx, 1); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Get: %v; want an error about %q", k, err, want)
		}
	}
	if _, err := db.Exec(`INSERT INTO ` + names["uniq"] + ` (k, id) VALUES (1, 'x')`); err != nil {
		t.Fatal(err)
	}
	rt, err := mysql.Records(db, names["uniq"], nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := rt.Lock(ctx, "x", "a", time.Minute); err != nil || !ok {
		t.Errorf("a unique index on the id column: Lock: %v %v", ok, err)
	}
	rt, err = mysql.Records(db, "rl_no_such_table", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := rt.Get(ctx, "x"); err == nil {
		t.Error("Get on a missing table: no error")
	}
	for _, c := range []struct {
		table string
		opts  *mysql.RecordOptions
	}{
		{"jobs; DROP TABLE x", nil},
		{"`jobs`", nil},
		{"db.jobs", nil},
		{"", nil},
		{strings.Repeat("a", 65), nil},
		{"jobs", &mysql.RecordOptions{IDColumn: "id) OR (1"}},
		{"jobs", &mysql.RecordOptions{UntilColumn: "a b"}},
		{"jobs", &mysql.RecordOptions{OwnerColumn: "locked_until"}},
	} {
		if _, err := mysql.Records(db, c.table, c.opts); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Records(%q, %+v): %v; want ErrInvalidArgument", c.table, c.opts, err)
		}
	}
	if _, err := mysql.Records(nil, "jobs", nil); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Records(nil db): %v", err)
	}
}

// ---------------------------------------------------------------------------
// Claims from several processes.

// claimChildEnv holds the configuration of a child process of
// TestRecordsClaimProcesses, as JSON.
const claimChildEnv = "WARDEN_TEST_MYSQL_RECORDS_CLAIM_CHILD"

type claimChildConfig struct {
	Table, Dir     string
	ID, Goroutines int
}

type claimed struct {
	ID    int64
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
	db, err := recordsDB()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rt, err := mysql.Records(db, cfg.Table, nil)
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
					out = append(out, claimed{ID: rec.ID.(int64), Token: rec.Token, Owner: rec.Owner})
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

// TestRecordsClaimProcesses: two processes × 4 goroutines claim 1000
// records; every record is claimed once, with token 1, by the holder the
// table names (nothing is released: the claims stay).
func TestRecordsClaimProcesses(t *testing.T) {
	const n, procs, goroutines = 1000, 2, 4
	f := newRecordFixture(t, nil, n, true)
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	var outs []*strings.Builder
	for i := range procs {
		js, _ := json.Marshal(claimChildConfig{Table: f.table, Dir: dir, ID: i, Goroutines: goroutines})
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
	got := map[int64][]claimed{}
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
	holders := map[int64]string{}
	rows, err := f.db.Query(`SELECT id, locked_by, lock_token FROM ` + f.table)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, tok int64
		var by string
		if err := rows.Scan(&id, &by, &tok); err != nil {
			t.Fatal(err)
		}
		holders[id] = fmt.Sprintf("%s/%d", by, tok)
	}
	rows.Close()
	for i := int64(1); i <= n; i++ {
		cs := got[i]
		if len(cs) != 1 {
			t.Errorf("record %d claimed %d times: %+v", i, len(cs), cs)
			continue
		}
		if cs[0].Token != 1 || holders[i] != cs[0].Owner+"/1" {
			t.Errorf("record %d: claimed %+v, the table says %s", i, cs[0], holders[i])
		}
	}
}
