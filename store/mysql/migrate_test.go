package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/mysql"
)

// rawDB opens the test server with plain go-sql-driver settings.
func rawDB(t *testing.T) *sql.DB {
	t.Helper()
	return rawDBOn(t, "")
}

// rawDBOn is rawDB on database name ("": the test server's).
func rawDBOn(t *testing.T, name string) *sql.DB {
	t.Helper()
	u, err := url.Parse(serverURL(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	if name == "" {
		name = u.Path[1:]
	}
	cfg := mysqldrv.NewConfig()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, name
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.ParseTime, cfg.Loc = true, time.UTC
	cfg.Params = map[string]string{"time_zone": "'+00:00'"}
	conn, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { db.Close() })
	return db
}

// ggsTables creates tables in the shape go-go-scope's MySQL adapter
// gives them, under names of the test's own (dropped at the end), and
// returns the names for Options.Tables.
func ggsTables(t *testing.T, db *sql.DB) mysql.Tables {
	sfx := fmt.Sprintf("_%d_%d", os.Getpid(), time.Now().UnixNano())
	tb := mysql.Tables{
		Locks: "ggs_locks" + sfx, Circuits: "ggs_circuit" + sfx, Cache: "ggs_cache" + sfx,
		Idempotency: "ggs_idem" + sfx, Checkpoints: "ggs_cp" + sfx, CheckpointTasks: "ggs_cpt" + sfx,
	}
	t.Cleanup(func() {
		for _, n := range []string{tb.Locks, tb.Circuits, tb.Cache, tb.Idempotency, tb.Checkpoints, tb.CheckpointTasks} {
			db.Exec("DROP TABLE IF EXISTS " + n)
		}
	})
	for _, q := range []string{
		`CREATE TABLE ` + tb.Locks + ` (` + "`key`" + ` VARCHAR(255) PRIMARY KEY, owner VARCHAR(255) NOT NULL,
			expires_at DATETIME NOT NULL, created_at DATETIME DEFAULT CURRENT_TIMESTAMP)`,
		`CREATE TABLE ` + tb.Circuits + ` (` + "`key`" + ` VARCHAR(255) PRIMARY KEY, state VARCHAR(20) NOT NULL,
			failure_count INT DEFAULT 0, last_failure_time DATETIME NULL, last_success_time DATETIME NULL,
			updated_at DATETIME DEFAULT CURRENT_TIMESTAMP)`,
		`CREATE TABLE ` + tb.Cache + ` (id INT AUTO_INCREMENT PRIMARY KEY, ` + "`key`" + ` VARCHAR(255) NOT NULL UNIQUE,
			value TEXT NOT NULL, expires_at DATETIME NULL, note VARCHAR(20) NOT NULL)`,
		// A lock of the Node service: expired, and one still held.
		`INSERT INTO ` + tb.Locks + " (`key`, owner, expires_at) VALUES ('lock:old', 'node-1', UTC_TIMESTAMP() - INTERVAL 1 HOUR), ('lock:held', 'node-2', UTC_TIMESTAMP() + INTERVAL 1 HOUR)",
		`INSERT INTO ` + tb.Cache + " (`key`, value, note) VALUES ('cache:k', '\"v\"', 'x')",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	return tb
}

// columnTypes returns a table's COLUMN_TYPEs by column.
func columnTypes(t *testing.T, db *sql.DB, table string) map[string]string {
	rows, err := db.Query(`SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`, table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	m := map[string]string{}
	for rows.Next() {
		var n, typ string
		if err := rows.Scan(&n, &typ); err != nil {
			t.Fatal(err)
		}
		m[n] = typ
	}
	return m
}

// TestMigrateUpgradesGoGoScopeTables opens the store on tables go-go-scope
// created: Migrate adds and widens columns, sets the keys, and the store
// then works on them, next to the rows already there.
func TestMigrateUpgradesGoGoScopeTables(t *testing.T) {
	ctx := context.Background()
	db := rawDB(t)
	tb := ggsTables(t, db)
	st, err := mysql.New(db, &mysql.Options{Tables: tb})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	cols := columnTypes(t, db, tb.Locks)
	for col, want := range map[string]string{"key": "varchar(600)", "owner": "varchar(512)", "expires_at": "datetime(3)", "token": "bigint", "namespace": "varchar(64)"} {
		if !strings.HasPrefix(cols[col], want) {
			t.Errorf("%s.%s is %q after Migrate, want %s", tb.Locks, col, cols[col], want)
		}
	}
	var pk string
	if err := db.QueryRow(`SELECT GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE()
		AND TABLE_NAME = ? AND INDEX_NAME = 'PRIMARY'`, tb.Cache).Scan(&pk); err != nil {
		t.Fatal(err)
	}
	if pk != "key" {
		t.Errorf("the primary key of %s is (%s), want (key): the stored key is unique across namespaces", tb.Cache, pk)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if stmts, err := mysql.PlannedChanges(ctx, st); err != nil || len(stmts) != 0 {
		t.Fatalf("after Migrate, Migrate still plans %q (%v)", stmts, err)
	}

	l := st.Locks()
	if _, ok, err := l.Acquire(ctx, "held", "go", time.Minute); err != nil || ok {
		t.Fatalf("the Node service's live lock must block: ok=%v err=%v", ok, err)
	}
	rec, ok, err := l.Acquire(ctx, "old", "go", 1500*time.Millisecond)
	if err != nil || !ok {
		t.Fatalf("the expired go-go-scope lock must be free: ok=%v err=%v", ok, err)
	}
	if d := rec.ExpiresAt.Sub(rec.AcquiredAt); d != 1500*time.Millisecond {
		t.Fatalf("TTL stored as %v, want 1.5s (milliseconds kept)", d)
	}
	if ok, err := l.Release(ctx, "old", "go", rec.Token); err != nil || !ok {
		t.Fatalf("release: ok=%v err=%v", ok, err)
	}
	rec2, ok, err := l.Acquire(ctx, "new", "go", time.Minute)
	if err != nil || !ok {
		t.Fatalf("new lock: ok=%v err=%v", ok, err)
	}
	if ok, err := l.Release(ctx, "new", "go", rec2.Token); err != nil || !ok {
		t.Fatalf("release new: ok=%v err=%v", ok, err)
	}
	rec3, ok, err := l.Acquire(ctx, "old", "go", time.Minute)
	if err != nil || !ok || rec3.Token <= rec.Token {
		t.Fatalf("reacquire: ok=%v err=%v token %d after %d", ok, err, rec3.Token, rec.Token)
	}

	// Keys are byte-exact now: "Old" is another lock than "old".
	if _, ok, err := l.Acquire(ctx, "Old", "go", time.Minute); err != nil || !ok {
		t.Fatalf("case-distinct key: ok=%v err=%v", ok, err)
	}

	// The Node service's own insert still works on the upgraded table.
	if _, err := db.Exec(`INSERT INTO ` + tb.Locks + " (`key`, owner, expires_at) VALUES ('lock:node', 'node-3', UTC_TIMESTAMP() + INTERVAL 1 HOUR)"); err != nil {
		t.Fatalf("a go-go-scope insert on the upgraded table: %v", err)
	}
	if r, ok, err := l.Get(ctx, "node"); err != nil || !ok || r.Owner != "node-3" {
		t.Fatalf("the Node service's new lock: %+v %v %v", r, ok, err)
	}

	c := st.Cache()
	if e, ok, err := c.Get(ctx, "k"); err != nil || !ok || string(e.Value) != `"v"` {
		t.Fatalf("go-go-scope cache row: %q %v %v", e.Value, ok, err)
	}
	if err := c.Set(ctx, "bin", []byte{0xff, 0, 1}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if e, ok, err := c.Get(ctx, "bin"); err != nil || !ok || string(e.Value) != "\xff\x00\x01" {
		t.Fatalf("binary value: %q %v %v", e.Value, ok, err)
	}
	br := st.Circuits()
	if _, err := br.RecordFailure(ctx, "svc", 3); err != nil {
		t.Fatalf("circuit on the go-go-scope table: %v", err)
	}
}

// TestMigrateRefusesNumericTimes: a time column holding numbers is not
// converted silently.
func TestMigrateRefusesNumericTimes(t *testing.T) {
	db := rawDB(t)
	name := fmt.Sprintf("ggs_num_%d_%d", os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + name) })
	if _, err := db.Exec(`CREATE TABLE ` + name + ` (` + "`key`" + ` VARCHAR(255) PRIMARY KEY, owner VARCHAR(255), expires_at BIGINT)`); err != nil {
		t.Fatal(err)
	}
	_, err := mysql.New(db, &mysql.Options{Tables: mysql.Tables{Locks: name}})
	if err == nil || !strings.Contains(err.Error(), "expires_at") {
		t.Fatalf("want an error naming expires_at, got %v", err)
	}
}

// TestAutoIncrementOutcomes: tables with an AUTO_INCREMENT column (which
// Migrate keeps) do not corrupt outcomes: every insert sets LAST_INSERT_ID
// to the column's next value, so outcomes are not read from it.
func TestAutoIncrementOutcomes(t *testing.T) {
	ctx := context.Background()
	db := rawDB(t)
	sfx := fmt.Sprintf("_%d_%d", os.Getpid(), time.Now().UnixNano())
	tb := mysql.Tables{
		Locks: "ai_locks" + sfx, Circuits: "ai_circuit" + sfx, Cache: "ai_cache" + sfx,
		Idempotency: "ai_idem" + sfx, Checkpoints: "ai_cp" + sfx, CheckpointTasks: "ai_cpt" + sfx,
	}
	for _, n := range []string{tb.Locks, tb.Cache, tb.Idempotency, tb.CheckpointTasks} {
		t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + n) })
		if _, err := db.Exec("CREATE TABLE " + n + " (id BIGINT AUTO_INCREMENT PRIMARY KEY, `key` VARCHAR(255) NOT NULL UNIQUE)"); err != nil {
			t.Fatal(err)
		}
		// Later ids are large, so that they cannot pass for an outcome.
		if _, err := db.Exec("ALTER TABLE " + n + " AUTO_INCREMENT = 1000"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		db.Exec("DROP TABLE IF EXISTS " + tb.Circuits)
		db.Exec("DROP TABLE IF EXISTS " + tb.Checkpoints)
	})
	st, err := mysql.New(db, &mysql.Options{Tables: tb, Prefix: "ai:"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if rec, ok, err := st.Locks().Acquire(ctx, "new", "o", time.Minute); err != nil || !ok || rec.Owner != "o" {
		t.Fatalf("Acquire of a new key: %+v ok=%v err=%v", rec, ok, err)
	}
	if _, ok, err := st.Locks().Acquire(ctx, "new", "p", time.Minute); err != nil || ok {
		t.Fatalf("Acquire of a held key: ok=%v err=%v", ok, err)
	}
	if ok, err := st.Cache().SetIfAbsent(ctx, "k", []byte("v"), time.Minute); err != nil || !ok {
		t.Fatalf("SetIfAbsent of a new key: ok=%v err=%v", ok, err)
	}
	if ok, err := st.Cache().SetIfAbsent(ctx, "k", []byte("w"), time.Minute); err != nil || ok {
		t.Fatalf("SetIfAbsent of a present key: ok=%v err=%v", ok, err)
	}
	if _, o, err := st.Idempotency().Claim(ctx, "c", "o", time.Minute, "fp"); err != nil || o != driver.Claimed {
		t.Fatalf("Claim of a fresh key: %v %v", o, err)
	}
	if _, o, err := st.Idempotency().Claim(ctx, "c", "p", time.Minute, "fp"); err != nil || o != driver.InProgress {
		t.Fatalf("Claim of a claimed key: %v %v", o, err)
	}
	if ok, err := st.Checkpoints().Fence(ctx, "task", 7); err != nil || !ok {
		t.Fatalf("Fence of a new task: %v %v", ok, err)
	}
	if cp, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "task", Data: []byte("d"), Token: 7}); err != nil || !ok || cp.Sequence != 1 {
		t.Fatalf("Save: %+v %v %v", cp, ok, err)
	}
	if _, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "task", Data: []byte("d"), Token: 6}); err != nil || ok {
		t.Fatalf("Save below the fence: %v %v", ok, err)
	}
}

// TestMigrateUpgradesEarlierLayout: tables of the layout warden used before
// it shared them with go-go-scope (VARBINARY keys, (namespace, key) primary
// keys, LONGBLOB values) are upgraded in place with their rows, and a
// second Migrate plans nothing.
func TestMigrateUpgradesEarlierLayout(t *testing.T) {
	ctx := context.Background()
	db := rawDB(t)
	tb := testTables(t, db, "old_")
	ns := "`namespace` VARBINARY(64) NOT NULL DEFAULT '', `key` VARBINARY(600) NOT NULL, "
	for _, q := range []string{
		"CREATE TABLE " + tb.Locks + " (" + ns + "owner VARBINARY(512) NULL, token BIGINT NOT NULL DEFAULT 0, created_at DATETIME(3) NOT NULL, " +
			"acquired_at DATETIME(3) NOT NULL, expires_at DATETIME(3) NOT NULL, released_at DATETIME(3) NULL, updated_at DATETIME(3) NOT NULL, PRIMARY KEY (`namespace`, `key`))",
		"CREATE TABLE " + tb.Cache + " (" + ns + "value LONGBLOB NOT NULL, expires_at DATETIME(3) NULL, updated_at DATETIME(3) NOT NULL, " +
			"PRIMARY KEY (`namespace`, `key`), KEY expires_at_idx (expires_at))",
		"CREATE TABLE " + tb.Checkpoints + " (`namespace` VARBINARY(64) NOT NULL DEFAULT '', id VARBINARY(640) NOT NULL, task_id VARBINARY(600) NOT NULL, " +
			"sequence BIGINT NOT NULL DEFAULT 0, `timestamp` DATETIME(3) NOT NULL, progress DOUBLE NOT NULL DEFAULT 0, data LONGBLOB NOT NULL, " +
			"estimated_time_remaining BIGINT NULL, token BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (`namespace`, task_id, sequence))",
		"INSERT INTO " + tb.Locks + " VALUES ('p:', 'p:lock:held', 'old', 1000, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3), UTC_TIMESTAMP(3) + INTERVAL 1 HOUR, NULL, UTC_TIMESTAMP(3))," +
			" ('p:', 'p:lock:rel', 'old', 2000, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3), UTC_TIMESTAMP(3), UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))",
		"INSERT INTO " + tb.Cache + " VALUES ('p:', 'p:cache:bin', x'ff00', NULL, UTC_TIMESTAMP(3)), ('p:', 'p:cache:js', '{\"a\": 1}', NULL, UTC_TIMESTAMP(3))",
		"INSERT INTO " + tb.Checkpoints + " VALUES ('p:', 'p:t:1', 'p:t', 1, UTC_TIMESTAMP(3), 50, x'fe', NULL, 3)",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	st, err := mysql.New(db, &mysql.Options{Tables: tb, Prefix: "p:"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if stmts, err := mysql.PlannedChanges(ctx, st); err != nil || len(stmts) != 0 {
		t.Fatalf("after Migrate, Migrate still plans %q (%v)", stmts, err)
	}
	if cols := columnTypes(t, db, tb.Locks); cols["key"] != "varchar(600)" {
		t.Fatalf("key is %s after Migrate", cols["key"])
	}
	if rec, ok, err := st.Locks().Acquire(ctx, "held", "new", time.Minute); err != nil || ok || rec.Owner != "old" {
		t.Fatalf("the old holding: %+v ok=%v err=%v", rec, ok, err)
	}
	if rec, ok, err := st.Locks().Acquire(ctx, "rel", "new", time.Minute); err != nil || !ok || rec.Token <= 2000 {
		t.Fatalf("the released row: %+v ok=%v err=%v", rec, ok, err)
	}
	for k, want := range map[string]string{"bin": "\xff\x00", "js": `{"a": 1}`} {
		if e, ok, err := st.Cache().Get(ctx, k); err != nil || !ok || string(e.Value) != want {
			t.Fatalf("cache %s: %q %v %v", k, e.Value, ok, err)
		}
	}
	if cp, ok, err := st.Checkpoints().Latest(ctx, "t"); err != nil || !ok || string(cp.Data) != "\xfe" || cp.Token != 3 {
		t.Fatalf("checkpoint: %+v %v %v", cp, ok, err)
	}
	// The DATETIME(3) timestamp of earlier releases is kept, and read and
	// written as times.
	if cols := columnTypes(t, db, tb.Checkpoints); cols["timestamp"] != "datetime(3)" {
		t.Fatalf("the checkpoints' timestamp is %s after Migrate, want datetime(3) kept", cols["timestamp"])
	}
	before := time.Now().Add(-time.Hour)
	if cp, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "t", Data: []byte(`{}`)}); err != nil || !ok ||
		cp.Sequence != 2 || cp.Time.Before(before) || cp.Time.After(time.Now().Add(time.Hour)) {
		t.Fatalf("a save on the kept DATETIME(3) timestamp: %+v %v %v", cp, ok, err)
	}
	if err := st.Cache().Set(ctx, "js2", []byte(`[1]`), 0); err != nil {
		t.Fatal(err)
	}
	if e, _, err := st.Cache().Get(ctx, "js2"); err != nil || string(e.Value) != "[1]" {
		t.Fatalf("a new JSON value in the kept LONGBLOB column: %q %v", e.Value, err)
	}
}

// TestMigrateWidensCheckpointTime: a checkpoints table whose timestamp is a
// DATETIME of whole seconds gets DATETIME(3) (its times kept), not the
// BIGINT of milliseconds a new table has, which would turn the times into
// numbers.
func TestMigrateWidensCheckpointTime(t *testing.T) {
	ctx := context.Background()
	db := rawDB(t)
	tb := testTables(t, db, "w_")
	for _, q := range []string{
		"CREATE TABLE " + tb.Checkpoints + " (id VARCHAR(255) NOT NULL PRIMARY KEY, task_id VARCHAR(255) NOT NULL, sequence INT NOT NULL, " +
			"`timestamp` DATETIME NOT NULL, progress INT NOT NULL DEFAULT 0, data JSON NOT NULL)",
		"INSERT INTO " + tb.Checkpoints + " VALUES ('t:1', 't', 1, '2024-05-06 07:08:09', 10, '{}')",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	st, err := mysql.New(db, &mysql.Options{Tables: tb})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if cols := columnTypes(t, db, tb.Checkpoints); cols["timestamp"] != "datetime(3)" {
		t.Fatalf("timestamp is %s after Migrate, want datetime(3)", cols["timestamp"])
	}
	want := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	if cp, ok, err := st.Checkpoints().Latest(ctx, "t"); err != nil || !ok || !cp.Time.Equal(want) {
		t.Fatalf("the checkpoint after Migrate: %+v %v %v, want time %v", cp, ok, err, want)
	}
}

// testTables names a set of tables of the test's own, starting with
// prefix, dropped when the test ends.
func testTables(t *testing.T, db *sql.DB, prefix string) mysql.Tables {
	sfx := fmt.Sprintf("_%d_%d", os.Getpid(), time.Now().UnixNano())
	tb := mysql.Tables{
		Locks: prefix + "locks" + sfx, Circuits: prefix + "circuit" + sfx, Cache: prefix + "cache" + sfx,
		Idempotency: prefix + "idem" + sfx, Checkpoints: prefix + "cp" + sfx, CheckpointTasks: prefix + "cpt" + sfx,
	}
	t.Cleanup(func() {
		for _, n := range []string{tb.Locks, tb.Circuits, tb.Cache, tb.Idempotency, tb.Checkpoints, tb.CheckpointTasks} {
			db.Exec("DROP TABLE IF EXISTS " + n)
		}
	})
	return tb
}
