package bench

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	gomysqllock "github.com/sanketplus/go-mysql-lock"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/lock"
	_ "github.com/warden-go/warden/store/mysql" // registers mysql://
)

// mysqlEnv names the MySQL/MariaDB server of the benchmarks, as in the
// tests; without it the mysql cases are left out.
const mysqlEnv = "WARDEN_TEST_MYSQL_URL"

// MySQL/MariaDB groups, shaped as the Redis and PostgreSQL ones (the
// measurements are the same functions), plus the same contention split
// over two processes. Contention: 8 workers, each with connections of its
// own, take one key in turn and hold it 1 ms; the time per operation is
// wall time per acquisition, and the other metrics show acquisitions per
// second and the fewest and most acquisitions of one worker (fairness).
const (
	mysqlCycleGroup   = "mysql lock cycle (uncontended acquire + release)"
	mysqlContendGroup = "mysql 8-way contention on one key, hold 1 ms (µs per acquisition)"
	mysqlProcsGroup   = "mysql 2 processes × 4 workers on one key, hold 1 ms (µs per acquisition)"
	mysqlHandoffGroup = "mysql lock hand-off (p50 µs, release → waiter on another connection)"
	mysqlPairedGroup  = "mysql lock cycle, paired: one cycle of the raw pair, the raw kept-row pair, warden's primitives with and without hand-off and lock.Locker in turn (median µs of lock.Locker's)"
	mysqlGetGroup     = "mysql cache get"
)

// mysqlPeer is one library under comparison. mk returns a locker with
// connections of its own on the server at base; lockers made with the
// same ns share warden's namespace.
type mysqlPeer struct {
	name string
	mk   func(base, ns string) (peerLocker, func(), error)
}

// mysqlPeers: the raw durable primitive, warden, and
// github.com/sanketplus/go-mysql-lock (GET_LOCK held on a connection for
// as long as the lock is held: no record, no TTL, no fencing token).
var mysqlPeers = []mysqlPeer{
	{"raw upsert + delete (go-sql-driver/mysql; waiters poll every 1 ms)", newRawMySQL},
	{"warden lock.Locker (waiters: named-lock queue)", newWardenURL},
	{"sanketplus/go-mysql-lock v0.0.7 (GET_LOCK)", newGoMySQLLock},
}

// mysqlCases returns the MySQL/MariaDB groups, measured on the server at
// base (a mysql:// URL).
func mysqlCases(base string) []Case {
	var cases []Case
	for i, p := range mysqlPeers {
		cases = append(cases, Case{Group: mysqlCycleGroup, Name: p.name, Baseline: i == 0,
			Run: func(b *testing.B) { peerCycle(b, mysqlPeerB(b, p, base, mysqlURL(base))) }})
	}
	cases = append(cases,
		Case{Group: mysqlCycleGroup, Name: "raw upsert + release UPDATE, row kept (warden's table: token, indexed expiry; no read)", Run: func(b *testing.B) {
			l, closeFn, err := newRawKeptMySQL(base)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(closeFn)
			peerCycle(b, l)
		}},
		Case{Group: mysqlCycleGroup, Name: "warden primitives Acquire + Release (no lease)", Run: func(b *testing.B) { primitiveCycle(b, mysqlURL(base)) }},
		Case{Group: mysqlCycleGroup, Name: "raw GET_LOCK(k, 0) + RELEASE_LOCK(k) (one connection; no record)", Run: func(b *testing.B) { rawNamedLockCycle(b, base) }},
	)
	cases = append(cases, Case{Group: mysqlPairedGroup, Name: "lock.Locker beside the raw upsert + delete and warden's primitives",
		Metric: "locker-µs", Run: func(b *testing.B) { mysqlPairedCycle(b, base) }})
	for i, p := range mysqlPeers {
		cases = append(cases, Case{Group: mysqlContendGroup, Name: p.name, Baseline: i == 0,
			Run: func(b *testing.B) {
				ns := mysqlURL(base)
				peerContend(b, func() peerLocker { return mysqlPeerB(b, p, base, ns) })
			}})
	}
	for i, p := range mysqlPeers {
		cases = append(cases, Case{Group: mysqlProcsGroup, Name: p.name, Baseline: i == 0,
			Run: func(b *testing.B) { mysqlProcs(b, i, base) }})
	}
	for _, p := range mysqlPeers {
		cases = append(cases, Case{Group: mysqlHandoffGroup, Name: p.name, Metric: HandoffMetric,
			Run: func(b *testing.B) {
				ns := mysqlURL(base)
				peerHandoff(b, mysqlPeerB(b, p, base, ns), mysqlPeerB(b, p, base, ns))
			}})
	}
	cases = append(cases,
		Case{Group: mysqlGetGroup, Name: "raw SELECT (go-sql-driver/mysql)", Baseline: true, Run: func(b *testing.B) { rawMySQLGet(b, base) }},
		Case{Group: mysqlGetGroup, Name: "warden Cache().Get", Run: func(b *testing.B) { mysqlCacheGet(b, mysqlURL(base)) }},
	)
	return cases
}

// mysqlPeerB makes p's locker for a benchmark, closed with it.
func mysqlPeerB(b *testing.B, p mysqlPeer, base, ns string) peerLocker {
	b.Helper()
	l, closeFn, err := p.mk(base, ns)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(closeFn)
	return l
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

// mysqlConfig is the go-sql-driver configuration of base with the
// connection settings the store uses (UTC session, parameters
// interpolated into the statement: one round trip per statement).
func mysqlConfig(base string) (*mysqldrv.Config, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	cfg := mysqldrv.NewConfig()
	cfg.Net, cfg.Addr = "tcp", u.Host
	if u.Port() == "" {
		cfg.Addr += ":3306"
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.ParseTime, cfg.Loc, cfg.InterpolateParams = true, time.UTC, true
	cfg.Params = map[string]string{"time_zone": "'+00:00'"}
	return cfg, nil
}

// openMySQL opens base with mysqlConfig and creates the baselines'
// tables.
func openMySQL(base string) (*sql.DB, error) {
	cfg, err := mysqlConfig(base)
	if err != nil {
		return nil, err
	}
	conn, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS bench_raw_locks (k VARBINARY(600) PRIMARY KEY, owner VARBINARY(255) NOT NULL, expires_at DATETIME(3) NOT NULL) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS bench_raw_cache (k VARBINARY(600) PRIMARY KEY, value LONGBLOB NOT NULL, expires_at DATETIME(3) NULL) ENGINE=InnoDB`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			db.Close()
			return nil, err
		}
	}
	return db, nil
}

// rawMySQLDB is openMySQL for a benchmark, closed with it.
func rawMySQLDB(b *testing.B, base string) *sql.DB {
	b.Helper()
	db, err := openMySQL(base)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return db
}

// ---- raw: the least a durable MySQL lock can do

// rawMySQL is a conditional upsert that takes a free or expired key
// (expiry by the database clock), and an owner-checked delete.
type rawMySQL struct{ db *sql.DB }

const (
	rawMySQLAcquire = `INSERT INTO bench_raw_locks (k, owner, expires_at)
		VALUES (?, ?, TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(3)))
		ON DUPLICATE KEY UPDATE
			owner = IF(expires_at <= UTC_TIMESTAMP(3), VALUES(owner), owner),
			expires_at = IF(expires_at <= UTC_TIMESTAMP(3), VALUES(expires_at), expires_at)`
	rawMySQLRelease = `DELETE FROM bench_raw_locks WHERE k = ? AND owner = ?`
)

func newRawMySQL(base, _ string) (peerLocker, func(), error) {
	db, err := openMySQL(base)
	if err != nil {
		return nil, nil, err
	}
	return rawMySQL{db}, func() { db.Close() }, nil
}

func (r rawMySQL) try(ctx context.Context, key string) (func() error, bool, error) {
	owner := fmt.Sprint(time.Now().UnixNano())
	res, err := r.db.ExecContext(ctx, rawMySQLAcquire, key, owner, 60_000_000)
	n, err := rowsAffected(res, err)
	var me *mysqldrv.MySQLError
	if errors.As(err, &me) && me.Number == 1213 {
		// An insert racing a delete of the same key can deadlock on the
		// gap; the pair's caller just tries again.
		return nil, false, nil
	}
	if err != nil || (n != 1 && n != 2) { // 1: inserted, 2: an expired row taken over, 0: held
		return nil, false, err
	}
	return func() error {
		res, err := r.db.ExecContext(ctx, rawMySQLRelease, key, owner)
		if n, err := rowsAffected(res, err); err != nil || n != 1 {
			return fmt.Errorf("raw release: %d rows, %v", n, err)
		}
		return nil
	}, true, nil
}

func (r rawMySQL) acquire(ctx context.Context, key string) (func() error, error) {
	for {
		rel, ok, err := r.try(ctx, key)
		if err != nil || ok {
			return rel, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// ---- raw, row kept

// rawKeptMySQL is the raw pair on a table shaped as warden's locks table
// (a 600-character key, a token, an indexed expiry, the release time),
// whose rows are kept on release so that tokens keep increasing: the
// writes warden's guarantees need, without warden's read of the row, its
// named lock or its code.
type rawKeptMySQL struct{ db *sql.DB }

const (
	rawKeptTable = `CREATE TABLE IF NOT EXISTS bench_raw_kept_locks (
		k VARCHAR(600) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PRIMARY KEY,
		owner VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
		token BIGINT NOT NULL DEFAULT 0,
		acquired_at DATETIME(3) NOT NULL, expires_at DATETIME(3) NOT NULL, released_at DATETIME(3) NULL,
		INDEX expires_at_idx (expires_at)) ENGINE=InnoDB`
	rawKeptAcquire = `INSERT INTO bench_raw_kept_locks (k, owner, token, acquired_at, expires_at, released_at)
		VALUES (?, ?, 1, UTC_TIMESTAMP(3), TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(3)), NULL)
		ON DUPLICATE KEY UPDATE
			token = IF(expires_at <= UTC_TIMESTAMP(3), token + 1, token),
			acquired_at = IF(expires_at <= UTC_TIMESTAMP(3), VALUES(acquired_at), acquired_at),
			owner = IF(expires_at <= UTC_TIMESTAMP(3), VALUES(owner), owner),
			released_at = IF(expires_at <= UTC_TIMESTAMP(3), NULL, released_at),
			expires_at = IF(expires_at <= UTC_TIMESTAMP(3), VALUES(expires_at), expires_at)`
	rawKeptRelease = `UPDATE bench_raw_kept_locks SET released_at = UTC_TIMESTAMP(3), expires_at = UTC_TIMESTAMP(3)
		WHERE k = ? AND owner = ? AND released_at IS NULL`
)

func newRawKeptMySQL(base string) (peerLocker, func(), error) {
	db, err := openMySQL(base)
	if err != nil {
		return nil, nil, err
	}
	if _, err := db.Exec(rawKeptTable); err != nil {
		db.Close()
		return nil, nil, err
	}
	return rawKeptMySQL{db}, func() { db.Close() }, nil
}

func (r rawKeptMySQL) try(ctx context.Context, key string) (func() error, bool, error) {
	owner := fmt.Sprint(time.Now().UnixNano())
	res, err := r.db.ExecContext(ctx, rawKeptAcquire, key, owner, 60_000_000)
	n, err := rowsAffected(res, err)
	if err != nil || (n != 1 && n != 2) { // 1: inserted, 2: a free row taken, 0: held
		return nil, false, err
	}
	return func() error {
		res, err := r.db.ExecContext(ctx, rawKeptRelease, key, owner)
		if n, err := rowsAffected(res, err); err != nil || n != 1 {
			return fmt.Errorf("raw kept release: %d rows, %v", n, err)
		}
		return nil
	}, true, nil
}

func (r rawKeptMySQL) acquire(ctx context.Context, key string) (func() error, error) {
	rel, ok, err := r.try(ctx, key)
	if err == nil && !ok {
		err = errors.New("raw kept: held (the uncontended cycle only)")
	}
	return rel, err
}

// ---- warden

// newWardenURL makes a lock.Locker on a store of its own at ns, a warden
// URL of any store (the base argument is the MySQL peers' and unused).
func newWardenURL(_, ns string) (peerLocker, func(), error) {
	st, err := warden.Open(context.Background(), ns)
	if err != nil {
		return nil, nil, err
	}
	l, err := lock.New(st, &lock.Options{TTL: time.Minute})
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return wardenPeer{l}, func() { l.Close(); st.Close() }, nil
}

// ---- go-mysql-lock

type goMySQLLock struct{ l *gomysqllock.MysqlLocker }

func newGoMySQLLock(base, _ string) (peerLocker, func(), error) {
	cfg, err := mysqlConfig(base)
	if err != nil {
		return nil, nil, err
	}
	conn, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		return nil, nil, err
	}
	db := sql.OpenDB(conn)
	return goMySQLLock{gomysqllock.NewMysqlLocker(db)}, func() { db.Close() }, nil
}

func (g goMySQLLock) try(ctx context.Context, key string) (func() error, bool, error) {
	l, err := g.l.ObtainTimeoutContext(ctx, key, 0)
	if errors.Is(err, gomysqllock.ErrMySQLTimeout) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return l.Release, true, nil
}

func (g goMySQLLock) acquire(ctx context.Context, key string) (func() error, error) {
	// MariaDB answers GET_LOCK(k, -1), the library's "forever", with
	// NULL: wait an hour at a time instead.
	l, err := g.l.ObtainTimeoutContext(ctx, key, 3600)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

// ---- raw named lock

// rawNamedLockCycle: GET_LOCK(k, 0) and RELEASE_LOCK(k) on one
// connection, what go-mysql-lock's cycle rests on.
func rawNamedLockCycle(b *testing.B, base string) {
	ctx := context.Background()
	c, err := rawMySQLDB(b, base).Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	key := redisKey()
	for b.Loop() {
		var got, rel sql.NullInt64
		if err := c.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", key).Scan(&got); err != nil || got.Int64 != 1 {
			b.Fatal("GET_LOCK:", got, err)
		}
		if err := c.QueryRowContext(ctx, "SELECT RELEASE_LOCK(?)", key).Scan(&rel); err != nil || rel.Int64 != 1 {
			b.Fatal("RELEASE_LOCK:", rel, err)
		}
	}
}

// mysqlPairedCycle: a raw cycle, a raw kept-row cycle, a cycle of
// warden's primitives, one of its primitives on a store without hand-off
// (handoff=false) and a lock.Locker cycle in turn, on keys of their own,
// so that all of them see the same load on a shared machine, where the
// time of one fsync can change several times over between the rounds of
// separate cases. It reports the medians and the ratios to the raw
// pair's.
func mysqlPairedCycle(b *testing.B, base string) {
	ctx := context.Background()
	raw := mysqlPeerB(b, mysqlPeers[0], base, "")
	kept, closeKept, err := newRawKeptMySQL(base)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(closeKept)
	w := mysqlPeerB(b, mysqlPeers[1], base, mysqlURL(base))
	prim := open(b, mysqlURL(base)).Locks()
	// The same primitives without hand-off: what the named locks cost.
	plain := open(b, mysqlURL(base)+"&handoff=false").Locks()
	rk, kk, wk, pk, nk := redisKey(), redisKey(), redisKey(), redisKey(), redisKey()
	cycle := func(l peerLocker, key string) time.Duration {
		start := time.Now()
		rel, err := l.acquire(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		if err := rel(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	primCycle := func(l *warden.Locks, key string) time.Duration {
		start := time.Now()
		rec, ok, err := l.Acquire(ctx, key, "owner", time.Minute)
		if err != nil || !ok {
			b.Fatal(ok, err)
		}
		if ok, err := l.Release(ctx, key, "owner", rec.Token); err != nil || !ok {
			b.Fatal(ok, err)
		}
		return time.Since(start)
	}
	var rt, kt, pt, nt, wt []time.Duration
	for b.Loop() {
		rt = append(rt, cycle(raw, rk))
		kt = append(kt, cycle(kept, kk))
		pt = append(pt, primCycle(prim, pk))
		nt = append(nt, primCycle(plain, nk))
		wt = append(wt, cycle(w, wk))
	}
	med := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds())
	}
	r, k, p, n, l := med(rt), med(kt), med(pt), med(nt), med(wt)
	b.ReportMetric(l, "locker-µs")
	b.ReportMetric(r, "raw-µs")
	b.ReportMetric(k/r, "kept×raw")
	b.ReportMetric(n/r, "no-handoff×raw")
	b.ReportMetric(p, "primitives-µs")
	b.ReportMetric(l/r, "locker×raw")
	b.ReportMetric(p/r, "primitives×raw")
}

// ---- two processes

// mysqlChildEnv carries the JSON procsChild of a child process of
// twoProcs (mysqlProcs, and the fairness group of every store): the
// running binary (the report command or the test binary) started again.
const mysqlChildEnv = "WARDEN_BENCH_MYSQL_CHILD"

// procsChild is what a child of twoProcs runs: Workers lockers of one
// MySQL peer, or of warden on the store at NS, taking Key in turn.
type procsChild struct {
	Peer     int  // index in mysqlPeers
	Warden   bool // instead: warden's lock.Locker on the store at NS, any store
	Base, NS string
	Key      string
	Workers  int
	// MinAcq, if set, is the fewest acquisitions a run makes in all
	// (b.N if more), so that min/max is read over enough turns; the time
	// per acquisition is then reported as AcqMetric.
	MinAcq int
}

// AcqMetric is the wall time per acquisition (µs) of a run of twoProcs
// with a MinAcq.
const AcqMetric = "µs/acq"

func init() {
	if js, ok := os.LookupEnv(mysqlChildEnv); ok {
		os.Exit(runProcsChild(js))
	}
}

// runProcsChild is the body of a child of twoProcs. It makes its
// lockers, writes 'r', waits for 'g' on stdin, then runs its workers until
// stdin closes, writing 'a' for every acquisition, and at the end a
// newline and its per-worker counts as JSON.
func runProcsChild(js string) int {
	var cfg procsChild
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	lockers, closeAll, err := procsLockers(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer closeAll()
	out := bufio.NewWriter(os.Stdout)
	var outMu sync.Mutex
	out.WriteString("r")
	out.Flush()
	in := bufio.NewReader(os.Stdin)
	if c, err := in.ReadByte(); err != nil || c != 'g' {
		return 2
	}
	var stop atomic.Bool
	go func() {
		io.Copy(io.Discard, in) // until the parent closes stdin
		stop.Store(true)
	}()
	counts, stalls, err := procsWorkers(lockers, cfg.Key, &stop, func() {
		outMu.Lock()
		out.WriteByte('a')
		out.Flush()
		outMu.Unlock()
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	b, _ := json.Marshal(struct {
		Counts []int64
		Stalls int64
	}{counts, stalls})
	outMu.Lock()
	defer outMu.Unlock()
	out.WriteString("\n")
	out.Write(b)
	out.WriteString("\n")
	out.Flush()
	return 0
}

// procsLockers makes cfg.Workers lockers of peer cfg.Peer (or warden's).
func procsLockers(cfg procsChild) ([]peerLocker, func(), error) {
	var ls []peerLocker
	var closers []func()
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	mk := newWardenURL // any store's URL
	if !cfg.Warden {
		mk = mysqlPeers[cfg.Peer].mk
	}
	for range cfg.Workers {
		l, c, err := mk(cfg.Base, cfg.NS)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		ls = append(ls, l)
		closers = append(closers, c)
	}
	return ls, closeAll, nil
}

// procsWorkers runs one worker per locker, taking key in turn and holding
// it 1 ms, until stop; each acquisition calls acquired. It returns the
// acquisitions of each worker.
func procsWorkers(ls []peerLocker, key string, stop *atomic.Bool, acquired func()) ([]int64, int64, error) {
	ctx := context.Background()
	per := make([]int64, len(ls))
	var stalls atomic.Int64
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var first error
	for w, l := range ls {
		wg.Go(func() {
			for !stop.Load() {
				rel, err := acquireBounded(ctx, l, key, &stalls)
				if err == nil {
					time.Sleep(time.Millisecond)
					per[w]++
					acquired()
					err = rel()
				}
				if err != nil {
					errMu.Lock()
					first = keepFirst(first, err)
					errMu.Unlock()
					stop.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	return per, stalls.Load(), first
}

func keepFirst(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// mysqlProcs: the contention of peerContend with the 8 workers split over
// two processes, 4 in this one and 4 in a child, until b.N acquisitions
// in all. Fairness across processes shows in the per-worker counts.
func mysqlProcs(b *testing.B, peer int, base string) {
	twoProcs(b, procsChild{Peer: peer, Base: base, NS: mysqlURL(base), Key: redisKey(), Workers: 4})
}

// twoProcs runs cfg.Workers workers in this process and as many in a
// child, on one key, until b.N acquisitions in all.
func twoProcs(b *testing.B, cfg procsChild) {
	js, _ := json.Marshal(cfg)
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), mysqlChildEnv+"="+string(js))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	lockers, closeAll, err := procsLockers(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer closeAll()
	out := bufio.NewReader(stdout)
	if c, err := out.ReadByte(); err != nil || c != 'r' {
		b.Fatal("child did not start:", err)
	}

	var total atomic.Int64
	var stop atomic.Bool
	target := int64(max(b.N, cfg.MinAcq))
	count := func() {
		if total.Add(1) >= target && !stop.Swap(true) {
			stdin.Close()
		}
	}
	type childOut struct {
		Counts []int64
		Stalls int64
		err    error
	}
	childDone := make(chan childOut, 1)
	b.ResetTimer()
	start := time.Now()
	if _, err := stdin.Write([]byte("g")); err != nil {
		b.Fatal(err)
	}
	go func() {
		var r childOut
		for {
			c, err := out.ReadByte()
			if err != nil {
				r.err = fmt.Errorf("child output: %w", err)
				break
			}
			if c == 'a' {
				count()
				continue
			}
			line, err := out.ReadBytes('\n')
			if err == nil {
				err = json.Unmarshal(line, &r)
			}
			r.err = err
			break
		}
		childDone <- r
	}()
	per, stalls, werr := procsWorkers(lockers, cfg.Key, &stop, count)
	if !stop.Swap(true) {
		stdin.Close()
	}
	r := <-childDone
	el := time.Since(start)
	b.StopTimer()
	if werr != nil {
		b.Fatal(werr)
	}
	if r.err != nil {
		b.Fatal(r.err)
	}
	per = append(per, r.Counts...)
	n := total.Load()
	b.ReportMetric(float64(n)/el.Seconds(), "acq/s")
	if cfg.MinAcq > 0 {
		b.ReportMetric(float64(el.Microseconds())/float64(n), AcqMetric)
	}
	b.ReportMetric(float64(slices.Min(per)), "min-per-worker")
	b.ReportMetric(float64(slices.Max(per)), "max-per-worker")
	b.ReportMetric(float64(slices.Min(per))/float64(max(slices.Max(per), 1)), "min/max")
	b.ReportMetric(float64(stalls+r.Stalls), "stalls")
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
