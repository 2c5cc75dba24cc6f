package sqlite

import (
	"context"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/eventhub"
)

const waitLimit = 10 * time.Second

// nextLock receives the next lock event or fails after waitLimit.
func nextLock(t *testing.T, ch <-chan driver.LockEvent) driver.LockEvent {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("lock watch channel closed")
		}
		return ev
	case <-time.After(waitLimit):
		t.Fatal("no lock event")
	}
	panic("unreachable")
}

func nextCircuit(t *testing.T, ch <-chan driver.CircuitRecord) driver.CircuitRecord {
	t.Helper()
	select {
	case r, ok := <-ch:
		if !ok {
			t.Fatal("circuit watch channel closed")
		}
		return r
	case <-time.After(waitLimit):
		t.Fatal("no circuit event")
	}
	panic("unreachable")
}

func expectLock(t *testing.T, ch <-chan driver.LockEvent, kind driver.LockEventKind, key, owner string, token int64) driver.LockEvent {
	t.Helper()
	ev := nextLock(t, ch)
	if ev.Kind != kind || ev.Key != key || ev.Owner != owner || ev.Token != token || ev.At.IsZero() {
		t.Fatalf("event %+v, want %v %q %q %d", ev, kind, key, owner, token)
	}
	return ev
}

// waitClosed waits until ch is closed, draining it.
func waitClosed[T any](t *testing.T, ch <-chan T) {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("watch channel not closed")
		}
	}
}

func TestWatchLocks(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, path := openTest(t, &Options{Prefix: "w:"})
	other := openAt(t, path, &Options{Prefix: "elsewhere:"})
	ch, err := st.Locks().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Locks().CanWatch() || !st.Circuits().CanWatch() {
		t.Fatal("CanWatch = false")
	}
	l := st.Locks()

	// Events of another namespace and of circuits are not delivered.
	if _, _, err := other.Locks().Acquire(ctx, "k", "stranger", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Circuits().RecordFailure(ctx, "k", 5); err != nil {
		t.Fatal(err)
	}

	a, _, err := l.Acquire(ctx, "k", "alice", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	expectLock(t, ch, driver.LockAcquired, "k", "alice", a.Token)

	// A refresh and a re-acquire by the holder are not new holdings.
	if _, _, err := l.Refresh(ctx, "k", "alice", a.Token, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Acquire(ctx, "k", "alice", time.Minute); err != nil {
		t.Fatal(err)
	}
	// A failed acquire is no event either.
	if _, ok, err := l.Acquire(ctx, "k", "bob", time.Minute); err != nil || ok {
		t.Fatal(ok, err)
	}
	if ok, err := l.Release(ctx, "k", "alice", a.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	expectLock(t, ch, driver.LockReleased, "k", "alice", a.Token)

	// Takeover of an expired holding: the old one is reported expired.
	c, _, err := l.Acquire(ctx, "k", "carol", 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	expectLock(t, ch, driver.LockAcquired, "k", "carol", c.Token)
	time.Sleep(time.Until(c.ExpiresAt) + 5*time.Millisecond) // the holding must expire
	d, ok, err := l.Acquire(ctx, "k", "dave", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	ev := expectLock(t, ch, driver.LockExpired, "k", "carol", c.Token)
	if !ev.At.Equal(c.ExpiresAt) {
		t.Fatalf("expired event at %v, holding expired at %v", ev.At, c.ExpiresAt)
	}
	expectLock(t, ch, driver.LockAcquired, "k", "dave", d.Token)
	if ok, err := l.ForceRelease(ctx, "k"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	expectLock(t, ch, driver.LockReleased, "k", "dave", d.Token)

	cancel()
	waitClosed(t, ch)
}

func TestWatchCircuits(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, _ := openTest(t, &Options{Prefix: "w:"})
	ch, err := st.Circuits().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := st.Circuits()
	if _, _, err := st.Locks().Acquire(ctx, "api", "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	r1, err := c.RecordFailure(ctx, "api", 2)
	if err != nil {
		t.Fatal(err)
	}
	got := nextCircuit(t, ch)
	if got != r1 {
		t.Fatalf("event %+v, want %+v", got, r1)
	}
	r2, _ := c.RecordFailure(ctx, "api", 2)
	if got := nextCircuit(t, ch); got != r2 || got.State != driver.Open {
		t.Fatalf("event %+v, want %+v", got, r2)
	}
	r3, _, _ := c.TryProbe(ctx, "api", "prober", 0, time.Minute)
	if got := nextCircuit(t, ch); got != r3 || got.ProbeOwner != "prober" {
		t.Fatalf("event %+v, want %+v", got, r3)
	}
	if _, err := c.Delete(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	if got := nextCircuit(t, ch); got.Name != "api" || got.State != driver.Closed || got.Failures != 0 {
		t.Fatalf("delete event %+v", got)
	}
	cancel()
	waitClosed(t, ch)
}

// TestWatchLifecycle: the watcher goroutine starts with the first watch,
// serves several, stops with the last, and restarts; Close closes the
// channels and waits for it.
func TestWatchLifecycle(t *testing.T) {
	st, _ := openTest(t, nil)
	s := st.Driver().(*store)
	running := s.hub.Running
	watcherGone := func() {
		t.Helper()
		done := make(chan struct{})
		go func() { s.hub.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(waitLimit):
			t.Fatal("watcher goroutine still running")
		}
	}
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	ch1, err := st.Locks().Watch(ctx1)
	if err != nil {
		t.Fatal(err)
	}
	ch2, err := st.Circuits().Watch(ctx2)
	if err != nil {
		t.Fatal(err)
	}
	cancel1()
	waitClosed(t, ch1)
	if !running() {
		t.Fatal("watcher stopped while a watch remains")
	}
	// The remaining watch still works.
	r, _ := st.Circuits().RecordFailure(context.Background(), "c", 3)
	if got := nextCircuit(t, ch2); got != r {
		t.Fatalf("event %+v", got)
	}
	cancel2()
	waitClosed(t, ch2)
	if running() {
		t.Fatal("watcher running without watches")
	}
	watcherGone()

	// It starts again.
	ctx3, cancel3 := context.WithCancel(context.Background())
	defer cancel3()
	ch3, err := st.Locks().Watch(ctx3)
	if err != nil {
		t.Fatal(err)
	}
	rec, _, _ := st.Locks().Acquire(context.Background(), "again", "o", time.Minute)
	expectLock(t, ch3, driver.LockAcquired, "again", "o", rec.Token)

	// Close ends it all.
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, ch3)
	watcherGone()
	if _, err := s.WatchLocks(context.Background()); err == nil {
		t.Fatal("WatchLocks after Close: no error")
	}
}

// TestWatchSlowReceiver: a receiver that does not keep up loses events and
// is told so; the store never blocks on it.
func TestWatchSlowReceiver(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, _ := openTest(t, nil)
	ch, err := st.Locks().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l := st.Locks()
	// 2 events per cycle: well over the channel's capacity.
	for i := 0; i < eventhub.Buffer; i++ {
		rec, _, err := l.Acquire(ctx, "busy", "o", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Release(ctx, "busy", "o", rec.Token); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.After(waitLimit)
	n := 0
	for {
		select {
		case ev := <-ch:
			n++
			if ev.Kind == driver.EventsLost {
				if n <= eventhub.Buffer {
					t.Fatalf("EventsLost after only %d events", n)
				}
				return
			}
		case <-deadline:
			t.Fatalf("no EventsLost after %d events", n)
		}
	}
}

// TestWatchGap: events pruned before the watcher read them are reported as
// EventsLost.
func TestWatchGap(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, _ := openTest(t, nil)
	ch, err := st.Locks().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	db := st.Driver().(*store).db
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	ins := `INSERT INTO go_goscope_events (kind, namespace, key, owner, token, at) VALUES ('acquired', '', 'lock:k', ?, 1, ?)`
	now := time.Now().UnixMilli()
	res, err := tx.Exec(ins, "pruned", now)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := res.LastInsertId()
	if _, err := tx.Exec(`DELETE FROM go_goscope_events WHERE id = ?`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ins, "kept", now); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if ev := nextLock(t, ch); ev.Kind != driver.EventsLost {
		t.Fatalf("first event %+v, want EventsLost", ev)
	}
	expectLock(t, ch, driver.LockAcquired, "k", "kept", 1)
}

// TestEventsPruned: the events table does not grow without bound, even
// with no watcher.
func TestEventsPruned(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	db := st.Driver().(*store).db
	old := time.Now().Add(-2 * time.Minute).UnixMilli()
	for i := 0; i < 20; i++ {
		if _, err := db.Exec(`INSERT INTO go_goscope_events (kind, namespace, key, at) VALUES ('acquired', '', 'lock:old', ?)`, old); err != nil {
			t.Fatal(err)
		}
	}
	// Each new event prunes up to 8 old ones.
	for i := 0; i < 3; i++ {
		rec, _, err := st.Locks().Acquire(ctx, "k", "o", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Locks().Release(ctx, "k", "o", rec.Token); err != nil {
			t.Fatal(err)
		}
	}
	var oldLeft, total int
	db.QueryRow(`SELECT count(*) FROM go_goscope_events WHERE key = 'lock:old'`).Scan(&oldLeft)
	db.QueryRow(`SELECT count(*) FROM go_goscope_events`).Scan(&total)
	if oldLeft != 0 || total != 6 {
		t.Fatalf("%d old events left, %d in all; want 0 and 6", oldLeft, total)
	}
	// Purge deletes old events too.
	if _, err := db.Exec(`INSERT INTO go_goscope_events (kind, namespace, key, at) VALUES ('acquired', '', 'lock:old', ?)`, old); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Purge(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	db.QueryRow(`SELECT count(*) FROM go_goscope_events WHERE key = 'lock:old'`).Scan(&oldLeft)
	if oldLeft != 0 {
		t.Fatalf("Purge left %d old events", oldLeft)
	}
}
