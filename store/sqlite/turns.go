package sqlite

import (
	"context"
	"database/sql"
	"sync"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// Fair hand-off across processes: the waiters' queues.
//
// A release wakes the waiters of every process at once (each store's
// watcher polls PRAGMA data_version), but the releaser asking again at
// once, or a waiter of its own process, reaches the file first: without
// more, it takes the key back again and again. So the store keeps, in a
// table of its own (config.turns, "<locks>_turns"), a queue per key of
// the owners waiting for it in WaitLock (the lock package's first waiter
// of a key in a Locker waits there between attempts), and the acquire
// statement reads it:
//
//   - WaitLock puts owner at the end of the key's queue (seq: one above
//     the key's highest), then waits — woken by the store's lock events
//     for the key — until the row is free and not reserved for another
//     waiter, or until max. While it waits it renews its entry: an entry
//     lives turnTTL unless renewed, every turnTTL/4. A waiter that dies,
//     hangs or stops asking without LeaveLock stops counting at most
//     turnTTL after its last renewal.
//   - For turnGrace after the row became free (a release, or the
//     holding's expiry: the row's expires_at either way), an acquire is
//     refused to every owner but the first live waiter of the queue
//     (reservedFor, in the acquire statement). The releaser that asks
//     again queues behind the waiters instead of barging. Past the grace
//     (the first waiter was too slow) anybody may take the key, as
//     before.
//   - An Acquire by a queued owner that wins the row deletes its entry in
//     the same IMMEDIATE transaction; LeaveLock deletes an entry that did
//     not become a holding.
//
// The lock row alone decides who holds the lock: the queue only adds a
// condition to the acquire of a free row — exclusion, tokens and expiry
// are untouched, and the uncontended acquire is still one statement (its
// condition reads the queue only for a row freed less than turnGrace
// ago: one index probe). A program that does not know the table
// (go-go-scope, an older warden) acquires as it always did; its waiters
// poll.

const (
	// turnTTL is how long a queue entry lives unless renewed: the longest
	// a waiter that died (or stopped waiting without LeaveLock) keeps the
	// others from a free key.
	turnTTL = 2 * time.Second
	// turnRenew is how often a waiting WaitLock renews its entry.
	turnRenew = turnTTL / 4
	// turnGrace is how long a free row stays reserved for the first
	// waiter: long enough for a waiter on a busy machine to see the
	// release and send its acquire.
	turnGrace = 2 * time.Second
)

// turns is a store's record of its owners' queue entries, by stored key
// and owner: when each was last written (sent, local clock).
type turns struct {
	off bool // no waiters' table (read-only file of an older warden)

	mu sync.Mutex
	m  map[turnKey]time.Time

	// leaving is held (read) by each LeaveLock while it deletes an entry,
	// and taken by Close before it closes the database, so that a
	// LeaveLock that took its entry out of m before Close's leaveAll ran
	// has deleted it too.
	leaving sync.RWMutex
}

type turnKey struct{ sk, owner string }

func (t *turns) get(k turnKey) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.m[k]
	return at, ok
}

func (t *turns) set(k turnKey, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[turnKey]time.Time{}
	}
	t.m[k] = at
}

// remove forgets k and reports whether it was recorded.
func (t *turns) remove(k turnKey) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.m[k]
	delete(t.m, k)
	return ok
}

// queued reports whether owner has an entry in sk's queue.
func (s *store) queued(sk, owner string) bool {
	_, ok := s.turns.get(turnKey{sk, owner})
	return ok
}

// turnArgs are the named arguments of the queue statements.
func turnArgs(sk, owner string, now int64) []any {
	return []any{sql.Named("key", sk), sql.Named("owner", owner), sql.Named("now", now),
		sql.Named("exp", now+driver.Millis(turnTTL))}
}

// keepTurn puts owner in sk's queue, or renews its entry when due (force:
// at once). An entry found lapsed is written again, at the end of the
// queue.
func (s *store) keepTurn(ctx context.Context, sk, owner string, force bool) error {
	k := turnKey{sk, owner}
	at, ok := s.turns.get(k)
	if ok && !force && time.Since(at) < turnRenew {
		return nil
	}
	sent := time.Now()
	if !ok {
		// Recorded before the write: an entry the write may have made is
		// deleted by Acquire, LeaveLock or Close all the same.
		s.turns.set(k, time.Time{})
	}
	err := s.write(ctx, func() error {
		if s.closed.Load() {
			// Close's leaveAll may have deleted the entries already:
			// writing one now would leave it to lapse.
			return warden.ErrClosed
		}
		args := turnArgs(sk, owner, nowMs())
		if ok {
			res, err := s.exec(ctx, s.q.turnRenew, args...)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n > 0 {
				return err
			}
		}
		if _, err := s.exec(ctx, s.q.turnPrune, args...); err != nil {
			return err
		}
		_, err := s.exec(ctx, s.q.turnJoin, args...)
		return err
	})
	if err == nil {
		s.turns.set(k, sent)
	}
	return err
}

// turnState is what a waiter reads: whether the row is held (live), when
// it became or becomes free (its expires_at, Unix ms) and whether it is
// reserved for another waiter. A missing row is free and not reserved.
func (s *store) turnState(ctx context.Context, sk, owner string) (live bool, freed int64, reserved bool, err error) {
	err = s.readRow(ctx, s.q.turnState, turnArgs(sk, owner, nowMs())...).Scan(&live, &freed, &reserved)
	if err == sql.ErrNoRows {
		return false, 0, false, nil
	}
	return live, freed, reserved, err
}

// WaitLock implements driver.LockWaiter: owner joins key's queue (or
// keeps its place) and waits, woken by the store's lock events, until
// the key is free and not reserved for a waiter ahead of it, or max
// passed. It declines (false) when it cannot wait: a read-only store, a
// store that cannot watch, or a failing one.
func (s *store) WaitLock(ctx context.Context, key, owner string, limit time.Duration) (bool, error) {
	if s.closed.Load() {
		return false, warden.ErrClosed
	}
	if s.cfg.readOnly || s.turns.off {
		return false, nil
	}
	if dl, ok := ctx.Deadline(); ok {
		limit = min(limit, time.Until(dl))
	}
	if limit <= 0 {
		return ctx.Err() == nil, ctx.Err()
	}
	end := time.Now().Add(limit)
	sk := s.lockPfx + key
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Subscribed before the first read of the row: a release committed
	// after that read is delivered.
	evs, err := s.WatchLocks(wctx)
	if err != nil {
		return false, s.waitErr(ctx)
	}
	if err := s.keepTurn(ctx, sk, owner, false); err != nil {
		return false, s.waitErr(ctx)
	}
	timer := time.NewTimer(limit)
	defer timer.Stop()
	read := true
	for {
		if read {
			live, freed, reserved, err := s.turnState(ctx, sk, owner)
			if err != nil {
				return false, s.waitErr(ctx)
			}
			if !live && !reserved {
				return true, nil
			}
			wake := end
			if at, _ := s.turns.get(turnKey{sk, owner}); at.Add(turnRenew).Before(wake) {
				wake = at.Add(turnRenew)
			}
			if !live {
				// Reserved for another waiter: look again when the
				// reservation ends, if nothing happens before.
				if until := msTime(freed + driver.Millis(turnGrace) + 1); until.Before(wake) {
					wake = until
				}
			}
			timer.Reset(max(time.Until(wake), 0))
			read = false
		}
		select {
		case ev, ok := <-evs:
			if !ok {
				if s.closed.Load() {
					return false, warden.ErrClosed
				}
				return false, ctx.Err()
			}
			read = ev.Key == key || ev.Kind == driver.EventsLost
		case <-timer.C:
			if !time.Now().Before(end) {
				return true, nil
			}
			if err := s.keepTurn(ctx, sk, owner, false); err != nil {
				return false, s.waitErr(ctx)
			}
			read = true
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// waitErr is WaitLock's error once the store failed it: ctx's, ErrClosed,
// or none (the caller polls).
func (s *store) waitErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return warden.ErrClosed
	}
	return nil
}

// LeaveLock implements driver.LockWaiter: owner leaves key's queue.
func (s *store) LeaveLock(key, owner string) {
	sk := s.lockPfx + key
	s.turns.leaving.RLock()
	defer s.turns.leaving.RUnlock()
	if !s.turns.remove(turnKey{sk, owner}) {
		return
	}
	// Also while the store closes: Close ends the waits in flight, whose
	// LeaveLock may come after Close's leaveAll looked for entries.
	s.deleteTurns([]turnKey{{sk, owner}})
}

// leaveAll deletes the queue entries of the store's owners as it closes,
// and waits for the LeaveLock calls deleting theirs.
func (s *store) leaveAll() {
	defer func() {
		s.turns.leaving.Lock()
		s.turns.leaving.Unlock()
	}()
	s.turns.mu.Lock()
	ks := make([]turnKey, 0, len(s.turns.m))
	for k := range s.turns.m {
		ks = append(ks, k)
	}
	clear(s.turns.m)
	s.turns.mu.Unlock()
	s.deleteTurns(ks)
}

// deleteTurns deletes the queue entries ks, bounded by the busy timeout;
// a failure leaves them to lapse (turnTTL). Not prepared: it runs while
// the store closes too, when it no longer prepares statements.
func (s *store) deleteTurns(ks []turnKey) {
	if len(ks) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.busy)
	defer cancel()
	_ = s.write(ctx, func() error {
		for _, k := range ks {
			args := s.withNS(turnArgs(k.sk, k.owner, nowMs()))
			if _, err := s.db.ExecContext(ctx, s.q.turnLeave, args...); err != nil {
				return err
			}
		}
		return nil
	})
}

var _ driver.LockWaiter = (*store)(nil)
