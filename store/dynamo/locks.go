package dynamo

import (
	"context"
	"sort"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/handoff"
)

// locks is the lock driver. A lock is one item (pk LOCK#<prefix>lock:<key>,
// sk METADATA) with owner, version (the fencing token), acquiredAt,
// expiresAtMs, releasedAt (present once released) and expiresAt (TTL and
// the go-go-scope layout's expiry: the second after the holding ends, or
// the second of the release, plus Options.LockRetention). Released and
// expired items are kept until TTL deletes them, so the next holder's
// token continues from them.
//
// Items of the go-go-scope layout have owner, version and expiresAt but
// no expiresAtMs: their expiry is expiresAt (epoch seconds). warden
// reports such a live lock as held by its owner with that expiry, and
// takes it over once expired, with a token of at least TokenBase(now)
// whatever version the item carried.
type locks struct{ s *store }

// lockExp is the expiry of a lock item in milliseconds (0: none).
func lockExp(it item) int64 {
	ms, _ := expiryMs(it)
	return ms
}

// nodeLock reports an item of the go-go-scope layout: no expiresAtMs.
func nodeLock(it item) bool { return it != nil && !has(it, aExp) && !has(it, aRel) }

func lockLive(it item, now int64) bool {
	return it != nil && !has(it, aRel) && lockExp(it) > now
}

func lockRec(key string, it item) driver.LockRecord {
	return driver.LockRecord{
		Key: key, Owner: gS(it, aOwner), Token: gN(it, aVersion),
		AcquiredAt: msTime(gN(it, aAcq)), ExpiresAt: msTime(lockExp(it)),
	}
}

// retentionTTL is the TTL attribute of a lock item whose holding ends at
// ms: the second after it, plus the lock retention.
func (s *store) retentionTTL(ms int64) int64 {
	return ttlSeconds(ms) + int64(s.retention/time.Second)
}

// Acquire forms: the condition and version update of a takeover, by what
// the item is.
const (
	// formWarden: absent, or warden's item released or expired, whose
	// version is below TokenBaseMicro(now) (or absent): the token is the
	// base. Tokens are max(version + 1, base), as on the SQL stores, so
	// a version another program lowered (a PutItem of the layout, an
	// UpdateItem) never makes a token go backwards.
	formWarden = iota
	// formWardenHigh: warden's item released or expired, whose version is
	// at or above TokenBaseMicro(now) (a holding that began within the
	// last fraction of a microsecond): version + 1.
	formWardenHigh
	// formNode: a go-go-scope item, expired by its seconds, whose version
	// is below TokenBase(now) (or absent).
	formNode
	// formNodeHigh: the same with a version at or above TokenBase(now).
	formNodeHigh
)

// acquireForm returns the condition and the version assignment of form f.
func acquireForm(f int) (cond, version string) {
	const nodeExpired = "attribute_exists(#pk) AND attribute_not_exists(#expiresAtMs) AND attribute_not_exists(#releasedAt) AND " +
		"(attribute_not_exists(#expiresAt) OR #expiresAt <= :nowSec)"
	switch f {
	case formNode:
		return nodeExpired + " AND (attribute_not_exists(#version) OR #version < :base1)", ":base1"
	case formNodeHigh:
		return nodeExpired + " AND #version >= :base1", "#version + :one"
	case formWardenHigh:
		return "(attribute_exists(#releasedAt) OR #expiresAtMs <= :now) AND #version >= :base1", "#version + :one"
	}
	return "(attribute_not_exists(#pk) OR attribute_exists(#releasedAt) OR #expiresAtMs <= :now) AND " +
		"(attribute_not_exists(#version) OR #version < :base1)", ":base1"
}

// Acquire implements driver.Locks with one conditional UpdateItem: it
// applies when the item is absent, released or expired (by the client's
// clock) and starts a new holding with token max(version+1,
// TokenBaseMicro(now)) (formWarden, formWardenHigh). When the condition fails, the endpoint returns the
// holder (ALL_OLD), or one consistent GetItem reads it; if the holder is
// owner itself, a second conditional update renews its holding and keeps
// its token. On endpoints without ALL_OLD, a store that found the lock
// held by another reads it first on its next attempts while that holding
// lasts (one request while it stays held). An acquire whose every attempt
// finds the item changed between its write and its read (or under the
// renewal) gives up with an error saying so (errContended), never with a
// made-up holder.
func (l locks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	rec, ok, err := l.acquire(ctx, key, owner, ttl)
	if ok {
		l.s.acquired(ctx, waitKey{PK: l.s.lockPfx + key, Owner: owner})
	}
	return rec, ok, err
}

// acquired ends k's wait once its Acquire holds the key: its place in
// the item's queue is given up (a hand-off removed it already; otherwise
// one more UpdateItem, on the contended path only).
func (s *store) acquired(ctx context.Context, k waitKey) {
	queued, h, handed := s.waits.book.Dequeue(k)
	if queued && (!handed || h.Entry) {
		_, _ = s.leavePlace(ctx, k)
	}
}

func (l locks) acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	s := l.s
	pk := s.lockPfx + key
	if h, ok := s.waits.book.TakeHanded(waitKey{PK: pk, Owner: owner}); ok {
		// Its WaitLock saw the key handed to owner: take the holding with
		// owner's TTL, one request. If it lapsed meanwhile, acquire.
		if r, ok, err := l.Refresh(ctx, key, owner, h.Token, ttl); err != nil || ok {
			if ok {
				s.waits.book.SetHanded(waitKey{PK: pk, Owner: owner}, h) // for acquired: whether the entry went with the hand-off
			}
			return r, ok, err
		}
	}
	if s.noAllOld.Load() {
		// On an endpoint that does not return the item with a failed
		// condition, a contended attempt costs the update and a read.
		// While this store last saw key held by another, read first:
		// one request while it stays held.
		if until, ok := s.heldHint.Load(pk); ok && nowMs() < until.(int64) {
			it, err := s.get(ctx, "reading lock", pk, metaSK)
			if err != nil {
				return driver.LockRecord{}, false, err
			}
			if lockLive(it, nowMs()) {
				rec := lockRec(key, it)
				if rec.Owner != owner {
					s.heldHint.Store(pk, lockExp(it))
					return rec, false, nil
				}
				if r, ok, err := l.Refresh(ctx, key, owner, rec.Token, ttl); err != nil || ok {
					return r, ok, err
				}
			}
		}
		s.heldHint.Delete(pk)
	}
	tries := s.attempts(retryLimit)
	form := formWarden
	for range tries {
		s.raced("write")
		t := time.Now()
		now := t.UnixMilli()
		exp := now + driver.Millis(ttl)
		req := reqID()
		base := driver.TokenBaseMicro(t)
		vals := item{":o": vS(owner), ":now": vN(now), ":nowSec": vN(now / 1000), ":exp": vN(exp), ":ttl": vN(s.retentionTTL(exp)),
			":base1": vN(base), ":one": vN(1), ":req": vS(req)}
		cond, version := acquireForm(form)
		upd := "SET #owner = :o, #version = " + version + ", #acquiredAt = :now, #expiresAtMs = :exp, " +
			"#expiresAt = :ttl, #updatedAt = :now, #req = :req" + lpkSet(s.lockPfx, vals) + s.evSet(s.lockEvt, now, req, vals) + " REMOVE #releasedAt, #handoff"
		attrs, failed, old, err := s.update(ctx, "acquiring lock", pk, metaSK, upd, cond, vals, types.ReturnValueAllNew)
		if err != nil {
			return driver.LockRecord{}, false, err
		}
		if !failed {
			s.noteQueue(pk, attrs)
			return lockRec(key, attrs), true, nil
		}
		if old == nil {
			s.noAllOld.Store(true)
			if old, err = s.get(ctx, "reading lock", pk, metaSK); err != nil {
				return driver.LockRecord{}, false, err
			}
		}
		if old != nil && gS(old, aReq) == req {
			// The SDK resent a write that had applied.
			return lockRec(key, old), true, nil
		}
		t = time.Now()
		now = t.UnixMilli()
		form = formWarden
		if nodeLock(old) && !lockLive(old, now) {
			// An expired go-go-scope lock: take it over in its own form.
			// The next attempt's base is at least TokenBaseMicro(t).
			form = formNode
			if has(old, aVersion) && gN(old, aVersion) >= driver.TokenBaseMicro(t) {
				form = formNodeHigh
			}
		} else if old != nil && !lockLive(old, now) && has(old, aVersion) && gN(old, aVersion) >= driver.TokenBaseMicro(t) {
			form = formWardenHigh
		}
		if lockLive(old, now) {
			rec := lockRec(key, old)
			if rec.Owner != owner {
				if s.noAllOld.Load() {
					s.hintHeld(pk, lockExp(old))
				}
				return rec, false, nil
			}
			s.raced("renew")
			r, ok, err := l.Refresh(ctx, key, owner, rec.Token, ttl)
			if err != nil || ok {
				return r, ok, err
			}
		}
		// The item changed between the condition and the read (or under
		// the renewal): try again.
	}
	// Neither acquired nor held by another as far as anyone can tell:
	// say so, rather than report a holder.
	return driver.LockRecord{}, false, &contendedError{op: "acquiring lock", key: key, tries: tries}
}

// maxHints bounds the held-lock hints a store keeps.
const maxHints = 10000

// hintHeld remembers that pk is held by another until exp (ms).
func (s *store) hintHeld(pk string, exp int64) {
	if s.hints.Add(1) > maxHints {
		s.heldHint.Clear()
		s.hints.Store(0)
	}
	s.heldHint.Store(pk, exp)
}

// Refresh implements driver.Locks: one conditional UpdateItem.
func (l locks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	s := l.s
	now := nowMs()
	exp := now + driver.Millis(ttl)
	vals := item{":o": vS(owner), ":t": vN(token), ":now": vN(now), ":exp": vN(exp), ":ttl": vN(s.retentionTTL(exp))}
	attrs, failed, _, err := s.update(ctx, "refreshing lock", s.lockPfx+key, metaSK,
		"SET #expiresAtMs = :exp, #expiresAt = :ttl, #updatedAt = :now REMOVE #handoff",
		"#owner = :o AND #version = :t AND attribute_not_exists(#releasedAt) AND #expiresAtMs > :now",
		vals, types.ReturnValueAllNew)
	if err != nil || failed {
		return driver.LockRecord{}, false, err
	}
	s.noteQueue(s.lockPfx+key, attrs)
	return lockRec(key, attrs), true, nil
}

// end marks a holding released with one conditional UpdateItem. If the
// condition fails, the item is read back (unless the endpoint returned
// it): a request id equal to this call's means the SDK resent a write that
// had applied.
func (s *store) endLock(ctx context.Context, op, key, cond string, vals item) (bool, error) {
	pk := s.lockPfx + key
	now := nowMs()
	req := reqID()
	vals[":now"] = vN(now)
	vals[":ttl"] = vN(now/1000 + int64(s.retention/time.Second)) // the go-go-scope layout's expiry: the lock is free from this second
	vals[":req"] = vS(req)
	upd := "SET #releasedAt = :now, #updatedAt = :now, #expiresAt = :ttl, #req = :req" + s.evSet(s.lockEvt, now, req, vals)
	_, failed, old, err := s.update(ctx, op, pk, metaSK, upd, cond, vals, types.ReturnValueNone)
	if err != nil || !failed {
		return err == nil, err
	}
	if old == nil {
		if old, err = s.get(ctx, "reading lock", pk, metaSK); err != nil {
			return false, err
		}
	}
	return old != nil && gS(old, aReq) == req, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Release implements driver.Locks: one conditional UpdateItem. The item is
// kept, marked released — or, when other owners wait in the item's queue,
// handed to the one that queued first (handoff.go): it becomes the holder,
// with the next token and an expiry handoff.Grace away, in the same request.
// The condition of the plain release requires an empty queue; a release
// that finds waiters it did not know of reads them from the failed
// condition's copy of the item (or one GetItem) and writes again.
func (l locks) Release(ctx context.Context, key, owner string, token int64) (bool, error) {
	return l.s.release(ctx, key, owner, token, false)
}

// release is Release; with untaken, only a holding handed to owner that
// no Acquire or Refresh took yet (the item's handoff attribute) is
// released: what a waiter that gives up releases, never a lease.
func (s *store) release(ctx context.Context, key, owner string, token int64, untaken bool) (bool, error) {
	pk := s.lockPfx + key
	mine := "#owner = :o AND #version = :t AND attribute_not_exists(#releasedAt)"
	if untaken {
		mine += " AND attribute_exists(#handoff)"
	}
	q, other := queueOf(s.queueHint(pk))
	tries := s.attempts(retryLimit)
	for range tries {
		t := time.Now()
		now := t.UnixMilli()
		req := reqID()
		vals := item{":o": vS(owner), ":t": vN(token), ":now": vN(now), ":req": vS(req)}
		names := map[string]string{}
		nextE, handTo, dropE := handoff.PickNext(q, owner, now)
		next, drop := "", owners(dropE)
		if handTo {
			next = nextE.Owner
		}
		if other {
			// A waiters attribute of another type, written by another
			// program: the plain release removes it (a map written since
			// the read stays).
			q, next, drop = nil, "", nil
		}
		// The entries this release removes: all of them (the attribute
		// whole, under a condition on its size, so that an entry written
		// since the queue was read stays), or those named.
		all := q != nil && len(drop)+btoi(next != "") == len(q)
		if !all && len(drop) > maxDrop {
			// DynamoDB refuses expressions over 4 KB: later releases and
			// the waiters' renewals remove the rest.
			drop = drop[:maxDrop]
		}
		var upd, cond string
		remove := func() string {
			if all {
				vals[":qn"] = vN(int64(len(q)))
				cond += " AND size(#waiters) = :qn"
				return " REMOVE #waiters"
			}
			if next != "" {
				return " REMOVE " + entryNames(append([]string{next}, drop...), names)
			}
			return " REMOVE " + entryNames(drop, names)
		}
		switch {
		case next != "":
			// Hand the key to next: a new holding, token max(t+1, base).
			exp := now + driver.Millis(handoff.Grace)
			vals[":n"] = vS(next)
			vals[":nv"] = vN(max(token+1, driver.TokenBaseMicro(t)))
			vals[":exp"] = vN(exp)
			vals[":ttl"] = vN(s.retentionTTL(exp))
			names["#w0"], names["#u"] = next, "u"
			cond = mine + " AND #waiters.#w0.#u > :now"
			upd = "SET #owner = :n, #version = :nv, #acquiredAt = :now, #expiresAtMs = :exp, #expiresAt = :ttl, " +
				"#updatedAt = :now, #req = :req, #handoff = :now" + s.evSet(s.lockEvt, now, req, vals) + remove()
		default:
			vals[":ttl"] = vN(now/1000 + int64(s.retention/time.Second)) // the go-go-scope layout's expiry: the lock is free from this second
			upd = "SET #releasedAt = :now, #updatedAt = :now, #expiresAt = :ttl, #req = :req" + s.evSet(s.lockEvt, now, req, vals)
			if other {
				vals[":M"] = vS("M")
				cond = mine + " AND attribute_exists(#waiters) AND NOT attribute_type(#waiters, :M)"
				upd += " REMOVE #waiters"
			} else if q != nil {
				// Only the releaser's own and lapsed entries, or an empty
				// queue: remove them.
				cond = mine + " AND attribute_exists(#waiters)"
				upd += remove()
			} else {
				// No queue known: the plain release, refused if there is
				// one. (attribute_not_exists, not size() = 0: the queue
				// attribute goes once empty, and size() costs dynalite a
				// third of a millisecond on every release.)
				cond = mine + " AND attribute_not_exists(#waiters)"
			}
		}
		_, failed, old, err := s.updateNames(ctx, "releasing lock", pk, metaSK, upd, cond, names, vals, types.ReturnValueNone)
		if err != nil {
			return false, err
		}
		if !failed {
			s.noteQueue(pk, nil)
			return true, nil
		}
		if old == nil {
			if old, err = s.get(ctx, "reading lock", pk, metaSK); err != nil {
				return false, err
			}
		}
		if old == nil {
			return false, nil
		}
		if gS(old, aReq) == req {
			// The SDK resent a write that had applied.
			s.noteQueue(pk, nil)
			return true, nil
		}
		if gS(old, aOwner) != owner || gN(old, aVersion) != token || has(old, aRel) || (untaken && !has(old, aHandoff)) {
			return false, nil // not owner's holding (any more), or taken
		}
		// Owner's holding, with another queue than the one guessed.
		q, other = queueOf(old)
	}
	return false, &contendedError{op: "releasing lock", key: key, tries: tries}
}

// ForceRelease implements driver.Locks: one conditional UpdateItem. A
// live holding of the go-go-scope layout (no expiresAtMs) is deleted
// instead, with one conditional DeleteItem, as that layout releases: kept
// and marked released, its small version would be the base of the next
// token.
func (l locks) ForceRelease(ctx context.Context, key string) (bool, error) {
	s := l.s
	ok, err := s.endLock(ctx, "force-releasing lock", key,
		"attribute_exists(#pk) AND attribute_not_exists(#releasedAt) AND #expiresAtMs > :now", item{})
	if err != nil || ok {
		return ok, err
	}
	_, failed, err := s.del(ctx, "force-releasing lock", s.lockPfx+key, metaSK,
		"attribute_exists(#pk) AND attribute_not_exists(#expiresAtMs) AND attribute_not_exists(#releasedAt) AND #expiresAt > :nowSec",
		item{":nowSec": vN(nowMs() / 1000)})
	return err == nil && !failed, err
}

// Get implements driver.Locks: one consistent GetItem.
func (l locks) Get(ctx context.Context, key string) (driver.LockRecord, bool, error) {
	it, err := l.s.get(ctx, "reading lock", l.s.lockPfx+key, metaSK)
	if err != nil || !lockLive(it, nowMs()) {
		return driver.LockRecord{}, false, err
	}
	return lockRec(key, it), true, nil
}

// List implements driver.Locks: a Query of the list index on the
// namespace and the pattern's literal prefix, the keys matched here, then
// consistent BatchGetItem reads of the matching items (store.list, walk);
// one GetItem for a pattern without wildcards.
func (l locks) List(ctx context.Context, pattern driver.Pattern) ([]driver.LockRecord, error) {
	s := l.s
	var out []driver.LockRecord
	now := nowMs()
	err := s.list(ctx, "listing locks", s.lockPfx, pattern, func(it item) error {
		k, ok := cutPrefix(gS(it, aPk), s.lockPfx)
		if ok && gS(it, aSk) == metaSK && pattern.Match(k) && lockLive(it, now) {
			out = append(out, lockRec(k, it))
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, err
}
