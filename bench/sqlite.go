package bench

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/lock"
	_ "github.com/warden-go/warden/store/memory" // registers memory://
	_ "github.com/warden-go/warden/store/sqlite" // registers sqlite://
	_ "modernc.org/sqlite"                       // the raw baseline's driver
)

// Case is one benchmark of the report.
type Case struct {
	Group string // rows of one group are compared with the group's baseline
	Name  string
	// Baseline marks the raw database primitive the group is compared to.
	Baseline bool
	// Metric, if set, names the b.ReportMetric value reported (in µs)
	// instead of the time per operation.
	Metric string
	// Allocs adds allocs/op to the report's other metrics.
	Allocs bool
	Run    func(b *testing.B)
}

// Cases returns the benchmarks, grouped. The MySQL/MariaDB groups are
// included only when WARDEN_TEST_MYSQL_URL names a server.
func Cases() []Case {
	cases := []Case{
		{Group: "sqlite lock cycle", Name: "raw upsert + delete (modernc.org/sqlite)", Baseline: true, Run: rawSQLiteCycle},
		{Group: "sqlite lock cycle", Name: "warden primitives Acquire + Release", Run: func(b *testing.B) { primitiveCycle(b, sqliteURL(b)) }},
		{Group: "sqlite lock cycle", Name: "lock.Locker TryAcquire + Release", Run: func(b *testing.B) { lockerCycle(b, sqliteURL(b)) }},
		{Group: "sqlite lock cycle", Name: "warden primitives, namespace watched by another store (events written)", Run: watchedCycle},
		{Group: "sqlite lock cycle, paired: one raw cycle, one of warden's primitives unwatched and one watched, in turn", Name: "warden primitives beside the raw upsert + delete",
			Metric: SQLitePairedMetric, Run: sqlitePairedCycle},
		{Group: "memory lock cycle", Name: "warden primitives Acquire + Release", Baseline: true, Run: func(b *testing.B) { primitiveCycle(b, "memory://") }},
		{Group: "memory lock cycle", Name: "lock.Locker TryAcquire + Release", Run: func(b *testing.B) { lockerCycle(b, "memory://") }},
		{Group: "sqlite cache get", Name: "raw SELECT (modernc.org/sqlite)", Baseline: true, Run: rawSQLiteGet},
		{Group: "sqlite cache get", Name: "warden Cache().Get", Run: cacheGet},
		{Group: "lock hand-off (p50 µs, release → waiting Acquire on another connection)", Name: "memory (notifications)", Metric: HandoffMetric, Run: func(b *testing.B) { handoff(b, "memory://handoff") }},
		{Group: "lock hand-off (p50 µs, release → waiting Acquire on another connection)", Name: "sqlite (notifications: data_version polling)", Metric: HandoffMetric, Run: func(b *testing.B) { handoff(b, sqliteURL(b)) }},
	}
	cases = append(cases, claimCases()...)
	cases = append(cases, breakerCases()...)
	cases = append(cases, fairnessCases()...)
	cases = append(cases, otelCases()...)
	if u := os.Getenv(mysqlEnv); u != "" {
		cases = append(cases, mysqlCases(u)...)
	}
	if u := os.Getenv(mongoEnv); u != "" {
		cases = append(cases, mongoCases(u)...)
	}
	if ep := os.Getenv(dynamoEnv); ep != "" {
		cases = append(cases, dynamoCases(ep)...)
	}
	if u := os.Getenv(redisEnv); u != "" {
		cases = append(cases, redisCases(u)...)
	}
	if u := os.Getenv(postgresEnv); u != "" {
		cases = append(cases, postgresCases(u)...)
	}
	return cases
}

func sqliteURL(b *testing.B) string {
	return "sqlite://" + filepath.Join(b.TempDir(), "bench.db")
}

func open(b *testing.B, u string) *warden.Store {
	b.Helper()
	st, err := warden.Open(context.Background(), u)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	return st
}

// primitiveCycle: one uncontended acquire and release through the checked
// store primitives (one statement each on SQLite).
func primitiveCycle(b *testing.B, u string) {
	op := primitiveOp(b, u)
	for b.Loop() {
		op()
	}
}

// primitiveOp returns one cycle of warden's primitives on the store at u.
func primitiveOp(b *testing.B, u string) func() {
	ctx := context.Background()
	l := open(b, u).Locks()
	return func() {
		rec, ok, err := l.Acquire(ctx, "bench", "owner", time.Minute)
		if err != nil || !ok {
			b.Fatal(ok, err)
		}
		if ok, err := l.Release(ctx, "bench", "owner", rec.Token); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}

// watchOn starts a watch of u's lock events, from a store of its own
// drained until the benchmark ends, so that the SQLite triggers write
// events for u's namespace.
func watchOn(b *testing.B, u string) {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	ch, err := open(b, u).Locks().Watch(ctx)
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		for range ch {
		}
	}()
}

// Metrics of the paired SQLite cycle: the primitives' µs per cycle, and
// each warden half's total time over the raw half's.
const (
	SQLitePairedMetric = "primitives-µs"
	SQLitePrimRatio    = "primitives/raw"
	SQLiteWatchedRatio = "watched/raw"
)

// sqlitePairedCycle runs one raw cycle, one of warden's primitives on a
// file nobody watches and one on a file watched by another store, in
// turn (the order rotating every iteration, each on a file of its own),
// so that the three meet the same load and fsync times: on a loaded
// machine their ratios are steadier than those of runs made one after
// the other.
func sqlitePairedCycle(b *testing.B) {
	watched := sqliteURL(b)
	watchOn(b, watched)
	ops := []func(){rawSQLiteOp(b), primitiveOp(b, sqliteURL(b)), primitiveOp(b, watched)}
	var total [3]time.Duration
	n := 0
	for b.Loop() {
		for j := range ops {
			k := (n + j) % len(ops)
			start := time.Now()
			ops[k]()
			total[k] += time.Since(start)
		}
		n++
	}
	b.ReportMetric(float64(total[1].Microseconds())/float64(n), SQLitePairedMetric)
	b.ReportMetric(float64(total[1])/float64(total[0]), SQLitePrimRatio)
	b.ReportMetric(float64(total[2])/float64(total[0]), SQLiteWatchedRatio)
}

// watchedCycle: primitiveCycle while another store on the file watches
// the namespace, so that the triggers write an event for every
// acquisition and release (the SQLite store writes events only then).
func watchedCycle(b *testing.B) {
	u := sqliteURL(b)
	watchOn(b, u)
	primitiveCycle(b, u)
}

// lockerCycle: the portable lock, with its lease bookkeeping and refresh
// scheduling.
func lockerCycle(b *testing.B, u string) {
	ctx := context.Background()
	lk, err := lock.New(open(b, u), &lock.Options{TTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lk.Close() })
	for b.Loop() {
		lease, err := lk.TryAcquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// rawDB opens the same kind of database the store uses (WAL, busy
// timeout, immediate transactions) for the baselines.
func rawDB(b *testing.B) *sql.DB {
	b.Helper()
	path := filepath.Join(b.TempDir(), "raw.db")
	dsn := "file:" + url.PathEscape(path) + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS locks (key TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at INTEGER NOT NULL);
		CREATE TABLE IF NOT EXISTS cache (key TEXT PRIMARY KEY, value BLOB, expires_at INTEGER)`); err != nil {
		b.Fatal(err)
	}
	return db
}

// rawSQLiteCycle: the least a SQLite lock can do — a conditional upsert
// that takes a free or expired key, then an owner-checked delete.
func rawSQLiteCycle(b *testing.B) {
	op := rawSQLiteOp(b)
	for b.Loop() {
		op()
	}
}

// rawSQLiteOp returns one raw cycle, on a database of its own.
func rawSQLiteOp(b *testing.B) func() {
	db := rawDB(b)
	acquire, err := db.Prepare(`INSERT INTO locks (key, owner, expires_at) VALUES (?1, ?2, ?3)
		ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
		WHERE locks.expires_at <= ?4`)
	if err != nil {
		b.Fatal(err)
	}
	release, err := db.Prepare(`DELETE FROM locks WHERE key = ?1 AND owner = ?2`)
	if err != nil {
		b.Fatal(err)
	}
	return func() {
		now := time.Now().UnixMilli()
		res, err := acquire.Exec("bench", "owner", now+60000, now)
		if n, _ := rowsAffected(res, err); n != 1 {
			b.Fatal("raw acquire failed", err)
		}
		res, err = release.Exec("bench", "owner")
		if n, _ := rowsAffected(res, err); n != 1 {
			b.Fatal("raw release failed", err)
		}
	}
}

func rowsAffected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// rawSQLiteGet: a primary-key read with an expiry check.
func rawSQLiteGet(b *testing.B) {
	db := rawDB(b)
	if _, err := db.Exec(`INSERT OR REPLACE INTO cache VALUES ('cache:bench', x'76616c7565', NULL)`); err != nil {
		b.Fatal(err)
	}
	get, err := db.Prepare(`SELECT value FROM cache WHERE key = ?1 AND (expires_at IS NULL OR expires_at > ?2)`)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		var v []byte
		if err := get.QueryRow("cache:bench", time.Now().UnixMilli()).Scan(&v); err != nil {
			b.Fatal(err)
		}
	}
}

// cacheGet: a hit through the store's checked cache primitive.
func cacheGet(b *testing.B) {
	ctx := context.Background()
	c := open(b, sqliteURL(b)).Cache()
	if err := c.Set(ctx, "bench", []byte("value"), 0); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, ok, err := c.Get(ctx, "bench"); err != nil || !ok {
			b.Fatal(fmt.Sprint(ok), err)
		}
	}
}

// Roles of a case in its group, from its name (see Case.Role).
const (
	RoleRaw    = "raw"    // the raw database primitive, no library
	RoleWarden = "warden" // warden itself
	RolePeer   = "peer"   // a library users would pick instead
	RoleOther  = "other"  // a paired run or a variant measured for a note
)

// Role tells what a case measures, from how its name begins: "raw" — the
// raw primitive; "warden", "lock.Locker", "recordlock", "memory (" or
// "sqlite (" and the other store names of the shared hand-off group,
// "the same with otelwarden" — warden; "both alternating" or a paired group — other; the
// breaker groups' baseline and any other name — a peer library.
func (c Case) Role() string {
	n := c.Name
	switch {
	case strings.HasPrefix(n, "raw "):
		return RoleRaw
	case strings.HasPrefix(n, "both alternating") || c.Metric != "" && strings.Contains(c.Group, "paired"):
		return RoleOther
	case strings.HasPrefix(n, "warden") || strings.HasPrefix(n, "lock.Locker") || strings.HasPrefix(n, "recordlock") ||
		strings.HasPrefix(n, "the same with otelwarden"):
		return RoleWarden
	}
	for _, s := range []string{"memory (", "sqlite (", "mongodb (", "dynamodb (", "postgres (", "mysql (", "redis ("} {
		if strings.HasPrefix(n, s) {
			return RoleWarden
		}
	}
	return RolePeer
}
