package lock

import (
	"context"
	"errors"

	"github.com/warden-go/warden/internal/valid"
)

// Do runs fn while holding key: it waits for the lock like Acquire, runs fn
// with a context that is cancelled when ctx ends or the lease is lost
// (context.Cause gives ErrLeaseLost then), releases the lock when fn
// returns or panics, and returns fn's error. If the lease was lost before
// it was released, the result also matches ErrLeaseLost: fn may have run
// partly without the lock. If the lock could not be taken, fn is not
// called and Acquire's error is returned. A nil Locker or fn is an error
// matching warden.ErrInvalidArgument.
//
// fn's context carries the lease: LeaseFromContext(ctx).Token() is the
// fencing token to pass to whatever fn writes.
//
// The release is made even if ctx has ended, bounded by the Locker's TTL
// (past it the holding lapses anyway); a failed release is logged at Warn
// rather than returned, since fn ran under the lock.
func Do(ctx context.Context, l *Locker, key string, fn func(ctx context.Context) error) error {
	switch {
	case l == nil:
		return valid.Nil("lock", "Locker")
	case fn == nil:
		return valid.Nil("lock", "function")
	}
	s, err := l.Acquire(ctx, key)
	if err != nil {
		return err
	}
	return s.Run(ctx, fn)
}

// Run runs fn under the lease — one taken with TryAcquire, say — the way
// Do does: fn's context is derived from the lease's (a loss cancels it in
// the same instant, and its Err consults the lease's clock), ctx's end is
// passed on to it, LeaseFromContext gives the lease back, and the lease
// is released when fn returns or panics, even if ctx has ended (bounded
// by the Locker's TTL). fn's error is returned; if the lease was lost
// before it was released, the result also matches ErrLeaseLost. A failed
// release is logged at Warn rather than returned.
func (s *Lease) Run(ctx context.Context, fn func(ctx context.Context) error) (err error) {
	l := s.l
	// fn's context is derived from the lease's, so that a loss cancels it
	// in the same instant (and its Err consults the lease's clock); ctx's
	// own end is passed on to it.
	fctx, stop := s.ctx.Child(ctx)
	fctx = context.WithValue(fctx, leaseKey{}, s)
	defer func() {
		stop()
		lostEarly := errors.Is(s.Err(), ErrLeaseLost)
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), l.ttl)
		rerr := s.Release(rctx)
		rcancel()
		switch {
		case lostEarly || errors.Is(rerr, ErrNotHeld):
			if err == nil {
				err = ErrLeaseLost
			} else if !errors.Is(err, ErrLeaseLost) {
				err = errors.Join(err, ErrLeaseLost)
			}
		case rerr != nil:
			l.log.Warn("warden: lock release failed; the holding lapses at its expiry",
				"store", l.st.Name(), "key", s.key, "owner", l.owner, "token", s.Token(), "error", rerr)
		}
	}()
	return fn(fctx)
}

type leaseKey struct{}

// LeaseFromContext returns the lease Do holds while it runs fn, from fn's
// context (or one derived from it); nil outside Do.
func LeaseFromContext(ctx context.Context) *Lease {
	s, _ := ctx.Value(leaseKey{}).(*Lease)
	return s
}
