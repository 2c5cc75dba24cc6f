package cache_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/cache"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/testkit"
)

// hungStore wraps the memory driver: its cache and lock operations named
// in ops ("get", "set", "acquire") do not answer — they block until their
// ctx ends or release is closed (the store answers again), then go on to
// the real store.
type hungStore struct {
	driver.Store
	ops     map[string]bool
	release chan struct{}

	mu        sync.Mutex
	deadlines map[string][]time.Time // of the blocked operations' contexts
}

func newHungStore(db string, ops ...string) *hungStore {
	h := &hungStore{Store: testkit.MemoryDriver(db), ops: map[string]bool{}, release: make(chan struct{}), deadlines: map[string][]time.Time{}}
	for _, op := range ops {
		h.ops[op] = true
	}
	return h
}

func (h *hungStore) block(ctx context.Context, op string) error {
	if !h.ops[op] {
		return nil
	}
	dl, _ := ctx.Deadline()
	h.mu.Lock()
	h.deadlines[op] = append(h.deadlines[op], dl)
	h.mu.Unlock()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-h.release:
		return nil
	}
}

// checkDeadlines fails the test unless every blocked operation op ran on
// a context whose deadline came before the caller's.
func (h *hungStore) checkDeadlines(t *testing.T, op string, caller time.Time) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, dl := range h.deadlines[op] {
		if dl.IsZero() || !dl.Before(caller) {
			t.Errorf("%s %d ran with deadline %v, not before the caller's %v: a hung store holds the caller to its deadline", op, i, dl, caller)
		}
	}
}

func (h *hungStore) Cache() driver.Cache { return hungCache{h.Store.Cache(), h} }
func (h *hungStore) Locks() driver.Locks { return hungLocks{h.Store.Locks(), h} }

type hungCache struct {
	driver.Cache
	h *hungStore
}

func (c hungCache) Get(ctx context.Context, key string) (driver.CacheEntry, bool, error) {
	if err := c.h.block(ctx, "get"); err != nil {
		return driver.CacheEntry{}, false, err
	}
	return c.Cache.Get(ctx, key)
}

func (c hungCache) Set(ctx context.Context, key string, v []byte, ttl time.Duration) error {
	if err := c.h.block(ctx, "set"); err != nil {
		return err
	}
	return c.Cache.Set(ctx, key, v, ttl)
}

type hungLocks struct {
	driver.Locks
	h *hungStore
}

func (l hungLocks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	if err := l.h.block(ctx, "acquire"); err != nil {
		return driver.LockRecord{}, false, err
	}
	return l.Locks.Acquire(ctx, key, owner, ttl)
}

// With default options and a store that stops answering, a caller with a
// 50 ms deadline gets the loaded value, not its own deadline's error: the
// lookup is bounded by half of the caller's remaining time, the loader
// runs without the store, the value is served without waiting for its
// write-back, and the fallback is counted. With FailOnStoreError the
// caller gets the store's timeout (warden.ErrStoreTimeout), not its own
// deadline's error.
func TestGetOrLoadHungStoreWithinCallerDeadline(t *testing.T) {
	db := testkit.DBName(t)
	h := newHungStore(db, "get", "set", "acquire")
	st := testkit.Open(t, h, quiet)
	c := newCache[string](t, st, nil)
	strict := newCache[string](t, st, &cache.Options{FailOnStoreError: true})
	defer close(h.release) // before the caches' Close, which waits for the write-back

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	deadline, _ := ctx.Deadline()
	var loads atomic.Int32
	v, err := c.GetOrLoad(ctx, "k", func(ctx context.Context) (string, error) {
		loads.Add(1)
		return "fresh", ctx.Err()
	})
	h.checkDeadlines(t, "get", deadline)
	h.checkDeadlines(t, "acquire", deadline)
	if err != nil || v != "fresh" || loads.Load() != 1 {
		t.Fatalf("GetOrLoad on a hung store = %q, %v after %d loads; want the loaded value", v, err, loads.Load())
	}
	if s := c.Stats(); s.StoreFallbacks != 1 || s.Loads != 1 {
		t.Fatalf("stats %+v: want 1 store fallback and 1 load", s)
	}

	sctx, scancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer scancel()
	_, err = strict.GetOrLoad(sctx, "k", func(context.Context) (string, error) { loads.Add(1); return "fresh", nil })
	if !errors.Is(err, warden.ErrStoreTimeout) || errors.Is(err, context.DeadlineExceeded) || loads.Load() != 1 {
		t.Fatalf("FailOnStoreError on a hung store: %v after %d more loads; want warden.ErrStoreTimeout and no load", err, loads.Load()-1)
	}
}

// A store that answers lookups and the load lease but whose write hangs:
// the caller gets the loaded value within its deadline, and the value
// lands in the store once it answers.
func TestGetOrLoadHungWriteBackDoesNotHoldTheCaller(t *testing.T) {
	db := testkit.DBName(t)
	h := newHungStore(db, "set")
	st := testkit.Open(t, h, quiet)
	c, err := cache.New[string](st, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	v, err := c.GetOrLoad(ctx, "k", func(context.Context) (string, error) { return "fresh", nil })
	if err != nil || v != "fresh" {
		close(h.release)
		_ = c.Close()
		t.Fatalf("GetOrLoad with a hung write = %q, %v; want the loaded value", v, err)
	}
	close(h.release) // the store answers: the write-back lands
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := cache.New[string](testkit.Open(t, testkit.MemoryDriver(db), quiet), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if v, err := got.Get(context.Background(), "k"); err != nil || v != "fresh" {
		t.Fatalf("after the store answered, the value is %q, %v; want it stored", v, err)
	}
}
