package drivertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/cache"
	"github.com/warden-go/warden/checkpoint"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/lock"
)

// portable runs the packages users call — lock, breaker, idempotency,
// cache, checkpoint — on the store: in this process (Smoke, LeaseLost) and,
// when the harness has a URL, across OS processes (the *Processes checks,
// LockHandoff, CheckpointResumeAfterKill in portable_multiprocess.go).
// These packages are written once over the driver primitives; the checks
// prove that the store's primitives give them what they rely on.
func (s *suite) portable(t *testing.T) {
	group(t, []check{
		{"Smoke", s.portableSmoke},
		{"LeaseLost", s.portableLeaseLost},
		{"LockExclusionProcesses", s.portableLockExclusion},
		{"LockHandoff", s.portableLockHandoff},
		{"IdempotencyProcesses", s.portableIdempotency},
		{"BreakerProcesses", s.portableBreaker},
		{"CacheLoadProcesses", s.portableCacheLoad},
		{"CacheHungStore", s.portableCacheHungStore},
		{"CheckpointResumeAfterKill", s.portableCheckpointKill},
	})
}

// errInjected is the failure the portable checks make their functions
// return.
var errInjected = errors.New("drivertest: injected failure")

// portableSmoke runs each package once on the store, in this process, so
// that stores without a URL also exercise the portable layer.
func (s *suite) portableSmoke(t *testing.T) {
	for _, c := range []check{
		{"Lock", s.smokeLock},
		{"Breaker", s.smokeBreaker},
		{"Idempotency", s.smokeIdempotency},
		{"Cache", s.smokeCache},
		{"Checkpoint", s.smokeCheckpoint},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t)
		})
	}
}

// smokeLock: Lockers of one process exclude each other through the store
// (lock.Do and Acquire), tokens increase, TryAcquire names the holder.
func (s *suite) smokeLock(t *testing.T) {
	st, _ := s.open(t)
	ctx := testCtx(t)
	const workers, rounds = 4, 5
	const key = "smoke-lock"
	lockers := make([]*lock.Locker, workers)
	for i := range lockers {
		var err error
		lockers[i], err = lock.New(st, &lock.Options{TTL: 10 * time.Second, RetryMax: 50 * time.Millisecond})
		fatalIf(t, "lock.New", err)
		t.Cleanup(func() {
			if err := lockers[i].Close(); err != nil {
				t.Errorf("Locker.Close: %v", err)
			}
		})
	}
	var (
		inside atomic.Int32
		errs   errList
		mu     sync.Mutex
		last   int64
		done   atomic.Int32
	)
	section := func(ctx context.Context, who string, l *lock.Locker) {
		if n := inside.Add(1); n != 1 {
			errs.add("%s: %d holders inside the critical section at once", who, n)
		}
		defer inside.Add(-1)
		rec, found, err := st.Locks().Get(ctx, key)
		switch {
		case err != nil:
			errs.add("%s: Get: %v", who, err)
			return
		case !found || rec.Owner != l.Owner():
			errs.add("%s: inside the critical section the store shows %+v (found=%v), want the holder %q", who, rec, found, l.Owner())
			return
		}
		mu.Lock()
		if rec.Token <= last {
			errs.add("%s: token %d after token %d: fencing tokens must increase", who, rec.Token, last)
		}
		last = rec.Token
		mu.Unlock()
		if ctx.Err() != nil {
			errs.add("%s: the lease ended inside the critical section: %v", who, context.Cause(ctx))
		}
		done.Add(1)
	}
	parallel(workers, func(i int) {
		l := lockers[i]
		for r := range rounds {
			who := "locker " + l.Owner()
			if (i+r)%2 == 0 {
				if err := lock.Do(ctx, l, key, func(ctx context.Context) error {
					section(ctx, who, l)
					return nil
				}); err != nil {
					errs.add("%s: lock.Do: %v", who, err)
				}
				continue
			}
			lease, err := l.Acquire(ctx, key)
			if err != nil {
				errs.add("%s: Acquire: %v", who, err)
				continue
			}
			section(lease.Context(), who, l)
			if err := lease.Release(ctx); err != nil {
				errs.add("%s: Release: %v", who, err)
			}
		}
	})
	errs.report(t, "lock.Do and Acquire from Lockers of one process")
	if n := done.Load(); n != workers*rounds {
		t.Errorf("%d critical sections completed, want %d", n, workers*rounds)
	}

	lease, err := lockers[0].Acquire(ctx, key)
	fatalIf(t, "Acquire", err)
	_, err = lockers[1].TryAcquire(ctx, key)
	var held *lock.HeldError
	switch {
	case !errors.Is(err, lock.ErrLocked) || !errors.As(err, &held):
		t.Errorf("TryAcquire of a held key: got %v, want a *lock.HeldError matching lock.ErrLocked", err)
	case held.Owner != lockers[0].Owner() || held.Token != lease.Token():
		t.Errorf("TryAcquire of a held key names %q with token %d, want %q with token %d", held.Owner, held.Token, lockers[0].Owner(), lease.Token())
	}
	errorIf(t, "Release", lease.Release(ctx))
	if rec, found, err := st.Locks().Get(ctx, key); err != nil || found {
		t.Errorf("after the last release the key is still held: %+v found=%v err=%v", rec, found, err)
	}
}

// smokeBreaker: a breaker opens at its threshold and rejects calls without
// running them, for every Breaker of the circuit.
func (s *suite) smokeBreaker(t *testing.T) {
	st, prefix := s.open(t)
	other := s.openPrefix(t, prefix)
	ctx := testCtx(t)
	const name, threshold = "smoke-breaker", 3
	// The counting is checked here, not the store budget: a store slowed
	// by a busy test machine must not make a write count as an outage.
	opts := &breaker.Options{Threshold: threshold, OpenFor: time.Minute, StoreTimeout: 10 * time.Second}
	b, err := breaker.New(st, name, opts)
	fatalIf(t, "breaker.New", err)
	t.Cleanup(func() { b.Close() })
	ran := 0
	fn := func(context.Context) error {
		ran++
		return errInjected
	}
	for i := range threshold {
		if err := b.Do(ctx, fn); !errors.Is(err, errInjected) {
			t.Errorf("failing call %d of %d below the threshold: got %v, want the injected failure", i+1, threshold, err)
		}
	}
	if err := b.Do(ctx, fn); !errors.Is(err, breaker.ErrOpen) {
		t.Errorf("a call after %d failures (the threshold): got %v, want breaker.ErrOpen", threshold, err)
	}
	if ran != threshold {
		t.Errorf("fn ran %d times, want %d: an open circuit must not run it", ran, threshold)
	}
	rec, found, err := st.Circuits().Get(ctx, name)
	fatalIf(t, "Get", err)
	if !found {
		t.Fatal("the circuit's record is absent after the breaker opened")
	}
	wantCircuit(t, "the record after the breaker opened", rec, name, driver.Open, threshold)

	// A Breaker of the same circuit on another connection sees it open.
	b2, err := breaker.New(other, name, opts)
	fatalIf(t, "breaker.New", err)
	t.Cleanup(func() { b2.Close() })
	if err := b2.Do(ctx, fn); !errors.Is(err, breaker.ErrOpen) {
		t.Errorf("another connection's Breaker of the open circuit: got %v, want breaker.ErrOpen", err)
	}
	if ran != threshold {
		t.Errorf("fn ran %d times, want %d", ran, threshold)
	}
}

// smokeIdempotency: concurrent duplicates run fn once and all return its
// result; a stored result is returned without running fn; an error is not
// stored.
func (s *suite) smokeIdempotency(t *testing.T) {
	st, _ := s.open(t)
	ctx := testCtx(t)
	const callers = 10
	opts := &idempotency.Options{Lease: 10 * time.Second, PollMin: 5 * time.Millisecond, PollMax: 50 * time.Millisecond}
	var runs atomic.Int32
	var errs errList
	parallel(callers, func(i int) {
		v, err := idempotency.Do(ctx, st, "smoke-idem", opts, func(ctx context.Context) (int, error) {
			runs.Add(1)
			sleepCtx(ctx, 50*time.Millisecond) // the work, long enough for the duplicates to arrive
			return 42, nil
		})
		if err != nil || v != 42 {
			errs.add("caller %d: got %d, %v; want 42", i, v, err)
		}
	})
	errs.report(t, "concurrent duplicates")
	if n := runs.Load(); n != 1 {
		t.Errorf("fn ran %d times for %d concurrent duplicates, want once", n, callers)
	}
	v, err := idempotency.Do(ctx, st, "smoke-idem", opts, func(context.Context) (int, error) {
		t.Error("fn ran again although its result is stored")
		return 0, nil
	})
	if err != nil || v != 42 {
		t.Errorf("a later duplicate: got %d, %v; want the stored 42", v, err)
	}
	if _, err := idempotency.Do(ctx, st, "smoke-idem-error", opts, func(context.Context) (int, error) {
		return 0, errInjected
	}); !errors.Is(err, errInjected) {
		t.Errorf("a failing fn: got %v, want its error", err)
	}
	v, err = idempotency.Do(ctx, st, "smoke-idem-error", opts, func(context.Context) (int, error) { return 7, nil })
	if err != nil || v != 7 {
		t.Errorf("a retry after a failure: got %d, %v; want 7 (a failure must not be stored)", v, err)
	}
}

// smokeCache: concurrent GetOrLoad calls of two Caches load once.
func (s *suite) smokeCache(t *testing.T) {
	st, _ := s.open(t)
	ctx := testCtx(t)
	const callers = 10
	var caches [2]*cache.Cache[string]
	for i := range caches {
		// A store slower than the default StoreTimeout counts as down,
		// and a Cache then loads without the lease (by design); a slow
		// test server must not pass for that here.
		c, err := cache.New[string](st, &cache.Options{TTL: time.Minute, PollMax: 50 * time.Millisecond, StoreTimeout: time.Minute})
		fatalIf(t, "cache.New", err)
		t.Cleanup(func() { c.Close() })
		caches[i] = c
	}
	var loads atomic.Int32
	var errs errList
	parallel(callers, func(i int) {
		v, err := caches[i%2].GetOrLoad(ctx, "smoke-cache", func(ctx context.Context) (string, error) {
			loads.Add(1)
			sleepCtx(ctx, 50*time.Millisecond) // the load, long enough for the others to arrive
			return "loaded", nil
		})
		if err != nil || v != "loaded" {
			errs.add("caller %d: got %q, %v", i, v, err)
		}
	})
	errs.report(t, "concurrent GetOrLoad")
	if n := loads.Load(); n != 1 {
		t.Errorf("the loader ran %d times for %d concurrent callers of two Caches, want once", n, callers)
	}
	if v, err := caches[1].Get(ctx, "smoke-cache"); err != nil || v != "loaded" {
		t.Errorf("Get after the load: got %q, %v", v, err)
	}
	if _, err := caches[0].Get(ctx, "smoke-cache-absent"); !errors.Is(err, cache.ErrNotFound) {
		t.Errorf("Get of an absent key: got %v, want cache.ErrNotFound", err)
	}
}

// smokeCheckpoint: a task that fails resumes from its last save in the
// next run, and its checkpoints are deleted when it succeeds.
func (s *suite) smokeCheckpoint(t *testing.T) {
	st, _ := s.open(t)
	ctx := testCtx(t)
	const task = "smoke-task"
	opts := &checkpoint.Options{Lock: true, LockOptions: &lock.Options{TTL: 10 * time.Second}}
	err := checkpoint.Run(ctx, st, task, opts, func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
		if v, ok := cp.State(); ok || cp.Resumed() {
			t.Errorf("a fresh task starts from state %d (resumed=%v)", v, cp.Resumed())
		}
		for step := 1; step <= 3; step++ {
			if err := cp.Save(ctx, step, float64(step)*20); err != nil {
				return err
			}
		}
		return errInjected
	})
	if !errors.Is(err, errInjected) {
		t.Fatalf("a failing task: Run returned %v, want its error", err)
	}
	state, last, err := checkpoint.Latest[int](ctx, st, task, nil)
	fatalIf(t, "checkpoint.Latest", err)
	if state != 3 || last.Token <= 0 {
		t.Errorf("after the failure the latest checkpoint holds state %d with token %d, want 3 with the lease's token", state, last.Token)
	}
	err = checkpoint.Run(ctx, st, task, opts, func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
		v, ok := cp.State()
		if !ok || v != 3 || !cp.Resumed() {
			t.Errorf("the second run starts from state %d (found=%v, resumed=%v), want 3", v, ok, cp.Resumed())
		}
		if cp.Token() <= last.Token {
			t.Errorf("the second run's token %d is not above the first's %d", cp.Token(), last.Token)
		}
		for step := v + 1; step <= 5; step++ {
			if err := cp.Save(ctx, step, float64(step)*20); err != nil {
				return err
			}
		}
		return nil
	})
	errorIf(t, "the resumed run", err)
	cps, err := checkpoint.List(ctx, st, task)
	fatalIf(t, "checkpoint.List", err)
	if len(cps) != 0 {
		t.Errorf("%d checkpoints left after the task succeeded, want none", len(cps))
	}
}

// ---------------------------------------------------------------------------
// lost leases

// portableLeaseLost: a lease whose refreshes the store stops accepting
// ends, with lock.ErrLeaseLost, within its TTL.
func (s *suite) portableLeaseLost(t *testing.T) {
	t.Run("ForceRelease", func(t *testing.T) {
		t.Parallel()
		s.leaseLostForceRelease(t)
	})
	t.Run("RefreshFails", func(t *testing.T) {
		t.Parallel()
		s.leaseLostRefreshFails(t)
	})
}

// awaitDone waits for done to close, however long that takes; false if
// ctx (the check's) ended first.
func awaitDone(ctx context.Context, done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// leaseLostForceRelease: an operator force-releases a held key from
// another connection; the holder's lease ends with ErrLeaseLost, and
// lock.Do reports the loss.
func (s *suite) leaseLostForceRelease(t *testing.T) {
	st, prefix := s.open(t)
	op := s.openPrefix(t, prefix)
	ctx := testCtx(t)
	const ttl = 3 * time.Second
	locker, err := lock.New(st, &lock.Options{TTL: ttl, RefreshInterval: 100 * time.Millisecond})
	fatalIf(t, "lock.New", err)
	t.Cleanup(func() { locker.Close() })

	const key = "lease-lost"
	lease, err := locker.Acquire(ctx, key)
	fatalIf(t, "Acquire", err)
	rec, found, err := op.Locks().Get(ctx, key)
	fatalIf(t, "Get", err)
	if !found || rec.Owner != locker.Owner() || rec.Token != lease.Token() {
		t.Fatalf("another connection sees %+v (found=%v), want the holder %q with token %d", rec, found, locker.Owner(), lease.Token())
	}
	ok, err := op.Locks().ForceRelease(ctx, key)
	released := time.Now() // the force-release applied before this
	fatalIf(t, "ForceRelease", err)
	if !ok {
		t.Fatal("ForceRelease of a held key reported nothing released")
	}
	if !awaitDone(ctx, lease.Done()) {
		t.Fatalf("the check ended before the lease of a force-released key: %v", ctx.Err())
	}
	// Within its TTL, computed: no refresh sent after the force-release
	// applied can succeed, so the deadline is at most TTL after it.
	if bound := released.Add(ttl); lease.Deadline().After(bound) {
		t.Errorf("the lease's deadline %v is more than its TTL after the force-release (%v): a refresh after the force-release renewed it",
			lease.Deadline().Format(time.RFC3339Nano), bound.Format(time.RFC3339Nano))
	}
	wantErr(t, "the lease's Err after a force-release", lease.Err(), lock.ErrLeaseLost)
	wantErr(t, "the cause of the lease's context", context.Cause(lease.Context()), lock.ErrLeaseLost)
	wantErr(t, "Release of the lost lease", lease.Release(ctx), lock.ErrNotHeld)

	// The same under lock.Do: fn's context ends and Do reports the loss.
	const key2 = "lease-lost-do"
	entered := make(chan struct{})
	result := make(chan error, 1)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // after ctx ends, fn and Do return
	wg.Go(func() {
		result <- lock.Do(ctx, locker, key2, func(fctx context.Context) error {
			close(entered)
			if !awaitDone(ctx, fctx.Done()) {
				return errors.New("fn's context was not cancelled before the check ended")
			}
			return context.Cause(fctx)
		})
	})
	if !awaitDone(ctx, entered) {
		t.Fatal("lock.Do did not run fn before the check ended")
	}
	ok, err = op.Locks().ForceRelease(ctx, key2)
	fatalIf(t, "ForceRelease", err)
	if !ok {
		t.Fatal("ForceRelease of a key held under lock.Do reported nothing released")
	}
	select {
	case err := <-result:
		wantErr(t, "lock.Do whose key was force-released", err, lock.ErrLeaseLost)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
}

// refreshFailStore is the harness store's driver with a lock driver whose
// refreshes fail once switched on, as they do for a holder cut off from
// its database.
type refreshFailStore struct {
	driver.Store
	locks *refreshFailLocks
}

func (s *refreshFailStore) Locks() driver.Locks { return s.locks }

// Close does nothing: the wrapped driver belongs to the harness's store.
func (s *refreshFailStore) Close() error { return nil }

type refreshFailLocks struct {
	driver.Locks
	failing atomic.Bool

	mu       sync.Mutex
	ok       int       // successful refreshes
	failed   int       // refreshes refused by the switch
	lastSent time.Time // when the last successful refresh was sent
}

func (l *refreshFailLocks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	if l.failing.Load() {
		l.mu.Lock()
		l.failed++
		l.mu.Unlock()
		return driver.LockRecord{}, false, errors.New("drivertest: the database is unreachable (injected)")
	}
	sent := time.Now()
	rec, ok, err := l.Locks.Refresh(ctx, key, owner, token, ttl)
	if err == nil && ok {
		l.mu.Lock()
		l.ok++
		if sent.After(l.lastSent) {
			l.lastSent = sent
		}
		l.mu.Unlock()
	}
	return rec, ok, err
}

func (l *refreshFailLocks) counts() (ok, failed int, lastSent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok, l.failed, l.lastSent
}

// leaseLostRefreshFails: once the store stops answering refreshes, the
// lease ends no later than about its TTL after the last refresh that
// succeeded — not before the failures began, and not never.
func (s *suite) leaseLostRefreshFails(t *testing.T) {
	st, _ := s.open(t)
	ctx := testCtx(t)
	fl := &refreshFailLocks{Locks: st.Driver().Locks()}
	wst := warden.New(&refreshFailStore{Store: st.Driver(), locks: fl}, &warden.Options{Logger: slog.New(slog.DiscardHandler)})
	const ttl = time.Second
	locker, err := lock.New(wst, &lock.Options{TTL: ttl, RefreshInterval: 100 * time.Millisecond})
	fatalIf(t, "lock.New", err)
	t.Cleanup(func() { locker.Close() })

	// Hold a lease through a few successful refreshes (awaited, not
	// slept). A host that stalls the process for longer than the TTL
	// (a loaded CI machine under -race) rightly ends the lease by the
	// clock while its refreshes still succeed: that is the deadline rule
	// at work, so the check verifies the lease ended no earlier than its
	// deadline and starts over with a new lease, a bounded number of times.
	var lease *lock.Lease
	for attempt := 1; lease == nil; attempt++ {
		l, err := locker.Acquire(ctx, fmt.Sprintf("lease-refresh-fails-%d", attempt))
		fatalIf(t, "Acquire", err)
		start, _, _ := fl.counts()
		for lease == nil {
			if n, _, _ := fl.counts(); n >= start+3 {
				lease = l
				break
			}
			select {
			case <-l.Done():
			default:
				sleepCtx(ctx, 5*time.Millisecond)
				continue
			}
			if now := time.Now(); now.Before(l.Deadline()) || !errors.Is(l.Err(), lock.ErrLeaseLost) {
				t.Fatalf("the lease ended (%v) at %v, before its deadline %v, while its refreshes succeeded",
					l.Err(), now.Format(time.RFC3339Nano), l.Deadline().Format(time.RFC3339Nano))
			}
			if attempt == 5 {
				t.Fatalf("the host stalled past the lease's deadline in each of %d attempts; the lease ended by the clock (%v)", attempt, l.Err())
			}
			t.Logf("attempt %d: the lease reached its deadline while its refreshes succeeded (a stalled host); starting over", attempt)
			break
		}
	}
	select {
	case <-lease.Done():
		t.Fatalf("the lease ended (%v) before its refreshes failed", lease.Err())
	default:
	}
	fl.failing.Store(true)
	if !awaitDone(ctx, lease.Done()) {
		t.Fatalf("the check ended before the lease whose refreshes fail: %v", ctx.Err())
	}
	ended := time.Now()
	_, failed, lastSent := fl.counts()
	wantErr(t, "the lease's Err after its refreshes failed", lease.Err(), lock.ErrLeaseLost)
	if failed == 0 {
		// No refresh was even tried before the deadline: a host stalled
		// for the rest of the TTL. The lease still ended by the rule,
		// which the checks below verify exactly.
		t.Logf("the lease ended before a refresh was tried (a stalled host): its Err is %v", lease.Err())
	}
	// The deadline rule, computed rather than timed: the lease's deadline
	// is at most the last successful refresh's send time + TTL −
	// lock.MinClockSkew, and it did not end before it.
	if bound := lastSent.Add(ttl - lock.MinClockSkew); lease.Deadline().After(bound) {
		t.Errorf("the lease's deadline %v is after its last successful refresh's send time + TTL − MinClockSkew (%v): its holder would believe it held a lock the store may have handed on",
			lease.Deadline().Format(time.RFC3339Nano), bound.Format(time.RFC3339Nano))
	}
	if ended.Before(lease.Deadline()) {
		t.Errorf("the lease ended at %v, before its deadline %v, while the store still had it", ended, lease.Deadline())
	}
	t.Logf("the lease ended %v after its last successful refresh was sent (TTL %v), after %d failed refreshes", ended.Sub(lastSent), ttl, failed)
	fl.failing.Store(false)
	wantErr(t, "Release of the lost lease", lease.Release(ctx), lock.ErrNotHeld)
}
