package breaker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/internal/testkit"
)

// A probe's outcome that arrives after other probes closed the circuit
// belongs to the generation the closing ended: process A's probe is
// still running when process B's two probes succeed and close the
// circuit; A's probe then fails (Threshold 1). The circuit stays closed,
// with no failure counted in its new closed period.
func TestLateProbeFailureLeavesClosedCircuit(t *testing.T) {
	t.Parallel()
	const openFor = 20 * time.Millisecond
	ctx := context.Background()
	db := testkit.DBName(t)
	stA, stB := openStore(t, db, nil), openStore(t, db, nil)
	opts := &breaker.Options{Threshold: 1, OpenFor: openFor, ProbeLease: time.Minute, HalfOpenProbes: 2}
	a := newBreaker(t, stA, "svc", opts)
	b := newBreaker(t, stB, "svc", opts)
	if err := a.Do(ctx, fail); !errors.Is(err, errBoom) {
		t.Fatalf("Do = %v, want errBoom", err)
	}
	if rec := record(t, stA, "svc"); rec.State != breaker.Open {
		t.Fatalf("after the failure at Threshold 1: %s, want open", rec.State)
	}
	time.Sleep(2 * openFor) // the open period passes

	// A's probe holds the first slot inside fn.
	started, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- a.Do(ctx, func(context.Context) error { close(started); <-release; return errBoom })
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("A's probe did not run: %v", err)
	}
	// B's two probes succeed and close the circuit.
	for i := range 2 {
		if err := b.Do(ctx, succeed); err != nil {
			t.Fatalf("B's probe %d: %v", i, err)
		}
	}
	if rec := record(t, stB, "svc"); rec.State != breaker.Closed {
		t.Fatalf("after B's two successful probes: %s, want closed", rec.State)
	}
	// A's probe fails late.
	close(release)
	if err := <-done; !errors.Is(err, errBoom) {
		t.Fatalf("A's probe: %v, want errBoom", err)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	rec := record(t, stB, "svc")
	if rec.State != breaker.Closed || rec.Failures != 0 || rec.TotalFailures != 0 {
		t.Fatalf("after the late probe failure: %s with %d failures (%d in the period), want closed with none: the probe's generation ended when the circuit closed",
			rec.State, rec.Failures, rec.TotalFailures)
	}
	if err := b.Do(ctx, succeed); err != nil {
		t.Fatalf("B after the late probe failure: %v, want the call to run", err)
	}
}
