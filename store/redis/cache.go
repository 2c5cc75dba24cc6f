package redis

import (
	"context"
	"slices"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/warden-go/warden/driver"
)

// A cache entry is a string with a PX expiry: Redis never serves an
// expired key, so its expiry is exact to the millisecond.

// cacheGet: {value, expiry in Unix ms or -1}, or nil.
var cacheGet = newScript(`
local v = redis.call('GET', KEYS[1])
if not v then return false end
return {v, redis.call('PEXPIRETIME', KEYS[1])}
`)

// cache is the store's cache driver.
type cache store

func (c *cache) s() *store { return (*store)(c) }

// Get implements driver.Cache.
func (c *cache) Get(ctx context.Context, key string) (driver.CacheEntry, bool, error) {
	v, err := c.s().run(ctx, cacheGet, c.s().key(kindCache, key))
	if err != nil || v == nil {
		return driver.CacheEntry{}, false, err
	}
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return driver.CacheEntry{}, false, errReply("cache get", v)
	}
	val := []byte(rStr(a[0]))
	return driver.CacheEntry{Key: key, Value: val, ExpiresAt: ms(rInt(a[1]))}, true, nil
}

// Set implements driver.Cache.
func (c *cache) Set(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	return c.s().fail(ctx, c.client.Set(ctx, c.s().key(kindCache, key), value, pxTTL(ttl)).Err())
}

// pxTTL is ttl for go-redis's SET: whole milliseconds (sent as PX), 0 for
// no expiry.
func pxTTL(ttl time.Duration) time.Duration {
	if ttl <= 0 {
		return 0
	}
	return time.Duration(driver.Millis(ttl)) * time.Millisecond
}

// SetIfAbsent implements driver.Cache with SET NX PX.
func (c *cache) SetIfAbsent(ctx context.Context, key string, value []byte, ttl time.Duration) (bool, error) {
	err := c.client.SetArgs(ctx, c.s().key(kindCache, key), value, goredis.SetArgs{Mode: "NX", TTL: pxTTL(ttl)}).Err()
	if isNil(err) {
		return false, nil
	}
	return err == nil, c.s().fail(ctx, err)
}

// Delete implements driver.Cache.
func (c *cache) Delete(ctx context.Context, key string) (bool, error) {
	n, err := c.client.Del(ctx, c.s().key(kindCache, key)).Result()
	return n == 1, c.s().fail(ctx, err)
}

// Has implements driver.Cache.
func (c *cache) Has(ctx context.Context, key string) (bool, error) {
	n, err := c.client.Exists(ctx, c.s().key(kindCache, key)).Result()
	return n == 1, c.s().fail(ctx, err)
}

// Clear implements driver.Cache: SCAN on every master, one pipeline of
// DELs per page (keys of a page may lie in different slots).
func (c *cache) Clear(ctx context.Context) (int64, error) {
	s := c.s()
	var n int64
	err := s.scan(ctx, s.match(kindCache, driver.MustPattern("*")), func(rks []string) error {
		pipe := s.client.Pipeline()
		var cmds []*goredis.IntCmd
		for _, rk := range rks {
			if _, ok := s.parseKey(kindCache, rk); ok {
				cmds = append(cmds, pipe.Del(ctx, rk))
			}
		}
		if len(cmds) == 0 {
			return nil
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
		for _, cmd := range cmds {
			n += cmd.Val()
		}
		return nil
	})
	return n, err
}

// Keys implements driver.Cache.
func (c *cache) Keys(ctx context.Context, p driver.Pattern) ([]string, error) {
	s := c.s()
	var out []string
	err := s.scan(ctx, s.match(kindCache, p), func(rks []string) error {
		for _, rk := range rks {
			if k, ok := s.parseKey(kindCache, rk); ok && p.Match(k) {
				out = append(out, k)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(out)
	return out, nil
}
