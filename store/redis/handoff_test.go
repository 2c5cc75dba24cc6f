package redis_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/fairtest"
	"github.com/warden-go/warden/internal/testkit"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/store/redis"
)

// The hand-off tests: a lock waiter queues beside the lock record, a
// release hands the key to the queue's head for a bounded time, in the
// order the waiters queued across processes; the lock record alone
// decides who holds the key.

// handoffChildEnv carries the JSON handoffChild of a child process of
// these tests (this test binary, run again).
const handoffChildEnv = "WARDEN_REDIS_HANDOFF_CHILD"

// handoffChild tells a child process what to do.
type handoffChild struct {
	Role    string // "fair": workers take turns; "wait": one waiting Acquire, until killed
	URL     string
	Addrs   []string // fair: the servers of the counter
	Cluster bool
	Workers int
	Key     string
	Total   int    // fair: acquisitions in all, counted in Counter
	Counter string // fair: the counter's Redis key
}

// fairResult is what a fair child reports.
type fairResult = testkit.FairResult

func init() {
	// The child processes run the same binary; they never reach the tests.
	if js, ok := os.LookupEnv(handoffChildEnv); ok {
		os.Exit(runHandoffChild(js))
	}
}

func runHandoffChild(js string) int {
	var cfg handoffChild
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	switch cfg.Role {
	case "wait":
		st, err := redis.Open(ctx, cfg.URL, nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		l, err := lock.New(st, &lock.Options{TTL: time.Minute})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		fmt.Println(l.Owner())
		_, err = l.Acquire(ctx, cfg.Key) // until the parent kills this process
		fmt.Fprintln(os.Stderr, "the waiting child's Acquire returned:", err)
		return 2
	case "fair":
		return runFairChild(ctx, cfg)
	}
	fmt.Fprintln(os.Stderr, "unknown role", cfg.Role)
	return 2
}

// runFairChild: Workers Lockers, each on a store of its own, take the key
// in turn until the counter, bumped under the lock, passes Total
// (fairtest.Child).
func runFairChild(ctx context.Context, cfg handoffChild) int {
	counter := goredis.NewUniversalClient(&goredis.UniversalOptions{Addrs: cfg.Addrs, IsClusterMode: cfg.Cluster})
	defer counter.Close()
	var lockers []*lock.Locker
	for range cfg.Workers {
		st, err := redis.Open(ctx, cfg.URL, nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer st.Close()
		l, err := lock.New(st, &lock.Options{TTL: 30 * time.Second})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer l.Close()
		lockers = append(lockers, l)
	}
	// Each holding lasts 1 ms (the bench's fairness scenario).
	return fairtest.Child(func() testkit.FairResult {
		return fairtest.Run(ctx, lockers, cfg.Key, cfg.Total, time.Millisecond, func(ctx context.Context) (int64, error) {
			return counter.Incr(ctx, cfg.Counter).Result()
		})
	})
}

// startChild starts a child process with cfg; its stdout is returned.
func startChild(t *testing.T, ctx context.Context, cfg handoffChild) (*exec.Cmd, io.WriteCloser, *bufio.Reader) {
	t.Helper()
	js, _ := json.Marshal(cfg)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), handoffChildEnv+"="+string(js))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, in, bufio.NewReader(out)
}

func readLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	s, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("child output: %v", err)
	}
	return strings.TrimSuffix(s, "\n")
}

func handoffCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func tagged(name string) string {
	return name + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
}

// handoffServer is one of the test servers, reached by URL and by a raw
// client.
type handoffServer struct {
	name    string
	url     func(testing.TB, string) string
	addrs   func(testing.TB) []string
	cluster bool
	client  func(testing.TB) goredis.UniversalClient
}

var handoffServers = []handoffServer{
	{"single", serverURL, func(t testing.TB) []string { return []string{serverAddr(t)} }, false,
		func(t testing.TB) goredis.UniversalClient { return singleClient(t) }},
	{"cluster", clusterURL, clusterAddrs, true,
		func(t testing.TB) goredis.UniversalClient { return clusterClient(t) }},
}

func openStore(t *testing.T, u func(testing.TB, string) string, prefix string) *warden.Store {
	t.Helper()
	st, err := redis.Open(context.Background(), u(t, prefix), nil)
	if err != nil {
		t.Fatal(err)
	}
	cleanNamespace(t, u(t, ""), prefix)
	t.Cleanup(func() { st.Close() })
	return st
}

func newLocker(t *testing.T, st *warden.Store, opts *lock.Options) *lock.Locker {
	t.Helper()
	l, err := lock.New(st, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

type acquired = fairtest.Acquired

var acquireAsync = fairtest.AcquireAsync

// waitFor polls cond (the server's state) until it holds; the test fails
// if ctx ends first.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not a synchronisation
	}
}

// queue returns the owners queued for key, first first.
func queue(t *testing.T, c goredis.UniversalClient, st *warden.Store, key string) []string {
	t.Helper()
	_, q, _ := redis.QueueKeys(st, key, "")
	owners, err := c.ZRange(context.Background(), q, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	return owners
}

// turn returns the owner the key's turn was handed to, and its end
// (server clock), if any.
func turn(t *testing.T, c goredis.UniversalClient, st *warden.Store, key string) (string, time.Time) {
	t.Helper()
	rk, _, _ := redis.QueueKeys(st, key, "")
	v, err := c.HMGet(context.Background(), rk, "n", "u").Result()
	if err != nil {
		t.Fatal(err)
	}
	owner, _ := v[0].(string)
	ms, _ := strconv.ParseInt(fmt.Sprint(v[1]), 10, 64)
	return owner, time.UnixMilli(ms).UTC()
}

// TestHandoffFairAcrossProcesses: 2 processes × 4 workers (a Locker and a
// store each) take one key in turn, bumping a counter and holding the key
// 1 ms, until the counter reaches 160; on the single server and on the
// cluster. Waiters queue beside the lock record, so every worker gets
// about its share: the fewest acquisitions of a worker are at least half
// the most (with pub/sub wake-ups alone, releasers that asked again at
// once took the key back: 0.1 to 0.45). The tokens increase with the
// counter: one holder at a time.
func TestHandoffFairAcrossProcesses(t *testing.T) {
	for _, srv := range handoffServers {
		t.Run(srv.name, func(t *testing.T) {
			srv.url(t, "")
			testkit.FairTwice(t, func(attempt int) bool { return handoffFairRun(t, srv, attempt) })
		})
	}
}

// handoffFairRun is one run of TestHandoffFairAcrossProcesses; it reports
// whether the hand-off was fair (min/max ≥ 0.5).
func handoffFairRun(t *testing.T, srv handoffServer, attempt int) bool {
	const procs, workers, total = 2, 4, 160
	ctx := handoffCtx(t)
	prefix := tagged(fmt.Sprintf("handofffair%d", attempt))
	cleanNamespace(t, srv.url(t, ""), prefix)
	cfg := handoffChild{Role: "fair", URL: srv.url(t, prefix), Addrs: srv.addrs(t), Cluster: srv.cluster,
		Workers: workers, Key: "fair", Total: total, Counter: prefix + "counter"}
	js, _ := json.Marshal(cfg)
	results := fairtest.Children(t, ctx, procs, handoffChildEnv, string(js))
	return testkit.CheckFair(t, results, workers, total)
}

// TestHandoffReleaserDoesNotBarge: a holder releases while a waiter of
// another store is queued, and asks again at once. The key goes to the
// waiter: the releaser's TryAcquire is refused (naming the waiter, whose
// turn it is), its Acquire queues behind.
func TestHandoffReleaserDoesNotBarge(t *testing.T) {
	ctx := handoffCtx(t)
	prefix := tagged("handoffbarge")
	hst := openStore(t, serverURL, prefix)
	holder := newLocker(t, hst, &lock.Options{TTL: time.Minute})
	waiter := newLocker(t, openStore(t, serverURL, prefix), &lock.Options{TTL: time.Minute})
	c := singleClient(t)
	for round := range 3 {
		held, err := holder.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		got := acquireAsync(ctx, waiter, "k")
		waitFor(t, ctx, "the waiter to queue", func() bool { return slices.Equal(queue(t, c, hst, "k"), []string{waiter.Owner()}) })
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		again, err := holder.TryAcquire(ctx, "k")
		if err == nil {
			again.Release(ctx)
			t.Fatalf("round %d: the releaser took the key back past the waiter it had woken", round)
		}
		var he *lock.HeldError
		if !errors.As(err, &he) {
			t.Fatal(err)
		}
		next := acquireAsync(ctx, holder, "k") // the releaser queues
		r := <-got
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		if he.Owner != waiter.Owner() {
			t.Errorf("round %d: the releaser was refused for %q, want the waiter %q whose turn it was", round, he.Owner, waiter.Owner())
		}
		if r.Lease.Token() <= held.Token() {
			t.Errorf("token %d after %d", r.Lease.Token(), held.Token())
		}
		waitFor(t, ctx, "the releaser to queue", func() bool { return slices.Equal(queue(t, c, hst, "k"), []string{holder.Owner()}) })
		if err := r.Lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r = <-next
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		if err := r.Lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if q := queue(t, c, hst, "k"); len(q) != 0 {
			t.Errorf("round %d: queue %v after every waiter acquired, want it empty", round, q)
		}
	}
}

// TestHandoffDeadWaiter: the first of two queued waiters is a process
// killed with SIGKILL just before the holder releases. The turn goes to it
// (its queue entry has not run out yet), nobody takes it, and it lapses:
// the live waiter then gets the key — although the holder's lease, which
// bounds its wait, runs a minute — and only after the dead waiter's turn
// ended (server clock). A dead waiter delays the others by the turn's
// grace plus one renewal of a live waiter's entry, not by the holder's
// TTL.
func TestHandoffDeadWaiter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := tagged("handoffdead")
	st := openStore(t, serverURL, prefix)
	c := singleClient(t)
	holder := newLocker(t, st, &lock.Options{TTL: time.Minute})
	held, err := holder.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	cmd, _, out := startChild(t, ctx, handoffChild{Role: "wait", URL: serverURL(t, prefix), Key: "k"})
	dead := readLine(t, out)
	waitFor(t, ctx, "the child to queue", func() bool { return slices.Equal(queue(t, c, st, "k"), []string{dead}) })
	waiter := newLocker(t, openStore(t, serverURL, prefix), &lock.Options{TTL: time.Minute})
	got := acquireAsync(ctx, waiter, "k")
	waitFor(t, ctx, "the live waiter to queue", func() bool {
		return slices.Equal(queue(t, c, st, "k"), []string{dead, waiter.Owner()})
	})
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	to, until := turn(t, c, st, "k")
	r := <-got
	if r.Err != nil {
		t.Fatalf("the live waiter did not get the key: %v", r.Err)
	}
	defer r.Lease.Release(ctx)
	rec, found, err := st.Locks().Get(ctx, "k")
	if err != nil || !found || rec.Token != r.Lease.Token() {
		t.Fatalf("Get = %+v found=%v err=%v, want the live waiter's holding", rec, found, err)
	}
	switch to {
	case dead:
		if rec.AcquiredAt.Before(until) {
			t.Errorf("the live waiter acquired at %v, before the dead waiter's turn ended at %v", rec.AcquiredAt, until)
		}
	case waiter.Owner():
		// The dead waiter's entry ran out before the release (a stalled
		// machine): it never got the turn.
		t.Logf("the dead waiter's queue entry ran out before the release")
	default:
		t.Fatalf("the release handed the turn to %q, want the dead waiter %q (or the live one)", to, dead)
	}
	if q := queue(t, c, st, "k"); len(q) != 0 {
		t.Errorf("queue %v after the live waiter acquired, want it empty (the dead waiter's entry gone)", q)
	}
}

// TestHandoffTurnGivenUpPassesOn: the waiter a release woke gives its
// turn up without taking the key (LeaveLock, as when its Acquire's
// context ends); the turn passes to the next waiter in the queue, which
// takes the key, and a newcomer is refused throughout. A waiter whose
// Acquire gives up while queued leaves the queue at once.
func TestHandoffTurnGivenUpPassesOn(t *testing.T) {
	ctx := handoffCtx(t)
	prefix := tagged("handoffpass")
	st := openStore(t, serverURL, prefix)
	c := singleClient(t)
	holder := newLocker(t, st, &lock.Options{TTL: time.Minute})
	w1 := openStore(t, serverURL, prefix).Driver().(driver.LockWaiter)
	w2 := newLocker(t, openStore(t, serverURL, prefix), &lock.Options{TTL: time.Minute})
	quitter := newLocker(t, openStore(t, serverURL, prefix), &lock.Options{TTL: time.Minute})
	newcomer := newLocker(t, openStore(t, serverURL, prefix), nil)

	held, err := holder.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	woken := make(chan error, 1)
	go func() {
		again, err := w1.WaitLock(ctx, "k", "w1", time.Minute)
		if err == nil && !again {
			err = errors.New("WaitLock returned false")
		}
		woken <- err
	}()
	waitFor(t, ctx, "the first waiter to queue", func() bool { return slices.Equal(queue(t, c, st, "k"), []string{"w1"}) })
	qctx, qcancel := context.WithCancel(ctx)
	gaveUp := acquireAsync(qctx, quitter, "k")
	waitFor(t, ctx, "the quitter to queue", func() bool {
		return slices.Equal(queue(t, c, st, "k"), []string{"w1", quitter.Owner()})
	})
	got := acquireAsync(ctx, w2, "k")
	waitFor(t, ctx, "the second waiter to queue", func() bool {
		return slices.Equal(queue(t, c, st, "k"), []string{"w1", quitter.Owner(), w2.Owner()})
	})
	qcancel()
	if r := <-gaveUp; !errors.Is(r.Err, context.Canceled) {
		t.Fatalf("the quitter's Acquire: %v, want context.Canceled", r.Err)
	}
	if q := queue(t, c, st, "k"); !slices.Equal(q, []string{"w1", w2.Owner()}) {
		t.Fatalf("queue %v after the quitter gave up, want [w1 %s]", q, w2.Owner())
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-woken; err != nil {
		t.Fatal(err)
	}
	if _, err := newcomer.TryAcquire(ctx, "k"); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("a newcomer's TryAcquire of a key handed to a waiter: %v, want ErrLocked", err)
	}
	w1.LeaveLock("k", "w1")
	if to, _ := turn(t, c, st, "k"); to != w2.Owner() {
		// w2 may have taken the key already: then the turn is cleared.
		if rec, found, err := st.Locks().Get(ctx, "k"); err != nil || !found || rec.Owner != w2.Owner() {
			t.Fatalf("after the woken waiter gave up: turn %q, holding %+v (found=%v, err=%v); want the turn or the key the second waiter's", to, rec, found, err)
		}
	}
	if _, err := newcomer.TryAcquire(ctx, "k"); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("a newcomer's TryAcquire after the woken waiter gave up: %v, want ErrLocked (the next waiter's turn)", err)
	}
	r := <-got
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if r.Lease.Token() <= held.Token() {
		t.Errorf("token %d after %d", r.Lease.Token(), held.Token())
	}
	if err := r.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if q := queue(t, c, st, "k"); len(q) != 0 {
		t.Errorf("queue %v at the end, want it empty", q)
	}
}

// TestHandoffHolderOutsideQueue: a holding written without the hand-off
// mark (as a warden without hand-off writes it) is outside the queue: a
// waiter does not queue behind it (WaitLock reports false: poll, woken by
// the store's notifications as before), and still gets the key once it is
// released.
func TestHandoffHolderOutsideQueue(t *testing.T) {
	ctx := handoffCtx(t)
	prefix := tagged("handoffoutside")
	st := openStore(t, serverURL, prefix)
	c := singleClient(t)
	rk, _, _ := redis.QueueKeys(st, "k", "")
	now := time.Now().UnixMilli()
	if err := c.HSet(ctx, rk, "o", "old", "t", strconv.FormatInt(now*4096, 10), "a", now, "e", now+60_000).Err(); err != nil {
		t.Fatal(err)
	}
	again, err := st.Driver().(driver.LockWaiter).WaitLock(ctx, "k", "w", time.Minute)
	if err != nil || again {
		t.Fatalf("WaitLock behind a holding outside the queue = %v, %v; want false (poll)", again, err)
	}
	if q := queue(t, c, st, "k"); len(q) != 0 {
		t.Errorf("queue %v behind a holding outside the queue, want it empty", q)
	}
	waiter := newLocker(t, st, &lock.Options{RetryMin: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond})
	got := acquireAsync(ctx, waiter, "k")
	if err := c.HSet(ctx, rk, "o", "").Err(); err != nil { // released the old way
		t.Fatal(err)
	}
	r := <-got
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if err := r.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestHandoffCloseEndsWaits: closing a store ends a waiter blocked in
// the queue (its Acquire returns ErrClosed), and its wait.
func TestHandoffCloseEndsWaits(t *testing.T) {
	ctx := handoffCtx(t)
	prefix := tagged("handoffclose")
	st := openStore(t, serverURL, prefix)
	c := singleClient(t)
	holder := newLocker(t, st, nil)
	wst, err := redis.Open(ctx, serverURL(t, prefix), nil)
	if err != nil {
		t.Fatal(err)
	}
	waiter := newLocker(t, wst, nil)
	held, err := holder.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	got := acquireAsync(ctx, waiter, "k")
	waitFor(t, ctx, "the waiter to queue", func() bool { return len(queue(t, c, st, "k")) == 1 })
	if err := wst.Close(); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if !errors.Is(r.Err, warden.ErrClosed) && !errors.Is(r.Err, lock.ErrClosed) {
		t.Errorf("Acquire on a store closed while it waited: %v, want ErrClosed", r.Err)
	}
	if n := redis.WaitsOut(wst); n != 0 {
		t.Errorf("%d waits out after Close, want 0", n)
	}
	// The closed store's waiter left the queue: it keeps no place that a
	// release would hand a turn to.
	if q := queue(t, c, st, "k"); len(q) != 0 {
		t.Errorf("queue after the waiting store closed: %v, want empty", q)
	}
}

// TestHandoffWaitsBounded: a store with handoff_conns=1 runs one wait at
// a time; a second waiter polls (it does not queue) and both still get
// their keys.
func TestHandoffWaitsBounded(t *testing.T) {
	ctx := handoffCtx(t)
	prefix := tagged("handoffbound")
	st := openStore(t, serverURL, prefix)
	c := singleClient(t)
	bst, err := redis.Open(ctx, serverURL(t, prefix)+"&handoff_conns=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bst.Close() })
	holder := newLocker(t, st, nil)
	var leases []*lock.Lease
	for _, k := range []string{"k0", "k1"} {
		lease, err := holder.TryAcquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, lease)
	}
	opts := &lock.Options{RetryMin: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond}
	got0 := acquireAsync(ctx, newLocker(t, bst, opts), "k0")
	waitFor(t, ctx, "the first waiter to queue", func() bool { return len(queue(t, c, st, "k0")) == 1 })
	got1 := acquireAsync(ctx, newLocker(t, bst, opts), "k1")
	if err := leases[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got1
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if q := queue(t, c, st, "k1"); len(q) != 0 {
		t.Errorf("the waiter beyond the bound queued: %v", q)
	}
	if n := redis.WaitsOut(bst); n != 1 {
		t.Errorf("%d waits out, want 1 (the bound)", n)
	}
	r.Lease.Release(ctx)
	if err := leases[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r = <-got0; r.Err != nil {
		t.Fatal(r.Err)
	}
	r.Lease.Release(ctx)
}
