package lock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/testkit"
)

// lossyAcquires is a store whose lock stream replaces every Acquired event
// by EventsLost, as a receiver that fell behind would see it.
type lossyAcquires struct{ driver.Store }

func (s lossyAcquires) WatchLocks(ctx context.Context) (<-chan driver.LockEvent, error) {
	src, err := s.Store.(driver.LockNotifier).WatchLocks(ctx)
	if err != nil {
		return nil, err
	}
	out := make(chan driver.LockEvent)
	go func() { // ends when src does, with ctx
		defer close(out)
		for ev := range src {
			if ev.Kind == driver.LockAcquired {
				ev = driver.LockEvent{Kind: driver.EventsLost, At: ev.At}
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// TestWatchTracksAfterEventsLost: a holding whose Acquired event was lost is
// found by the listing Watch makes after the EventsLost, and its lapse is
// reported.
func TestWatchTracksAfterEventsLost(t *testing.T) {
	db := testkit.DBName(t)
	w := openEnv(t, db, func(d driver.Store) driver.Store { return lossyAcquires{d} }).locker(t, &Options{PollInterval: 10 * time.Millisecond})
	a := openEnv(t, db, nil).locker(t, &Options{TTL: 100 * time.Millisecond, DisableAutoRefresh: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := w.Watch(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	s, err := a.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, ch); ev.Kind != EventsLost {
		t.Fatalf("first event %+v, want EventsLost", ev)
	}
	if ev := expectEvent(t, ch, Expired, "job", a.Owner()); ev.Token != s.Token() {
		t.Fatalf("expired %+v, want token %d", ev, s.Token())
	}
}

// listHangs is a lock driver whose List does not answer while hang is
// set: it blocks until its ctx ends (a store that stopped answering).
type listHangs struct {
	driver.Locks
	hang      atomic.Bool
	deadlines chan time.Time // of the hung listings' contexts; zero: none
}

func (h *listHangs) List(ctx context.Context, p driver.Pattern) ([]driver.LockRecord, error) {
	if !h.hang.Load() {
		return h.Locks.List(ctx, p)
	}
	dl, _ := ctx.Deadline()
	select {
	case h.deadlines <- dl:
	default:
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

type listHangsStore struct {
	driver.Store
	locks *listHangs
}

func (s listHangsStore) Locks() driver.Locks { return s.locks }

// A polling Watch on a store whose listing hangs reports it, as it
// reports a failing listing: an EventsLost event whose Err matches
// warden.ErrStoreTimeout (not the caller's deadline), once; the events go
// on when the store answers again. Watch gives each listing a bounded
// budget instead of waiting on the watch's own context, which has no
// deadline here: the hung listing's context must have one of its own.
func TestPollWatchReportsHungListing(t *testing.T) {
	db := testkit.DBName(t)
	h := &listHangs{deadlines: make(chan time.Time, 1)}
	w := openEnv(t, db, func(d driver.Store) driver.Store {
		h.Locks = d.Locks()
		return listHangsStore{Store: d, locks: h}
	}).locker(t, &Options{PollInterval: 5 * time.Millisecond})
	holder := openEnv(t, db, nil).locker(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := w.Watch(ctx, "*")
	if err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, events); ev.Kind != EventsLost || !errors.Is(ev.Err, ErrPolled) {
		t.Fatalf("first event %+v, want EventsLost with ErrPolled", ev)
	}
	h.hang.Store(true)
	// The hung listing tells its deadline before it blocks.
	if dl := <-h.deadlines; dl.IsZero() {
		t.Fatal("the hung listing ran without a deadline of its own: it waits on the watch's own context")
	}
	ev, ok := <-events
	if !ok {
		t.Fatal("the watch ended without reporting the hung listing")
	}
	if ev.Kind != EventsLost || !errors.Is(ev.Err, warden.ErrStoreTimeout) || errors.Is(ev.Err, context.DeadlineExceeded) {
		t.Fatalf("while the listing hangs: %+v, want EventsLost with an Err matching warden.ErrStoreTimeout", ev)
	}
	h.hang.Store(false)
	if _, err := holder.Acquire(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	for ev := range events {
		if ev.Kind == EventsLost {
			t.Fatalf("a second EventsLost for one run of failures: %+v", ev)
		}
		if ev.Kind == Acquired && ev.Key == "k" {
			return
		}
	}
	t.Fatal("the watch ended before the acquisition was reported")
}

// Watch's first listing is bounded too: a store that does not answer it
// is an error matching warden.ErrStoreTimeout, not a Watch call that
// waits as long as the caller's context (which has no deadline here: the
// hung listing's context must have one of its own).
func TestPollWatchFirstListingHangs(t *testing.T) {
	h := &listHangs{deadlines: make(chan time.Time, 1)}
	h.hang.Store(true)
	w := openEnv(t, testkit.DBName(t), func(d driver.Store) driver.Store {
		h.Locks = d.Locks()
		return listHangsStore{Store: d, locks: h}
	}).locker(t, &Options{PollInterval: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := w.Watch(ctx, "*")
		done <- err
	}()
	// The hung listing tells its deadline before it blocks.
	if dl := <-h.deadlines; dl.IsZero() {
		t.Fatal("Watch's first listing ran without a deadline of its own: it waits on the caller's context")
	}
	if err := <-done; !errors.Is(err, warden.ErrStoreTimeout) {
		t.Fatalf("Watch on a store whose listing hangs = %v, want an error matching warden.ErrStoreTimeout", err)
	}
}

// refusesWatch is a store with notifications that it cannot deliver now:
// its WatchLocks fails with an error matching errors.ErrUnsupported, as a
// read-only SQLite file the process may not write does.
type refusesWatch struct{ driver.Store }

func (refusesWatch) WatchLocks(context.Context) (<-chan driver.LockEvent, error) {
	return nil, fmt.Errorf("%w: the file cannot be written", errors.ErrUnsupported)
}

// A store whose notifications are unavailable now is polled, as a store
// without notifications, rather than refusing the watch.
func TestWatchPollsWhenNotificationsUnsupported(t *testing.T) {
	db := testkit.DBName(t)
	w := openEnv(t, db, func(d driver.Store) driver.Store { return refusesWatch{d} }).locker(t, &Options{PollInterval: 5 * time.Millisecond})
	holder := openEnv(t, db, nil).locker(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := w.Watch(ctx, "*")
	if err != nil {
		t.Fatalf("Watch: %v, want a polled watch", err)
	}
	if ev := nextEvent(t, events); ev.Kind != EventsLost || !errors.Is(ev.Err, ErrPolled) {
		t.Fatalf("first event %+v, want EventsLost with ErrPolled", ev)
	}
	if _, err := holder.Acquire(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	for ev := range events {
		if ev.Kind == Acquired && ev.Key == "k" {
			return
		}
	}
	t.Fatal("the watch ended before the acquisition was reported")
}

// failsFirstWatch is a store whose first WatchLocks fails, as one whose
// server was briefly unreachable when the subscription started.
type failsFirstWatch struct {
	driver.Store
	failed *atomic.Bool
}

func (s failsFirstWatch) WatchLocks(ctx context.Context) (<-chan driver.LockEvent, error) {
	if s.failed.CompareAndSwap(false, true) {
		return nil, errors.New("connection refused")
	}
	return s.Store.(driver.LockNotifier).WatchLocks(ctx)
}

// TestWaiterAfterFailedSubscription: a waiter whose back-off (an hour)
// counts on the release's notification, and whose subscription failed
// once, still gets the key soon after the release: it subscribes again
// within a second, polling meanwhile. Before, it slept the hour (the
// holder's TTL is an hour too), and the Acquire below ended with its
// context.
func TestWaiterAfterFailedSubscription(t *testing.T) {
	db := testkit.DBName(t)
	holder := openEnv(t, db, nil).locker(t, &Options{TTL: time.Hour})
	var failed atomic.Bool
	we := openEnv(t, db, func(d driver.Store) driver.Store { return failsFirstWatch{d, &failed} })
	waiter := we.locker(t, &Options{RetryMin: time.Hour, RetryMax: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := holder.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lease *Lease
		err   error
	}
	got := make(chan result, 1)
	go func() {
		s, err := waiter.Acquire(ctx, "job")
		got <- result{s, err}
	}()
	// The waiter tried, failed to subscribe, and sleeps.
	testkit.Eventually(t, 5*time.Second, "waiter to sleep after the failed subscription", func() bool {
		waiter.mu.Lock()
		defer waiter.mu.Unlock()
		ks := waiter.keys["job"]
		return failed.Load() && we.ops.Get("lock.acquire") >= 1 && ks != nil && !ks.busy
	})
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("the waiter did not get the released key: %v", r.err)
	}
	if r.lease.Token() <= h.Token() {
		t.Fatalf("token %d not greater than the previous holder's %d", r.lease.Token(), h.Token())
	}
}

// watchFailsThenHangs is a store whose first WatchLocks fails and whose
// later ones block until their context ends, as a server that stops
// answering.
type watchFailsThenHangs struct {
	driver.Store
	calls *atomic.Int64
}

func (s watchFailsThenHangs) WatchLocks(ctx context.Context) (<-chan driver.LockEvent, error) {
	if s.calls.Add(1) == 1 {
		return nil, errors.New("connection refused")
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestWaiterWatchHangs: the store's Watch blocks. A waiting Acquire still
// ends with its own context (the subscription starts in a goroutine of the
// Locker's), and once the key is free the next Acquire of the same Locker
// takes it. Before, the waiter that started the subscription waited in
// Watch, past its context, and the Locker's other waiters of the key
// queued behind it until Close.
func TestWaiterWatchHangs(t *testing.T) {
	db := testkit.DBName(t)
	holder := openEnv(t, db, nil).locker(t, &Options{TTL: time.Hour})
	var calls atomic.Int64
	we := openEnv(t, db, func(d driver.Store) driver.Store { return watchFailsThenHangs{d, &calls} })
	waiter := we.locker(t, &Options{RetryMin: 2 * time.Second, RetryMax: time.Hour})
	h, err := holder.Acquire(context.Background(), "job")
	if err != nil {
		t.Fatal(err)
	}
	acquire := func(d time.Duration) (*Lease, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		got := make(chan struct{})
		var s *Lease
		var err error
		go func() {
			defer close(got)
			s, err = waiter.Acquire(ctx, "job")
		}()
		select {
		case <-got:
			return s, err
		case <-time.After(d + 20*time.Second): // a bound for the failure, not a speed check
			t.Fatalf("Acquire with a context of %v has not returned 20 s after it ended", d)
			return nil, nil
		}
	}
	if _, err := acquire(3 * time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire of a held key: %v, want its context's deadline", err)
	}
	if calls.Load() < 2 {
		t.Fatalf("%d Watch calls: the hanging one was never made", calls.Load())
	}
	if err := h.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	s, err := acquire(10 * time.Second)
	if err != nil {
		t.Fatalf("Acquire of the free key: %v", err)
	}
	if s.Token() <= h.Token() {
		t.Fatalf("token %d not greater than the previous holder's %d", s.Token(), h.Token())
	}
}
