package mongo

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/handoff"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Fair hand-off across processes: waiters queue in the lock document, and
// a release hands the key to the first of them.
//
// Waiters in other processes learn of a release through the event
// collection, which reaches them a poll or more after the release; a
// releaser that asks again at once reaches the document first, so
// without more it took the key back again and again. So the store keeps
// a queue in the lock document itself, in a field `waiters`
// (entry name → {a: arrival, u: until}, Unix ms, the waiter's clock; an
// entry's name is "w" and the owner in unpadded URL-safe base64, since
// an owner may hold '.' or '$', which field names may not), and
// implements driver.LockWaiter:
//
//   - WaitLock (the lock package's first waiter of a key in a Locker,
//     after an attempt found the key held) sets owner's entry — its
//     arrival is the time it first queued, kept while it waits again —
//     and renews it every handoff.TurnRenew (an entry lives
//     handoff.TurnTTL). It waits until the key is handed to it, is free,
//     or max passed: the first waiter reads the document every
//     HandoffPoll; the others read it when an event of the key arrives,
//     and with each renewal.
//   - Release, when the queue holds live entries of other owners, does
//     not free the key: in the same one conditional update it makes the
//     entry with the earliest arrival the holder, with the next token, an
//     expiry handoff.Grace away and a `handoff` mark, and removes that
//     entry. The releaser that asks again finds the key held and queues
//     behind. The new holder's Acquire, once its WaitLock saw the
//     hand-off, renews that holding with its own TTL (one Refresh, which
//     removes the mark).
//   - A waiter that dies keeps its entry at most TurnTTL; a holding
//     handed to it lapses Grace after the release. A waiter that gives up
//     (LeaveLock) removes its entry and releases a holding handed to it
//     that no Acquire or Refresh took (the mark), which hands the key on.
//
// The document alone decides who holds the lock, as before: a hand-off is
// one conditional write from one holding to the next, with a greater
// token; an acquire's filter does not read the queue (the uncontended
// acquire costs what it did, and removes the acquirer's own entry in the
// same write). The uncontended release is still one update: its filter
// also requires that the document has no queue, and a release that finds
// one it did not know of reads the document and hands off with a second
// write.
const (
	// fWaiters is the lock document's queue; fHandoff the hand-off mark.
	fWaiters = "waiters"
	fHandoff = "handoff"
)

// entryName is the field name of owner's queue entry.
func entryName(owner string) string { return "w" + base64.RawURLEncoding.EncodeToString([]byte(owner)) }

// entryPath is the path of owner's queue entry in the lock document.
func entryPath(owner string) string { return fWaiters + "." + entryName(owner) }

// queueOf returns the entries of a document's queue, earliest arrival
// first: nil when it has none, empty when it has an empty one. other
// reports a waiters field that is not a document (written by another
// program: a release removes it).
func queueOf(rv bson.RawValue) (q []handoff.Entry, other bool) {
	if rv.Type == 0 {
		return nil, false
	}
	doc, ok := rv.DocumentOK()
	if !ok {
		return nil, true
	}
	els, err := doc.Elements()
	if err != nil {
		return nil, true
	}
	q = make([]handoff.Entry, 0, len(els))
	for _, el := range els {
		e := handoff.Entry{Name: el.Key()}
		if b, ok := strings.CutPrefix(e.Name, "w"); ok {
			if o, err := base64.RawURLEncoding.DecodeString(b); err == nil && len(o) > 0 && entryName(string(o)) == e.Name {
				e.Owner = string(o)
			}
		}
		if d, ok := el.Value().DocumentOK(); ok {
			e.Arrival, _ = d.Lookup("a").AsInt64OK()
			e.Until, _ = d.Lookup("u").AsInt64OK()
		}
		q = append(q, e)
	}
	handoff.Sort(q)
	return q, false
}

// lockState is a lock document's holding as a waiter needs it.
type lockState = handoff.State

// stateOf is the state of a lock document (nil: absent).
func stateOf(d *lockDoc) lockState {
	if d == nil {
		return handoff.Absent()
	}
	var exp int64
	if d.ExpiresAt != nil {
		exp = d.ExpiresAt.UnixMilli()
	}
	q, _ := queueOf(d.Waiters)
	return handoff.NewState(d.Owner, d.Token, d.Released, exp, q, nowMs())
}

func nowMs() int64 { return time.Now().UnixMilli() }

// queueHints remembers, for the lock documents this store wrote last with
// a queue, the queue as the write left it: a release's first guess.
type queueHints struct {
	mu sync.Mutex
	m  map[string]bson.RawValue
}

// noteQueue remembers the queue of sk's document as a write left it.
func (s *store) noteQueue(sk string, d *lockDoc) {
	h := &s.qhints
	h.mu.Lock()
	defer h.mu.Unlock()
	if d == nil || d.Waiters.Type == 0 {
		delete(h.m, sk)
		return
	}
	if h.m == nil || len(h.m) >= handoff.MaxHints {
		h.m = map[string]bson.RawValue{}
	}
	h.m[sk] = bson.RawValue{Type: d.Waiters.Type, Value: append([]byte(nil), d.Waiters.Value...)}
}

func (s *store) queueHint(sk string) bson.RawValue {
	h := &s.qhints
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.m[sk]
}

// handProj is what a release's and a waiter's read of a lock document
// needs.
var handProj = bson.D{{Key: "owner", Value: 1}, {Key: "token", Value: 1}, {Key: "expiresAt", Value: 1},
	{Key: "released", Value: 1}, {Key: fWaiters, Value: 1}, {Key: fHandoff, Value: 1}}

// readLock reads sk's lock document (nil: absent).
func (s *store) readLock(ctx context.Context, sk string) (*lockDoc, error) {
	var d lockDoc
	err := s.locks.FindOne(ctx, s.nsKey(sk), options.FindOne().SetProjection(handProj)).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	return &d, nil
}

// queueable is the condition of a lock document whose queue an entry can
// be set in: none yet, or a document.
var queueable = bson.E{Key: "$or", Value: bson.A{
	bson.D{{Key: fWaiters, Value: set("$exists", false)}},
	bson.D{{Key: fWaiters, Value: set("$type", "object")}},
}}

// keepPlace sets k's entry in the queue of its lock document, removing
// the lapsed entries of others in prune, and returns the document's
// state. ok is false when there is no document of warden's to queue on
// (absent, the key held by a service of the go-go-scope layout, or a
// waiters field of another program's): then st is the holding found, or
// unknown.
func (s *store) keepPlace(ctx context.Context, k handoff.Key, prune []handoff.Entry) (st lockState, ok bool, err error) {
	done, ok := s.book.StartWrite()
	if !ok {
		return lockState{}, false, errClosed
	}
	defer done()
	arr := s.book.Arrival(k, nowMs())
	upd := bson.D{{Key: "$set", Value: bson.D{{Key: entryPath(k.Owner), Value: bson.D{
		{Key: "a", Value: arr}, {Key: "u", Value: nowMs() + driver.Millis(handoff.TurnTTL)}}}}}}
	var rm bson.D
	for _, e := range prune {
		if e.Owner != k.Owner {
			rm = append(rm, bson.E{Key: fWaiters + "." + e.Name, Value: ""})
		}
	}
	if len(rm) > 0 {
		upd = append(upd, bson.E{Key: "$unset", Value: rm})
	}
	var d lockDoc
	err = s.locks.FindOneAndUpdate(ctx, append(s.nsKey(k.PK), queueable), upd, after1()).Decode(&d)
	set := err == nil // owner's entry is in the queue
	if set {
		s.noteQueue(k.PK, &d)
		st := stateOf(&d)
		if st.Live(nowMs()) {
			return st, true, nil
		}
		// Free by warden's document: the key may be held by a service of
		// the go-go-scope layout (a document of its own), which the waiter
		// would find at once, again and again.
	} else if !errors.Is(err, mongo.ErrNoDocuments) {
		return lockState{}, false, ctxErr(ctx, err)
	}
	// No live holding of warden's with a queue to join. A holding of the
	// go-go-scope layout (a document of its own, no token), as an
	// acquire sees it (foreign: live until its expiresAt, or for ever
	// without one), takes no queue: decline, and do not try again before
	// it ends (a second, when it has no expiry).
	key, _ := strings.CutPrefix(k.PK, s.lockPfx)
	rec, held, err := locks{s}.foreign(ctx, key, k.PK)
	if err != nil {
		return lockState{}, false, err
	}
	if held {
		exp := rec.ExpiresAt
		if exp.IsZero() {
			exp = time.Now().Add(time.Second)
		}
		st = lockState{Known: true, Owner: rec.Owner, Exp: exp.UnixMilli()}
		s.book.HintNoQueue(k.PK, st.Exp)
		if set {
			// The entry just set waits on nothing: take it out.
			_, _ = s.leavePlace(ctx, k)
		}
		return st, false, nil
	}
	if set {
		// Free: the caller tries at once, its entry kept (its place).
		return stateOf(&d), true, nil
	}
	// No document of warden's to queue on, or one with a waiters field of
	// another program's: read its holding.
	rec, held, err = locks{s}.Get(ctx, key)
	if err != nil {
		return lockState{}, false, err
	}
	if !held {
		return stateOf(nil), false, nil
	}
	return lockState{Known: true, Owner: rec.Owner, Token: rec.Token, Exp: rec.ExpiresAt.UnixMilli()}, false, nil
}

// leavePlace removes k's entry from its document's queue and returns the
// document's state afterwards (unknown if there is no such document).
func (s *store) leavePlace(ctx context.Context, k handoff.Key) (lockState, error) {
	var d lockDoc
	err := s.locks.FindOneAndUpdate(ctx, append(s.nsKey(k.PK), queueable),
		bson.D{{Key: "$unset", Value: bson.D{{Key: entryPath(k.Owner), Value: ""}}}}, after1()).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return lockState{}, nil
	}
	if err != nil {
		return lockState{}, ctxErr(ctx, err)
	}
	s.noteQueue(k.PK, &d)
	return stateOf(&d), nil
}

// WaitLock implements driver.LockWaiter: owner queues in key's document
// (or keeps its place) and waits until the key is handed to it or is
// free, or max passed. It declines (false) when the store does not hand
// off (DisableHandoff), when the key is held by a service of the
// go-go-scope layout, when the event watcher cannot start, or when a
// request fails.
func (s *store) WaitLock(ctx context.Context, key, owner string, limit time.Duration) (bool, error) {
	if !s.handoff {
		return false, nil
	}
	for _, v := range []struct{ what, s string }{{"key", key}, {"owner", owner}} {
		if err := warden.ValidateKey(v.s); err != nil {
			return false, fmt.Errorf("mongo: waiting for lock: %s: %w", v.what, err)
		}
	}
	k := handoff.Key{PK: s.lockPfx + key, Owner: owner}
	if nowMs() < s.book.NoQueueUntil(k.PK) {
		return false, nil // held by a service of the go-go-scope layout: poll
	}
	if dl, ok := ctx.Deadline(); ok {
		limit = min(limit, time.Until(dl))
	}
	if limit <= 0 {
		return ctx.Err() == nil, ctx.Err()
	}
	end := time.Now().Add(limit)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Subscribed before the entry is written: the events that follow it
	// are seen.
	evs, err := s.WatchLocks(wctx)
	if err != nil {
		return false, ctx.Err()
	}
	cur, ok, err := s.keepPlace(ctx, k, nil)
	if err != nil {
		return false, ctx.Err()
	}
	if !ok {
		s.book.Dequeue(k)
		// Nothing to queue on: absent or free, try now; held outside the
		// queue: poll.
		return cur.Known && !cur.Live(nowMs()), nil
	}
	renewed, read := time.Now(), time.Now()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		now := nowMs()
		switch {
		case cur.Live(now) && cur.Owner == owner:
			// (Whether owner's entry is still queued does not matter here:
			// the Acquire that takes the holding removes it either way.)
			s.book.SetHanded(k, handoff.Handed{Token: cur.Token})
			return true, nil
		case !cur.Live(now):
			return true, nil
		}
		wake := end
		at := []time.Time{renewed.Add(handoff.TurnRenew), time.UnixMilli(cur.Exp + 1)}
		if cur.First == owner {
			at = append(at, read.Add(s.handPoll))
		}
		for _, t := range at {
			if t.Before(wake) {
				wake = t
			}
		}
		timer.Reset(max(time.Until(wake), 0))
		look := false // an event of the key came: read the document
		select {
		case ev, open := <-evs:
			if !open {
				return false, ctx.Err()
			}
			if ev.Key != key && ev.Kind != driver.EventsLost {
				continue
			}
			look = true
		case <-timer.C:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		sent := time.Now()
		if !sent.Before(end) {
			return true, nil
		}
		if sent.Before(renewed.Add(handoff.TurnRenew)) && sent.UnixMilli() <= cur.Exp && (look || cur.First == owner) {
			d, err := s.readLock(ctx, k.PK)
			if err != nil {
				return false, ctx.Err()
			}
			if st := stateOf(d); st.Newer(cur) {
				cur = st // a hand-off after the entry was last set
			} else if !cur.Newer(st) {
				cur = st // the same holding; the queue as it is now
			}
			read = sent
			continue
		}
		// Renewal due, or the holding's expiry come (a refresh makes no
		// event): set the entry again and read the document's state in
		// the same request.
		st, ok, err := s.keepPlace(ctx, k, cur.Lapsed)
		if err != nil {
			return false, ctx.Err()
		}
		if !ok {
			s.book.Dequeue(k)
			return st.Known && !st.Live(nowMs()), nil
		}
		cur, renewed, read = st, sent, sent
	}
}

// LeaveLock implements driver.LockWaiter: owner's entry leaves key's
// queue, and a holding handed to owner that its Acquire did not take is
// released (handing the key on). The requests are bounded by
// handoff.LeaveWait.
func (s *store) LeaveLock(key, owner string) {
	k := handoff.Key{PK: s.lockPfx + key, Owner: owner}
	queued, h, handed := s.book.Dequeue(k)
	if !queued && !handed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), handoff.LeaveWait)
	defer cancel()
	s.leave(ctx, k, h.Token, handed)
}

func (s *store) leave(ctx context.Context, k handoff.Key, token int64, handed bool) {
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
		key, _ := strings.CutPrefix(k.PK, s.lockPfx)
		_, _ = s.release(ctx, key, k.Owner, token, true)
	}
}

// leaveAll, as the store closes, takes its owners out of the queues and
// releases holdings handed to them that no Acquire took.
func (s *store) leaveAll() {
	ls := s.book.Close()
	if len(ls) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), handoff.LeaveWait)
	defer cancel()
	for _, l := range ls {
		s.leave(ctx, l.Key, l.Token, l.Handed)
	}
}

// acquired ends k's wait once its Acquire holds the key: the acquire's
// write removed its entry from the queue.
func (s *store) acquired(k handoff.Key) { s.book.Dequeue(k) }

var _ driver.LockWaiter = (*store)(nil)
