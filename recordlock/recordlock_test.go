package recordlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/recordlock"
	"github.com/warden-go/warden/store/memory"
)

func newTable(n int) *memory.RecordTable {
	t := memory.NewRecordTable("jobs")
	for i := 1; i <= n; i++ {
		t.Insert(fmt.Sprintf("job-%d", i), map[string]any{"status": "todo"})
	}
	return t
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newLocker[F any](t *testing.T, d driver.Records[F], opts *recordlock.Options) *recordlock.Locker[F] {
	t.Helper()
	l, err := recordlock.New(d, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// hooked wraps a RecordTable, letting a test act before or after each
// driver call.
type hooked struct {
	*memory.RecordTable
	extendErr  atomic.Pointer[error] // returned by Extend after applying it
	extendHold chan struct{}         // if non-nil, Extend waits for it before answering
	lockDelay  time.Duration         // Lock answers this late
	extends    atomic.Int64
	gets       atomic.Int64
}

func (h *hooked) Lock(ctx context.Context, id any, owner string, d time.Duration) (driver.RecordLock, bool, bool, error) {
	rec, found, ok, err := h.RecordTable.Lock(ctx, id, owner, d)
	if h.lockDelay > 0 {
		time.Sleep(h.lockDelay) // the answer travels slowly
	}
	return rec, found, ok, err
}

func (h *hooked) Extend(ctx context.Context, id any, owner string, token int64, d time.Duration) (driver.RecordLock, bool, bool, error) {
	h.extends.Add(1)
	rec, found, ok, err := h.RecordTable.Extend(ctx, id, owner, token, d)
	if h.extendHold != nil {
		select {
		case <-h.extendHold:
		case <-ctx.Done():
			return driver.RecordLock{}, false, false, ctx.Err()
		}
	}
	if e := h.extendErr.Load(); e != nil {
		return driver.RecordLock{}, false, false, *e
	}
	return rec, found, ok, err
}

func (h *hooked) Get(ctx context.Context, id any) (driver.RecordLock, bool, error) {
	h.gets.Add(1)
	return h.RecordTable.Get(ctx, id)
}

func TestNewRefusesBadOptions(t *testing.T) {
	if _, err := recordlock.New[memory.RecordFilter](nil, nil); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("nil driver: %v", err)
	}
	if _, err := recordlock.New(newTable(1), &recordlock.Options{ClockSkew: -1}); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("negative ClockSkew: %v", err)
	}
	if _, err := recordlock.New(newTable(1), &recordlock.Options{Owner: "a\x00b"}); !errors.Is(err, warden.ErrInvalidKey) {
		t.Errorf("owner with NUL: %v", err)
	}
}

func TestBadArguments(t *testing.T) {
	l := newLocker(t, newTable(1), nil)
	ctx := ctxT(t)
	for _, d := range []time.Duration{-time.Second, 0, time.Millisecond, recordlock.MinDuration - time.Millisecond} {
		if _, err := l.Lock(ctx, "job-1", d); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Lock for %v: %v, want ErrInvalidArgument", d, err)
		}
		if _, err := l.Claim(ctx, memory.RecordFilter{}, d); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Claim for %v: %v, want ErrInvalidArgument", d, err)
		}
	}
	//lint:ignore SA1012 a nil context is what is tested
	if _, err := l.Lock(nil, "job-1", time.Second); !errors.Is(err, warden.ErrInvalidArgument) { //nolint:staticcheck
		t.Errorf("nil ctx: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Lock(cctx, "job-1", time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled ctx: %v", err)
	}
	k, err := l.Lock(ctx, "job-1", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Extend(ctx, time.Millisecond); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Extend by 1ms: %v", err)
	}
}

func TestAutoExtendKeepsTheLock(t *testing.T) {
	tbl := &hooked{RecordTable: newTable(1)}
	l := newLocker(t, tbl, nil)
	ctx := ctxT(t)
	k, err := l.Lock(ctx, "job-1", recordlock.MinDuration)
	if err != nil {
		t.Fatal(err)
	}
	first := k.Deadline()
	// Wait for five extensions; each moves the deadline.
	for tbl.extends.Load() < 5 {
		select {
		case <-k.Done():
			t.Fatalf("an auto-extended lock ended: %v", context.Cause(k.Context()))
		case <-time.After(10 * time.Millisecond):
		}
	}
	if k.Err() != nil || !k.Deadline().After(first) {
		t.Errorf("after 5 extensions: err %v, deadline %v (first %v)", k.Err(), k.Deadline(), first)
	}
	if err := k.Release(ctx); err != nil {
		t.Fatal(err)
	}
	n := tbl.extends.Load()
	time.Sleep(3 * recordlock.MinDuration) // would-be extension rounds
	if tbl.extends.Load() != n {
		t.Errorf("extensions went on after Release: %d then %d", n, tbl.extends.Load())
	}
}

func TestNoAutoExtendEndsAtTheDeadline(t *testing.T) {
	tbl := &hooked{RecordTable: newTable(1)}
	l := newLocker(t, tbl, &recordlock.Options{NoAutoExtend: true})
	ctx := ctxT(t)
	k, err := l.Lock(ctx, "job-1", recordlock.MinDuration)
	if err != nil {
		t.Fatal(err)
	}
	<-k.Done()
	if now := time.Now(); now.Before(k.Deadline()) {
		t.Errorf("context done at %v, before its deadline %v", now, k.Deadline())
	}
	if !errors.Is(k.Err(), recordlock.ErrLeaseLost) || tbl.extends.Load() != 0 {
		t.Errorf("Err %v, extensions %d; want ErrLeaseLost, 0", k.Err(), tbl.extends.Load())
	}
	if err := k.Release(ctx); !errors.Is(err, recordlock.ErrNotHeld) || !errors.Is(err, recordlock.ErrLeaseLost) {
		t.Errorf("Release after the deadline: %v, want ErrNotHeld and ErrLeaseLost", err)
	}
	if rec, _, _ := tbl.Get(ctx, "job-1"); rec.Owner != "" {
		t.Errorf("the lapsed holding was not cleared by Release: %+v", rec)
	}
}

// An extension that applied but whose answer was lost is credited by
// reading the record back — to its send time, never later.
func TestExtendSettledByReadBack(t *testing.T) {
	tbl := &hooked{RecordTable: newTable(1)}
	l := newLocker(t, tbl, &recordlock.Options{NoAutoExtend: true, ClockSkew: 10 * time.Millisecond})
	ctx := ctxT(t)
	k, err := l.Lock(ctx, "job-1", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	lost := errors.New("connection reset")
	tbl.extendErr.Store(&lost)
	before := time.Now()
	if err := k.Extend(ctx, 5*time.Second); err != nil {
		t.Fatalf("Extend whose answer was lost but which applied: %v; the read-back shows it applied", err)
	}
	after := time.Now()
	if tbl.gets.Load() != 1 {
		t.Errorf("%d reads back, want 1", tbl.gets.Load())
	}
	if dl := k.Deadline(); dl.Before(before.Add(5*time.Second-10*time.Millisecond)) || dl.After(after.Add(5*time.Second-10*time.Millisecond)) {
		t.Errorf("deadline %v, want the send time plus 5s less the margin", dl)
	}
	// Not ours any more: the read-back shows the loss.
	if _, _, err := tbl.ForceRelease(ctx, "job-1"); err != nil {
		t.Fatal(err)
	}
	if err := k.Extend(ctx, 5*time.Second); !errors.Is(err, recordlock.ErrLeaseLost) {
		t.Errorf("Extend failing on a force-released record: %v, want ErrLeaseLost", err)
	}
}

// A hung extension cannot keep the context alive past the deadline.
func TestHungExtendEndsAtTheDeadline(t *testing.T) {
	tbl := &hooked{RecordTable: newTable(1), extendHold: make(chan struct{})}
	defer close(tbl.extendHold)
	l := newLocker(t, tbl, nil)
	ctx := ctxT(t)
	k, err := l.Lock(ctx, "job-1", recordlock.MinDuration)
	if err != nil {
		t.Fatal(err)
	}
	<-k.Done()
	if now := time.Now(); now.Before(k.Deadline()) {
		t.Errorf("done at %v before the deadline %v", now, k.Deadline())
	}
	if !errors.Is(k.Err(), recordlock.ErrLeaseLost) {
		t.Errorf("Err %v, want ErrLeaseLost", k.Err())
	}
}

// A lock granted after its deadline is given back, not handed out.
func TestLateGrantGivenBack(t *testing.T) {
	tbl := &hooked{RecordTable: newTable(1), lockDelay: recordlock.MinDuration}
	l := newLocker(t, tbl, nil)
	ctx := ctxT(t)
	_, err := l.Lock(ctx, "job-1", recordlock.MinDuration)
	if !errors.Is(err, warden.ErrStoreTooSlow) {
		t.Fatalf("Lock answered after its deadline: %v, want ErrStoreTooSlow", err)
	}
	if rec, _, _ := tbl.Get(ctx, "job-1"); rec.Owner != "" {
		t.Errorf("the late holding was not given back: %+v", rec)
	}
}

func TestCloseReleasesAndRefuses(t *testing.T) {
	tbl := newTable(3)
	l, err := recordlock.New(tbl, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	var ks []*recordlock.Lock
	for i := 1; i <= 3; i++ {
		k, err := l.Lock(ctx, fmt.Sprintf("job-%d", i), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		ks = append(ks, k)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, k := range ks {
		if !errors.Is(context.Cause(k.Context()), recordlock.ErrReleased) {
			t.Errorf("lock %v after Close: %v", k.ID(), context.Cause(k.Context()))
		}
	}
	if live, _ := tbl.List(ctx, 10); len(live) != 0 {
		t.Errorf("Close left %d records locked", len(live))
	}
	if _, err := l.Lock(ctx, "job-1", time.Minute); !errors.Is(err, recordlock.ErrClosed) {
		t.Errorf("Lock after Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// Many goroutines of many Lockers: never two holders, tokens in order.
func TestConcurrentLockers(t *testing.T) {
	tbl := newTable(1)
	ctx := ctxT(t)
	var inside, overlaps atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		l := newLocker(t, tbl, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done := 0; done < 20; {
				k, err := l.Lock(ctx, "job-1", time.Second)
				if errors.Is(err, recordlock.ErrLocked) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				inside.Add(-1)
				done++
				if err := k.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if overlaps.Load() != 0 {
		t.Errorf("%d overlaps", overlaps.Load())
	}
	rec, _, _ := tbl.Get(ctx, "job-1")
	if rec.Token != 160 {
		t.Errorf("token after 160 holdings: %d", rec.Token)
	}
}
