// Package lock gives Go services distributed locks on the database they
// already run, through any warden store (memory, sqlite, postgres, mysql,
// redis, mongodb, dynamodb). It is written once over the store's atomic
// lock primitives, so it behaves the same on every backend.
//
//	st, _ := warden.Open(ctx, "postgres://…")
//	locker, err := lock.New(st, nil) // TTL 30 s, refreshed every 10 s
//	if err != nil { … }
//	defer locker.Close()
//
//	err := lock.Do(ctx, locker, "jobs/nightly-report", func(ctx context.Context) error {
//		return buildReport(ctx) // ctx ends if the lock is lost
//	})
//
// # Leases
//
// Acquire waits for a key and returns a [Lease]; TryAcquire makes one
// attempt and returns [ErrLocked] (a [*HeldError] naming the holder) if
// the key is held. A lease lasts TTL in the store and renews itself in the
// background every RefreshInterval. The Locker schedules all its leases on
// one timer and refreshes them, nearest deadline first, with short-lived
// workers sized to the load, so a held lease costs no goroutine and a
// process can hold tens of thousands.
// Release ends it.
//
// The lease's Context is cancelled the moment the lease ends; its cause
// (and Err) is [ErrReleased] after a release and [ErrLeaseLost] when the
// lease can no longer be proven held: a refresh was refused (the holding
// expired and someone else took the key, or an operator force-released
// it), or no refresh succeeded before the lease's local deadline. The
// local deadline is the local time the last successful acquire or refresh
// was sent, plus TTL, minus ClockSkew (at least MinClockSkew): the store
// cannot have let anyone else in before it, as long as the two clocks run
// at about the same rate. At the deadline the context is done first —
// before the next waiter is let in or the loss is logged — and its Err
// consults the clock, so it reports the loss even before a timer fires.
// Acquire never returns a lease whose deadline has already passed.
// A refresh that fails is retried with a short back-off until then, and a
// refresh whose outcome is unknown (sent, no reply) is settled by reading
// the record back. Losses are logged at Warn on the store's logger.
//
// # What a lease does not promise
//
// A lease is a lock with a timeout. It guarantees that no two holders are
// granted the same key at the same time by the store, and that the holder
// is told (its context cancelled) when it can no longer be sure it still
// holds it. It cannot stop a holder that does not look: a process paused
// for longer than the TTL (a GC pause, a stopped VM, a slow disk) may wake
// up and carry on writing after another holder took over. That is why
// every lease has a fencing token ([Lease.Token]), strictly greater than
// the token of every earlier holding of the key: pass it with every write
// to the resource the lock protects and have the resource refuse a write
// whose token is smaller than the greatest it has accepted. Work done
// under [Do] should also watch its context — by calling ctx.Err() before
// each write, not only by waiting on Done: Err consults the clock and is
// exact at the lease's deadline, while Done is closed by a timer that the
// Go runtime may run up to ~10 ms late on a process whose goroutines keep
// every CPU busy.
//
// # Waiting
//
// Waiters in one Locker are served in FIFO order per key, and only the
// first of them asks the store. On stores with notifications (PostgreSQL,
// Redis, MongoDB, DynamoDB, SQLite, memory) the Locker holds one subscription,
// started on first need, and a release wakes the first waiter at once.
// Waiters also retry with a jittered exponential back-off between RetryMin
// and RetryMax that never sleeps past the holder's known expiry, which is
// all they rely on with stores without notifications (MySQL).
//
// # Watching
//
// [Locker.Watch] streams acquire, release and expiry events for keys
// matching a glob, from every process: the store's notifications where it
// has them (with a holding that lapses reported expired about PollInterval
// after its expiry), otherwise a poller that lists the locks every
// PollInterval and begins its stream with an EventsLost event (Err:
// [ErrPolled]) saying that holdings between two polls are not seen.
//
// # Owners and keys
//
// A Locker has one owner identity (default hostname:pid:random). Within a
// Locker, leases are not re-entrant: Acquire of a key the Locker already
// holds waits until that lease ends, and TryAcquire reports ErrLocked.
// Keys are non-empty UTF-8 strings of at most 512 bytes; the store's
// errors for invalid keys, and for a closed store, are returned as they
// are (they match warden.ErrInvalidKey, warden.ErrClosed, …).
package lock
