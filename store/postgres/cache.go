package postgres

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
)

// cache is the cache driver.
type cache struct{ s *store }

// Get implements driver.Cache in one SELECT.
func (c cache) Get(ctx context.Context, key string) (driver.CacheEntry, bool, error) {
	var v []byte
	var exp sql.NullTime
	found, err := c.s.row(ctx, c.s.q.cacheGet, []any{c.s.prefix, c.s.cachePfx + key}, &v, &exp)
	if err != nil || !found {
		return driver.CacheEntry{}, false, err
	}
	return driver.CacheEntry{Key: key, Value: nonNil(v), ExpiresAt: utc(exp)}, true, nil
}

// Set implements driver.Cache in one upsert.
func (c cache) Set(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	_, err := c.s.exec(ctx, c.s.q.cacheSet, c.s.prefix, c.s.cachePfx+key, nonNil(value), millis(ttl))
	return err
}

// SetIfAbsent implements driver.Cache in one upsert that replaces only an
// expired entry and returns a row when it stored.
func (c cache) SetIfAbsent(ctx context.Context, key string, value []byte, ttl time.Duration) (bool, error) {
	var one int
	return c.s.row(ctx, c.s.q.cacheSetIfAbsent, []any{c.s.prefix, c.s.cachePfx + key, nonNil(value), millis(ttl)}, &one)
}

// Delete implements driver.Cache: it deletes the live entry (an expired
// row is left for Purge and reads as absent).
func (c cache) Delete(ctx context.Context, key string) (bool, error) {
	n, err := c.s.exec(ctx, c.s.q.cacheDelete, c.s.prefix, c.s.cachePfx+key)
	return n > 0, err
}

// Has implements driver.Cache.
func (c cache) Has(ctx context.Context, key string) (bool, error) {
	var one int
	return c.s.row(ctx, c.s.q.cacheHas, []any{c.s.prefix, c.s.cachePfx + key}, &one)
}

// Clear implements driver.Cache in one DELETE of the namespace's cache
// key range, counting the live entries among the deleted rows.
func (c cache) Clear(ctx context.Context) (int64, error) {
	lo, hi := keyRange(c.s.cachePfx)
	var n int64
	_, err := c.s.row(ctx, c.s.q.cacheClear, []any{c.s.prefix, lo, hi}, &n)
	return n, err
}

// Keys implements driver.Cache.
func (c cache) Keys(ctx context.Context, pattern driver.Pattern) ([]string, error) {
	var out []string
	err := c.s.list(ctx, c.s.q.cacheKeys, c.s.cachePfx, pattern, func(rows rowsIter) (string, error) {
		var sk string
		if err := rows.Scan(&sk); err != nil {
			return "", err
		}
		if k, ok := strings.CutPrefix(sk, c.s.cachePfx); ok && pattern.Match(k) {
			out = append(out, k)
		}
		return sk, nil
	})
	return out, err
}
