package lock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/deadline"
)

type leaseState int

const (
	stateHeld leaseState = iota
	stateReleased
	stateLost
)

// Lease is one holding of a lock, returned by Acquire and TryAcquire. Its
// methods are safe for concurrent use.
//
// A held lease renews itself in the background about every
// RefreshInterval. It costs no goroutine: the Locker keeps its leases'
// wake-up times in one schedule driven by a single timer, and the
// refreshes due are made by a small pool of workers that exist only while
// there is work. A refresh that fails is retried with a
// short back-off; one whose outcome is unknown is settled by reading the
// record back. When the lease can no longer be proven held — a refresh is
// refused, or none succeeded before the local deadline — its context is
// cancelled with ErrLeaseLost first, before anything else happens; then
// the next waiter may take the key and the loss is logged at Warn on the
// store's logger. At the deadline the context's Err reports the loss by
// the clock, even before the timer that closes Done has fired.
type Lease struct {
	l     *Locker
	key   string
	token int64
	// ctx is the lease's context. Its deadline is the local time until
	// which the lease is proven held: the send time of the last acquire
	// or refresh known to have applied, plus TTL, minus ClockSkew.
	ctx *deadline.Context

	mu    sync.Mutex
	state leaseState
	// expiresAt is the latest expiry the store reported (store clock).
	expiresAt time.Time
	// nextRefresh is when the background refresh is due.
	nextRefresh time.Time
	// pendingSince is the send time of the earliest refresh whose outcome
	// stayed unknown (zero if none). Its write may still land at any time,
	// so a later success does not clear it: if a read-back shows the
	// expiry moved, only "some refresh sent at or after pendingSince
	// applied" is known.
	pendingSince time.Time
	failures     int  // consecutive failed background refreshes
	queued       bool // waiting for a refresh worker
	refreshing   bool
	refreshDone  chan struct{} // closed when the refresh in flight ends
	// at is the lease's next wake-up in the Locker's schedule: the next
	// refresh or the deadline, whichever is first. at and idx (its place
	// in the schedule, -1 if not scheduled) are guarded by Locker.schedMu.
	at  time.Time
	idx int
	// unconfirmed: the lease ended without the store confirming the
	// holding ended (lost at the deadline, or its release failed).
	unconfirmed bool
	releasing   bool // a store release is in flight
	// acquired is when the lease was handed out (only with
	// Options.Observe: hold times).
	acquired time.Time
}

// newLease starts a lease on a holding acquired by a request sent at sent;
// l.mu must be held.
func (l *Locker) newLease(parent context.Context, key string, rec driver.LockRecord, sent time.Time) *Lease {
	s := &Lease{
		l:           l,
		key:         key,
		token:       rec.Token,
		ctx:         deadline.New(parent, sent.Add(l.ttl-l.skew), ErrLeaseLost),
		expiresAt:   rec.ExpiresAt,
		nextRefresh: sent.Add(l.refreshDelay()),
		idx:         -1,
	}
	if l.observe != nil {
		s.acquired = time.Now()
	}
	s.mu.Lock()
	s.arm()
	s.mu.Unlock()
	return s
}

// Key returns the lock's key.
func (s *Lease) Key() string { return s.key }

// Token returns the lease's fencing token: strictly greater than the token
// of every earlier holding of the key on this store. Pass it to the
// resource the lock protects and have the resource refuse writes carrying
// a token smaller than the greatest it has seen.
func (s *Lease) Token() int64 { return s.token }

// ExpiresAt returns the latest expiry of the holding the store reported,
// on the store's clock.
func (s *Lease) ExpiresAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expiresAt
}

// Deadline returns the local time at which the lease's context is done
// with ErrLeaseLost unless a refresh succeeds first: the local send time
// of the last successful acquire or refresh, plus TTL, minus ClockSkew.
// Acquire and TryAcquire never return a lease whose deadline has passed.
func (s *Lease) Deadline() time.Time { return s.ctx.When() }

// Context returns a context that is cancelled the moment the lease is lost
// or released; context.Cause then returns ErrLeaseLost or ErrReleased. Its
// Err consults the clock: from the lease's deadline on it reports the
// loss even if the timer that closes Done has not fired yet. It carries
// the values of the context given to Acquire, and no deadline of its own
// (Deadline gives the moving one).
func (s *Lease) Context() context.Context { return s.ctx }

// Done returns a channel closed when the lease ends: Context().Done().
func (s *Lease) Done() <-chan struct{} { return s.ctx.Done() }

// Err returns nil while the lease is held, then why it ended: ErrLeaseLost
// or ErrReleased. Like Context().Err(), it consults the clock.
func (s *Lease) Err() error {
	if s.ctx.Err() == nil {
		return nil
	}
	return context.Cause(s.ctx)
}

// endErr is the error of an ended lease; s.mu must be held.
func (s *Lease) endErr() error {
	if s.state == stateReleased {
		return ErrReleased
	}
	return ErrLeaseLost
}

// arm schedules the lease's next wake-up: the next background refresh or
// the deadline, whichever comes first (only the deadline while a refresh
// is queued or in flight); s.mu must be held.
func (s *Lease) arm() {
	at := s.ctx.When()
	if s.l.autoRefresh && !s.refreshing && !s.queued && s.nextRefresh.Before(at) {
		at = s.nextRefresh
	}
	s.l.setWake(s, at)
}

// wakeUp runs when a refresh is due or the deadline has come.
func (s *Lease) wakeUp() {
	s.mu.Lock()
	if s.state != stateHeld {
		s.mu.Unlock()
		return
	}
	now := time.Now()
	if s.ctx.Expire(now) {
		s.lose("no refresh succeeded before the lease's local deadline", true)
		return
	}
	if s.refreshing || s.queued || !s.l.autoRefresh || now.Before(s.nextRefresh) {
		s.arm()
		s.mu.Unlock()
		return
	}
	s.queued = true
	s.arm() // only the deadline while queued
	s.mu.Unlock()
	s.l.schedule(s)
}

// Refresh renews the holding now, for TTL from now. It returns nil when
// renewed; ErrLeaseLost if the store refused (the lease is then lost, its
// context cancelled) or it was lost before; ErrReleased after Release; or
// the store's error if the outcome stays unknown after reading the record
// back — the lease then stays held until its deadline and the background
// refresh, if enabled, keeps trying. Refreshes of one lease are made one
// at a time.
func (s *Lease) Refresh(ctx context.Context) error { return s.refresh(ctx, false) }

// refresh makes one refresh (auto: a background one) and reports it to
// Options.Observe.
func (s *Lease) refresh(ctx context.Context, auto bool) error {
	if s.l.observe == nil {
		return s.renew(ctx, auto, nil)
	}
	var sent time.Time
	err := s.renew(ctx, auto, &sent)
	if !sent.IsZero() { // a store refresh was made
		s.emit(ctx, Observation{Kind: ObservedRefresh, Start: sent, Duration: time.Since(sent), Err: err})
	}
	return err
}

// renew is refresh; sentAt, if not nil, is set to the refresh's send
// time once it goes to the store.
func (s *Lease) renew(ctx context.Context, auto bool, sentAt *time.Time) error {
	l := s.l
	s.mu.Lock()
	for s.refreshing {
		done := s.refreshDone
		s.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
	}
	if auto {
		s.queued = false
	}
	if s.state != stateHeld {
		err := s.endErr()
		s.mu.Unlock()
		return err
	}
	sent := time.Now()
	if s.ctx.Expire(sent) {
		s.lose("no refresh succeeded before the lease's local deadline", true)
		return ErrLeaseLost
	}
	s.refreshing = true
	s.refreshDone = make(chan struct{})
	// A read-back can credit the expiry it finds only to the earliest
	// refresh whose write may have made it.
	base := sent
	if !s.pendingSince.IsZero() {
		base = s.pendingSince
	}
	prevExp, deadline := s.expiresAt, s.ctx.When()
	s.arm() // only the deadline while the refresh is in flight
	s.mu.Unlock()
	if sentAt != nil {
		*sentAt = sent
	}

	// No answer after the deadline can help: bound the calls by it.
	rctx, cancel := context.WithDeadline(ctx, deadline)
	rec, ok, err := l.locks.Refresh(rctx, s.key, l.owner, s.token, l.ttl)
	var (
		back     driver.LockRecord
		found    bool
		readBack bool
	)
	if err != nil && rctx.Err() == nil {
		// The refresh may or may not have applied: read the record back.
		var gerr error
		back, found, gerr = l.locks.Get(rctx, s.key)
		readBack = gerr == nil
	}
	cancel()

	s.mu.Lock()
	s.refreshing = false
	close(s.refreshDone)
	if s.state != stateHeld {
		err := s.endErr()
		s.mu.Unlock()
		return err
	}
	now := time.Now()
	ours := found && back.Owner == l.owner && back.Token == s.token
	switch {
	case err == nil && ok:
		return s.prove(sent, rec.ExpiresAt)
	case err == nil:
		s.lose("a refresh was refused: "+describe(rec), false)
		return ErrLeaseLost
	case readBack && ours && back.ExpiresAt.After(prevExp) && base.Add(l.ttl-l.skew).After(s.ctx.When()):
		// The expiry moved since the last proof, so a refresh sent at or
		// after base applied — which extends the deadline only if base is
		// after the last proof.
		return s.prove(base, back.ExpiresAt)
	case readBack && !ours:
		s.lose("a refresh failed ("+err.Error()+") and reading back showed "+describe(back), false)
		return ErrLeaseLost
	}
	// Unknown, or still ours but not renewed: held until the deadline.
	if s.pendingSince.IsZero() {
		s.pendingSince = sent
	}
	if s.ctx.Expire(now) {
		s.lose("no refresh succeeded before the lease's local deadline ("+err.Error()+")", true)
		return ErrLeaseLost
	}
	if auto {
		s.nextRefresh = now.Add(l.backoff(s.failures))
		s.failures++
	}
	s.arm()
	s.mu.Unlock()
	return err
}

// describe tells who holds a record, for log lines.
func describe(rec driver.LockRecord) string {
	if rec.Owner == "" {
		return "the lock is not held"
	}
	return fmt.Sprintf("held by %q with token %d", rec.Owner, rec.Token)
}

// prove records that the holding was renewed by a request sent at base,
// with expiry exp on the store's clock. s.mu must be held; prove unlocks
// it. An answer that comes after the deadline is too late: the context is
// done by then, and the lease is lost (ErrLeaseLost).
func (s *Lease) prove(base, exp time.Time) error {
	l := s.l
	if !s.ctx.Extend(base.Add(l.ttl - l.skew)) {
		s.lose("a refresh was answered only after the lease's local deadline", true)
		return ErrLeaseLost
	}
	if exp.After(s.expiresAt) {
		s.expiresAt = exp
	}
	s.failures = 0
	s.nextRefresh = base.Add(l.refreshDelay())
	s.arm()
	s.mu.Unlock()
	return nil
}

// lose ends a held lease with ErrLeaseLost. s.mu must be held; lose
// unlocks it. unconfirmed: the store may still have the holding.
//
// The order is the deadline rule's: the holder is told first (its context
// is cancelled), then the next local waiter may take the key, then the
// loss is logged — a slow log handler never delays the first two.
func (s *Lease) lose(reason string, unconfirmed bool) {
	s.ctx.Cancel(ErrLeaseLost)
	s.state = stateLost
	s.unconfirmed = unconfirmed
	s.l.unschedule(s)
	s.mu.Unlock()
	l := s.l
	l.detach(s, unconfirmed)
	l.log.Warn("warden: lock lease lost", "store", l.st.Name(), "key", s.key, "owner", l.owner, "token", s.token, "reason", reason)
	if l.observe != nil {
		cause := LostRefused
		if unconfirmed {
			cause = LostExpired
		}
		s.emit(s.ctx, Observation{Kind: ObservedLoss, Held: time.Since(s.acquired), Cause: cause, Err: ErrLeaseLost})
	}
}

// Release ends the lease: its context is cancelled with ErrReleased at
// once, then the holding is released in the store. It returns nil on
// success; an error matching ErrNotHeld (and ErrLeaseLost) if the lease
// had been lost before; or the store's error. Whatever the outcome the
// lease stops refreshing; if the store could not be told, the holding
// lapses at its expiry, and calling Release again retries. Releasing a
// released lease again returns nil.
func (s *Lease) Release(ctx context.Context) error {
	l := s.l
	s.mu.Lock()
	first := false
	switch {
	case s.releasing:
		s.mu.Unlock()
		return nil
	case s.state == stateLost:
		retry := s.unconfirmed
		s.unconfirmed = false
		s.mu.Unlock()
		if retry {
			// The store may still have the holding: end it so others need
			// not wait for it to lapse — but not while an acquire of this
			// Locker is in flight on the key: it may be renewing this very
			// holding, and must see it as stale when its answer comes.
			_ = l.exclusive(ctx, s.key, func() {
				if _, err := l.locks.Release(ctx, s.key, l.owner, s.token); err == nil {
					l.clearStale(s.key, s.token)
				}
			})
		}
		return fmt.Errorf("%w: %w", ErrNotHeld, ErrLeaseLost)
	case s.state == stateReleased && !s.unconfirmed:
		s.mu.Unlock()
		return nil
	case s.state == stateHeld && s.ctx.Expire(time.Now()):
		// Past the deadline (or lost, not yet noticed): the lease was not
		// provably held any more, so this is no release.
		s.lose("no refresh succeeded before the lease's local deadline", true)
		return s.Release(ctx)
	case s.state == stateHeld:
		first = true
		s.state = stateReleased
		s.unconfirmed = true
		s.l.unschedule(s)
	}
	s.releasing = true
	s.mu.Unlock()
	if first {
		s.ctx.Cancel(ErrReleased)
	}
	var (
		ok  bool
		err error
	)
	release := func() { ok, err = l.locks.Release(ctx, s.key, l.owner, s.token) }
	if first {
		// The lease is still the key's holder here: no acquire of this
		// Locker runs on the key.
		release()
	} else if xerr := l.exclusive(ctx, s.key, release); xerr != nil {
		// A retry after a failed release: the holding is stale and
		// acquires of this Locker may run (see the lost case above).
		err = xerr
	}
	s.mu.Lock()
	s.releasing = false
	if err == nil {
		s.unconfirmed = false
	}
	s.mu.Unlock()
	switch {
	case first:
		// Local waiters take their turn only now that the store's holding
		// has ended (or could not be ended: then the next acquire of this
		// Locker ends it first, so that tokens stay unique).
		l.detach(s, err != nil)
	case err == nil:
		l.clearStale(s.key, s.token)
	}
	if err == nil && !ok && first {
		err = ErrNotHeld
	}
	if first && l.observe != nil {
		s.emit(ctx, Observation{Kind: ObservedRelease, Held: time.Since(s.acquired), Err: err})
	}
	return err
}

// detach removes an ended lease from its key, letting the next local
// waiter take its turn.
func (l *Locker) detach(s *Lease, unconfirmed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if unconfirmed {
		l.addStale(s.key, s.token)
	}
	if ks := l.keys[s.key]; ks != nil && ks.held == s {
		ks.held = nil
		if l.observe != nil && len(ks.queue) > 0 {
			ks.freed = time.Now()
		}
		ks.wakeHead()
		l.gc(s.key, ks)
	}
}

// clearStale forgets a stale holding the store has ended.
func (l *Locker) clearStale(key string, token int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sh, ok := l.stale[key]; ok && sh.token == token {
		delete(l.stale, key)
	}
}
