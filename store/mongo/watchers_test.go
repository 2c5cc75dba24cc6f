package mongo_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/faultproxy"
	"github.com/warden-go/warden/store/mongo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
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

// TestWatchGapMarkerSurvivesStaleKeeper: the keeper of an event watcher
// that has been replaced (its watch ended and a new one started) may find
// the gap marker due; the hub refuses its delivery, and the marker stays
// due for the current watcher, which sends it.
func TestWatchGapMarkerSurvivesStaleKeeper(t *testing.T) {
	_, watcher, _, _ := gapPair(t)
	ch, err := watcher.Driver().(driver.LockNotifier).WatchLocks(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	mongo.StaleKeeperSync(watcher)
	if e := nextLock(t, ch, "waiting for the gap marker after a stale keeper found it due"); e.Kind != driver.EventsLost {
		t.Fatalf("event %+v, want the gap marker", e)
	}
}

// TestWatchServerGone: with the server unreachable (its connections
// blackholed, and a server selection that would wait an hour), a Watch of
// a kind already registered returns at once although the keeper's renewal
// hangs, a Watch whose ctx ends gives up with it, and Close returns after
// its bounded attempt to delete the registrations (which then lapse).
// Without those bounds each of them waits for the hour.
func TestWatchServerGone(t *testing.T) {
	u, err := url.Parse(serverURL(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	co := options.Client().SetHosts([]string{p.Addr()}).SetDirect(true).SetServerSelectionTimeout(time.Hour)
	db := testDB(t, co)
	// Cleanups run last first: the proxy closes before the client
	// disconnects, which otherwise waits for a connection the blackhole
	// holds open (the client's handshake has no deadline of its own).
	t.Cleanup(func() { p.Close() })
	st, err := mongo.New(db, &mongo.Options{Prefix: fmt.Sprintf("gone-%d:", time.Now().UnixNano())})
	if err != nil {
		t.Fatal(err)
	}
	d := st.Driver()
	if _, err := d.(driver.LockNotifier).WatchLocks(t.Context()); err != nil {
		t.Fatal(err)
	}
	cctx, cancelCircuits := context.WithCancel(t.Context())
	if _, err := d.(driver.CircuitNotifier).WatchCircuits(cctx); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	cancelCircuits()   // the keeper's deletion of the circuit registration hangs
	mongo.RenewNow(st) // and so does its renewal of the lock registration
	within(t, "a second WatchLocks", func() {
		if _, err := d.(driver.LockNotifier).WatchLocks(t.Context()); err != nil {
			t.Errorf("WatchLocks of a kind registered, with the server gone: %v", err)
		}
	})
	within(t, "a WatchCircuits whose ctx ends", func() {
		ctx, cancel := context.WithCancel(t.Context())
		go cancel()
		_, err := d.(driver.CircuitNotifier).WatchCircuits(ctx)
		t.Logf("WatchCircuits: %v", err) // nil if it joined the running watcher before its ctx ended
	})
	within(t, "Close", func() { st.Close() })
}

// within runs f, failing the test if it has not returned shortly before
// the test's deadline (f is then left running).
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	var limit <-chan time.Time
	if d, ok := t.Deadline(); ok {
		limit = time.After(time.Until(d) * 9 / 10)
	}
	select {
	case <-done:
	case <-limit:
		t.Fatalf("%s has not returned", what)
	}
}

// TestWatchCancelledLeavesNoRegistration: a Watch whose ctx ends while
// its registration is on the wire (it may have been written) leaves
// nothing behind once the store closes.
func TestWatchCancelledLeavesNoRegistration(t *testing.T) {
	prefix := fmt.Sprintf("cancelled-%d:", time.Now().UnixNano())
	st, err := mongo.New(testDB(t, nil), &mongo.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	regs := testDB(t, nil).Collection(mongo.DefaultEventsCollection + "_watchers")
	failed := 0
	for i := range 100 {
		ctx, cancel := context.WithTimeout(t.Context(), time.Duration(200+i*60)*time.Microsecond)
		ch, err := st.Driver().(driver.LockNotifier).WatchLocks(ctx)
		if err != nil {
			failed++
		}
		cancel()
		if ch != nil {
			for range ch {
			}
		}
	}
	st.Close()
	n, err := regs.CountDocuments(context.Background(), bson.D{{Key: "ns", Value: prefix}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d of 100 watches gave up with their ctx", failed)
	if n != 0 {
		t.Errorf("%d registrations left after the store closed", n)
	}
}
