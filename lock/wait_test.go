package lock

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
)

// queueStore gives the memory driver (its notifications hidden) the
// capability of a server-side queue, answered by the test: each WaitLock
// call is handed to the test on calls and returns what the test replies.
type queueStore struct {
	driver.Store
	calls chan waitCall
	left  atomic.Int32
}

type waitCall struct {
	key, owner string
	max        time.Duration
	reply      chan bool
}

func (q *queueStore) WaitLock(ctx context.Context, key, owner string, max time.Duration) (bool, error) {
	c := waitCall{key, owner, max, make(chan bool, 1)}
	select {
	case q.calls <- c:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	select {
	case again := <-c.reply:
		return again, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

func (q *queueStore) LeaveLock(key, owner string) { q.left.Add(1) }

// TestWaitTurnInStoreQueue: on a store with a server-side queue, the first
// waiter waits there — for the holder's expiry at most, plus a back-off —
// and asks the store nothing more until the queue wakes it; woken, it
// acquires at once.
func TestWaitTurnInStoreQueue(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const db = "wait-turn"
	holder := openEnv(t, db, nil).locker(t, &Options{TTL: time.Minute})
	q := &queueStore{calls: make(chan waitCall)}
	we := openEnv(t, db, func(d driver.Store) driver.Store { q.Store = d; return q })
	waiter := we.locker(t, &Options{TTL: time.Minute, RetryMin: time.Millisecond, RetryMax: time.Millisecond})

	held, err := holder.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(ctx, "k")
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	c := <-q.calls
	if c.key != "k" || c.owner != waiter.Owner() {
		t.Errorf("WaitLock(%q, %q), want (%q, %q)", c.key, c.owner, "k", waiter.Owner())
	}
	if until := time.Until(held.ExpiresAt()); c.max < until-time.Second {
		t.Errorf("WaitLock for at most %v; the holder's expiry is %v away: a waiter in the queue waits for it", c.max, until)
	}
	attempts := we.ops.Get("lock.acquire")
	if attempts != 1 {
		t.Errorf("%d acquire attempts before waiting in the queue, want 1", attempts)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c.reply <- true // the queue wakes the waiter
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if n := we.ops.Get("lock.acquire"); n != 2 {
		t.Errorf("%d acquire attempts in all, want 2: one before the wait, one when woken", n)
	}
	if n := q.left.Load(); n != 1 {
		t.Errorf("LeaveLock called %d times after the waiting Acquire, want 1 (a no-op for a turn that became the lease)", n)
	}
}

// TestWaitTurnPollsWhenQueueDeclines: a store whose queue cannot help
// (WaitLock reports false) leaves the waiter polling with its back-off,
// and a waiting Acquire that gives up leaves its turn.
func TestWaitTurnPollsWhenQueueDeclines(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const db = "wait-decline"
	holder := openEnv(t, db, nil).locker(t, &Options{TTL: time.Minute})
	q := &queueStore{calls: make(chan waitCall)}
	we := openEnv(t, db, func(d driver.Store) driver.Store { q.Store = d; return q })
	waiter := we.locker(t, &Options{TTL: time.Minute, RetryMin: time.Millisecond, RetryMax: time.Millisecond})
	if _, err := holder.TryAcquire(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(actx, "k")
		got <- err
	}()
	for i := range 3 {
		c := <-q.calls
		// Each wait comes after one more attempt: a declined wait is
		// followed by the back-off and an attempt, not by another wait.
		if n := we.ops.Get("lock.acquire"); n != i+1 {
			t.Errorf("at wait %d: %d attempts, want %d", i+1, n, i+1)
		}
		c.reply <- false
	}
	acancel()
	if err := <-got; err == nil {
		t.Fatal("Acquire of a held key returned a lease")
	}
	if n := q.left.Load(); n != 1 {
		t.Errorf("LeaveLock called %d times after the Acquire gave up, want 1", n)
	}
}
