package mongo

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// cache is the cache driver. A cache document: _id and key (prefix +
// "cache:" + key), namespace, value (native BSON for JSON values, else
// binary: see values.go), expiresAt (null: no expiry), updatedAt.
//
// Entries of the go-go-scope adapter. The adapter upserts by key alone, so
// it writes into warden's document when there is one; when there is none
// it inserts its own, with an ObjectId _id and no namespace. warden reads,
// overwrites and deletes such a document as the entry of its key: a lookup
// by _id that finds nothing also looks for a document with that key and
// no namespace (in the same query), and a write that collides with one on
// the unique key index writes into it.
type cache struct{ s *store }

type cacheDoc struct {
	ID        any           `bson:"_id"`
	Key       string        `bson:"key"`
	Value     bson.RawValue `bson:"value"`
	ExpiresAt *time.Time    `bson:"expiresAt"`
}

// nodeEntry is the filter of a go-go-scope adapter's entry of stored key
// sk: that key, no namespace.
func nodeEntry(sk string) bson.D {
	return bson.D{{Key: "key", Value: sk}, {Key: "namespace", Value: bson.D{{Key: "$exists", Value: false}}}}
}

// kindRange restricts a listing (cache entries, locks) to stored keys
// starting with prefix in the namespace: warden's documents by their namespace, the
// go-go-scope adapter's (no namespace) by their key alone, which the key
// range bounds (stored keys are unambiguous, see driver.ValidatePrefix).
func (s *store) kindRange(prefix string) bson.D {
	r := s.keyRange("key", prefix)
	r[0] = bson.E{Key: "namespace", Value: bson.D{{Key: "$in", Value: bson.A{s.prefix, nil}}}}
	return r
}

// findEntry reads the entry of stored key sk: warden's document, else the
// go-go-scope adapter's, in one query whose branches are both indexed
// (_id, key_1). warden's document wins should both exist (the sort puts
// strings before ObjectIds).
func (c cache) findEntry(ctx context.Context, sk string, d *cacheDoc) error {
	s := c.s
	f := bson.D{{Key: "$or", Value: bson.A{s.nsKey(sk), nodeEntry(sk)}}}
	proj := options.FindOne().SetProjection(set("value", 1, "expiresAt", 1)).SetSort(set("_id", 1))
	return s.cache.FindOne(ctx, f, proj).Decode(d)
}

// Get implements driver.Cache: one find.
func (c cache) Get(ctx context.Context, key string) (driver.CacheEntry, bool, error) {
	s := c.s
	var d cacheDoc
	// The read checks expiry here, on the document it read: one
	// document, read atomically.
	t := now()
	err := c.findEntry(ctx, s.cachePfx+key, &d)
	if errors.Is(err, mongo.ErrNoDocuments) || (err == nil && !liveAt(d.ExpiresAt, t)) {
		return driver.CacheEntry{}, false, nil
	}
	if err != nil {
		return driver.CacheEntry{}, false, ctxErr(ctx, err)
	}
	v, err := valueJSON(d.Value)
	if err != nil {
		return driver.CacheEntry{}, false, fmt.Errorf("%w (key %q)", err, key)
	}
	return driver.CacheEntry{Key: key, Value: v, ExpiresAt: utc(d.ExpiresAt)}, true, nil
}

// Set implements driver.Cache: one upsert; two when the key's entry is the
// go-go-scope adapter's document, which the upsert collides with.
func (c cache) Set(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	s := c.s
	sk := s.cachePfx + key
	v := storedValue(value, s.maxValue)
	for range s.tries {
		s.raced("write")
		t := now()
		upd := bson.D{{Key: "$set", Value: set("value", v, "expiresAt", expiry(t, ttl), "updatedAt", t)}}
		_, err := s.cache.UpdateOne(ctx, s.nsKey(sk), s.withIdent(upd, sk), options.UpdateOne().SetUpsert(true))
		if !isDup(err) { // concurrent first upserts: one inserts, repeat the other
			return ctxErr(ctx, err)
		}
		res, err := s.cache.UpdateOne(ctx, nodeEntry(sk), upd)
		if err != nil {
			return ctxErr(ctx, err)
		}
		if res.MatchedCount > 0 {
			return nil
		}
	}
	return s.busy("writing cache entry", key)
}

// SetIfAbsent implements driver.Cache: one upsert whose filter matches an
// expired entry; a live entry makes the insert collide (E11000): not
// stored, unless the collision was with an expired entry of the
// go-go-scope adapter, which is then overwritten on condition that it is
// still expired.
func (c cache) SetIfAbsent(ctx context.Context, key string, value []byte, ttl time.Duration) (bool, error) {
	s := c.s
	sk := s.cachePfx + key
	t := now()
	upd := bson.D{{Key: "$set", Value: set("value", storedValue(value, s.maxValue), "expiresAt", expiry(t, ttl), "updatedAt", t)}}
	f := append(s.nsKey(sk), bson.E{Key: "expiresAt", Value: set("$lte", t)})
	res, err := s.cache.UpdateOne(ctx, f, s.withIdent(upd, sk), options.UpdateOne().SetUpsert(true))
	if isDup(err) {
		if dupOnID(err) {
			return false, nil // warden's own entry is live
		}
		res, err := s.cache.UpdateOne(ctx, append(nodeEntry(sk), bson.E{Key: "expiresAt", Value: set("$lte", t)}), upd)
		if err != nil {
			return false, ctxErr(ctx, err)
		}
		return res.MatchedCount > 0, nil
	}
	if err != nil {
		return false, ctxErr(ctx, err)
	}
	return res.MatchedCount > 0 || res.UpsertedCount > 0, nil
}

// Delete implements driver.Cache.
func (c cache) Delete(ctx context.Context, key string) (bool, error) {
	s := c.s
	sk := s.cachePfx + key
	// Deletes the entry, live or expired (expired is absent), and reports
	// whether it was live.
	t := now()
	var d cacheDoc
	err := s.cache.FindOneAndDelete(ctx, s.nsKey(sk)).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		err = s.cache.FindOneAndDelete(ctx, nodeEntry(sk)).Decode(&d)
	}
	if errors.Is(err, mongo.ErrNoDocuments) {
		return false, nil
	}
	if err != nil {
		return false, ctxErr(ctx, err)
	}
	return liveAt(d.ExpiresAt, t), nil
}

// Has implements driver.Cache.
func (c cache) Has(ctx context.Context, key string) (bool, error) {
	s := c.s
	t := now()
	var d cacheDoc
	err := c.findEntry(ctx, s.cachePfx+key, &d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return false, nil
	}
	if err != nil {
		return false, ctxErr(ctx, err)
	}
	return liveAt(d.ExpiresAt, t), nil
}

// Clear implements driver.Cache: deletes the namespace's live entries
// (counted), then its expired ones.
func (c cache) Clear(ctx context.Context) (int64, error) {
	s := c.s
	res, err := s.cache.DeleteMany(ctx, append(s.kindRange(s.cachePfx), live(now())))
	if err != nil {
		return 0, ctxErr(ctx, err)
	}
	if _, err := s.cache.DeleteMany(ctx, s.kindRange(s.cachePfx)); err != nil {
		return res.DeletedCount, ctxErr(ctx, err)
	}
	return res.DeletedCount, nil
}

// Keys implements driver.Cache.
func (c cache) Keys(ctx context.Context, pattern driver.Pattern) ([]string, error) {
	s := c.s
	var out []string
	f := append(s.kindRange(s.cachePfx+pattern.Prefix()), live(now()))
	err := findAll(ctx, s.cache, f, set("key", 1), func(d *cacheDoc) {
		if key, ok := strings.CutPrefix(d.Key, s.cachePfx); ok && pattern.Match(key) {
			out = append(out, key)
		}
	})
	sort.Strings(out)
	return out, err
}
