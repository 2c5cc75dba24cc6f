// Package hangstore wraps a driver store for tests: the cache and lock
// operations it is told to hang do not answer — they block until their
// context ends (a store that stopped answering) or Release is closed (the
// store answers again), and then go on to the wrapped store.
package hangstore

import (
	"context"
	"sync"
	"time"

	"github.com/warden-go/warden/driver"
)

// The operations a Store can hang.
const (
	CacheGet    = "cache get"
	CacheSet    = "cache set"
	LockAcquire = "lock acquire"
)

// Store is a driver.Store whose operations named at New hang.
type Store struct {
	driver.Store
	// Release, once closed, lets every hung operation (and every later
	// one) go on to the wrapped store.
	Release chan struct{}

	ops       map[string]bool
	mu        sync.Mutex
	deadlines map[string][]time.Time
}

// New wraps d; the operations ops (CacheGet, CacheSet, LockAcquire) hang.
func New(d driver.Store, ops ...string) *Store {
	h := &Store{Store: d, Release: make(chan struct{}), ops: map[string]bool{}, deadlines: map[string][]time.Time{}}
	for _, op := range ops {
		h.ops[op] = true
	}
	return h
}

// Deadlines returns the deadlines of the contexts of the hung calls of
// op, in call order; a zero time for a context without one.
func (h *Store) Deadlines(op string) []time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]time.Time(nil), h.deadlines[op]...)
}

func (h *Store) block(ctx context.Context, op string) error {
	if !h.ops[op] {
		return nil
	}
	dl, _ := ctx.Deadline()
	h.mu.Lock()
	h.deadlines[op] = append(h.deadlines[op], dl)
	h.mu.Unlock()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-h.Release:
		return nil
	}
}

// Cache returns the wrapped store's cache with CacheGet and CacheSet
// hanging if asked.
func (h *Store) Cache() driver.Cache { return hungCache{h.Store.Cache(), h} }

// Locks returns the wrapped store's locks with LockAcquire hanging if
// asked.
func (h *Store) Locks() driver.Locks { return hungLocks{h.Store.Locks(), h} }

type hungCache struct {
	driver.Cache
	h *Store
}

func (c hungCache) Get(ctx context.Context, key string) (driver.CacheEntry, bool, error) {
	if err := c.h.block(ctx, CacheGet); err != nil {
		return driver.CacheEntry{}, false, err
	}
	return c.Cache.Get(ctx, key)
}

func (c hungCache) Set(ctx context.Context, key string, v []byte, ttl time.Duration) error {
	if err := c.h.block(ctx, CacheSet); err != nil {
		return err
	}
	return c.Cache.Set(ctx, key, v, ttl)
}

type hungLocks struct {
	driver.Locks
	h *Store
}

func (l hungLocks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	if err := l.h.block(ctx, LockAcquire); err != nil {
		return driver.LockRecord{}, false, err
	}
	return l.Locks.Acquire(ctx, key, owner, ttl)
}
