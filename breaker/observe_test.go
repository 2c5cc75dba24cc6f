package breaker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/internal/testkit"
)

// observer collects what a Breaker reports to Options.Observe: calls and
// rejections in a list (they are reported before Do returns), state
// changes on a channel (they may be reported from the Breaker's own
// goroutines, after Do returned).
type observer struct {
	mu      sync.Mutex
	calls   []breaker.Observation
	changes chan breaker.Observation
}

func newObserver() *observer { return &observer{changes: make(chan breaker.Observation, 16)} }

func (o *observer) observe(_ context.Context, ob breaker.Observation) {
	if ob.Kind == breaker.ObservedStateChange {
		o.changes <- ob
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls = append(o.calls, ob)
}

// take returns the calls and rejections observed since the last take.
func (o *observer) take() []breaker.Observation {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.calls
	o.calls = nil
	return c
}

// change waits for the next state change and checks it.
func (o *observer) change(t *testing.T, from, to breaker.State) {
	t.Helper()
	c := <-o.changes
	if c.Circuit != "api" || c.From != from || c.To != to {
		t.Fatalf("state change observed as %+v, want %s → %s", c, from, to)
	}
}

// A failure that opens the circuit, the rejection that follows and the
// panicking call are observed with their outcome and the state change.
func TestObserveCallsAndRejections(t *testing.T) {
	ctx := context.Background()
	obs := newObserver()
	st := openStore(t, testkit.DBName(t), nil)
	b := newBreaker(t, st, "api", &breaker.Options{Threshold: 2, OpenFor: time.Hour, Observe: obs.observe})
	if err := b.Do(ctx, succeed); err != nil {
		t.Fatal(err)
	}
	if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	func() {
		defer func() { _ = recover() }()
		_ = b.Do(ctx, func(context.Context) error { panic("x") })
	}()
	if err := b.Do(ctx, succeed); !errors.Is(err, breaker.ErrOpen) {
		t.Fatalf("a call on an open circuit: %v", err)
	}
	got := obs.take()
	if len(got) != 4 {
		t.Fatalf("observed %d calls and rejections, want 4: %+v", len(got), got)
	}
	want := []struct {
		kind    breaker.ObservationKind
		outcome breaker.CallOutcome
		err     error
	}{
		{breaker.ObservedCall, breaker.CallSucceeded, nil},
		{breaker.ObservedCall, breaker.CallFailed, errBoom},
		{breaker.ObservedCall, breaker.CallFailed, nil}, // the panic
		{breaker.ObservedRejection, "", breaker.ErrOpen},
	}
	for i, w := range want {
		o := got[i]
		if o.Kind != w.kind || o.Outcome != w.outcome || !errors.Is(o.Err, w.err) || (w.err == nil) != (o.Err == nil) || o.Circuit != "api" || o.Probe || o.Duration < 0 {
			t.Errorf("observation %d: %+v, want kind %s, outcome %q, error %v", i, o, w.kind, w.outcome, w.err)
		}
	}
	if r := got[3]; r.State != breaker.Open || r.Duration != 0 {
		t.Errorf("rejection observed as %+v, want state open", r)
	}
	obs.change(t, breaker.Closed, breaker.Open)
}

// A circuit that opens, is probed and closes is observed as three state
// changes, and the successful probe as a probe call.
func TestObserveOpenAndClose(t *testing.T) {
	ctx := context.Background()
	obs := newObserver()
	st := openStore(t, testkit.DBName(t), nil)
	b := newBreaker(t, st, "api", &breaker.Options{Threshold: 1, OpenFor: 20 * time.Millisecond, Observe: obs.observe})
	if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	obs.change(t, breaker.Closed, breaker.Open)
	testkit.Eventually(t, 5*time.Second, "a probe closes the circuit", func() bool { return b.Do(ctx, succeed) == nil })
	obs.change(t, breaker.Open, breaker.HalfOpen)
	obs.change(t, breaker.HalfOpen, breaker.Closed)
	got := obs.take()
	if first := got[0]; first.Kind != breaker.ObservedCall || first.Outcome != breaker.CallFailed || first.Probe {
		t.Fatalf("first observation %+v", first)
	}
	for _, o := range got[1 : len(got)-1] {
		if o.Kind != breaker.ObservedRejection {
			t.Fatalf("while open, observed %+v, want rejections only", o)
		}
	}
	if last := got[len(got)-1]; last.Kind != breaker.ObservedCall || last.Outcome != breaker.CallSucceeded || !last.Probe {
		t.Fatalf("the closing probe observed as %+v", last)
	}
	if s := b.Stats(); s.Rejections != int64(len(got)-2) {
		t.Fatalf("stats count %d rejections, %d observed", s.Rejections, len(got)-2)
	}
}
