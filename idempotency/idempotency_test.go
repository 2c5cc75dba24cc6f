package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/internal/testkit"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/store/memory"
)

type receipt struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// 100 concurrent duplicates spread over several processes (stores on one
// database): fn runs once, and every caller gets its result.
func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	t.Parallel()
	const callers, procs = 100, 4
	db := testkit.DBName(t)
	ops := &testkit.OpCounter{}
	var stores []*warden.Store
	for range procs {
		stores = append(stores, openStore(t, db, ops))
	}
	var ran atomic.Int32
	fn := func(ctx context.Context) (receipt, error) {
		n := ran.Add(1)
		// Stay in progress until every caller has tried to claim the key,
		// however long that takes: each claims at least once.
		for ops.Get("idempotency.claim") < callers {
			time.Sleep(time.Millisecond)
		}
		return receipt{ID: fmt.Sprint("r-", n), Amount: 42}, nil
	}
	results := make([]receipt, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			results[i], errs[i] = idempotency.Do(context.Background(), stores[i%procs], "charge-1", fast(idemOpts{}), fn)
		})
	}
	wg.Wait()
	if n := ran.Load(); n != 1 {
		t.Fatalf("fn ran %d times", n)
	}
	want := receipt{ID: "r-1", Amount: 42}
	for i := range callers {
		if errs[i] != nil || results[i] != want {
			t.Fatalf("caller %d got %+v, %v; want %+v", i, results[i], errs[i], want)
		}
	}
	rec, found, err := stores[0].Idempotency().Get(context.Background(), "charge-1")
	if err != nil || !found || rec.Status != driver.IdemCompleted {
		t.Fatalf("record %+v found=%v err=%v", rec, found, err)
	}
	// A later duplicate returns the stored result without running fn.
	got, err := idempotency.Do(context.Background(), stores[1], "charge-1", nil, fn)
	if err != nil || got != want || ran.Load() != 1 {
		t.Fatalf("later duplicate: %+v, %v (fn ran %d times)", got, err, ran.Load())
	}
}

func TestNoWaitReportsInProgress(t *testing.T) {
	t.Parallel()
	st := openStore(t, testkit.DBName(t), nil)
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := idempotency.Do(context.Background(), st, "job", &idemOpts{Owner: "worker-a"}, func(context.Context) (string, error) {
			<-release
			return "first", nil
		})
		done <- err
	}()
	testkit.Eventually(t, 5*time.Second, "the first call claims the key", func() bool { return pending(t, st, "job") })

	_, err := idempotency.Do(context.Background(), st, "job", &idemOpts{NoWait: true}, func(context.Context) (string, error) {
		t.Error("a duplicate ran fn")
		return "", nil
	})
	var ip *idempotency.InProgressError
	if !errors.Is(err, idempotency.ErrInProgress) || !errors.As(err, &ip) {
		t.Fatalf("duplicate: %v", err)
	}
	if ip.Key != "job" || !strings.HasPrefix(ip.Owner, "worker-a#") || ip.Until.IsZero() {
		t.Errorf("InProgressError %+v", ip)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	v, err := idempotency.Do(context.Background(), st, "job", &idemOpts{NoWait: true}, func(context.Context) (string, error) { return "second", nil })
	if v != "first" || err != nil {
		t.Fatalf("after completion: %q, %v", v, err)
	}
}

func TestErrorsAreNotStored(t *testing.T) {
	t.Parallel()
	st := openStore(t, testkit.DBName(t), nil)
	ctx := context.Background()
	var ran int
	fn := func(context.Context) (int, error) {
		ran++
		if ran == 1 {
			return 0, errBoom
		}
		return 7, nil
	}
	if _, err := idempotency.Do(ctx, st, "k", nil, fn); !errors.Is(err, errBoom) {
		t.Fatalf("first call: %v", err)
	}
	if _, found, _ := st.Idempotency().Get(ctx, "k"); found {
		t.Fatal("a failed call left a record")
	}
	v, err := idempotency.Do(ctx, st, "k", nil, fn)
	if v != 7 || err != nil || ran != 2 {
		t.Fatalf("retry: %v, %v (ran %d)", v, err, ran)
	}
}

// With CacheErrors a stored error comes back as an error, never as a
// zero-value success.
func TestCacheErrors(t *testing.T) {
	t.Parallel()
	st := openStore(t, testkit.DBName(t), nil)
	ctx := context.Background()
	opts := &idemOpts{CacheErrors: true}
	_, err := idempotency.Do(ctx, st, "k", opts, func(context.Context) (receipt, error) {
		return receipt{}, fmt.Errorf("card declined: %w", errBoom)
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("the call that ran fn gets fn's own error: %v", err)
	}
	for _, o := range []*idemOpts{opts, nil} {
		v, err := idempotency.Do(ctx, st, "k", o, func(context.Context) (receipt, error) {
			t.Error("fn ran again despite a stored error")
			return receipt{ID: "x"}, nil
		})
		var se *idempotency.StoredError
		if err == nil || !errors.Is(err, idempotency.ErrStoredError) || !errors.As(err, &se) {
			t.Fatalf("duplicate: %+v, %v", v, err)
		}
		if se.Message != "card declined: boom" || se.Key != "k" || v != (receipt{}) {
			t.Errorf("stored error %+v, value %+v", se, v)
		}
	}
	_, found, err := idempotency.Result[receipt](ctx, st, "k", nil)
	if !found || !errors.Is(err, idempotency.ErrStoredError) {
		t.Fatalf("Result: found=%v err=%v", found, err)
	}

	// A caller that gave up does not store its cancellation.
	cctx, cancel := context.WithCancel(ctx)
	_, err = idempotency.Do(cctx, st, "k2", opts, func(ctx context.Context) (int, error) {
		cancel()
		return 0, ctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if _, found, _ := st.Idempotency().Get(ctx, "k2"); found {
		t.Fatal("a cancellation was stored")
	}
}

// A claimant that died (claimed, never completed) loses the key when its
// lease lapses; a waiting duplicate takes it over and runs fn.
func TestDeadClaimantIsTakenOver(t *testing.T) {
	t.Parallel()
	st := openStore(t, testkit.DBName(t), nil)
	ctx := context.Background()
	dead, out, err := st.Idempotency().Claim(ctx, "k", "dead-worker", 150*time.Millisecond, "")
	if err != nil || out != driver.Claimed {
		t.Fatalf("claim: %v %v", out, err)
	}
	var ip *idempotency.InProgressError
	if _, err := idempotency.Do(ctx, st, "k", &idemOpts{NoWait: true}, func(context.Context) (int, error) { return 0, nil }); !errors.As(err, &ip) || ip.Owner != "dead-worker" {
		t.Fatalf("NoWait while the dead claim is live: %v", err)
	}
	// The waiter's back-off is an hour: without the cap at the end of the
	// claim's lease it would sleep half an hour or more, and the test
	// would not end.
	var ran atomic.Int32
	var ranAt time.Time
	v, err := idempotency.Do(ctx, st, "k", &idemOpts{PollMin: time.Hour, PollMax: time.Hour}, func(context.Context) (int, error) {
		ranAt = time.Now()
		ran.Add(1)
		return 99, nil
	})
	if v != 99 || err != nil || ran.Load() != 1 {
		t.Fatalf("takeover: %v, %v (ran %d)", v, err, ran.Load())
	}
	// The memory store decides by this clock, in milliseconds: the waiter
	// cannot have the key before the dead claim's expiry.
	if ranAt.Before(dead.ExpiresAt) {
		t.Fatalf("fn ran at %v, before the dead claim's expiry %v", ranAt, dead.ExpiresAt)
	}
	rec, _, _ := st.Idempotency().Get(ctx, "k")
	if rec.Status != driver.IdemCompleted || rec.Owner == "dead-worker" {
		t.Fatalf("record after takeover %+v", rec)
	}
	// The dead claimant's late completion is refused.
	if ok, err := st.Idempotency().Complete(ctx, "k", "dead-worker", []byte(`1`), 0); ok || err != nil {
		t.Fatalf("late completion by the dead claimant: ok=%v err=%v", ok, err)
	}
}

// fn runs far longer than the lease: the background renewal keeps the
// claim, duplicates never run fn, and fn's ctx stays live. fn works for
// four leases and then waits until a duplicate has checked the key after
// that, and at least five have in all, so that the checks cover the whole
// run however slowly the machine makes them.
func TestLongFnKeepsItsClaim(t *testing.T) {
	t.Parallel()
	db := testkit.DBName(t)
	st := openStore(t, db, nil)
	other := openStore(t, db, nil)
	const lease = 200 * time.Millisecond
	var ran atomic.Int32
	finished := make(chan struct{})
	outlasted := make(chan struct{}) // fn's work has outlasted four leases
	checked := make(chan struct{})   // and duplicates checked the key after that
	release := sync.OnceFunc(func() { close(checked) })
	defer release()
	fn := func(ctx context.Context) (string, error) {
		if ran.Add(1) > 1 {
			return "again", nil // reported below: fn ran twice
		}
		time.Sleep(4 * lease) // the work itself outlasts the lease
		close(outlasted)
		<-checked
		if err := context.Cause(ctx); err != nil {
			return "", fmt.Errorf("fn's ctx ended: %w", err)
		}
		return "done", nil
	}
	var first string
	var firstErr error
	go func() {
		defer close(finished)
		first, firstErr = idempotency.Do(context.Background(), st, "k", &idemOpts{Lease: lease}, fn)
	}()
	testkit.Eventually(t, 5*time.Second, "the key is claimed", func() bool { return pending(t, st, "k") })

	var waited string
	var waitErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		waited, waitErr = idempotency.Do(context.Background(), other, "k", fast(idemOpts{Lease: lease}), fn)
	})
	checks := 0
	for running := true; running; {
		select {
		case <-finished:
			running = false
		case <-time.After(25 * time.Millisecond): // the checks' spacing
			late := false
			select {
			case <-outlasted:
				late = true
			default:
			}
			_, err := idempotency.Do(context.Background(), other, "k", &idemOpts{NoWait: true, Lease: lease}, fn)
			if err != nil && !errors.Is(err, idempotency.ErrInProgress) {
				t.Fatalf("duplicate while running: %v", err)
			}
			// A second run of fn (a duplicate took the claim over)
			// releases the first, to be reported below.
			if checks++; (late && checks >= 5) || ran.Load() > 1 {
				release()
			}
		}
	}
	wg.Wait()
	if first != "done" || firstErr != nil || waited != "done" || waitErr != nil {
		t.Fatalf("claimant: %q, %v; waiting duplicate: %q, %v", first, firstErr, waited, waitErr)
	}
	if n := ran.Load(); n != 1 {
		t.Fatalf("fn ran %d times (%d duplicate checks)", n, checks)
	}
}

func TestFingerprintMismatch(t *testing.T) {
	t.Parallel()
	st := openStore(t, testkit.DBName(t), nil)
	ctx := context.Background()
	fn := func(context.Context) (int, error) { return 1, nil }
	if _, err := idempotency.Do(ctx, st, "k", &idemOpts{Fingerprint: "sha:aaa"}, fn); err != nil {
		t.Fatal(err)
	}
	_, err := idempotency.Do(ctx, st, "k", &idemOpts{Fingerprint: "sha:bbb"}, func(context.Context) (int, error) {
		t.Error("fn ran for a mismatching request")
		return 2, nil
	})
	var me *idempotency.MismatchError
	if !errors.Is(err, idempotency.ErrMismatch) || !errors.As(err, &me) || me.Stored != "sha:aaa" || me.Given != "sha:bbb" {
		t.Fatalf("different fingerprint: %v", err)
	}
	for _, fp := range []string{"sha:aaa", ""} {
		if v, err := idempotency.Do(ctx, st, "k", &idemOpts{Fingerprint: fp}, fn); v != 1 || err != nil {
			t.Fatalf("fingerprint %q: %v, %v", fp, v, err)
		}
	}
	if _, _, err := idempotency.Result[int](ctx, st, "k", &idemOpts{Fingerprint: "sha:ccc"}); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("Result with another fingerprint: %v", err)
	}

	// In progress with another fingerprint: a mismatch, not a wait.
	if _, _, err := st.Idempotency().Claim(ctx, "k2", "someone", time.Minute, "fp-x"); err != nil {
		t.Fatal(err)
	}
	if _, err := idempotency.Do(ctx, st, "k2", &idemOpts{Fingerprint: "fp-y"}, fn); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("in progress, other fingerprint: %v", err)
	}
	if _, err := idempotency.Do(ctx, st, "k2", &idemOpts{Fingerprint: "fp-x", NoWait: true}, fn); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("in progress, same fingerprint: %v", err)
	}
}

// A duplicate waiting for a claim ends its wait when its ctx ends, with
// ctx's error unchanged.
func TestCancelWhileWaiting(t *testing.T) {
	t.Parallel()
	st := openStore(t, testkit.DBName(t), nil)
	if _, _, err := st.Idempotency().Claim(context.Background(), "k", "busy", time.Hour, ""); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	// Polls an hour apart and a claim live for an hour: only ctx can end
	// the wait (if it does not, the test never ends).
	_, err := idempotency.Do(ctx, st, "k", &idemOpts{PollMin: time.Hour, PollMax: time.Hour}, func(context.Context) (int, error) {
		t.Error("fn ran while another claim was live")
		return 0, nil
	})
	if err != context.DeadlineExceeded || err != ctx.Err() {
		t.Fatalf("Do = %v, want ctx.Err() unchanged (ctx.Err() = %v)", err, ctx.Err())
	}
}

// An operator deletes the claim while fn runs: the next renewal finds it
// gone, fn's ctx is cancelled with ErrLeaseLost and the result is not
// stored.
func TestLostClaimCancelsFn(t *testing.T) {
	t.Parallel()
	st := openStore(t, testkit.DBName(t), nil)
	ctx := context.Background()
	started := make(chan struct{})
	var cause error
	done := make(chan error, 1)
	go func() {
		_, err := idempotency.Do(ctx, st, "k", &idemOpts{Lease: idempotency.MinLease}, func(ctx context.Context) (int, error) {
			close(started)
			<-ctx.Done() // never, if the lost claim did not cancel fn
			cause = context.Cause(ctx)
			return 0, ctx.Err()
		})
		done <- err
	}()
	<-started
	if ok, err := st.Idempotency().Delete(ctx, "k"); !ok || err != nil {
		t.Fatalf("delete: %v %v", ok, err)
	}
	err := <-done
	if !errors.Is(err, idempotency.ErrLeaseLost) || !errors.Is(cause, idempotency.ErrLeaseLost) {
		t.Fatalf("Do = %v, fn's cause = %v", err, cause)
	}
	if _, found, _ := st.Idempotency().Get(ctx, "k"); found {
		t.Fatal("a lost claim's outcome was stored")
	}
}

// Renewals that keep failing: fn's ctx is done by the claim's deadline —
// its send time + lease − margin, by the clock — before the lease can
// have lapsed in the store, with the renewals' error as its cause.
func TestRenewalFailureCancelsFn(t *testing.T) {
	t.Parallel()
	f := &flaky{Store: testkit.MemoryDriver(testkit.DBName(t))}
	st := openDriver(t, f, nil)
	// A lease of a second: the first renewal is due at a third of it,
	// and has 600 ms to fail before the deadline, so that the cause names
	// its error.
	const lease = time.Second
	f.down.Store(true) // every renewal fails (the claim does not renew)
	var cause error
	_, err := idempotency.Do(context.Background(), st, "k", &idemOpts{Lease: lease}, func(ctx context.Context) (int, error) {
		// The claim was sent before fn started, so its deadline is at or
		// before start + lease − lease/20 (the margin at this lease):
		// from then on ctx's Err, which consults the clock, must report it.
		limit := time.Now().Add(lease - lease/20)
		for {
			now := time.Now()
			if ctx.Err() != nil { // asked at or after now
				break
			}
			if !now.Before(limit) {
				return 0, fmt.Errorf("fn's ctx live at %v, past the claim's deadline (at the latest %v)", now, limit)
			}
			time.Sleep(time.Millisecond)
		}
		cause = context.Cause(ctx)
		return 0, ctx.Err()
	})
	if !errors.Is(err, idempotency.ErrLeaseLost) || !errors.Is(cause, errDown) || !errors.Is(cause, idempotency.ErrLeaseLost) {
		t.Fatalf("Do = %v, cause = %v", err, cause)
	}
	f.down.Store(false)
}

// Transient renewal errors are retried: failed renewals do not lose the
// claim if one succeeds before the lease runs out.
func TestTransientRenewalErrorIsRetried(t *testing.T) {
	t.Parallel()
	f := &flaky{Store: testkit.MemoryDriver(testkit.DBName(t))}
	ops := &testkit.OpCounter{}
	st := openDriver(t, f, ops)
	const lease = 150 * time.Millisecond
	v, err := idempotency.Do(context.Background(), st, "k", &idemOpts{Lease: lease}, func(ctx context.Context) (int, error) {
		f.failures.Store(2)
		testkit.Eventually(t, 5*time.Second, "two renewals fail and one succeeds", func() bool {
			return f.failures.Load() < 0 && ops.Get("idempotency.extend") >= 3
		})
		time.Sleep(lease) // past the first lease: only the retried renewal keeps it
		return 5, context.Cause(ctx)
	})
	if v != 5 || err != nil {
		t.Fatalf("Do = %v, %v", v, err)
	}
}

func TestPanicGivesTheKeyBack(t *testing.T) {
	t.Parallel()
	st := openStore(t, testkit.DBName(t), nil)
	ctx := context.Background()
	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Errorf("recovered %v", r)
			}
		}()
		_, _ = idempotency.Do(ctx, st, "k", nil, func(context.Context) (int, error) { panic("kaboom") })
	}()
	if _, found, _ := st.Idempotency().Get(ctx, "k"); found {
		t.Fatal("a panicking call kept the key")
	}
	if v, err := idempotency.Do(ctx, st, "k", nil, func(context.Context) (int, error) { return 3, nil }); v != 3 || err != nil {
		t.Fatalf("retry: %v %v", v, err)
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	st := openStore(t, testkit.DBName(t), nil)
	ctx := context.Background()
	fn := func(context.Context) (int, error) { t.Error("fn ran"); return 0, nil }
	for _, o := range []idemOpts{
		{Lease: -time.Second},
		{Lease: time.Microsecond},
		{Retain: -1},
		{PollMin: time.Second, PollMax: time.Millisecond},
	} {
		if _, err := idempotency.Do(ctx, st, "k", &o, fn); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("options %+v: %v", o, err)
		}
	}
	if _, err := idempotency.Do(ctx, st, "", nil, fn); !errors.Is(err, warden.ErrInvalidKey) {
		t.Errorf("empty key: %v", err)
	}
	if _, err := idempotency.Do(ctx, st, "k", &idemOpts{Fingerprint: strings.Repeat("f", 600)}, fn); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("long fingerprint: %v", err)
	}
	if _, err := idempotency.Do(ctx, st, "k", &idemOpts{Owner: strings.Repeat("o", 600)}, fn); !errors.Is(err, warden.ErrInvalidKey) {
		t.Errorf("long owner: %v", err)
	}
	if _, err := idempotency.Do[int](ctx, st, "k", nil, nil); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("nil fn: %v", err)
	}
	if _, err := idempotency.Do(ctx, nil, "k", nil, fn); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("nil store: %v", err)
	}
	// PollMin alone above the default PollMax raises PollMax with it.
	if _, err := idempotency.Do(ctx, st, "ok", &idemOpts{PollMin: 2 * time.Second}, func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Errorf("PollMin only: %v", err)
	}
}

// TestMinLease: Do refuses a Lease under MinLease — lock.MinTTL, for the
// same reason — naming the minimum, before claiming anything; 10 ms, the
// former minimum, too. A claim with the minimum lease keeps itself: fn
// runs while ten renewals in a row succeed, and its result is stored.
func TestMinLease(t *testing.T) {
	t.Parallel()
	if idempotency.MinLease != lock.MinTTL {
		t.Errorf("MinLease %v, want lock.MinTTL %v: claims are renewed like leases", idempotency.MinLease, lock.MinTTL)
	}
	ops := &testkit.OpCounter{}
	st := openStore(t, testkit.DBName(t), ops)
	ctx := context.Background()
	for _, lease := range []time.Duration{time.Millisecond, 10 * time.Millisecond, idempotency.MinLease - time.Millisecond} {
		_, err := idempotency.Do(ctx, st, "k", &idemOpts{Lease: lease}, func(context.Context) (int, error) {
			t.Errorf("fn ran with Lease %v", lease)
			return 0, nil
		})
		want := fmt.Sprintf("Lease %v is under the minimum of %v", lease, idempotency.MinLease)
		if !errors.Is(err, warden.ErrInvalidArgument) || !strings.Contains(fmt.Sprint(err), want) {
			t.Errorf("Lease %v: %v, want an error matching warden.ErrInvalidArgument that says %q", lease, err, want)
		}
		if _, _, err := idempotency.Result[int](ctx, st, "k", &idemOpts{Lease: lease}); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Result with Lease %v: %v, want an error matching warden.ErrInvalidArgument", lease, err)
		}
	}
	if n := ops.Get("idempotency.claim"); n != 0 {
		t.Fatalf("refused leases made %d claims", n)
	}
	v, err := idempotency.Do(ctx, st, "k", &idemOpts{Lease: idempotency.MinLease}, func(ctx context.Context) (int, error) {
		for ops.Get("idempotency.extend") < 10 {
			if ctx.Err() != nil {
				return 0, fmt.Errorf("a claim with Lease %v was lost after %d renewals: %w", idempotency.MinLease, ops.Get("idempotency.extend"), context.Cause(ctx))
			}
			time.Sleep(time.Millisecond)
		}
		return 7, nil
	})
	if v != 7 || err != nil {
		t.Fatalf("Do with Lease %v = %v, %v", idempotency.MinLease, v, err)
	}
	if got, found, err := idempotency.Result[int](ctx, st, "k", nil); got != 7 || !found || err != nil {
		t.Fatalf("stored result %v found=%v err=%v, want 7", got, found, err)
	}
}

// textCodec stores strings as raw bytes: not JSON.
type textCodec struct{}

func (textCodec) Marshal(v any) ([]byte, error) { return []byte("<" + *v.(*string) + ">"), nil }
func (textCodec) Unmarshal(b []byte, v any) error {
	s := string(b)
	if !strings.HasPrefix(s, "<") || !strings.HasSuffix(s, ">") {
		return errors.New("not a text value")
	}
	*v.(*string) = s[1 : len(s)-1]
	return nil
}

// ptrCodec adapts textCodec to values passed by value.
type ptrCodec struct{}

func (ptrCodec) Marshal(v any) ([]byte, error) {
	s := v.(string)
	return textCodec{}.Marshal(&s)
}
func (ptrCodec) Unmarshal(b []byte, v any) error { return textCodec{}.Unmarshal(b, v) }

func TestCodecsAndBareRecords(t *testing.T) {
	t.Parallel()
	st := openStore(t, testkit.DBName(t), nil)
	ctx := context.Background()
	opts := &idemOpts{Codec: ptrCodec{}}
	if v, err := idempotency.Do(ctx, st, "k", opts, func(context.Context) (string, error) { return "héllo \"x\"", nil }); err != nil || v != "héllo \"x\"" {
		t.Fatalf("first: %q %v", v, err)
	}
	v, err := idempotency.Do(ctx, st, "k", opts, func(context.Context) (string, error) { return "other", nil })
	if err != nil || v != "héllo \"x\"" {
		t.Fatalf("duplicate with a custom codec: %q %v", v, err)
	}

	// A bare value written by an operator (or go-go-scope) is read as such.
	if err := st.Idempotency().Set(ctx, "bare", []byte(`{"id":"r-9","amount":5}`), time.Minute); err != nil {
		t.Fatal(err)
	}
	r, err := idempotency.Do(ctx, st, "bare", nil, func(context.Context) (receipt, error) {
		t.Error("fn ran for a stored bare value")
		return receipt{}, nil
	})
	if err != nil || r != (receipt{ID: "r-9", Amount: 5}) {
		t.Fatalf("bare value: %+v %v", r, err)
	}
	// An undecodable record is an error, never a zero-value success.
	if err := st.Idempotency().Set(ctx, "junk", []byte("not json"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := idempotency.Do(ctx, st, "junk", nil, func(context.Context) (receipt, error) { return receipt{}, nil }); err == nil {
		t.Fatal("an undecodable record decoded as a success")
	}
	if _, found, err := idempotency.Result[receipt](ctx, st, "absent", nil); found || err != nil {
		t.Fatalf("Result(absent) found=%v err=%v", found, err)
	}
}

// A result the store cannot hold (too large, or not encodable): fn's
// value comes back with an error matching ErrNotStored, and the key keeps
// a stored failure that says so — a retry never runs fn (a card charge)
// again.
func TestResultNotStorableKeepsKeyBlocked(t *testing.T) {
	t.Parallel()
	st := openDriver(t, memory.NewDriver(&memory.Options{MaxValueBytes: 256}), nil)
	ctx := context.Background()
	big := strings.Repeat("x", 300)
	var runs atomic.Int32
	charge := func(v string) func(context.Context) (string, error) {
		return func(context.Context) (string, error) { runs.Add(1); return v, nil }
	}
	v, err := idempotency.Do(ctx, st, "big", nil, charge(big))
	if v != big || !errors.Is(err, idempotency.ErrNotStored) || !errors.Is(err, warden.ErrValueTooLarge) {
		t.Fatalf("Do = %d bytes, %v", len(v), err)
	}
	_, err = idempotency.Do(ctx, st, "bad", &idemOpts{Codec: failingCodec{}}, charge("x"))
	if !errors.Is(err, idempotency.ErrNotStored) || !errors.Is(err, errBoom) {
		t.Fatalf("Do with a failing codec: %v", err)
	}
	for _, key := range []string{"big", "bad"} {
		for range 3 {
			_, err := idempotency.Do(ctx, st, key, nil, charge("again"))
			var se *idempotency.StoredError
			if !errors.As(err, &se) || !strings.Contains(se.Message, "fn succeeded") {
				t.Fatalf("retry of %q: %v, want a *StoredError saying fn succeeded", key, err)
			}
		}
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("fn ran %d times for two keys", n)
	}
}

// failingCodec cannot encode anything.
type failingCodec struct{}

func (failingCodec) Marshal(any) ([]byte, error) { return nil, errBoom }
func (failingCodec) Unmarshal([]byte, any) error { return errBoom }

// No goroutine outlives Do, whatever way it ends.
func TestNoGoroutineLeaks(t *testing.T) {
	base := runtime.NumGoroutine()
	st := openStore(t, testkit.DBName(t), nil)
	ctx := context.Background()
	opts := &idemOpts{Lease: idempotency.MinLease, PollMin: time.Millisecond, PollMax: 5 * time.Millisecond}
	_, _ = idempotency.Do(ctx, st, "ok", opts, func(context.Context) (int, error) { return 1, nil })
	_, _ = idempotency.Do(ctx, st, "ok", opts, func(context.Context) (int, error) { return 1, nil })
	_, _ = idempotency.Do(ctx, st, "err", opts, func(context.Context) (int, error) { return 0, errBoom })
	func() {
		defer func() { _ = recover() }()
		_, _ = idempotency.Do(ctx, st, "panic", opts, func(context.Context) (int, error) { panic("x") })
	}()
	_, _ = idempotency.Do(ctx, st, "slow", opts, func(context.Context) (int, error) { time.Sleep(opts.Lease); return 1, nil }) // renewed meanwhile
	_, _, _ = st.Idempotency().Claim(ctx, "busy", "other", time.Minute, "")
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	_, _ = idempotency.Do(cctx, st, "busy", opts, func(context.Context) (int, error) { return 1, nil })
	cancel()
	_, _ = idempotency.Do(ctx, st, "lost", opts, func(ctx context.Context) (int, error) {
		_, _ = st.Idempotency().Delete(ctx, "lost")
		<-ctx.Done() // never, if the lost claim did not cancel fn
		return 0, ctx.Err()
	})
	testkit.Eventually(t, 5*time.Second, "the goroutines end", func() bool { return runtime.NumGoroutine() <= base })
}

// sendTimes records when each claim of the wrapped store was sent.
type sendTimes struct {
	driver.Store
	mu   sync.Mutex
	sent map[string]time.Time // key → send time of the last successful claim
}

func (s *sendTimes) Idempotency() driver.Idempotency { return sendTimesIdem{s.Store.Idempotency(), s} }

type sendTimesIdem struct {
	driver.Idempotency
	s *sendTimes
}

func (i sendTimesIdem) Claim(ctx context.Context, key, owner string, lease time.Duration, fp string) (driver.IdemRecord, driver.ClaimOutcome, error) {
	sent := time.Now()
	rec, out, err := i.Idempotency.Claim(ctx, key, owner, lease, fp)
	if err == nil && (out == driver.Claimed || out == driver.TakenOver) {
		i.s.mu.Lock()
		i.s.sent[key] = sent
		i.s.mu.Unlock()
	}
	return rec, out, err
}

// Item 3 of issue 12: a claimant cut off from the store (its renewals
// fail) has fn's context done by its deadline — claim send time + lease −
// the margin of at least 5 ms, by the clock — and so strictly before a
// duplicate can take the key over and run fn.
func TestClaimDeadlineBeforeTakeover(t *testing.T) {
	t.Parallel()
	const lease = idempotency.MinLease // margin 5 ms
	db := testkit.DBName(t)
	f := &flaky{Store: testkit.MemoryDriver(db)}
	times := &sendTimes{Store: f, sent: map[string]time.Time{}}
	a := openDriver(t, times, nil)
	b := openStore(t, db, nil)
	ctx := context.Background()
	for trial := range 30 {
		key := fmt.Sprint("charge-", trial)
		f.down.Store(true) // a's renewals fail from the start
		entered := make(chan context.Context, 1)
		release := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := idempotency.Do(ctx, a, key, &idemOpts{Lease: lease}, func(ctx context.Context) (int, error) {
				entered <- ctx
				<-release
				return 1, nil
			})
			done <- err
		}()
		actx := <-entered
		times.mu.Lock()
		sent := times.sent[key]
		times.mu.Unlock()
		bound := sent.Add(lease - 5*time.Millisecond)
		// The duplicate takes over once the store lets it, and checks, the
		// moment its fn runs, that a's fn has been told.
		var live bool
		_, err := idempotency.Do(ctx, b, key, fast(idemOpts{Lease: lease, PollMin: time.Millisecond, PollMax: time.Millisecond}), func(context.Context) (int, error) {
			live = actx.Err() == nil
			return 2, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		if live {
			t.Fatalf("trial %d: a duplicate ran fn while the first claimant's fn context was live", trial)
		}
		if now.After(bound) && actx.Err() == nil {
			t.Fatalf("trial %d: fn's context live past send time + lease − 5 ms", trial)
		}
		close(release)
		if err := <-done; !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Fatalf("trial %d: the cut-off claimant's Do = %v, want ErrLeaseLost", trial, err)
		}
		f.down.Store(false)
	}
}
