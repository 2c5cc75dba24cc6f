package idempotency

// Adversarial tests of the deadline rule for idempotency claims
// (docs/design.md "The deadline rule (leases and claims)"), on the memory
// store with the idempotency driver wrapped to delay answers. A failing
// test is a violation. (Internal package: one test emulates a second
// process's call counter.)

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/deadline"
	"github.com/warden-go/warden/internal/testkit"
)

var advQuiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func advOpen(t *testing.T, drv driver.Store) *warden.Store {
	t.Helper()
	return testkit.Open(t, drv, &warden.Options{Logger: advQuiet})
}

// shortDo is Do accepting leases down to deadline.MinTTL (10 ms), where
// the deadline rule still holds; Do refuses leases under MinLease.
func shortDo[T any](ctx context.Context, st *warden.Store, key string, opts *Options, fn func(context.Context) (T, error)) (T, error) {
	return do(ctx, st, key, opts, fn, deadline.MinTTL)
}

// slowIdem delays the answers of Claim and Extend (the write applies at
// once; the answer is late), as many times as the counters say. With
// hold set, Extend instead hangs, ignoring ctx, until hold is closed,
// and then fails without reaching the store; it says it hangs by closing
// entered.
type slowIdem struct {
	driver.Idempotency
	claimDelay, extendDelay atomic.Int64 // ns
	lateClaims, lateExtends atomic.Int32
	extends                 atomic.Int32
	hold, entered           chan struct{}
	enterOnce               sync.Once
}

func (s *slowIdem) Claim(ctx context.Context, key, owner string, lease time.Duration, fp string) (driver.IdemRecord, driver.ClaimOutcome, error) {
	rec, out, err := s.Idempotency.Claim(ctx, key, owner, lease, fp)
	if s.lateClaims.Add(-1) >= 0 {
		time.Sleep(time.Duration(s.claimDelay.Load()))
	}
	return rec, out, err
}

func (s *slowIdem) Extend(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	s.extends.Add(1)
	if s.hold != nil {
		s.enterOnce.Do(func() { close(s.entered) })
		<-s.hold
		return false, errors.New("adversarial: connection stuck")
	}
	ok, err := s.Idempotency.Extend(context.WithoutCancel(ctx), key, owner, lease)
	if s.lateExtends.Add(-1) >= 0 {
		time.Sleep(time.Duration(s.extendDelay.Load())) // ignores ctx: the answer is simply late
	}
	return ok, err
}

type slowStore struct {
	driver.Store
	idem *slowIdem
}

func (s *slowStore) Idempotency() driver.Idempotency { return s.idem }

func wrapSlow(d driver.Store, f *slowIdem) driver.Store {
	f.Idempotency = d.Idempotency()
	return &slowStore{Store: d, idem: f}
}

// HOLDS since bf341e8 (a VIOLATION at 1d31f4e). Two processes calling
// Do with one Options.Owner label never share a claim. At 1d31f4e the
// owner was label + "#" + a per-process call counter starting at 0, so
// process A's k-th call and process B's k-th call carried the same owner;
// the store treats a claim by the claimant's own owner as a renewal
// (driver.Claimed), and B ran fn while A's fn was still running (this
// test failed: fn ran twice, two at once). HEAD adds a per-process nonce.
//
// Interleaving: process A (store stA) calls Do(key, Owner "billing") and
// fn starts; process B (store stB, another connection to the same
// database) makes its call with the same label and the same call count;
// B must get ErrInProgress. (One test binary has one counter and nonce:
// the test sets them to emulate process B's.)
func TestAdversarialSameOwnerLabelAcrossProcesses(t *testing.T) {
	db := testkit.DBName(t)
	stA := advOpen(t, testkit.MemoryDriver(db))
	stB := advOpen(t, testkit.MemoryDriver(db))
	ctx := context.Background()
	var running, maxRunning, runs atomic.Int32
	started := make(chan struct{}, 2)
	release := make(chan struct{})
	fn := func(ctx context.Context) (int, error) {
		runs.Add(1)
		n := running.Add(1)
		for {
			m := maxRunning.Load()
			if n <= m || maxRunning.CompareAndSwap(m, n) {
				break
			}
		}
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		running.Add(-1)
		return 1, nil
	}
	opts := &Options{Owner: "billing", Lease: time.Second, NoWait: true}
	seq := callSeq.Load() // process A's counter before its call
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := Do(ctx, stA, "charge:1", opts, fn); err != nil {
			t.Errorf("process A: %v", err)
		}
	}()
	<-started
	callSeq.Store(seq) // process B has made as many calls as A had
	nonce := processNonce
	processNonce = "0123456789ab" // and is another process
	defer func() { processNonce = nonce }()
	_, errB := Do(ctx, stB, "charge:1", opts, func(ctx context.Context) (int, error) {
		// fn runs in B: let A finish only after B's fn has started.
		go func() { time.Sleep(20 * time.Millisecond); close(release) }()
		return fn(ctx)
	})
	select {
	case <-release:
	default:
		close(release)
	}
	wg.Wait()
	t.Logf("seq %d, now %d, B: %v, runs %d", seq, callSeq.Load(), errB, runs.Load())
	if runs.Load() > 1 || maxRunning.Load() > 1 {
		t.Fatalf("two processes with Owner label %q ran fn for one key %d times (%d at once; B's Do returned %v): they shared the owner %q",
			opts.Owner, runs.Load(), maxRunning.Load(), errB, opts.Owner+"#"+itoa(seq+1))
	}
	if !errors.Is(errB, ErrInProgress) {
		t.Fatalf("process B: %v, want ErrInProgress", errB)
	}
}

func itoa(n uint64) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// HOLDS since fcf8986 (a VIOLATION at 1d31f4e: DESIGN.md §4.1 says
// "Acquire never returns a lease whose deadline has passed. The same rule
// governs idempotency claims"). A Claim answered after the claim's
// deadline (the write applied, the answer late) must not run fn on that
// claim. At 1d31f4e fn was called with a context already done, while a
// duplicate had taken the key over and ran fn too (this test failed:
// fn ran twice, once dead at entry); HEAD claims again instead.
//
// Interleaving (Lease 50 ms, margin 5 ms): A's Claim applies at t0 and is
// answered at t0+70; meanwhile at t0+55 the claim has lapsed and B's Do
// takes it over and runs fn; A's Do must not call fn with a context
// whose deadline (t0+45) has passed.
func TestAdversarialLateClaimAnswerNeverRunsDeadFn(t *testing.T) {
	const lease = 50 * time.Millisecond
	db := testkit.DBName(t)
	slow := &slowIdem{}
	slow.claimDelay.Store(int64(70 * time.Millisecond))
	slow.lateClaims.Store(1)
	stA := advOpen(t, wrapSlow(testkit.MemoryDriver(db), slow))
	stB := advOpen(t, testkit.MemoryDriver(db))
	ctx := context.Background()
	var runs atomic.Int32
	deadAtEntry := make(chan error, 2)
	fn := func(ctx context.Context) (int, error) {
		runs.Add(1)
		deadAtEntry <- ctx.Err()
		time.Sleep(5 * time.Millisecond)
		return 1, nil
	}
	var wg sync.WaitGroup
	wg.Add(1)
	var errA error
	go func() {
		defer wg.Done()
		_, errA = shortDo(ctx, stA, "k", &Options{Lease: lease}, fn)
	}()
	time.Sleep(lease + 5*time.Millisecond) // A's claim has lapsed in the store
	_, errB := shortDo(ctx, stB, "k", &Options{Lease: lease, PollMin: time.Millisecond, PollMax: 5 * time.Millisecond}, fn)
	wg.Wait()
	close(deadAtEntry)
	var dead int
	for err := range deadAtEntry {
		if err != nil {
			dead++
		}
	}
	t.Logf("fn ran %d times; A: %v; B: %v", runs.Load(), errA, errB)
	if dead > 0 {
		t.Fatalf("fn was called %d time(s) with a claim already past its deadline (context done at entry); fn ran %d times in all",
			dead, runs.Load())
	}
}

// HOLDS. A renewal answered after the claim's deadline does not revive
// it: fn's context reports the loss by the clock at the deadline (before
// the late answer arrives), stays done, and Do reports ErrLeaseLost
// without storing the result.
func TestAdversarialLateRenewalDoesNotRevive(t *testing.T) {
	const lease = 60 * time.Millisecond
	slow := &slowIdem{}
	slow.extendDelay.Store(int64(lease))
	slow.lateExtends.Store(1 << 20)
	st := advOpen(t, wrapSlow(testkit.MemoryDriver(testkit.DBName(t)), slow))
	ctx := context.Background()
	_, err := shortDo(ctx, st, "k", &Options{Lease: lease}, func(ctx context.Context) (int, error) {
		start := time.Now()
		limit := start.Add(lease - deadlineMargin(lease)) // the claim's deadline is at or before this
		for ctx.Err() == nil {
			if now := time.Now(); now.After(limit) {
				return 0, errors.New("fn's context is live past the claim's deadline")
			}
		}
		if !errors.Is(context.Cause(ctx), ErrLeaseLost) {
			return 0, errors.New("cause is not ErrLeaseLost: " + context.Cause(ctx).Error())
		}
		// The late answer (a successful Extend) arrives; ctx stays done.
		for slow.extends.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(lease)
		if ctx.Err() == nil {
			return 0, errors.New("a late renewal revived the claim")
		}
		return 1, nil
	})
	if !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Do = %v, want ErrLeaseLost", err)
	}
	if v, found, _ := Result[int](ctx, st, "k", nil); found {
		t.Fatalf("a result (%v) was stored for a lost claim", v)
	}
}

func deadlineMargin(lease time.Duration) time.Duration {
	s, _ := resolve(&Options{Lease: lease}, deadline.MinTTL)
	return s.margin
}

// HOLDS since d6ee0e3 (a VIOLATION for fn's Done channel before it; its
// Err was right). The claim's context was cancelled at its deadline only
// by the renewal goroutine, which also makes the renewal calls. If a
// renewal call hangs past the deadline (a driver stuck on a dead
// connection that does not honour cancellation — the lock package copes
// with exactly this: its schedule timer ends a lease at its deadline
// whatever its refresh is doing), fn's ctx.Done() stayed open until the
// call returned, long after the store let a duplicate take the key over:
// a fn blocked in `select { case <-ctx.Done(): … }` or in any library
// call that watches ctx.Done() kept working while the duplicate ran fn.
// A timer of the claim's own now closes Done at the deadline.
//
// A's renewals hang in the driver until the test lets them go, after
// A's Done has closed: Done closing at all, with nobody calling Err
// (which consults the clock and would cancel the context itself), shows
// that it does not wait for the renewal. It closes at or after the
// deadline, with ErrLeaseLost, and then B takes the key over and runs fn.
// (How soon after the deadline Done closes is the runtime's timer
// latency — a benchmark's matter, not a test's; Err is exact, see
// TestAdversarialLateRenewalDoesNotRevive.)
func TestAdversarialHungRenewalStillEndsAtDeadline(t *testing.T) {
	const lease = 60 * time.Millisecond
	db := testkit.DBName(t)
	slow := &slowIdem{hold: make(chan struct{}), entered: make(chan struct{})}
	stA := advOpen(t, wrapSlow(testkit.MemoryDriver(db), slow))
	stB := advOpen(t, testkit.MemoryDriver(db))
	ctx := context.Background()
	aCause := make(chan error, 1)
	aDone := make(chan time.Time, 1)
	// A's claim is sent after this: its deadline is at or after
	// before + lease − margin.
	before := time.Now()
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = shortDo(ctx, stA, "k", &Options{Lease: lease}, func(ctx context.Context) (int, error) {
			<-ctx.Done() // never, if Done waited for the hung renewal
			aDone <- time.Now()
			aCause <- context.Cause(ctx)
			return 1, nil
		})
	})
	defer wg.Wait()
	released := false
	release := func() {
		if !released {
			released = true
			close(slow.hold)
		}
	}
	defer release()
	doneAt := <-aDone
	hung := false
	select {
	case <-slow.entered:
		hung = true
	default: // the renewal was not due before the deadline on a slow machine
	}
	if earliest := before.Add(lease - deadlineMargin(lease)); doneAt.Before(earliest) {
		t.Errorf("A's fn ctx.Done() closed at %v, before the claim's deadline (at the earliest %v)", doneAt, earliest)
	}
	if cause := <-aCause; !errors.Is(cause, ErrLeaseLost) {
		t.Errorf("A's fn ctx ended with %v, want ErrLeaseLost", cause)
	}
	t.Logf("A's Done closed %v after the earliest possible deadline; a renewal hung meanwhile: %v",
		doneAt.Sub(before.Add(lease-deadlineMargin(lease))).Round(time.Millisecond), hung)
	// B takes the key over once the store lets A's claim lapse.
	if v, err := shortDo(ctx, stB, "k", &Options{Lease: lease, PollMin: time.Millisecond, PollMax: 5 * time.Millisecond}, func(ctx context.Context) (int, error) {
		return 2, nil
	}); err != nil || v != 2 {
		t.Fatalf("B: %v, %v; want B to take the key over and run fn", v, err)
	}
	release()
}
