package cache_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/cache"
	"github.com/warden-go/warden/internal/hangstore"
	"github.com/warden-go/warden/internal/testkit"
)

// checkDeadlines fails the test unless every hung call of op ran on a
// context whose deadline came before the caller's.
func checkDeadlines(t *testing.T, h *hangstore.Store, op string, caller time.Time) {
	t.Helper()
	for i, dl := range h.Deadlines(op) {
		if dl.IsZero() || !dl.Before(caller) {
			t.Errorf("%s %d ran with deadline %v, not before the caller's %v: a hung store holds the caller to its deadline", op, i, dl, caller)
		}
	}
}

// callerDeadline runs check with a caller whose deadline is d away, then
// 2d, 4d, … while check reports that it could not decide: the caller's
// own deadline passed before the call returned, on a machine too slow for
// d (the store budgets under test are fractions of the caller's time, and
// the loader needs the rest). Tests assert behaviour, not speed: a slow
// machine is no failure. check reports real failures itself (checking
// first what holds whatever the machine's speed, like the budgets'
// deadlines); the doubling stops at the first. A check that never decides
// is reported by go test's -timeout.
func callerDeadline(t *testing.T, d time.Duration, check func(d time.Duration) (decided bool)) {
	t.Helper()
	for !check(d) && !t.Failed() {
		t.Logf("the caller's deadline of %v passed before the call returned (slow machine): again with %v", d, 2*d)
		d *= 2
	}
}

// With default options and a store that stops answering, a caller with a
// 50 ms deadline gets the loaded value, not its own deadline's error: the
// lookup is bounded by half of the caller's remaining time, the loader
// runs without the store, the value is served without waiting for its
// write-back, and the fallback is counted. With FailOnStoreError the
// caller gets the store's timeout (warden.ErrStoreTimeout), not its own
// deadline's error. (On a machine too slow for 50 ms, the deadline
// doubles until the caller's own deadline no longer passes first.)
func TestGetOrLoadHungStoreWithinCallerDeadline(t *testing.T) {
	callerDeadline(t, 50*time.Millisecond, func(d time.Duration) bool {
		db := testkit.DBName(t)
		h := hangstore.New(testkit.MemoryDriver(db), hangstore.CacheGet, hangstore.CacheSet, hangstore.LockAcquire)
		st := testkit.Open(t, h, quiet)
		c := newCache[string](t, st, nil)
		strict := newCache[string](t, st, &cache.Options{FailOnStoreError: true})
		defer close(h.Release) // before the caches' Close, which waits for the write-back

		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		deadline, _ := ctx.Deadline()
		var loads atomic.Int32
		v, err := c.GetOrLoad(ctx, "k", func(ctx context.Context) (string, error) {
			loads.Add(1)
			return "fresh", ctx.Err()
		})
		checkDeadlines(t, h, hangstore.CacheGet, deadline)
		checkDeadlines(t, h, hangstore.LockAcquire, deadline)
		if ctx.Err() != nil {
			return false // the caller's deadline passed before GetOrLoad returned
		}
		if err != nil || v != "fresh" || loads.Load() != 1 {
			t.Fatalf("GetOrLoad on a hung store = %q, %v after %d loads; want the loaded value", v, err, loads.Load())
		}
		if s := c.Stats(); s.StoreFallbacks != 1 || s.Loads != 1 {
			t.Fatalf("stats %+v: want 1 store fallback and 1 load", s)
		}

		sctx, scancel := context.WithTimeout(context.Background(), d)
		defer scancel()
		_, err = strict.GetOrLoad(sctx, "k", func(context.Context) (string, error) { loads.Add(1); return "fresh", nil })
		if sctx.Err() != nil {
			return false
		}
		if !errors.Is(err, warden.ErrStoreTimeout) || errors.Is(err, context.DeadlineExceeded) || loads.Load() != 1 {
			t.Fatalf("FailOnStoreError on a hung store: %v after %d more loads; want warden.ErrStoreTimeout and no load", err, loads.Load()-1)
		}
		return true
	})
}

// A store that answers lookups and the load lease but whose write hangs:
// the caller gets the loaded value within its deadline, and the value
// lands in the store once it answers. (The deadline doubles on a machine
// too slow for 50 ms, as above.)
func TestGetOrLoadHungWriteBackDoesNotHoldTheCaller(t *testing.T) {
	callerDeadline(t, 50*time.Millisecond, func(d time.Duration) bool {
		db := testkit.DBName(t)
		h := hangstore.New(testkit.MemoryDriver(db), hangstore.CacheSet)
		st := testkit.Open(t, h, quiet)
		c, err := cache.New[string](st, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		v, err := c.GetOrLoad(ctx, "k", func(context.Context) (string, error) { return "fresh", nil })
		late := ctx.Err() != nil // the caller's deadline passed before GetOrLoad returned
		if !late && (err != nil || v != "fresh") {
			close(h.Release)
			_ = c.Close()
			t.Fatalf("GetOrLoad with a hung write = %q, %v; want the loaded value", v, err)
		}
		close(h.Release) // the store answers: the write-back lands
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if late {
			return false
		}
		got, err := cache.New[string](testkit.Open(t, testkit.MemoryDriver(db), quiet), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer got.Close()
		if v, err := got.Get(context.Background(), "k"); err != nil || v != "fresh" {
			t.Fatalf("after the store answered, the value is %q, %v; want it stored", v, err)
		}
		return true
	})
}
