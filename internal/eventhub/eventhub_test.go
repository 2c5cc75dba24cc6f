package eventhub

import (
	"context"
	"errors"
	"testing"

	"github.com/warden-go/warden/driver"
)

// startCounting returns a StartFunc whose loops hand their Run to runs and
// block until their ctx ends.
func startCounting(runs chan<- *Run) StartFunc {
	return func(context.Context) (func(context.Context, *Run), error) {
		return func(ctx context.Context, run *Run) {
			runs <- run
			<-ctx.Done()
		}, nil
	}
}

func TestDeliverOverflowOwesOneMarker(t *testing.T) {
	runs := make(chan *Run, 1)
	h := New(startCounting(runs), errors.New("closed"))
	defer h.Close()
	ch, err := h.WatchLocks(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	run := <-runs
	evs := make([]driver.LockEvent, Buffer+5)
	for i := range evs {
		evs[i] = driver.LockEvent{Kind: driver.LockAcquired, Key: "k", Token: int64(i + 1)}
	}
	if !h.Deliver(run, evs, nil, false) {
		t.Fatal("Deliver refused the current run")
	}
	for i := 0; i < Buffer; i++ {
		if ev := <-ch; ev.Token != int64(i+1) {
			t.Fatalf("event %d: token %d", i, ev.Token)
		}
	}
	// The overflow is owed as one marker, sent by the next Deliver.
	h.Deliver(run, nil, nil, false)
	if ev := <-ch; ev.Kind != driver.EventsLost {
		t.Fatalf("after an overflow: %v, want EventsLost", ev.Kind)
	}
	h.Deliver(run, []driver.LockEvent{{Kind: driver.LockReleased, Key: "k"}}, nil, false)
	if ev := <-ch; ev.Kind != driver.LockReleased {
		t.Fatalf("after the marker: %v, want the next event", ev.Kind)
	}
}

func TestWatcherFollowsSubscribers(t *testing.T) {
	runs := make(chan *Run, 2)
	closed := errors.New("closed")
	h := New(startCounting(runs), closed)
	ctx, cancel := context.WithCancel(context.Background())
	locks, err := h.WatchLocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	circs, err := h.WatchCircuits(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	first := <-runs
	if l, c := h.Wants(); !l || !c {
		t.Fatalf("Wants = %v, %v with both kinds watched", l, c)
	}
	cancel()
	if _, ok := <-locks; ok {
		t.Fatal("the lock channel stayed open after its ctx ended")
	}
	if l, c := h.Wants(); l || !c {
		t.Fatalf("Wants = %v, %v with circuits watched only", l, c)
	}
	if !h.Running() {
		t.Fatal("the watcher stopped while a circuit watch remained")
	}
	h.Deliver(first, nil, []driver.CircuitRecord{{Name: "c"}}, true)
	if r := <-circs; r.Name != "" {
		t.Fatalf("a gap must come first as an EventsLost record, got %q", r.Name)
	}
	if r := <-circs; r.Name != "c" {
		t.Fatalf("got %q, want c", r.Name)
	}
	h.Close()
	h.Wait()
	if _, ok := <-circs; ok {
		t.Fatal("Close left a channel open")
	}
	if h.Running() {
		t.Fatal("running after Close")
	}
	if h.Deliver(first, nil, nil, false) {
		t.Fatal("Deliver accepted a stopped run")
	}
	if _, err := h.WatchLocks(context.Background()); !errors.Is(err, closed) {
		t.Fatalf("WatchLocks after Close: %v, want the closed error", err)
	}
	select {
	case <-runs:
		t.Fatal("a second watcher was started")
	default:
	}
}
