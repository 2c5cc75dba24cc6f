package lock

// Adversarial tests of the deadline rule (docs/design.md "The deadline
// rule (leases and claims)"), through the public API on the memory store,
// with the lock driver wrapped to delay, drop or reorder answers and
// writes. Each test says what it attacks; a failing test is a violation.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/deadline"
	"github.com/warden-go/warden/internal/testkit"
)

var errAdv = errors.New("adversarial: connection reset")

// Refresh behaviours of advLocks.
const (
	refNormal   = iota
	refFail     // the request never reaches the store; the caller gets an error at once
	refInFlight // the request is delayed on the way: the write lands `delay` later; the caller sees only its own ctx end
)

// landing is a refresh write that reached the store late.
type landing struct {
	at  time.Time
	rec driver.LockRecord
	ok  bool
	err error
}

// advLocks wraps the memory lock driver.
type advLocks struct {
	driver.Locks
	mode   atomic.Int32
	delay  atomic.Int64 // ns, refInFlight
	landed chan landing
}

func (f *advLocks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	switch f.mode.Load() {
	case refFail:
		return driver.LockRecord{}, false, errAdv
	case refInFlight:
		d := time.Duration(f.delay.Load())
		go func() {
			time.Sleep(d)
			rec, ok, err := f.Locks.Refresh(context.Background(), key, owner, token, ttl)
			f.landed <- landing{time.Now(), rec, ok, err}
		}()
		<-ctx.Done()
		return driver.LockRecord{}, false, ctx.Err()
	}
	return f.Locks.Refresh(ctx, key, owner, token, ttl)
}

type advStore struct {
	driver.Store
	locks driver.Locks
}

func (s *advStore) Locks() driver.Locks { return s.locks }

func wrapAdv(f *advLocks) func(driver.Store) driver.Store {
	return func(d driver.Store) driver.Store {
		f.Locks = d.Locks()
		return &advStore{Store: d, locks: f}
	}
}

// VIOLATION. An ambiguous refresh whose read-back shows the expiry moved
// is credited to the send time of the *current* round of refreshes
// (pendingSince), but a successful refresh in between clears
// pendingSince while an older refresh's write is still in flight. When
// that older write lands, the expiry moves; a later refresh that fails
// without reaching the store then reads the record back, sees the moved
// expiry and extends the deadline to its own send time + TTL − margin —
// past the store's expiry, which was set by the old write.
//
// Interleaving (TTL 200 ms, margin 10 ms, auto-refresh off):
//
//	t0        TryAcquire                       store expiry t0+200
//	t1≈t0     R1 = Refresh(ctx with 5 ms timeout); its write is delayed
//	          in flight by 30 ms; R1 returns the ctx error with no
//	          read-back (rctx is done): pendingSince = t1
//	t2≈t1+5   R2 = Refresh succeeds: prove(t2) clears pendingSince;
//	          deadline t2+190, s.expiresAt = t2+200
//	a1≈t1+30  R1's write lands: store expiry a1+200  (> t2+200)
//	t3≈a1+60  R3 = Refresh; the request fails before reaching the store;
//	          read-back shows expiry a1+200 > prevExp t2+200, "ours":
//	          prove(base = pendingSince = t3): deadline t3+190 ≈ a1+250
//	a1+200    the store lets Locker B in, while s.Err() == nil until
//	          ≈ a1+250.
func TestAdversarialReadBackCreditsAnOlderRefresh(t *testing.T) {
	const ttl = 200 * time.Millisecond
	db := testkit.DBName(t)
	f := &advLocks{landed: make(chan landing, 4)}
	a := openEnv(t, db, wrapAdv(f)).locker(t, &Options{TTL: ttl, DisableAutoRefresh: true})
	b := openEnv(t, db, nil).locker(t, &Options{TTL: ttl, DisableAutoRefresh: true})
	ctx := context.Background()

	s, err := a.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	// R1: in flight for 30 ms, abandoned by its caller after 5 ms.
	f.delay.Store(int64(30 * time.Millisecond))
	f.mode.Store(refInFlight)
	rctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
	err = s.Refresh(rctx)
	cancel()
	if err == nil {
		t.Fatal("R1 should have failed (its caller gave up)")
	}
	// R2: a clean success.
	f.mode.Store(refNormal)
	if err := s.Refresh(ctx); err != nil {
		t.Fatalf("R2: %v", err)
	}
	r2Deadline := s.Deadline()
	land := <-f.landed // R1's write lands after R2's
	if land.err != nil || !land.ok {
		t.Fatalf("R1's late write: ok=%v err=%v", land.ok, land.err)
	}
	storeExp := land.rec.ExpiresAt
	time.Sleep(60 * time.Millisecond)
	// R3: never reaches the store; its read-back sees R1's expiry.
	f.mode.Store(refFail)
	r3 := s.Refresh(ctx)
	f.mode.Store(refNormal)
	t.Logf("R3 = %v; deadline after R2 %v, now %v; store expiry (set by R1, sent before R2) %v",
		r3, r2Deadline.Format("15:04:05.000"), s.Deadline().Format("15:04:05.000"), storeExp.Format("15:04:05.000"))
	if s.Deadline().After(storeExp.Add(-MinClockSkew)) {
		t.Errorf("the lease's deadline %v is past the store's expiry %v less MinClockSkew: no refresh sent after %v reached the store",
			s.Deadline().Format("15:04:05.000"), storeExp.Format("15:04:05.000"), storeExp.Add(-ttl).Format("15:04:05.000"))
	}
	// Another Locker takes the key as soon as the store lets it.
	for {
		s2, err := b.TryAcquire(ctx, "k")
		if errors.Is(err, ErrLocked) {
			time.Sleep(500 * time.Microsecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if s.Err() == nil {
			t.Fatalf("Locker B acquired %q (token %d) at %v while the first lease (token %d, deadline %v) reports itself held",
				s2.Key(), s2.Token(), time.Now().Format("15:04:05.000"), s.Token(), s.Deadline().Format("15:04:05.000"))
		}
		_ = s2.Release(ctx)
		return
	}
}

// HOLDS for Err (found as a violation for Done). The Go runtime runs
// timers only when a goroutine yields or is preempted (about every 10 ms
// for a spinning one), so with a CPU-bound holder on every P the lease's
// Done channel can close up to ~10 ms after the deadline — past the
// store's expiry for short TTLs. That is why the deadline rule makes Err
// consult the clock, and why docs/design.md tells holders to check
// ctx.Err() (not only Done) before each write: under the same load, Err
// reports the loss at the deadline, every time.
//
// Interleaving (TTL 20 ms, margin 5 ms): Acquire at t0; the store's
// expiry is ≈ t0+20; GOMAXPROCS goroutines of the holder spin, each
// checking the lease context's Err between chunks of work.
func TestAdversarialErrExactUnderCPULoad(t *testing.T) {
	const ttl = 20 * time.Millisecond
	l := openEnv(t, testkit.DBName(t), nil).shortLocker(t, &Options{TTL: ttl, DisableAutoRefresh: true})
	ctx := context.Background()
	const rounds = 20
	var late []time.Duration
	for i := range rounds {
		s, err := l.TryAcquire(ctx, fmt.Sprint("k", i))
		if err != nil {
			t.Fatal(err)
		}
		n := runtime.GOMAXPROCS(0)
		var (
			wg      sync.WaitGroup
			worst   atomic.Int64 // how long past the store's expiry Done was seen open
			sawOpen atomic.Bool
		)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				x := 0
				for {
					for j := range 1000 { // a chunk of work
						x += j * j
					}
					now := time.Now()
					if s.Context().Err() != nil { // asked at or after now
						return
					}
					if over := now.Sub(s.Deadline()); over >= 0 {
						sawOpen.Store(true)
						for {
							cur := worst.Load()
							if int64(over) <= cur || worst.CompareAndSwap(cur, int64(over)) {
								break
							}
						}
						if over > 50*time.Millisecond {
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		if sawOpen.Load() {
			late = append(late, time.Duration(worst.Load()))
		}
		_ = s.Release(ctx)
	}
	if len(late) > 0 {
		t.Errorf("in %d of %d rounds the holder saw its lease context's Err nil at or after the deadline (up to %v after it)",
			len(late), rounds, slicesMax(late))
	}
}

func slicesMax(d []time.Duration) time.Duration {
	m := d[0]
	for _, x := range d {
		m = max(m, x)
	}
	return m
}

// chaosLocks applies every write at call time (no reordering) but, at
// random, fails a call before it reaches the store, fails it after the
// write applied (ambiguous), or answers it late.
type chaosLocks struct {
	driver.Locks
	maxDelay time.Duration
	on       atomic.Bool
}

// chaosTrace records every lock call's outcome, for failure reports.
var chaosTrace = &trace{}

type trace struct {
	mu  sync.Mutex
	evs []string
}

func (tr *trace) add(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.evs = append(tr.evs, time.Now().Format("05.000000")+" "+fmt.Sprintf(format, args...))
	if len(tr.evs) > 4000 {
		tr.evs = tr.evs[2000:]
	}
}

func (tr *trace) dump(key string) string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []string
	for _, e := range tr.evs {
		if strings.Contains(e, " "+key+" ") {
			out = append(out, e)
		}
	}
	if len(out) > 60 {
		out = out[len(out)-60:]
	}
	return strings.Join(out, "\n")
}

func (c *chaosLocks) roll() (before, after bool, delay time.Duration) {
	if !c.on.Load() {
		return
	}
	switch r := rand.IntN(20); {
	case r == 0:
		before = true
	case r == 1:
		after = true
	case r < 6:
		delay = rand.N(c.maxDelay)
	}
	return
}

func (c *chaosLocks) wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *chaosLocks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	before, after, d := c.roll()
	if before {
		return driver.LockRecord{}, false, errAdv
	}
	rec, ok, err := c.Locks.Acquire(ctx, key, owner, ttl)
	chaosTrace.add("acquire %s %s ok=%v tok=%d exp=%v err=%v after=%v delay=%v", key, owner[len(owner)-4:], ok, rec.Token%1000, rec.ExpiresAt.Format("05.000"), err, after, d)
	if after && err == nil {
		return driver.LockRecord{}, false, errAdv
	}
	if werr := c.wait(ctx, d); werr != nil {
		return driver.LockRecord{}, false, werr
	}
	return rec, ok, err
}

func (c *chaosLocks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	before, after, d := c.roll()
	if before {
		return driver.LockRecord{}, false, errAdv
	}
	rec, ok, err := c.Locks.Refresh(ctx, key, owner, token, ttl)
	chaosTrace.add("refresh %s %s tok=%d ok=%v exp=%v err=%v after=%v delay=%v", key, owner[len(owner)-4:], token%1000, ok, rec.ExpiresAt.Format("05.000"), err, after, d)
	if after && err == nil {
		return driver.LockRecord{}, false, errAdv
	}
	if werr := c.wait(ctx, d); werr != nil {
		return driver.LockRecord{}, false, werr
	}
	return rec, ok, err
}

func (c *chaosLocks) Release(ctx context.Context, key, owner string, token int64) (bool, error) {
	before, after, d := c.roll()
	if before {
		return false, errAdv
	}
	ok, err := c.Locks.Release(ctx, key, owner, token)
	chaosTrace.add("release %s %s tok=%d ok=%v err=%v after=%v delay=%v", key, owner[len(owner)-4:], token%1000, ok, err, after, d)
	if after && err == nil {
		return false, errAdv
	}
	if werr := c.wait(ctx, d); werr != nil {
		return false, werr
	}
	return ok, err
}

func (c *chaosLocks) Get(ctx context.Context, key string) (driver.LockRecord, bool, error) {
	before, _, d := c.roll()
	if before {
		return driver.LockRecord{}, false, errAdv
	}
	rec, ok, err := c.Locks.Get(ctx, key)
	chaosTrace.add("get %s found=%v owner=%s tok=%d exp=%v", key, ok, rec.Owner, rec.Token%1000, rec.ExpiresAt.Format("05.000"))
	if werr := c.wait(ctx, d); werr != nil {
		return driver.LockRecord{}, false, werr
	}
	return rec, ok, err
}

// Chaos (VIOLATION in "shared", 1–3 runs in 10; "solo" HOLDS): Lockers
// whose goroutines Acquire, TryAcquire and Do on two keys, Refresh (short
// timeouts) and Release at random, with background refresh on and a TTL
// of 30 ms, over a lock driver that fails calls before or after they
// apply and answers late (writes never reorder; so this does not reach
// TestAdversarialReadBackCreditsAnOlderRefresh's bug). Oracle, checked the
// instant any lease is handed out: every other lease on the key reports
// itself lost (Err ≠ nil), and no two leases ever carry one token.
//
// "shared": three Lockers used by three goroutines each — fails at times
// by TestAdversarialLostReleaseRacesWaiterRenewal's race (a lost lease's
// Release racing a waiter of the same Locker). "solo": six Lockers used
// by one goroutine each, which rules that race out.
func TestAdversarialChaosExclusion(t *testing.T) {
	t.Run("shared", func(t *testing.T) { chaosExclusion(t, 3, 3) })
	t.Run("solo", func(t *testing.T) { chaosExclusion(t, 6, 1) })
}

func chaosExclusion(t *testing.T, nLockers, perLocker int) {
	const ttl = 30 * time.Millisecond
	db := testkit.DBName(t)
	keys := []string{"a", "b"}
	var (
		mu     sync.Mutex
		leases = map[string][]*Lease{}
		tokens = map[string]map[int64]*Lease{}
		viol   []string
	)
	onAcquire := func(s *Lease) {
		mu.Lock()
		defer mu.Unlock()
		for _, o := range leases[s.Key()] {
			// Both live at one instant (Err is monotone): a violation
			// whichever was handed out first.
			if o != s && o.Err() == nil && s.Err() == nil {
				viol = append(viol, fmt.Sprintf("key %q token %d (%s, deadline %v, store expiry %v) handed out at %v while token %d (%s, deadline %v, store expiry %v) reports itself held\n%s",
					s.Key(), s.Token(), s.l.Owner(), s.Deadline().Format("05.000000"), s.ExpiresAt().Format("05.000000"), time.Now().Format("05.000000"),
					o.Token(), o.l.Owner(), o.Deadline().Format("05.000000"), o.ExpiresAt().Format("05.000000"), chaosTrace.dump(s.Key())))
			}
		}
		if tokens[s.Key()] == nil {
			tokens[s.Key()] = map[int64]*Lease{}
		}
		if o := tokens[s.Key()][s.Token()]; o != nil && o != s {
			viol = append(viol, fmt.Sprintf("key %q: token %d handed out twice: first to %s (deadline %v, err %v), then to %s at %v (deadline %v)",
				s.Key(), s.Token(), o.l.Owner(), o.Deadline().Format("15:04:05.000000"), context.Cause(o.Context()),
				s.l.Owner(), time.Now().Format("15:04:05.000000"), s.Deadline().Format("15:04:05.000000")))
		}
		tokens[s.Key()][s.Token()] = s
		leases[s.Key()] = append(leases[s.Key()], s)
	}
	var chaos []*chaosLocks
	var lockers []*Locker
	for i := range nLockers {
		c := &chaosLocks{maxDelay: 15 * time.Millisecond}
		chaos = append(chaos, c)
		e := openEnv(t, db, func(d driver.Store) driver.Store {
			c.Locks = d.Locks()
			return &advStore{Store: d, locks: c}
		})
		lockers = append(lockers, e.shortLocker(t, &Options{TTL: ttl, Owner: "same", RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond}))
		_ = i
	}
	for _, c := range chaos {
		c.on.Store(true)
	}
	stop := time.Now().Add(900 * time.Millisecond)
	var wg sync.WaitGroup
	for _, l := range lockers {
		for range perLocker {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := context.Background()
				for time.Now().Before(stop) {
					key := keys[rand.IntN(len(keys))]
					hold := func(s *Lease) {
						onAcquire(s)
						end := time.Now().Add(rand.N(2 * ttl))
						for time.Now().Before(end) && s.Err() == nil {
							if rand.IntN(3) == 0 {
								rctx, cancel := context.WithTimeout(ctx, rand.N(10*time.Millisecond)+time.Millisecond)
								_ = s.Refresh(rctx)
								cancel()
							}
							time.Sleep(rand.N(5 * time.Millisecond))
						}
					}
					switch rand.IntN(3) {
					case 0:
						actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
						s, err := l.Acquire(actx, key)
						cancel()
						if err == nil {
							hold(s)
							_ = s.Release(ctx)
						}
					case 1:
						s, err := l.TryAcquire(ctx, key)
						if err == nil {
							hold(s)
							_ = s.Release(ctx)
						} else {
							time.Sleep(time.Millisecond)
						}
					case 2:
						actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
						_ = Do(actx, l, key, func(ctx context.Context) error {
							hold(LeaseFromContext(ctx))
							return nil
						})
						cancel()
					}
				}
			}()
		}
	}
	wg.Wait()
	for _, c := range chaos {
		c.on.Store(false)
	}
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for _, ls := range leases {
		n += len(ls)
	}
	t.Logf("%d leases handed out", n)
	if len(viol) > 0 {
		t.Fatalf("%d violations, first: %s", len(viol), viol[0])
	}
}

// lateAcquireLocks holds back the answer of the next successful acquire
// (the write applies at once) after telling the test it applied.
type lateAcquireLocks struct {
	driver.Locks
	failReleases atomic.Int32 // fail this many releases before they reach the store
	armed        atomic.Bool
	delay        time.Duration
	applied      chan driver.LockRecord
}

func (f *lateAcquireLocks) Release(ctx context.Context, key, owner string, token int64) (bool, error) {
	if f.failReleases.Add(-1) >= 0 {
		return false, errAdv
	}
	return f.Locks.Release(ctx, key, owner, token)
}

func (f *lateAcquireLocks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	rec, ok, err := f.Locks.Acquire(ctx, key, owner, ttl)
	if err == nil && ok && f.armed.CompareAndSwap(true, false) {
		f.applied <- rec
		time.Sleep(f.delay)
	}
	return rec, ok, err
}

// VIOLATION (exclusion and token uniqueness). A lease lost at its local
// deadline is recorded as a stale holding and lets the Locker's next
// waiter in; the waiter's acquire renews the still-live store holding
// (same owner: same token). If the lost lease's Release — exactly what
// lock.Do's deferred release does after fn overran the deadline — ends
// that holding in the store and clears the stale record while the
// waiter's acquire is in flight, the waiter's answer finds no stale
// record and is handed out as a new lease with the old token, on a
// holding the store has already released. Another Locker then takes the
// key while the new lease reports itself held until its deadline.
//
// Interleaving (TTL 200 ms, ClockSkew 50 ms, auto-refresh off; Locker A,
// waiter W in A, Locker B):
//
//	t0        L1 = A.Acquire(k): token T, store expiry t0+200
//	          W = A.Acquire(k) queues behind L1
//	t0+150    L1's deadline: lose → stale[k]=T, W woken
//	t0+150    W's store acquire: T is live and A's → renewed, token T
//	          (answer in flight for 30 ms)
//	t0+151    L1.Release: store release of T succeeds → clearStale(k, T)
//	t0+152    B.TryAcquire(k) → token T+1
//	t0+180    W's answer: acquired, token T; stale[k] is gone → W gets a
//	          lease with token T, deadline t0+300, while B holds T+1.
func TestAdversarialLostReleaseRacesWaiterRenewal(t *testing.T) {
	const ttl = 200 * time.Millisecond
	db := testkit.DBName(t)
	f := &lateAcquireLocks{delay: 30 * time.Millisecond, applied: make(chan driver.LockRecord, 1)}
	a := openEnv(t, db, func(d driver.Store) driver.Store {
		f.Locks = d.Locks()
		return &advStore{Store: d, locks: f}
	}).locker(t, &Options{TTL: ttl, ClockSkew: 50 * time.Millisecond, DisableAutoRefresh: true})
	b := openEnv(t, db, nil).locker(t, &Options{TTL: ttl, DisableAutoRefresh: true})
	ctx := context.Background()

	l1, err := a.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	f.armed.Store(true)
	type res struct {
		s   *Lease
		err error
	}
	got := make(chan res, 1)
	go func() {
		s, err := a.Acquire(ctx, "k")
		got <- res{s, err}
	}()
	var renewed driver.LockRecord
	select {
	case renewed = <-f.applied: // W's acquire applied, its answer in flight
	case r := <-got:
		t.Fatalf("the waiter's Acquire returned (%v, token %d) without its acquire applying", r.err, tokenOf(r.s))
	}
	if renewed.Token != l1.Token() {
		t.Skipf("the waiter's acquire came after the store let the holding lapse (token %d, not %d): no race this time", renewed.Token, l1.Token())
	}
	if rerr := l1.Release(ctx); !errors.Is(rerr, ErrLeaseLost) {
		t.Fatalf("Release of the lost lease = %v", rerr)
	}
	s2, err := b.TryAcquire(ctx, "k")
	if errors.Is(err, ErrLocked) {
		// The release waited for the waiter's acquire, which found the
		// holding stale and took a token of its own: B is refused.
		r := <-got
		if r.err != nil || r.s.Token() <= l1.Token() || r.s.Err() != nil {
			t.Fatalf("B refused, but the waiter got %v (token %d, Err %v) after the lost lease's token %d", r.err, tokenOf(r.s), errOf(r.s), l1.Token())
		}
		_ = r.s.Release(ctx)
		return
	}
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	defer s2.Release(ctx)
	r := <-got
	if r.err != nil {
		t.Logf("waiter: %v (no violation)", r.err)
		return
	}
	defer r.s.Release(ctx)
	var msgs []string
	if r.s.Token() == l1.Token() {
		msgs = append(msgs, fmt.Sprintf("the waiter's lease has the lost lease's token %d", l1.Token()))
	}
	if r.s.Err() == nil && s2.Err() == nil {
		msgs = append(msgs, fmt.Sprintf("the waiter's lease (token %d, deadline %v) reports itself held while Locker B holds the key with token %d",
			r.s.Token(), r.s.Deadline().Format("15:04:05.000"), s2.Token()))
	}
	if len(msgs) > 0 {
		t.Fatal(strings.Join(msgs, "; "))
	}
}

// stubbornLocks answers Refresh and Get late, ignoring the caller's
// context (a driver that does not honour cancellation): the write applies
// at once, the answer comes `delay` later. failRefresh makes the refresh
// answer an error (after applying), so that the read-back decides. With
// hold set, Refresh instead answers only once hold is closed, and says it
// has applied by closing entered.
type stubbornLocks struct {
	driver.Locks
	delay       atomic.Int64
	failRefresh atomic.Bool
	hold        chan struct{}
	entered     chan struct{}
	enterOnce   sync.Once
}

func (f *stubbornLocks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	rec, ok, err := f.Locks.Refresh(context.WithoutCancel(ctx), key, owner, token, ttl)
	if f.hold != nil {
		f.enterOnce.Do(func() { close(f.entered) })
		<-f.hold
		return rec, ok, err
	}
	if f.failRefresh.Load() {
		return driver.LockRecord{}, false, errAdv
	}
	time.Sleep(time.Duration(f.delay.Load()))
	return rec, ok, err
}

func (f *stubbornLocks) Get(ctx context.Context, key string) (driver.LockRecord, bool, error) {
	rec, ok, err := f.Locks.Get(context.WithoutCancel(ctx), key)
	time.Sleep(time.Duration(f.delay.Load()))
	return rec, ok, err
}

// HOLDS. A successful refresh (or a read-back proving one applied)
// answered after the lease's deadline, by a driver that ignores
// cancellation, does not revive the lease: Refresh reports ErrLeaseLost,
// the context stays done with ErrLeaseLost, and the deadline does not
// move.
func TestAdversarialLateRefreshNeverRevives(t *testing.T) {
	const ttl = 40 * time.Millisecond
	for _, readBack := range []bool{false, true} {
		f := &stubbornLocks{}
		l := openEnv(t, testkit.DBName(t), func(d driver.Store) driver.Store {
			f.Locks = d.Locks()
			return &advStore{Store: d, locks: f}
		}).shortLocker(t, &Options{TTL: ttl, DisableAutoRefresh: true})
		ctx := context.Background()
		s, err := l.TryAcquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		before := s.Deadline()
		f.delay.Store(int64(ttl))
		f.failRefresh.Store(readBack)
		err = s.Refresh(ctx)
		if !errors.Is(err, ErrLeaseLost) || s.Err() != ErrLeaseLost || context.Cause(s.Context()) != ErrLeaseLost {
			t.Fatalf("read-back=%v: late Refresh = %v; Err %v; cause %v", readBack, err, s.Err(), context.Cause(s.Context()))
		}
		if s.Deadline() != before {
			t.Fatalf("read-back=%v: a late answer moved the deadline from %v to %v", readBack, before, s.Deadline())
		}
		select {
		case <-s.Done():
		default:
			t.Fatalf("read-back=%v: Done open after a late answer", readBack)
		}
	}
}

// HOLDS. Close while background refreshes are in flight (answers held
// back 15 ms) and Acquire calls are waiting: every lease ends (cause
// ErrReleased or ErrLeaseLost), the waiters get ErrClosed, no later
// refresh revives anything, and -race sees no race.
func TestAdversarialCloseDuringRefresh(t *testing.T) {
	const ttl = 30 * time.Millisecond
	f := &timedLocks{}
	e := openEnv(t, testkit.DBName(t), wrapTimed(f))
	l, err := newLocker(e.st, &Options{TTL: ttl, RefreshInterval: 2 * time.Millisecond}, deadline.MinTTL)
	if err != nil {
		t.Fatal(err)
	}
	f.refreshDelay.Store(int64(15 * time.Millisecond))
	ctx := context.Background()
	var leases []*Lease
	for i := range 50 {
		s, err := l.TryAcquire(ctx, fmt.Sprint("k", i))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, s)
	}
	type waited struct {
		s   *Lease
		err error
	}
	waits := make(chan waited, 10)
	for i := range 10 {
		go func() {
			s, err := l.Acquire(ctx, fmt.Sprint("k", i))
			waits <- waited{s, err}
		}()
	}
	time.Sleep(8 * time.Millisecond) // refreshes in flight
	_ = l.Close()
	for range 10 {
		// A waiter either got ErrClosed, or — its key's lease lost at its
		// deadline before Close (a loaded machine delays refreshes) — a
		// lease that Close then ended.
		w := <-waits
		if w.err == nil {
			if w.s.Err() == nil {
				t.Fatalf("a lease a waiter got is still live after Close")
			}
			continue
		}
		if !errors.Is(w.err, ErrClosed) {
			t.Fatalf("waiting Acquire after Close = %v", w.err)
		}
	}
	time.Sleep(20 * time.Millisecond) // the in-flight refreshes answer
	if recs, err := e.st.Locks().List(ctx, "*"); err != nil || len(recs) > 0 {
		t.Fatalf("after Close the store still has %d holdings (%v)", len(recs), err)
	}
	for i, s := range leases {
		c := context.Cause(s.Context())
		if s.Err() == nil || (c != ErrReleased && c != ErrLeaseLost) {
			t.Fatalf("lease %d after Close: Err %v, cause %v", i, s.Err(), c)
		}
	}
}

// VIOLATION, same race as TestAdversarialLostReleaseRacesWaiterRenewal
// without any deadline involved: Release's documented retry ("if the
// store could not be told … calling Release again retries").
//
//	L1.Release #1: the store cannot be told → L1 ends locally, stale[k]=T,
//	               the waiter W of the same Locker is let in
//	W's acquire renews T in the store (same owner); answer in flight
//	L1.Release #2: the store releases T → clearStale(k, T)
//	B.TryAcquire(k) → T+1
//	W's answer: acquired T, no stale record → a lease with token T on a
//	            holding the store released; it reports itself held while
//	            B holds the key.
func TestAdversarialReleaseRetryRacesWaiterRenewal(t *testing.T) {
	const ttl = 200 * time.Millisecond
	db := testkit.DBName(t)
	f := &lateAcquireLocks{delay: 30 * time.Millisecond, applied: make(chan driver.LockRecord, 1)}
	a := openEnv(t, db, func(d driver.Store) driver.Store {
		f.Locks = d.Locks()
		return &advStore{Store: d, locks: f}
	}).locker(t, &Options{TTL: ttl, DisableAutoRefresh: true})
	b := openEnv(t, db, nil).locker(t, &Options{TTL: ttl, DisableAutoRefresh: true})
	ctx := context.Background()
	l1, err := a.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lease, 1)
	go func() {
		s, err := a.Acquire(ctx, "k")
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	for queueLen(a, "k") == 0 {
		time.Sleep(time.Millisecond)
	}
	f.armed.Store(true)
	f.failReleases.Store(1)
	if err := l1.Release(ctx); err == nil {
		t.Fatal("the first Release should have failed")
	}
	renewed := <-f.applied
	if renewed.Token != l1.Token() {
		t.Fatalf("the waiter's acquire got token %d, want the renewal of %d", renewed.Token, l1.Token())
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatalf("Release retry: %v", err)
	}
	s2, err := b.TryAcquire(ctx, "k")
	if errors.Is(err, ErrLocked) {
		// The release waited for the waiter's acquire, which found the
		// holding stale and took a token of its own: B is refused.
		w := <-got
		if w == nil || w.Token() <= l1.Token() || w.Err() != nil {
			t.Fatalf("B refused, but the waiter got token %d (Err %v) after the lost lease's token %d", tokenOf(w), errOf(w), l1.Token())
		}
		_ = w.Release(ctx)
		return
	}
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	defer s2.Release(ctx)
	w := <-got
	if w == nil {
		return
	}
	defer w.Release(ctx)
	if w.Token() == l1.Token() || (w.Err() == nil && s2.Err() == nil) {
		t.Fatalf("the waiter's lease has token %d (released lease's: %d) and Err %v while Locker B holds the key with token %d",
			w.Token(), l1.Token(), w.Err(), s2.Token())
	}
}

// HOLDS (contrast with idempotency's TestAdversarialHungRenewalKeepsDoneOpen).
// A background refresh stuck in a driver that ignores cancellation does
// not hold the lease's Done open: the schedule's timer ends the lease at
// its deadline whatever its refresh is doing, without anyone calling Err.
//
// The background refresh hangs in the driver until the test lets it go,
// after Done has closed: Done closing at all shows that it does not wait
// for the refresh. (How soon after the deadline it closes is the
// runtime's timer latency: a benchmark's matter, not a test's.)
func TestAdversarialHungRefreshStillEndsAtDeadline(t *testing.T) {
	const ttl = 60 * time.Millisecond
	f := &stubbornLocks{hold: make(chan struct{}), entered: make(chan struct{})}
	l := openEnv(t, testkit.DBName(t), func(d driver.Store) driver.Store {
		f.Locks = d.Locks()
		return &advStore{Store: d, locks: f}
	}).shortLocker(t, &Options{TTL: ttl})
	s, err := l.TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer close(f.hold)
	<-f.entered // the first background refresh applied and hangs
	dl := s.Deadline()
	<-s.Done() // never, if Done waited for the refresh
	if now := time.Now(); now.Before(dl) {
		t.Fatalf("Done closed at %v, before the deadline %v", now, dl)
	}
	if s.Deadline() != dl {
		t.Fatalf("the deadline moved from %v to %v while the refresh hung", dl, s.Deadline())
	}
	if cause := context.Cause(s.Context()); cause != ErrLeaseLost {
		t.Fatalf("cause %v, want ErrLeaseLost", cause)
	}
}

// VIOLATION, TestAdversarialLostReleaseRacesWaiterRenewal's race through
// lock.Do, the way it happens in production: fn overruns the lease, sees
// ctx.Done() at the deadline and winds down; the same instant the lease's
// loss lets the Locker's next waiter in, whose acquire renews the
// still-live holding (same token). Do's deferred Release then ends that
// holding in the store and clears the stale record while the waiter's
// answer is in flight (one store round trip). The waiter's lease has
// the old token on a released holding; Locker B takes the key meanwhile.
func TestAdversarialDoOverrunRacesWaiterRenewal(t *testing.T) {
	const ttl = 200 * time.Millisecond
	db := testkit.DBName(t)
	f := &lateAcquireLocks{delay: 30 * time.Millisecond, applied: make(chan driver.LockRecord, 1)}
	a := openEnv(t, db, func(d driver.Store) driver.Store {
		f.Locks = d.Locks()
		return &advStore{Store: d, locks: f}
	}).locker(t, &Options{TTL: ttl, ClockSkew: 50 * time.Millisecond, DisableAutoRefresh: true})
	b := openEnv(t, db, nil).locker(t, &Options{TTL: ttl, DisableAutoRefresh: true})
	ctx := context.Background()
	got := make(chan *Lease, 1)
	var token int64
	doErr := Do(ctx, a, "k", func(ctx context.Context) error {
		token = LeaseFromContext(ctx).Token()
		f.armed.Store(true)
		go func() {
			s, err := a.Acquire(context.Background(), "k")
			if err != nil {
				t.Error(err)
			}
			got <- s
		}()
		<-ctx.Done() // the lease is lost at its deadline: wind down
		<-f.applied  // (winding down takes as long as the waiter's acquire to reach the store)
		return ctx.Err()
	})
	if !errors.Is(doErr, ErrLeaseLost) {
		t.Fatalf("Do = %v, want ErrLeaseLost", doErr)
	}
	s2, err := b.TryAcquire(ctx, "k")
	if errors.Is(err, ErrLocked) {
		// The release waited for the waiter's acquire, which found the
		// holding stale and took a token of its own: B is refused.
		w := <-got
		if w == nil || w.Token() <= token || w.Err() != nil {
			t.Fatalf("B refused, but the waiter got token %d (Err %v) after the lost lease's token %d", tokenOf(w), errOf(w), token)
		}
		_ = w.Release(ctx)
		return
	}
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	defer s2.Release(ctx)
	w := <-got
	if w == nil {
		return
	}
	defer w.Release(ctx)
	if w.Token() == token || (w.Err() == nil && s2.Err() == nil) {
		t.Fatalf("the waiter's lease has token %d (Do's lease had %d) and Err %v while Locker B holds the key with token %d",
			w.Token(), token, w.Err(), s2.Token())
	}
}

// scriptLocks plays a script of refresh behaviours, one per call (the
// last one repeats): refNormal, refFail, or refLands — the caller gets an
// error at once while the write is still on its way and lands `delay`
// later (a request stuck on one pooled connection while the next goes
// through another).
type scriptLocks struct {
	driver.Locks
	delay  time.Duration
	mu     sync.Mutex
	script []int
	calls  int
	landed chan landing
}

const refLands = 100

// Get fails too from R4 on: after R3 (and its read-back) the Locker is
// cut off from the store.
func (f *scriptLocks) Get(ctx context.Context, key string) (driver.LockRecord, bool, error) {
	f.mu.Lock()
	cut := f.calls > 3
	f.mu.Unlock()
	if cut {
		return driver.LockRecord{}, false, errAdv
	}
	return f.Locks.Get(ctx, key)
}

func (f *scriptLocks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	f.mu.Lock()
	mode := f.script[min(f.calls, len(f.script)-1)]
	f.calls++
	f.mu.Unlock()
	switch mode {
	case refFail:
		return driver.LockRecord{}, false, errAdv
	case refLands:
		go func() {
			time.Sleep(f.delay)
			rec, ok, err := f.Locks.Refresh(context.Background(), key, owner, token, ttl)
			f.landed <- landing{time.Now(), rec, ok, err}
		}()
		return driver.LockRecord{}, false, errAdv
	}
	return f.Locks.Refresh(ctx, key, owner, token, ttl)
}

// VIOLATION, TestAdversarialReadBackCreditsAnOlderRefresh's bug with the
// background refresh alone (no caller timeouts), ending in a partition:
//
//	t1     R1 (background) fails at once; its write is still on its way;
//	       read-back shows nothing moved: unknown, pendingSince = t1
//	t1+~4  R2 (the retry) succeeds: prove(t2) clears pendingSince
//	t1+30  R1's write lands: store expiry t1+30+TTL
//	t3     R3 fails before reaching the store; read-back sees the moved
//	       expiry: prove(t3) → deadline t3+TTL−margin, past the store's
//	       expiry when t3 > t1+30+margin
//	       every later refresh fails (A is cut off from the store)
//	t1+30+TTL  Locker B takes the key; A's lease reports itself held
//	       until t3+TTL−margin.
func TestAdversarialReadBackCreditsAnOlderRefreshInBackground(t *testing.T) {
	const ttl = 300 * time.Millisecond
	db := testkit.DBName(t)
	f := &scriptLocks{delay: 30 * time.Millisecond, landed: make(chan landing, 1),
		script: []int{refLands, refNormal, refFail}}
	a := openEnv(t, db, func(d driver.Store) driver.Store {
		f.Locks = d.Locks()
		return &advStore{Store: d, locks: f}
	}).locker(t, &Options{TTL: ttl, RetryMin: 2 * time.Millisecond, RetryMax: 4 * time.Millisecond})
	b := openEnv(t, db, nil).locker(t, &Options{TTL: ttl, DisableAutoRefresh: true})
	ctx := context.Background()
	s, err := a.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	land := <-f.landed
	if !land.ok {
		t.Fatalf("R1's write: %+v", land)
	}
	for {
		s2, err := b.TryAcquire(ctx, "k")
		if errors.Is(err, ErrLocked) {
			time.Sleep(500 * time.Microsecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Release(ctx)
		if s.Err() == nil {
			t.Fatalf("Locker B acquired the key at %v (R1's expiry %v) while A's lease reports itself held until %v",
				time.Now().Format("05.000"), land.rec.ExpiresAt.Format("05.000"), s.Deadline().Format("05.000"))
		}
		f.mu.Lock()
		t.Logf("no violation this time: B got in at %v, R1's write landed at %v with expiry %v, A's deadline %v, %d refresh calls",
			time.Now().Format("05.000"), land.at.Format("05.000"), land.rec.ExpiresAt.Format("05.000"), s.Deadline().Format("05.000"), f.calls)
		f.mu.Unlock()
		return
	}
}

func tokenOf(s *Lease) int64 {
	if s == nil {
		return 0
	}
	return s.Token()
}

func errOf(s *Lease) error {
	if s == nil {
		return errors.New("no lease")
	}
	return s.Err()
}
