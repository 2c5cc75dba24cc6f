package mongo

import (
	"context"
	"errors"
	"sort"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// idempotency is the idempotency-key driver. A document: key (prefix +
// key), namespace, status (pending, completed), owner, fingerprint, result
// (binary), value (a completed result's native BSON form, when it has one:
// what the go-go-scope adapter reads), createdAt, expiresAt (the claim's
// lease, or the result's retention; null: kept until deleted), updatedAt.
//
// Records of the go-go-scope adapter (MongoDBIdempotencyAdapter): the
// adapter stores a task's result as {key, value, expiresAt, updatedAt},
// with an ObjectId _id and no namespace, after the task ran. warden reads
// such a record as a completed one whose result is the JSON of value:
// Claim reports it completed (never a loop on the adapter's unique key_1
// index, which its insert collides with), Get and List show it, Delete
// deletes it, and Set replaces it by warden's own record. An expired one
// is deleted by the Claim that meets it.
type idempotency struct{ s *store }

type idemDoc struct {
	Key         string     `bson:"key"`
	Status      string     `bson:"status"`
	Owner       *string    `bson:"owner"`
	Fingerprint *string    `bson:"fingerprint"`
	Result      []byte     `bson:"result"`
	CreatedAt   *time.Time `bson:"createdAt"`
	ExpiresAt   *time.Time `bson:"expiresAt"`
	UpdatedAt   *time.Time `bson:"updatedAt"`
	// Namespace is nil on the go-go-scope adapter's records, whose result
	// is Value.
	Namespace *string       `bson:"namespace"`
	Value     bson.RawValue `bson:"value"`
}

// foreign reports whether d holds a result the go-go-scope adapter
// stored: its own record, or warden's pending claim that the adapter's
// set (an upsert by key) wrote its value into. warden's own pending claims
// never have a value (a claim removes it), so a value there is the
// adapter's result.
func (d *idemDoc) foreign() bool {
	return (d.Namespace == nil && d.Status == "") || (d.Status == string(driver.IdemPending) && d.Value.Type != 0)
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func (d *idemDoc) record(key string) driver.IdemRecord {
	if d.foreign() {
		// A result the adapter stored: value (absent: JavaScript's
		// undefined, read as null).
		res := []byte("null")
		if d.Value.Type != 0 && d.Value.Type != bson.TypeUndefined {
			if b, err := valueJSON(d.Value); err == nil {
				res = b
			}
		}
		return driver.IdemRecord{Key: key, Status: driver.IdemCompleted, Result: res, CreatedAt: utc(d.UpdatedAt), ExpiresAt: utc(d.ExpiresAt)}
	}
	r := driver.IdemRecord{Key: key, Status: driver.IdemStatus(d.Status), Owner: str(d.Owner), Fingerprint: str(d.Fingerprint),
		CreatedAt: utc(d.CreatedAt), ExpiresAt: utc(d.ExpiresAt)}
	if r.Status == driver.IdemCompleted {
		r.Result = nonNil(d.Result)
	}
	return r
}

// Claim implements driver.Idempotency. One findOneAndUpdate with upsert
// claims an absent or lapsed key (returning the document as it was, which
// tells a takeover from a fresh claim); a live record makes the insert
// collide (E11000), and one read tells whose it is (the caller's own
// pending claim is then renewed).
func (i idempotency) Claim(ctx context.Context, key, owner string, lease time.Duration, fingerprint string) (driver.IdemRecord, driver.ClaimOutcome, error) {
	s := i.s
	sk := s.prefix + key
	for range s.tries {
		s.raced("write")
		t := now()
		exp := after(t, lease)
		var before idemDoc
		err := s.idem.FindOneAndUpdate(ctx, append(s.nsKey(sk), bson.E{Key: "expiresAt", Value: set("$lte", t)}),
			s.withIdent(bson.D{{Key: "$set", Value: set("status", string(driver.IdemPending), "owner", owner, "fingerprint", fingerprint,
				"result", nil, "createdAt", t, "expiresAt", exp, "updatedAt", t)}, {Key: "$unset", Value: set("value", "")}}, sk),
			options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.Before)).Decode(&before)
		rec := driver.IdemRecord{Key: key, Status: driver.IdemPending, Owner: owner, Fingerprint: fingerprint, CreatedAt: t, ExpiresAt: exp}
		switch {
		case err == nil && before.Status == string(driver.IdemPending):
			return rec, driver.TakenOver, nil
		case err == nil || errors.Is(err, mongo.ErrNoDocuments):
			return rec, driver.Claimed, nil
		case !isDup(err):
			return driver.IdemRecord{}, 0, ctxErr(ctx, err)
		}
		var d idemDoc
		err = s.idem.FindOne(ctx, s.nsKey(sk)).Decode(&d)
		if errors.Is(err, mongo.ErrNoDocuments) {
			// The insert collided with another document of this key: the
			// go-go-scope adapter's record (its unique key_1 index), or
			// warden's own, deleted meanwhile.
			if rec, done, err := i.foreignClaim(ctx, key, sk); err != nil || done {
				return rec, driver.Completed, err
			}
			continue
		}
		if err != nil {
			return driver.IdemRecord{}, 0, ctxErr(ctx, err)
		}
		t = now()
		if d.ExpiresAt != nil && !d.ExpiresAt.After(t) {
			continue // lapsed meanwhile
		}
		if d.Status == string(driver.IdemCompleted) || d.foreign() {
			return d.record(key), driver.Completed, nil
		}
		if str(d.Owner) != owner {
			return d.record(key), driver.InProgress, nil
		}
		// The caller's own live claim: renew the lease.
		s.raced("renew")
		exp = after(t, lease)
		res, err := s.idem.UpdateOne(ctx, append(s.nsKey(sk), bson.E{Key: "status", Value: string(driver.IdemPending)},
			bson.E{Key: "owner", Value: owner}, bson.E{Key: "expiresAt", Value: set("$gt", t)}),
			bson.D{{Key: "$set", Value: set("expiresAt", exp, "updatedAt", t)}})
		if err != nil {
			return driver.IdemRecord{}, 0, ctxErr(ctx, err)
		}
		if res.MatchedCount > 0 {
			r := d.record(key)
			r.ExpiresAt = exp
			return r, driver.Claimed, nil
		}
		if err := ctx.Err(); err != nil {
			return driver.IdemRecord{}, 0, err
		}
	}
	return driver.IdemRecord{}, 0, s.busy("claiming idempotency key", key)
}

// foreignClaim reads the go-go-scope adapter's record of stored key sk
// for a Claim that collided with it: a live one is a completed result
// (done); an expired one is deleted, if it still is, so that the claim
// can be tried again.
func (i idempotency) foreignClaim(ctx context.Context, key, sk string) (driver.IdemRecord, bool, error) {
	s := i.s
	var d idemDoc
	err := s.idem.FindOne(ctx, nodeEntry(sk)).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return driver.IdemRecord{}, false, nil
	}
	if err != nil {
		return driver.IdemRecord{}, false, ctxErr(ctx, err)
	}
	t := now()
	if liveAt(d.ExpiresAt, t) {
		return d.record(key), true, nil
	}
	if _, err := s.idem.DeleteOne(ctx, append(nodeEntry(sk), bson.E{Key: "expiresAt", Value: set("$lte", t)})); err != nil {
		return driver.IdemRecord{}, false, ctxErr(ctx, err)
	}
	return driver.IdemRecord{}, false, nil
}

func (i idempotency) pending(key, owner string) bson.D {
	return append(i.s.nsKey(i.s.prefix+key), bson.E{Key: "status", Value: string(driver.IdemPending)}, bson.E{Key: "owner", Value: owner})
}

// ownClaim is owner's pending claim of key, unless the go-go-scope
// adapter wrote its result into it (foreign): Extend and Abandon leave
// that result alone; Complete still writes the claimant's own.
func (i idempotency) ownClaim(key, owner string) bson.D {
	return append(i.pending(key, owner), bson.E{Key: "value", Value: set("$exists", false)})
}

// Extend implements driver.Idempotency.
func (i idempotency) Extend(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	t := now()
	res, err := i.s.idem.UpdateOne(ctx, i.ownClaim(key, owner), bson.D{{Key: "$set", Value: set("expiresAt", after(t, lease), "updatedAt", t)}})
	if err != nil {
		return false, ctxErr(ctx, err)
	}
	return res.MatchedCount > 0, nil
}

// Complete implements driver.Idempotency.
func (i idempotency) Complete(ctx context.Context, key, owner string, result []byte, retain time.Duration) (bool, error) {
	t := now()
	res, err := i.s.idem.UpdateOne(ctx, i.pending(key, owner), i.s.withValue(set(
		"status", string(driver.IdemCompleted), "result", nonNil(result), "expiresAt", expiry(t, retain), "updatedAt", t), result))
	if err != nil {
		return false, ctxErr(ctx, err)
	}
	return res.MatchedCount > 0, nil
}

// Abandon implements driver.Idempotency.
func (i idempotency) Abandon(ctx context.Context, key, owner string) (bool, error) {
	res, err := i.s.idem.DeleteOne(ctx, i.ownClaim(key, owner))
	if err != nil {
		return false, ctxErr(ctx, err)
	}
	return res.DeletedCount > 0, nil
}

// Get implements driver.Idempotency.
func (i idempotency) Get(ctx context.Context, key string) (driver.IdemRecord, bool, error) {
	s := i.s
	var d idemDoc
	t := now()
	err := s.idem.FindOne(ctx, s.nsKey(s.prefix+key)).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		err = s.idem.FindOne(ctx, nodeEntry(s.prefix+key)).Decode(&d)
	}
	if errors.Is(err, mongo.ErrNoDocuments) || (err == nil && !liveAt(d.ExpiresAt, t)) {
		return driver.IdemRecord{}, false, nil
	}
	if err != nil {
		return driver.IdemRecord{}, false, ctxErr(ctx, err)
	}
	return d.record(key), true, nil
}

// Set implements driver.Idempotency: one upsert.
func (i idempotency) Set(ctx context.Context, key string, result []byte, ttl time.Duration) error {
	s := i.s
	for range s.tries {
		s.raced("write")
		t := now()
		_, err := s.idem.UpdateOne(ctx, s.nsKey(s.prefix+key), s.withIdent(s.withValue(set(
			"status", string(driver.IdemCompleted), "owner", nil, "fingerprint", nil, "result", nonNil(result),
			"createdAt", t, "expiresAt", expiry(t, ttl), "updatedAt", t), result), s.prefix+key),
			options.UpdateOne().SetUpsert(true))
		if !isDup(err) {
			return ctxErr(ctx, err)
		}
		// The go-go-scope adapter's record of the key: replaced.
		if _, err := s.idem.DeleteOne(ctx, nodeEntry(s.prefix+key)); err != nil {
			return ctxErr(ctx, err)
		}
	}
	return s.busy("writing idempotency key", key)
}

// Delete implements driver.Idempotency.
func (i idempotency) Delete(ctx context.Context, key string) (bool, error) {
	s := i.s
	t := now()
	var d idemDoc
	err := s.idem.FindOneAndDelete(ctx, s.nsKey(s.prefix+key)).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		err = s.idem.FindOneAndDelete(ctx, nodeEntry(s.prefix+key)).Decode(&d)
	}
	if errors.Is(err, mongo.ErrNoDocuments) {
		return false, nil
	}
	if err != nil {
		return false, ctxErr(ctx, err)
	}
	return liveAt(d.ExpiresAt, t), nil
}

// List implements driver.Idempotency.
func (i idempotency) List(ctx context.Context, pattern driver.Pattern) ([]driver.IdemRecord, error) {
	s := i.s
	var out []driver.IdemRecord
	f := append(s.kindRange(s.prefix+pattern.Prefix()), live(now()))
	err := findAll(ctx, s.idem, f, nil, func(d *idemDoc) {
		if key, ok := strings.CutPrefix(d.Key, s.prefix); ok && pattern.Match(key) {
			out = append(out, d.record(key))
		}
	})
	sort.Slice(out, func(a, b int) bool { return out[a].Key < out[b].Key })
	return out, err
}

// withValue is the update that $sets fields and the completed result's
// value for the go-go-scope adapter, which hands a record's value to its
// service: the result's native BSON form when it has one that reads back
// byte for byte (see values.go); else value is removed (the adapter then
// reads undefined), never a form that reads back different.
func (s *store) withValue(fields bson.D, result []byte) bson.D {
	if v, size, ok := nativeValue(result); ok && size <= s.maxValue {
		return bson.D{{Key: "$set", Value: append(fields, bson.E{Key: "value", Value: v})}}
	}
	return bson.D{{Key: "$set", Value: fields}, {Key: "$unset", Value: set("value", "")}}
}
