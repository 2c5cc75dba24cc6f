package cache_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/cache"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/testkit"
	"github.com/warden-go/warden/store/memory"
)

// TestMain fails the run if a goroutine of this package outlives the
// tests (every test closes its caches).
func TestMain(m *testing.M) {
	testkit.MainNoLeaks(m, "leaked cache goroutines", func(g string) bool {
		return strings.Contains(g, "warden/cache.") && !strings.Contains(g, "leaked")
	})
}

// quiet drops the warnings the tests provoke on purpose.
var quiet = &warden.Options{Logger: slog.New(slog.DiscardHandler)}

// stores opens n stores on one memory database with one prefix, like n
// processes connected to one server.
func stores(t *testing.T, n int) []*warden.Store {
	t.Helper()
	return testkit.Stores(t, n, quiet)
}

func newCache[T any](t *testing.T, st *warden.Store, opts *cache.Options) *cache.Cache[T] {
	t.Helper()
	c, err := cache.New[T](st, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestGetSetZeroValueAndMiss(t *testing.T) {
	ctx := context.Background()
	st := stores(t, 1)[0]
	c := newCache[int](t, st, nil)

	if _, err := c.Get(ctx, "n"); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("Get of a missing key: err = %v, want ErrNotFound", err)
	}
	if err := c.Set(ctx, "n", 0); err != nil {
		t.Fatal(err)
	}
	v, err := c.Get(ctx, "n")
	if err != nil || v != 0 {
		t.Fatalf("Get of a cached zero = %v, %v; want 0, nil", v, err)
	}
	if ok, err := c.Has(ctx, "n"); err != nil || !ok {
		t.Fatalf("Has = %v, %v; want true", ok, err)
	}
	if err := c.Set(ctx, "n", 7); err != nil {
		t.Fatal(err)
	}
	if v, _ := c.Get(ctx, "n"); v != 7 {
		t.Fatalf("Get after overwrite = %d, want 7", v)
	}
	ok, err := c.Delete(ctx, "n")
	if err != nil || !ok {
		t.Fatalf("Delete = %v, %v; want true", ok, err)
	}
	if ok, _ := c.Delete(ctx, "n"); ok {
		t.Fatal("second Delete reported a live entry")
	}
	if _, err := c.Get(ctx, "n"); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("Get after Delete: err = %v, want ErrNotFound", err)
	}
	s := c.Stats()
	if s.Hits != 2 || s.Misses != 2 {
		t.Fatalf("stats = %+v, want 2 hits and 2 misses", s)
	}
}

func TestStructValuesAndInvalidKey(t *testing.T) {
	ctx := context.Background()
	type user struct {
		Name string
		Tags []string
	}
	c := newCache[*user](t, stores(t, 1)[0], nil)
	if err := c.Set(ctx, "u", &user{Name: "Ada", Tags: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	u, err := c.Get(ctx, "u")
	if err != nil || u == nil || u.Name != "Ada" || len(u.Tags) != 1 {
		t.Fatalf("Get = %+v, %v", u, err)
	}
	if err := c.Set(ctx, "nil", nil); err != nil {
		t.Fatal(err)
	}
	if u, err := c.Get(ctx, "nil"); err != nil || u != nil {
		t.Fatalf("Get of a cached nil = %v, %v; want nil, nil", u, err)
	}
	if err := c.Set(ctx, "", &user{}); !errors.Is(err, warden.ErrInvalidKey) {
		t.Fatalf("Set with an empty key: err = %v, want ErrInvalidKey", err)
	}
}

func TestTTLExpiry(t *testing.T) {
	ctx := context.Background()
	c := newCache[string](t, stores(t, 1)[0], &cache.Options{TTL: 40 * time.Millisecond})
	if err := c.Set(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetTTL(ctx, "forever", "v", 0); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "k"); err != nil || v != "v" {
		t.Fatalf("Get before expiry = %q, %v", v, err)
	}
	testkit.Eventually(t, 5*time.Second, "the entry to expire", func() bool {
		_, err := c.Get(ctx, "k")
		return errors.Is(err, cache.ErrNotFound)
	})
	if ok, _ := c.Has(ctx, "k"); ok {
		t.Fatal("Has reports an expired entry")
	}
	if v, err := c.Get(ctx, "forever"); err != nil || v != "v" {
		t.Fatalf("an entry without TTL expired: %q, %v", v, err)
	}
	if err := c.SetTTL(ctx, "k", "v", -time.Second); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Fatalf("negative ttl: err = %v, want ErrInvalidArgument", err)
	}
}

// gate is a loader that counts its calls and blocks until opened.
type gate struct {
	calls atomic.Int64
	open  chan struct{}
	value string
}

func newGate(v string) *gate { return &gate{open: make(chan struct{}), value: v} }

func (g *gate) load(ctx context.Context) (string, error) {
	g.calls.Add(1)
	select {
	case <-g.open:
		return g.value, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func TestGetOrLoadOneLoadPerProcess(t *testing.T) {
	ctx := context.Background()
	var acquires atomic.Int64
	st := warden.New(memory.NewDriver(nil), &warden.Options{Hook: warden.HookFunc(func(_ context.Context, op warden.OpInfo) {
		if op.Op == "lock.acquire" {
			acquires.Add(1)
		}
	})})
	defer st.Close()
	c := newCache[string](t, st, &cache.Options{TTL: time.Minute})
	g := newGate("loaded")

	const n = 50
	var started, done sync.WaitGroup
	started.Add(n)
	done.Add(n)
	errs := make(chan error, n)
	for range n {
		go func() {
			defer done.Done()
			started.Done()
			v, err := c.GetOrLoad(ctx, "k", g.load)
			if err == nil && v != "loaded" {
				err = fmt.Errorf("got %q", v)
			}
			errs <- err
		}()
	}
	started.Wait()
	testkit.Eventually(t, 5*time.Second, "the loader to start", func() bool { return g.calls.Load() > 0 })
	// Every caller waits on the one load before it ends: a caller that
	// looked up the key before the value was stored but joined only after
	// the load ended would start a load of its own (and take a lease, then
	// find the value stored) — correct, but not what this test counts.
	for cache.LoadWaiters(c) < n {
		runtime.Gosched()
	}
	close(g.open)
	done.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := g.calls.Load(); got != 1 {
		t.Fatalf("loader called %d times, want 1", got)
	}
	if got := acquires.Load(); got != 1 {
		t.Fatalf("%d load leases taken, want 1: callers in one process share one load", got)
	}
	if s := c.Stats(); s.Loads != 1 || s.Hits+s.Misses != n {
		t.Fatalf("stats = %+v, want 1 load and %d lookups", s, n)
	}
	if v, err := c.Get(ctx, "k"); err != nil || v != "loaded" {
		t.Fatalf("the loaded value was not stored: %q, %v", v, err)
	}
}

func TestGetOrLoadOneLoadAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	sts := stores(t, 3)
	var caches []*cache.Cache[string]
	for _, st := range sts {
		caches = append(caches, newCache[string](t, st, &cache.Options{TTL: time.Minute, PollMax: 20 * time.Millisecond}))
	}
	g := newGate("shared")

	const n = 50
	var started, done sync.WaitGroup
	started.Add(n)
	done.Add(n)
	errs := make(chan error, n)
	for i := range n {
		c := caches[i%len(caches)]
		go func() {
			defer done.Done()
			started.Done()
			v, err := c.GetOrLoad(ctx, "hot", g.load)
			if err == nil && v != "shared" {
				err = fmt.Errorf("got %q", v)
			}
			errs <- err
		}()
	}
	started.Wait()
	testkit.Eventually(t, 5*time.Second, "the loader to start", func() bool { return g.calls.Load() > 0 })
	// Let the other processes reach their waiting loops before the value
	// appears, so that they really wait on the lease.
	testkit.Eventually(t, 5*time.Second, "every cache to miss", func() bool {
		for _, c := range caches {
			if c.Stats().Misses == 0 {
				return false
			}
		}
		return true
	})
	close(g.open)
	done.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := g.calls.Load(); got != 1 {
		t.Fatalf("loader called %d times across 3 processes, want 1", got)
	}
	// The lease lives in the lock namespace, never among cache keys.
	keys, err := caches[0].Keys(ctx, "")
	if err != nil || len(keys) != 1 || keys[0] != "hot" {
		t.Fatalf("Keys = %q, %v; want [hot]", keys, err)
	}
}

func TestNegativeCaching(t *testing.T) {
	ctx := context.Background()
	st := stores(t, 1)[0]
	var calls atomic.Int64
	absent := func(context.Context) (int, error) {
		calls.Add(1)
		return 0, fmt.Errorf("user 9: %w", cache.ErrNotFound)
	}

	t.Run("off", func(t *testing.T) {
		c := newCache[int](t, st, &cache.Options{Prefix: "off:"})
		calls.Store(0)
		for range 2 {
			if _, err := c.GetOrLoad(ctx, "k", absent); !errors.Is(err, cache.ErrNotFound) {
				t.Fatalf("err = %v, want ErrNotFound", err)
			}
		}
		if calls.Load() != 2 {
			t.Fatalf("loader called %d times, want 2 (absence not cached)", calls.Load())
		}
		if keys, _ := c.Keys(ctx, ""); len(keys) != 0 {
			t.Fatalf("an absence was stored: %q", keys)
		}
	})

	t.Run("on", func(t *testing.T) {
		c := newCache[int](t, st, &cache.Options{Prefix: "on:", NegativeTTL: 60 * time.Millisecond})
		calls.Store(0)
		_, err := c.GetOrLoad(ctx, "k", absent)
		if !errors.Is(err, cache.ErrNotFound) || !strings.Contains(err.Error(), "user 9") {
			t.Fatalf("first call: err = %v, want the loader's ErrNotFound", err)
		}
		if _, err := c.GetOrLoad(ctx, "k", absent); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("second call: err = %v, want ErrNotFound", err)
		}
		if _, err := c.Get(ctx, "k"); !errors.Is(err, cache.ErrNotFound) {
			t.Fatalf("Get of a cached absence: err = %v, want ErrNotFound", err)
		}
		if ok, _ := c.Has(ctx, "k"); ok {
			t.Fatal("Has reports a cached absence as a value")
		}
		if calls.Load() != 1 {
			t.Fatalf("loader called %d times, want 1 (absence cached)", calls.Load())
		}
		if s := c.Stats(); s.NegativeHits != 2 || s.LoadErrors != 0 {
			t.Fatalf("stats = %+v, want 2 negative hits, no load errors", s)
		}
		// After NegativeTTL the loader is asked again.
		testkit.Eventually(t, 5*time.Second, "the absence to expire", func() bool {
			_, _ = c.GetOrLoad(ctx, "k", absent)
			return calls.Load() >= 2
		})
	})
}

func TestStaleWhileRevalidate(t *testing.T) {
	ctx := context.Background()
	sts := stores(t, 3)
	opts := &cache.Options{TTL: 30 * time.Millisecond, StaleWhileRevalidate: time.Hour, PollMax: 20 * time.Millisecond}
	var caches []*cache.Cache[string]
	for _, st := range sts {
		caches = append(caches, newCache[string](t, st, opts))
	}
	if err := caches[0].Set(ctx, "k", "old"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "the value to go stale", func() bool {
		ok, err := caches[0].Has(ctx, "k")
		return err == nil && !ok
	})
	if _, err := caches[0].Get(ctx, "k"); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("Get of a stale value: err = %v, want ErrNotFound", err)
	}

	g := newGate("new")
	var wg sync.WaitGroup
	errs := make(chan error, 30)
	for i := range 30 {
		c := caches[i%3]
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := c.GetOrLoad(ctx, "k", g.load)
			if err == nil && v != "old" {
				err = fmt.Errorf("got %q while the reload is blocked, want the stale value", v)
			}
			errs <- err
		}()
	}
	// Every caller returns the stale value while the reload is blocked.
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, 5*time.Second, "the reload to start", func() bool { return g.calls.Load() > 0 })
	close(g.open)
	testkit.Eventually(t, 5*time.Second, "the reloaded value", func() bool {
		v, err := caches[1].Get(ctx, "k")
		return err == nil && v == "new"
	})
	for _, c := range caches {
		c.Close() // waits for background reloads
	}
	if got := g.calls.Load(); got != 1 {
		t.Fatalf("%d reloads, want exactly 1", got)
	}
	var stale uint64
	for _, c := range caches {
		stale += c.Stats().StaleHits
	}
	if stale != 30 {
		t.Fatalf("%d stale hits, want 30", stale)
	}
}

func TestCallerCancellationDoesNotCancelLoad(t *testing.T) {
	c := newCache[string](t, stores(t, 1)[0], nil)
	var loaderErr atomic.Value
	open := make(chan struct{})
	var calls atomic.Int64
	loader := func(ctx context.Context) (string, error) {
		calls.Add(1)
		select {
		case <-open:
		case <-ctx.Done():
		}
		loaderErr.Store(fmt.Sprint(ctx.Err()))
		return "v", nil
	}

	type key struct{}
	cctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "traced"))
	first := make(chan error, 1)
	go func() {
		_, err := c.GetOrLoad(cctx, "k", func(ctx context.Context) (string, error) {
			if ctx.Value(key{}) != "traced" {
				return "", errors.New("the load context lost the caller's values")
			}
			return loader(ctx)
		})
		first <- err
	}()
	testkit.Eventually(t, 5*time.Second, "the loader to start", func() bool { return calls.Load() == 1 })

	second := make(chan string, 1)
	go func() {
		v, err := c.GetOrLoad(context.Background(), "k", loader)
		if err != nil {
			v = err.Error()
		}
		second <- v
	}()

	cancel()
	// The load still runs (open is closed only below): a cancelled caller
	// that kept waiting for it would never return, and the test would not
	// end.
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: err = %v, want context.Canceled", err)
	}
	close(open)
	if v := <-second; v != "v" {
		t.Fatalf("the other caller got %q, want v", v)
	}
	if e := loaderErr.Load(); e != "<nil>" {
		t.Fatalf("the load's context ended (%v) when one caller gave up", e)
	}
	if calls.Load() != 1 {
		t.Fatalf("loader called %d times, want 1", calls.Load())
	}
	// A caller whose deadline passes while it waits returns its own error.
	g := newGate("x")
	dctx, dcancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer dcancel()
	if _, err := c.GetOrLoad(dctx, "slow", g.load); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	close(g.open)
}

func TestLoaderErrorsAndPanicsAreNotCached(t *testing.T) {
	ctx := context.Background()
	c := newCache[int](t, stores(t, 1)[0], &cache.Options{NegativeTTL: time.Hour})
	boom := errors.New("boom")
	if _, err := c.GetOrLoad(ctx, "k", func(context.Context) (int, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the loader's error", err)
	}
	_, err := c.GetOrLoad(ctx, "k", func(context.Context) (int, error) { panic("kaput") })
	var pe *cache.PanicError
	if !errors.As(err, &pe) || pe.Value != "kaput" || len(pe.Stack) == 0 {
		t.Fatalf("err = %v, want a *PanicError with the value and a stack", err)
	}
	if _, err := c.Get(ctx, "k"); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("a failed load left an entry: %v", err)
	}
	v, err := c.GetOrLoad(ctx, "k", func(context.Context) (int, error) { return 3, nil })
	if err != nil || v != 3 {
		t.Fatalf("load after failures = %d, %v; want 3", v, err)
	}
	if s := c.Stats(); s.Loads != 3 || s.LoadErrors != 2 {
		t.Fatalf("stats = %+v, want 3 loads, 2 load errors", s)
	}
	if _, err := c.GetOrLoad(ctx, "nil", nil); err == nil {
		t.Fatal("a nil loader was accepted")
	}
}

func TestLoadBoundedByLoadLease(t *testing.T) {
	c := newCache[int](t, stores(t, 1)[0], &cache.Options{LoadLease: 30 * time.Millisecond})
	_, err := c.GetOrLoad(context.Background(), "k", func(ctx context.Context) (int, error) {
		<-ctx.Done()
		return 0, ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "LoadLease") {
		t.Fatalf("err = %v, want a LoadLease deadline error", err)
	}
}

func TestTakeOverAfterFailedOrLapsedLoader(t *testing.T) {
	ctx := context.Background()
	sts := stores(t, 2)
	a := newCache[string](t, sts[0], &cache.Options{PollMax: 10 * time.Millisecond})
	b := newCache[string](t, sts[1], &cache.Options{PollMax: 10 * time.Millisecond})

	// A's loader fails while B waits: B takes the lease and loads.
	aStarted, aFail := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		_, err := a.GetOrLoad(ctx, "k", func(context.Context) (string, error) {
			close(aStarted)
			<-aFail
			return "", errors.New("a failed")
		})
		aDone <- err
	}()
	<-aStarted
	bDone := make(chan string, 1)
	go func() {
		v, err := b.GetOrLoad(ctx, "k", func(context.Context) (string, error) { return "from b", nil })
		if err != nil {
			v = err.Error()
		}
		bDone <- v
	}()
	testkit.Eventually(t, 5*time.Second, "B to miss", func() bool { return b.Stats().Misses == 1 })
	close(aFail)
	if err := <-aDone; err == nil || err.Error() != "a failed" {
		t.Fatalf("A: err = %v", err)
	}
	if v := <-bDone; v != "from b" {
		t.Fatalf("B got %q, want its own load", v)
	}

	// A dead process's lease (the documented lock key) lapses: B takes over.
	_, ok, err := sts[0].Locks().Acquire(ctx, "cache-load:dead", "dead-process", 80*time.Millisecond)
	if err != nil || !ok {
		t.Fatalf("cannot plant a lease: %v %v", ok, err)
	}
	v, err := b.GetOrLoad(ctx, "dead", func(ctx context.Context) (string, error) {
		rec, found, err := sts[0].Locks().Get(ctx, "cache-load:dead")
		if err != nil || !found || rec.Owner == "dead-process" {
			return "", fmt.Errorf("the load runs while the lease is %+v (found %v, %v)", rec, found, err)
		}
		return "late", nil
	})
	if err != nil || v != "late" {
		t.Fatalf("GetOrLoad = %q, %v", v, err)
	}
}

func TestKeysAndClear(t *testing.T) {
	ctx := context.Background()
	st := stores(t, 1)[0]
	all := newCache[int](t, st, nil)
	users := newCache[int](t, st, &cache.Options{Prefix: "u*:"})
	orders := newCache[int](t, st, &cache.Options{Prefix: "o:"})

	for i, k := range []string{"a1", "a2", "b", "x*y", "x?y"} {
		if err := users.Set(ctx, k, i); err != nil {
			t.Fatal(err)
		}
	}
	if err := orders.Set(ctx, "a1", 1); err != nil {
		t.Fatal(err)
	}
	if err := all.Set(ctx, "top", 1); err != nil {
		t.Fatal(err)
	}
	check := func(c *cache.Cache[int], pattern string, want ...string) {
		t.Helper()
		got, err := c.Keys(ctx, pattern)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("Keys(%q) = %q, want %q", pattern, got, want)
		}
	}
	check(users, "", "a1", "a2", "b", "x*y", "x?y")
	check(users, "a*", "a1", "a2")
	check(users, `x\*y`, "x*y")
	check(orders, "*", "a1")
	check(all, "", "o:a1", "top", "u*:a1", "u*:a2", "u*:b", "u*:x*y", "u*:x?y")

	n, err := users.Clear(ctx)
	if err != nil || n != 5 {
		t.Fatalf("Clear = %d, %v; want 5", n, err)
	}
	check(users, "")
	check(orders, "", "a1")
	n, err = all.Clear(ctx)
	if err != nil || n != 2 {
		t.Fatalf("Clear of the namespace = %d, %v; want 2", n, err)
	}
	check(all, "")
}

func TestEnvelopeIsUnambiguous(t *testing.T) {
	ctx := context.Background()
	st := stores(t, 1)[0]
	c := newCache[map[string]any](t, st, nil)
	tricky := map[string]any{"_warden": "cache/v1", "absent": true}
	if err := c.Set(ctx, "t", tricky); err != nil {
		t.Fatal(err)
	}
	v, err := c.Get(ctx, "t")
	if err != nil || v["_warden"] != "cache/v1" || v["absent"] != true {
		t.Fatalf("Get = %v, %v; want the value that looks like an envelope", v, err)
	}

	// Plain JSON written by another program is read as is.
	if err := st.Cache().Set(ctx, "foreign", []byte(`{"a":1}`), 0); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "foreign"); err != nil || v["a"] != float64(1) {
		t.Fatalf("Get of a foreign JSON value = %v, %v", v, err)
	}
	// A value without soft expiry is stored as plain JSON.
	if err := c.Set(ctx, "plain", map[string]any{"b": 2}); err != nil {
		t.Fatal(err)
	}
	e, _, err := st.Cache().Get(ctx, "plain")
	if err != nil || string(e.Value) != `{"b":2}` {
		t.Fatalf("stored form = %s, %v; want plain JSON", e.Value, err)
	}
	// An entry of another type is a decode error for Get, a reload for
	// GetOrLoad.
	ints := newCache[int](t, st, nil)
	if _, err := ints.Get(ctx, "plain"); err == nil || errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("Get of an undecodable entry: err = %v, want a decode error", err)
	}
	n, err := ints.GetOrLoad(ctx, "plain", func(context.Context) (int, error) { return 5, nil })
	if err != nil || n != 5 {
		t.Fatalf("GetOrLoad over an undecodable entry = %d, %v; want a reload", n, err)
	}
}

// rawCodec stores strings as their bytes, which are not JSON.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return []byte(*v.(*string)), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*v.(*string) = string(b)
	return nil
}

type ptrCodec struct{ rawCodec }

func (ptrCodec) Marshal(v any) ([]byte, error) {
	s := v.(string)
	return rawCodec{}.Marshal(&s)
}

func TestCustomCodecInEnvelope(t *testing.T) {
	ctx := context.Background()
	st := stores(t, 1)[0]
	c := newCache[string](t, st, &cache.Options{Codec: ptrCodec{}, TTL: time.Hour, StaleWhileRevalidate: time.Hour})
	for _, s := range []string{"\x01\x02 not json", ""} {
		if err := c.Set(ctx, "k", s); err != nil {
			t.Fatal(err)
		}
		v, err := c.Get(ctx, "k")
		if err != nil || v != s {
			t.Fatalf("Get = %q, %v; want %q", v, err, s)
		}
	}
	e, _, _ := st.Cache().Get(ctx, "k")
	if !bytes.HasPrefix(e.Value, []byte(`{"_warden":"cache/v1"`)) {
		t.Fatalf("stored form %s is not an envelope", e.Value)
	}
}

// failingStore wraps the real memory driver; its cache Set fails while
// failSet is true.
type failingStore struct {
	driver.Store
	failSet atomic.Bool
}

func (f *failingStore) Cache() driver.Cache { return &failingCache{Cache: f.Store.Cache(), f: f} }

type failingCache struct {
	driver.Cache
	f *failingStore
}

func (c *failingCache) Set(ctx context.Context, key string, v []byte, ttl time.Duration) error {
	if c.f.failSet.Load() {
		return errors.New("disk full")
	}
	return c.Cache.Set(ctx, key, v, ttl)
}

func TestStoreFailureAfterLoad(t *testing.T) {
	ctx := context.Background()
	fs := &failingStore{Store: memory.NewDriver(nil)}
	var logs testkit.LogBuffer
	st := warden.New(fs, &warden.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer st.Close()
	c := newCache[int](t, st, nil)
	fs.failSet.Store(true)
	v, err := c.GetOrLoad(ctx, "k", func(context.Context) (int, error) { return 4, nil })
	if err != nil || v != 4 {
		t.Fatalf("GetOrLoad = %d, %v; want the loaded value despite the failed write", v, err)
	}
	if c.Stats().Errors != 1 {
		t.Fatalf("stats = %+v, want 1 error", c.Stats())
	}
	logged := logs.String()
	if !strings.Contains(logged, "disk full") {
		t.Fatalf("the failed write was not logged: %q", logged)
	}
	if err := c.Set(ctx, "k", 1); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("Set: err = %v, want the store's error", err)
	}
}

func TestCloseStopsLoads(t *testing.T) {
	c := newCache[int](t, stores(t, 1)[0], nil)
	started := make(chan struct{})
	res := make(chan error, 1)
	go func() {
		_, err := c.GetOrLoad(context.Background(), "k", func(ctx context.Context) (int, error) {
			close(started)
			<-ctx.Done()
			return 0, ctx.Err()
		})
		res <- err
	}()
	<-started
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err == nil {
		t.Fatal("a load stopped by Close returned no error")
	}
	if _, err := c.GetOrLoad(context.Background(), "k", func(context.Context) (int, error) { return 1, nil }); !errors.Is(err, cache.ErrClosed) {
		t.Fatalf("GetOrLoad after Close: err = %v, want ErrClosed", err)
	}
	if err := c.Set(context.Background(), "k", 1); err != nil {
		t.Fatalf("Set after Close: %v", err)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := cache.New[int](memory.New(nil), &cache.Options{TTL: -1}); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Fatalf("negative TTL: err = %v, want ErrInvalidArgument", err)
	}
	if _, err := cache.New[int](nil, nil); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Fatalf("nil store: err = %v, want ErrInvalidArgument", err)
	}
}

// downStore wraps the memory driver; while down is set its cache and lock
// calls fail, and while hung they block until their context ends.
type downStore struct {
	driver.Store
	down, hung atomic.Bool
}

var errStoreDown = errors.New("connection refused (test outage)")

func (d *downStore) wait(ctx context.Context) error {
	if d.hung.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	if d.down.Load() {
		return errStoreDown
	}
	return nil
}

func (d *downStore) Cache() driver.Cache { return downCache{d.Store.Cache(), d} }
func (d *downStore) Locks() driver.Locks { return downLocks{d.Store.Locks(), d} }

type downCache struct {
	driver.Cache
	d *downStore
}

func (c downCache) Get(ctx context.Context, key string) (driver.CacheEntry, bool, error) {
	if err := c.d.wait(ctx); err != nil {
		return driver.CacheEntry{}, false, err
	}
	return c.Cache.Get(ctx, key)
}

func (c downCache) Set(ctx context.Context, key string, v []byte, ttl time.Duration) error {
	if err := c.d.wait(ctx); err != nil {
		return err
	}
	return c.Cache.Set(ctx, key, v, ttl)
}

type downLocks struct {
	driver.Locks
	d *downStore
}

func (l downLocks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	if err := l.d.wait(ctx); err != nil {
		return driver.LockRecord{}, false, err
	}
	return l.Locks.Acquire(ctx, key, owner, ttl)
}

// Issue 13: a cache outage is not a read outage. With the store failing
// or hung, GetOrLoad loads and serves, and counts the fallback; with
// FailOnStoreError it returns the store's error without loading. The
// caller sets no deadline: only StoreTimeout bounds the hung calls (a
// GetOrLoad that waited for them would never return, and the test would
// not end).
func TestGetOrLoadWhenTheStoreIsDown(t *testing.T) {
	d := &downStore{Store: testkit.MemoryDriver(testkit.DBName(t))}
	st := testkit.Open(t, d, quiet)
	c := newCache[string](t, st, &cache.Options{StoreTimeout: 20 * time.Millisecond})
	strict := newCache[string](t, st, &cache.Options{StoreTimeout: 20 * time.Millisecond, FailOnStoreError: true})
	var loads atomic.Int32
	loader := func(context.Context) (string, error) { loads.Add(1); return "fresh", nil }
	for _, mode := range []string{"down", "hung"} {
		d.down.Store(mode == "down")
		d.hung.Store(mode == "hung")
		ctx := context.Background()
		before := loads.Load()
		v, err := c.GetOrLoad(ctx, "k-"+mode, loader)
		if err != nil || v != "fresh" || loads.Load() != before+1 {
			t.Fatalf("%s store: GetOrLoad = %q, %v after %d loads; want the loaded value", mode, v, err, loads.Load()-before)
		}
		_, err = strict.GetOrLoad(ctx, "k-"+mode, loader)
		if err == nil || loads.Load() != before+1 {
			t.Fatalf("%s store with FailOnStoreError: err %v after %d loads; want the store's error, no load", mode, err, loads.Load()-before)
		}
		if mode == "hung" && !errors.Is(err, warden.ErrStoreTimeout) {
			t.Fatalf("hung store with FailOnStoreError: err %v, want warden.ErrStoreTimeout", err)
		}
	}
	if s := c.Stats(); s.StoreFallbacks != 2 || s.Loads != 2 {
		t.Fatalf("stats %+v: want 2 store fallbacks and 2 loads", s)
	}
	// Back up: the next miss takes the usual path.
	d.down.Store(false)
	d.hung.Store(false)
	if v, err := c.GetOrLoad(context.Background(), "k-up", loader); err != nil || v != "fresh" {
		t.Fatal(v, err)
	}
	if v, err := c.Get(context.Background(), "k-up"); err != nil || v != "fresh" {
		t.Fatalf("the loaded value was not stored once the store was back: %q, %v", v, err)
	}
	if s := c.Stats(); s.StoreFallbacks != 2 {
		t.Fatalf("a fallback counted with the store up: %+v", s)
	}
}
