package drivertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

func (s *suite) lifecycle(t *testing.T) {
	group(t, []check{
		{"Closed", s.lifeClosed},
		{"Cancelled", s.lifeCancelled},
		{"CancelMidFlight", s.lifeCancelMidFlight},
	})
}

// storeCall is one call of every kind, for the lifecycle checks.
type storeCall struct {
	name string
	call func(ctx context.Context, st *warden.Store) error
}

// everyCall makes one call of each capability and kind.
var everyCall = []storeCall{
	{"Ping", func(ctx context.Context, st *warden.Store) error { return st.Ping(ctx) }},
	{"Migrate", func(ctx context.Context, st *warden.Store) error { return st.Migrate(ctx) }},
	{"Purge", func(ctx context.Context, st *warden.Store) error { _, err := st.Purge(ctx, 0); return err }},
	{"Locks.Acquire", func(ctx context.Context, st *warden.Store) error {
		_, _, err := st.Locks().Acquire(ctx, "k", "owner", time.Minute)
		return err
	}},
	{"Locks.Get", func(ctx context.Context, st *warden.Store) error { _, _, err := st.Locks().Get(ctx, "k"); return err }},
	{"Locks.List", func(ctx context.Context, st *warden.Store) error { _, err := st.Locks().List(ctx, "*"); return err }},
	{"Locks.ForceRelease", func(ctx context.Context, st *warden.Store) error {
		_, err := st.Locks().ForceRelease(ctx, "k")
		return err
	}},
	{"Circuits.RecordFailure", func(ctx context.Context, st *warden.Store) error {
		_, err := st.Circuits().RecordFailure(ctx, "c", 3)
		return err
	}},
	{"Circuits.TryProbe", func(ctx context.Context, st *warden.Store) error {
		_, _, err := st.Circuits().TryProbe(ctx, "c", "owner", 0, time.Minute)
		return err
	}},
	{"Circuits.List", func(ctx context.Context, st *warden.Store) error { _, err := st.Circuits().List(ctx, "*"); return err }},
	{"Cache.Set", func(ctx context.Context, st *warden.Store) error { return st.Cache().Set(ctx, "k", []byte("v"), 0) }},
	{"Cache.SetIfAbsent", func(ctx context.Context, st *warden.Store) error {
		_, err := st.Cache().SetIfAbsent(ctx, "k2", []byte("v"), 0)
		return err
	}},
	{"Cache.Get", func(ctx context.Context, st *warden.Store) error { _, _, err := st.Cache().Get(ctx, "k"); return err }},
	{"Cache.Keys", func(ctx context.Context, st *warden.Store) error { _, err := st.Cache().Keys(ctx, "*"); return err }},
	{"Cache.Clear", func(ctx context.Context, st *warden.Store) error { _, err := st.Cache().Clear(ctx); return err }},
	{"Idempotency.Claim", func(ctx context.Context, st *warden.Store) error {
		_, _, err := st.Idempotency().Claim(ctx, "i", "owner", time.Minute, "")
		return err
	}},
	{"Idempotency.List", func(ctx context.Context, st *warden.Store) error {
		_, err := st.Idempotency().List(ctx, "*")
		return err
	}},
	{"Checkpoints.Save", func(ctx context.Context, st *warden.Store) error {
		_, _, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "task"})
		return err
	}},
	{"Checkpoints.List", func(ctx context.Context, st *warden.Store) error {
		_, err := st.Checkpoints().List(ctx, "task")
		return err
	}},
	{"Checkpoints.Tasks", func(ctx context.Context, st *warden.Store) error {
		_, err := st.Checkpoints().Tasks(ctx, "*")
		return err
	}},
}

// lifeClosed: every call after Close returns ErrClosed; Close is
// idempotent; closing one connection leaves the others working.
func (s *suite) lifeClosed(t *testing.T) {
	ctx := testCtx(t)
	st, prefix := s.open(t)
	other := s.openPrefix(t, prefix)
	fatalIf(t, "Set", st.Cache().Set(ctx, "written-before-close", []byte("v"), 0))
	fatalIf(t, "Close", st.Close())
	if err := st.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if !st.Closed() {
		t.Error("Closed() = false after Close")
	}
	for _, c := range everyCall {
		wantErr(t, c.name+" after Close", c.call(ctx, st), warden.ErrClosed)
	}
	if st.Locks().CanWatch() {
		_, err := st.Locks().Watch(ctx)
		wantErr(t, "Locks.Watch after Close", err, warden.ErrClosed)
	}
	if st.Circuits().CanWatch() {
		_, err := st.Circuits().Watch(ctx)
		wantErr(t, "Circuits.Watch after Close", err, warden.ErrClosed)
	}
	e, found, err := other.Cache().Get(ctx, "written-before-close")
	if err != nil || !found || string(e.Value) != "v" {
		t.Errorf("another connection after one closed: found=%v err=%v", found, err)
	}
	for _, c := range everyCall {
		errorIf(t, c.name+" on another connection after one closed", c.call(ctx, other))
	}
}

// lifeCancelled: a cancelled or expired context makes every call return
// the context's error, and nothing is written.
func (s *suite) lifeCancelled(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	expired, cancel2 := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel2()
	for _, c := range everyCall {
		wantErr(t, c.name+" with a cancelled context", c.call(cancelled, st), context.Canceled)
		wantErr(t, c.name+" with an expired context", c.call(expired, st), context.DeadlineExceeded)
	}
	if st.Locks().CanWatch() {
		_, err := st.Locks().Watch(cancelled)
		wantErr(t, "Locks.Watch with a cancelled context", err, context.Canceled)
	}
	if _, found, err := st.Cache().Get(ctx, "k"); err != nil || found {
		t.Errorf("a call with a cancelled context wrote: found=%v err=%v", found, err)
	}
	if _, found, err := st.Locks().Get(ctx, "k"); err != nil || found {
		t.Errorf("a call with a cancelled context took a lock: found=%v err=%v", found, err)
	}
	errorIf(t, "Ping after cancelled calls", st.Ping(ctx))
}

// lifeCancelMidFlight: contexts ending while calls are in flight make the
// calls return the context's error (never another error, never a panic),
// and the store keeps working afterwards.
func (s *suite) lifeCancelMidFlight(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	const workers, calls = 8, 40
	var errs errList
	parallel(workers, func(g int) {
		for i := range calls {
			c := everyCall[(g*calls+i)%len(everyCall)]
			d := time.Duration(rand.IntN(400)) * time.Microsecond
			var cctx context.Context
			var cancel context.CancelFunc
			want := context.Canceled
			if i%2 == 0 {
				cctx, cancel = context.WithCancel(ctx)
				tm := time.AfterFunc(d, cancel)
				defer tm.Stop()
			} else {
				cctx, cancel = context.WithTimeout(ctx, d)
				want = context.DeadlineExceeded
			}
			err := c.call(cctx, st)
			cancel()
			if err != nil && !errors.Is(err, want) {
				errs.add("%s whose context ended mid-flight: %v (want nil or %v)", c.name, err, want)
			}
		}
	})
	errs.report(t, "calls with contexts ending mid-flight")
	for _, c := range everyCall {
		errorIf(t, c.name+" after calls with cancelled contexts", c.call(ctx, st))
	}
	if _, ok, err := st.Locks().Acquire(ctx, fmt.Sprintf("fresh-%d", rand.Int()), "owner", time.Minute); err != nil || !ok {
		t.Errorf("Acquire after cancelled calls: ok=%v err=%v", ok, err)
	}
}
