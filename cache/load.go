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

	"github.com/warden-go/warden"
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
	// remote: the load found another process's load lease in its way
	// and waited for it (set before done is closed).
	remote bool
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
// loader errors are returned as they are, never cached. A loaded value is
// returned once it is stored, or once the caller's store budget (below)
// runs out, whichever comes first; the write goes on in the background
// then (Close waits for it), and a failure to store the value is logged
// to the store's logger.
//
// Every store call GetOrLoad waits for before loading (the lookup, taking
// the load lease) is bounded by Options.StoreTimeout and by half of the
// time left before ctx's deadline, so that a store that stops answering
// leaves the loader time to run. When the store fails or runs out of that
// budget, GetOrLoad loads anyway (unless Options.FailOnStoreError, which
// returns the store's error, matching warden.ErrStoreTimeout for a budget
// that ran out): the value is served, its storing is attempted in the
// background, and Stats.StoreFallbacks counts it.
func (c *Cache[T]) GetOrLoad(ctx context.Context, key string, loader func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	if loader == nil {
		return zero, valid.Nil("cache", "loader")
	}
	sk := c.opts.Prefix + key
	dl, _ := ctx.Deadline()
	lctx, cancel := c.storeCtx(ctx, dl)
	r, err := c.lookup(lctx, sk, true)
	err = storeErr(ctx, lctx, err)
	cancel()
	if err != nil && ctx.Err() == nil && !isDecodeErr(err) && !c.opts.FailOnStoreError {
		// The store is down or slow: load without it.
		c.count(err)
		c.misses.Add(1)
		c.lookedUp(ctx, key, LookupMiss)
		return c.join(ctx, sk, loader, err)
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
		c.lookedUp(ctx, key, LookupHit)
		return r.val, nil
	case stateAbsent:
		c.negHits.Add(1)
		c.lookedUp(ctx, key, LookupNegative)
		return zero, ErrNotFound
	case stateStale:
		if c.opts.StaleWhileRevalidate > 0 {
			c.staleHits.Add(1)
			c.lookedUp(ctx, key, LookupStale)
			c.revalidate(ctx, sk, loader)
			return r.val, nil
		}
	}
	c.misses.Add(1)
	c.lookedUp(ctx, key, LookupMiss)
	return c.join(ctx, sk, loader, nil)
}

// storeCtx returns the context of a store call a caller waits for: ctx
// bounded by StoreTimeout and, when the caller has a deadline dl, by half
// of the time left before it, so that a hung store leaves the loader the
// other half.
func (c *Cache[T]) storeCtx(ctx context.Context, dl time.Time) (context.Context, context.CancelFunc) {
	d := c.opts.StoreTimeout
	if !dl.IsZero() {
		d = min(d, time.Until(dl)/2)
	}
	return context.WithTimeout(ctx, d)
}

// storeErr returns err, an error of a store call made on sctx (from
// storeCtx) for a caller on ctx, as an error matching
// warden.ErrStoreTimeout when the budget ran out while ctx lived (not
// context.DeadlineExceeded, which would read as the caller's own).
func storeErr(ctx, sctx context.Context, err error) error {
	if err != nil && ctx.Err() == nil && sctx.Err() != nil &&
		(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return fmt.Errorf("cache: %w", warden.ErrStoreTimeout)
	}
	return err
}

// join waits for the process's load of sk, starting one if none runs.
// down is the store's error if the caller's lookup failed: a load started
// then goes without the store. The load's store calls are bounded by the
// deadline of the caller that starts it, and so is the callers' wait for
// the loaded value to be stored.
func (c *Cache[T]) join(ctx context.Context, sk string, loader func(context.Context) (T, error), down error) (T, error) {
	var zero T
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return zero, ErrClosed
	}
	f := c.flights[sk]
	joined := f != nil // another caller's load
	if f == nil {
		f = &flight[T]{done: make(chan struct{})}
		c.flights[sk] = f
		base, stop := c.detach(ctx)
		dl, _ := ctx.Deadline()
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer stop()
			var (
				v     T
				err   error
				after func()
			)
			if down != nil {
				v, after, err = c.loadWithoutStore(base, sk, loader, down)
			} else {
				v, after, err = c.fetch(base, dl, sk, f, loader)
			}
			if after != nil {
				// Store the value (and give the load lease back) while the
				// callers wait, so that their next lookup finds it — but
				// only within their store budget; the write goes on
				// without them past it, or at once if the store is down.
				wrote := make(chan struct{})
				c.wg.Add(1)
				go func() {
					defer c.wg.Done()
					defer close(wrote)
					after()
				}()
				if down == nil {
					wctx, cancel := c.storeCtx(base, dl)
					select {
					case <-wrote:
					case <-wctx.Done():
					}
					cancel()
				}
			}
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

	var start time.Time
	if c.opts.Observe != nil {
		start = time.Now()
	}
	select {
	case <-f.done:
		if c.opts.Observe != nil && (joined || f.remote) {
			c.observeKey(ctx, sk, Observation{Kind: ObservedLoadWait, Duration: time.Since(start), Remote: f.remote, Err: f.err})
		}
		return f.val, f.err
	case <-ctx.Done():
		c.mu.Lock()
		f.waiters--
		c.mu.Unlock()
		if c.opts.Observe != nil && joined {
			c.observeKey(ctx, sk, Observation{Kind: ObservedLoadWait, Duration: time.Since(start), Err: ctx.Err()})
		}
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
// started. Its store calls are bounded as storeCtx says, for a caller
// whose deadline is dl. after, if not nil, stores the value and gives
// the lease back; it is run once the value is served.
func (c *Cache[T]) fetch(base context.Context, dl time.Time, sk string, f *flight[T], loader func(context.Context) (T, error)) (v T, after func(), err error) {
	var zero T
	owner := c.flightOwner()
	lk := leaseKey(sk)
	delay := c.opts.PollMin
	for {
		if base.Err() != nil {
			return zero, nil, ErrClosed
		}
		sent := time.Now()
		actx, cancel := c.storeCtx(base, dl)
		rec, acquired, err := c.st.Locks().Acquire(actx, lk, owner, c.opts.LoadLease)
		err = storeErr(base, actx, err)
		cancel()
		if err != nil {
			c.count(err)
			if base.Err() == nil && !c.opts.FailOnStoreError {
				return c.loadWithoutStore(base, sk, loader, err)
			}
			return zero, nil, c.closedOr(base, err)
		}
		if acquired {
			return c.loadHeld(base, dl, sk, lk, owner, rec.Token, sent, loader)
		}
		// Another process loads: wait for its value, or for its lease to
		// end so that this one can take over.
		f.remote = true
		if !c.pause(base, f, jitter(delay)) {
			return zero, nil, c.closedOr(base, context.Canceled) // nobody waits any more
		}
		delay = min(2*delay, c.opts.PollMax)
		lctx, cancel := c.storeCtx(base, dl)
		r, err := c.lookup(lctx, sk, true)
		err = storeErr(base, lctx, err)
		cancel()
		if err != nil && !isDecodeErr(err) {
			c.count(err)
			if base.Err() == nil && !c.opts.FailOnStoreError {
				return c.loadWithoutStore(base, sk, loader, err)
			}
			return zero, nil, c.closedOr(base, err)
		}
		switch r.state {
		case stateFresh:
			return r.val, nil, nil
		case stateStale:
			if c.opts.StaleWhileRevalidate > 0 {
				return r.val, nil, nil
			}
		case stateAbsent:
			return zero, nil, ErrNotFound
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
// (acquired by a request sent at sent). It first re-reads the entry
// (bounded like fetch's calls, for a caller whose deadline is dl), in
// case the previous lease holder stored a value just before the lease was
// taken. after stores the result (a value, or an absence with
// NegativeTTL) and then gives the lease back, so that other processes find
// the value once the lease is free.
func (c *Cache[T]) loadHeld(base context.Context, dl time.Time, sk, lk, owner string, token int64, sent time.Time, loader func(context.Context) (T, error)) (v T, after func(), err error) {
	var zero T
	giveBack := func() { c.giveBack(base, lk, owner, token) }

	lctx, cancel := c.storeCtx(base, dl)
	r, err := c.lookup(lctx, sk, true)
	err = storeErr(base, lctx, err)
	cancel()
	if err != nil && !isDecodeErr(err) {
		c.count(err)
		if base.Err() == nil && !c.opts.FailOnStoreError {
			v, store, err := c.loadWithoutStore(base, sk, loader, err)
			return v, func() {
				store()
				giveBack()
			}, err
		}
		return zero, giveBack, c.closedOr(base, err)
	}
	switch r.state {
	case stateFresh:
		return r.val, giveBack, nil
	case stateAbsent:
		return zero, giveBack, ErrNotFound
	}

	ldctx, cancel := context.WithDeadline(base, sent.Add(c.opts.LoadLease))
	defer cancel()
	c.loads.Add(1)
	v, err = c.callLoader(ldctx, sk, loader)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			if c.opts.NegativeTTL <= 0 {
				return zero, giveBack, err
			}
			return zero, func() {
				wctx, wcancel := context.WithTimeout(context.WithoutCancel(base), releaseTimeout)
				if serr := c.st.Cache().Set(wctx, sk, absentValue, c.opts.NegativeTTL); serr != nil {
					c.count(serr)
					c.st.Logger().Warn("warden cache: cannot cache an absence", "key", sk, "err", serr)
				}
				wcancel()
				giveBack()
			}, err
		}
		c.loadErrs.Add(1)
		if cerr := ldctx.Err(); cerr != nil && errors.Is(err, cerr) && base.Err() == nil {
			err = fmt.Errorf("cache: load of %q ran out of its LoadLease (%v): %w", sk, c.opts.LoadLease, err)
		}
		return zero, giveBack, err
	}
	return v, func() {
		c.store(base, sk, v, releaseTimeout)
		giveBack()
	}, nil
}

// store writes a loaded value v under sk, bounded by timeout and not by
// base's cancellation; a failure is counted and logged.
func (c *Cache[T]) store(base context.Context, sk string, v T, timeout time.Duration) {
	b, hard, err := c.encode(v, c.opts.TTL)
	if err == nil {
		wctx, wcancel := context.WithTimeout(context.WithoutCancel(base), timeout)
		err = c.st.Cache().Set(wctx, sk, b, hard)
		wcancel()
	}
	if err != nil {
		c.count(err)
		c.st.Logger().Warn("warden cache: cannot store a loaded value", "key", sk, "err", err)
	}
}

// loadWithoutStore loads sk when the store failed (storeErr) on the way:
// without the cross-process lease, bounded by LoadLease. The value is
// served; after attempts to store it, bounded by StoreTimeout.
func (c *Cache[T]) loadWithoutStore(base context.Context, sk string, loader func(context.Context) (T, error), storeErr error) (v T, after func(), err error) {
	var zero T
	c.fallbacks.Add(1)
	if c.opts.Observe != nil {
		c.observeKey(base, sk, Observation{Kind: ObservedFallback, Err: storeErr})
	}
	c.st.Logger().Warn("warden cache: the store failed; loading without it", "key", sk, "err", storeErr)
	lctx, cancel := context.WithTimeout(base, c.opts.LoadLease)
	defer cancel()
	c.loads.Add(1)
	v, err = c.callLoader(lctx, sk, loader)
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			c.loadErrs.Add(1)
		}
		return zero, func() {}, err
	}
	return v, func() { c.store(base, sk, v, c.opts.StoreTimeout) }, nil
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
		_, after, err := c.loadHeld(base, time.Time{}, sk, lk, owner, rec.Token, sent, loader)
		if after != nil {
			after()
		}
		if err != nil && !errors.Is(err, ErrNotFound) && base.Err() == nil {
			c.st.Logger().Warn("warden cache: background reload failed; serving the stale value", "key", sk, "err", err)
		}
	}()
}

// callLoader calls loader for the stored key sk, observing the load.
func (c *Cache[T]) callLoader(ctx context.Context, sk string, loader func(context.Context) (T, error)) (T, error) {
	if c.opts.Observe == nil {
		return callLoader(ctx, loader)
	}
	start := time.Now()
	v, err := callLoader(ctx, loader)
	c.observeKey(ctx, sk, Observation{Kind: ObservedLoad, Duration: time.Since(start), Err: err})
	return v, err
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
