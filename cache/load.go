package cache

import (
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/warden-go/warden/internal/valid"
)

// releaseTimeout bounds the writes a load makes after its loader returned
// (storing the value, giving the lease back), which run even if the load's
// own context ended.
const releaseTimeout = 5 * time.Second

// flight is one load of a key in this process, shared by its callers.
type flight[T any] struct {
	done    chan struct{} // closed when val and err are set
	val     T
	err     error
	waiters int // callers waiting on done; guarded by Cache.mu
}

// GetOrLoad returns key's value, loading it with loader on a miss and
// storing it for Options.TTL. See the package documentation for how loads
// are shared within a process and across processes.
//
// Callers that share a load get the value the first caller's loader
// returned (the other callers' loaders are not called) and must not modify
// it if it holds references. If ctx ends, GetOrLoad returns ctx.Err() at
// once; the load goes on for the others. A loader returning an error that
// wraps ErrNotFound means the value does not exist; GetOrLoad then returns
// that error, and caches the absence for Options.NegativeTTL if set. Other
// loader errors are returned as they are, never cached. A failure to store
// a loaded value is logged to the store's logger and the value returned.
//
// When the store fails or does not answer within Options.StoreTimeout,
// GetOrLoad loads anyway (unless Options.FailOnStoreError): the value is
// served, its storing is attempted, and Stats.StoreFallbacks counts it.
func (c *Cache[T]) GetOrLoad(ctx context.Context, key string, loader func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	if loader == nil {
		return zero, valid.Nil("cache", "loader")
	}
	sk := c.opts.Prefix + key
	lctx, cancel := context.WithTimeout(ctx, c.opts.StoreTimeout)
	r, err := c.lookup(lctx, sk, true)
	cancel()
	if err != nil && ctx.Err() == nil && !isDecodeErr(err) && !c.opts.FailOnStoreError {
		// The store is down or slow: load as on a miss (fetch loads
		// without the store if it still fails).
		c.count(err)
		c.misses.Add(1)
		return c.join(ctx, sk, loader)
	}
	if err != nil {
		if ctx.Err() != nil || !isDecodeErr(err) {
			c.count(err)
			if ctx.Err() != nil {
				return zero, ctx.Err()
			}
			return zero, err
		}
		// An entry that does not decode as T (written by another version
		// of the program) is reloaded and overwritten.
		c.count(err)
		c.st.Logger().Warn("warden cache: reloading an entry that does not decode", "key", key, "err", err)
		r = result[T]{}
	}
	switch r.state {
	case stateFresh:
		c.hits.Add(1)
		return r.val, nil
	case stateAbsent:
		c.negHits.Add(1)
		return zero, ErrNotFound
	case stateStale:
		if c.opts.StaleWhileRevalidate > 0 {
			c.staleHits.Add(1)
			c.revalidate(ctx, sk, loader)
			return r.val, nil
		}
	}
	c.misses.Add(1)
	return c.join(ctx, sk, loader)
}

// join waits for the process's load of sk, starting one if none runs.
func (c *Cache[T]) join(ctx context.Context, sk string, loader func(context.Context) (T, error)) (T, error) {
	var zero T
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return zero, ErrClosed
	}
	f := c.flights[sk]
	if f == nil {
		f = &flight[T]{done: make(chan struct{})}
		c.flights[sk] = f
		base, stop := c.detach(ctx)
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer stop()
			v, err := c.fetch(base, sk, f, loader)
			c.mu.Lock()
			if c.flights[sk] == f {
				delete(c.flights, sk)
			}
			f.val, f.err = v, err
			c.mu.Unlock()
			close(f.done)
		}()
	}
	f.waiters++
	c.mu.Unlock()

	select {
	case <-f.done:
		return f.val, f.err
	case <-ctx.Done():
		c.mu.Lock()
		f.waiters--
		c.mu.Unlock()
		return zero, ctx.Err()
	}
}

// detach returns a context with ctx's values that ends only when the Cache
// is closed, and the function that releases it.
func (c *Cache[T]) detach(ctx context.Context) (context.Context, func()) {
	base, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stopAfter := context.AfterFunc(c.ctx, cancel)
	return base, func() { stopAfter(); cancel() }
}

// fetch obtains sk's value for flight f: it takes the load lease and
// loads, or waits for the process holding the lease to store the value.
// It gives up when no caller waits any more and the loader has not
// started.
func (c *Cache[T]) fetch(base context.Context, sk string, f *flight[T], loader func(context.Context) (T, error)) (T, error) {
	var zero T
	owner := c.flightOwner()
	lk := leaseKey(sk)
	delay := c.opts.PollMin
	for {
		if base.Err() != nil {
			return zero, ErrClosed
		}
		sent := time.Now()
		actx, cancel := context.WithTimeout(base, c.opts.StoreTimeout)
		rec, acquired, err := c.st.Locks().Acquire(actx, lk, owner, c.opts.LoadLease)
		cancel()
		if err != nil {
			c.count(err)
			if base.Err() == nil && !c.opts.FailOnStoreError {
				return c.loadWithoutStore(base, sk, loader, err)
			}
			return zero, c.closedOr(base, err)
		}
		if acquired {
			return c.loadHeld(base, sk, lk, owner, rec.Token, sent, loader)
		}
		// Another process loads: wait for its value, or for its lease to
		// end so that this one can take over.
		if !c.pause(base, f, jitter(delay)) {
			return zero, c.closedOr(base, context.Canceled) // nobody waits any more
		}
		delay = min(2*delay, c.opts.PollMax)
		lctx, cancel := context.WithTimeout(base, c.opts.StoreTimeout)
		r, err := c.lookup(lctx, sk, true)
		cancel()
		if err != nil && !isDecodeErr(err) {
			c.count(err)
			if base.Err() == nil && !c.opts.FailOnStoreError {
				return c.loadWithoutStore(base, sk, loader, err)
			}
			return zero, c.closedOr(base, err)
		}
		switch r.state {
		case stateFresh:
			return r.val, nil
		case stateStale:
			if c.opts.StaleWhileRevalidate > 0 {
				return r.val, nil
			}
		case stateAbsent:
			return zero, ErrNotFound
		}
	}
}

// pause waits d; it reports false, after removing f from the flights,
// if no caller waits for f any more or the Cache was closed.
func (c *Cache[T]) pause(base context.Context, f *flight[T], d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-base.Done():
		return false
	case <-t.C:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.waiters > 0 {
		return true
	}
	for k, g := range c.flights {
		if g == f {
			delete(c.flights, k)
		}
	}
	return false
}

// loadHeld runs the loader while this process holds the load lease of sk
// (acquired by a request sent at sent), stores the result and gives the
// lease back. It first re-reads the entry, in case the previous lease
// holder stored a value just before the lease was taken.
func (c *Cache[T]) loadHeld(base context.Context, sk, lk, owner string, token int64, sent time.Time, loader func(context.Context) (T, error)) (T, error) {
	var zero T
	defer c.giveBack(base, lk, owner, token)

	r, err := c.lookup(base, sk, true)
	if err != nil && !isDecodeErr(err) {
		c.count(err)
		return zero, c.closedOr(base, err)
	}
	switch r.state {
	case stateFresh:
		return r.val, nil
	case stateAbsent:
		return zero, ErrNotFound
	}

	lctx, cancel := context.WithDeadline(base, sent.Add(c.opts.LoadLease))
	defer cancel()
	c.loads.Add(1)
	v, err := callLoader(lctx, loader)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			if c.opts.NegativeTTL > 0 {
				wctx, wcancel := context.WithTimeout(context.WithoutCancel(base), releaseTimeout)
				if serr := c.st.Cache().Set(wctx, sk, absentValue, c.opts.NegativeTTL); serr != nil {
					c.count(serr)
					c.st.Logger().Warn("warden cache: cannot cache an absence", "key", sk, "err", serr)
				}
				wcancel()
			}
			return zero, err
		}
		c.loadErrs.Add(1)
		if cerr := lctx.Err(); cerr != nil && errors.Is(err, cerr) && base.Err() == nil {
			err = fmt.Errorf("cache: load of %q ran out of its LoadLease (%v): %w", sk, c.opts.LoadLease, err)
		}
		return zero, err
	}
	b, hard, err := c.encode(v, c.opts.TTL)
	if err == nil {
		wctx, wcancel := context.WithTimeout(context.WithoutCancel(base), releaseTimeout)
		err = c.st.Cache().Set(wctx, sk, b, hard)
		wcancel()
	}
	if err != nil {
		c.count(err)
		c.st.Logger().Warn("warden cache: cannot store a loaded value", "key", sk, "err", err)
	}
	return v, nil
}

// loadWithoutStore loads sk when the store failed (storeErr) on the way:
// without the cross-process lease, bounded by LoadLease. The value is
// served and its storing attempted (bounded by StoreTimeout); a failure
// there is logged.
func (c *Cache[T]) loadWithoutStore(base context.Context, sk string, loader func(context.Context) (T, error), storeErr error) (T, error) {
	var zero T
	c.fallbacks.Add(1)
	c.st.Logger().Warn("warden cache: the store failed; loading without it", "key", sk, "err", storeErr)
	lctx, cancel := context.WithTimeout(base, c.opts.LoadLease)
	defer cancel()
	c.loads.Add(1)
	v, err := callLoader(lctx, loader)
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			c.loadErrs.Add(1)
		}
		return zero, err
	}
	b, hard, err := c.encode(v, c.opts.TTL)
	if err == nil {
		wctx, wcancel := context.WithTimeout(context.WithoutCancel(base), c.opts.StoreTimeout)
		err = c.st.Cache().Set(wctx, sk, b, hard)
		wcancel()
	}
	if err != nil {
		c.count(err)
	}
	return v, nil
}

// giveBack releases a load lease; a failure only delays other loaders
// until the lease lapses, so it is logged.
func (c *Cache[T]) giveBack(base context.Context, lk, owner string, token int64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(base), releaseTimeout)
	defer cancel()
	if _, err := c.st.Locks().Release(ctx, lk, owner, token); err != nil {
		c.count(err)
		c.st.Logger().Warn("warden cache: cannot release a load lease; it lapses by itself", "lease", lk, "err", err)
	}
}

// revalidate reloads the stale entry sk in the background, unless this
// Cache already does or another process holds the load lease.
func (c *Cache[T]) revalidate(ctx context.Context, sk string, loader func(context.Context) (T, error)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	if _, busy := c.revalidating[sk]; busy {
		return
	}
	c.revalidating[sk] = struct{}{}
	base, stop := c.detach(ctx)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer stop()
		defer func() {
			c.mu.Lock()
			delete(c.revalidating, sk)
			c.mu.Unlock()
		}()
		owner, lk := c.flightOwner(), leaseKey(sk)
		sent := time.Now()
		rec, acquired, err := c.st.Locks().Acquire(base, lk, owner, c.opts.LoadLease)
		if err != nil {
			if base.Err() == nil {
				c.count(err)
				c.st.Logger().Warn("warden cache: cannot take a load lease to revalidate", "key", sk, "err", err)
			}
			return
		}
		if !acquired {
			return // another process revalidates
		}
		if _, err := c.loadHeld(base, sk, lk, owner, rec.Token, sent, loader); err != nil && !errors.Is(err, ErrNotFound) && base.Err() == nil {
			c.st.Logger().Warn("warden cache: background reload failed; serving the stale value", "key", sk, "err", err)
		}
	}()
}

// callLoader calls loader, turning a panic into a *PanicError.
func callLoader[T any](ctx context.Context, loader func(context.Context) (T, error)) (v T, err error) {
	defer func() {
		if p := recover(); p != nil {
			var zero T
			v, err = zero, &PanicError{Value: p, Stack: debug.Stack()}
		}
	}()
	return loader(ctx)
}

// closedOr returns ErrClosed if base ended (the Cache was closed), else
// err.
func (c *Cache[T]) closedOr(base context.Context, err error) error {
	if base.Err() != nil {
		return ErrClosed
	}
	return err
}

// flightOwner returns a lease owner unique to one load.
func (c *Cache[T]) flightOwner() string {
	return c.owner + ":" + strconv.FormatUint(c.seq.Add(1), 10)
}

// decodeError is an entry that does not decode as the Cache's type.
type decodeError struct {
	key string
	err error
}

// Error describes the entry and why it does not decode.
func (e *decodeError) Error() string { return fmt.Sprintf("cache: decode %q: %v", e.key, e.err) }

// Unwrap returns the codec's error.
func (e *decodeError) Unwrap() error { return e.err }

// isDecodeErr reports whether err came from decoding an entry.
func isDecodeErr(err error) bool {
	var de *decodeError
	return errors.As(err, &de)
}

// jitter returns d ± 25 %.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	q := int64(d) / 4
	if q == 0 {
		return d
	}
	return time.Duration(int64(d) - q + rand.Int64N(2*q+1))
}

// newOwner returns this Cache's lease owner prefix: host:pid:random.
func newOwner() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "unknown-host"
	}
	if len(host) > 200 {
		host = strings.ToValidUTF8(host[:200], "")
	}
	var b [6]byte
	_, _ = cryptoRand(b[:])
	return "cache:" + host + ":" + strconv.Itoa(os.Getpid()) + ":" + hex.EncodeToString(b[:])
}

var cryptoRand = crand.Read

// hashedKey returns tag + the hex SHA-256 of s.
func hashedKey(tag, s string) string {
	sum := sha256.Sum256([]byte(s))
	return tag + hex.EncodeToString(sum[:])
}
