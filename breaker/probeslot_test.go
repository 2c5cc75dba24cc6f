package breaker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/internal/testkit"
)

// probe calls b.Do until a call is admitted, polling while the circuit
// rejects calls, and waits until the admitted call's fn runs: fn then
// holds until release is closed and returns result, and b.Do's error is
// sent on done.
func probe(t *testing.T, ctx context.Context, b *breaker.Breaker, who string, result error) (release chan struct{}, done chan error) {
	t.Helper()
	started := make(chan struct{})
	release, done = make(chan struct{}), make(chan error, 1)
	fn := func(context.Context) error { close(started); <-release; return result }
	go func() {
		for {
			err := b.Do(ctx, fn)
			if !errors.Is(err, breaker.ErrOpen) || ctx.Err() != nil {
				done <- err
				return
			}
			time.Sleep(time.Millisecond) // the polling interval, not a synchronisation
		}
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("%s's probe did not run: %v", who, err)
	}
	return release, done
}

// A probe whose slot lapsed and was granted to another process's probe
// no longer decides the circuit: process A's probe runs past its
// ProbeLease (the shortest, 1 ms), process B's Breaker then gets the slot
// (the store judges the lapse by its own clock), A's probe succeeds late
// and must not close the circuit, and B's probe, failing, re-opens it.
func TestLapsedProbeSlotDoesNotDecide(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := testkit.DBName(t)
	stA, stB := openStore(t, db, nil), openStore(t, db, nil)
	opts := &breaker.Options{Threshold: 1, OpenFor: 5 * time.Millisecond, ProbeLease: time.Millisecond,
		SyncInterval: time.Millisecond, StoreTimeout: 10 * time.Second}
	a := newBreaker(t, stA, "svc", opts)
	b := newBreaker(t, stB, "svc", opts)
	if err := a.Do(ctx, fail); !errors.Is(err, errBoom) {
		t.Fatalf("Do = %v, want errBoom", err)
	}
	if rec := record(t, stA, "svc"); rec.State != breaker.Open {
		t.Fatalf("after the failure at Threshold 1: %s, want open", rec.State)
	}

	// A's probe holds the slot inside fn, past its lease.
	releaseA, doneA := probe(t, ctx, a, "A", nil)
	probeA := record(t, stA, "svc")
	if probeA.State != breaker.HalfOpen {
		t.Fatalf("while A probes: %s, want half-open", probeA.State)
	}

	// B's probe gets the slot once A's has lapsed.
	releaseB, doneB := probe(t, ctx, b, "B", errBoom)
	probeB := record(t, stB, "svc")
	if probeB.State != breaker.HalfOpen || probeB.ProbeOwner == probeA.ProbeOwner {
		t.Fatalf("while B probes: %s, probe owner %q (A's was %q), want half-open with B's slot", probeB.State, probeB.ProbeOwner, probeA.ProbeOwner)
	}

	// A's probe succeeds late: its slot is no longer granted.
	close(releaseA)
	if err := <-doneA; err != nil {
		t.Fatalf("A's probe: %v", err)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if rec := record(t, stB, "svc"); rec.State != breaker.HalfOpen || rec.ProbeOwner != probeB.ProbeOwner {
		t.Fatalf("after the late success of A's lapsed probe: %s, probe owner %q; want half-open, B (%q) still probing: a probe whose slot lapsed and was granted again decided the circuit",
			rec.State, rec.ProbeOwner, probeB.ProbeOwner)
	}

	// B's probe decides.
	close(releaseB)
	if err := <-doneB; !errors.Is(err, errBoom) {
		t.Fatalf("B's probe: %v, want errBoom", err)
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if rec := record(t, stB, "svc"); rec.State != breaker.Open {
		t.Fatalf("after B's probe failed: %s, want open", rec.State)
	}
}
