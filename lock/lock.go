package lock

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
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
	ErrLeaseLost = errors.New("lock: lease lost")
	// ErrReleased: the lease ended because it was released (by
	// Lease.Release, Do returning, or Locker.Close). It is the cause of a
	// released lease's context.
	ErrReleased = errors.New("lock: lease released")
	// ErrClosed: the Locker was closed. Pending and later Acquire,
	// TryAcquire and Watch calls return it.
	ErrClosed = errors.New("lock: locker closed")
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
	// maxDefaultSkew caps the default clock-skew margin.
	maxDefaultSkew = time.Second
	// closeTimeout bounds the releases Close makes.
	closeTimeout = 5 * time.Second
	// refreshWorkers bounds the background refreshes in flight at once.
	refreshWorkers = 16
)

// Options configure a Locker. The zero value (or nil) gives the documented
// defaults. Negative durations are treated as zero.
type Options struct {
	// TTL is how long a holding lasts in the store unless refreshed.
	// 0: 30 seconds (DefaultTTL). It must be at least one millisecond.
	TTL time.Duration
	// Owner identifies this Locker's holdings in the store; operators see
	// it in `warden lock ls`. "": hostname:pid:random, unique per Locker.
	// Two Lockers given the same Owner on one store count as one holder
	// and do not exclude each other: give every Locker its own.
	Owner string
	// RefreshInterval is how often a held lease renews itself in the
	// background (less up to a tenth at random, to spread refreshes).
	// 0: TTL/3. A value that leaves no time to refresh before the local
	// deadline (≥ TTL − ClockSkew) is reduced to TTL/3.
	RefreshInterval time.Duration
	// RetryMin and RetryMax bound the jittered exponential back-off of a
	// waiting Acquire between two attempts (and of the retries of a failed
	// refresh). 0: 5 ms and 1 s. A RetryMax below RetryMin is raised to
	// RetryMin. A waiter never sleeps past the current holder's expiry,
	// and on stores with notifications it is woken at once by a release.
	RetryMin, RetryMax time.Duration
	// ClockSkew is the safety margin subtracted from a lease's local
	// deadline (the local time the last successful acquire or refresh was
	// sent, plus TTL): the lease's context is cancelled that much before
	// the store could let another holder in, to allow for clocks running
	// at different rates. 0: TTL/20, at most one second. Values above
	// TTL/2 are reduced to TTL/2.
	ClockSkew time.Duration
	// DisableAutoRefresh turns background refreshing off: leases then last
	// one TTL unless Lease.Refresh is called. Their contexts are still
	// cancelled with ErrLeaseLost at the local deadline.
	DisableAutoRefresh bool
	// PollInterval is how often Watch lists the store's locks to find
	// changes when the store has no notifications. 0: one second
	// (DefaultPollInterval).
	PollInterval time.Duration
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

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	mu        sync.Mutex
	closed    bool
	keys      map[string]*keyState
	stale     map[string]staleHolding
	staleScan int // size of stale after its last full prune
	sub       subState
	subRetry  time.Time      // earliest restart of a failed subscription
	due       []*Lease       // leases waiting for a refresh worker, FIFO
	workers   int            // refresh workers running
	wg        sync.WaitGroup // background goroutines

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
// the store's notifications are subscribed to on first need.
func New(st *warden.Store, opts *Options) *Locker {
	if opts == nil {
		opts = &Options{}
	}
	nonNeg := func(d time.Duration) time.Duration { return max(d, 0) }
	l := &Locker{
		st:          st,
		locks:       st.Locks(),
		log:         st.Logger(),
		owner:       opts.Owner,
		ttl:         nonNeg(opts.TTL),
		refresh:     nonNeg(opts.RefreshInterval),
		skew:        nonNeg(opts.ClockSkew),
		retryMin:    nonNeg(opts.RetryMin),
		retryMax:    nonNeg(opts.RetryMax),
		poll:        nonNeg(opts.PollInterval),
		autoRefresh: !opts.DisableAutoRefresh,
		keys:        map[string]*keyState{},
		stale:       map[string]staleHolding{},
	}
	l.canWatch = l.locks.CanWatch()
	if l.owner == "" {
		l.owner = defaultOwner()
	}
	if l.ttl == 0 {
		l.ttl = DefaultTTL
	}
	if l.skew == 0 {
		l.skew = min(l.ttl/20, maxDefaultSkew)
	}
	l.skew = min(l.skew, l.ttl/2)
	if l.refresh == 0 || l.refresh >= l.ttl-l.skew {
		l.refresh = l.ttl / 3
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
	return l
}

// defaultOwner is hostname:pid:random.
func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	if len(host) > 255 {
		host = host[:255]
	}
	var b [6]byte
	_, _ = crand.Read(b[:]) // never fails (crypto/rand panics rather)
	return host + ":" + strconv.Itoa(os.Getpid()) + ":" + hex.EncodeToString(b[:])
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
// store's notifications report that the key was released. Other waiters
// of the key in this Locker wait their turn in FIFO order without asking
// the store. Transient store errors are retried the same way; invalid
// arguments and a closed store are returned at once.
//
// The lease's context carries ctx's values but not its cancellation: the
// lease lives until released or lost.
func (l *Locker) Acquire(ctx context.Context, key string) (*Lease, error) {
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
		for ks.queue[0] != w || ks.held != nil || ks.busy {
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
		if acquired {
			if l.closed {
				l.mu.Unlock()
				l.releaseOrphan(ctx, key, rec.Token)
				return nil, ErrClosed
			}
			s := l.newLease(ctx, key, rec, sent)
			ks.held = s
			l.mu.Unlock()
			return s, nil
		}
		l.mu.Unlock()

		if err != nil {
			if cctx.Err() != nil {
				return nil, doneErr(ctx, cctx, lastErr)
			}
			if permanent(err) {
				return nil, err
			}
			lastErr = err
		}
		if l.subscribe() {
			// Notifications start now: look again at once, so that a
			// release between the attempt and the subscription is not
			// missed.
			continue
		}
		delay := l.backoff(attempts)
		attempts++
		if err == nil && !rec.ExpiresAt.IsZero() {
			// Never sleep past the holder's expiry (plus a millisecond for
			// the store's rounding).
			delay = max(min(delay, time.Until(rec.ExpiresAt)+time.Millisecond), 0)
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
	cctx, cancel := l.callCtx(ctx)
	defer cancel()
	l.mu.Lock()
	for {
		if l.closed {
			l.mu.Unlock()
			return nil, ErrClosed
		}
		ks := l.state(key)
		if s := ks.held; s != nil {
			l.mu.Unlock()
			return nil, &HeldError{Key: key, Owner: l.owner, Token: s.token, ExpiresAt: s.ExpiresAt()}
		}
		if !ks.busy {
			break
		}
		// Another attempt on the key is in flight: wait for its outcome.
		if ks.idle == nil {
			ks.idle = make(chan struct{})
		}
		idle := ks.idle
		l.mu.Unlock()
		select {
		case <-idle:
		case <-cctx.Done():
			return nil, doneErr(ctx, cctx, nil)
		}
		l.mu.Lock()
	}
	ks := l.keys[key]
	ks.busy = true
	l.mu.Unlock()

	rec, acquired, sent, err := l.attempt(cctx, key)

	l.mu.Lock()
	ks.endBusy()
	ks.wakeHead()
	if acquired && !l.closed {
		s := l.newLease(ctx, key, rec, sent)
		ks.held = s
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
func (l *Locker) attempt(ctx context.Context, key string) (rec driver.LockRecord, acquired bool, sent time.Time, err error) {
	for {
		sent = time.Now()
		rec, acquired, err = l.locks.Acquire(ctx, key, l.owner, l.ttl)
		if err != nil {
			return rec, false, sent, err
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

// schedule queues a lease whose background refresh is due, starting a
// worker if fewer than refreshWorkers run. Workers exit when the queue is
// empty, so an idle Locker has none.
func (l *Locker) schedule(s *Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return // Close releases the lease
	}
	l.due = append(l.due, s)
	if l.workers < refreshWorkers {
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
		s := l.due[0]
		l.due[0] = nil
		l.due = l.due[1:]
		if len(l.due) == 0 {
			l.due = nil
		}
		l.mu.Unlock()
		_ = s.refresh(s.ctx, true)
	}
}
