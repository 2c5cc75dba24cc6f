package drivertest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
)

func (s *suite) notifications(t *testing.T) {
	group(t, []check{
		{"Locks", s.notifyLocks},
		{"Circuits", s.notifyCircuits},
		{"CloseEndsWatch", s.notifyClose},
	})
}

// eventWait is how long the leak checks wait for an event before going on
// without one (they only log it; the Notifications checks judge delivery,
// without a time limit).
const eventWait = 10 * time.Second

// drainClosed waits for a watch channel to be closed. It sets no time
// limit: a channel never closed is reported by go test's -timeout.
func drainClosed[T any](ch <-chan T) {
	for range ch {
	}
}

// notifyLocks: a watcher sees the lock events made through another
// connection in its namespace, and none of another namespace.
func (s *suite) notifyLocks(t *testing.T) {
	ctx := testCtx(t)
	watcher, prefix := s.open(t)
	if !watcher.Locks().CanWatch() {
		t.Skipf("%s has no lock notifications", s.h.Name)
	}
	actor := s.openPrefix(t, prefix)
	intruder := s.openPrefix(t, strings.TrimSuffix(prefix, ":")+"x:")
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := watcher.Locks().Watch(wctx)
	fatalIf(t, "Watch", err)

	// next returns the next event; it waits as long as that takes.
	next := func(what string) driver.LockEvent {
		t.Helper()
		ev, ok := <-ch
		if !ok {
			t.Fatalf("%s: the watch channel closed early", what)
		}
		if ev.Owner == "intruder" {
			t.Errorf("watcher saw another namespace's event: %+v", ev)
		}
		return ev
	}

	// The subscription may take effect after Watch returns: make events
	// until one arrives, every 50 ms.
	for armed := false; !armed; {
		rec, ok, err := actor.Locks().Acquire(ctx, "warm-up", "warmer", time.Minute)
		fatalIf(t, "Acquire", err)
		if ok {
			if _, err := actor.Locks().Release(ctx, "warm-up", "warmer", rec.Token); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatal("the watch channel closed early")
			}
			armed = ev.Key == "warm-up" || ev.Kind == driver.EventsLost
		case <-time.After(50 * time.Millisecond):
		}
	}

	// Another namespace acts first on the same key.
	irec, ok, err := intruder.Locks().Acquire(ctx, "k", "intruder", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire in another namespace: ok=%v err=%v", ok, err)
	}
	if _, err := intruder.Locks().Release(ctx, "k", "intruder", irec.Token); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := actor.Locks().Acquire(ctx, "k", "alice", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire: ok=%v err=%v", ok, err)
	}
	if ok, err := actor.Locks().Release(ctx, "k", "alice", rec.Token); err != nil || !ok {
		t.Fatalf("Release: ok=%v err=%v", ok, err)
	}
	if _, ok, err := actor.Locks().Acquire(ctx, "sentinel", "bob", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire: ok=%v err=%v", ok, err)
	}
	var acquired, released, lost bool
	for {
		ev := next("waiting for the sentinel's event")
		if ev.Kind == driver.EventsLost {
			lost = true
			continue
		}
		if ev.Key == "sentinel" && ev.Kind == driver.LockAcquired {
			break
		}
		if ev.Key != "k" {
			continue
		}
		switch ev.Kind {
		case driver.LockAcquired:
			if ev.Owner == "alice" {
				if ev.Token != rec.Token {
					t.Errorf("acquired event token %d, want %d", ev.Token, rec.Token)
				}
				checkTime(t, "event time", ev.At)
				acquired = true
			}
		case driver.LockReleased:
			if !acquired {
				t.Errorf("released event before the acquired event: %+v", ev)
			}
			released = true
		}
	}
	if lost {
		t.Logf("the watcher was told events were lost")
	}
	if !acquired || !released {
		t.Errorf("watcher saw acquired=%v released=%v for a lock taken and released through another connection", acquired, released)
	}
	cancel()
	drainClosed(ch)
}

// notifyCircuits: a watcher sees circuit changes made through another
// connection in its namespace, and none of another namespace.
func (s *suite) notifyCircuits(t *testing.T) {
	ctx := testCtx(t)
	watcher, prefix := s.open(t)
	if !watcher.Circuits().CanWatch() {
		t.Skipf("%s has no circuit notifications", s.h.Name)
	}
	actor := s.openPrefix(t, prefix)
	intruder := s.openPrefix(t, strings.TrimSuffix(prefix, ":")+"x:")
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := watcher.Circuits().Watch(wctx)
	fatalIf(t, "Watch", err)
	next := func(what string) driver.CircuitRecord {
		t.Helper()
		rec, ok := <-ch
		if !ok {
			t.Fatalf("%s: the watch channel closed early", what)
		}
		if rec.Name == "intruder" || (rec.Name == "c" && rec.Failures > 1) {
			t.Errorf("watcher saw another namespace's change: %+v", rec)
		}
		return rec
	}
	for armed := false; !armed; {
		if _, err := actor.Circuits().RecordFailure(ctx, "warm-up", 1000); err != nil {
			t.Fatal(err)
		}
		select {
		case rec, ok := <-ch:
			if !ok {
				t.Fatal("the watch channel closed early")
			}
			armed = rec.Name == "warm-up" || rec.Name == ""
		case <-time.After(50 * time.Millisecond):
		}
	}
	for range 3 {
		if _, err := intruder.Circuits().RecordFailure(ctx, "c", 1000); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := intruder.Circuits().RecordFailure(ctx, "intruder", 1000); err != nil {
		t.Fatal(err)
	}
	want, err := actor.Circuits().RecordFailure(ctx, "c", 1000)
	fatalIf(t, "RecordFailure", err)
	if _, err := actor.Circuits().Set(ctx, "sentinel", driver.Open); err != nil {
		t.Fatal(err)
	}
	seen := false
	for {
		rec := next("waiting for the sentinel's change")
		if rec.Name == "sentinel" {
			break
		}
		if rec.Name == "c" && rec.Failures == 1 {
			if rec.Version != want.Version || rec.State != driver.Closed {
				t.Errorf("change of c: %+v, want %+v", rec, want)
			}
			seen = true
		}
	}
	if !seen {
		t.Errorf("watcher did not see the failure recorded through another connection")
	}
	cancel()
	drainClosed(ch)
}

// notifyClose: closing the store ends its watches.
func (s *suite) notifyClose(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	lw, cw := st.Locks().CanWatch(), st.Circuits().CanWatch()
	if !lw && !cw {
		t.Skipf("%s has no notifications", s.h.Name)
	}
	var lch <-chan driver.LockEvent
	var cch <-chan driver.CircuitRecord
	var err error
	if lw {
		lch, err = st.Locks().Watch(ctx)
		fatalIf(t, "Locks.Watch", err)
	}
	if cw {
		cch, err = st.Circuits().Watch(ctx)
		fatalIf(t, "Circuits.Watch", err)
	}
	fatalIf(t, "Close", st.Close())
	if lw {
		drainClosed(lch)
	}
	if cw {
		drainClosed(cch)
	}
}
