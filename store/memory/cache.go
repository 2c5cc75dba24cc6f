package memory

import (
	"context"
	"sort"
	"time"

	"github.com/warden-go/warden/driver"
)

// cacheRec is one cache entry.
type cacheRec struct {
	value     []byte
	expiresAt time.Time // zero: no expiry
}

func (r *cacheRec) live(now time.Time) bool { return r.expiresAt.IsZero() || r.expiresAt.After(now) }

// expiry returns now+ttl, or zero (no expiry) for ttl 0.
func expiry(now time.Time, ttl time.Duration) time.Time {
	if ttl <= 0 {
		return time.Time{}
	}
	return after(now, ttl)
}

// cache is the store's cache driver.
type cache store

func (c *cache) s() *store { return (*store)(c) }

// Get returns the live entry of key.
func (c *cache) Get(ctx context.Context, key string) (driver.CacheEntry, bool, error) {
	s := c.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return driver.CacheEntry{}, false, err
	}
	defer s.end()
	r := sp.cache[key]
	if r == nil || !r.live(now) {
		return driver.CacheEntry{}, false, nil
	}
	return driver.CacheEntry{Key: key, Value: clone(r.value), ExpiresAt: r.expiresAt}, true, nil
}

// Set stores value under key for ttl (0: no expiry).
func (c *cache) Set(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	s := c.s()
	if err := s.checkValue(value); err != nil {
		return err
	}
	sp, now, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer s.end()
	sp.cache[key] = &cacheRec{value: clone(value), expiresAt: expiry(now, ttl)}
	return nil
}

// SetIfAbsent stores value only if key has no live entry.
func (c *cache) SetIfAbsent(ctx context.Context, key string, value []byte, ttl time.Duration) (bool, error) {
	s := c.s()
	if err := s.checkValue(value); err != nil {
		return false, err
	}
	sp, now, err := s.begin(ctx)
	if err != nil {
		return false, err
	}
	defer s.end()
	if r := sp.cache[key]; r != nil && r.live(now) {
		return false, nil
	}
	sp.cache[key] = &cacheRec{value: clone(value), expiresAt: expiry(now, ttl)}
	return true, nil
}

// Delete removes key's entry; ok=false if it had no live entry.
func (c *cache) Delete(ctx context.Context, key string) (bool, error) {
	s := c.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return false, err
	}
	defer s.end()
	r := sp.cache[key]
	if r == nil {
		return false, nil
	}
	delete(sp.cache, key)
	return r.live(now), nil
}

// Has reports whether key has a live entry.
func (c *cache) Has(ctx context.Context, key string) (bool, error) {
	s := c.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return false, err
	}
	defer s.end()
	r := sp.cache[key]
	return r != nil && r.live(now), nil
}

// Clear deletes every cache entry of the namespace and counts the live
// ones.
func (c *cache) Clear(ctx context.Context) (int64, error) {
	s := c.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer s.end()
	var n int64
	for key, r := range sp.cache {
		if r.live(now) {
			n++
		}
		delete(sp.cache, key)
	}
	return n, nil
}

// Keys returns the live keys matching pattern, sorted.
func (c *cache) Keys(ctx context.Context, pattern driver.Pattern) ([]string, error) {
	s := c.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer s.end()
	keys := []string{}
	for key, r := range sp.cache {
		if r.live(now) && pattern.Match(key) {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	return keys, nil
}
