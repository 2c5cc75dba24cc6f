package bench

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	_ "github.com/warden-go/warden/store/mysql" // registers mysql://
)

// mysqlEnv names the MySQL/MariaDB server of the benchmarks, as in the
// tests; without it the mysql cases are left out.
const mysqlEnv = "WARDEN_TEST_MYSQL_URL"

// mysqlCases returns the MySQL/MariaDB groups, measured on the server at
// base (a mysql:// URL).
func mysqlCases(base string) []Case {
	return []Case{
		{Group: "mysql lock cycle", Name: "raw upsert + delete (go-sql-driver/mysql)", Baseline: true, Run: func(b *testing.B) { rawMySQLCycle(b, base) }},
		{Group: "mysql lock cycle", Name: "warden primitives Acquire + Release", Run: func(b *testing.B) { primitiveCycle(b, mysqlURL(base)) }},
		{Group: "mysql lock cycle", Name: "lock.Locker TryAcquire + Release", Run: func(b *testing.B) { lockerCycle(b, mysqlURL(base)) }},
		{Group: "mysql cache get", Name: "raw SELECT (go-sql-driver/mysql)", Baseline: true, Run: func(b *testing.B) { rawMySQLGet(b, base) }},
		{Group: "mysql cache get", Name: "warden Cache().Get", Run: func(b *testing.B) { mysqlCacheGet(b, mysqlURL(base)) }},
		{Group: "lock hand-off (p50 µs, release → waiting Acquire on another connection)", Name: "mysql (no notifications: back-off)", Metric: HandoffMetric, Run: func(b *testing.B) { handoff(b, mysqlURL(base)) }},
	}
}

var mysqlRuns atomic.Int64

// mysqlURL is base with a namespace of the run's own, so that runs never
// see each other's records.
func mysqlURL(base string) string {
	sep := "?"
	if u, err := url.Parse(base); err == nil && u.RawQuery != "" {
		sep = "&"
	}
	return fmt.Sprintf("%s%sprefix=bench%d%d%d:", base, sep, os.Getpid(), time.Now().UnixNano(), mysqlRuns.Add(1))
}

// rawMySQLDB opens base with the connection settings the store uses
// (UTC session, parameters interpolated into the statement: one round
// trip per statement) and creates the baseline's tables.
func rawMySQLDB(b *testing.B, base string) *sql.DB {
	b.Helper()
	u, err := url.Parse(base)
	if err != nil {
		b.Fatal(err)
	}
	cfg := mysqldrv.NewConfig()
	cfg.Net, cfg.Addr = "tcp", u.Host
	if u.Port() == "" {
		cfg.Addr += ":3306"
	}
	cfg.DBName = u.Path[1:]
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.ParseTime, cfg.Loc, cfg.InterpolateParams = true, time.UTC, true
	cfg.Params = map[string]string{"time_zone": "'+00:00'"}
	conn, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		b.Fatal(err)
	}
	db := sql.OpenDB(conn)
	b.Cleanup(func() { db.Close() })
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS bench_raw_locks (k VARBINARY(600) PRIMARY KEY, owner VARBINARY(255) NOT NULL, expires_at DATETIME(3) NOT NULL) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS bench_raw_cache (k VARBINARY(600) PRIMARY KEY, value LONGBLOB NOT NULL, expires_at DATETIME(3) NULL) ENGINE=InnoDB`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			b.Fatal(err)
		}
	}
	return db
}

// rawMySQLCycle: the least a MySQL lock can do — a conditional upsert that
// takes a free or expired key (expiry by the database clock), then an
// owner-checked delete.
func rawMySQLCycle(b *testing.B, base string) {
	db := rawMySQLDB(b, base)
	key := fmt.Sprintf("bench-%d-%d", os.Getpid(), mysqlRuns.Add(1))
	b.Cleanup(func() { db.Exec(`DELETE FROM bench_raw_locks WHERE k = ?`, key) })
	const acquire = `INSERT INTO bench_raw_locks (k, owner, expires_at)
		VALUES (?, ?, TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(3)))
		ON DUPLICATE KEY UPDATE
			owner = IF(expires_at <= UTC_TIMESTAMP(3), VALUES(owner), owner),
			expires_at = IF(expires_at <= UTC_TIMESTAMP(3), VALUES(expires_at), expires_at)`
	const release = `DELETE FROM bench_raw_locks WHERE k = ? AND owner = ?`
	for b.Loop() {
		// 1: inserted, 2: an expired row taken over, 0: held.
		res, err := db.Exec(acquire, key, "owner", 60_000_000)
		if n, _ := rowsAffected(res, err); n != 1 && n != 2 {
			b.Fatal("raw acquire failed", err)
		}
		res, err = db.Exec(release, key, "owner")
		if n, _ := rowsAffected(res, err); n != 1 {
			b.Fatal("raw release failed", err)
		}
	}
}

// rawMySQLGet: a primary-key read with an expiry check by the database
// clock.
func rawMySQLGet(b *testing.B, base string) {
	db := rawMySQLDB(b, base)
	key := fmt.Sprintf("cache:bench-%d-%d", os.Getpid(), mysqlRuns.Add(1))
	if _, err := db.Exec(`REPLACE INTO bench_raw_cache VALUES (?, ?, NULL)`, key, []byte("value")); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Exec(`DELETE FROM bench_raw_cache WHERE k = ?`, key) })
	for b.Loop() {
		var v []byte
		if err := db.QueryRow(`SELECT value FROM bench_raw_cache WHERE k = ? AND (expires_at IS NULL OR expires_at > UTC_TIMESTAMP(3))`, key).Scan(&v); err != nil {
			b.Fatal(err)
		}
	}
}

// mysqlCacheGet: a hit through the store's checked cache primitive.
func mysqlCacheGet(b *testing.B, u string) {
	ctx := context.Background()
	c := open(b, u).Cache()
	if err := c.Set(ctx, "bench", []byte("value"), 0); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Delete(ctx, "bench") })
	for b.Loop() {
		if _, ok, err := c.Get(ctx, "bench"); err != nil || !ok {
			b.Fatal(fmt.Sprint(ok), err)
		}
	}
}
