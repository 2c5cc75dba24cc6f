// Package cache is a typed cache kept in a warden store and shared by every
// process that uses the store, with stampede protection.
//
//	users, err := cache.New[User](st, &cache.Options{TTL: time.Minute})
//	if err != nil { … }
//	defer users.Close()
//	u, err := users.GetOrLoad(ctx, "user:42", func(ctx context.Context) (User, error) {
//		return db.LoadUser(ctx, 42)
//	})
//
// # Misses and absent values
//
// Get returns ErrNotFound on a miss, so a cached zero value is told apart
// from no value. A loader signals that the value does not exist by
// returning an error that wraps ErrNotFound; with Options.NegativeTTL set,
// that absence is cached too, and GetOrLoad and Get answer ErrNotFound
// without calling the loader until it expires.
//
// # Loads
//
// GetOrLoad loads a missing value at most once at a time per key:
//
//   - In one process (one Cache), concurrent callers for a key share one
//     load. The load runs on its own goroutine with a context detached from
//     the callers' (it keeps their values, not their cancellation) and
//     bounded by Options.LoadLease, so a caller that gives up stops waiting
//     without cancelling the load for the others.
//   - Across processes, a loader first takes a short lease on the key: a
//     lock, through the store's lock primitives, on the lock key
//     "cache-load:" + the stored cache key (for a stored key too long for
//     that, "cache-load#" + the hex SHA-256 of the stored key). These lock
//     keys are reserved for this package; being locks, they never appear in
//     Keys or Clear of the cache. The other processes poll for the value
//     with jittered exponential back-off (Options.PollMin to PollMax) and
//     take the lease over if the loader gives it back without a value or
//     lets it lapse. Lock records are kept after release for fencing, so
//     each loaded key leaves a small lock record until warden.Store.Purge
//     removes it.
//   - With Options.StaleWhileRevalidate, a value past its TTL is still
//     served for that long while one process (the lease holder) reloads it
//     in the background.
//
// Loader errors are returned to the callers that shared the load and are
// never cached; a panic in a loader is recovered and returned as a
// *PanicError.
//
// # Stored form
//
// Values are encoded with Options.Codec (JSON by default). A value without
// soft expiry is stored as the codec's bytes alone, which other programs
// sharing the store can read; values with a soft expiry and cached
// absences are stored in a small JSON envelope described in envelope.go of
// this package (a top-level member "_warden":"cache/v1"). Stale and absent
// entries count as live entries for Keys and Clear.
//
// Soft expiry is decided with the writer's and the reader's clocks, so
// clock skew between processes shifts it by the skew; the hard expiry (the
// entry's TTL in the store) uses the store's clock.
package cache

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/valid"
)

// ErrNotFound is returned when a key has no value: a miss, an expired
// entry, or a cached absence. Loaders return an error wrapping it to say
// that a value does not exist.
var ErrNotFound = errors.New("cache: not found")

// ErrClosed is returned by GetOrLoad after Close. It is warden.ErrClosed.
var ErrClosed = warden.ErrClosed

// Default option values.
const (
	DefaultLoadLease = 10 * time.Second
	DefaultPollMin   = 5 * time.Millisecond
	DefaultPollMax   = 200 * time.Millisecond
	// DefaultStoreTimeout bounds GetOrLoad's store calls before it loads.
	DefaultStoreTimeout = time.Second
)

// Options configure a Cache. The zero value (or nil) caches values without
// expiry, as JSON, without negative caching or stale serving.
type Options struct {
	// TTL is how long Set and loaded values live. 0: no expiry.
	TTL time.Duration
	// Codec encodes values. Nil: warden.JSONCodec.
	Codec warden.Codec
	// NegativeTTL is how long a loader's "absent" answer (an error
	// wrapping ErrNotFound) is cached. 0: absences are not cached.
	NegativeTTL time.Duration
	// LoadLease bounds one load: the cross-process lease on the key lasts
	// this long, and the loader's context ends when it runs out.
	// 0: DefaultLoadLease (10 s).
	LoadLease time.Duration
	// StaleWhileRevalidate is how long past its TTL a value may still be
	// served by GetOrLoad while one process reloads it in the background.
	// It only applies to values with a TTL. 0: off (an expired value is a
	// miss).
	StaleWhileRevalidate time.Duration
	// PollMin and PollMax bound the jittered exponential back-off of
	// callers waiting for another process's load. 0: DefaultPollMin (5 ms)
	// and DefaultPollMax (200 ms). A PollMax under PollMin is raised to it.
	PollMin, PollMax time.Duration
	// StoreTimeout bounds each store call GetOrLoad makes before it
	// loads (the lookup, taking the load lease) and its wait for the
	// loaded value to be stored; each is also bounded by half of the time
	// left before the caller's deadline, so that a store that hangs
	// leaves the loader time to run. 0: DefaultStoreTimeout (1 s).
	StoreTimeout time.Duration
	// FailOnStoreError makes GetOrLoad return the store's error when the
	// store fails or times out. By default it loads instead — without
	// the cross-process lease, so every process whose store is down
	// loads for itself — serves the value, tries to store it, and counts
	// the fallback in Stats.StoreFallbacks: a cache outage does not
	// become a read outage.
	FailOnStoreError bool
	// Prefix is put before every key, so that several caches can share a
	// store without seeing each other's keys: Keys lists and Clear deletes
	// only keys under it. "": the store's whole cache namespace. With a
	// Prefix, Clear deletes entries one by one.
	Prefix string
	// Observe, if set, is told of every lookup, load, wait for another
	// caller's load, store error and store fallback of this Cache (see
	// Observation), for telemetry: otelwarden.Telemetry.Cache is one. It
	// is called after the fact, on the goroutine that saw it — the
	// caller's, or the one running a load — with the caller's context
	// (context.Background() for store errors) and no lock of the Cache
	// held. It must be quick, safe for concurrent use, and must neither
	// panic nor call the Cache. Nil: nothing is observed, at no cost.
	Observe func(ctx context.Context, o Observation)
}

// Stats counts a Cache's outcomes since it was created.
type Stats struct {
	Hits         uint64 // fresh values returned by Get or GetOrLoad
	StaleHits    uint64 // stale values served by GetOrLoad (StaleWhileRevalidate)
	NegativeHits uint64 // cached absences found
	Misses       uint64 // lookups that found nothing usable
	Loads        uint64 // loader calls made by this Cache
	LoadErrors   uint64 // loader calls that failed or panicked (absence is not a failure)
	Errors       uint64 // store or codec errors met by this Cache
	// StoreFallbacks counts GetOrLoad calls that loaded without the store
	// because it failed or timed out (see Options.FailOnStoreError).
	StoreFallbacks uint64
}

// PanicError is returned by GetOrLoad when the loader panicked.
type PanicError struct {
	Value any    // the value passed to panic
	Stack []byte // the loader goroutine's stack at the panic
}

// Error describes the panic.
func (e *PanicError) Error() string { return fmt.Sprintf("cache: loader panicked: %v", e.Value) }

// Cache is a typed cache on a warden store. It is safe for concurrent use.
// Create it with New and call Close when done with GetOrLoad.
type Cache[T any] struct {
	st    *warden.Store
	opts  Options
	codec warden.Codec
	owner string
	seq   atomic.Uint64

	ctx    context.Context // ends at Close; parent of every load
	cancel context.CancelFunc

	mu           sync.Mutex
	closed       bool
	flights      map[string]*flight[T]
	revalidating map[string]struct{}
	wg           sync.WaitGroup

	hits, staleHits, negHits, misses, loads, loadErrs, errs, fallbacks atomic.Uint64
}

// New returns a cache of T values on st. nil opts means defaults. A nil
// store, or a duration in opts that is negative or under one millisecond,
// is an error wrapping warden.ErrInvalidArgument.
func New[T any](st *warden.Store, opts *Options) (*Cache[T], error) {
	if st == nil {
		return nil, valid.Nil("cache", "store")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if err := valid.Durations("cache", valid.D{Name: "TTL", V: o.TTL}, valid.D{Name: "NegativeTTL", V: o.NegativeTTL},
		valid.D{Name: "LoadLease", V: o.LoadLease}, valid.D{Name: "StaleWhileRevalidate", V: o.StaleWhileRevalidate},
		valid.D{Name: "PollMin", V: o.PollMin}, valid.D{Name: "PollMax", V: o.PollMax},
		valid.D{Name: "StoreTimeout", V: o.StoreTimeout}); err != nil {
		return nil, err
	}
	if o.Codec == nil {
		o.Codec = warden.JSONCodec{}
	}
	if o.LoadLease == 0 {
		o.LoadLease = DefaultLoadLease
	}
	if o.StoreTimeout == 0 {
		o.StoreTimeout = DefaultStoreTimeout
	}
	if o.PollMin == 0 {
		o.PollMin = DefaultPollMin
	}
	if o.PollMax == 0 {
		o.PollMax = DefaultPollMax
	}
	if o.PollMax < o.PollMin {
		o.PollMax = o.PollMin
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Cache[T]{
		st:           st,
		opts:         o,
		codec:        o.Codec,
		owner:        newOwner(),
		ctx:          ctx,
		cancel:       cancel,
		flights:      map[string]*flight[T]{},
		revalidating: map[string]struct{}{},
	}
	return c, nil
}

// Close cancels the loads this Cache is running (their loaders' contexts
// end) and waits until their goroutines have returned. Later GetOrLoad
// calls return ErrClosed; Get, Set and the other direct operations keep
// working. The store is not closed. Close is idempotent.
func (c *Cache[T]) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	return nil
}

// count counts a store or codec error; context errors are the caller's,
// not failures.
func (c *Cache[T]) count(err error) {
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		c.errs.Add(1)
		if c.opts.Observe != nil {
			c.opts.Observe(context.Background(), Observation{Kind: ObservedStoreError, Err: err})
		}
	}
}

// Stats returns the cache's counters.
func (c *Cache[T]) Stats() Stats {
	return Stats{
		Hits:         c.hits.Load(),
		StaleHits:    c.staleHits.Load(),
		NegativeHits: c.negHits.Load(),
		Misses:       c.misses.Load(),
		Loads:        c.loads.Load(),
		LoadErrors:   c.loadErrs.Load(),
		Errors:       c.errs.Load(),

		StoreFallbacks: c.fallbacks.Load(),
	}
}

// Get returns key's value, or ErrNotFound if there is none, it expired
// (stale values count as expired here), or an absence is cached.
func (c *Cache[T]) Get(ctx context.Context, key string) (T, error) {
	var zero T
	r, err := c.lookup(ctx, c.opts.Prefix+key, true)
	if err != nil {
		c.count(err)
		return zero, err
	}
	switch r.state {
	case stateFresh:
		c.hits.Add(1)
		c.lookedUp(ctx, key, LookupHit)
		return r.val, nil
	case stateAbsent:
		c.negHits.Add(1)
		c.lookedUp(ctx, key, LookupNegative)
	default:
		c.misses.Add(1)
		c.lookedUp(ctx, key, LookupMiss)
	}
	return zero, ErrNotFound
}

// Has reports whether key has a fresh value (not stale, not a cached
// absence). It does not decode the value.
func (c *Cache[T]) Has(ctx context.Context, key string) (bool, error) {
	r, err := c.lookup(ctx, c.opts.Prefix+key, false)
	if err != nil {
		c.count(err)
		return false, err
	}
	return r.state == stateFresh, nil
}

// Set stores v under key for Options.TTL.
func (c *Cache[T]) Set(ctx context.Context, key string, v T) error {
	return c.SetTTL(ctx, key, v, c.opts.TTL)
}

// SetTTL stores v under key for ttl (0: no expiry; whole milliseconds,
// rounded up; a ttl that is negative or under one millisecond is an error
// matching warden.ErrInvalidArgument). With StaleWhileRevalidate the entry is kept that much longer
// and served stale by GetOrLoad.
func (c *Cache[T]) SetTTL(ctx context.Context, key string, v T, ttl time.Duration) error {
	if err := valid.Durations("cache", valid.D{Name: "ttl", V: ttl}); err != nil {
		return err
	}
	b, hard, err := c.encode(v, ttl)
	if err != nil {
		c.count(err)
		return fmt.Errorf("cache: encode %q: %w", key, err)
	}
	if err := c.st.Cache().Set(ctx, c.opts.Prefix+key, b, hard); err != nil {
		c.count(err)
		return err
	}
	return nil
}

// Delete removes key's entry (a value or a cached absence) and reports
// whether there was a live one.
func (c *Cache[T]) Delete(ctx context.Context, key string) (bool, error) {
	ok, err := c.st.Cache().Delete(ctx, c.opts.Prefix+key)
	if err != nil {
		c.count(err)
	}
	return ok, err
}

// Keys returns the keys with a live entry (fresh, stale or a cached
// absence) that match the glob pattern ('*' any run, '?' one character,
// '\' escapes; "" matches all), sorted, without Options.Prefix.
func (c *Cache[T]) Keys(ctx context.Context, pattern string) ([]string, error) {
	if pattern == "" {
		pattern = "*"
	}
	keys, err := c.st.Cache().Keys(ctx, escapeGlob(c.opts.Prefix)+pattern)
	if err != nil {
		c.count(err)
		return nil, err
	}
	if c.opts.Prefix != "" {
		for i, k := range keys {
			keys[i] = strings.TrimPrefix(k, c.opts.Prefix)
		}
	}
	return keys, nil
}

// Clear deletes every entry of the cache — the store's whole cache
// namespace, or only the keys under Options.Prefix — and returns how many
// live entries it deleted. With a Prefix, entries are deleted one by one,
// so entries written meanwhile may survive.
func (c *Cache[T]) Clear(ctx context.Context) (int64, error) {
	if c.opts.Prefix == "" {
		n, err := c.st.Cache().Clear(ctx)
		if err != nil {
			c.count(err)
		}
		return n, err
	}
	keys, err := c.st.Cache().Keys(ctx, escapeGlob(c.opts.Prefix)+"*")
	if err != nil {
		c.count(err)
		return 0, err
	}
	var n int64
	for _, k := range keys {
		ok, err := c.st.Cache().Delete(ctx, k)
		if err != nil {
			c.count(err)
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// ---------------------------------------------------------------------------
// encoding and lookup

type state int

const (
	stateMiss   state = iota // no live entry
	stateFresh               // a value within its TTL
	stateStale               // a value past its TTL, within StaleWhileRevalidate
	stateAbsent              // a cached absence
	stateBad                 // an entry that does not decode as T
)

type result[T any] struct {
	state state
	val   T
	err   error // the decode error of stateBad
}

// encode returns the stored form of v and the entry's hard TTL.
func (c *Cache[T]) encode(v T, ttl time.Duration) ([]byte, time.Duration, error) {
	raw, err := c.codec.Marshal(v)
	if err != nil {
		return nil, 0, err
	}
	if ttl > 0 && c.opts.StaleWhileRevalidate > 0 {
		b, err := wrap(raw, time.Now().Add(ttl))
		return b, ttl + c.opts.StaleWhileRevalidate, err
	}
	if _, ok := parseEnvelope(raw); ok {
		// A plain value that reads as an envelope goes in a real one.
		b, err := wrap(raw, time.Time{})
		return b, ttl, err
	}
	return raw, ttl, nil
}

// lookup reads the stored key sk and classifies its entry; decode=false
// skips decoding the value.
func (c *Cache[T]) lookup(ctx context.Context, sk string, decode bool) (result[T], error) {
	var r result[T]
	e, found, err := c.st.Cache().Get(ctx, sk)
	if err != nil || !found {
		return r, err
	}
	payload := e.Value
	r.state = stateFresh
	if env, ok := parseEnvelope(e.Value); ok {
		if env.Absent {
			r.state = stateAbsent
			return r, nil
		}
		payload = env.payload()
		if env.Fresh != 0 && time.Now().UnixMilli() >= env.Fresh {
			r.state = stateStale
		}
	}
	if decode {
		if err := c.codec.Unmarshal(payload, &r.val); err != nil {
			return result[T]{}, &decodeError{key: strings.TrimPrefix(sk, c.opts.Prefix), err: err}
		}
	}
	return r, nil
}

// escapeGlob makes s match itself literally in a glob.
func escapeGlob(s string) string {
	if !strings.ContainsAny(s, `*?\`) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if r == '*' || r == '?' || r == '\\' {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// leaseKey is the lock key of the load lease of stored key sk.
func leaseKey(sk string) string {
	const tag = "cache-load:"
	if len(tag)+len(sk) <= driver.MaxKeyBytes {
		return tag + sk
	}
	return hashedKey("cache-load#", sk)
}
