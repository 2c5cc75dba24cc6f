package sqlite

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/eventhub"
)

// The waits below set no time limit: tests assert what happens, not how
// fast, and an event or an end that never comes is reported by go test's
// -timeout, with every goroutine's stack.

// nextLock receives the next lock event, failing if the channel closes.
func nextLock(t *testing.T, ch <-chan driver.LockEvent) driver.LockEvent {
	t.Helper()
	ev, ok := <-ch
	if !ok {
		t.Fatal("lock watch channel closed")
	}
	return ev
}

// nextCircuit receives the next circuit change, failing if the channel
// closes.
func nextCircuit(t *testing.T, ch <-chan driver.CircuitRecord) driver.CircuitRecord {
	t.Helper()
	r, ok := <-ch
	if !ok {
		t.Fatal("circuit watch channel closed")
	}
	return r
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
	for range ch {
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
		s.hub.Wait() // never, if the watcher goroutine kept running
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
	n := 0
	for ev := range ch { // never ends, if the overflow were not reported
		n++
		if ev.Kind == driver.EventsLost {
			if n <= eventhub.Buffer {
				t.Fatalf("EventsLost after only %d events", n)
			}
			return
		}
	}
	t.Fatalf("the watch channel closed after %d events without EventsLost", n)
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

// TestWatchExpiredInQuietTable: a holding that expired long before
// another owner takes the key over (no other event in between) is
// reported LockExpired to watchers. The expired event carries the old
// expiry as its time; pruning the events table by time deleted it in the
// statement that wrote it, and watchers got EventsLost instead.
func TestWatchExpiredInQuietTable(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, _ := openTest(t, nil)
	s := st.Driver().(*store)
	ch, err := st.Locks().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l := st.Locks()
	c, _, err := l.Acquire(ctx, "k", "carol", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	expectLock(t, ch, driver.LockAcquired, "k", "carol", c.Token)

	// carol's process died two minutes ago: her holding expired then,
	// and nothing has happened since.
	expired := time.Now().Add(-2 * time.Minute).UnixMilli()
	if _, err := s.db.ExecContext(ctx, `UPDATE go_goscope_locks SET acquired_at = ?, expires_at = ?, updated_at = ? WHERE key = ?`,
		expired-time.Minute.Milliseconds(), expired, expired, s.lockPfx+"k"); err != nil {
		t.Fatal(err)
	}
	d, ok, err := l.Acquire(ctx, "k", "dave", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	ev := expectLock(t, ch, driver.LockExpired, "k", "carol", c.Token)
	if ev.At.UnixMilli() != expired {
		t.Fatalf("expired event at %v, holding expired at %v", ev.At, msTime(expired))
	}
	expectLock(t, ch, driver.LockAcquired, "k", "dave", d.Token)
}

// TestWatchGapInsideBatch: events missing between two events that the
// watcher reads in one batch are reported where they were lost:
// EventsLost between the two.
func TestWatchGapInsideBatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, _ := openTest(t, nil)
	ch, err := st.Locks().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	db := st.Driver().(*store).db
	// One transaction: the watcher sees its events together, in one read.
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	ins := `INSERT INTO go_goscope_events (kind, namespace, key, owner, token, at) VALUES ('acquired', '', 'lock:k', ?, ?, ?)`
	now := time.Now().UnixMilli()
	if _, err := tx.Exec(ins, "before", 1, now); err != nil {
		t.Fatal(err)
	}
	res, err := tx.Exec(ins, "pruned", 2, now)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := res.LastInsertId()
	if _, err := tx.Exec(`DELETE FROM go_goscope_events WHERE id = ?`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ins, "after", 3, now); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	expectLock(t, ch, driver.LockAcquired, "k", "before", 1)
	if ev := nextLock(t, ch); ev.Kind != driver.EventsLost {
		t.Fatalf("event after a missing id: %+v, want EventsLost", ev)
	}
	expectLock(t, ch, driver.LockAcquired, "k", "after", 3)
}

// TestDeliverRunsSplitsAtGaps: a batch is delivered in runs of
// consecutive ids, with EventsLost before every run that follows missing
// ids, and only there.
func TestDeliverRunsSplitsAtGaps(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, _ := openTest(t, nil)
	s := st.Driver().(*store)
	// A hub of the store whose watcher loop does not read the database:
	// it hands over its Run, and the test delivers batches itself.
	runs := make(chan *eventhub.Run, 1)
	h := &hub{s: s}
	h.Hub = eventhub.New(func(context.Context) (func(context.Context, *eventhub.Run), error) {
		return func(ctx context.Context, run *eventhub.Run) { runs <- run; <-ctx.Done() }, nil
	}, errClosed)
	defer h.Close()
	hch, err := h.WatchLocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	run := <-runs
	ev := func(id int64) event {
		return event{id: id, kind: "acquired", key: s.lockPfx + "k", at: 1, token: sql.NullInt64{Int64: id, Valid: true}}
	}
	// After id 10: 11 12 | 14 | 17 18.
	if !h.deliverRuns(run, []event{ev(11), ev(12), ev(14), ev(17), ev(18)}, 10) {
		t.Fatal("deliverRuns refused the current run")
	}
	var got []int64 // tokens, 0 for EventsLost
	for len(got) < 7 {
		e := nextLock(t, hch)
		got = append(got, e.Token)
	}
	want := []int64{11, 12, 0, 14, 0, 17, 18}
	if !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v (0: EventsLost)", got, want)
	}
	// A gap before the first event: the marker comes first.
	if !h.deliverRuns(run, []event{ev(20)}, 18) {
		t.Fatal("deliverRuns refused the current run")
	}
	if e := nextLock(t, hch); e.Kind != driver.EventsLost {
		t.Fatalf("first event after a gap: %+v, want EventsLost", e)
	}
	if e := nextLock(t, hch); e.Token != 20 {
		t.Fatalf("event %+v, want token 20", e)
	}
}

// TestEventsPruned: the events table keeps the eventWindow newest events,
// whatever their time, with or without a watcher.
func TestEventsPruned(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	db := st.Driver().(*store).db
	count := func() (n, minID, maxID int64) {
		t.Helper()
		if err := db.QueryRow(`SELECT count(*), COALESCE(min(id), 0), COALESCE(max(id), 0) FROM go_goscope_events`).Scan(&n, &minID, &maxID); err != nil {
			t.Fatal(err)
		}
		return n, minID, maxID
	}
	// Events about long-past times are kept in a quiet table (watched:
	// events are written only then).
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	if _, err := st.Driver().(*store).WatchLocks(wctx); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour).UnixMilli()
	for i := 0; i < 20; i++ {
		if _, err := db.Exec(`INSERT INTO go_goscope_events (kind, namespace, key, at) VALUES ('expired', '', 'lock:old', ?)`, old); err != nil {
			t.Fatal(err)
		}
	}
	rec, _, err := st.Locks().Acquire(ctx, "k", "o", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Locks().Release(ctx, "k", "o", rec.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Purge(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := count(); n != 22 {
		t.Fatalf("%d events in a quiet table, want all 22", n)
	}
	// Past the window, the oldest go first, and only they.
	fill := `WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < ?)
		INSERT INTO go_goscope_events (kind, namespace, key, at) SELECT 'acquired', '', 'lock:fill', ? FROM c`
	if _, err := db.Exec(fill, eventWindow, time.Now().UnixMilli()); err != nil {
		t.Fatal(err)
	}
	n, minID, maxID := count()
	if n != eventWindow || maxID-minID+1 != eventWindow {
		t.Fatalf("%d events, ids %d..%d; want the %d newest", n, minID, maxID, eventWindow)
	}
}

// TestEventsPruneUpgraded: a database whose prune trigger is the earlier,
// time-based one gets the id-based one when opened, once; Purge then
// trims the table to the window, newest kept.
func TestEventsPruneUpgraded(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, nil)
	db := st.Driver().(*store).db
	oldTrigger := `CREATE TRIGGER "go_goscope_events_warden_prune" AFTER INSERT ON "go_goscope_events"
BEGIN
	DELETE FROM "go_goscope_events" WHERE id IN (
		SELECT id FROM (SELECT id, at FROM "go_goscope_events" ORDER BY id LIMIT 8) WHERE at < NEW.at - 60000);
END`
	if _, err := db.Exec(`DROP TRIGGER "go_goscope_events_warden_prune"`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(oldTrigger); err != nil {
		t.Fatal(err)
	}
	fill := `WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < ?)
		INSERT INTO go_goscope_events (kind, namespace, key, at) SELECT 'acquired', '', 'lock:fill', ? FROM c`
	if _, err := db.Exec(fill, eventWindow+50, time.Now().UnixMilli()); err != nil {
		t.Fatal(err)
	}
	st.Close()

	st2 := openAt(t, path, nil)
	s2 := st2.Driver().(*store)
	var def string
	if err := s2.db.QueryRow(`SELECT sql FROM sqlite_master WHERE name = 'go_goscope_events_warden_prune'`).Scan(&def); err != nil {
		t.Fatal(err)
	}
	if sameSQL(def, oldTrigger) || !strings.Contains(def, "NEW.id -") {
		t.Fatalf("prune trigger not replaced: %s", def)
	}
	if ok, _, err := s2.schemaCurrent(ctx); err != nil || !ok {
		t.Fatalf("schema current after the upgrade: %v, %v; want true (no migration at every open)", ok, err)
	}
	var maxID int64
	s2.db.QueryRow(`SELECT max(id) FROM go_goscope_events`).Scan(&maxID)
	if _, err := st2.Purge(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	var n, minID int64
	s2.db.QueryRow(`SELECT count(*), min(id) FROM go_goscope_events`).Scan(&n, &minID)
	if n != eventWindow || minID != maxID-eventWindow+1 {
		t.Fatalf("after Purge: %d events from id %d; want the %d newest (up to id %d)", n, minID, eventWindow, maxID)
	}
}
