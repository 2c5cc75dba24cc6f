package mongo

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/handoff"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// locks is the lock driver.
//
// A lock document: key (prefix + "lock:" + key), namespace, owner, token,
// acquiredAt, expiresAt, released, releasedAt, purgeAt, createdAt,
// updatedAt. The document is kept after release so that its token carries
// on: released: true, expiresAt removed and key parked (see parkedKey), so
// that neither the go-go-scope adapter's unique index on key nor its TTL
// index on expiresAt sees a released document. warden's TTL index on
// purgeAt (the end of the holding plus LockRetention) deletes it once it
// has been idle for the retention.
//
// Locks of the go-go-scope adapter. The adapter inserts its own documents
// (an ObjectId _id, key, owner, expiresAt, createdAt) and relies on a
// unique index on key. A warden acquire that collides with such a document
// reports it as the holder while it is live, and deletes it (conditionally
// on its expiry) once it has expired; see foreign.
//
// Fencing tokens. A new holding gets the candidate token tokenBase(now),
// about 4.1 per microsecond of the client's clock, if that is greater than
// the document's token; the acquire's filter requires it
// (token < candidate), so the one update both checks and sets it. When the
// candidate is not greater (a second holding within the same millisecond,
// or a client whose clock is behind the last holder's), the acquire falls
// back to a compare-and-swap on the token it read, setting token + 1.
// Either way the token only grows, strictly, and a document recreated after
// the retention, or after another program deleted it (the go-go-scope
// adapter's forceRelease), starts above every token the old one handed out
// as long as the clock has moved on a microsecond since.
type locks struct{ s *store }

// tokenBase is the candidate token of a holding that starts at t
// (driver.TokenBaseMicro): a document deleted by another program and
// recreated a round trip later starts above every token handed out before.
func tokenBase(t time.Time) int64 { return driver.TokenBaseMicro(t) }

type lockDoc struct {
	Key        string     `bson:"key"`
	Owner      string     `bson:"owner"`
	Token      int64      `bson:"token"`
	AcquiredAt *time.Time `bson:"acquiredAt"`
	ExpiresAt  *time.Time `bson:"expiresAt"`
	Released   bool       `bson:"released"`
	// Waiters is the queue of the fair hand-off (handoff.go), as stored.
	Waiters bson.RawValue `bson:"waiters"`
	// Handoff marks a holding a release handed to a waiter, until a
	// refresh or acquire takes it.
	Handoff *time.Time `bson:"handoff"`
}

func (d lockDoc) record(key string) driver.LockRecord {
	return driver.LockRecord{Key: key, Owner: d.Owner, Token: d.Token, AcquiredAt: utc(d.AcquiredAt), ExpiresAt: utc(d.ExpiresAt)}
}

// liveAt reports whether the document is a live holding at t.
func (d lockDoc) liveAt(t time.Time) bool {
	return !d.Released && d.ExpiresAt != nil && d.ExpiresAt.After(t)
}

// free is the condition of a document without a live holding at t.
func free(t time.Time) bson.E {
	return bson.E{Key: "$or", Value: bson.A{
		bson.D{{Key: "released", Value: true}},
		bson.D{{Key: "expiresAt", Value: bson.D{{Key: "$lte", Value: t}}}},
	}}
}

var lockProj = bson.D{{Key: "key", Value: 1}, {Key: "owner", Value: 1}, {Key: "token", Value: 1},
	{Key: "acquiredAt", Value: 1}, {Key: "expiresAt", Value: 1}, {Key: "released", Value: 1}}

// after1 returns the document as the update left it. (No projection:
// FerretDB does not implement findAndModify's "fields".)
func after1() *options.FindOneAndUpdateOptionsBuilder {
	return options.FindOneAndUpdate().SetReturnDocument(options.After)
}

// Acquire implements driver.Locks, the same way on every server. The
// uncontended path — the key absent, released or expired, and the
// candidate token greater than the stored one — is one findOneAndUpdate
// with upsert whose filter matches a free document; an expired holding is
// taken over at once. When the filter matches nothing the upsert collides
// with the existing document on the unique _id (E11000; also what the
// loser of two upserts racing on one absent key is told): one read tells
// whether the lock is held by someone else (returned, not acquired), is the
// caller's own live holding (renewed, token kept) or is free with a token
// at or above the candidate (taken by a compare-and-swap on the token read,
// setting max(candidate, token+1)). A read that finds no document (deleted
// since the collision, or a winner's insert the read does not see yet)
// looks for a go-go-scope holding of the key and, finding none, starts
// again with the upsert.
//
// Each step that finds the document changed since it was read starts
// again; after the store's retry limit the acquire gives up with an error
// that names the key and the attempts (errBusy), never an outcome.
func (l locks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	s := l.s
	k := handoff.Key{PK: s.lockPfx + key, Owner: owner}
	if h, ok := s.book.TakeHanded(k); ok {
		// Its WaitLock saw the key handed to owner: take the holding with
		// owner's TTL, one request. If it lapsed meanwhile, acquire.
		if r, ok, err := l.Refresh(ctx, key, owner, h.Token, ttl); err != nil || ok {
			if ok {
				s.acquired(k)
			}
			return r, ok, err
		}
	}
	rec, ok, err := l.acquire(ctx, key, owner, ttl)
	if ok {
		s.acquired(k)
	}
	return rec, ok, err
}

// takeUnset is what every write that starts or renews owner's holding
// removes: the hand-off mark, and owner's own entry in the queue when
// owner waited (owner's Acquire calls, after a WaitLock).
func (s *store) takeUnset(sk, owner string) bson.E {
	u := bson.D{{Key: fHandoff, Value: ""}}
	if s.book.Queued(handoff.Key{PK: sk, Owner: owner}) {
		u = append(u, bson.E{Key: entryPath(owner), Value: ""})
	}
	return bson.E{Key: "$unset", Value: u}
}

func (l locks) acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	s := l.s
	sk := s.lockPfx + key
	unset := s.takeUnset(sk, owner)
	write := true // try the upsert first: on the first attempt, and after finding no document
	for range s.tries {
		s.raced("write")
		wall := time.Now()
		t := wall.UTC().Truncate(time.Millisecond) // now()
		cand := tokenBase(wall)
		var d lockDoc
		if write {
			filter := append(s.nsKey(sk), bson.E{Key: "token", Value: bson.D{{Key: "$lt", Value: cand}}}, free(t))
			update := bson.D{
				{Key: "$set", Value: bson.D{{Key: "key", Value: sk}, {Key: "owner", Value: owner}, {Key: "token", Value: cand},
					{Key: "acquiredAt", Value: t}, {Key: "expiresAt", Value: after(t, ttl)},
					{Key: "released", Value: false}, {Key: "releasedAt", Value: nil}, {Key: "purgeAt", Value: purgeAt(t, ttl)}, {Key: "updatedAt", Value: t}}},
				{Key: "$setOnInsert", Value: bson.D{{Key: "createdAt", Value: t}, {Key: "namespace", Value: s.prefix}}},
				unset,
			}
			err := s.locks.FindOneAndUpdate(ctx, filter, update, after1().SetUpsert(true)).Decode(&d)
			if err == nil {
				s.noteQueue(sk, &d)
				s.emitLock(ctx, evAcquired, sk, d.Owner, d.Token, t)
				return d.record(key), true, nil
			}
			if !isDup(err) {
				return driver.LockRecord{}, false, ctxErr(ctx, err)
			}
		}
		// The document exists: read it.
		err := s.locks.FindOne(ctx, s.nsKey(sk), options.FindOne().SetProjection(lockProj)).Decode(&d)
		write = false
		if errors.Is(err, mongo.ErrNoDocuments) {
			// No document of ours: the collision was on key, with a
			// go-go-scope holding, or ours was deleted meanwhile (or is
			// not visible to this read yet).
			rec, held, err := l.foreign(ctx, key, sk)
			if err != nil || held {
				return rec, false, err
			}
			write = true
			continue // the other document is gone (or was deleted as expired): upsert again
		}
		if err != nil {
			return driver.LockRecord{}, false, ctxErr(ctx, err)
		}
		wall = time.Now()
		t = wall.UTC().Truncate(time.Millisecond) // now()
		switch {
		case d.liveAt(t) && d.Owner != owner:
			return d.record(key), false, nil
		case d.liveAt(t):
			// The caller's own live holding: renew it, keep the token.
			s.raced("renew")
			f := append(s.nsKey(sk), bson.E{Key: "owner", Value: owner}, bson.E{Key: "token", Value: d.Token},
				bson.E{Key: "released", Value: false}, bson.E{Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: t}}})
			u := bson.D{{Key: "$set", Value: bson.D{{Key: "expiresAt", Value: after(t, ttl)}, {Key: "purgeAt", Value: purgeAt(t, ttl)}, {Key: "updatedAt", Value: t}}}, unset}
			var r lockDoc
			err := s.locks.FindOneAndUpdate(ctx, f, u, after1()).Decode(&r)
			if err == nil {
				s.noteQueue(sk, &r)
				return r.record(key), true, nil
			}
			if !errors.Is(err, mongo.ErrNoDocuments) {
				return driver.LockRecord{}, false, ctxErr(ctx, err)
			}
		default:
			// Free: compare-and-swap on the token read.
			tok := max(tokenBase(wall), d.Token+1)
			f := append(s.nsKey(sk), bson.E{Key: "token", Value: d.Token}, free(t))
			u := bson.D{{Key: "$set", Value: bson.D{{Key: "key", Value: sk}, {Key: "owner", Value: owner}, {Key: "token", Value: tok},
				{Key: "acquiredAt", Value: t}, {Key: "expiresAt", Value: after(t, ttl)}, {Key: "released", Value: false},
				{Key: "releasedAt", Value: nil}, {Key: "purgeAt", Value: purgeAt(t, ttl)}, {Key: "updatedAt", Value: t}}}, unset}
			var r lockDoc
			err := s.locks.FindOneAndUpdate(ctx, f, u, after1()).Decode(&r)
			if err == nil {
				s.noteQueue(sk, &r)
				s.emitLock(ctx, evAcquired, sk, r.Owner, r.Token, t)
				return r.record(key), true, nil
			}
			if isDup(err) {
				// Our released document cannot take the key back: a
				// go-go-scope holding has it.
				rec, held, err := l.foreign(ctx, key, sk)
				if err != nil || held {
					return rec, false, err
				}
				continue
			}
			if !errors.Is(err, mongo.ErrNoDocuments) {
				return driver.LockRecord{}, false, ctxErr(ctx, err)
			}
		}
		if err := ctx.Err(); err != nil {
			return driver.LockRecord{}, false, err
		}
	}
	return driver.LockRecord{}, false, s.busy("acquiring lock", key)
}

// Refresh implements driver.Locks: one findOneAndUpdate checked on owner,
// token and liveness. It takes a holding handed to owner (removes the
// hand-off mark).
func (l locks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	s := l.s
	sk := s.lockPfx + key
	t := now()
	f := append(s.nsKey(sk), bson.E{Key: "owner", Value: owner}, bson.E{Key: "token", Value: token},
		bson.E{Key: "released", Value: false}, bson.E{Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: t}}})
	u := bson.D{{Key: "$set", Value: bson.D{{Key: "expiresAt", Value: after(t, ttl)}, {Key: "purgeAt", Value: purgeAt(t, ttl)}, {Key: "updatedAt", Value: t}}},
		s.takeUnset(sk, owner)}
	var d lockDoc
	err := s.locks.FindOneAndUpdate(ctx, f, u, after1()).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return driver.LockRecord{}, false, nil
	}
	if err != nil {
		return driver.LockRecord{}, false, ctxErr(ctx, err)
	}
	s.noteQueue(sk, &d)
	return d.record(key), true, nil
}

// releaseUpdate marks the holding of the document with _id id released at
// t. The document stays, with its token, out of the way of the go-go-scope
// adapter: its key parked (the adapter's unique index on key then lets the
// adapter insert its own holding) and no expiresAt (the adapter's TTL index
// on expiresAt, expireAfterSeconds 0, would delete it at once and the
// token with it). purgeAt keeps it for LockRetention.
func releaseUpdate(id string, t time.Time) bson.D {
	return bson.D{
		{Key: "$set", Value: bson.D{{Key: "key", Value: parkedKey(id)}, {Key: "released", Value: true}, {Key: "releasedAt", Value: t},
			{Key: "purgeAt", Value: t.Add(LockRetention)}, {Key: "updatedAt", Value: t}}},
		{Key: "$unset", Value: bson.D{{Key: "expiresAt", Value: ""}, {Key: fHandoff, Value: ""}}},
	}
}

// parkedKey is the key of a released lock document whose _id is id. It
// starts with ':', which no stored key of warden does (a prefix is a name
// followed by ':', a store without prefix starts with a kind tag), and is
// unique per document, as the unique indexes on key need.
func parkedKey(id string) string { return ":released:" + id }

// purgeAt is when the TTL index on purgeAt may delete a lock document
// whose holding runs from t for ttl: LockRetention after its end.
func purgeAt(t time.Time, ttl time.Duration) time.Time { return after(t, ttl).Add(LockRetention) }

// foreignLock is a lock document under another _id holding the stored key:
// one the go-go-scope adapter inserted.
type foreignLock struct {
	ID        any        `bson:"_id"`
	Owner     string     `bson:"owner"`
	CreatedAt *time.Time `bson:"createdAt"`
	ExpiresAt *time.Time `bson:"expiresAt"`
	Namespace *string    `bson:"namespace"`
}

// foreign looks at the document that holds the stored key sk under an _id
// other than warden's, after an acquire collided on the key. A live one is
// the holder (held: the acquire is not granted). An expired one is deleted,
// on condition that it is still expired (a holder that extended it keeps
// it), and the acquire tries again; so does one that is gone. A go-go-scope
// holding has no token: tokens come from warden's own document, or
// TokenBase when there is none.
func (l locks) foreign(ctx context.Context, key, sk string) (driver.LockRecord, bool, error) {
	s := l.s
	var d foreignLock
	err := s.locks.FindOne(ctx, bson.D{{Key: "key", Value: sk}, {Key: "_id", Value: bson.D{{Key: "$ne", Value: s.docID(sk)}}}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return driver.LockRecord{}, false, nil
	}
	if err != nil {
		return driver.LockRecord{}, false, ctxErr(ctx, err)
	}
	if d.Namespace != nil {
		return driver.LockRecord{}, false, fmt.Errorf("mongo: acquiring lock %q: document %v of namespace %q holds the same stored key %q", key, d.ID, *d.Namespace, sk)
	}
	t := now()
	if d.ExpiresAt == nil || d.ExpiresAt.After(t) {
		// A go-go-scope lock without expiresAt never expires there either.
		return driver.LockRecord{Key: key, Owner: d.Owner, AcquiredAt: utc(d.CreatedAt), ExpiresAt: utc(d.ExpiresAt)}, true, nil
	}
	if _, err := s.locks.DeleteOne(ctx, bson.D{{Key: "_id", Value: d.ID}, {Key: "expiresAt", Value: bson.D{{Key: "$lte", Value: t}}}}); err != nil {
		return driver.LockRecord{}, false, ctxErr(ctx, err)
	}
	return driver.LockRecord{}, false, nil
}

// Release implements driver.Locks: one updateOne checked on owner and
// token, expired or not, and on the document having no queue. While
// others wait in the document's queue (handoff.go), the same one update
// hands the key to the first of them instead; a queue the store did not
// know of costs a read and a second update.
func (l locks) Release(ctx context.Context, key, owner string, token int64) (bool, error) {
	return l.s.release(ctx, key, owner, token, false)
}

// release is Release; with untaken, only a holding handed to owner that
// no Acquire or Refresh took yet (the document's handoff mark) is
// released: what a waiter that gives up releases, never a lease.
func (s *store) release(ctx context.Context, key, owner string, token int64, untaken bool) (bool, error) {
	sk := s.lockPfx + key
	mine := append(s.nsKey(sk), bson.E{Key: "owner", Value: owner}, bson.E{Key: "token", Value: token}, bson.E{Key: "released", Value: false})
	if untaken {
		mine = append(mine, bson.E{Key: fHandoff, Value: set("$exists", true)})
	}
	rv := s.queueHint(sk)
	for range s.tries {
		wall := time.Now()
		t := wall.UTC().Truncate(time.Millisecond)
		q, other := queueOf(rv)
		next, ok, drop := handoff.PickNext(q, owner, wall.UnixMilli())
		f := append(bson.D(nil), mine...)
		var u bson.D
		switch {
		case ok && !other:
			// Hand the key to next: a new holding, token max(t+1, base).
			tok := max(token+1, tokenBase(wall))
			exp := t.Add(handoff.Grace)
			var rm bson.D
			if len(drop)+1 == len(q) {
				// Every entry goes: the queue whole, if it is unchanged.
				f = append(f, bson.E{Key: fWaiters, Value: rv})
				rm = bson.D{{Key: fWaiters, Value: ""}}
			} else {
				f = append(f, bson.E{Key: fWaiters + "." + next.Name + ".u", Value: set("$gt", wall.UnixMilli())})
				rm = bson.D{{Key: fWaiters + "." + next.Name, Value: ""}}
				for _, e := range drop {
					rm = append(rm, bson.E{Key: fWaiters + "." + e.Name, Value: ""})
				}
			}
			u = bson.D{
				{Key: "$set", Value: bson.D{{Key: "owner", Value: next.Owner}, {Key: "token", Value: tok}, {Key: "acquiredAt", Value: t},
					{Key: "expiresAt", Value: exp}, {Key: "purgeAt", Value: exp.Add(LockRetention)}, {Key: "updatedAt", Value: t}, {Key: fHandoff, Value: t}}},
				{Key: "$unset", Value: rm},
			}
			res, err := s.locks.UpdateOne(ctx, f, u)
			if err != nil {
				return false, ctxErr(ctx, err)
			}
			if res.MatchedCount > 0 {
				s.noteQueue(sk, nil)
				s.emitLock(ctx, evReleased, sk, owner, token, t)
				s.emitLock(ctx, evAcquired, sk, next.Owner, tok, t)
				return true, nil
			}
		default:
			if rv.Type == 0 {
				// No queue known: the plain release, refused if there is
				// one.
				f = append(f, bson.E{Key: fWaiters, Value: set("$exists", false)})
				u = releaseUpdate(s.docID(sk), t)
			} else {
				// Only owner's own and lapsed entries, an empty queue, or a
				// waiters field of another program's: removed whole, if it
				// is unchanged since read.
				f = append(f, bson.E{Key: fWaiters, Value: rv})
				u = releaseUpdate(s.docID(sk), t)
				u[1].Value = append(u[1].Value.(bson.D), bson.E{Key: fWaiters, Value: ""})
			}
			res, err := s.locks.UpdateOne(ctx, f, u)
			if err != nil {
				return false, ctxErr(ctx, err)
			}
			if res.MatchedCount > 0 {
				s.noteQueue(sk, nil)
				s.emitLock(ctx, evReleased, sk, owner, token, t)
				return true, nil
			}
		}
		// Not released: not owner's holding (any more), or a queue other
		// than the one guessed. Read it.
		d, err := s.readLock(ctx, sk)
		if err != nil {
			return false, err
		}
		if d == nil || d.Owner != owner || d.Token != token || d.Released || (untaken && d.Handoff == nil) {
			s.noteQueue(sk, nil)
			return false, nil
		}
		rv = d.Waiters
	}
	return false, s.busy("releasing lock", key)
}

// ForceRelease implements driver.Locks.
func (l locks) ForceRelease(ctx context.Context, key string) (bool, error) {
	s := l.s
	sk := s.lockPfx + key
	t := now()
	f := append(s.nsKey(sk), bson.E{Key: "released", Value: false}, bson.E{Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: t}}})
	var d lockDoc
	err := s.locks.FindOneAndUpdate(ctx, f, releaseUpdate(s.docID(sk), t)).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		// A live holding of the go-go-scope adapter is its document:
		// deleted, as the adapter's own forceRelease does.
		res, err := s.locks.DeleteOne(ctx, append(nodeEntry(sk), bson.E{Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: t}}}))
		if err != nil {
			return false, ctxErr(ctx, err)
		}
		return res.DeletedCount > 0, nil
	}
	if err != nil {
		return false, ctxErr(ctx, err)
	}
	s.emitLock(ctx, evReleased, sk, d.Owner, d.Token, t)
	return true, nil
}

// liveLock is the condition of a live holding at t (a go-go-scope
// adapter's document has no released field).
func liveLock(t time.Time) bson.D {
	return bson.D{{Key: "released", Value: bson.D{{Key: "$ne", Value: true}}}, {Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: t}}}}
}

// Get implements driver.Locks: one find whose $or matches warden's
// document by _id and a go-go-scope adapter's holding by key (both
// indexed: _id, key_1). At most one document holds the key, and warden's
// released one has given it up, so the live one is the answer.
func (l locks) Get(ctx context.Context, key string) (driver.LockRecord, bool, error) {
	s := l.s
	sk := s.lockPfx + key
	t := now()
	f := bson.D{{Key: "$or", Value: bson.A{s.nsKey(sk), nodeEntry(sk)}}}
	cur, err := s.locks.Find(ctx, f, options.Find().SetProjection(lockProj))
	if err != nil {
		return driver.LockRecord{}, false, ctxErr(ctx, err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	for cur.Next(ctx) {
		var d lockDoc
		if err := cur.Decode(&d); err != nil {
			return driver.LockRecord{}, false, err
		}
		if d.liveAt(t) {
			return d.record(key), true, nil
		}
	}
	return driver.LockRecord{}, false, ctxErr(ctx, cur.Err())
}

// List implements driver.Locks: warden's live holdings in the namespace
// and the go-go-scope adapter's (no namespace) in its key range.
func (l locks) List(ctx context.Context, pattern driver.Pattern) ([]driver.LockRecord, error) {
	s := l.s
	var out []driver.LockRecord
	f := append(s.kindRange(s.lockPfx+pattern.Prefix()), liveLock(now())...)
	err := findAll(ctx, s.locks, f, lockProj, func(d *lockDoc) {
		if key, ok := strings.CutPrefix(d.Key, s.lockPfx); ok && pattern.Match(key) {
			out = append(out, d.record(key))
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, err
}

// findAll runs a find and calls each for every decoded document, reading
// every batch.
func findAll[T any](ctx context.Context, c *mongo.Collection, filter bson.D, proj bson.D, each func(*T)) error {
	o := options.Find()
	if proj != nil {
		o.SetProjection(proj)
	}
	cur, err := c.Find(ctx, filter, o)
	if err != nil {
		return ctxErr(ctx, err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	for cur.Next(ctx) {
		var d T
		if err := cur.Decode(&d); err != nil {
			return err
		}
		each(&d)
	}
	return ctxErr(ctx, cur.Err())
}
