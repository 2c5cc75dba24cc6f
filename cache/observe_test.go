package cache_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/cache"
	"github.com/warden-go/warden/internal/testkit"
)

// observer collects what a Cache reports to Options.Observe.
type observer struct {
	mu  sync.Mutex
	obs []cache.Observation
}

func (o *observer) observe(_ context.Context, ob cache.Observation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.obs = append(o.obs, ob)
}

// take returns the observations since the last take.
func (o *observer) take() []cache.Observation {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.obs
	o.obs = nil
	return c
}

// Lookups, a load and a store error are observed with their key, result,
// duration and error.
func TestObserveLookupsAndLoads(t *testing.T) {
	ctx := context.Background()
	o := &observer{}
	st := stores(t, 1)[0]
	c := newCache[int](t, st, &cache.Options{Prefix: "app/", Observe: o.observe})
	if _, err := c.Get(ctx, "n"); !errors.Is(err, cache.ErrNotFound) {
		t.Fatal(err)
	}
	if v, err := c.GetOrLoad(ctx, "n", func(context.Context) (int, error) { return 4, nil }); err != nil || v != 4 {
		t.Fatalf("GetOrLoad = %d, %v", v, err)
	}
	if v, err := c.GetOrLoad(ctx, "n", nil); err == nil {
		t.Fatalf("GetOrLoad without a loader = %d, nil", v) // refused before any lookup
	}
	if v, err := c.Get(ctx, "n"); err != nil || v != 4 {
		t.Fatalf("Get = %d, %v", v, err)
	}
	got := o.take()
	want := []cache.Observation{
		{Kind: cache.ObservedLookup, Key: "n", Result: cache.LookupMiss},
		{Kind: cache.ObservedLookup, Key: "n", Result: cache.LookupMiss},
		{Kind: cache.ObservedLoad, Key: "n"},
		{Kind: cache.ObservedLookup, Key: "n", Result: cache.LookupHit},
	}
	if len(got) != len(want) {
		t.Fatalf("observed %+v, want %+v", got, want)
	}
	for i, w := range want {
		g := got[i]
		d := g.Duration
		g.Duration = 0
		if g != w || d < 0 {
			t.Errorf("observation %d: %+v, want %+v", i, got[i], w)
		}
	}

	// An undecodable entry is a codec error, observed as a store error.
	if err := c.Set(ctx, "s", 1); err != nil {
		t.Fatal(err)
	}
	strs := newCache[string](t, st, &cache.Options{Prefix: "app/", Observe: o.observe})
	if _, err := strs.Get(ctx, "s"); err == nil {
		t.Fatal("Get of an int as a string succeeded")
	}
	got = o.take()
	if len(got) != 1 || got[0].Kind != cache.ObservedStoreError || got[0].Err == nil || !strings.Contains(got[0].Err.Error(), `"s"`) {
		t.Fatalf("a decode failure observed as %+v", got)
	}
}

// A GetOrLoad that finds another process's load lease in its way waits
// for that process's value: a remote load wait.
func TestObserveRemoteLoadWait(t *testing.T) {
	ctx := context.Background()
	db := testkit.DBName(t)
	a := newCache[string](t, testkit.Open(t, testkit.MemoryDriver(db), quiet), &cache.Options{PollMax: 10 * time.Millisecond})
	acquires := make(chan struct{}, 64)
	stB := testkit.Open(t, testkit.MemoryDriver(db), &warden.Options{Logger: quiet.Logger, Hook: warden.HookFunc(func(_ context.Context, op warden.OpInfo) {
		if op.Op == "lock.acquire" {
			acquires <- struct{}{}
		}
	})})
	o := &observer{}
	b := newCache[string](t, stB, &cache.Options{PollMax: 10 * time.Millisecond, Observe: o.observe})
	g := newGate("v")
	aDone := make(chan error, 1)
	go func() {
		_, err := a.GetOrLoad(ctx, "hot", g.load)
		aDone <- err
	}()
	testkit.Eventually(t, 5*time.Second, "a's loader to start", func() bool { return g.calls.Load() == 1 })
	bDone := make(chan error, 1)
	go func() {
		v, err := b.GetOrLoad(ctx, "hot", func(context.Context) (string, error) { return "b's own", nil })
		if err == nil && v != "v" {
			err = errors.New("b got " + v)
		}
		bDone <- err
	}()
	<-acquires // b asked for the lease, which a holds: b waits for a
	close(g.open)
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	got := o.take()
	if len(got) != 2 || got[0].Result != cache.LookupMiss || got[1].Kind != cache.ObservedLoadWait || !got[1].Remote ||
		got[1].Err != nil || got[1].Key != "hot" || got[1].Duration <= 0 {
		t.Fatalf("b observed %+v, want a miss and a remote load wait", got)
	}
}
