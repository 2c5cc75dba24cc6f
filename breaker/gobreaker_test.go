package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/testkit"
)

// ratio is gobreaker's documented example of a ReadyToTrip: at least 10
// requests, half of them failures.
func ratio(c breaker.Counts) bool {
	return c.Requests >= 10 && float64(c.TotalFailures)/float64(c.Requests) >= 0.5
}

// wantRecord checks the shared record's state and counts.
func wantRecord(t *testing.T, what string, rec driver.CircuitRecord, state breaker.State, want breaker.Counts) {
	t.Helper()
	if rec.State != state || rec.Counts() != want {
		t.Fatalf("%s: %s with %+v, want %s with %+v", what, rec.State, rec.Counts(), state, want)
	}
}

// ReadyToTrip decides on the fleet's counts: successes of one process,
// written with its next failure, count in another's decision, and the
// circuit opens at the failure that makes the ratio, not before.
func TestReadyToTripOverFleetCounts(t *testing.T) {
	t.Parallel()
	db := testkit.DBName(t)
	st := openStore(t, db, nil)
	opts := &breaker.Options{ReadyToTrip: ratio, OpenFor: time.Hour}
	a := newBreaker(t, st, "api", opts)
	b := newBreaker(t, openStore(t, db, nil), "api", opts)
	ctx := context.Background()
	for range 6 {
		if err := a.Do(ctx, succeed); err != nil {
			t.Fatal(err)
		}
	}
	wantRecord(t, "after 6 successes", record(t, st, "api"), breaker.Closed, breaker.Counts{})
	if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	wantRecord(t, "after b's failure", record(t, st, "api"), breaker.Closed,
		breaker.Counts{Requests: 1, TotalFailures: 1, ConsecutiveFailures: 1})
	if err := a.Do(ctx, fail); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	wantRecord(t, "after a's failure, written with its 6 successes", record(t, st, "api"), breaker.Closed,
		breaker.Counts{Requests: 8, TotalSuccesses: 6, TotalFailures: 2, ConsecutiveFailures: 2})
	for i := range 3 {
		if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
			t.Fatalf("failure %d of b: %v", i+1, err)
		}
	}
	// 5 failures of 11 requests: below half.
	wantRecord(t, "at 5 of 11", record(t, st, "api"), breaker.Closed,
		breaker.Counts{Requests: 11, TotalSuccesses: 6, TotalFailures: 5, ConsecutiveFailures: 5})
	if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	rec := record(t, st, "api")
	if rec.State != breaker.Open || rec.Failures != 6 {
		t.Fatalf("at 6 failures of 12 requests: %s with %d failures, want open", rec.State, rec.Failures)
	}
	if err := b.Do(ctx, succeed); !errors.Is(err, breaker.ErrOpen) {
		t.Fatalf("after the trip: %v", err)
	}
	testkit.Eventually(t, 5*time.Second, "a sees the trip", func() bool { return a.Stats().State == breaker.Open })
}

// Without ReadyToTrip, Threshold decides in the store as before; the two
// cannot be set together, and a bad Interval is refused.
func TestReadyToTripOptions(t *testing.T) {
	t.Parallel()
	st := openStore(t, testkit.DBName(t), nil)
	for _, o := range []breaker.Options{
		{Threshold: 3, ReadyToTrip: ratio},
		{Interval: -time.Second},
		{Interval: time.Microsecond},
	} {
		if _, err := breaker.New(st, "api", &o); err == nil {
			t.Errorf("New(%+v): no error", o)
		}
	}
}

// Concurrent failures in several processes, with a ReadyToTrip over the
// total: every failure before the trip is counted and the circuit opens
// once, at the trip-th failure of the fleet.
func TestReadyToTripConcurrent(t *testing.T) {
	t.Parallel()
	const procs, callers, trip = 4, 8, 20
	db := testkit.DBName(t)
	st := openStore(t, db, nil)
	var bs []*breaker.Breaker
	for range procs {
		bs = append(bs, newBreaker(t, openStore(t, db, nil), "api", &breaker.Options{
			ReadyToTrip: func(c breaker.Counts) bool { return c.TotalFailures >= trip },
			OpenFor:     time.Hour,
		}))
	}
	var wg sync.WaitGroup
	var ran, rejected atomic.Int64
	for _, b := range bs {
		for range callers {
			wg.Go(func() {
				for range 2 {
					err := b.Do(context.Background(), func(context.Context) error { ran.Add(1); return errBoom })
					if errors.Is(err, breaker.ErrOpen) {
						rejected.Add(1)
					} else if !errors.Is(err, errBoom) {
						t.Errorf("Do: %v", err)
					}
				}
			})
		}
	}
	wg.Wait()
	for _, b := range bs {
		if err := b.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	rec := record(t, st, "api")
	if rec.State != breaker.Open {
		t.Fatalf("after %d failures: %s", ran.Load(), rec.State)
	}
	if ran.Load() < trip || ran.Load()+rejected.Load() != procs*callers*2 {
		t.Errorf("%d calls ran and %d were rejected, of %d; want at least %d to run", ran.Load(), rejected.Load(), procs*callers*2, trip)
	}
	// The failures counted are those before the trip (later ones belong
	// to the generation that ended): at least trip, at most those that ran.
	if rec.Failures < trip || rec.Failures > ran.Load() {
		t.Errorf("the open circuit counts %d failures; want between %d and the %d that ran", rec.Failures, trip, ran.Load())
	}
}

// Interval resets the closed state's counts: failures of an old period do
// not add up with new ones (with Threshold as with ReadyToTrip).
func TestInterval(t *testing.T) {
	t.Parallel()
	const interval = 100 * time.Millisecond
	for _, opts := range []breaker.Options{
		{Threshold: 3, Interval: interval, OpenFor: time.Hour},
		{ReadyToTrip: func(c breaker.Counts) bool { return c.ConsecutiveFailures >= 3 }, Interval: interval, OpenFor: time.Hour},
	} {
		t.Run(fmt.Sprintf("readyToTrip=%v", opts.ReadyToTrip != nil), func(t *testing.T) {
			t.Parallel()
			st := openStore(t, testkit.DBName(t), nil)
			b := newBreaker(t, st, "api", &opts)
			ctx := context.Background()
			for range 2 {
				_ = b.Do(ctx, fail)
			}
			first := record(t, st, "api")
			if first.Failures != 2 || first.IntervalStart.IsZero() {
				t.Fatalf("after 2 failures: %d failures, period from %v", first.Failures, first.IntervalStart)
			}
			// Let the period end (the store's clock decides; memory's is
			// this process's).
			time.Sleep(time.Until(first.IntervalStart.Add(interval + 10*time.Millisecond)))
			for i := range 2 {
				if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
					t.Fatalf("failure %d of the new period: %v", i+1, err)
				}
			}
			rec := record(t, st, "api")
			if rec.State != breaker.Closed || rec.Failures != 2 || !rec.IntervalStart.After(first.IntervalStart) {
				t.Fatalf("2 failures into a new period: %s with %d failures, period from %v (was %v)", rec.State, rec.Failures, rec.IntervalStart, first.IntervalStart)
			}
			// Within the period they add up.
			if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
				t.Fatal(err)
			}
			if rec := record(t, st, "api"); rec.State != breaker.Open {
				t.Fatalf("the third failure within the period: %s with %d failures", rec.State, rec.Failures)
			}
		})
	}
}

// With ReadyToTrip the steady closed success path stays write-free; the
// successes are written with the next write, and, while the circuit has
// failures in its period, by the periodic read.
func TestReadyToTripSuccessesWritten(t *testing.T) {
	t.Parallel()
	ops := &testkit.OpCounter{}
	st, _ := openFlaky(t, testkit.DBName(t), ops, nil)
	const sync = 20 * time.Millisecond
	b := newBreaker(t, st, "api", &breaker.Options{ReadyToTrip: ratio, SyncInterval: sync})
	ctx := context.Background()
	for range 500 {
		if err := b.Do(ctx, succeed); err != nil {
			t.Fatal(err)
		}
	}
	if n := circuitWrites(ops); n != 0 {
		t.Fatalf("%d writes for 500 successes on a circuit without failures", n)
	}
	if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	wantRecord(t, "the failure with the 500 successes", record(t, st, "api"), breaker.Closed,
		breaker.Counts{Requests: 501, TotalSuccesses: 500, TotalFailures: 1, ConsecutiveFailures: 1})
	// The first success after it is written at once; the next ones by a
	// periodic read.
	for range 5 {
		if err := b.Do(ctx, succeed); err != nil {
			t.Fatal(err)
		}
	}
	if rec := record(t, st, "api"); rec.Successes < 501 || rec.Failures != 0 {
		t.Fatalf("after the first success following the failure: %+v", rec.Counts())
	}
	time.Sleep(sync)
	if err := b.Do(ctx, succeed); err != nil {
		t.Fatal(err)
	}
	if n := ops.Get("circuit.record-successes"); n < 1 {
		t.Fatalf("%d batched writes after SyncInterval, want at least 1", n)
	}
	if rec := record(t, st, "api"); rec.Successes != 505 {
		t.Fatalf("the periodic write counted %d successes, want 505 (the 506th is still local)", rec.Successes)
	}
}

// A panicking ReadyToTrip counts as "not ready" and is logged; the
// Breaker goes on.
func TestReadyToTripPanics(t *testing.T) {
	t.Parallel()
	st := openStore(t, testkit.DBName(t), nil)
	b := newBreaker(t, st, "api", &breaker.Options{ReadyToTrip: func(breaker.Counts) bool { panic("bad trip") }})
	for range 3 {
		if err := b.Do(context.Background(), fail); !errors.Is(err, errBoom) {
			t.Fatal(err)
		}
	}
	if err := b.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rec := record(t, st, "api"); rec.State != breaker.Closed || rec.TotalFailures != 3 {
		t.Fatalf("%s with %d failures", rec.State, rec.TotalFailures)
	}
}

// racing is the memory driver with one more writer: right before the
// first Trip, another process changes the circuit (a batch of successes),
// so that Trip finds a newer version.
type racing struct {
	driver.Store
	raced atomic.Bool
}

func (r *racing) Circuits() driver.Circuits { return racingCircuits{r.Store.Circuits(), r} }

type racingCircuits struct {
	driver.Circuits
	r *racing
}

func (c racingCircuits) Trip(ctx context.Context, name string, version int64) (driver.CircuitRecord, bool, error) {
	if !c.r.raced.Swap(true) {
		if _, err := c.Circuits.RecordOutcome(ctx, name, driver.Outcome{Gen: driver.AnyGeneration, Successes: 1}); err != nil {
			return driver.CircuitRecord{}, false, err
		}
	}
	return c.Circuits.Trip(ctx, name, version)
}

// A Trip that finds the circuit changed since the counts it decided on
// does not open it; the Breaker decides again on the newer counts, and
// trips at that version.
func TestReadyToTripDecidesAgain(t *testing.T) {
	t.Parallel()
	r := &racing{Store: testkit.MemoryDriver(testkit.DBName(t))}
	st := testkit.Open(t, r, nil)
	b := newBreaker(t, st, "api", &breaker.Options{
		ReadyToTrip: func(c breaker.Counts) bool { return c.ConsecutiveFailures >= 2 },
		OpenFor:     time.Hour,
	})
	for range 2 {
		if err := b.Do(context.Background(), fail); !errors.Is(err, errBoom) {
			t.Fatal(err)
		}
	}
	if err := b.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !r.raced.Load() {
		t.Fatal("no Trip was made")
	}
	rec := record(t, st, "api")
	if rec.State != breaker.Open || rec.Failures != 2 {
		t.Fatalf("after 2 failures and a Trip that lost a race: %s with %d failures, want open", rec.State, rec.Failures)
	}
}

// While the store is unreachable, ReadyToTrip decides on the local view's
// counts (the last record's, with the failures counted locally since).
func TestReadyToTripStoreDown(t *testing.T) {
	t.Parallel()
	st, f := openFlaky(t, testkit.DBName(t), nil, nil)
	b := newBreaker(t, st, "api", &breaker.Options{
		ReadyToTrip: func(c breaker.Counts) bool { return c.TotalFailures >= 3 },
		OpenFor:     time.Hour,
	})
	ctx := context.Background()
	if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	f.down.Store(true)
	for i := range 2 {
		if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
			t.Fatalf("failure %d while the store is down: %v", i+2, err)
		}
	}
	if s := b.Stats(); s.State != breaker.Open || !s.StoreDown {
		t.Fatalf("after 1 recorded and 2 local failures: %+v, want open locally", s)
	}
	if err := b.Do(ctx, succeed); !errors.Is(err, breaker.ErrOpen) {
		t.Fatalf("a call on the locally open circuit: %v", err)
	}
}
