package breaker

import (
	"math"
	"time"
)

// The fast paths. A Breaker's local view lives under b.mu; every time b.mu
// is released (unlockMu, and unlock, which uses it) the view's verdict for
// the common calls is published in an immutable snapshot, read with one
// atomic load. Code that changes the view under b.mu and wakes another
// goroutine before releasing it (an outcome write closing its done
// channel) publishes first (publishLocked), so that the woken goroutine's
// next call sees the change. The snapshot's verdicts:
//
//   - a call on a circuit the view holds closed is admitted, with the
//     view's generation, without b.mu;
//   - a call on a circuit the view holds open or half-open, before its
//     next probe is due, is rejected (unless an inconclusive probe left a
//     slot to reuse) with an *OpenError made once per view, without b.mu
//     and without allocating;
//   - a success of a call admitted closed that needs no write (see
//     succeeded) is counted without b.mu.
//
// The snapshot says no more than the view it was made from, so these
// paths are exactly as fresh as the locked path: a change made elsewhere
// reaches them when it reaches the view (a notification, or the read due
// every SyncInterval), not later. Their time limits are the view's own:
// the snapshot expires when the view's next read of the store is due
// (never, while a notification stream is live) and, for a rejection, when
// the next probe is due; an expired snapshot sends the call to the locked
// path, which reads the store or probes as before. The clock is read once
// per call at most (monotonic only), and not at all for a closed call on
// a store that delivers notifications.

// snapshot is the published verdict of the local view. It is never
// modified once published.
type snapshot struct {
	// admit: a call is admitted as a normal call of generation gen.
	admit bool
	gen   int64
	// reject, if set, is the error of a rejected call.
	reject *OpenError
	// expires is the monotonic time (mono) from which admit and reject no
	// longer hold.
	expires int64
	// quiet: the success of a normal call needs no write and changes
	// nothing but the counters. It does not expire: it changes only with
	// the view.
	quiet bool
}

// epoch is the origin of mono.
var epoch = time.Now()

// never is the expiry of a snapshot without a time limit.
const never = math.MaxInt64

// mono returns the monotonic clock, in nanoseconds since epoch; it reads
// only the monotonic clock, which time.Now reads along with the wall clock.
func mono() int64 { return int64(time.Since(epoch)) }

// monoOf returns t, a time read from this process's clock, on mono's scale.
func monoOf(t time.Time) int64 { return int64(t.Sub(epoch)) }

// fastAdmit returns the verdict of the published snapshot on a call,
// the ticket of an admitted call or the error of a rejected one: ok is
// false if the locked path must decide.
func (b *Breaker) fastAdmit() (t ticket, ok bool, err error) {
	s := b.snap.Load()
	if s == nil || s.expires <= 0 {
		return ticket{}, false, nil
	}
	if s.expires != never && mono() >= s.expires {
		return ticket{}, false, nil
	}
	if s.admit {
		return ticket{kind: normalCall, gen: s.gen}, true, nil
	}
	if s.reject != nil {
		b.rejections.Add(1)
		return ticket{}, true, s.reject
	}
	return ticket{}, false, nil
}

// quietSuccess reports whether the published snapshot says that the
// success of a normal call needs no write.
func (b *Breaker) quietSuccess() bool {
	s := b.snap.Load()
	return s != nil && s.quiet
}

// unlockMu publishes the local view's snapshot and releases b.mu.
func (b *Breaker) unlockMu() {
	b.publishLocked()
	b.mu.Unlock()
}

// publishLocked publishes the snapshot of the local view, unless the one
// published already says the same; b.mu is held. It does not read the
// clock.
func (b *Breaker) publishLocked() {
	var s snapshot
	// The read of the store admit makes first (maybeSync) is not due
	// before expires.
	switch {
	case b.canWatch && !b.started, b.resyncing, b.lastSync.IsZero():
		s.expires = 0 // admit must start the watcher or read the store
	case b.watching && !b.storeDown:
		s.expires = never
	default:
		s.expires = monoOf(b.lastSync.Add(b.syncEvery))
	}
	rejecting := false
	switch {
	case b.failClosed && b.storeDown:
		// Rejections that wrap the store's error: the locked path.
	case b.state == Closed:
		s.admit, s.gen = true, b.rec.Generation()
	case b.probing >= b.probes || b.chain == "":
		// Rejected until the next probe is due (and after it, while every
		// probe slot of this Breaker's is taken, by the locked path). A
		// zero nextProbe is due at once.
		rejecting = true
		s.expires = min(s.expires, monoOf(b.nextProbe))
	}
	if b.readyToTrip == nil {
		last := len(b.inflight) > 0 && b.inflight[len(b.inflight)-1].success
		s.quiet = b.state != Closed || last || b.fails == 0 && !b.failWritesLocked()
	}
	p := b.snap.Load()
	if p != nil && p.admit == s.admit && p.gen == s.gen && p.expires == s.expires && p.quiet == s.quiet &&
		(p.reject != nil) == rejecting && (!rejecting || p.reject.State == b.state && p.reject.Until.Equal(b.nextProbe)) {
		return
	}
	if rejecting {
		if p != nil && p.reject != nil && p.reject.State == b.state && p.reject.Until.Equal(b.nextProbe) {
			s.reject = p.reject
		} else {
			s.reject = &OpenError{Name: b.name, State: b.state, Until: b.nextProbe}
		}
	}
	b.snap.Store(&s)
}
