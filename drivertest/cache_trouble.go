package drivertest

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/cache"
	"github.com/warden-go/warden/driver"
)

// cacheHungDriver wraps the store under test: its cache reads and writes
// and its lock acquisitions do not answer — they block until their ctx
// ends or release is closed (the store answers again), then go on to the
// real store.
type cacheHungDriver struct {
	driver.Store
	release chan struct{}

	mu        sync.Mutex
	deadlines map[string][]time.Time // of the blocked operations' contexts, by operation
}

func (h *cacheHungDriver) block(ctx context.Context, op string) error {
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

func (h *cacheHungDriver) Cache() driver.Cache { return cacheHungCache{h.Store.Cache(), h} }
func (h *cacheHungDriver) Locks() driver.Locks { return cacheHungLocks{h.Store.Locks(), h} }

type cacheHungCache struct {
	driver.Cache
	h *cacheHungDriver
}

func (c cacheHungCache) Get(ctx context.Context, key string) (driver.CacheEntry, bool, error) {
	if err := c.h.block(ctx, "cache get"); err != nil {
		return driver.CacheEntry{}, false, err
	}
	return c.Cache.Get(ctx, key)
}

func (c cacheHungCache) Set(ctx context.Context, key string, v []byte, ttl time.Duration) error {
	if err := c.h.block(ctx, "cache set"); err != nil {
		return err
	}
	return c.Cache.Set(ctx, key, v, ttl)
}

type cacheHungLocks struct {
	driver.Locks
	h *cacheHungDriver
}

func (l cacheHungLocks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	if err := l.h.block(ctx, "lock acquire"); err != nil {
		return driver.LockRecord{}, false, err
	}
	return l.Locks.Acquire(ctx, key, owner, ttl)
}

// portableCacheHungStore: with default options and a store that stops
// answering, GetOrLoad with a deadline serves the loaded value: the store
// calls the caller waits for end before its deadline, the loader runs
// without the store, and the fallback is counted. Once the store answers
// again, the value's write-back lands. (A 2 s deadline, as in
// Circuits/BreakerHungStore; the bound is checked on every blocked
// operation's deadline.)
func (s *suite) portableCacheHungStore(t *testing.T) {
	st, _ := s.open(t)
	h := &cacheHungDriver{Store: unclosed(st.Driver()), release: make(chan struct{}), deadlines: map[string][]time.Time{}}
	hs := warden.New(h, &warden.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(func() { _ = hs.Close() })
	c, err := cache.New[string](hs, nil)
	fatalIf(t, "cache.New", err)
	released := false
	defer func() {
		if !released {
			close(h.release)
		}
		_ = c.Close()
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	deadline, _ := ctx.Deadline()
	loads := 0
	v, err := c.GetOrLoad(ctx, "hung", func(context.Context) (string, error) {
		loads++
		return "loaded", nil
	})
	h.mu.Lock()
	for _, op := range []string{"cache get", "lock acquire"} {
		for i, dl := range h.deadlines[op] {
			if dl.IsZero() || !dl.Before(deadline) {
				t.Errorf("%s %d ran with deadline %v, not before the caller's %v", op, i, dl, deadline)
			}
		}
	}
	h.mu.Unlock()
	if err != nil || v != "loaded" || loads != 1 {
		t.Fatalf("GetOrLoad on a hung store = %q, %v after %d loads; want the loaded value", v, err, loads)
	}
	if st := c.Stats(); st.StoreFallbacks != 1 {
		t.Errorf("stats %+v: want 1 store fallback", st)
	}
	close(h.release) // the store answers: the write-back lands
	released = true
	fatalIf(t, "Close", c.Close())
	got, err := cache.New[string](st, nil)
	fatalIf(t, "cache.New", err)
	defer got.Close()
	if v, err := got.Get(testCtx(t), "hung"); err != nil || v != "loaded" {
		t.Errorf("after the store answered again, Get = %q, %v; want the loaded value written back", v, err)
	}
}
