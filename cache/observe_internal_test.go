package cache

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden/internal/testkit"
)

// A GetOrLoad that joins another caller's load in this process is
// observed as a local load wait; the caller that loads is not.
func TestObserveLocalLoadWait(t *testing.T) {
	ctx := context.Background()
	var (
		mu  sync.Mutex
		obs []Observation
	)
	st := testkit.Stores(t, 1, nil)[0]
	c, err := New[string](st, &Options{Observe: func(_ context.Context, o Observation) {
		mu.Lock()
		defer mu.Unlock()
		obs = append(obs, o)
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	started, release := make(chan struct{}), make(chan struct{})
	loader := func(context.Context) (string, error) {
		close(started)
		<-release
		return "v", nil
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if v, err := c.GetOrLoad(ctx, "k", loader); err != nil || v != "v" {
				t.Errorf("GetOrLoad = %q, %v", v, err)
			}
		}()
	}
	<-started
	testkit.Eventually(t, 5*time.Second, "both callers to wait for the load", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		f := c.flights["k"]
		return f != nil && f.waiters == 2
	})
	close(release)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	var lookups, loads, waits int
	for _, o := range obs {
		switch o.Kind {
		case ObservedLookup:
			lookups++
		case ObservedLoad:
			loads++
		case ObservedLoadWait:
			waits++
			if o.Remote || o.Err != nil || o.Key != "k" || o.Duration <= 0 {
				t.Errorf("load wait observed as %+v", o)
			}
		default:
			t.Errorf("unexpected observation %+v", o)
		}
	}
	if lookups != 2 || loads != 1 || waits != 1 {
		t.Fatalf("observed %d lookups, %d loads, %d load waits; want 2, 1, 1: %+v", lookups, loads, waits, obs)
	}
}
