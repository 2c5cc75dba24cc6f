package mongo_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/mongo"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// gapPair opens, in one fresh namespace, a writer store and a watcher
// store that each learn who watches from their own reads of the
// registrations, as stores of two processes do. The writer records the
// lock events it drops (nobody watching, by its last read) with the time
// it began deciding; the watcher writes no events. Both close when the
// test ends (the writer may be closed earlier).
func gapPair(t *testing.T) (writer, watcher *warden.Store, prefix string, drops *dropLog) {
	t.Helper()
	prefix = fmt.Sprintf("gap-%d:", time.Now().UnixNano())
	ow := &mongo.Options{Prefix: prefix}
	mongo.OwnWatchCache(ow)
	writer, err := mongo.New(testDB(t, nil), ow)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { writer.Close() })
	ov := &mongo.Options{Prefix: prefix, DisableEvents: true}
	mongo.OwnWatchCache(ov)
	watcher, err = mongo.New(testDB(t, nil), ov)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { watcher.Close() })
	drops = &dropLog{first: make(chan struct{})}
	mongo.SetDropped(writer, drops.add)
	return writer, watcher, prefix, drops
}

// dropLog is what a writer dropped: when it began deciding each time.
type dropLog struct {
	mu    sync.Mutex
	at    []time.Time
	first chan struct{} // closed at the first drop
}

func (l *dropLog) add(_ string, decided time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.at) == 0 {
		close(l.first)
	}
	l.at = append(l.at, decided)
}

func (l *dropLog) times() []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Time(nil), l.at...)
}

// cycle takes and releases key through st.
func cycle(t *testing.T, st *warden.Store, key string) {
	t.Helper()
	lk := st.Driver().Locks()
	rec, ok, err := lk.Acquire(t.Context(), key, "w", time.Minute)
	if err != nil || !ok {
		t.Errorf("Acquire %q: ok=%v err=%v", key, ok, err)
		return
	}
	if _, err := lk.Release(t.Context(), key, "w", rec.Token); err != nil {
		t.Errorf("Release %q: %v", key, err)
	}
}

// cycling takes and releases key through st over and over until the
// returned stop is called (which waits for the last cycle to end).
func cycling(t *testing.T, st *warden.Store, key string) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			default:
			}
			cycle(t, st, key)
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(quit); <-done }) }
}

// nextLock returns the watch's next event. It sets no time limit of its
// own: an event that never comes fails the test shortly before go test's
// -timeout would.
func nextLock(t *testing.T, ch <-chan driver.LockEvent, what string) driver.LockEvent {
	t.Helper()
	var limit <-chan time.Time
	if d, ok := t.Deadline(); ok {
		limit = time.After(time.Until(d) * 9 / 10)
	}
	select {
	case e, ok := <-ch:
		if !ok {
			t.Fatalf("%s: the watch ended", what)
		}
		return e
	case <-limit:
		t.Fatalf("%s: nothing came before the test's deadline", what)
	}
	return driver.LockEvent{}
}

// checkCovered: every event the writer dropped was decided before the
// watcher received the gap marker at marker (so the state the watcher
// reads after the marker holds the change the event was about).
func checkCovered(t *testing.T, drops []time.Time, marker time.Time) {
	t.Helper()
	for _, d := range drops {
		if !d.Before(marker) {
			t.Errorf("an event was dropped (decided at %s) after the watcher's gap marker (received at %s): the watcher reads the state before that change and is never told of it",
				d.Format("15:04:05.000000"), marker.Format("15:04:05.000000"))
		}
	}
}

// TestWatchGapCoversDroppedEvents: a writer in another process may drop
// events for up to WatchersFresh after a watch registered (its last read
// of the registrations predates it); the watch's subscribers then get an
// EventsLost marker, and no event is dropped after it. The writer's read
// is fresh when the watch registers, and it takes and releases a key
// without pause until events reach the watcher after the marker.
func TestWatchGapCoversDroppedEvents(t *testing.T) {
	writer, watcher, _, drops := gapPair(t)
	// The writer reads who watches (nobody) and drops this cycle's events.
	cycle(t, writer, "warm-up")
	<-drops.first
	registered := make(chan time.Time, 1)
	mongo.SetAfterRegister(watcher, func() { registered <- time.Now() })
	ch, err := watcher.Driver().(driver.LockNotifier).WatchLocks(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	acked := <-registered
	stop := cycling(t, writer, "k")
	defer stop()
	var marker time.Time
	before := 0 // events that reached the watcher before the marker
	for marker.IsZero() {
		if e := nextLock(t, ch, "waiting for the gap marker"); e.Kind == driver.EventsLost {
			marker = time.Now()
		} else {
			before++
		}
	}
	for e := nextLock(t, ch, "waiting for an event after the marker"); e.Key != "k"; {
		e = nextLock(t, ch, "waiting for an event after the marker")
	}
	stop()
	writer.Close() // its writer has decided about every event
	all := drops.times()
	if len(all) < 2 {
		t.Fatalf("the writer dropped %d events: the test did not run into the gap (its read of the registrations was %s old when the watch registered)",
			len(all), acked.Sub(all[0]))
	}
	t.Logf("%d events dropped, the last decided %s after the registration was acknowledged; %d delivered before the marker, which came %s after it",
		len(all), all[len(all)-1].Sub(acked), before, marker.Sub(acked))
	checkCovered(t, all, marker)
	if marker.Sub(acked) < mongo.WatchersFresh {
		t.Errorf("the gap marker came %s after the registration was acknowledged, before a writer's read could have seen it (%s)", marker.Sub(acked), mongo.WatchersFresh)
	}
}

// TestWatchRegistrationLapsed: a watcher whose registration another
// process deleted (as lapsed, on its clock) writes it again at its next
// renewal and tells its subscribers events may have been lost; every
// event dropped meanwhile was decided before that marker.
func TestWatchRegistrationLapsed(t *testing.T) {
	writer, watcher, prefix, drops := gapPair(t)
	ch, err := watcher.Driver().(driver.LockNotifier).WatchLocks(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// The registration's own gap marker first.
	for nextLock(t, ch, "waiting for the registration's marker").Kind != driver.EventsLost {
	}
	regs := testDB(t, nil).Collection(mongo.DefaultEventsCollection + "_watchers")
	res, err := regs.DeleteMany(t.Context(), bson.D{{Key: "ns", Value: prefix}})
	if err != nil || res.DeletedCount != 1 {
		t.Fatalf("deleting the watcher's registration: %v deleted, err %v", res.DeletedCount, err)
	}
	mongo.ExpireWatchCache(writer)
	cycle(t, writer, "meanwhile")
	<-drops.first
	mongo.RenewNow(watcher)
	stop := cycling(t, writer, "k")
	defer stop()
	var marker time.Time
	for marker.IsZero() {
		if e := nextLock(t, ch, "waiting for the lapse's marker"); e.Kind == driver.EventsLost {
			marker = time.Now()
		}
	}
	for e := nextLock(t, ch, "waiting for an event after the marker"); e.Key != "k"; {
		e = nextLock(t, ch, "waiting for an event after the marker")
	}
	stop()
	writer.Close()
	all := drops.times()
	t.Logf("%d events dropped while the registration was gone", len(all))
	checkCovered(t, all, marker)
	n, err := regs.CountDocuments(context.Background(), bson.D{{Key: "ns", Value: prefix}})
	if err != nil || n != 1 {
		t.Errorf("registrations after the renewal: %d (err %v), want 1", n, err)
	}
}

// TestWatchEndsRegistration: the registration lives while the watch does
// and is deleted when it ends; the writers then stop writing events.
func TestWatchEndsRegistration(t *testing.T) {
	writer, watcher, prefix, drops := gapPair(t)
	regs := testDB(t, nil).Collection(mongo.DefaultEventsCollection + "_watchers")
	count := func() int64 {
		t.Helper()
		n, err := regs.CountDocuments(context.Background(), bson.D{{Key: "ns", Value: prefix}})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	ctx, cancel := context.WithCancel(t.Context())
	ch, err := watcher.Driver().(driver.LockNotifier).WatchLocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cch, err := watcher.Driver().(driver.CircuitNotifier).WatchCircuits(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 2 {
		t.Fatalf("%d registrations while locks and circuits are watched, want 2", n)
	}
	cycle(t, writer, "k") // the writer's first read sees the watcher
	for e := nextLock(t, ch, "waiting for the event"); e.Key != "k"; {
		e = nextLock(t, ch, "waiting for the event")
	}
	if got := drops.times(); len(got) != 0 {
		t.Errorf("%d lock events dropped while watched", len(got))
	}
	cancel()
	for range ch {
	}
	watcher.Close() // waits for the watcher's goroutines, which delete the registrations
	for range cch {
	}
	if n := count(); n != 0 {
		t.Errorf("%d registrations left after the watches ended and the store closed", n)
	}
	mongo.ExpireWatchCache(writer)
	cycle(t, writer, "after")
	<-drops.first
}
