package dynamo

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/handoff"
)

// Fair hand-off across processes: waiters queue on the lock item, and a
// release hands the key to the first of them.
//
// Waiters learn of a release through the events index, polled every
// EventPoll; a releaser that asks again at once reaches the table first,
// so without more it took the key back again and again (2 processes × 4
// workers: min/max acquisitions per worker 0.01). So the store keeps a
// queue in the lock item itself, in a map attribute `waiters`
// (owner → {a: arrival, u: until}, Unix ms, the client's clock), and
// implements driver.LockWaiter:
//
//   - WaitLock (the lock package's first waiter of a key in a Locker,
//     after an attempt found the key held) writes owner's entry into the
//     map — its arrival is the time it first queued, kept while it waits
//     again — and renews it every handoff.TurnRenew (an entry lives
//     handoff.TurnTTL). It waits, woken by the store's lock events,
//     until the key is handed to it, is free, or max passed.
//   - Release, when the map holds live entries of other owners, does not
//     free the item: in the same one conditional UpdateItem it makes the
//     entry with the earliest arrival the holder, with the next token and
//     an expiry handoff.Grace away, and removes that entry. The releaser
//     that asks again finds the key held and queues behind. The new
//     holder's Acquire, once its WaitLock saw the hand-off, renews that
//     holding with its own TTL (one Refresh).
//   - A waiter that dies keeps its entry at most handoff.TurnTTL; a
//     holding handed to it lapses handoff.Grace after the release, and
//     its entry is gone with the hand-off. A waiter that gives up
//     (LeaveLock) removes its entry and releases a holding handed to it
//     that its Acquire did not take, which hands the key on.
//
// The item alone decides who holds the lock, as before: a hand-off is one
// conditional write from one holding to the next, with a greater token;
// acquire, refresh and the events are unchanged, and an acquire's
// condition does not read the map (the uncontended acquire costs what it
// did). The uncontended release is still one UpdateItem: its condition
// also requires the map to be absent or empty, and a release that finds
// waiters it did not know of reads them from the failed condition's copy
// of the item (one GetItem where the endpoint does not return it) and
// hands off with a second write.
const (
	// aWaiters is the lock item's queue: owner → {a, u}.
	aWaiters = "waiters"
	// maxDrop bounds the lapsed entries one write removes by name (a
	// release: 50; a renewal: handoff.MaxPrune), keeping its expression
	// well under DynamoDB's 4 KB.
	maxDrop = 50
)

// waitKey names one owner waiting for one lock item (its pk).
type waitKey = handoff.Key

// waits is what a store knows of its owners' places in the lock items'
// queues (book), and what its watcher saw of the items they wait for.
type waits struct {
	book handoff.Book
	mu   sync.Mutex
	// seen: for each lock item a WaitLock of this store waits for, the
	// last state the watcher read, and how many waits look at it.
	seen map[string]*seenLock
	// hints: for lock items this store wrote last with waiters in their
	// queue, the queue as it was then (a release's first guess).
	hints map[string]item
}

type seenLock struct {
	refs int
	st   lockState
}

// lockState is a lock item's holding as a waiter needs it.
type lockState = handoff.State

func lockStateOf(it item) lockState {
	if it == nil {
		return handoff.Absent()
	}
	q, _ := queueOf(it)
	return handoff.NewState(gS(it, aOwner), gN(it, aVersion), has(it, aRel), lockExp(it), q, nowMs())
}

// queueOf returns the entries of an item's queue, earliest arrival first;
// other reports a waiters attribute that is not a map (written by another
// program: a release removes it).
func queueOf(it item) (q []handoff.Entry, other bool) {
	v, present := it[aWaiters]
	m, ok := v.(*types.AttributeValueMemberM)
	if !ok {
		return nil, present
	}
	q = make([]handoff.Entry, 0, len(m.Value))
	for o, v := range m.Value {
		e := handoff.Entry{Owner: o, Name: o}
		if mv, ok := v.(*types.AttributeValueMemberM); ok {
			e.Arrival, e.Until = gN(mv.Value, "a"), gN(mv.Value, "u")
		}
		q = append(q, e)
	}
	handoff.Sort(q)
	return q, false
}

// owners returns the owners of entries.
func owners(es []handoff.Entry) []string {
	var os []string
	for _, e := range es {
		os = append(os, e.Owner)
	}
	return os
}

// noteQueue remembers the queue of pk's item as a write saw it, for the
// next release of pk.
func (s *store) noteQueue(pk string, it item) {
	_, ok := it[aWaiters].(*types.AttributeValueMemberM)
	w := &s.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	if !ok {
		// (An empty queue is remembered too: the release removes it at
		// once rather than after a failed condition.)
		delete(w.hints, pk)
		return
	}
	if w.hints == nil || len(w.hints) >= maxHints {
		w.hints = map[string]item{}
	}
	w.hints[pk] = item{aWaiters: it[aWaiters]}
}

func (s *store) queueHint(pk string) item {
	w := &s.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hints[pk]
}

// noteSeen records the lock items the watcher read for the items a
// WaitLock waits for; it runs before the poll's events are delivered.
func (s *store) noteSeen(its []item) {
	w := &s.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.seen) == 0 {
		return
	}
	for _, it := range its {
		if sl := w.seen[gS(it, aPk)]; sl != nil {
			if st := lockStateOf(it); st.Newer(sl.st) {
				sl.st = st
			}
		}
	}
}

// watchSeen starts (d 1) or ends (d -1) a wait's interest in pk's state.
func (s *store) watchSeen(pk string, d int) {
	w := &s.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	sl := w.seen[pk]
	if sl == nil {
		if d < 0 {
			return
		}
		if w.seen == nil {
			w.seen = map[string]*seenLock{}
		}
		sl = &seenLock{}
		w.seen[pk] = sl
	}
	sl.refs += d
	if sl.refs <= 0 {
		delete(w.seen, pk)
	}
}

func (s *store) seenState(pk string) lockState {
	w := &s.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	if sl := w.seen[pk]; sl != nil {
		return sl.st
	}
	return lockState{}
}

// entryNames returns the expression names of the queue entries of owners,
// as #w0, #w1, …, and the paths "#waiters.#wN" joined by commas.
func entryNames(owners []string, names map[string]string) string {
	var paths string
	for i, o := range owners {
		n := "#w" + strconv.Itoa(i)
		names[n] = o
		if i > 0 {
			paths += ", "
		}
		paths += "#waiters." + n
	}
	return paths
}

// keepPlace writes k's entry into the queue of its lock item (creating
// the queue if the item has none) and returns the item's state. ok is
// false when there is no item of warden's layout to queue on (absent, or
// written by a service of the go-go-scope layout, or with a waiters
// attribute of another program's): then st is the item read, or unknown.
func (s *store) keepPlace(ctx context.Context, k waitKey, prune []handoff.Entry) (st lockState, ok bool, err error) {
	done, ok := s.waits.book.StartWrite()
	if !ok {
		return lockState{}, false, errClosed
	}
	defer done()
	arr := s.waits.book.Arrival(k, nowMs())
	entry := func() types.AttributeValue {
		return &types.AttributeValueMemberM{Value: item{"a": vN(arr), "u": vN(nowMs() + driver.Millis(handoff.TurnTTL))}}
	}
	join := func() (item, bool, error) {
		// Entries of others found lapsed at the last read go too (a
		// holder that keeps the key long releases none): nothing else
		// removes them while the key stays held.
		var dead []string
		for _, e := range prune {
			if e.Owner != k.Owner {
				dead = append(dead, e.Owner)
			}
		}
		names := map[string]string{"#w0": k.Owner}
		upd := "SET #waiters.#w0 = :e"
		if len(dead) > 0 {
			rm := entryNames(append([]string{k.Owner}, dead...), names) // #w0 is owner's own
			upd += " REMOVE " + rm[len("#waiters.#w0, "):]
		}
		attrs, failed, _, err := s.updateNames(ctx, "waiting for lock", k.PK, metaSK,
			upd, "attribute_exists(#waiters)", names, item{":e": entry()}, types.ReturnValueAllNew)
		prune = nil // once
		return attrs, !failed, err
	}
	attrs, ok, err := join()
	if err != nil || ok {
		return lockStateOf(attrs), ok, err
	}
	attrs, failed, _, err := s.updateNames(ctx, "waiting for lock", k.PK, metaSK,
		"SET #waiters = :m", "attribute_not_exists(#waiters) AND attribute_exists(#expiresAtMs)", nil,
		item{":m": &types.AttributeValueMemberM{Value: item{k.Owner: entry()}}}, types.ReturnValueAllNew)
	if err != nil || !failed {
		return lockStateOf(attrs), !failed, err
	}
	// No queue to join and none created: the item is absent or not of
	// warden's layout — or the queue appeared between the two writes.
	it, err := s.get(ctx, "reading lock", k.PK, metaSK)
	if err != nil {
		return lockState{}, false, err
	}
	if _, ok := it[aWaiters].(*types.AttributeValueMemberM); ok && has(it, aExp) {
		attrs, ok, err := join()
		if err != nil || ok {
			return lockStateOf(attrs), ok, err
		}
		key, _ := cutPrefix(k.PK, s.lockPfx)
		return lockState{}, false, &contendedError{op: "waiting for lock", key: key, tries: 3}
	}
	if it == nil {
		return lockStateOf(nil), false, nil
	}
	st = lockState{Known: true, Owner: gS(it, aOwner), Token: gN(it, aVersion), Released: has(it, aRel), Exp: lockExp(it)}
	if st.Live(nowMs()) && !has(it, aExp) {
		// A holding of the go-go-scope layout: do not try again before it
		// ends.
		s.waits.book.HintNoQueue(k.PK, st.Exp)
	}
	return st, false, nil
}

// leavePlace removes k's entry from its item's queue and returns the
// item's state afterwards (unknown if the item has no queue).
func (s *store) leavePlace(ctx context.Context, k waitKey) (lockState, error) {
	attrs, failed, _, err := s.updateNames(ctx, "leaving lock queue", k.PK, metaSK,
		"REMOVE #waiters.#w0", "attribute_exists(#waiters)", map[string]string{"#w0": k.Owner}, nil, types.ReturnValueAllNew)
	if err != nil || failed {
		return lockState{}, err
	}
	s.noteQueue(k.PK, attrs)
	return lockStateOf(attrs), nil
}

// WaitLock implements driver.LockWaiter: owner queues on key's item (or
// keeps its place) and waits until the key is handed to it or is free, or
// max passed. The store's lock events wake it; while it is first in the
// queue it also reads the item every HandoffPoll. It declines (false)
// when the store does not hand off (DisableHandoff), when the item is
// one of the go-go-scope layout, when the store's watcher cannot start,
// or when a request fails.
func (s notifyStore) WaitLock(ctx context.Context, key, owner string, limit time.Duration) (bool, error) {
	if !s.handoff {
		return false, nil
	}
	for _, v := range []struct{ what, s string }{{"key", key}, {"owner", owner}} {
		if err := warden.ValidateKey(v.s); err != nil {
			return false, fmt.Errorf("dynamo: waiting for lock: %s: %w", v.what, err)
		}
	}
	if nowMs() < s.waits.book.NoQueueUntil(s.lockPfx+key) {
		return false, nil // held by a service of the go-go-scope layout: poll
	}
	if dl, ok := ctx.Deadline(); ok {
		limit = min(limit, time.Until(dl))
	}
	if limit <= 0 {
		return ctx.Err() == nil, ctx.Err()
	}
	end := time.Now().Add(limit)
	k := waitKey{PK: s.lockPfx + key, Owner: owner}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Subscribed before the queue entry is written: the hand-off that
	// follows it is seen.
	s.watchSeen(k.PK, 1)
	defer s.watchSeen(k.PK, -1)
	evs, err := s.hub.WatchLocks(wctx)
	if err != nil {
		return false, ctx.Err()
	}
	cur, ok, err := s.keepPlace(ctx, k, nil)
	if err != nil {
		return false, ctx.Err()
	}
	if !ok {
		s.waits.book.Dequeue(k)
		// Nothing to queue on: absent or free, try now; a live holding of
		// the go-go-scope layout: poll.
		return cur.Known && !cur.Live(nowMs()), nil
	}
	renewed, read := time.Now(), time.Now()
	entry := true // the last state read came with owner's entry written
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		if st := s.seenState(k.PK); st.Newer(cur) {
			cur, entry = st, false
		}
		now := nowMs()
		switch {
		case cur.Live(now) && cur.Owner == owner:
			s.waits.book.SetHanded(k, handoff.Handed{Token: cur.Token, Entry: entry})
			return true, nil
		case !cur.Live(now):
			return true, nil
		}
		wake := end
		at := []time.Time{renewed.Add(handoff.TurnRenew), msTime(cur.Exp + 1)}
		if cur.First == owner {
			at = append(at, read.Add(s.handPoll))
		}
		for _, t := range at {
			if t.Before(wake) {
				wake = t
			}
		}
		timer.Reset(max(time.Until(wake), 0))
		select {
		case _, open := <-evs:
			// Any event (EventsLost too: the watcher's states are read all
			// the same): look at the state the watcher saw.
			if !open {
				return false, ctx.Err()
			}
			continue
		case <-timer.C:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		sent := time.Now()
		if !sent.Before(end) {
			return true, nil
		}
		if sent.Before(renewed.Add(handoff.TurnRenew)) && sent.UnixMilli() <= cur.Exp && cur.First == owner {
			// First in the queue: read the item.
			it, err := s.get(ctx, "reading lock", k.PK, metaSK)
			if err != nil {
				return false, ctx.Err()
			}
			if st := lockStateOf(it); st.Newer(cur) {
				cur, entry = st, false // a hand-off after the entry was last written removed it
			} else if !cur.Newer(st) {
				cur = st // the same holding; the queue as it is now
			}
			read = sent
			continue
		}
		// Renewal due, or the holding's expiry come (a refresh is not in
		// the events): write the entry again and read the item's state in
		// the same request.
		st, ok, err := s.keepPlace(ctx, k, cur.Lapsed)
		if err != nil {
			return false, ctx.Err()
		}
		if !ok {
			s.waits.book.Dequeue(k)
			return st.Known && !st.Live(nowMs()), nil
		}
		cur, renewed, read, entry = st, sent, sent, true
	}
}

// LeaveLock implements driver.LockWaiter: owner's entry leaves key's
// queue, and a holding handed to owner that its Acquire did not take is
// released (handing the key on). The requests are bounded by handoff.LeaveWait.
func (s *store) LeaveLock(key, owner string) {
	k := waitKey{PK: s.lockPfx + key, Owner: owner}
	queued, h, handed := s.waits.book.Dequeue(k)
	if !queued && !handed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), handoff.LeaveWait)
	defer cancel()
	s.leave(ctx, k, h.Token, handed)
}

func (s *store) leave(ctx context.Context, k waitKey, token int64, handed bool) {
	st, err := s.leavePlace(ctx, k)
	if err != nil {
		return
	}
	if st.Live(nowMs()) && st.Owner == k.Owner {
		token, handed = st.Token, true
	}
	if handed {
		// Only a holding no Acquire or Refresh took (its handoff mark):
		// never a lease, whichever call of this owner took it.
		key, _ := cutPrefix(k.PK, s.lockPfx)
		_, _ = s.release(ctx, key, k.Owner, token, true)
	}
}

// leaveAll, as the store closes, takes its owners out of the queues and
// releases holdings handed to them that no Acquire took.
func (s *store) leaveAll() {
	ls := s.waits.book.Close()
	if len(ls) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), handoff.LeaveWait)
	defer cancel()
	for _, l := range ls {
		s.leave(ctx, l.Key, l.Token, l.Handed)
	}
}

var _ driver.LockWaiter = notifyStore{}
