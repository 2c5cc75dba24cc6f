package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/deadline"
	"github.com/warden-go/warden/internal/testkit"
)

// The deadline rule (docs/design.md): a lease is proven held until the
// local send time of its last successful acquire or refresh, plus TTL,
// minus a margin of at least MinClockSkew; its context is done at that
// instant, before anything else happens, and no lease is handed out past
// it. These tests check it exactly, through the public API, on the memory
// store (with its millisecond clock) wrapped to add latency.

// timedLocks records when each acquire and refresh was sent and can hold
// their answers back (the write applies, the answer is late), or make the
// store's reported expiries lag (a store clock behind ours).
type timedLocks struct {
	driver.Locks
	acquireDelay atomic.Int64 // ns an acquire's answer is held back
	lateAcquires atomic.Int64 // how many acquires are answered late (then on time)
	refreshDelay atomic.Int64 // ns a refresh's answer is held back
	lag          atomic.Int64 // ns subtracted from the expiries of records of other holders
	acquires     atomic.Int64

	mu   sync.Mutex
	sent map[string]time.Time // key+token → send time of the last successful acquire or refresh
}

func (f *timedLocks) note(key string, rec driver.LockRecord, sent time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sent == nil {
		f.sent = map[string]time.Time{}
	}
	f.sent[fmt.Sprint(key, "/", rec.Token)] = sent
}

// lastSent is the send time of the last successful acquire or refresh of
// a lease.
func (f *timedLocks) lastSent(s *Lease) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sent[fmt.Sprint(s.Key(), "/", s.Token())]
}

func (f *timedLocks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	f.acquires.Add(1)
	sent := time.Now()
	rec, ok, err := f.Locks.Acquire(ctx, key, owner, ttl)
	if err == nil && ok {
		f.note(key, rec, sent)
		if f.lateAcquires.Add(-1) >= 0 {
			time.Sleep(time.Duration(f.acquireDelay.Load()))
		}
	}
	if err == nil && !ok {
		rec.ExpiresAt = rec.ExpiresAt.Add(-time.Duration(f.lag.Load()))
	}
	return rec, ok, err
}

func (f *timedLocks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	sent := time.Now()
	rec, ok, err := f.Locks.Refresh(ctx, key, owner, token, ttl)
	if err == nil && ok {
		f.note(key, rec, sent)
	}
	if d := time.Duration(f.refreshDelay.Load()); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return driver.LockRecord{}, false, ctx.Err()
		}
	}
	return rec, ok, err
}

type timedStore struct {
	driver.Store
	locks *timedLocks
}

func (s *timedStore) Locks() driver.Locks { return s.locks }

func wrapTimed(f *timedLocks) func(driver.Store) driver.Store {
	return func(d driver.Store) driver.Store {
		f.Locks = d.Locks()
		return &timedStore{Store: d, locks: f}
	}
}

// checkDeadline asserts the deadline rule's bound on a held lease:
// Deadline() ≤ last send + TTL − MinClockSkew, computed, not timed.
func checkDeadline(t *testing.T, f *timedLocks, s *Lease, ttl time.Duration) {
	t.Helper()
	sent := f.lastSent(s)
	if sent.IsZero() {
		t.Fatalf("lease %s/%d: no send time recorded", s.Key(), s.Token())
	}
	if bound := sent.Add(ttl - MinClockSkew); s.Deadline().After(bound) {
		t.Fatalf("lease %s/%d: deadline %v is after last send + TTL − MinClockSkew = %v",
			s.Key(), s.Token(), s.Deadline().Format(time.RFC3339Nano), bound.Format(time.RFC3339Nano))
	}
}

// blockingHandler is a slog handler whose Handle blocks until release is
// closed: the slowest log handler there is.
type blockingHandler struct {
	release chan struct{}
	entered chan struct{} // closed at the first Handle
	once    sync.Once
}

func newBlockingHandler() *blockingHandler {
	return &blockingHandler{release: make(chan struct{}), entered: make(chan struct{})}
}

func (h *blockingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *blockingHandler) Handle(context.Context, slog.Record) error {
	h.once.Do(func() { close(h.entered) })
	<-h.release
	return nil
}
func (h *blockingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *blockingHandler) WithGroup(string) slog.Handler      { return h }

func TestNewRefusesUnsafeOptions(t *testing.T) {
	st := openEnv(t, testkit.DBName(t), nil).st
	for _, o := range []*Options{
		{TTL: MinTTL - time.Millisecond},
		{TTL: time.Millisecond},
		{TTL: -time.Second},
		{ClockSkew: -time.Millisecond},
		{RefreshInterval: -time.Millisecond},
		{RetryMin: -time.Millisecond},
		{RetryMax: -time.Millisecond},
		{PollInterval: -time.Millisecond},
	} {
		if _, err := New(st, o); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("New(%+v) = %v, want ErrInvalidArgument", *o, err)
		}
	}
	if _, err := New(nil, nil); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("New(nil store) = %v, want ErrInvalidArgument", err)
	}
	if _, err := New(st, &Options{Owner: string(make([]byte, 600))}); !errors.Is(err, warden.ErrInvalidKey) {
		t.Errorf("New with a 600-byte owner = %v, want ErrInvalidKey", err)
	}
	// The margin is floored whatever is asked, and at most half the TTL.
	for _, o := range []Options{{TTL: MinTTL}, {TTL: MinTTL, ClockSkew: time.Millisecond}, {TTL: time.Second, ClockSkew: time.Hour}} {
		l, err := New(st, &o)
		if err != nil {
			t.Fatalf("New(%+v): %v", o, err)
		}
		if l.skew < MinClockSkew || l.skew > l.ttl/2 {
			t.Errorf("New(%+v): margin %v, want in [%v, %v]", o, l.skew, MinClockSkew, l.ttl/2)
		}
		_ = l.Close()
	}
}

// Item 2: with the shortest TTL, another Locker never takes the key while
// the first lease still reports itself held — the margin covers the
// store clock's millisecond granularity.
func TestShortTTLNeverOverlaps(t *testing.T) {
	db := testkit.DBName(t)
	f := &timedLocks{}
	a := openEnv(t, db, wrapTimed(f)).shortLocker(t, &Options{TTL: deadline.MinTTL, DisableAutoRefresh: true})
	b := openEnv(t, db, nil).shortLocker(t, &Options{TTL: deadline.MinTTL, DisableAutoRefresh: true})
	ctx := context.Background()
	for i := range 200 {
		key := fmt.Sprint("k", i)
		s, err := a.TryAcquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		checkDeadline(t, f, s, deadline.MinTTL)
		for {
			s2, err := b.TryAcquire(ctx, key)
			if errors.Is(err, ErrLocked) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			// b holds the key now: a must know it has lost it.
			if s.Err() == nil {
				t.Fatalf("round %d: another Locker took %q while the first lease (deadline %v) reported itself held",
					i, key, s.Deadline().Format(time.RFC3339Nano))
			}
			_ = s2.Release(ctx)
			break
		}
	}
}

// Item 14: Err and Context().Err() consult the clock: from the deadline
// on they report the loss, whether or not a timer has fired.
func TestErrConsultsTheClock(t *testing.T) {
	l := openEnv(t, testkit.DBName(t), nil).shortLocker(t, &Options{TTL: 50 * time.Millisecond, DisableAutoRefresh: true})
	ctx := context.Background()
	for i := range 20 {
		s, err := l.TryAcquire(ctx, fmt.Sprint("k", i))
		if err != nil {
			t.Fatal(err)
		}
		ctx := s.Context()
		for {
			before := s.Err() // asked at or before now
			now := time.Now()
			lerr, cerr := s.Err(), ctx.Err() // asked at or after now
			if now.Before(s.Deadline()) {
				if before != nil {
					t.Fatalf("lease ended (%v) before its deadline", before)
				}
				continue
			}
			if lerr != ErrLeaseLost || cerr == nil || context.Cause(ctx) != ErrLeaseLost {
				t.Fatalf("at %v, past the deadline %v: Err %v, Context().Err %v",
					now.Format(time.RFC3339Nano), s.Deadline().Format(time.RFC3339Nano), lerr, cerr)
			}
			break
		}
	}
}

// Item 14: an acquire answered after the lease's deadline is not handed
// out; Acquire asks again and returns a lease that is live, with the same
// holding (its token) when the store still had it.
func TestAcquireNeverReturnsAnExpiredLease(t *testing.T) {
	const ttl = 100 * time.Millisecond
	f := &timedLocks{}
	l := openEnv(t, testkit.DBName(t), wrapTimed(f)).locker(t, &Options{TTL: ttl, DisableAutoRefresh: true})
	ctx := context.Background()
	f.acquireDelay.Store(int64(ttl))
	for _, try := range []bool{false, true} {
		f.lateAcquires.Store(1)
		var (
			s   *Lease
			err error
		)
		if try {
			s, err = l.TryAcquire(ctx, fmt.Sprint("k", try))
		} else {
			s, err = l.Acquire(ctx, fmt.Sprint("k", try))
		}
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		if !now.Before(s.Deadline()) || s.Err() != nil {
			t.Fatalf("TryAcquire=%v returned a lease past its deadline %v at %v (Err %v)", try, s.Deadline(), now, s.Err())
		}
		checkDeadline(t, f, s, ttl)
		if err := s.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// A store whose answers always come too late: TryAcquire gives up
	// with an error that says so and gives the holding back.
	f.lateAcquires.Store(1 << 30)
	_, err := l.TryAcquire(ctx, "slow")
	if !errors.Is(err, ErrStoreTooSlow) {
		t.Fatalf("TryAcquire on a too-slow store = %v, want ErrStoreTooSlow", err)
	}
	rec, found, err := f.Locks.Get(ctx, "slow")
	if err != nil {
		t.Fatal(err)
	}
	if found && rec.Owner != "" {
		t.Fatalf("the holding was not given back: %+v", rec)
	}
}

// Item 1: the holder is told first. A lease reaching its deadline is
// cancelled before the next waiter of the same Locker is let in and
// before the loss is logged, however slow the log handler.
func TestLossCancelsBeforeWakingOrLogging(t *testing.T) {
	h := newBlockingHandler()
	st := testkit.Open(t, testkit.MemoryDriver(testkit.DBName(t)), &warden.Options{Logger: slog.New(h)})
	l, err := newLocker(st, &Options{TTL: 50 * time.Millisecond, DisableAutoRefresh: true}, deadline.MinTTL)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	first, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		s, err := l.Acquire(ctx, "k")
		if err == nil {
			_ = s.Release(ctx)
		}
		got <- err
	}()
	defer func() {
		close(h.release)
		if err := <-got; err != nil {
			t.Error(err)
		}
	}()
	select {
	case err := <-got:
		got <- err
		// The waiter was let in: the first lease must be done already.
		select {
		case <-first.Done():
		default:
			t.Fatal("a waiter of the same Locker got the key while the first lease's context was live")
		}
	case <-h.entered:
		// The loss is being logged (the handler blocks): the context
		// must have been cancelled before.
		select {
		case <-first.Done():
		default:
			t.Fatal("the loss was logged before the lease's context was cancelled")
		}
	}
}

// Item 1: many leases ending together are all cancelled — even while the
// log handler of the first loss blocks — and each exactly by its
// deadline, by the clock.
func TestManyLeasesEndTogether(t *testing.T) {
	const n = 1000
	h := newBlockingHandler()
	db := testkit.DBName(t)
	st := testkit.Open(t, testkit.MemoryDriver(db), &warden.Options{Logger: slog.New(h)})
	l, err := New(st, &Options{TTL: 200 * time.Millisecond, DisableAutoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	defer close(h.release) // before Close, which logs the losses not logged yet
	other := openEnv(t, db, nil).locker(t, &Options{TTL: time.Minute})
	ctx := context.Background()
	leases := make([]*Lease, n)
	for i := range leases {
		if leases[i], err = l.TryAcquire(ctx, fmt.Sprint("k", i)); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range leases {
		<-s.Done() // never, if the blocked log handler held the others up
		if s.Err() != ErrLeaseLost {
			t.Fatalf("lease %d: Err %v", i, s.Err())
		}
	}
	// Another Locker can take every key only after its lease is done.
	for i, s := range leases {
		s2, err := other.Acquire(ctx, s.Key())
		if err != nil {
			t.Fatal(err)
		}
		if s.Err() == nil {
			t.Fatalf("key %d taken over while its lease was live", i)
		}
		_ = s2.Release(ctx)
	}
}

// Item 4: Owner is a label; two Lockers given the same one still exclude
// each other and get tokens of their own.
func TestSameOwnerLabelStillExcludes(t *testing.T) {
	db := testkit.DBName(t)
	a := openEnv(t, db, nil).locker(t, &Options{Owner: "billing-cron"})
	b := openEnv(t, db, nil).locker(t, &Options{Owner: "billing-cron"})
	if a.Owner() == b.Owner() {
		t.Fatalf("two Lockers share the identity %q", a.Owner())
	}
	ctx := context.Background()
	s, err := a.TryAcquire(ctx, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.TryAcquire(ctx, "nightly")
	var held *HeldError
	if !errors.As(err, &held) || held.Owner != a.Owner() || held.Token != s.Token() {
		t.Fatalf("second Locker with the same Owner label: %v, want ErrLocked held by %q", err, a.Owner())
	}
	if got := held.Owner[:len("billing-cron#")]; got != "billing-cron#" {
		t.Fatalf("owner %q does not start with its label", held.Owner)
	}
}

// Item 5: Do's fn context is derived from the lease's: when a refresh
// finds the lock lost, fn's context is done before Refresh returns.
func TestDoContextEndsWithTheLease(t *testing.T) {
	e := openEnv(t, testkit.DBName(t), nil)
	l := e.locker(t, &Options{DisableAutoRefresh: true})
	ctx := context.Background()
	for i := range 50 {
		err := Do(ctx, l, fmt.Sprint("k", i), func(ctx context.Context) error {
			s := LeaseFromContext(ctx)
			if _, err := e.st.Locks().ForceRelease(ctx, s.Key()); err != nil {
				return err
			}
			if err := s.Refresh(context.Background()); !errors.Is(err, ErrLeaseLost) {
				return fmt.Errorf("Refresh after a force-release = %v", err)
			}
			if ctx.Err() == nil {
				return errors.New("fn's context is still live after the lease was lost")
			}
			if context.Cause(ctx) != ErrLeaseLost {
				return fmt.Errorf("fn's context cause %v", context.Cause(ctx))
			}
			return nil
		})
		if err != ErrLeaseLost { // fn's own errors would be joined to it
			t.Fatal(err)
		}
	}
	// And by the clock: fn's context reports the loss at the deadline.
	l2 := e.shortLocker(t, &Options{TTL: 30 * time.Millisecond, DisableAutoRefresh: true})
	err := Do(ctx, l2, "clock", func(ctx context.Context) error {
		s := LeaseFromContext(ctx)
		for time.Now().Before(s.Deadline()) {
		}
		if ctx.Err() == nil {
			return errors.New("fn's context is live past the lease's deadline")
		}
		return nil
	})
	if err != ErrLeaseLost {
		t.Fatal(err)
	}
}

// Item 6: refreshes keep up with slow round trips: no lease is lost
// while every one of them is refreshed (its deadline moves) with a slow
// round trip.
func TestManyLeasesSlowRefresh(t *testing.T) {
	for _, tc := range []struct {
		n        int
		ttl, rtt time.Duration
	}{
		{2000, 3 * time.Second, 25 * time.Millisecond},   // 16 FIFO workers lost 796 of them
		{10000, 10 * time.Second, 50 * time.Millisecond}, // 3 000 refreshes a second
	} {
		t.Run(fmt.Sprint(tc.n), func(t *testing.T) {
			if testing.Short() && tc.n > 2000 {
				t.Skip("10 000 leases")
			}
			f := &timedLocks{}
			e := openEnv(t, testkit.DBName(t), wrapTimed(f))
			l := e.locker(t, &Options{TTL: tc.ttl})
			ctx := context.Background()
			f.refreshDelay.Store(int64(tc.rtt))
			leases := make([]*Lease, tc.n)
			first := make([]time.Time, tc.n)
			for i := range leases {
				s, err := l.TryAcquire(ctx, fmt.Sprintf("k%05d", i))
				if err != nil {
					t.Fatal(err)
				}
				leases[i], first[i] = s, s.Deadline()
			}
			// Twice: every lease refreshed once, then once more.
			for round := range 2 {
				for i, s := range leases {
					for !s.Deadline().After(first[i]) {
						if s.Err() != nil {
							t.Fatalf("round %d: lease %d of %d lost with a %v refresh round trip; log: %.400s",
								round, i, tc.n, tc.rtt, e.logs.String())
						}
						time.Sleep(5 * time.Millisecond)
					}
					first[i] = s.Deadline()
				}
			}
		})
	}
}

// Item 7: a holder expiry already in the waiter's past (the store's clock
// lags) does not make the waiter spin: between two store calls it sleeps
// at least half of RetryMin (the back-off's jitter floor).
func TestWaiterDoesNotSpinOnAPastExpiry(t *testing.T) {
	db := testkit.DBName(t)
	const retryMin = 5 * time.Millisecond
	f := &timedLocks{}
	f.lag.Store(int64(time.Hour))
	holder := openEnv(t, db, nil).locker(t, nil)
	waiter := openEnv(t, db, func(d driver.Store) driver.Store { return hideNotify(wrapTimed(f)(d)) }).
		locker(t, &Options{RetryMin: retryMin, RetryMax: retryMin})
	ctx := context.Background()
	if _, err := holder.Acquire(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := waiter.Acquire(wctx, "k")
	elapsed := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire = %v", err)
	}
	calls := f.acquires.Load()
	if limit := int64(elapsed/(retryMin/2)) + 1; calls > limit {
		t.Fatalf("%d store calls in %v: more than one per RetryMin/2 (%d)", calls, elapsed, limit)
	}
}

// listFails makes the lock driver's List fail while fail is set.
type listFails struct {
	driver.Locks
	fail atomic.Bool
}

var errListDown = errors.New("connection refused (test outage)")

func (f *listFails) List(ctx context.Context, p driver.Pattern) ([]driver.LockRecord, error) {
	if f.fail.Load() {
		return nil, errListDown
	}
	return f.Locks.List(ctx, p)
}

// Issue 13: a polling Watch tells "no events" from "store unreachable":
// a failing listing is reported once, as EventsLost with the error, and
// the events go on when the store is back.
func TestPollWatchReportsStoreErrors(t *testing.T) {
	db := testkit.DBName(t)
	f := &listFails{}
	w := openEnv(t, db, func(d driver.Store) driver.Store {
		f.Locks = d.Locks()
		return hideNotify(&timedStore{Store: d, locks: &timedLocks{Locks: f}})
	}).locker(t, &Options{PollInterval: 5 * time.Millisecond})
	holder := openEnv(t, db, nil).locker(t, nil)
	ctx := context.Background()
	events, err := w.Watch(ctx, "*")
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-events; ev.Kind != EventsLost || !errors.Is(ev.Err, ErrPolled) {
		t.Fatalf("first event %+v, want EventsLost with ErrPolled", ev)
	}
	f.fail.Store(true)
	ev := <-events
	if ev.Kind != EventsLost || !errors.Is(ev.Err, errListDown) {
		t.Fatalf("while the store fails: %+v, want EventsLost with the store's error", ev)
	}
	f.fail.Store(false)
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
