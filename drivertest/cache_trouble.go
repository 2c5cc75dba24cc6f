package drivertest

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/cache"
	"github.com/warden-go/warden/internal/hangstore"
)

// portableCacheHungStore: with default options and a store that stops
// answering, GetOrLoad with a deadline serves the loaded value: the store
// calls the caller waits for end before its deadline, the loader runs
// without the store, and the fallback is counted. Once the store answers
// again, the value's write-back lands. (A 2 s deadline, as in
// Circuits/BreakerHungStore; the bound is checked on every blocked
// operation's deadline.)
func (s *suite) portableCacheHungStore(t *testing.T) {
	st, _ := s.open(t)
	h := hangstore.New(unclosed(st.Driver()), hangstore.CacheGet, hangstore.CacheSet, hangstore.LockAcquire)
	hs := warden.New(h, &warden.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(func() { _ = hs.Close() })
	c, err := cache.New[string](hs, nil)
	fatalIf(t, "cache.New", err)
	released := false
	defer func() {
		if !released {
			close(h.Release)
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
	for _, op := range []string{hangstore.CacheGet, hangstore.LockAcquire} {
		for i, dl := range h.Deadlines(op) {
			if dl.IsZero() || !dl.Before(deadline) {
				t.Errorf("%s %d ran with deadline %v, not before the caller's %v", op, i, dl, deadline)
			}
		}
	}
	if err != nil || v != "loaded" || loads != 1 {
		t.Fatalf("GetOrLoad on a hung store = %q, %v after %d loads; want the loaded value", v, err, loads)
	}
	if st := c.Stats(); st.StoreFallbacks != 1 {
		t.Errorf("stats %+v: want 1 store fallback", st)
	}
	close(h.Release) // the store answers: the write-back lands
	released = true
	fatalIf(t, "Close", c.Close())
	got, err := cache.New[string](st, nil)
	fatalIf(t, "cache.New", err)
	defer got.Close()
	if v, err := got.Get(testCtx(t), "hung"); err != nil || v != "loaded" {
		t.Errorf("after the store answered again, Get = %q, %v; want the loaded value written back", v, err)
	}
}
