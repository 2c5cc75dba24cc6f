package dynamo

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/warden-go/warden/driver"
)

// cache is the cache driver. An entry is one item (pk
// CACHE#<prefix>cache:<key>, sk METADATA) with data (absent for an empty
// value; native for JSON, see values.go) and, for entries with a TTL,
// expiresAtMs and expiresAt. An entry of the go-go-scope layout has no
// expiresAtMs: its expiresAt (epoch seconds) is its expiry.
type cache struct{ s *store }

func cacheLive(it item, now int64) bool {
	if it == nil {
		return false
	}
	exp, ok := expiryMs(it)
	return !ok || exp > now
}

// expiryMs returns the expiry of an item in milliseconds: expiresAtMs, or
// for an item of the go-go-scope layout, which has only the epoch seconds
// of expiresAt, the start of that second. ok is false when the item has
// neither (no expiry).
func expiryMs(it item) (ms int64, ok bool) {
	switch {
	case has(it, aExp):
		return gN(it, aExp), true
	case has(it, aTTL):
		return gN(it, aTTL) * 1000, true
	}
	return 0, false
}

func (c cache) item(key string, value []byte, ttl time.Duration, now int64, req string) item {
	it := itemKey(c.s.cachePfx+key, metaSK)
	it[aLpk] = vS(c.s.cachePfx)
	if len(value) > 0 {
		it[aData] = dataValue(value, c.s.maxValue)
	}
	if ttl > 0 {
		exp := now + driver.Millis(ttl)
		it[aExp] = vN(exp)
		it[aTTL] = vN(ttlSeconds(exp))
	}
	if req != "" {
		it[aReq] = vS(req)
	}
	return it
}

// Get implements driver.Cache: one consistent GetItem.
func (c cache) Get(ctx context.Context, key string) (driver.CacheEntry, bool, error) {
	it, err := c.s.get(ctx, "reading cache entry", c.s.cachePfx+key, metaSK)
	if err != nil || !cacheLive(it, nowMs()) {
		return driver.CacheEntry{}, false, err
	}
	v := []byte{}
	if d, ok := it[aData]; ok {
		if v, err = dataJSON(d); err != nil {
			return driver.CacheEntry{}, false, fmt.Errorf("%w (key %q)", err, key)
		}
	}
	exp, _ := expiryMs(it)
	return driver.CacheEntry{Key: key, Value: v, ExpiresAt: msTime(exp)}, true, nil
}

// Set implements driver.Cache: one PutItem.
func (c cache) Set(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	_, err := c.s.put(ctx, "writing cache entry", c.item(key, value, ttl, nowMs(), ""), "", nil)
	return err
}

// SetIfAbsent implements driver.Cache: one conditional PutItem (absent or
// expired). When the condition fails the item is read back, in case the
// SDK resent a put that had applied.
func (c cache) SetIfAbsent(ctx context.Context, key string, value []byte, ttl time.Duration) (bool, error) {
	now := nowMs()
	req := reqID()
	failed, err := c.s.put(ctx, "writing cache entry", c.item(key, value, ttl, now, req),
		"attribute_not_exists(#pk) OR #expiresAtMs <= :now OR (attribute_not_exists(#expiresAtMs) AND #expiresAt <= :nowSec)",
		item{":now": vN(now), ":nowSec": vN(now / 1000)})
	if err != nil || !failed {
		return err == nil, err
	}
	it, err := c.s.get(ctx, "reading cache entry", c.s.cachePfx+key, metaSK)
	return it != nil && gS(it, aReq) == req, err
}

// Delete implements driver.Cache: one DeleteItem returning the old item.
func (c cache) Delete(ctx context.Context, key string) (bool, error) {
	old, _, err := c.s.del(ctx, "deleting cache entry", c.s.cachePfx+key, metaSK, "", nil)
	return cacheLive(old, nowMs()), err
}

// Has implements driver.Cache: one consistent GetItem.
func (c cache) Has(ctx context.Context, key string) (bool, error) {
	_, ok, err := c.Get(ctx, key)
	return ok, err
}

// Clear implements driver.Cache: the namespace's entries (see walk: a
// Query of the list index and consistent BatchGetItem reads, which tell
// the live ones to count), then BatchWriteItem deletes, 25 a request.
// Deletes are unconditional: Clear removes every entry, whatever its
// state.
func (c cache) Clear(ctx context.Context) (int64, error) {
	s := c.s
	var keys []item
	var live int64
	now := nowMs()
	want := func(pk, sk string) need {
		if sk == metaSK {
			return load
		}
		return skip
	}
	err := s.walk(ctx, "listing cache entries", []span{{s.cachePfx, ""}}, want, func(pk, _ string, it item) error {
		keys = append(keys, itemKey(pk, metaSK))
		if cacheLive(it, now) {
			live++
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if err := s.deleteKeys(ctx, "clearing cache", keys); err != nil {
		return 0, err
	}
	return live, nil
}

// Keys implements driver.Cache: see locks.List.
func (c cache) Keys(ctx context.Context, pattern driver.Pattern) ([]string, error) {
	s := c.s
	var out []string
	now := nowMs()
	err := s.list(ctx, "listing cache keys", s.cachePfx, pattern, func(it item) error {
		k, ok := cutPrefix(gS(it, aPk), s.cachePfx)
		if ok && gS(it, aSk) == metaSK && pattern.Match(k) && cacheLive(it, now) {
			out = append(out, k)
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}
