package lock

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/testkit"
)

func TestMutualExclusionAcrossLockers(t *testing.T) {
	db := testkit.DBName(t)
	const lockers, perLocker, cycles = 3, 4, 15
	var (
		inside   atomic.Int32
		mu       sync.Mutex
		tokens   []int64
		owners   = map[string]bool{}
		wg       sync.WaitGroup
		failures atomic.Int32
	)
	ctx := context.Background()
	for i := 0; i < lockers; i++ {
		l := openEnv(t, db, nil).locker(t, &Options{RetryMax: 50 * time.Millisecond})
		owners[l.Owner()] = true
		for g := 0; g < perLocker; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for c := 0; c < cycles; c++ {
					s, err := l.Acquire(ctx, "shared")
					if err != nil {
						t.Errorf("Acquire: %v", err)
						return
					}
					if n := inside.Add(1); n != 1 {
						failures.Add(1)
					}
					mu.Lock()
					tokens = append(tokens, s.Token())
					mu.Unlock()
					runtime.Gosched()
					inside.Add(-1)
					if err := s.Release(ctx); err != nil {
						t.Errorf("Release: %v", err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if len(owners) != lockers {
		t.Fatalf("default owners are not distinct: %v", owners)
	}
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d times more than one holder was inside the critical section", n)
	}
	if want := lockers * perLocker * cycles; len(tokens) != want {
		t.Fatalf("%d holdings, want %d", len(tokens), want)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("token %d of holding %d is not greater than the previous %d", tokens[i], i, tokens[i-1])
		}
	}
}

func TestLocalWaitersFIFO(t *testing.T) {
	e := openEnv(t, testkit.DBName(t), nil)
	l := e.locker(t, &Options{RetryMax: 20 * time.Millisecond})
	ctx := context.Background()
	first, err := l.Acquire(ctx, "fifo")
	if err != nil {
		t.Fatal(err)
	}
	const n = 6
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := l.Acquire(ctx, "fifo")
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := s.Release(ctx); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		}()
		// Enqueue the waiters one after the other.
		testkit.Eventually(t, 5*time.Second, "waiter to queue", func() bool { return queueLen(l, "fifo") == i+1 })
	}
	acquires := e.ops.Get("lock.acquire")
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("waiters served in order %v, want 0..%d", order, n-1)
		}
	}
	if len(order) != n {
		t.Fatalf("%d waiters served, want %d", len(order), n)
	}
	// Only the head asked the store while the key was held locally: none
	// of the waiters polled it before the release.
	if acquires != 1 {
		t.Fatalf("%d store acquires before the release, want 1 (local waiters must not poll)", acquires)
	}
}

func TestWaiterWokenByReleaseNotification(t *testing.T) {
	db := testkit.DBName(t)
	holder := openEnv(t, db, nil).locker(t, &Options{TTL: time.Hour})
	we := openEnv(t, db, nil)
	// A back-off (and a holder TTL) far longer than the wait below: only
	// the notification can hand the lock over.
	waiter := we.locker(t, &Options{RetryMin: time.Hour, RetryMax: time.Hour})
	ctx := context.Background()
	h, err := holder.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lease, 1)
	go func() {
		s, err := waiter.Acquire(ctx, "job")
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- s
	}()
	// The waiter tried, subscribed, tried again, and now sleeps.
	testkit.Eventually(t, 5*time.Second, "waiter to sleep", func() bool {
		waiter.mu.Lock()
		defer waiter.mu.Unlock()
		ks := waiter.keys["job"]
		return we.ops.Get("lock.acquire") >= 2 && waiter.sub == subRunning && ks != nil && !ks.busy
	})
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// With an hour's back-off only the release's notification can wake
	// the waiter: if it does not, the test never ends.
	s := <-got
	if s == nil {
		t.Fatal("no lease")
	}
	if s.Token() <= h.Token() {
		t.Fatalf("token %d not greater than the previous holder's %d", s.Token(), h.Token())
	}
}

func TestWaiterWithoutNotifications(t *testing.T) {
	db := testkit.DBName(t)
	ctx := context.Background()

	t.Run("release", func(t *testing.T) {
		holder := openEnv(t, db, hideNotify).locker(t, nil)
		waiter := openEnv(t, db, hideNotify).locker(t, &Options{RetryMin: 5 * time.Millisecond, RetryMax: 50 * time.Millisecond})
		if waiter.canWatch {
			t.Fatal("the wrapped store still offers notifications")
		}
		h, err := holder.Acquire(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			time.Sleep(100 * time.Millisecond) // let the waiter poll a few times
			_ = h.Release(ctx)
		}()
		s, err := waiter.Acquire(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		if h.Err() != ErrReleased {
			t.Fatalf("waiter acquired while the holder's lease was %v", h.Err())
		}
		if s.Token() <= h.Token() {
			t.Fatal("tokens do not increase")
		}
	})

	t.Run("expiry", func(t *testing.T) {
		const ttl = 200 * time.Millisecond
		holder := openEnv(t, db, hideNotify).locker(t, &Options{TTL: ttl, DisableAutoRefresh: true})
		// An hour's back-off: without the cap at the holder's expiry the
		// waiter would sleep half an hour or more, and the test would not
		// end. Neither store has notifications to wake it.
		waiter := openEnv(t, db, hideNotify).locker(t, &Options{RetryMin: time.Hour, RetryMax: time.Hour})
		h, err := holder.Acquire(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		expires := h.ExpiresAt()
		s, err := waiter.Acquire(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		// The memory store decides by this clock, in milliseconds: the
		// waiter cannot have the key before the holder's expiry.
		if at := time.Now(); at.Before(expires) {
			t.Fatalf("acquired at %v, before the holder's expiry %v", at, expires)
		}
		if cause := waitDone(h); cause != ErrLeaseLost {
			t.Fatalf("expired holder's cause = %v, want ErrLeaseLost", cause)
		}
		if s.Token() <= h.Token() {
			t.Fatal("tokens do not increase")
		}
	})
}

func TestLeaseLostWhenRefreshFails(t *testing.T) {
	const ttl = 300 * time.Millisecond
	f := &faultyLocks{}
	e := openEnv(t, testkit.DBName(t), wrapFaulty(f))
	l := e.locker(t, &Options{TTL: ttl, RefreshInterval: 60 * time.Millisecond, RetryMin: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond})
	ctx := context.Background()
	s, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	// Well past one TTL with working refreshes: still held.
	testkit.Eventually(t, 5*time.Second, "refreshes", func() bool { return f.oks.Load() >= 8 })
	select {
	case <-s.Done():
		t.Fatalf("lease ended (%v) while refreshes succeeded", context.Cause(s.Context()))
	default:
	}
	if s.Err() != nil {
		t.Fatalf("Err = %v while held", s.Err())
	}
	f.fail.Store(true)
	cause := waitDone(s)
	lostAt := time.Now()
	if cause != ErrLeaseLost || s.Err() != ErrLeaseLost {
		t.Fatalf("cause %v, Err %v; want ErrLeaseLost", cause, s.Err())
	}
	// The deadline rule, computed: the lease ended at its deadline, which
	// is at most the last successful refresh's send time + TTL −
	// MinClockSkew.
	last := time.Unix(0, f.lastOK.Load())
	if bound := last.Add(ttl - MinClockSkew); s.Deadline().After(bound) {
		t.Fatalf("deadline %v is after the last successful refresh's send time + TTL − MinClockSkew (%v)", s.Deadline(), bound)
	}
	if lostAt.Before(s.Deadline()) {
		t.Fatalf("lease lost at %v, before its deadline %v, while the store kept it", lostAt, s.Deadline())
	}
	if f.calls.Load() <= f.oks.Load() {
		t.Fatal("failing refreshes were not retried")
	}
	// The holder is told first, then the loss is logged.
	testkit.Eventually(t, 5*time.Second, "the loss logged", func() bool { return contains(e.logs.String(), "lease lost") })
	if err := s.Release(ctx); !errors.Is(err, ErrNotHeld) || !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Release of a lost lease = %v, want ErrNotHeld", err)
	}
	// The Locker can take the key again, with a new token.
	f.fail.Store(false)
	s2, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if s2.Token() <= s.Token() {
		t.Fatalf("new lease token %d, lost one %d", s2.Token(), s.Token())
	}
}

// TestRefreshDueAThirdIntoTheWindow: a lease's background refresh is due
// a third (less its jitter of a tenth) of the way from the last send time
// to the lease's deadline, whatever the margin, so that the refresh has
// the other two thirds to be answered. Due at TTL/3, it had only a sixth
// of the TTL where the margin takes half of it, and leases at the
// minimum TTL were lost on a busy machine. Computed, not timed.
func TestRefreshDueAThirdIntoTheWindow(t *testing.T) {
	e := openEnv(t, testkit.DBName(t), nil)
	ctx := context.Background()
	for i, o := range []Options{
		{TTL: MinTTL},
		{TTL: MinTTL, ClockSkew: MinTTL / 2},
		{TTL: time.Second, ClockSkew: 400 * time.Millisecond},
		{},
		{TTL: time.Second, RefreshInterval: time.Second}, // leaves no time: reduced
	} {
		l := e.locker(t, &o)
		s, err := l.TryAcquire(ctx, fmt.Sprint("k", i))
		if err != nil {
			t.Fatal(err)
		}
		window := l.ttl - l.skew
		s.mu.Lock() // the deadline and the next refresh move together
		sent := s.ctx.When().Add(-window)
		due := s.nextRefresh.Sub(sent)
		s.mu.Unlock()
		if third := window / 3; due > third || due < third-third/10-1 {
			t.Errorf("%+v: the refresh is due %v after the send time; want a third of the %v window, %v, less at most a tenth", o, due, window, third)
		}
		if err := s.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMinTTLLeaseKeepsItself: a lease with the shortest TTL New accepts
// keeps itself alive — the behaviour MinTTL promises. Ten background
// refreshes in a row succeed while the lease stays held.
func TestMinTTLLeaseKeepsItself(t *testing.T) {
	f := &faultyLocks{wake: make(chan struct{}, 1)}
	l := openEnv(t, testkit.DBName(t), wrapFaulty(f)).locker(t, &Options{TTL: MinTTL})
	ctx := context.Background()
	s, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	for f.oks.Load() < 10 {
		select {
		case <-f.wake:
		case <-s.Done():
			t.Fatalf("a lease with TTL %v was lost after %d refreshes: %v", MinTTL, f.oks.Load(), context.Cause(s.Context()))
		}
	}
	if err := s.Release(ctx); err != nil {
		t.Fatalf("Release after %d refreshes: %v", f.oks.Load(), err)
	}
}

func TestStaleHoldingGetsNewToken(t *testing.T) {
	// A lease lost at its deadline while the store still has the holding:
	// the Locker's next lease on the key must not reuse its token.
	f := &faultyLocks{}
	e := openEnv(t, testkit.DBName(t), wrapFaulty(f))
	l := e.locker(t, &Options{TTL: 2 * time.Second, RefreshInterval: 20 * time.Millisecond, ClockSkew: 1900 * time.Millisecond})
	ctx := context.Background()
	f.fail.Store(true)
	s, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	// ClockSkew is capped to TTL/2: the lease is lost locally after ~1 s,
	// while the store keeps the holding for 2 s.
	if cause := waitDone(s); cause != ErrLeaseLost {
		t.Fatalf("cause %v", cause)
	}
	if rec, found, err := e.st.Locks().Get(ctx, "k"); err != nil || !found || rec.Token != s.Token() {
		t.Fatalf("store record %+v %v %v: expected the old holding still live", rec, found, err)
	}
	s2, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if s2.Token() <= s.Token() {
		t.Fatalf("new lease token %d reuses or precedes the lost one %d", s2.Token(), s.Token())
	}
}

func TestForceReleaseLosesLease(t *testing.T) {
	db := testkit.DBName(t)
	e := openEnv(t, db, nil)
	l := e.locker(t, &Options{TTL: 2 * time.Second, RefreshInterval: 30 * time.Millisecond})
	other := openEnv(t, db, nil)
	ctx := context.Background()
	s, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	ok, err := other.st.Locks().ForceRelease(ctx, "k")
	if err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v", ok, err)
	}
	if cause := waitDone(s); cause != ErrLeaseLost {
		t.Fatalf("cause %v, want ErrLeaseLost", cause)
	}
	if err := s.Refresh(ctx); err != ErrLeaseLost {
		t.Fatalf("Refresh of a lost lease = %v", err)
	}
	if err := s.Release(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Release = %v, want ErrNotHeld", err)
	}
	s2, err := other.locker(t, nil).TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if s2.Token() <= s.Token() {
		t.Fatal("tokens do not increase")
	}
}

func TestAmbiguousRefreshResolvedByReadBack(t *testing.T) {
	const ttl = 300 * time.Millisecond
	f := &faultyLocks{wake: make(chan struct{}, 1)}
	e := openEnv(t, testkit.DBName(t), wrapFaulty(f))
	l := e.locker(t, &Options{TTL: ttl, RefreshInterval: 60 * time.Millisecond})
	ctx := context.Background()
	f.ambiguous.Store(true)
	s, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	// Every refresh errors after applying: only read-backs can move the
	// deadline. Wait until they have moved it three TTLs past the
	// acquire's own, refresh by refresh.
	first := s.Deadline()
	for !s.Deadline().After(first.Add(3 * ttl)) {
		select {
		case <-s.Done():
			t.Fatalf("lease ended with %v after %d refreshes although every refresh applied", s.Err(), f.calls.Load())
		case <-f.wake:
		}
	}
	rec, found, err := e.st.Locks().Get(ctx, "k")
	if err != nil || !found || rec.Owner != l.Owner() || rec.Token != s.Token() {
		t.Fatalf("store record %+v %v %v", rec, found, err)
	}
	f.ambiguous.Store(false)
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Err() != ErrReleased {
		t.Fatalf("Err after release = %v", s.Err())
	}

	// Manual refreshes are settled the same way. Without background
	// refreshes, and once the store's millisecond clock has moved past the
	// acquire, an applied refresh always moves the expiry; within the same
	// millisecond read-back could not tell it applied and would keep the
	// lease only until its deadline.
	m := e.locker(t, &Options{TTL: ttl, DisableAutoRefresh: true})
	ms, err := m.Acquire(ctx, "manual")
	if err != nil {
		t.Fatal(err)
	}
	for acquired := time.Now(); time.Since(acquired) < 3*time.Millisecond; {
		time.Sleep(time.Millisecond) // let the clock move past the acquire's millisecond
	}
	f.ambiguous.Store(true)
	if err := ms.Refresh(ctx); err != nil {
		t.Fatalf("manual ambiguous Refresh = %v", err)
	}
	f.ambiguous.Store(false)
	if err := ms.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestTryAcquire(t *testing.T) {
	db := testkit.DBName(t)
	a := openEnv(t, db, nil).locker(t, nil)
	b := openEnv(t, db, nil).locker(t, nil)
	ctx := context.Background()
	s, err := a.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.TryAcquire(ctx, "k")
	var he *HeldError
	if !errors.Is(err, ErrLocked) || !errors.As(err, &he) {
		t.Fatalf("TryAcquire of a held key = %v, want ErrLocked", err)
	}
	if he.Key != "k" || he.Owner != a.Owner() || he.Token != s.Token() || he.ExpiresAt.IsZero() {
		t.Fatalf("holder %+v, want owner %q token %d", he, a.Owner(), s.Token())
	}
	// The same Locker: not re-entrant.
	_, err = a.TryAcquire(ctx, "k")
	if !errors.As(err, &he) || he.Owner != a.Owner() || he.Token != s.Token() {
		t.Fatalf("TryAcquire by the holding Locker = %v", err)
	}
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx); err != nil {
		t.Fatalf("second Release = %v, want nil", err)
	}
	s2, err := b.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if s2.Token() <= s.Token() {
		t.Fatal("tokens do not increase")
	}
	// Invalid keys are refused before any I/O.
	if _, err := b.TryAcquire(ctx, ""); !errors.Is(err, warden.ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := b.Acquire(ctx, ""); !errors.Is(err, warden.ErrInvalidKey) {
		t.Fatalf("Acquire of an empty key: %v", err)
	}
}

func TestTokensIncreaseAcrossExpiry(t *testing.T) {
	db := testkit.DBName(t)
	a := openEnv(t, db, nil).shortLocker(t, &Options{TTL: 50 * time.Millisecond, DisableAutoRefresh: true})
	b := openEnv(t, db, nil).shortLocker(t, &Options{TTL: 50 * time.Millisecond, DisableAutoRefresh: true})
	ctx := context.Background()
	var last int64
	for i := 0; i < 6; i++ {
		l := a
		if i%2 == 1 {
			l = b
		}
		s, err := l.Acquire(ctx, "k") // the previous holding expires
		if err != nil {
			t.Fatal(err)
		}
		if s.Token() <= last {
			t.Fatalf("holding %d token %d, previous %d", i, s.Token(), last)
		}
		last = s.Token()
	}
}

func TestAcquireContextEnds(t *testing.T) {
	db := testkit.DBName(t)
	a := openEnv(t, db, nil).locker(t, nil)
	b := openEnv(t, db, nil).locker(t, nil)
	if _, err := a.Acquire(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.Acquire(ctx, "k"); err != context.DeadlineExceeded {
		t.Fatalf("Acquire = %v, want context.DeadlineExceeded", err)
	}
	if n := queueLen(b, "k"); n != 0 {
		t.Fatalf("%d waiters left behind", n)
	}
}

func TestDo(t *testing.T) {
	db := testkit.DBName(t)
	l := openEnv(t, db, nil).locker(t, &Options{TTL: 2 * time.Second, RefreshInterval: 30 * time.Millisecond})
	other := openEnv(t, db, nil)
	ol := other.locker(t, nil)
	ctx := context.Background()

	boom := errors.New("boom")
	ran := false
	err := Do(ctx, l, "job", func(ctx context.Context) error {
		ran = true
		if _, err := ol.TryAcquire(ctx, "job"); !errors.Is(err, ErrLocked) {
			t.Errorf("inside Do, the key is not held: %v", err)
		}
		return boom
	})
	if !ran || err != boom {
		t.Fatalf("Do = %v (ran %v), want fn's error", err, ran)
	}
	s, err := ol.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatalf("key not released after Do: %v", err)
	}
	_ = s.Release(ctx)

	// Losing the lease cancels fn's context with ErrLeaseLost.
	err = Do(ctx, l, "job", func(fctx context.Context) error {
		if _, err := other.st.Locks().ForceRelease(ctx, "job"); err != nil {
			return err
		}
		<-fctx.Done() // never, if the loss does not cancel fn's context
		return context.Cause(fctx)
	})
	if !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Do after a lost lease = %v, want ErrLeaseLost", err)
	}

	// fn succeeded but the lease was lost meanwhile: still reported.
	err = Do(ctx, l, "job", func(context.Context) error {
		_, err := other.st.Locks().ForceRelease(ctx, "job")
		return err
	})
	if !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Do = %v, want ErrLeaseLost", err)
	}

	// Not acquired: fn is not called.
	h, err := ol.Acquire(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release(ctx)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	err = Do(cctx, l, "busy", func(context.Context) error {
		t.Error("fn called without the lock")
		return nil
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do = %v", err)
	}
}

// nextEvent reads one event, or fails if the channel is closed. It sets
// no time limit: an event that never comes is reported by go test's
// -timeout.
func nextEvent(t *testing.T, ch <-chan Event) Event {
	t.Helper()
	ev, ok := <-ch
	if !ok {
		t.Fatal("watch channel closed")
	}
	return ev
}

func expectEvent(t *testing.T, ch <-chan Event, kind EventKind, key, owner string) Event {
	t.Helper()
	ev := nextEvent(t, ch)
	if ev.Kind != kind || ev.Key != key || (owner != "" && ev.Owner != owner) {
		t.Fatalf("event %v %q by %q, want %v %q by %q", ev.Kind, ev.Key, ev.Owner, kind, key, owner)
	}
	return ev
}

func TestWatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		wrap func(d driver.Store) driver.Store
	}{{"notifications", nil}, {"polling", hideNotify}} {
		t.Run(tc.name, func(t *testing.T) {
			db := testkit.DBName(t)
			w := openEnv(t, db, tc.wrap).locker(t, &Options{PollInterval: 10 * time.Millisecond})
			a := openEnv(t, db, tc.wrap).locker(t, &Options{TTL: 100 * time.Millisecond, DisableAutoRefresh: true})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if _, err := w.Watch(ctx, "job\\"); !errors.Is(err, warden.ErrInvalidPattern) {
				t.Fatalf("bad pattern: %v", err)
			}
			ch, err := w.Watch(ctx, "job:*")
			if err != nil {
				t.Fatal(err)
			}
			if tc.wrap != nil {
				// A poller says first that it can miss holdings.
				if ev := nextEvent(t, ch); ev.Kind != EventsLost || !errors.Is(ev.Err, ErrPolled) {
					t.Fatalf("first polled event %+v, want EventsLost with ErrPolled", ev)
				}
			}
			s, err := a.Acquire(ctx, "job:1")
			if err != nil {
				t.Fatal(err)
			}
			ev := expectEvent(t, ch, Acquired, "job:1", a.Owner())
			if ev.Token != s.Token() {
				t.Fatalf("event token %d, lease %d", ev.Token, s.Token())
			}
			if _, err := a.Acquire(ctx, "other"); err != nil { // filtered out
				t.Fatal(err)
			}
			if err := s.Release(ctx); err != nil {
				t.Fatal(err)
			}
			expectEvent(t, ch, Released, "job:1", a.Owner())
			// An expiry: the poller reports it; the memory store's stream
			// does not, but the next holder's acquire shows up either way.
			if _, err := a.Acquire(ctx, "job:2"); err != nil {
				t.Fatal(err)
			}
			ev = expectEvent(t, ch, Acquired, "job:2", a.Owner())
			// Its lapse is reported while nobody takes the key, At its
			// expiry, by the poller and on the stream alike.
			exp := expectEvent(t, ch, Expired, "job:2", a.Owner())
			if exp.Token != ev.Token || exp.At.Before(ev.At) {
				t.Fatalf("expired %+v after acquired %+v", exp, ev)
			}
			cancel()
			testkit.Eventually(t, 5*time.Second, "channel closed", func() bool {
				select {
				case _, ok := <-ch:
					return !ok
				default:
					return false
				}
			})
		})
	}
}

func TestDiff(t *testing.T) {
	now := time.Now().UTC()
	rec := func(key, owner string, token int64, exp time.Duration) driver.LockRecord {
		return driver.LockRecord{Key: key, Owner: owner, Token: token, ExpiresAt: now.Add(exp)}
	}
	prev := map[string]driver.LockRecord{
		"a": rec("a", "x", 1, time.Minute),  // unchanged (refreshed)
		"b": rec("b", "x", 2, time.Minute),  // released
		"c": rec("c", "x", 3, -time.Second), // expired
		"d": rec("d", "x", 4, -time.Second), // expired and taken
	}
	cur := map[string]driver.LockRecord{
		"a": rec("a", "x", 1, 2*time.Minute),
		"d": rec("d", "y", 5, time.Minute),
		"e": rec("e", "y", 6, time.Minute), // new
	}
	var got []string
	for _, ev := range diff(prev, cur, now) {
		got = append(got, fmt.Sprintf("%v %s %s %d", ev.Kind, ev.Key, ev.Owner, ev.Token))
	}
	want := []string{"released b x 2", "expired c x 3", "expired d x 4", "acquired d y 5", "acquired e y 6"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("diff = %q, want %q", got, want)
	}

	// A holding replaced between two polls ended before its successor
	// began: released (its expiry was later) at the successor's
	// acquisition, not at the poll.
	acq := now.Add(-time.Second)
	prev = map[string]driver.LockRecord{"f": rec("f", "x", 7, -time.Second/2)}
	next := rec("f", "y", 8, time.Minute)
	next.AcquiredAt = acq
	evs := diff(prev, map[string]driver.LockRecord{"f": next}, now)
	if len(evs) != 2 || evs[0].Kind != Released || !evs[0].At.Equal(acq) || evs[1].Kind != Acquired || !evs[1].At.Equal(acq) {
		t.Fatalf("replaced holding: %+v", evs)
	}
}

func TestCloseStopsEverything(t *testing.T) {
	db := testkit.DBName(t)
	e := openEnv(t, db, nil)
	pe := openEnv(t, db, hideNotify)
	holder := openEnv(t, db, nil).locker(t, nil)
	ctx := context.Background()
	if _, err := holder.Acquire(ctx, "busy"); err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()

	l := e.locker(t, &Options{TTL: time.Second, RefreshInterval: 10 * time.Millisecond})
	pl := pe.locker(t, &Options{PollInterval: 10 * time.Millisecond})
	s, err := l.Acquire(ctx, "mine")
	if err != nil {
		t.Fatal(err)
	}
	pending := make(chan error, 2)
	go func() {
		_, err := l.Acquire(ctx, "busy")
		pending <- err
	}()
	go func() {
		_, err := pl.Acquire(ctx, "busy")
		pending <- err
	}()
	testkit.Eventually(t, 5*time.Second, "subscription", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.sub == subRunning
	})
	w1, err := l.Watch(ctx, "*")
	if err != nil {
		t.Fatal(err)
	}
	w2, err := pl.Watch(ctx, "*")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let refreshes and polls run

	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pl.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := <-pending; !errors.Is(err, ErrClosed) {
			t.Fatalf("pending Acquire = %v, want ErrClosed", err)
		}
	}
	for _, w := range []<-chan Event{w1, w2} {
		testkit.Eventually(t, 5*time.Second, "watch closed", func() bool {
			select {
			case _, ok := <-w:
				return !ok
			default:
				return false
			}
		})
	}
	if s.Err() != ErrReleased {
		t.Fatalf("lease after Close: %v, want ErrReleased", s.Err())
	}
	if _, found, _ := e.st.Locks().Get(ctx, "mine"); found {
		t.Fatal("Close did not release the lease in the store")
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if _, err := l.Acquire(ctx, "x"); err != ErrClosed {
		t.Fatalf("Acquire after Close = %v", err)
	}
	if _, err := l.TryAcquire(ctx, "x"); err != ErrClosed {
		t.Fatalf("TryAcquire after Close = %v", err)
	}
	if _, err := l.Watch(ctx, "*"); err != ErrClosed {
		t.Fatalf("Watch after Close = %v", err)
	}
	waitGoroutines(base)
}

func TestManyLeases(t *testing.T) {
	if testing.Short() {
		t.Skip("10 000 leases")
	}
	const n = 10000
	e := openEnv(t, testkit.DBName(t), nil)
	// A long TTL, so that a machine slowed by -race and other builds still
	// refreshes every lease in time; a short interval, so that every lease
	// refreshes soon.
	l := e.locker(t, &Options{TTL: 20 * time.Second, RefreshInterval: 500 * time.Millisecond})
	ctx := context.Background()
	runtime.GC()
	base := runtime.NumGoroutine()
	leases := make([]*Lease, n)
	first := make([]time.Time, n)
	start := time.Now()
	for i := range leases {
		s, err := l.TryAcquire(ctx, fmt.Sprintf("k%05d", i))
		if err != nil {
			t.Fatal(err)
		}
		leases[i], first[i] = s, s.Deadline()
	}
	t.Logf("%d leases acquired in %v", n, time.Since(start))
	// Until every lease has refreshed in the background (its deadline
	// moved), the goroutine count stays small and independent of the
	// number of leases.
	peak := runtime.NumGoroutine()
	next := 0 // leases before next have refreshed
	for next < n {
		peak = max(peak, runtime.NumGoroutine())
		for next < n && leases[next].Deadline().After(first[next]) {
			if err := leases[next].Err(); err != nil {
				t.Fatalf("lease %s ended: %v; log: %.600s", leases[next].Key(), err, e.logs.String())
			}
			next++
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("all refreshed after %v; goroutines: %d before, peak %d", time.Since(start), base, peak)
	// Refresh workers are sized to the load and never more than
	// maxRefreshWorkers (a machine short of CPU makes the queue wait and
	// the pool grow); a goroutine per lease would be ten thousand.
	if peak > base+maxRefreshWorkers+100 {
		t.Fatalf("goroutines grew from %d to %d with %d leases", base, peak, n)
	}
	for _, s := range leases {
		if s.Err() != nil {
			t.Fatalf("lease %s ended: %v", s.Key(), s.Err())
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, s := range leases {
		if s.Err() != ErrReleased {
			t.Fatalf("lease %s after Close: %v", s.Key(), s.Err())
		}
	}
	waitGoroutines(base)
}

func TestLeaseFromContext(t *testing.T) {
	l := openEnv(t, testkit.DBName(t), nil).locker(t, nil)
	ctx := context.Background()
	if LeaseFromContext(ctx) != nil {
		t.Fatal("a lease outside Do")
	}
	var seen *Lease
	err := Do(ctx, l, "k", func(ctx context.Context) error {
		seen = LeaseFromContext(ctx)
		if seen == nil || seen.Key() != "k" || seen.Token() <= 0 || seen.Err() != nil {
			t.Errorf("lease in Do = %+v", seen)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen == nil || seen.Err() != ErrReleased {
		t.Fatalf("lease after Do: %v", seen)
	}
}
