package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/testkit"
)

// hung wraps the memory driver: its circuit operations named in ops do
// not answer — they block until their ctx ends (a store that stopped
// answering) or release is closed (the store recovers), and then go on to
// the real store. It has no notifications, so Breakers on it poll.
type hung struct {
	driver.Store
	ops     map[string]bool // "get", "probe", "failure", "success"
	release chan struct{}

	mu        sync.Mutex
	deadlines []time.Time // of the blocked operations' contexts; zero: none
	finished  atomic.Int32
}

func newHung(db string, ops ...string) *hung {
	h := &hung{Store: testkit.MemoryDriver(db), ops: map[string]bool{}, release: make(chan struct{})}
	for _, op := range ops {
		h.ops[op] = true
	}
	return h
}

func (h *hung) Circuits() driver.Circuits { return hungCircuits{h.Store.Circuits(), h} }

// block holds an operation op until its ctx ends or the store recovers.
func (h *hung) block(ctx context.Context, op string) error {
	if !h.ops[op] {
		return nil
	}
	defer h.finished.Add(1)
	dl, _ := ctx.Deadline()
	h.mu.Lock()
	h.deadlines = append(h.deadlines, dl)
	h.mu.Unlock()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-h.release:
		return nil
	}
}

// checkDeadlines fails the test unless every blocked operation ran on a
// context whose deadline came before the caller's.
func (h *hung) checkDeadlines(t *testing.T, caller time.Time) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.deadlines) == 0 {
		t.Fatal("no store operation was attempted")
	}
	for i, dl := range h.deadlines {
		if dl.IsZero() || !dl.Before(caller) {
			t.Errorf("store operation %d ran with deadline %v, not before the caller's %v: a hung store holds the caller to its deadline", i, dl, caller)
		}
	}
}

// callerDeadline runs check with a caller whose deadline is d away, then
// 2d, 4d, … while check reports that it could not decide: the caller's
// own deadline passed before the call returned, on a machine too slow for
// d (the Breaker's store budget is a fraction of the caller's time, and
// fn needs the rest). Tests assert behaviour, not speed: a slow machine is
// no failure. check reports real failures itself (checking first what
// holds whatever the machine's speed, like the budgets' deadlines); the
// doubling stops at the first. A check that never decides is reported by
// go test's -timeout.
func callerDeadline(t *testing.T, d time.Duration, check func(d time.Duration) (decided bool)) {
	t.Helper()
	for !check(d) && !t.Failed() {
		t.Logf("the caller's deadline of %v passed before the call returned (slow machine): again with %v", d, 2*d)
		d *= 2
	}
}

type hungCircuits struct {
	driver.Circuits
	h *hung
}

func (c hungCircuits) RecordFailure(ctx context.Context, name string, threshold int, gen int64) (driver.CircuitRecord, error) {
	if err := c.h.block(ctx, "failure"); err != nil {
		return driver.CircuitRecord{}, err
	}
	return c.Circuits.RecordFailure(ctx, name, threshold, gen)
}

func (c hungCircuits) RecordSuccess(ctx context.Context, name string, gen int64) (driver.CircuitRecord, error) {
	if err := c.h.block(ctx, "success"); err != nil {
		return driver.CircuitRecord{}, err
	}
	return c.Circuits.RecordSuccess(ctx, name, gen)
}

func (c hungCircuits) TryProbe(ctx context.Context, name, owner string, openFor, lease time.Duration) (driver.CircuitRecord, bool, error) {
	if err := c.h.block(ctx, "probe"); err != nil {
		return driver.CircuitRecord{}, false, err
	}
	return c.Circuits.TryProbe(ctx, name, owner, openFor, lease)
}

func (c hungCircuits) RecordOutcome(ctx context.Context, name string, o driver.Outcome) (driver.CircuitRecord, error) {
	op := "success"
	if o.Kind == driver.OutcomeFailure {
		op = "failure"
	}
	if err := c.h.block(ctx, op); err != nil {
		return driver.CircuitRecord{}, err
	}
	return c.Circuits.RecordOutcome(ctx, name, o)
}

func (c hungCircuits) Trip(ctx context.Context, name string, version int64) (driver.CircuitRecord, bool, error) {
	if err := c.h.block(ctx, "failure"); err != nil {
		return driver.CircuitRecord{}, false, err
	}
	return c.Circuits.Trip(ctx, name, version)
}

func (c hungCircuits) TryProbes(ctx context.Context, name, owner string, openFor, lease time.Duration, maxProbes int) (driver.CircuitRecord, bool, error) {
	if err := c.h.block(ctx, "probe"); err != nil {
		return driver.CircuitRecord{}, false, err
	}
	return c.Circuits.TryProbes(ctx, name, owner, openFor, lease, maxProbes)
}

func (c hungCircuits) Get(ctx context.Context, name string) (driver.CircuitRecord, bool, error) {
	if err := c.h.block(ctx, "get"); err != nil {
		return driver.CircuitRecord{}, false, err
	}
	return c.Circuits.Get(ctx, name)
}

// A store that stops answering is not an outage of the callers: with a
// 50 ms deadline, Do runs fn (fail-open) or rejects the call (fail-closed)
// after store work bounded by the breaker's own budget, which ends before
// the caller's deadline, and the breaker reports the store down. (On a
// machine too slow for 50 ms, the deadline doubles until the caller's own
// deadline no longer passes first.)
func TestHungStoreIsNotTheCallersOutage(t *testing.T) {
	t.Parallel()
	for _, failClosed := range []bool{false, true} {
		t.Run(fmt.Sprint("failClosed=", failClosed), func(t *testing.T) {
			t.Parallel()
			callerDeadline(t, 50*time.Millisecond, func(d time.Duration) bool {
				h := newHung(testkit.DBName(t), "get", "probe", "failure", "success")
				st := testkit.Open(t, h, &warden.Options{Logger: quiet})
				b := newBreaker(t, st, "api", &breaker.Options{FailClosed: failClosed})
				defer close(h.release) // before the breaker's Close
				ctx, cancel := context.WithTimeout(context.Background(), d)
				defer cancel()
				deadline, _ := ctx.Deadline()

				var ran bool
				var fnCtxErr error
				v, err := breaker.Call(ctx, b, func(ctx context.Context) (int, error) {
					ran, fnCtxErr = true, ctx.Err()
					return 42, nil
				})
				h.checkDeadlines(t, deadline)
				if ctx.Err() != nil {
					return false // the caller's deadline passed before Do returned
				}
				if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
					t.Fatalf("Do failed with the caller's own deadline: %v (ran=%v)", err, ran)
				}
				if s := b.Stats(); !s.StoreDown || !errors.Is(s.LastStoreError, breaker.ErrStoreTimeout) {
					t.Fatalf("the hung store is not reported down: %+v", s)
				}
				if failClosed {
					var oe *breaker.OpenError
					if !errors.As(err, &oe) || !errors.Is(err, breaker.ErrStoreTimeout) || ran {
						t.Fatalf("fail-closed on a hung store: err=%v ran=%v, want a rejection for the store's timeout", err, ran)
					}
					return true
				}
				if err != nil || v != 42 || !ran || fnCtxErr != nil {
					t.Fatalf("fail-open on a hung store: v=%d err=%v ran=%v fn's ctx=%v, want fn's result from a live ctx", v, err, ran, fnCtxErr)
				}
				return true
			})
		})
	}
}

// A failure whose write the store does not answer does not hold the
// caller: Do returns with fn's error while the write still waits (it ends
// only when the test lets the store answer, or after the Breaker's own
// write timeout of seconds), and the write lands once the store answers.
// (The caller's deadline of 50 ms doubles on a machine too slow for it.)
func TestHungOutcomeWriteIsNotLost(t *testing.T) {
	t.Parallel()
	callerDeadline(t, 50*time.Millisecond, func(d time.Duration) bool {
		return hungOutcomeWriteIsNotLost(t, d)
	})
}

func hungOutcomeWriteIsNotLost(t *testing.T, d time.Duration) (decided bool) {
	db := testkit.DBName(t)
	h := newHung(db, "failure")
	st := testkit.Open(t, h, &warden.Options{Logger: quiet})
	b, err := breaker.New(st, "api", &breaker.Options{SyncInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	released := false
	defer func() {
		if !released {
			close(h.release)
		}
	}()
	if err := b.Do(context.Background(), succeed); err != nil { // reads the record
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
		t.Fatalf("Do = %v, want fn's error", err)
	}
	if ctx.Err() != nil {
		return false // the caller's deadline passed before Do returned
	}
	if n := h.finished.Load(); n != 0 {
		t.Fatalf("Do returned only after its failure write ended (%d ended; the store had not answered): the caller was held by the store", n)
	}
	gone, cancelGone := context.WithCancel(context.Background())
	cancelGone()
	if err := b.Flush(gone); err != context.Canceled {
		t.Fatalf("Flush(cancelled) with a write in flight = %v, want context.Canceled", err)
	}
	released = true
	close(h.release) // the store answers again
	if err := b.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if rec := record(t, openStore(t, db, nil), "api"); rec.Failures != 1 {
		t.Fatalf("after the store answered, the circuit has %d failures, want 1 (the increment was lost)", rec.Failures)
	}
	if s := b.Stats(); s.StoreDown || s.Failures != 1 {
		t.Fatalf("stats after the write landed: %+v", s)
	}
	return true
}

// waitStoreClock waits until the store's clock (the UpdatedAt of a write)
// reaches at.
func waitStoreClock(t *testing.T, st *warden.Store, at time.Time) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, "the store's clock passes "+at.String(), func() bool {
		rec, err := st.Circuits().RecordFailure(context.Background(), "store-clock", 1<<30)
		return err == nil && !rec.UpdatedAt.Before(at)
	})
}

// A Breaker that first meets a circuit that opened long ago (OpenFor has
// passed by the store's clock, nothing written since) probes at once; it
// does not wait another OpenFor.
func TestNewBreakerProbesOldOpenCircuitAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.DBName(t)
	const openFor = 300 * time.Millisecond
	op := openStore(t, db, nil)
	rec, err := op.Circuits().RecordFailure(ctx, "api", 1)
	if err != nil || rec.State != breaker.Open {
		t.Fatalf("opening: %+v %v", rec, err)
	}
	waitStoreClock(t, op, rec.OpenedAt.Add(openFor))

	b := newBreaker(t, openStore(t, db, nil), "api", &breaker.Options{OpenFor: openFor, SyncInterval: time.Hour})
	ran := false
	if err := b.Do(ctx, func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("the first call of a new breaker on a circuit open for longer than OpenFor: err=%v ran=%v, want it admitted as the probe", err, ran)
	}
	if s := b.Stats(); s.Probes != 1 || s.State != breaker.Closed {
		t.Fatalf("stats %+v", s)
	}
	if rec := record(t, op, "api"); rec.State != breaker.Closed {
		t.Fatalf("record after the probe: %+v", rec)
	}
}

// A slow call admitted while the circuit was closed ends with a success
// while another process probes the circuit, which has opened since: the
// success belongs to an older generation and changes nothing, so the
// probe's failure re-opens the circuit.
func TestLateSuccessDoesNotCloseANewGeneration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.DBName(t)
	const openFor = 50 * time.Millisecond
	// a polls (no notifications, SyncInterval an hour): its view stays
	// what its own calls saw.
	stA, _ := openFlaky(t, db, nil, nil)
	a := newBreaker(t, stA, "api", &breaker.Options{Threshold: 2, OpenFor: openFor, SyncInterval: time.Hour})
	other := openStore(t, db, nil).Circuits() // another process
	if err := a.Do(ctx, fail); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}

	started, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- a.Do(ctx, func(context.Context) error { close(started); <-finish; return nil })
	}()
	<-started

	// Meanwhile the circuit opens (a's failure and another), and after OpenFor the other process
	// takes the probe slot.
	opened, err := other.RecordFailure(ctx, "api", 2)
	if err != nil {
		t.Fatal(err)
	}
	if opened.State != breaker.Open {
		t.Fatalf("after 2 failures: %+v", opened)
	}
	testkit.Eventually(t, 10*time.Second, "the other process gets the probe slot", func() bool {
		_, granted, err := other.TryProbe(ctx, "api", "other-process", openFor, time.Minute)
		return err == nil && granted
	})

	close(finish) // the slow call succeeds now
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rec := record(t, openStore(t, db, nil), "api")
	if rec.State != breaker.HalfOpen || rec.ProbeOwner != "other-process" {
		t.Fatalf("a late success of the previous generation changed the probed circuit: %s, probe owner %q", rec.State, rec.ProbeOwner)
	}
	// The probe fails: the circuit re-opens.
	if rec, err := other.RecordFailure(ctx, "api", 2); err != nil || rec.State != breaker.Open {
		t.Fatalf("after the probe failed: %+v %v, want open", rec, err)
	}
}

// On an open circuit whose open period has passed, only the probe request
// hangs (reads and outcome writes answer): with a 50 ms deadline, Do
// returns within it — the probe request is bounded by the breaker's
// budget, which ends before the caller's deadline — and the call follows
// the policy: fail-open runs fn as a local probe, fail-closed rejects it
// for the store's timeout. (The deadline doubles on a machine too slow
// for 50 ms.)
func TestHungProbeRequestIsNotTheCallersOutage(t *testing.T) {
	t.Parallel()
	for _, failClosed := range []bool{false, true} {
		t.Run(fmt.Sprint("failClosed=", failClosed), func(t *testing.T) {
			t.Parallel()
			callerDeadline(t, 50*time.Millisecond, func(d time.Duration) bool {
				return hungProbeRequest(t, failClosed, d)
			})
		})
	}
}

func hungProbeRequest(t *testing.T, failClosed bool, d time.Duration) (decided bool) {
	ctx := context.Background()
	db := testkit.DBName(t)
	const openFor = 20 * time.Millisecond
	op := openStore(t, db, nil)
	rec, err := op.Circuits().RecordFailure(ctx, "api", 1)
	if err != nil || rec.State != breaker.Open {
		t.Fatalf("opening: %+v %v", rec, err)
	}
	waitStoreClock(t, op, rec.OpenedAt.Add(openFor))

	h := newHung(db, "probe")
	st := testkit.Open(t, h, &warden.Options{Logger: quiet})
	b := newBreaker(t, st, "api", &breaker.Options{OpenFor: openFor, FailClosed: failClosed})
	defer close(h.release) // before the breaker's Close
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	deadline, _ := cctx.Deadline()

	ran := false
	var fnCtxErr error
	v, err := breaker.Call(cctx, b, func(ctx context.Context) (int, error) {
		ran, fnCtxErr = true, ctx.Err()
		return 42, nil
	})
	h.checkDeadlines(t, deadline)
	if cctx.Err() != nil {
		return false // the caller's deadline passed before Do returned
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		t.Fatalf("Do failed with the caller's own deadline: %v (ran=%v)", err, ran)
	}
	if s := b.Stats(); !errors.Is(s.LastStoreError, breaker.ErrStoreTimeout) {
		t.Fatalf("the hung probe request is not counted as a store timeout: %+v", s)
	}
	if failClosed {
		if !errors.Is(err, breaker.ErrOpen) || !errors.Is(err, breaker.ErrStoreTimeout) || ran {
			t.Fatalf("fail-closed with a hung probe request: err=%v ran=%v, want a rejection for the store's timeout", err, ran)
		}
		return true
	}
	if err != nil || v != 42 || !ran || fnCtxErr != nil {
		t.Fatalf("fail-open with a hung probe request: v=%d err=%v ran=%v fn's ctx=%v, want fn run as a local probe from a live ctx", v, err, ran, fnCtxErr)
	}
	return true
}
