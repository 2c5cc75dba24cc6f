package breaker_test

import (
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
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/internal/testkit"
	"github.com/warden-go/warden/store/memory"
)

func TestNewValidates(t *testing.T) {
	st := memory.New(nil)
	defer st.Close()
	if _, err := breaker.New(st, "", nil); !errors.Is(err, warden.ErrInvalidKey) {
		t.Errorf("empty name: %v", err)
	}
	if _, err := breaker.New(st, "a\x00b", nil); !errors.Is(err, warden.ErrInvalidKey) {
		t.Errorf("NUL in name: %v", err)
	}
	if _, err := breaker.New(nil, "x", nil); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("nil store: %v", err)
	}
	for _, o := range []breaker.Options{
		{Threshold: -1},
		{OpenFor: -time.Second},
		{OpenFor: time.Microsecond},
		{ProbeLease: -1},
		{HalfOpenProbes: -2},
		{SyncInterval: -time.Second},
	} {
		if _, err := breaker.New(st, "x", &o); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("New(%+v) = %v, want ErrInvalidArgument", o, err)
		}
	}
	if _, err := breaker.New(st, "x", &breaker.Options{Owner: strings.Repeat("o", 600)}); !errors.Is(err, warden.ErrInvalidKey) {
		t.Errorf("long owner: %v", err)
	}
	b, err := breaker.New(st, "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.Name() != "x" {
		t.Errorf("Name() = %q", b.Name())
	}
}

// Several processes (stores on one database), each with a Breaker and many
// goroutines: the circuit opens on exactly the Threshold-th failure in
// total, and every Breaker then rejects calls.
func TestOpensAfterExactlyThresholdFailures(t *testing.T) {
	t.Parallel()
	const threshold, procs = 20, 4
	db := testkit.DBName(t)
	var bs []*breaker.Breaker
	for range procs {
		bs = append(bs, newBreaker(t, openStore(t, db, nil), "api", &breaker.Options{Threshold: threshold, OpenFor: time.Hour}))
	}
	check := openStore(t, db, nil)
	ctx := context.Background()

	failMany := func(n int) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				if err := bs[i%procs].Do(ctx, fail); !errors.Is(err, errBoom) {
					t.Errorf("Do = %v, want errBoom", err)
				}
			})
		}
		wg.Wait()
	}
	failMany(threshold - 1)
	if rec := record(t, check, "api"); rec.State != breaker.Closed || rec.Failures != threshold-1 {
		t.Fatalf("after %d failures: %s with %d failures, want closed with %d", threshold-1, rec.State, rec.Failures, threshold-1)
	}
	failMany(1)
	if rec := record(t, check, "api"); rec.State != breaker.Open || rec.Failures != threshold {
		t.Fatalf("after %d failures: %s with %d failures, want open with %d", threshold, rec.State, rec.Failures, threshold)
	}
	for i, b := range bs {
		testkit.Eventually(t, 5*time.Second, fmt.Sprintf("breaker %d sees the circuit open", i), func() bool { return b.Stats().State == breaker.Open })
		ran := false
		err := b.Do(ctx, func(context.Context) error { ran = true; return nil })
		var oe *breaker.OpenError
		if !errors.Is(err, breaker.ErrOpen) || !errors.As(err, &oe) || ran {
			t.Fatalf("breaker %d on an open circuit: err=%v ran=%v", i, err, ran)
		}
		if oe.Name != "api" || oe.State != breaker.Open || oe.Until.IsZero() {
			t.Errorf("OpenError %+v", oe)
		}
	}
}

// Many goroutines on Breakers in several processes hammer the circuit with
// failures; no increment is lost before it opens. The store budget is
// generous: a write that outlasts it (a loaded machine, -race) makes the
// store count as down, and the failures meanwhile are counted locally
// only, by design (see TestStoreOutageFailsOpen), which is not what this
// test is about.
func TestConcurrentFailuresNotLost(t *testing.T) {
	t.Parallel()
	db := testkit.DBName(t)
	const threshold = 1000
	var bs []*breaker.Breaker
	for range 3 {
		bs = append(bs, newBreaker(t, openStore(t, db, nil), "api", &breaker.Options{Threshold: threshold, StoreTimeout: time.Minute}))
	}
	var wg sync.WaitGroup
	for g := range 30 {
		wg.Go(func() {
			for range 10 {
				_ = bs[g%3].Do(context.Background(), fail)
			}
		})
	}
	wg.Wait()
	if rec := record(t, openStore(t, db, nil), "api"); rec.Failures != 300 || rec.State != breaker.Closed {
		t.Fatalf("record %s with %d failures, want closed with 300", rec.State, rec.Failures)
	}
}

// openAll opens the circuit through bs[0] and waits until every Breaker's
// view is open.
func openAll(t *testing.T, bs []*breaker.Breaker) {
	t.Helper()
	for _, b := range bs { // start every Breaker's view (and notifications)
		if err := b.Do(context.Background(), succeed); err != nil {
			t.Fatal(err)
		}
	}
	if err := bs[0].Do(context.Background(), fail); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	for i, b := range bs {
		testkit.Eventually(t, 5*time.Second, fmt.Sprintf("breaker %d sees the circuit open", i), func() bool { return b.Stats().State == breaker.Open })
	}
}

// After OpenFor, many Breakers in several processes call at once: exactly
// one call in the fleet runs (the probe); its success closes the circuit
// for everybody.
func TestExactlyOneProbeFleetWide(t *testing.T) {
	t.Parallel()
	const procs, perProc = 6, 5
	const openFor = 80 * time.Millisecond
	db := testkit.DBName(t)
	var bs []*breaker.Breaker
	for range procs {
		// Every Breaker claims the same Owner: the probe slot must still go
		// to one of them only.
		bs = append(bs, newBreaker(t, openStore(t, db, nil), "api", &breaker.Options{Threshold: 1, OpenFor: openFor, ProbeLease: time.Minute, Owner: "same-host:1"}))
	}
	openAll(t, bs)
	time.Sleep(openFor + 50*time.Millisecond) // the open period must pass

	var ran, rejected, turnedAway atomic.Int32
	total := int32(procs * perProc)
	var wg sync.WaitGroup
	for i := range total {
		wg.Go(func() {
			called := false
			err := bs[int(i)%procs].Do(context.Background(), func(context.Context) error {
				called = true
				ran.Add(1)
				// Hold the probe until every other call has either started
				// its own fn or returned without running it, however long
				// that takes, so that nobody could call after the circuit
				// closed. (A second probe is held the same way, and both
				// are reported below.)
				for ran.Load()+turnedAway.Load() < total {
					time.Sleep(time.Millisecond)
				}
				return nil
			})
			if !called {
				turnedAway.Add(1)
			}
			switch {
			case errors.Is(err, breaker.ErrOpen):
				rejected.Add(1)
			case err != nil:
				t.Errorf("Do = %v", err)
			}
		})
	}
	wg.Wait()
	if ran.Load() != 1 || rejected.Load() != total-1 {
		t.Fatalf("fn ran %d times, %d rejected; want 1 and %d", ran.Load(), rejected.Load(), total-1)
	}
	check := openStore(t, db, nil)
	if rec := record(t, check, "api"); rec.State != breaker.Closed || rec.Failures != 0 {
		t.Fatalf("after a successful probe: %s with %d failures", rec.State, rec.Failures)
	}
	var probes int64
	for i, b := range bs {
		testkit.Eventually(t, 5*time.Second, fmt.Sprintf("breaker %d sees the circuit closed", i), func() bool { return b.Stats().State == breaker.Closed })
		probes += b.Stats().Probes
		if err := b.Do(context.Background(), succeed); err != nil {
			t.Errorf("breaker %d after closing: %v", i, err)
		}
	}
	if probes != 1 {
		t.Errorf("%d probes granted in total, want 1", probes)
	}
}

// A failed probe re-opens the circuit for another OpenFor.
func TestFailedProbeReopens(t *testing.T) {
	t.Parallel()
	const openFor = 250 * time.Millisecond
	db := testkit.DBName(t)
	st := openStore(t, db, nil)
	b := newBreaker(t, st, "api", &breaker.Options{Threshold: 1, OpenFor: openFor})
	other := newBreaker(t, openStore(t, db, nil), "api", &breaker.Options{Threshold: 1, OpenFor: openFor})
	openAll(t, []*breaker.Breaker{b, other})
	first := record(t, st, "api")

	time.Sleep(openFor + 20*time.Millisecond)
	if err := b.Do(context.Background(), fail); !errors.Is(err, errBoom) {
		t.Fatalf("probe: %v", err)
	}
	rec := record(t, st, "api")
	if rec.State != breaker.Open || !rec.OpenedAt.After(first.OpenedAt) {
		t.Fatalf("after a failed probe: %s opened at %v (first at %v)", rec.State, rec.OpenedAt, first.OpenedAt)
	}
	ran := false
	if err := b.Do(context.Background(), func(context.Context) error { ran = true; return nil }); !errors.Is(err, breaker.ErrOpen) || ran {
		t.Fatalf("right after a failed probe: err=%v ran=%v", err, ran)
	}
	// The other process learns it and probes again once OpenFor passed.
	testkit.Eventually(t, 5*time.Second, "a second probe closes the circuit", func() bool {
		return other.Do(context.Background(), succeed) == nil
	})
	if rec := record(t, st, "api"); rec.State != breaker.Closed {
		t.Fatalf("after the second probe: %s", rec.State)
	}
}

// HalfOpenProbes (gobreaker's MaxRequests): 2 probes run at once across
// the fleet, every other call is rejected meanwhile, and 2 successes in a
// row close the circuit.
func TestHalfOpenProbes(t *testing.T) {
	t.Parallel()
	const openFor = 50 * time.Millisecond
	db := testkit.DBName(t)
	st := openStore(t, db, nil)
	opts := &breaker.Options{Threshold: 1, OpenFor: openFor, HalfOpenProbes: 2, ProbeLease: time.Minute}
	a := newBreaker(t, st, "api", opts)
	b := newBreaker(t, openStore(t, db, nil), "api", opts)
	c := newBreaker(t, openStore(t, db, nil), "api", opts)
	openAll(t, []*breaker.Breaker{a, b, c})
	time.Sleep(openFor + 20*time.Millisecond)

	// Two probes, in two processes, held inside fn.
	started, release := make(chan struct{}, 2), [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	done := make(chan error, 2)
	for i, p := range []*breaker.Breaker{a, b} {
		go func() {
			done <- p.Do(context.Background(), func(context.Context) error {
				started <- struct{}{}
				<-release[i]
				return nil
			})
		}()
	}
	for range 2 {
		select {
		case <-started:
		case err := <-done:
			t.Fatalf("a probe did not run: %v", err)
		}
	}
	if rec := record(t, st, "api"); rec.State != breaker.HalfOpen || rec.Probes != 2 {
		t.Fatalf("with two probes running: %s with %d probe slots", rec.State, rec.Probes)
	}
	for _, p := range []*breaker.Breaker{c, a} {
		err := p.Do(context.Background(), succeed)
		var oe *breaker.OpenError
		if !errors.As(err, &oe) || oe.State != breaker.HalfOpen {
			t.Fatalf("a third call while two probes run: %v", err)
		}
	}
	close(release[0])
	if err := <-done; err != nil {
		t.Fatalf("first probe: %v", err)
	}
	if rec := record(t, st, "api"); rec.State != breaker.HalfOpen || rec.ConsecutiveSuccesses != 1 || rec.Probes != 1 {
		t.Fatalf("after one of two successes: %s, %d successes, %d probe slots", rec.State, rec.ConsecutiveSuccesses, rec.Probes)
	}
	close(release[1])
	if err := <-done; err != nil {
		t.Fatalf("second probe: %v", err)
	}
	if rec := record(t, st, "api"); rec.State != breaker.Closed {
		t.Fatalf("after two successful probes: %s", rec.State)
	}
}

func TestIsFailure(t *testing.T) {
	t.Parallel()
	st := openStore(t, testkit.DBName(t), nil)
	errNotFound := errors.New("not found")
	b := newBreaker(t, st, "api", &breaker.Options{
		Threshold: 2,
		IsFailure: func(err error) bool { return !errors.Is(err, errNotFound) },
	})
	ctx := context.Background()
	for range 5 {
		if err := b.Do(ctx, func(context.Context) error { return errNotFound }); !errors.Is(err, errNotFound) {
			t.Fatal(err)
		}
	}
	if rec := record(t, st, "api"); rec.Failures != 0 || rec.State != breaker.Closed {
		t.Fatalf("errors IsFailure rejects were counted: %+v", rec)
	}
	// A success (here: an error that is no failure) resets the count.
	_ = b.Do(ctx, fail)
	_ = b.Do(ctx, func(context.Context) error { return errNotFound })
	_ = b.Do(ctx, fail)
	if rec := record(t, st, "api"); rec.Failures != 1 || rec.State != breaker.Closed {
		t.Fatalf("count not reset by a non-failure: %+v", rec)
	}
	_ = b.Do(ctx, fail)
	if rec := record(t, st, "api"); rec.State != breaker.Open {
		t.Fatalf("two failures in a row: %s", rec.State)
	}
	if s := b.Stats(); s.Successes != 6 || s.CallFailures != 3 || s.Calls != 9 {
		t.Errorf("stats %+v", s)
	}
}

func TestCallerCancellationIsNotAFailure(t *testing.T) {
	t.Parallel()
	ops := &testkit.OpCounter{}
	st := openStore(t, testkit.DBName(t), ops)
	b := newBreaker(t, st, "api", &breaker.Options{Threshold: 1})

	ctx, cancel := context.WithCancel(context.Background())
	err := b.Do(ctx, func(ctx context.Context) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v", err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer dcancel()
	_ = b.Do(dctx, func(ctx context.Context) error {
		<-ctx.Done()
		return fmt.Errorf("query: %w", ctx.Err())
	})
	if n := ops.Get("circuit.record-failure"); n != 0 {
		t.Fatalf("%d failures recorded for caller cancellations", n)
	}
	if s := b.Stats(); s.Ignored != 2 || s.CallFailures != 0 {
		t.Errorf("stats %+v", s)
	}
	// A call already cancelled does not run.
	if err := b.Do(ctx, func(context.Context) error { t.Error("fn ran with a cancelled ctx"); return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("Do(cancelled) = %v", err)
	}

	// A deadline of fn's own while the caller still waits is a failure.
	err = b.Do(context.Background(), func(ctx context.Context) error {
		ictx, icancel := context.WithTimeout(ctx, time.Millisecond)
		defer icancel()
		<-ictx.Done()
		return ictx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	if rec := record(t, st, "api"); rec.State != breaker.Open {
		t.Fatalf("fn's own timeout was not a failure: %+v", rec)
	}
}

// The steady closed state makes no store write and no read: the record is
// read when the Breaker starts (and when its notification stream starts)
// and then only every SyncInterval on stores without notifications.
func TestSteadySuccessMakesNoWrites(t *testing.T) {
	t.Parallel()
	t.Run("notifications", func(t *testing.T) {
		t.Parallel()
		ops := &testkit.OpCounter{}
		b := newBreaker(t, openStore(t, testkit.DBName(t), ops), "api", nil)
		if err := b.Do(context.Background(), succeed); err != nil {
			t.Fatal(err)
		}
		// One read by the first call, one by the watcher once subscribed.
		testkit.Eventually(t, 5*time.Second, "the subscription and its read", func() bool {
			return ops.Get("circuit.watch") == 1 && ops.Get("circuit.get") == 2
		})
		ops.Reset()
		steady(t, b, ops)
	})
	t.Run("polling", func(t *testing.T) {
		t.Parallel()
		ops := &testkit.OpCounter{}
		st, _ := openFlaky(t, testkit.DBName(t), ops, nil)
		b := newBreaker(t, st, "api", &breaker.Options{SyncInterval: time.Hour})
		if err := b.Do(context.Background(), succeed); err != nil {
			t.Fatal(err)
		}
		if n := ops.Get("circuit.get"); n != 1 {
			t.Fatalf("%d reads by the first call, want 1", n)
		}
		ops.Reset()
		steady(t, b, ops)
	})
}

func steady(t *testing.T, b *breaker.Breaker, ops *testkit.OpCounter) {
	t.Helper()
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			for range 200 {
				if v, err := breaker.Call(context.Background(), b, func(context.Context) (int, error) { return 7, nil }); v != 7 || err != nil {
					t.Errorf("Call = %v, %v", v, err)
				}
			}
		})
	}
	wg.Wait()
	if n := circuitWrites(ops); n != 0 {
		t.Errorf("%d store writes on the steady success path", n)
	}
	if n := ops.Get("circuit.get"); n != 0 {
		t.Errorf("%d reads for 2000 calls in the steady state", n)
	}

	// The first success after failures writes once; the next ones don't.
	_ = b.Do(context.Background(), fail)
	_ = b.Do(context.Background(), fail)
	for range 20 {
		_ = b.Do(context.Background(), succeed)
	}
	if f, s := ops.Get("circuit.record-failure"), ops.Get("circuit.record-success"); f != 2 || s != 1 {
		t.Errorf("%d failure and %d success writes, want 2 and 1", f, s)
	}
	if st := b.Stats(); st.Failures != 0 || st.Calls != 2023 {
		t.Errorf("stats %+v", st)
	}
}

// An operator's change reaches a polling Breaker within SyncInterval and a
// Breaker on a store with notifications without any call.
func TestViewFollowsOperators(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("polling", func(t *testing.T) {
		t.Parallel()
		db := testkit.DBName(t)
		st, _ := openFlaky(t, db, nil, nil)
		b := newBreaker(t, st, "api", &breaker.Options{SyncInterval: 10 * time.Millisecond})
		if err := b.Do(ctx, succeed); err != nil {
			t.Fatal(err)
		}
		op := openStore(t, db, nil)
		if _, err := op.Circuits().Set(ctx, "api", breaker.Open); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 5*time.Second, "calls are rejected", func() bool { return errors.Is(b.Do(ctx, succeed), breaker.ErrOpen) })
		// Deleting the record (its version restarts) closes the circuit.
		if _, err := op.Circuits().Delete(ctx, "api"); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 5*time.Second, "calls run again", func() bool { return b.Do(ctx, succeed) == nil })
		for range 3 {
			_ = b.Do(ctx, fail)
		}
		if rec := record(t, op, "api"); rec.Failures != 3 {
			t.Fatalf("after the reset the breaker records %d failures, want 3", rec.Failures)
		}
	})
	t.Run("notifications", func(t *testing.T) {
		t.Parallel()
		db := testkit.DBName(t)
		b := newBreaker(t, openStore(t, db, nil), "api", &breaker.Options{SyncInterval: time.Hour})
		if err := b.Do(ctx, succeed); err != nil {
			t.Fatal(err)
		}
		op := openStore(t, db, nil)
		if _, err := op.Circuits().Set(ctx, "api", breaker.Open); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 5*time.Second, "the view opens", func() bool { return b.Stats().State == breaker.Open })
		if err := b.Do(ctx, succeed); !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("Do = %v", err)
		}
		if _, err := op.Circuits().Delete(ctx, "api"); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 5*time.Second, "the view closes", func() bool { return b.Stats().State == breaker.Closed })
		for range 2 {
			_ = b.Do(ctx, fail)
		}
		if rec := record(t, op, "api"); rec.Failures != 2 {
			t.Fatalf("after the reset the breaker records %d failures, want 2", rec.Failures)
		}
	})
}

func TestStoreOutageFailsOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.DBName(t)
	var logs testkit.LogBuffer
	st, f := openFlaky(t, db, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	const openFor = 250 * time.Millisecond
	b := newBreaker(t, st, "api", &breaker.Options{Threshold: 3, OpenFor: openFor, SyncInterval: 20 * time.Millisecond})
	if err := b.Do(ctx, succeed); err != nil {
		t.Fatal(err)
	}
	f.down.Store(true)

	// Calls keep running; failures are counted locally.
	if err := b.Do(ctx, succeed); err != nil {
		t.Fatalf("fail-open success: %v", err)
	}
	for i := range 3 {
		if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
			t.Fatalf("failure %d during the outage: %v", i, err)
		}
	}
	s := b.Stats()
	if !s.StoreDown || s.StoreErrors == 0 || !errors.Is(s.LastStoreError, errDown) || s.State != breaker.Open {
		t.Fatalf("stats during the outage: %+v", s)
	}
	ran := false
	if err := b.Do(ctx, func(context.Context) error { ran = true; return nil }); !errors.Is(err, breaker.ErrOpen) || ran {
		t.Fatalf("locally open: err=%v ran=%v", err, ran)
	}
	if rec := record(t, openStore(t, db, nil), "api"); rec.Failures != 0 {
		t.Fatalf("the unreachable store recorded %d failures", rec.Failures)
	}
	// After OpenFor the local view probes; a success closes it locally.
	time.Sleep(openFor + 10*time.Millisecond)
	testkit.Eventually(t, 5*time.Second, "a local probe runs", func() bool { return b.Do(ctx, succeed) == nil })
	if s := b.Stats(); s.State != breaker.Closed {
		t.Fatalf("after the local probe: %+v", s)
	}
	if n := strings.Count(logs.String(), "store unreachable"); n != 1 {
		t.Errorf("%d outage warnings, want 1:\n%s", n, logs.String())
	}

	f.down.Store(false)
	testkit.Eventually(t, 5*time.Second, "the store is reachable again", func() bool {
		_ = b.Do(ctx, succeed)
		return !b.Stats().StoreDown
	})
	for range 3 {
		_ = b.Do(ctx, fail)
	}
	if rec := record(t, st, "api"); rec.State != breaker.Open || rec.Failures != 3 {
		t.Fatalf("after the outage: %+v", rec)
	}
}

func TestStoreOutageFailsClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, f := openFlaky(t, testkit.DBName(t), nil, nil)
	b := newBreaker(t, st, "api", &breaker.Options{FailClosed: true, SyncInterval: 10 * time.Millisecond})
	if err := b.Do(ctx, succeed); err != nil {
		t.Fatal(err)
	}
	f.down.Store(true)
	var ran atomic.Int32
	var oe *breaker.OpenError
	testkit.Eventually(t, 5*time.Second, "calls are rejected", func() bool {
		err := b.Do(ctx, func(context.Context) error { ran.Add(1); return nil })
		return errors.As(err, &oe)
	})
	if !errors.Is(oe, breaker.ErrOpen) || !errors.Is(oe, errDown) || oe.StoreErr == nil || !strings.Contains(oe.Error(), "unreachable") {
		t.Fatalf("rejection %v", oe)
	}
	before := ran.Load()
	for range 5 {
		if err := b.Do(ctx, func(context.Context) error { ran.Add(1); return nil }); !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("Do during the outage = %v", err)
		}
	}
	if ran.Load() != before {
		t.Fatal("fn ran while failing closed")
	}
	f.down.Store(false)
	testkit.Eventually(t, 5*time.Second, "calls run again", func() bool { return b.Do(ctx, succeed) == nil })
}

// A probe that cannot be granted because the store is down runs as a
// local probe (fail-open); with FailClosed it is rejected.
func TestOutageWhileOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, failClosed := range []bool{false, true} {
		t.Run(fmt.Sprint("failClosed=", failClosed), func(t *testing.T) {
			t.Parallel()
			st, f := openFlaky(t, testkit.DBName(t), nil, nil)
			const openFor = 40 * time.Millisecond
			b := newBreaker(t, st, "api", &breaker.Options{Threshold: 1, OpenFor: openFor, SyncInterval: time.Hour, FailClosed: failClosed})
			_ = b.Do(ctx, fail)
			time.Sleep(openFor + 10*time.Millisecond)
			f.down.Store(true)
			ran := false
			err := b.Do(ctx, func(context.Context) error { ran = true; return nil })
			if failClosed {
				if !errors.Is(err, breaker.ErrOpen) || !errors.Is(err, errDown) || ran {
					t.Fatalf("err=%v ran=%v", err, ran)
				}
				return
			}
			if err != nil || !ran {
				t.Fatalf("local probe: err=%v ran=%v", err, ran)
			}
			if s := b.Stats(); s.State != breaker.Closed || !s.StoreDown {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

func TestOnStateChange(t *testing.T) {
	t.Parallel()
	const openFor = 40 * time.Millisecond
	var mu sync.Mutex
	var got []string
	b := newBreaker(t, openStore(t, testkit.DBName(t), nil), "api", &breaker.Options{
		Threshold: 2,
		OpenFor:   openFor,
		OnStateChange: func(name string, from, to breaker.State) {
			mu.Lock()
			got = append(got, fmt.Sprintf("%s:%s->%s", name, from, to))
			mu.Unlock()
		},
	})
	ctx := context.Background()
	_ = b.Do(ctx, fail)
	_ = b.Do(ctx, fail)
	time.Sleep(openFor + 10*time.Millisecond)
	if err := b.Do(ctx, succeed); err != nil {
		t.Fatal(err)
	}
	want := "api:closed->open api:open->half-open api:half-open->closed"
	testkit.Eventually(t, 5*time.Second, "three transitions", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 3
	})
	// Late notifications of the same changes must not repeat them.
	_ = b.Do(ctx, succeed)
	mu.Lock()
	defer mu.Unlock()
	if s := strings.Join(got, " "); s != want {
		t.Fatalf("transitions %q, want %q", s, want)
	}
}

func TestPanicIsAFailure(t *testing.T) {
	t.Parallel()
	st := openStore(t, testkit.DBName(t), nil)
	b := newBreaker(t, st, "api", &breaker.Options{Threshold: 1})
	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Errorf("recovered %v", r)
			}
		}()
		_ = b.Do(context.Background(), func(context.Context) error { panic("kaboom") })
	}()
	if rec := record(t, st, "api"); rec.State != breaker.Open {
		t.Fatalf("after a panic: %+v", rec)
	}
}

func TestStateReadsTheStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.DBName(t)
	st, f := openFlaky(t, db, nil, nil)
	b := newBreaker(t, st, "api", &breaker.Options{SyncInterval: time.Hour})
	if s, err := b.State(ctx); s != breaker.Closed || err != nil {
		t.Fatalf("State = %s, %v", s, err)
	}
	if _, err := openStore(t, db, nil).Circuits().Set(ctx, "api", breaker.Open); err != nil {
		t.Fatal(err)
	}
	if s, err := b.State(ctx); s != breaker.Open || err != nil {
		t.Fatalf("State = %s, %v", s, err)
	}
	f.down.Store(true)
	if s, err := b.State(ctx); s != breaker.Open || !errors.Is(err, errDown) {
		t.Fatalf("State during an outage = %s, %v", s, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.State(cctx); err != context.Canceled {
		t.Fatalf("State(cancelled) = %v", err)
	}
}

// Close stops the notification goroutines of every Breaker; the Breakers
// still work afterwards (polling).
func TestCloseStopsGoroutines(t *testing.T) {
	base := runtime.NumGoroutine()
	db := testkit.DBName(t)
	var bs []*breaker.Breaker
	for i := range 5 {
		st := openStore(t, db, nil)
		b, err := breaker.New(st, fmt.Sprint("c", i), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Do(context.Background(), succeed); err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	testkit.Eventually(t, 5*time.Second, "the subscriptions start", func() bool { return runtime.NumGoroutine() >= base+5 })
	for _, b := range bs {
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		_ = b.Close() // idempotent
	}
	testkit.Eventually(t, 5*time.Second, "the goroutines end", func() bool { return runtime.NumGoroutine() <= base })
	for _, b := range bs {
		if err := b.Do(context.Background(), succeed); err != nil {
			t.Fatalf("Do after Close: %v", err)
		}
	}
	if n := runtime.NumGoroutine(); n > base {
		t.Fatalf("%d goroutines after using closed breakers, want at most %d", n, base)
	}
}

// A store closed under a Breaker ends its subscription; calls fail open.
func TestStoreClosed(t *testing.T) {
	t.Parallel()
	st := openStore(t, testkit.DBName(t), nil)
	b := newBreaker(t, st, "api", &breaker.Options{SyncInterval: time.Millisecond})
	if err := b.Do(context.Background(), succeed); err != nil {
		t.Fatal(err)
	}
	_ = st.Close()
	testkit.Eventually(t, 5*time.Second, "the breaker notices", func() bool {
		return b.Do(context.Background(), succeed) == nil && b.Stats().StoreDown
	})
	if s := b.Stats(); !errors.Is(s.LastStoreError, warden.ErrClosed) {
		t.Errorf("last store error %v", s.LastStoreError)
	}
}
