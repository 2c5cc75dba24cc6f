package lock

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// Event is one change of a lock, as Watch delivers it: Kind, Key (without
// the store's prefix; empty for EventsLost), Owner and Token of the
// holding concerned, and At, when it happened.
type Event = driver.LockEvent

// EventKind says what happened to a lock.
type EventKind = driver.LockEventKind

// The kinds of events.
const (
	// Acquired: a new holding began.
	Acquired = driver.LockAcquired
	// Released: a holding was released or force-released.
	Released = driver.LockReleased
	// Expired: a holding lapsed (reported by stores that can tell, and by
	// the poller of stores without notifications).
	Expired = driver.LockExpired
	// EventsLost: events may be missing — the receiver fell behind, or
	// (Event.Err set) the store could not be read; re-read the state you
	// care about with the store's lock List or Get.
	EventsLost = driver.EventsLost
)

// ErrPolled is the Err of the EventsLost event that begins a Watch on a
// store without notifications: its poller does not see the holdings that
// begin and end between two polls.
var ErrPolled = errors.New("lock: the store has no notifications and Watch polls it")

// subscribe starts the Locker's one store subscription, which wakes
// waiters when their key is released, if the store has notifications and
// the subscription is neither running nor starting. The store's Watch is
// called from a goroutine of its own (bounded by the Locker's context), so
// that a store slow to answer it never holds up a waiting Acquire past its
// own context; once it runs, every key's first waiter is woken to look
// again (a release may have come before the subscription began).
func (l *Locker) subscribe() {
	if !l.canWatch {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.sub != subNone || time.Now().Before(l.subRetry) {
		return
	}
	l.sub = subStarting
	l.wg.Add(1)
	go l.startSubscription()
}

// startSubscription calls the store's Watch for subscribe.
func (l *Locker) startSubscription() {
	defer l.wg.Done()
	ch, err := l.locks.Watch(l.ctx)

	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil || l.closed {
		// A subscription that raced with Close ends with l.ctx.
		l.sub = subNone
		l.subUnsupported = errors.Is(err, errors.ErrUnsupported)
		if l.subUnsupported {
			l.subRetry = time.Now().Add(l.retryMax) // not a passing failure: waiters poll
		} else {
			l.subRetry = time.Now().Add(min(l.retryMax, subRetryMax))
		}
		return
	}
	l.sub = subRunning
	l.subUnsupported = false
	l.wg.Add(1)
	go l.dispatch(ch)
	// Releases may have happened before the subscription began.
	l.wakeAll()
}

// dispatch wakes the first waiter of every key released, and every first
// waiter when events were lost. It ends when the subscription does (on
// Close or when the store ends it); waiters then fall back on back-off
// and restart the subscription on their next wait.
func (l *Locker) dispatch(ch <-chan driver.LockEvent) {
	defer l.wg.Done()
loop:
	for {
		var ev driver.LockEvent
		select {
		case e, ok := <-ch:
			if !ok {
				break loop
			}
			ev = e
		case <-l.ctx.Done():
			return
		}
		l.mu.Lock()
		switch ev.Kind {
		case driver.LockReleased, driver.LockExpired:
			if ks := l.keys[ev.Key]; ks != nil {
				ks.wakeHead()
			}
		case driver.EventsLost:
			l.wakeAll()
		}
		l.mu.Unlock()
	}
	l.mu.Lock()
	l.sub = subNone
	l.subRetry = time.Now().Add(min(l.retryMax, subRetryMax))
	l.wakeAll()
	l.mu.Unlock()
}

// subRetryMax bounds how long a failed or ended subscription to the
// store's notifications waits before it is started again, and, until it
// runs, the back-off of a waiting Acquire, whatever RetryMax says: a
// waiter that counts on a release's notification (a RetryMax of an hour)
// would otherwise sleep through every release after a transient failure
// (a server briefly unreachable when the subscription started).
const subRetryMax = time.Second

// subscriptionDown reports whether the store has notifications but the
// Locker's subscription is not running.
func (l *Locker) subscriptionDown() bool {
	if !l.canWatch {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sub != subRunning && !l.subUnsupported && !l.closed
}

// wakeAll wakes the first waiter of every key; l.mu must be held.
func (l *Locker) wakeAll() {
	for _, ks := range l.keys {
		ks.wakeHead()
	}
}

// Watch delivers acquire and release events, from every process, for the
// keys matching the glob pattern ('*' any run, '?' one character, '\'
// escapes; "" matches every key), until ctx ends or the Locker closes;
// then the channel is closed. Events are not replayed: the first ones are
// the changes after Watch returns.
//
// On stores with notifications the events come from the store's stream
// (each Watch has its own subscription). Delivery is best effort: a
// receiver that falls behind gets an EventsLost event in place of the
// events it missed. A store's stream reports a holding that lapses (its
// holder died) only when the next holder takes the key, if at all, so
// Watch also tracks the matching holdings (listed when it starts and after
// an EventsLost, and from Acquired events) and reads each again
// PollInterval after its expiry: one that is gone or replaced by then is
// reported Expired, At its expiry, and the store's own later event for it
// is dropped.
//
// On stores without notifications (or whose notifications cannot be had
// now: their Watch fails with an error matching errors.ErrUnsupported,
// as a read-only SQLite file this process may not write) Watch polls: it
// lists the matching
// locks every PollInterval (default one second) and reports the
// differences — Acquired for a new holding, Released for a holding gone
// before its expiry, Expired for one gone after it (both followed by
// Acquired when another holding replaced it between two polls, and then
// stamped no later than the new holding's acquisition). Changes that begin
// and end between two polls are not seen: the stream begins with an
// EventsLost event whose Err is ErrPolled and says so. A receiver that
// falls behind delays the polls rather than losing events. A listing that
// fails is reported as an EventsLost event whose Err is the store's error,
// once per run of failures, so that a silent store and an unreachable one
// look different. Every listing Watch makes (and every read of a tracked
// holding) has PollInterval, at least one second, to answer: one that
// does not is abandoned and counts as a failure whose error matches
// warden.ErrStoreTimeout, so a store that stops answering is reported
// too, and Watch itself returns that error if its first listing hangs.
func (l *Locker) Watch(ctx context.Context, pattern string) (<-chan Event, error) {
	p, err := warden.ParsePattern(pattern)
	if err != nil {
		return nil, err
	}
	wctx, cancel := l.callCtx(ctx)
	if l.ctx.Err() != nil {
		cancel()
		return nil, ErrClosed
	}
	var (
		src  <-chan driver.LockEvent
		snap map[string]driver.LockRecord
	)
	if l.canWatch {
		src, err = l.locks.Watch(wctx)
		if errors.Is(err, errors.ErrUnsupported) {
			// This store cannot deliver notifications now (a read-only
			// SQLite file this process may not write): poll, as on
			// stores without notifications.
			src, err = nil, nil
		}
	}
	if err == nil {
		// After subscribing, so that a holding acquired in between is in
		// the listing or in the stream.
		snap, err = l.snapshot(wctx, pattern)
	}
	if err != nil {
		// (wctx is judged before cancel, which would end it.)
		done := wctx.Err() != nil
		cancel()
		if done {
			return nil, doneErr(ctx, wctx, nil)
		}
		return nil, err
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		cancel()
		return nil, ErrClosed
	}
	l.wg.Add(1)
	l.mu.Unlock()
	out := make(chan Event)
	if src != nil {
		go l.forward(wctx, cancel, src, pattern, p, snap, out)
	} else {
		go l.pollLoop(wctx, cancel, pattern, snap, out)
	}
	return out, nil
}

// forward passes the store's events for matching keys to out, and reports
// the lapse of a tracked holding the stream did not report (see Watch).
// live holds the matching holdings known to be current.
func (l *Locker) forward(ctx context.Context, cancel context.CancelFunc, src <-chan driver.LockEvent, pattern string, p driver.Pattern, live map[string]driver.LockRecord, out chan<- Event) {
	defer l.wg.Done()
	defer close(out)
	defer cancel()
	ended := map[string]int64{}   // key → token whose end Watch reported itself
	due := map[string]time.Time{} // key → when to read its holding again
	track := func(rec driver.LockRecord) {
		live[rec.Key] = rec
		due[rec.Key] = rec.ExpiresAt.Add(l.poll)
	}
	for _, rec := range live {
		track(rec)
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	send := func(ev Event) bool {
		select {
		case out <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	// check reads key's holding again and reports its lapse; false when
	// ctx ended.
	check := func(key string, now time.Time) bool {
		evs, ok := l.recheck(ctx, key, live, due, now)
		for _, ev := range evs {
			ended[ev.Key] = ev.Token
			ok = ok && send(ev)
		}
		return ok
	}
	for {
		var next time.Time
		for _, at := range due {
			if next.IsZero() || at.Before(next) {
				next = at
			}
		}
		var tick <-chan time.Time
		if !next.IsZero() {
			timer.Reset(time.Until(next))
			tick = timer.C
		}
		select {
		case ev, ok := <-src:
			if !ok {
				return
			}
			if ev.Kind != driver.EventsLost && !p.Match(ev.Key) {
				continue
			}
			switch ev.Kind {
			case driver.LockAcquired:
				// Tracked below, once the event is out.
			case driver.LockReleased, driver.LockExpired:
				if tok, ok := ended[ev.Key]; ok && ev.Token <= tok {
					if ev.Token == tok {
						delete(ended, ev.Key)
					}
					continue // reported already, as it lapsed
				}
				if rec, ok := live[ev.Key]; ok && rec.Token == ev.Token {
					delete(live, ev.Key)
					delete(due, ev.Key)
				}
			}
			if !send(ev) {
				return
			}
			switch ev.Kind {
			case driver.LockAcquired:
				live[ev.Key] = driver.LockRecord{Key: ev.Key, Owner: ev.Owner, Token: ev.Token}
				if !check(ev.Key, time.Now()) {
					return
				}
			case driver.EventsLost:
				// Acquisitions may be among the lost events: track the
				// holdings listed now too.
				if cur, err := l.snapshot(ctx, pattern); err == nil {
					for key, rec := range cur {
						old, ok := live[key]
						switch {
						case !ok:
							track(rec)
						case old.Token != rec.Token && !check(key, time.Now()):
							return // (check reports old's lapse, tracks rec)
						}
					}
				}
			}
		case <-tick:
			now := time.Now()
			for key, at := range due {
				if !at.After(now) && !check(key, now) {
					return
				}
			}
		case <-ctx.Done():
			return
		}
	}
}

// recheck reads the holding of a tracked key again, for forward: it updates
// live and due, and returns an Expired event if the holding it tracked has
// lapsed. ok is false when ctx ended.
func (l *Locker) recheck(ctx context.Context, key string, live map[string]driver.LockRecord, due map[string]time.Time, now time.Time) (evs []Event, ok bool) {
	var rec driver.LockRecord
	var found bool
	err := l.bounded(ctx, fmt.Sprintf("reading the lock %q", key), func(ctx context.Context) (err error) {
		rec, found, err = l.locks.Get(ctx, key)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, false
		}
		due[key] = now.Add(l.poll) // try again
		return nil, true
	}
	old := live[key]
	delete(live, key)
	delete(due, key)
	if found && rec.Token == old.Token && rec.ExpiresAt.After(now) {
		live[key], due[key] = rec, rec.ExpiresAt.Add(l.poll) // live, or renewed
		return nil, true
	}
	end := old.ExpiresAt
	if found && rec.Token == old.Token {
		end = rec.ExpiresAt // lapsed, though the store still shows it
	}
	if !end.IsZero() && !end.After(now) {
		// Gone or replaced after its expiry: it lapsed. (A holding
		// released before its expiry is reported by the stream; one
		// whose expiry was never read is left to the stream too.)
		evs = append(evs, Event{Kind: Expired, Key: key, Owner: old.Owner, Token: old.Token, At: end})
	}
	if found && rec.Token > old.Token && rec.ExpiresAt.After(now) {
		live[key], due[key] = rec, rec.ExpiresAt.Add(l.poll)
	}
	return evs, true
}

// storeBudget is how long one store operation of a Watch (a listing, a
// read of a tracked holding) may take: PollInterval, at least
// DefaultPollInterval. A listing that has not answered when the next is
// due is late already; the floor spares a short PollInterval on a far
// store from timing out every listing.
func (l *Locker) storeBudget() time.Duration { return max(l.poll, DefaultPollInterval) }

// bounded runs op on ctx bounded by the Watch store budget; a budget that
// runs out while ctx lives is an error matching warden.ErrStoreTimeout.
func (l *Locker) bounded(ctx context.Context, what string, op func(ctx context.Context) error) error {
	budget := l.storeBudget()
	sctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	err := op(sctx)
	if err != nil && ctx.Err() == nil && sctx.Err() != nil {
		return fmt.Errorf("lock: %s: %w (%v)", what, warden.ErrStoreTimeout, budget)
	}
	return err
}

// snapshot lists the live holdings matching pattern, within the store
// budget.
func (l *Locker) snapshot(ctx context.Context, pattern string) (map[string]driver.LockRecord, error) {
	var recs []driver.LockRecord
	err := l.bounded(ctx, fmt.Sprintf("listing the locks matching %q", pattern), func(ctx context.Context) (err error) {
		recs, err = l.locks.List(ctx, pattern)
		return err
	})
	if err != nil {
		return nil, err
	}
	m := make(map[string]driver.LockRecord, len(recs))
	for _, r := range recs {
		m[r.Key] = r
	}
	return m, nil
}

// poll reports the differences between successive listings to out.
func (l *Locker) pollLoop(ctx context.Context, cancel context.CancelFunc, pattern string, prev map[string]driver.LockRecord, out chan<- Event) {
	defer l.wg.Done()
	defer close(out)
	defer cancel()
	ticker := time.NewTicker(l.poll)
	defer ticker.Stop()
	select {
	case out <- Event{Kind: EventsLost, At: time.Now().UTC().Truncate(time.Millisecond),
		Err: fmt.Errorf("%w every %v: holdings that begin and end between two polls are not seen", ErrPolled, l.poll)}:
	case <-ctx.Done():
		return
	}
	failing := false
	for {
		select {
		case <-ticker.C:
		case <-ctx.Done():
			return
		}
		cur, err := l.snapshot(ctx, pattern)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// Tell the watcher once per run of failures, so that "no
			// events" and "store unreachable" look different; the next
			// poll that works reports the net changes.
			if !failing {
				failing = true
				select {
				case out <- Event{Kind: EventsLost, At: time.Now().UTC().Truncate(time.Millisecond), Err: err}:
				case <-ctx.Done():
					return
				}
			}
			continue
		}
		failing = false
		for _, ev := range diff(prev, cur, time.Now().UTC().Truncate(time.Millisecond)) {
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
		prev = cur
	}
}

// diff turns two listings into events, in key order.
func diff(prev, cur map[string]driver.LockRecord, now time.Time) []Event {
	keys := make([]string, 0, len(prev)+len(cur))
	for k := range prev {
		keys = append(keys, k)
	}
	for k := range cur {
		if _, ok := prev[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var evs []Event
	for _, k := range keys {
		old, had := prev[k]
		rec, has := cur[k]
		if had && has && old.Token == rec.Token {
			continue // unchanged or refreshed
		}
		if had {
			// The holding ended by now, and before the holding that
			// replaced it began.
			end := now
			if has && !rec.AcquiredAt.IsZero() && rec.AcquiredAt.Before(end) {
				end = rec.AcquiredAt
			}
			ev := Event{Kind: Released, Key: k, Owner: old.Owner, Token: old.Token, At: end}
			if !old.ExpiresAt.After(end) {
				ev.Kind, ev.At = Expired, old.ExpiresAt
			}
			evs = append(evs, ev)
		}
		if has {
			at := rec.AcquiredAt
			if at.IsZero() {
				at = now
			}
			evs = append(evs, Event{Kind: Acquired, Key: k, Owner: rec.Owner, Token: rec.Token, At: at})
		}
	}
	return evs
}
