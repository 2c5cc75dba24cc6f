package breaker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/internal/testkit"
)

// A store whose writes hang while its reads answer is down: the first
// failure write that outlasts the budget makes it so (StoreDown, with
// ErrStoreTimeout), the failure counts on the local view at once, and the
// reads that follow neither bring the store back nor erase the failures
// counted locally. Failing closed, fn runs once; failing open, it runs
// until the local view reaches Threshold. Once the write lands, the
// store's record is the truth again.
func TestHungWritesAreAStoreFailure(t *testing.T) {
	t.Parallel()
	for _, failClosed := range []bool{false, true} {
		t.Run(map[bool]string{false: "fail-open", true: "fail-closed"}[failClosed], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testkit.DBName(t)
			h := newHung(db, "failure")
			st := testkit.Open(t, h, &warden.Options{Logger: quiet})
			b := newBreaker(t, st, "api", &breaker.Options{Threshold: 3, OpenFor: time.Hour, FailClosed: failClosed,
				SyncInterval: time.Millisecond, // (nearly) every call reads the record
				StoreTimeout: 20 * time.Millisecond})
			if err := b.Do(ctx, succeed); err != nil { // reads the record
				t.Fatal(err)
			}
			ran := 0
			want := 3
			if failClosed {
				want = 1
			}
			for i := range 6 {
				err := b.Do(ctx, func(context.Context) error { ran++; return errBoom })
				switch {
				case i < want && !errors.Is(err, errBoom):
					t.Fatalf("call %d: %v, want fn's error", i, err)
				case i >= want && !errors.Is(err, breaker.ErrOpen):
					t.Fatalf("call %d: %v, want a rejection", i, err)
				case i >= want && failClosed && !errors.Is(err, breaker.ErrStoreTimeout):
					t.Fatalf("call %d: %v, want a rejection for the store's timeout", i, err)
				}
			}
			if ran != want {
				t.Fatalf("fn ran %d times, want %d (Threshold 3, writes hung, FailClosed %v)", ran, want, failClosed)
			}
			s := b.Stats()
			if !s.StoreDown || s.StoreErrors == 0 || !errors.Is(s.LastStoreError, breaker.ErrStoreTimeout) || s.Failures != int64(want) {
				t.Fatalf("stats while writes hang: %+v", s)
			}
			if !failClosed && s.State != breaker.Open {
				t.Fatalf("failing open, the local view is %s after %d failures, want open", s.State, want)
			}
			close(h.release) // the store answers again; the late write lands
			if err := b.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if rec := record(t, openStore(t, db, nil), "api"); rec.Failures != 1 {
				t.Fatalf("the store has %d failures, want 1 (the write in flight)", rec.Failures)
			}
			if s := b.Stats(); s.StoreDown || s.Failures != 1 || s.State != breaker.Closed {
				t.Fatalf("stats after the late write landed: %+v", s)
			}
		})
	}
}

// A success that follows a failure whose write is still in flight is
// written after it, so the store's consecutive failures reset as the
// calls' order says: failure, success, failure leaves a Threshold-2
// circuit closed with one consecutive failure (as gobreaker would).
func TestSuccessAfterPendingFailureIsWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.DBName(t)
	h := newHung(db, "failure")
	st := testkit.Open(t, h, &warden.Options{Logger: quiet})
	b := newBreaker(t, st, "api", &breaker.Options{Threshold: 2, OpenFor: time.Hour,
		SyncInterval: time.Hour, StoreTimeout: 20 * time.Millisecond})
	if err := b.Do(ctx, succeed); err != nil { // reads the record
		t.Fatal(err)
	}
	if err := b.Do(ctx, fail); !errors.Is(err, errBoom) { // its write hangs
		t.Fatal(err)
	}
	if err := b.Do(ctx, succeed); err != nil {
		t.Fatal(err)
	}
	close(h.release) // the store answers: the failure lands, then the success
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	check := testkit.Open(t, testkit.MemoryDriver(db), &warden.Options{Logger: quiet})
	if rec := record(t, check, "api"); rec.State != breaker.Closed || rec.Failures != 0 {
		t.Fatalf("after failure, success: %s with %d consecutive failures, want closed with 0 (the success was not written after the failure)", rec.State, rec.Failures)
	}
	if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if rec := record(t, check, "api"); rec.State != breaker.Closed || rec.Failures != 1 {
		t.Fatalf("after failure, success, failure with Threshold 2: %s with %d consecutive failures, want closed with 1", rec.State, rec.Failures)
	}
	if s := b.Stats(); s.StoreDown || s.State != breaker.Closed || s.Failures != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// More outcome writes than run at once (64) are queued, not dropped, and
// reach the store in order: 100 failures, a success and 50 failures,
// issued while the store holds every failure write, leave the circuit
// with 150 failures of which 50 consecutive, and no store error.
func TestWritesBeyondTheInFlightLimitAreQueued(t *testing.T) {
	t.Parallel()
	db := testkit.DBName(t)
	h := newHung(db, "failure")
	st := testkit.Open(t, h, &warden.Options{Logger: quiet})
	b := newBreaker(t, st, "api", &breaker.Options{Threshold: 1000, OpenFor: time.Hour, SyncInterval: time.Hour})
	if err := b.Do(context.Background(), succeed); err != nil { // reads the record
		t.Fatal(err)
	}
	// Each caller gives up as fn returns, so it does not wait for its
	// write: the writes pile up while the store holds them.
	call := func(err error) {
		ctx, cancel := context.WithCancel(context.Background())
		if got := b.Do(ctx, func(context.Context) error { cancel(); return err }); got != err {
			t.Fatalf("Do = %v, want %v", got, err)
		}
	}
	for range 100 {
		call(errBoom)
	}
	call(nil)
	for range 50 {
		call(errBoom)
	}
	close(h.release)
	if err := b.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec := record(t, openStore(t, db, nil), "api")
	if rec.State != breaker.Closed || rec.TotalFailures != 150 || rec.Failures != 50 {
		t.Fatalf("store after 100 failures, a success, 50 failures: %s, %d failures, %d consecutive; want closed, 150, 50", rec.State, rec.TotalFailures, rec.Failures)
	}
	if s := b.Stats(); s.StoreErrors != 0 || s.StoreDown || s.Failures != 50 || s.State != breaker.Closed {
		t.Fatalf("stats %+v", s)
	}
}
