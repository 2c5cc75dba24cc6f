package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
)

// cache is the cache driver.
type cache struct{ s *store }

// Get implements driver.Cache.
func (c cache) Get(ctx context.Context, key string) (driver.CacheEntry, bool, error) {
	var value []byte
	var exp sql.NullInt64
	err := c.s.readRow(ctx, c.s.q.cacheGet, sql.Named("key", c.s.cachePfx+key), sql.Named("now", nowMs())).Scan(&value, &exp)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.CacheEntry{}, false, nil
	}
	if err != nil {
		return driver.CacheEntry{}, false, ctxErr(ctx, err)
	}
	return driver.CacheEntry{Key: key, Value: nonNil(value), ExpiresAt: nullMsTime(exp)}, true, nil
}

// Set implements driver.Cache in one upsert.
func (c cache) Set(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	_, err := c.s.execCount(ctx, c.s.q.cacheSet, func(now int64) []any {
		return []any{sql.Named("key", c.s.cachePfx+key), sql.Named("value", nonNil(value)),
			sql.Named("exp", expiry(now, ttl)), sql.Named("now", now)}
	})
	return err
}

// SetIfAbsent implements driver.Cache in one upsert that replaces only an
// expired entry.
func (c cache) SetIfAbsent(ctx context.Context, key string, value []byte, ttl time.Duration) (bool, error) {
	return c.s.execOK(ctx, c.s.q.cacheSetIfAbsent, func(now int64) []any {
		return []any{sql.Named("key", c.s.cachePfx+key), sql.Named("value", nonNil(value)),
			sql.Named("exp", expiry(now, ttl)), sql.Named("now", now)}
	})
}

// Delete implements driver.Cache: it deletes the row, live or expired, and
// reports whether it was live.
func (c cache) Delete(ctx context.Context, key string) (bool, error) {
	var live bool
	err := c.s.write(ctx, func() error {
		err := c.s.queryRow(ctx, nil, c.s.q.cacheDelete, sql.Named("key", c.s.cachePfx+key), sql.Named("now", nowMs())).Scan(&live)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		return err
	})
	return live, err
}

// Has implements driver.Cache.
func (c cache) Has(ctx context.Context, key string) (bool, error) {
	var one int
	err := c.s.readRow(ctx, c.s.q.cacheHas, sql.Named("key", c.s.cachePfx+key), sql.Named("now", nowMs())).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, ctxErr(ctx, err)
}

// Clear implements driver.Cache: one DELETE over the namespace's cache
// keys, counting the live entries among the deleted rows.
func (c cache) Clear(ctx context.Context) (int64, error) {
	cond, args := c.s.nsRange("key", c.s.cachePfx)
	var n int64
	err := c.s.write(ctx, func() error {
		n = 0
		rows, err := c.s.query(ctx, fmt.Sprintf(c.s.q.cacheClear, cond), append(args, nowMs())...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var live bool
			if err := rows.Scan(&live); err != nil {
				return err
			}
			if live {
				n++
			}
		}
		return rows.Err()
	})
	return n, err
}

// Keys implements driver.Cache.
func (c cache) Keys(ctx context.Context, pattern driver.Pattern) ([]string, error) {
	s := c.s
	cond, args := s.nsRange("key", s.cachePfx+pattern.Prefix())
	args = append(args, pattern.SQLiteGlob(s.cachePfx), nowMs())
	rows, err := s.readQuery(ctx, fmt.Sprintf(s.q.cacheKeys, cond), args...)
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var sk string
		if err := rows.Scan(&sk); err != nil {
			return nil, ctxErr(ctx, err)
		}
		if key, ok := strings.CutPrefix(sk, s.cachePfx); ok && pattern.Match(key) {
			out = append(out, key)
		}
	}
	return out, ctxErr(ctx, rows.Err())
}
