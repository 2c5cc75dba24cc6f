package lock

import (
	"context"
	"time"

	"github.com/warden-go/warden/driver"
)

// Waiting in the store's queue. On a store that queues lock waiters
// (driver.LockWaiter: MySQL's named locks, SQLite's waiters' table,
// Redis's queue beside the record, DynamoDB's and MongoDB's queues in the
// lock record),
// the first waiter of a key in a Locker waits there between two attempts
// instead of sleeping a back-off: the store wakes it when the holder
// releases the key (or, on MySQL, its session ends), in the order the
// waiters of every process queued. The lock record still decides: a
// waiter whose turn came tries Acquire, and polls as before while the
// record shows a holder outside the queue.

// waitTurn is the wait of a key's first waiter after an attempt that
// found the key held (rec, the holder's record) on a store with a
// server-side queue. It waits at most until the holder's expiry plus the
// n-th back-off, and reports whether the next attempt should be made at
// once; false (the store has no queue, cannot wait now, or ctx ended)
// leaves the usual back-off to the caller. *waited is set once the store
// was asked, so that the caller gives up a turn it did not use.
func (l *Locker) waitTurn(ctx context.Context, key string, rec driver.LockRecord, n int, waited *bool) bool {
	w, ok := l.st.Driver().(driver.LockWaiter)
	if !ok {
		return false
	}
	max := l.backoff(n)
	if until := time.Until(rec.ExpiresAt); until > 0 {
		max += until
	}
	*waited = true
	again, err := w.WaitLock(ctx, key, l.owner, max)
	return err == nil && again
}

// leaveTurn gives up the turn for key that a waiting Acquire of this
// Locker may have been given and did not turn into a lease.
func (l *Locker) leaveTurn(key string) {
	if w, ok := l.st.Driver().(driver.LockWaiter); ok {
		w.LeaveLock(key, l.owner)
	}
}
