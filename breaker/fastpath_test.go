package breaker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/internal/testkit"
)

// The fast paths allocate nothing: a call rejected on a circuit the local
// view holds open, and a successful call on a circuit it holds closed, on
// a store with circuit notifications (memory) and on one without (polled
// every SyncInterval). These are properties, not timings.
func TestFastPathsDoNotAllocate(t *testing.T) {
	stores := []struct {
		name string
		open func(t *testing.T) *warden.Store
	}{
		{"notifications", func(t *testing.T) *warden.Store { return openStore(t, testkit.DBName(t), nil) }},
		{"polling", func(t *testing.T) *warden.Store { st, _ := openFlaky(t, testkit.DBName(t), nil, nil); return st }},
	}
	for _, s := range stores {
		t.Run(s.name+"/rejection on an open circuit", func(t *testing.T) {
			ctx := context.Background()
			b := newBreaker(t, s.open(t), "api", &breaker.Options{Threshold: 1, OpenFor: time.Hour, SyncInterval: time.Hour})
			if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
				t.Fatalf("Do = %v, want errBoom", err)
			}
			if st := b.Stats().State; st != breaker.Open {
				t.Fatalf("after the failure at Threshold 1: %s, want open", st)
			}
			ran := 0
			fn := func(context.Context) error { ran++; return nil }
			var bad error
			n := zeroAllocs(t, func() {
				if err := b.Do(ctx, fn); !errors.Is(err, breaker.ErrOpen) && bad == nil {
					bad = err
				}
			})
			if bad != nil || ran != 0 {
				t.Fatalf("a call on the open circuit: err=%v, fn ran %d times", bad, ran)
			}
			if got := b.Stats().Rejections; got < int64(n) {
				t.Errorf("Rejections = %d after %d rejected calls", got, n)
			}
		})
		t.Run(s.name+"/success on a closed circuit", func(t *testing.T) {
			ctx := context.Background()
			b := newBreaker(t, s.open(t), "api", &breaker.Options{SyncInterval: time.Hour})
			if err := b.Do(ctx, succeed); err != nil {
				t.Fatal(err)
			}
			var bad error
			n := zeroAllocs(t, func() {
				if err := b.Do(ctx, succeed); err != nil && bad == nil {
					bad = err
				}
			})
			if bad != nil {
				t.Fatalf("a call on the closed circuit: %v", bad)
			}
			if st := b.Stats(); st.State != breaker.Closed || st.Successes < int64(n) {
				t.Errorf("after %d successes: %+v", n, st)
			}
		})
	}
}

// zeroAllocs fails t unless f allocates nothing on average over a
// testing.AllocsPerRun measurement, and returns the number of calls of f
// made. AllocsPerRun counts the whole process's allocations: a
// measurement that meets those of a goroutine of the Breaker's own (the
// notification watcher reads the record once it has subscribed) is made
// again, a few times; f allocating on every call fails every measurement.
func zeroAllocs(t *testing.T, f func()) int {
	t.Helper()
	const runs, attempts = 200, 5
	var allocs float64
	for i := range attempts {
		if allocs = testing.AllocsPerRun(runs, f); allocs == 0 {
			return (i + 1) * (runs + 1)
		}
	}
	t.Fatalf("%v allocations per call, want 0", allocs)
	return 0
}

// A call that opens the circuit is seen by the fast path of the very next
// call: the local view is published before the caller waiting for the
// failure's write is woken, so the next call cannot run on the view from
// before the write.
func TestOwnOpeningRejectsTheNextCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for i := range 200 {
		b := newBreaker(t, openStore(t, testkit.DBName(t), nil), "api", &breaker.Options{Threshold: 1, OpenFor: time.Hour})
		if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
			t.Fatalf("round %d: Do = %v, want errBoom", i, err)
		}
		ran := false
		if err := b.Do(ctx, func(context.Context) error { ran = true; return nil }); !errors.Is(err, breaker.ErrOpen) || ran {
			t.Fatalf("round %d: the call after the opening: err=%v, ran=%v; want ErrOpen without running", i, err, ran)
		}
	}
}
