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

// cache is the cache driver. A cache document: key (prefix + "cache:" +
// key), namespace, value (binary), expiresAt (null: no expiry), updatedAt.
type cache struct{ s *store }

type cacheDoc struct {
	Key       string     `bson:"key"`
	Value     []byte     `bson:"value"`
	ExpiresAt *time.Time `bson:"expiresAt"`
}

// Get implements driver.Cache: one find.
func (c cache) Get(ctx context.Context, key string) (driver.CacheEntry, bool, error) {
	s := c.s
	var d cacheDoc
	// Reads filter on _id alone and check expiry here: one document, read
	// atomically, and the only filter FerretDB looks up without a scan.
	t := now()
	err := s.cache.FindOne(ctx, s.nsKey(s.cachePfx+key), options.FindOne().SetProjection(set("value", 1, "expiresAt", 1))).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) || (err == nil && !liveAt(d.ExpiresAt, t)) {
		return driver.CacheEntry{}, false, nil
	}
	if err != nil {
		return driver.CacheEntry{}, false, ctxErr(ctx, err)
	}
	return driver.CacheEntry{Key: key, Value: nonNil(d.Value), ExpiresAt: utc(d.ExpiresAt)}, true, nil
}

// Set implements driver.Cache: one upsert.
func (c cache) Set(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	s := c.s
	for range s.tries {
		s.raced("write")
		t := now()
		_, err := s.cache.UpdateOne(ctx, s.nsKey(s.cachePfx+key),
			s.withIdent(bson.D{{Key: "$set", Value: set("value", nonNil(value), "expiresAt", expiry(t, ttl), "updatedAt", t)}}, s.cachePfx+key),
			options.UpdateOne().SetUpsert(true))
		if !isDup(err) { // concurrent first upserts: one inserts, repeat the other
			return ctxErr(ctx, err)
		}
	}
	return s.busy("writing cache entry", key)
}

// SetIfAbsent implements driver.Cache: one upsert whose filter matches an
// expired entry; a live entry makes the insert collide (E11000): not
// stored.
func (c cache) SetIfAbsent(ctx context.Context, key string, value []byte, ttl time.Duration) (bool, error) {
	s := c.s
	t := now()
	f := append(s.nsKey(s.cachePfx+key), bson.E{Key: "expiresAt", Value: set("$lte", t)})
	res, err := s.cache.UpdateOne(ctx, f,
		s.withIdent(bson.D{{Key: "$set", Value: set("value", nonNil(value), "expiresAt", expiry(t, ttl), "updatedAt", t)}}, s.cachePfx+key),
		options.UpdateOne().SetUpsert(true))
	if isDup(err) {
		return false, nil
	}
	if err != nil {
		return false, ctxErr(ctx, err)
	}
	return res.MatchedCount > 0 || res.UpsertedCount > 0, nil
}

// Delete implements driver.Cache.
func (c cache) Delete(ctx context.Context, key string) (bool, error) {
	s := c.s
	// Deletes the entry, live or expired (expired is absent), and reports
	// whether it was live.
	t := now()
	var d cacheDoc
	err := s.cache.FindOneAndDelete(ctx, s.nsKey(s.cachePfx+key)).Decode(&d)
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
	err := s.cache.FindOne(ctx, s.nsKey(s.cachePfx+key), options.FindOne().SetProjection(set("expiresAt", 1))).Decode(&d)
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
	res, err := s.cache.DeleteMany(ctx, append(s.keyRange("key", s.cachePfx), live(now())))
	if err != nil {
		return 0, ctxErr(ctx, err)
	}
	if _, err := s.cache.DeleteMany(ctx, s.keyRange("key", s.cachePfx)); err != nil {
		return res.DeletedCount, ctxErr(ctx, err)
	}
	return res.DeletedCount, nil
}

// Keys implements driver.Cache.
func (c cache) Keys(ctx context.Context, pattern driver.Pattern) ([]string, error) {
	s := c.s
	var out []string
	f := append(s.keyRange("key", s.cachePfx+pattern.Prefix()), live(now()))
	err := findAll(ctx, s.cache, f, set("key", 1), func(d *cacheDoc) {
		if key, ok := strings.CutPrefix(d.Key, s.cachePfx); ok && pattern.Match(key) {
			out = append(out, key)
		}
	})
	sort.Strings(out)
	return out, err
}
