package mysql

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
)

// cache is the cache driver.
type cache struct{ s *store }

// Get implements driver.Cache.
func (c cache) Get(ctx context.Context, key string) (driver.CacheEntry, bool, error) {
	var js, bin []byte
	var exp sql.NullTime
	err := c.s.db.QueryRowContext(ctx, c.s.q.cacheGet, c.s.prefix, c.s.cachePfx+key).Scan(&js, &bin, &exp)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.CacheEntry{}, false, nil
	}
	if err != nil {
		return driver.CacheEntry{}, false, ctxErr(ctx, err)
	}
	return driver.CacheEntry{Key: key, Value: valueOf(js, bin), ExpiresAt: utc(exp)}, true, nil
}

// Set implements driver.Cache in one upsert. A value that is JSON is
// stored as JSON (go-go-scope's adapter reads it), any other in
// value_bin.
func (c cache) Set(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	js := jsonArg(value)
	_, err := c.s.exec(ctx, c.s.q.cacheSet, c.s.prefix, c.s.cachePfx+key, js, js, js, nonNil(value), usec(ttl))
	return err
}

// SetIfAbsent implements driver.Cache in one upsert that replaces only an
// expired entry and leaves in @warden_out whether it stored, then a read
// of it.
func (c cache) SetIfAbsent(ctx context.Context, key string, value []byte, ttl time.Duration) (bool, error) {
	var stored int64
	js := jsonArg(value)
	err := c.s.outcome(ctx, nil, c.s.q.cacheSetIfAbsent, []any{c.s.prefix, c.s.cachePfx + key, js, js, js, nonNil(value), usec(ttl)},
		func(q querier) error { return q.QueryRowContext(ctx, "SELECT @warden_out").Scan(&stored) })
	return stored == 1, err
}

// Delete implements driver.Cache: it deletes the live entry (an expired
// row is left for Purge and reads as absent).
func (c cache) Delete(ctx context.Context, key string) (bool, error) {
	n, err := c.s.execCount(ctx, c.s.q.cacheDelete, c.s.prefix, c.s.cachePfx+key)
	return n > 0, err
}

// Has implements driver.Cache.
func (c cache) Has(ctx context.Context, key string) (bool, error) {
	var one int
	err := c.s.db.QueryRowContext(ctx, c.s.q.cacheHas, c.s.prefix, c.s.cachePfx+key).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, ctxErr(ctx, err)
}

// Clear implements driver.Cache in one READ COMMITTED transaction.
func (c cache) Clear(ctx context.Context) (int64, error) {
	s := c.s
	cond, args := keyRange("`key`", s.cachePfx)
	args = append([]any{s.prefix}, args...)
	var n int64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, sprintf(s.q.cacheClear, cond), args...)
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, sprintf(s.q.cacheClearDead, cond), args...)
		return err
	})
	return n, err
}

// Keys implements driver.Cache.
func (c cache) Keys(ctx context.Context, pattern driver.Pattern) ([]string, error) {
	var out []string
	err := c.s.list(ctx, c.s.q.cacheKeys, "`key`", c.s.cachePfx, pattern, func(rows *sql.Rows) error {
		var sk []byte
		if err := rows.Scan(&sk); err != nil {
			return err
		}
		if k, ok := strings.CutPrefix(string(sk), c.s.cachePfx); ok && pattern.Match(k) {
			out = append(out, k)
		}
		return nil
	})
	return out, err
}
