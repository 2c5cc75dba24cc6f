package lock

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/deadline"
	"github.com/warden-go/warden/internal/owner"
	"github.com/warden-go/warden/internal/valid"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrLocked: TryAcquire found the key held by someone else (possibly
	// another Lease of the same Locker). The error is a *HeldError that
	// names the holder.
	ErrLocked = errors.New("lock: locked")
	// ErrNotHeld: Release found that the lease was no longer held — it was
	// lost (expired and taken over, force-released, or not provably held
	// in time) before it was released.
	ErrNotHeld = errors.New("lock: not held")
	// ErrLeaseLost: the lease ended because it could no longer be proven
	// held: a refresh was refused, or none succeeded before the local
	// deadline. It is the cause (context.Cause) of a lost lease's context.
	// It is warden.ErrLeaseLost, shared with idempotency.
	ErrLeaseLost = warden.ErrLeaseLost
	// ErrReleased: the lease ended because it was released (by
	// Lease.Release, Do returning, or Locker.Close). It is the cause of a
	// released lease's context.
	ErrReleased = errors.New("lock: lease released")
	// ErrClosed: the Locker (or its store) was closed. Pending and later
	// Acquire, TryAcquire and Watch calls return it. It is
	// warden.ErrClosed.
	ErrClosed = warden.ErrClosed
	// ErrStoreTooSlow: the store granted the lock, but its answers kept
	// arriving after the lease's deadline (the round trip took longer than
	// TTL − ClockSkew), so no lease could be handed out; the holding was
	// given back. TryAcquire returns it; a waiting Acquire keeps trying.
	// It is warden.ErrStoreTooSlow, shared with idempotency.
	ErrStoreTooSlow = warden.ErrStoreTooSlow
)

// HeldError is the error TryAcquire returns when the key is held. It
// matches ErrLocked with errors.Is; use errors.As to read the holder.
type HeldError struct {
	Key   string // the key asked for
	Owner string // the holder; this Locker's own Owner if another of its leases holds the key
	Token int64  // the holder's fencing token
	// ExpiresAt is when the holding lapses unless refreshed, on the store's
	// clock.
	ExpiresAt time.Time
}

// Error describes the holding.
func (e *HeldError) Error() string {
	return fmt.Sprintf("lock: %q is held by %q until %s", e.Key, e.Owner, e.ExpiresAt.UTC().Format(time.RFC3339Nano))
}

// Unwrap returns ErrLocked, so that errors.Is(err, ErrLocked) holds.
func (e *HeldError) Unwrap() error { return ErrLocked }

// Defaults of Options' zero values.
const (
	// DefaultTTL is the lease time-to-live when Options.TTL is zero.
	DefaultTTL = 30 * time.Second
	// DefaultRetryMin is the first back-off of a waiting Acquire when
	// Options.RetryMin is zero.
	DefaultRetryMin = 5 * time.Millisecond
	// DefaultRetryMax is the longest back-off of a waiting Acquire when
	// Options.RetryMax is zero.
	DefaultRetryMax = time.Second
	// DefaultPollInterval is how often Watch lists the locks of a store
	// without notifications when Options.PollInterval is zero.
	DefaultPollInterval = time.Second
	// MinClockSkew is the smallest safety margin a lease gets, whatever
	// Options.ClockSkew says: the coarsest store clock's granularity (one
	// millisecond) plus slack for the timer that closes a lease's Done
	// channel.
	MinClockSkew = deadline.MinMargin
	// MinTTL is the shortest TTL a Locker accepts. A lease is proven for
	// TTL − ClockSkew from each refresh's send time and refreshes itself
	// a third of the way through that window, so each refresh has the
	// other two thirds — about 63 ms at this TTL — for its timer to fire,
	// its goroutine to run and the store to answer. Shorter TTLs would
	// keep exclusion (the deadline rule needs only 2 × MinClockSkew) but
	// not the lease: a loaded CPU's time slice, a garbage collection or
	// one fsync on a busy disk outlasts a refresh's time at 10 ms.
	MinTTL = 100 * time.Millisecond
	// closeTimeout bounds the releases Close makes.
	closeTimeout = 5 * time.Second
	// minRefreshWorkers and maxRefreshWorkers bound the background
	// refreshes in flight at once (see Locker.schedule).
	minRefreshWorkers = 16
	maxRefreshWorkers = 1024
	// maxLateAnswers bounds how often one TryAcquire asks again when the
	// store's answers keep coming after the lease's deadline.
	maxLateAnswers = 3
)

// Options configure a Locker. The zero value (or nil) gives the documented
// defaults; New refuses negative durations, durations under one
// millisecond and a TTL under MinTTL.
type Options struct {
	// TTL is how long a holding lasts in the store unless refreshed.
	// 0: 30 seconds (DefaultTTL). At least MinTTL (100 ms).
	TTL time.Duration
	// Owner is a label for this Locker's holdings that operators read in
	// `warden lock ls`; "": hostname:pid. Every Locker adds a random
	// suffix of its own ("billing-cron#3f9a1c2b5d7e"), so two Lockers never
	// share a holding even when they are given the same label; Locker.Owner
	// returns the full identity.
	Owner string
	// RefreshInterval is how often a held lease renews itself in the
	// background (less up to a tenth at random, to spread refreshes).
	// 0: (TTL − ClockSkew)/3, a third of the time a refresh proves the
	// lease for, so that the next refresh has the other two thirds to be
	// answered. A value that leaves no time to refresh before the local
	// deadline (≥ TTL − ClockSkew) is reduced to that default.
	RefreshInterval time.Duration
	// RetryMin and RetryMax bound the jittered exponential back-off of a
	// waiting Acquire between two attempts (and of the retries of a failed
	// refresh). 0: 5 ms and 1 s. A RetryMax below RetryMin is raised to
	// RetryMin. A waiter never sleeps past the current holder's expiry,
	// and on stores with notifications it is woken at once by a release;
	// while the Locker's subscription to them is down (it failed to start,
	// or the store ended it), a waiter sleeps at most a second and the
	// subscription is started again.
	RetryMin, RetryMax time.Duration
	// ClockSkew is the safety margin subtracted from a lease's local
	// deadline (the local time the last successful acquire or refresh was
	// sent, plus TTL): the lease's context is cancelled that much before
	// the store could let another holder in, to allow for clocks running
	// at different rates, the store clock's granularity and timer slack.
	// 0: TTL/20, at most one second. Never below MinClockSkew (5 ms);
	// values above TTL/2 are reduced to TTL/2.
	ClockSkew time.Duration
	// DisableAutoRefresh turns background refreshing off: leases then last
	// one TTL unless Lease.Refresh is called. Their contexts are still
	// cancelled with ErrLeaseLost at the local deadline.
	DisableAutoRefresh bool
	// PollInterval is how often Watch lists the store's locks to find
	// changes when the store has no notifications. 0: one second
	// (DefaultPollInterval).
	PollInterval time.Duration
	// Observe, if set, is told of every acquisition, refresh, release
	// and loss of this Locker's leases (see Observation), for telemetry:
	// otelwarden.Telemetry.Lock is one. It is called after the fact, on
	// the goroutine that saw it — the caller's, or a refresh worker's —
	// with the call's context (the lease's for background refreshes and
	// losses) and no lock of the Locker held; a lost lease is reported
	// after its context was cancelled. It must be quick, safe for
	// concurrent use, and must neither panic nor call the Locker. Nil:
	// nothing is observed, at no cost.
	Observe func(ctx context.Context, o Observation)
}

// Locker takes distributed locks on one store for one owner. Its methods
// are safe for concurrent use. A Locker owns the background work of its
// leases and watches; Close stops all of it.
//
// Within one Locker, waiters for the same key are served in FIFO order
// and only the first of them asks the store, so a thousand goroutines
// waiting for one key cost one store request per back-off step, not a
// thousand. Leases of one Locker are not re-entrant: Acquire of a key the
// same Locker holds waits until that lease ends.
type Locker struct {
	st    *warden.Store
	locks *warden.Locks
	log   *slog.Logger
	owner string

	ttl, refresh, skew time.Duration
	retryMin, retryMax time.Duration
	poll               time.Duration
	autoRefresh        bool
	canWatch           bool
	observe            func(context.Context, Observation)

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	mu        sync.Mutex
	closed    bool
	keys      map[string]*keyState
	stale     map[string]staleHolding
	staleScan int // size of stale after its last full prune
	sub       subState
	subRetry  time.Time // earliest restart of a failed subscription
	// subUnsupported: the last subscription failed with an error matching
	// errors.ErrUnsupported (notifications cannot be had here: waiters poll).
	subUnsupported bool
	due            dueQueue       // leases waiting for a refresh worker, nearest deadline first
	workers        int            // refresh workers running
	wg             sync.WaitGroup // background goroutines

	schedMu    sync.Mutex // guards sched, schedTimer and every lease's at and idx
	sched      schedule
	schedTimer *time.Timer
}

// keyState is what a Locker knows about one key it holds or waits for.
// It is guarded by Locker.mu and dropped when empty.
type keyState struct {
	held  *Lease    // the Locker's lease on the key, or nil
	queue []*waiter // Acquire calls waiting, FIFO; only queue[0] asks the store
	busy  bool      // a store acquire for the key is in flight
	idle  chan struct{}
	// freed is when the Locker's last lease on the key ended while
	// Acquire calls waited (only with Options.Observe: hand-off times).
	freed time.Time
}

// waiter is one waiting Acquire call.
type waiter struct {
	wake chan struct{} // capacity 1: "look again"
}

// staleHolding remembers a holding of this Locker that ended locally
// without the store confirming it (a lease lost at its deadline, a release
// that failed). If the store still has it, a new acquire by the same owner
// would renew it and get its token again; the Locker releases it first so
// that every Lease gets a token of its own.
type staleHolding struct {
	token int64
	until time.Time // after this the store has surely let it lapse
}

type subState int

const (
	subNone subState = iota
	subStarting
	subRunning
)

// New returns a Locker on st (nil opts: defaults). It starts no goroutine;
// the store's notifications are subscribed to on first need. It returns
// an error matching warden.ErrInvalidArgument for a nil store, a negative
// duration or one under a millisecond, or a TTL under MinTTL, and
// warden.ErrInvalidKey for an Owner that cannot be stored.
func New(st *warden.Store, opts *Options) (*Locker, error) {
	return newLocker(st, opts, MinTTL)
}

// newLocker is New accepting TTLs down to minTTL. The package's tests of
// the deadline rule use TTLs down to deadline.MinTTL, where the rule still
// keeps exclusion and leases are lost often — what those tests are after.
func newLocker(st *warden.Store, opts *Options, minTTL time.Duration) (*Locker, error) {
	if opts == nil {
		opts = &Options{}
	}
	if st == nil {
		return nil, valid.Nil("lock", "store")
	}
	if err := valid.Durations("lock", valid.D{Name: "TTL", V: opts.TTL}, valid.D{Name: "RefreshInterval", V: opts.RefreshInterval},
		valid.D{Name: "ClockSkew", V: opts.ClockSkew}, valid.D{Name: "RetryMin", V: opts.RetryMin},
		valid.D{Name: "RetryMax", V: opts.RetryMax}, valid.D{Name: "PollInterval", V: opts.PollInterval}); err != nil {
		return nil, err
	}
	if opts.TTL != 0 && opts.TTL < minTTL {
		return nil, fmt.Errorf("lock: %w: TTL %v is under the minimum of %v: so short a lease is lost to ordinary scheduling and store delays", warden.ErrInvalidArgument, opts.TTL, minTTL)
	}
	l := &Locker{
		st:          st,
		locks:       st.Locks(),
		log:         st.Logger(),
		owner:       owner.ID(opts.Owner),
		ttl:         opts.TTL,
		refresh:     opts.RefreshInterval,
		retryMin:    opts.RetryMin,
		retryMax:    opts.RetryMax,
		poll:        opts.PollInterval,
		autoRefresh: !opts.DisableAutoRefresh,
		observe:     opts.Observe,
		keys:        map[string]*keyState{},
		stale:       map[string]staleHolding{},
	}
	if err := warden.ValidateKey(l.owner); err != nil {
		return nil, fmt.Errorf("lock: owner: %w", err)
	}
	l.canWatch = l.locks.CanWatch()
	if l.ttl == 0 {
		l.ttl = DefaultTTL
	}
	l.skew = deadline.Margin(l.ttl, opts.ClockSkew)
	if l.refresh == 0 || l.refresh >= l.ttl-l.skew {
		// A third of the window a refresh proves, not of the TTL: the
		// margin can take up to half the TTL, and TTL/3 then left the
		// refresh a sixth of the TTL to be answered in.
		l.refresh = (l.ttl - l.skew) / 3
	}
	l.refresh = max(l.refresh, time.Millisecond)
	if l.retryMin == 0 {
		l.retryMin = DefaultRetryMin
	}
	if l.retryMax == 0 {
		l.retryMax = DefaultRetryMax
	}
	l.retryMax = max(l.retryMax, l.retryMin)
	if l.poll == 0 {
		l.poll = DefaultPollInterval
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l, nil
}

// Owner returns the identity this Locker's holdings carry in the store.
func (l *Locker) Owner() string { return l.owner }

// TTL returns the lease time-to-live in use.
func (l *Locker) TTL() time.Duration { return l.ttl }

// Close stops everything the Locker owns: it releases every lease still
// held (their contexts end with ErrReleased; releases are bounded to a
// few seconds in all), makes pending Acquire calls return ErrClosed, ends
// the Locker's store subscription and closes the channels of its watches.
// It does not close the store. It returns the releases' errors, if any,
// and is idempotent.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.cancel()
	l.due = nil
	var held []*Lease
	for _, ks := range l.keys {
		if ks.held != nil {
			held = append(held, ks.held)
		}
	}
	l.mu.Unlock()
	l.stopSchedule()

	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	var first error
	failed := 0
	for _, s := range held {
		if err := s.Release(ctx); err != nil && !errors.Is(err, ErrNotHeld) {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	l.wg.Wait()
	if first != nil {
		return fmt.Errorf("lock: close: %d of %d leases not released in the store (they lapse at their expiry): %w", failed, len(held), first)
	}
	return nil
}

// state returns key's state, creating it; l.mu must be held.
func (l *Locker) state(key string) *keyState {
	ks := l.keys[key]
	if ks == nil {
		ks = &keyState{}
		l.keys[key] = ks
	}
	return ks
}

// holder returns the lease of this Locker that holds key, or nil; l.mu
// must be held. A lease already lost — its context done with ErrLeaseLost
// (at its deadline, by the clock) — but not yet detached by its loss
// handling is detached here and recorded as a stale holding, so that the
// Locker can take the key again at once and still never reuse its token.
func (l *Locker) holder(key string, ks *keyState) *Lease {
	s := ks.held
	if s == nil || s.ctx.Err() == nil || context.Cause(s.ctx) != ErrLeaseLost {
		return s
	}
	l.addStale(key, s.token)
	ks.held = nil
	return nil
}

// gc drops key's state if nothing refers to it; l.mu must be held.
func (l *Locker) gc(key string, ks *keyState) {
	if ks.held == nil && len(ks.queue) == 0 && !ks.busy && l.keys[key] == ks {
		delete(l.keys, key)
	}
}

// endBusy ends a store attempt on ks; l.mu must be held.
func (ks *keyState) endBusy() {
	ks.busy = false
	if ks.idle != nil {
		close(ks.idle)
		ks.idle = nil
	}
}

func wake(w *waiter) {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// wakeHead tells the first waiter of ks to look again; l.mu must be held.
func (ks *keyState) wakeHead() {
	if len(ks.queue) > 0 {
		wake(ks.queue[0])
	}
}

// callCtx derives a context from ctx that also ends, with cause ErrClosed,
// when the Locker closes.
func (l *Locker) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.ctx, func() { cancel(ErrClosed) })
	return cctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// doneErr is the error of a call whose derived context cctx ended: ErrClosed
// if the Locker closed, otherwise the caller's context error, joined with
// the last store error seen while waiting, if any.
func doneErr(ctx, cctx context.Context, lastErr error) error {
	if ctx.Err() == nil && context.Cause(cctx) == ErrClosed {
		return ErrClosed
	}
	err := ctx.Err()
	if err == nil {
		err = cctx.Err()
	}
	if lastErr != nil {
		return fmt.Errorf("%w (last store error: %w)", err, lastErr)
	}
	return err
}

// permanent reports errors that retrying cannot cure.
func permanent(err error) bool {
	return errors.Is(err, warden.ErrInvalidKey) || errors.Is(err, warden.ErrInvalidArgument) ||
		errors.Is(err, warden.ErrInvalidPattern) || errors.Is(err, warden.ErrClosed) ||
		errors.Is(err, errors.ErrUnsupported) || errors.Is(err, ErrClosed)
}

// backoff is the n-th (from 0) jittered exponential delay between RetryMin
// and RetryMax: a random duration in [d/2, d] with d = RetryMin·2ⁿ capped
// at RetryMax.
func (l *Locker) backoff(n int) time.Duration {
	d := l.retryMin
	for i := 0; i < n && d < l.retryMax; i++ {
		d *= 2
	}
	d = min(d, l.retryMax)
	half := d / 2
	return half + rand.N(d-half+1)
}

// Acquire takes key, waiting as long as it is held by someone else, until
// ctx ends (it returns ctx.Err(), wrapped with the last store error if the
// store was failing) or the Locker closes (ErrClosed).
//
// While waiting, the first waiter of the key in this Locker asks the store
// again after a jittered exponential back-off between RetryMin and
// RetryMax that never runs past the holder's expiry, and at once when the
// store's notifications report that the key was released. On a store
// that queues waiters itself (driver.LockWaiter: MySQL, SQLite, Redis,
// DynamoDB, MongoDB) it waits in that queue instead, woken the moment the
// key is released, in the order the waiters of every process queued.
// Other waiters of the key in this Locker wait their turn in FIFO order without asking
// the store. Transient store errors are retried the same way; invalid
// arguments and a closed store are returned at once.
//
// The lease's context carries ctx's values but not its cancellation: the
// lease lives until released or lost.
func (l *Locker) Acquire(ctx context.Context, key string) (*Lease, error) {
	if l.observe == nil {
		return l.acquire(ctx, key, nil)
	}
	tr := &acquireTrace{start: time.Now()}
	s, err := l.acquire(ctx, key, tr)
	l.observeAcquire(ctx, key, s, err, tr)
	return s, err
}

// acquire is Acquire; tr, if not nil, collects what it sees for its
// ObservedAcquire.
func (l *Locker) acquire(ctx context.Context, key string, tr *acquireTrace) (*Lease, error) {
	cctx, cancel := l.callCtx(ctx)
	defer cancel()
	w := &waiter{wake: make(chan struct{}, 1)}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	ks := l.state(key)
	ks.queue = append(ks.queue, w)
	l.mu.Unlock()
	defer l.leave(key, ks, w)
	var waited bool // asked the store's queue (wait.go)
	defer func() {
		if waited {
			l.leaveTurn(key)
		}
	}()

	var (
		timer    *time.Timer
		attempts int
		lastErr  error
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		// Wait for this waiter's turn: first in line, key not held by
		// this Locker, no other attempt in flight.
		l.mu.Lock()
		for ks.queue[0] != w || l.holder(key, ks) != nil || ks.busy {
			if tr != nil {
				tr.contended = true
				if ks.held != nil {
					tr.holder = l.owner
				}
			}
			l.mu.Unlock()
			select {
			case <-w.wake:
			case <-cctx.Done():
				return nil, doneErr(ctx, cctx, lastErr)
			}
			l.mu.Lock()
		}
		ks.busy = true
		l.mu.Unlock()
		select {
		case <-w.wake: // anything signalled so far is answered by this attempt
		default:
		}

		rec, acquired, sent, err := l.attempt(cctx, key)

		l.mu.Lock()
		ks.endBusy()
		if !acquired {
			ks.freed = time.Time{} // the next holder is not ours: no hand-off to measure
		}
		if acquired {
			if l.closed {
				l.mu.Unlock()
				l.releaseOrphan(ctx, key, rec.Token)
				return nil, ErrClosed
			}
			s := l.newLease(ctx, key, rec, sent)
			ks.held = s
			if tr != nil && !ks.freed.IsZero() {
				tr.handOff = s.acquired.Sub(ks.freed)
			}
			ks.freed = time.Time{}
			l.mu.Unlock()
			return s, nil
		}
		l.mu.Unlock()
		if tr != nil && err == nil {
			tr.contended, tr.holder = true, rec.Owner
		}

		if err != nil {
			if cctx.Err() != nil {
				return nil, doneErr(ctx, cctx, lastErr)
			}
			if permanent(err) {
				return nil, err
			}
			lastErr = err
		}
		// Start the store's notifications if they are not running; once
		// they do, this waiter is woken to look again.
		l.subscribe()
		if err == nil && l.waitTurn(cctx, key, rec, attempts, &waited) {
			attempts++
			continue
		}
		delay := l.backoff(attempts)
		attempts++
		if err == nil && !rec.ExpiresAt.IsZero() {
			// Never sleep past the holder's expiry (plus a millisecond for
			// the store's rounding). An expiry already in our past — the
			// store's clock lags ours, or the holder is being renewed —
			// leaves the back-off as it is: it must not turn the wait
			// into a busy loop.
			if until := time.Until(rec.ExpiresAt); until > 0 {
				delay = min(delay, until+time.Millisecond)
			}
		}
		if l.subscriptionDown() {
			// No release will wake this waiter until the subscription
			// runs again: look (and subscribe) again soon.
			delay = min(delay, subRetryMax)
		}
		if timer == nil {
			timer = time.NewTimer(delay)
		} else {
			timer.Reset(delay)
		}
		select {
		case <-w.wake:
		case <-timer.C:
		case <-cctx.Done():
			return nil, doneErr(ctx, cctx, lastErr)
		}
	}
}

// leave removes w from key's queue; if w was first, the next waiter takes
// its turn.
func (l *Locker) leave(key string, ks *keyState, w *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, x := range ks.queue {
		if x == w {
			copy(ks.queue[i:], ks.queue[i+1:])
			ks.queue[len(ks.queue)-1] = nil
			ks.queue = ks.queue[:len(ks.queue)-1]
			if i == 0 {
				ks.wakeHead()
			}
			break
		}
	}
	if len(ks.queue) == 0 {
		ks.queue = nil
	}
	l.gc(key, ks)
}

// TryAcquire makes one attempt to take key. If someone holds it — another
// owner, or another lease of this Locker — it returns a *HeldError that
// matches ErrLocked and names the holder. TryAcquire does not queue: it
// may take a key that Acquire calls of this Locker are waiting for.
func (l *Locker) TryAcquire(ctx context.Context, key string) (*Lease, error) {
	if l.observe == nil {
		return l.tryAcquire(ctx, key)
	}
	tr := &acquireTrace{start: time.Now()}
	s, err := l.tryAcquire(ctx, key)
	var held *HeldError
	if errors.As(err, &held) {
		tr.contended, tr.holder = true, held.Owner
	}
	l.observeAcquire(ctx, key, s, err, tr)
	return s, err
}

// tryAcquire is TryAcquire.
func (l *Locker) tryAcquire(ctx context.Context, key string) (*Lease, error) {
	cctx, cancel := l.callCtx(ctx)
	defer cancel()
	l.mu.Lock()
	// Another attempt on the key in flight: wait for its outcome.
	ks, err := l.idleState(key, cctx.Done(), func(ks *keyState) error {
		if l.closed {
			return ErrClosed
		}
		if s := l.holder(key, ks); s != nil {
			return &HeldError{Key: key, Owner: l.owner, Token: s.token, ExpiresAt: s.ExpiresAt()}
		}
		return nil
	})
	if err != nil {
		l.mu.Unlock()
		if err == errWaitEnded {
			err = doneErr(ctx, cctx, nil)
		}
		return nil, err
	}
	ks.busy = true
	l.mu.Unlock()

	rec, acquired, sent, err := l.attempt(cctx, key)

	l.mu.Lock()
	ks.endBusy()
	ks.wakeHead()
	if acquired && !l.closed {
		s := l.newLease(ctx, key, rec, sent)
		ks.held = s
		ks.freed = time.Time{}
		l.mu.Unlock()
		return s, nil
	}
	closed := l.closed
	l.gc(key, ks)
	l.mu.Unlock()
	switch {
	case acquired:
		l.releaseOrphan(ctx, key, rec.Token)
		return nil, ErrClosed
	case err != nil:
		if cctx.Err() != nil {
			return nil, doneErr(ctx, cctx, nil)
		}
		return nil, err
	case closed:
		return nil, ErrClosed
	}
	return nil, &HeldError{Key: key, Owner: rec.Owner, Token: rec.Token, ExpiresAt: rec.ExpiresAt}
}

// attempt makes one store acquire of key. sent is the local time the
// successful request was sent. If the store hands back a holding this
// Locker lost track of (see staleHolding), it is released and taken anew,
// so that the new lease has a token of its own.
//
// An answer that arrives after the lease's deadline (sent + TTL −
// ClockSkew) is no use: the holding may have lapsed in the store already.
// attempt then asks again — while the holding is still ours the store
// renews it and keeps its token — so that no lease is handed out past its
// deadline. After maxLateAnswers late answers in a row it gives up with
// an error that says so, giving the holding back.
func (l *Locker) attempt(ctx context.Context, key string) (rec driver.LockRecord, acquired bool, sent time.Time, err error) {
	late := 0
	for {
		sent = time.Now()
		rec, acquired, err = l.locks.Acquire(ctx, key, l.owner, l.ttl)
		if err != nil {
			return rec, false, sent, err
		}
		if acquired && !time.Now().Before(sent.Add(l.ttl-l.skew)) {
			if late++; late < maxLateAnswers && ctx.Err() == nil {
				continue
			}
			l.releaseOrphan(ctx, key, rec.Token)
			return rec, false, sent, fmt.Errorf("lock: %q: %w: the store answered %d acquires in a row only after the lease's deadline (TTL %v less ClockSkew %v); the round trip is too slow for this TTL",
				key, ErrStoreTooSlow, late, l.ttl, l.skew)
		}
		l.mu.Lock()
		sh, ok := l.stale[key]
		isStale := ok && acquired && sh.token == rec.Token
		if ok && (sh.token != rec.Token || isStale) {
			// Either superseded by another holding or about to be ended.
			delete(l.stale, key)
		}
		l.mu.Unlock()
		if !isStale {
			return rec, acquired, sent, nil
		}
		if _, err := l.locks.Release(ctx, key, l.owner, rec.Token); err != nil {
			l.mu.Lock()
			l.stale[key] = sh
			l.mu.Unlock()
			return rec, false, sent, err
		}
	}
}

// exclusive runs f while no store acquire of key by this Locker is in
// flight, keeping new ones from starting until f returns. Releases of a
// holding the Locker lost track of (a stale holding) go through it: an
// acquire in flight may be renewing that very holding (the same owner
// re-acquiring keeps its token), and must find it still marked stale when
// its answer arrives, or it would hand out a lease on a holding the
// release has just ended, with a token another holder may get next. It
// returns ctx's error if ctx ends first (f is then not run).
func (l *Locker) exclusive(ctx context.Context, key string, f func()) error {
	l.mu.Lock()
	ks, err := l.idleState(key, ctx.Done(), nil)
	if err != nil {
		l.mu.Unlock()
		return ctx.Err()
	}
	ks.busy = true
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		ks.endBusy()
		ks.wakeHead()
		l.gc(key, ks)
		l.mu.Unlock()
	}()
	f()
	return nil
}

// errWaitEnded: idleState's done channel closed first.
var errWaitEnded = errors.New("lock: wait ended")

// idleState returns key's state once no store attempt of this Locker on
// the key is in flight. l.mu is held on entry and on return (it is
// released while waiting). check, if not nil, looks at the state each
// time before waiting and ends the wait with its error; a closed done
// ends it with errWaitEnded. The state is looked up afresh after every
// wait: one left empty meanwhile may have been dropped.
func (l *Locker) idleState(key string, done <-chan struct{}, check func(*keyState) error) (*keyState, error) {
	for {
		ks := l.state(key)
		if check != nil {
			if err := check(ks); err != nil {
				l.gc(key, ks)
				return nil, err
			}
		}
		if !ks.busy {
			return ks, nil
		}
		if ks.idle == nil {
			ks.idle = make(chan struct{})
		}
		idle := ks.idle
		l.mu.Unlock()
		select {
		case <-idle:
			l.mu.Lock()
		case <-done:
			l.mu.Lock()
			l.gc(key, ks)
			return nil, errWaitEnded
		}
	}
}

// releaseOrphan gives back a holding acquired after Close began.
func (l *Locker) releaseOrphan(ctx context.Context, key string, token int64) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	_, _ = l.locks.Release(rctx, key, l.owner, token)
}

// addStale records a holding that ended locally without the store's
// confirmation; l.mu must be held.
func (l *Locker) addStale(key string, token int64) {
	now := time.Now()
	l.stale[key] = staleHolding{token: token, until: now.Add(2 * l.ttl)}
	if len(l.stale) >= 64 && len(l.stale) >= 2*l.staleScan {
		for k, sh := range l.stale {
			if now.After(sh.until) {
				delete(l.stale, k)
			}
		}
		l.staleScan = len(l.stale)
	}
}

// refreshDelay is the time from one refresh to the next: RefreshInterval
// less up to a tenth, at random, so that leases taken together do not all
// refresh together.
func (l *Locker) refreshDelay() time.Duration {
	return l.refresh - rand.N(l.refresh/10+1)
}

// schedule queues a lease whose background refresh is due; the queue
// serves the nearest deadline first. Workers exit when the queue is
// empty, so an idle Locker has none.
func (l *Locker) schedule(s *Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return // Close releases the lease
	}
	heap.Push(&l.due, dueLease{s: s, at: s.ctx.When(), queued: time.Now()})
	l.addWorkers()
}

// addWorkers sizes the refresh work to the load; l.mu must be held. A
// fast store keeps minRefreshWorkers. When the most urgent queued
// refresh has waited longer than an eighth of the time a lease has
// between its refresh and its deadline, the refreshes come faster than
// the workers make them (slow round trips): every call then adds a
// worker — each refresh that ends adds one, so the count doubles about
// once per round trip — up to maxRefreshWorkers, never more than there
// are refreshes to make. Workers exit when the queue is empty, so the
// count falls back by itself. (Growing on a measured round trip instead
// would also grow on CPU starvation, where more workers only add
// contention; a waiting queue is the one sign that more help.)
func (l *Locker) addWorkers() {
	want := minRefreshWorkers
	if len(l.due) > 0 && time.Since(l.due[0].queued) > (l.ttl-l.skew-l.refresh)/8 {
		want = l.workers + 1
	}
	want = min(want, maxRefreshWorkers, l.workers+len(l.due))
	for l.workers < want {
		l.workers++
		l.wg.Add(1)
		go l.refreshWorker()
	}
}

// refreshWorker makes the queued background refreshes.
func (l *Locker) refreshWorker() {
	defer l.wg.Done()
	for {
		l.mu.Lock()
		if len(l.due) == 0 || l.closed {
			l.workers--
			l.mu.Unlock()
			return
		}
		s := heap.Pop(&l.due).(dueLease).s
		l.mu.Unlock()
		_ = s.refresh(s.ctx, true)
		l.mu.Lock()
		if !l.closed {
			l.addWorkers()
		}
		l.mu.Unlock()
	}
}

// dueLease is a lease waiting for a refresh worker, with its deadline when
// it was queued (it does not move while queued).
type dueLease struct {
	s      *Lease
	at     time.Time // the lease's deadline
	queued time.Time
}

// dueQueue is a min-heap of leases by deadline; guarded by Locker.mu.
type dueQueue []dueLease

func (q dueQueue) Len() int           { return len(q) }
func (q dueQueue) Less(i, j int) bool { return q[i].at.Before(q[j].at) }
func (q dueQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *dueQueue) Push(x any)        { *q = append(*q, x.(dueLease)) }
func (q *dueQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	old[len(old)-1] = dueLease{}
	*q = old[:len(old)-1]
	return x
}
