package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"
	"github.com/warden-go/warden/lock"
	_ "github.com/warden-go/warden/store/redis" // registers redis://
)

// redisEnv names the Redis server of the benchmarks, as in the tests;
// without it the redis cases are left out.
const redisEnv = "WARDEN_TEST_REDIS_URL"

// Redis groups. Contention: 8 goroutines take turns on one key, each
// holding it 1 ms; the time per operation is wall time per acquisition
// (1e6 / it = acquisitions per second), and go test -bench also shows
// acq/s and the fewest and most acquisitions of one worker (fairness).
const (
	redisCycleGroup   = "redis lock cycle (uncontended acquire + release)"
	redisContendGroup = "redis 8-way contention on one key, hold 1 ms (µs per acquisition)"
	redisHandoffGroup = "redis lock hand-off (p50 µs, release → waiter on another connection)"
	// HandoffP99Metric is the 99th percentile of a Redis hand-off case.
	HandoffP99Metric = "handoff-p99-µs"
)

// redisCases returns the Redis groups, measured on the server at base (a
// redis:// URL): warden against github.com/go-redsync/redsync/v4,
// github.com/bsm/redislock, github.com/redis/rueidis/rueidislock and the
// raw SET NX PX + compare-and-delete pair.
func redisCases(base string) []Case {
	type peer struct {
		name string
		// mk returns a locker with connections of its own; lockers made
		// with the same ns share the namespace (warden's prefix).
		mk func(b *testing.B, ns string) peerLocker
	}
	peers := []peer{
		{"raw SET NX PX + compare-and-delete (go-redis; waiters poll every 1 ms)", newRawRedis},
		{"warden lock.Locker (waiters: pub/sub)", newWardenPeer},
		{"bsm/redislock (waiters: 10 ms linear back-off)", newRedislock},
		{"go-redsync/redsync/v4 (one pool; waiters: its default 50–250 ms delay)", newRedsync},
		{"rueidislock (KeyMajority 1; waiters: client-side-caching invalidation)", newRueidislock},
	}
	var cases []Case
	for i, p := range peers {
		cases = append(cases, Case{Group: redisCycleGroup, Name: p.name, Baseline: i == 0,
			Run: func(b *testing.B) { peerCycle(b, p.mk(b, redisURL(base))) }})
	}
	cases = append(cases, Case{Group: redisCycleGroup, Name: "warden primitives Acquire + Release (no lease)",
		Run: func(b *testing.B) { primitiveCycle(b, redisURL(base)) }})
	for i, p := range peers {
		cases = append(cases, Case{Group: redisContendGroup, Name: p.name, Baseline: i == 0,
			Run: func(b *testing.B) {
				ns := redisURL(base)
				peerContend(b, func() peerLocker { return p.mk(b, ns) })
			}})
	}
	for _, p := range peers {
		cases = append(cases, Case{Group: redisHandoffGroup, Name: p.name, Metric: HandoffMetric,
			Run: func(b *testing.B) {
				ns := redisURL(base)
				peerHandoff(b, p.mk(b, ns), p.mk(b, ns))
			}})
	}
	return cases
}

var redisRuns atomic.Int64

// redisURL is base with a namespace of the run's own.
func redisURL(base string) string {
	sep := "?"
	if u, err := url.Parse(base); err == nil && u.RawQuery != "" {
		sep = "&"
	}
	return fmt.Sprintf("%s%sprefix=bench%d%d%d:", base, sep, os.Getpid(), time.Now().UnixNano(), redisRuns.Add(1))
}

// redisKey is a key of the run's own for the peers.
func redisKey() string {
	return fmt.Sprintf("bench-%d-%d-%d", os.Getpid(), time.Now().UnixNano(), redisRuns.Add(1))
}

// peerLocker is what every library under comparison offers: take a lock
// waiting for it, take it without waiting, and release it. Each one owns
// its connections. The measurements below (peerCycle, peerContend,
// peerHandoff) and wardenPeer serve every store's lock groups, Redis's and
// PostgreSQL's alike.
type peerLocker interface {
	acquire(ctx context.Context, key string) (release func() error, err error)
	try(ctx context.Context, key string) (release func() error, ok bool, err error)
}

// goredisClient opens a go-redis client on base.
func goredisClient(b *testing.B, base string) *goredis.Client {
	b.Helper()
	u, err := url.Parse(base)
	if err != nil {
		b.Fatal(err)
	}
	u.RawQuery = ""
	o, err := goredis.ParseURL(u.String())
	if err != nil {
		b.Fatal(err)
	}
	o.MaxRetries, o.ContextTimeoutEnabled = -1, true
	c := goredis.NewClient(o)
	b.Cleanup(func() { c.Close() })
	return c
}

// ---- raw

type rawRedis struct{ c *goredis.Client }

var rawRelease = goredis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

func newRawRedis(b *testing.B, base string) peerLocker { return rawRedis{goredisClient(b, base)} }

func (r rawRedis) try(ctx context.Context, key string) (func() error, bool, error) {
	val := fmt.Sprint(time.Now().UnixNano())
	ok, err := r.c.SetNX(ctx, key, val, time.Minute).Result()
	if err != nil || !ok {
		return nil, false, err
	}
	return func() error {
		n, err := rawRelease.Run(ctx, r.c, []string{key}, val).Int()
		if err == nil && n != 1 {
			err = errors.New("raw release: not held")
		}
		return err
	}, true, nil
}

func (r rawRedis) acquire(ctx context.Context, key string) (func() error, error) {
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

// ---- warden

type wardenPeer struct{ l *lock.Locker }

func newWardenPeer(b *testing.B, ns string) peerLocker {
	l, err := lock.New(open(b, ns), &lock.Options{TTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return wardenPeer{l}
}

func (w wardenPeer) try(ctx context.Context, key string) (func() error, bool, error) {
	l, err := w.l.TryAcquire(ctx, key)
	if errors.Is(err, lock.ErrLocked) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return func() error { return l.Release(ctx) }, true, nil
}

func (w wardenPeer) acquire(ctx context.Context, key string) (func() error, error) {
	l, err := w.l.Acquire(ctx, key)
	if err != nil {
		return nil, err
	}
	return func() error { return l.Release(ctx) }, nil
}

// ---- bsm/redislock

type bsmLock struct{ c *redislock.Client }

func newRedislock(b *testing.B, base string) peerLocker {
	return bsmLock{redislock.New(goredisClient(b, base))}
}

func (r bsmLock) try(ctx context.Context, key string) (func() error, bool, error) {
	l, err := r.c.Obtain(ctx, key, time.Minute, nil)
	if errors.Is(err, redislock.ErrNotObtained) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return func() error { return l.Release(ctx) }, true, nil
}

func (r bsmLock) acquire(ctx context.Context, key string) (func() error, error) {
	l, err := r.c.Obtain(ctx, key, time.Minute, &redislock.Options{RetryStrategy: redislock.LinearBackoff(10 * time.Millisecond)})
	if err != nil {
		return nil, err
	}
	return func() error { return l.Release(ctx) }, nil
}

// ---- redsync

type redsyncLock struct{ rs *redsync.Redsync }

func newRedsync(b *testing.B, base string) peerLocker {
	return redsyncLock{redsync.New(redsyncgoredis.NewPool(goredisClient(b, base)))}
}

func (r redsyncLock) try(ctx context.Context, key string) (func() error, bool, error) {
	m := r.rs.NewMutex(key, redsync.WithExpiry(time.Minute), redsync.WithTries(1))
	if err := m.TryLockContext(ctx); err != nil {
		var taken *redsync.ErrTaken
		if errors.As(err, &taken) || errors.Is(err, redsync.ErrFailed) {
			return nil, false, nil
		}
		return nil, false, err
	}
	return func() error { _, err := m.UnlockContext(ctx); return err }, true, nil
}

func (r redsyncLock) acquire(ctx context.Context, key string) (func() error, error) {
	m := r.rs.NewMutex(key, redsync.WithExpiry(time.Minute), redsync.WithTries(math.MaxInt32))
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return func() error { _, err := m.UnlockContext(ctx); return err }, nil
}

// ---- rueidislock

type rueidisLock struct{ l rueidislock.Locker }

func newRueidislock(b *testing.B, base string) peerLocker {
	u, err := url.Parse(base)
	if err != nil {
		b.Fatal(err)
	}
	l, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption:   rueidis.ClientOption{InitAddress: []string{u.Host}},
		KeyMajority:    1,
		KeyValidity:    time.Minute,
		NoLoopTracking: true,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(l.Close)
	return rueidisLock{l}
}

func (r rueidisLock) try(ctx context.Context, key string) (func() error, bool, error) {
	_, cancel, err := r.l.TryWithContext(ctx, key)
	if errors.Is(err, rueidislock.ErrNotLocked) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return func() error { cancel(); return nil }, true, nil
}

func (r rueidisLock) acquire(ctx context.Context, key string) (func() error, error) {
	_, cancel, err := r.l.WithContext(ctx, key)
	if err != nil {
		return nil, err
	}
	return func() error { cancel(); return nil }, nil
}

// ---- the measurements

// peerCycle: one uncontended acquire and release per operation. The
// acquire is the waiting one: its first attempt is immediate in every
// library, and rueidislock releases in the background (its cancel returns
// before the key is deleted), so its next acquire may find the key still
// held and wait for the release.
func peerCycle(b *testing.B, l peerLocker) {
	ctx := context.Background()
	key := redisKey()
	for b.Loop() {
		rel, err := l.acquire(ctx, key)
		if err != nil {
			b.Fatal("acquire:", err)
		}
		if err := rel(); err != nil {
			b.Fatal("release:", err)
		}
	}
}

// peerContend: 8 workers, each with its own locker (connections), take
// the one key in turn and hold it 1 ms, until b.N acquisitions in all.
func peerContend(b *testing.B, mk func() peerLocker) {
	const workers = 8
	ctx := context.Background()
	key := redisKey()
	var ls []peerLocker
	for len(ls) < workers {
		ls = append(ls, mk())
	}
	var next, stalls atomic.Int64
	per := make([]int64, workers)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				rel, err := acquireBounded(ctx, ls[w], key, &stalls)
				if err != nil {
					b.Error("acquire:", err)
					return
				}
				time.Sleep(time.Millisecond)
				per[w]++
				if err := rel(); err != nil {
					b.Error("release:", err)
					return
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/el.Seconds(), "acq/s")
	b.ReportMetric(float64(slices.Min(per)), "min-per-worker")
	b.ReportMetric(float64(slices.Max(per)), "max-per-worker")
	b.ReportMetric(float64(stalls.Load()), "stalls")
}

// stallAfter bounds one waiting acquire of the contention and hand-off
// cases. A waiter still waiting then — while the key is free, or held
// only by workers that take turns every millisecond — has missed its
// wake-up: rueidislock's waiters wait for a client-side-caching
// invalidation with no timeout, and under contention one sometimes never
// comes. The case counts it as a stall (metric "stalls") and asks again.
const stallAfter = 2 * time.Second

// acquireBounded is l.acquire bounded by stallAfter, retried after each
// stall. The context of an acquire that succeeds in time lives until the
// release: rueidislock ties its lock to that context.
func acquireBounded(ctx context.Context, l peerLocker, key string, stalls *atomic.Int64) (func() error, error) {
	for {
		actx, cancel := context.WithCancel(ctx)
		timer := time.AfterFunc(stallAfter, cancel)
		rel, err := l.acquire(actx, key)
		if timer.Stop() {
			if err != nil {
				cancel()
				return nil, err
			}
			return func() error { err := rel(); cancel(); return err }, nil
		}
		if err == nil {
			_ = rel()
		}
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		stalls.Add(1)
	}
}

// peerHandoff: holder takes the key; waiter, on other connections, waits
// for it; the holder releases; the latency is release → waiter acquired.
func peerHandoff(b *testing.B, holder, waiter peerLocker) {
	ctx := context.Background()
	key := redisKey()
	var lat []time.Duration
	var stalls atomic.Int64
	for b.Loop() {
		// The previous waiter's release may still be on its way
		// (rueidislock releases in the background): wait for the key.
		rel, err := acquireBounded(ctx, holder, key, &stalls)
		if err != nil {
			b.Fatal("holder:", err)
		}
		type result struct {
			at  time.Time
			rel func() error
			err error
		}
		got := make(chan result, 1)
		go func() {
			wrel, err := acquireBounded(ctx, waiter, key, &stalls)
			got <- result{time.Now(), wrel, err}
		}()
		// Let the waiter find the lock held and start waiting (this
		// shapes the scenario; it is not a measurement).
		time.Sleep(20 * time.Millisecond)
		released := time.Now()
		if err := rel(); err != nil {
			b.Fatal(err)
		}
		r := <-got
		if r.err != nil {
			b.Fatal("waiter:", r.err)
		}
		lat = append(lat, r.at.Sub(released))
		if err := r.rel(); err != nil {
			b.Fatal("waiter release:", err)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), HandoffMetric)
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds()), HandoffP99Metric)
	b.ReportMetric(float64(stalls.Load()), "stalls")
}
