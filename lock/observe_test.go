package lock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warden-go/warden/internal/testkit"
)

// observations collects what a Locker reports to Options.Observe; next
// blocks until the next one arrives (go test's -timeout reports one that
// never does).
type observations chan Observation

func (c observations) observe(_ context.Context, o Observation) { c <- o }

func (c observations) next(t *testing.T, want ObservationKind) Observation {
	t.Helper()
	o := <-c
	if o.Kind != want {
		t.Fatalf("observed %q (%+v), want %q", o.Kind, o, want)
	}
	return o
}

func (c observations) none(t *testing.T) {
	t.Helper()
	select {
	case o := <-c:
		t.Fatalf("unexpected observation %+v", o)
	default:
	}
}

// An uncontended cycle is observed as an acquire, a refresh and a
// release with the lease's key, owner and token.
func TestObserveUncontendedCycle(t *testing.T) {
	ctx := context.Background()
	obs := make(observations, 16)
	l := openEnv(t, testkit.DBName(t), nil).locker(t, &Options{DisableAutoRefresh: true, Observe: obs.observe})
	before := time.Now()
	s, err := l.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	a := obs.next(t, ObservedAcquire)
	if a.Key != "job" || a.Owner != l.Owner() || a.Token != s.Token() || a.Err != nil || a.Contended || a.Holder != "" || a.HandOff != 0 {
		t.Fatalf("acquire observed as %+v", a)
	}
	if a.Start.Before(before) || a.Waited < 0 || a.Waited > time.Since(before) {
		t.Fatalf("acquire started %v, waited %v; the call began at %v", a.Start, a.Waited, before)
	}
	if err := s.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	r := obs.next(t, ObservedRefresh)
	if r.Key != "job" || r.Token != s.Token() || r.Err != nil || r.Duration < 0 {
		t.Fatalf("refresh observed as %+v", r)
	}
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rel := obs.next(t, ObservedRelease)
	if rel.Key != "job" || rel.Token != s.Token() || rel.Err != nil || rel.Held < 0 || rel.Held > time.Since(before) {
		t.Fatalf("release observed as %+v", rel)
	}
	// Releasing again is no release: nothing more is observed.
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	obs.none(t)
}

// A waiter of the same Locker is observed as contended, with the Locker
// itself as the holder it saw and the hand-off time from the release to
// its lease; TryAcquire of another Locker names the holder it found.
func TestObserveContention(t *testing.T) {
	ctx := context.Background()
	db := testkit.DBName(t)
	obs := make(observations, 16)
	l := openEnv(t, db, nil).locker(t, &Options{DisableAutoRefresh: true, Observe: obs.observe})
	first, err := l.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	obs.next(t, ObservedAcquire)
	got := make(chan *Lease, 1)
	go func() {
		s, err := l.Acquire(ctx, "job")
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	testkit.Eventually(t, 5*time.Second, "the second Acquire to queue", func() bool { return queueLen(l, "job") == 1 })
	released := time.Now()
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := <-got
	// The release wakes the waiter before it is reported: the two come in
	// either order.
	byKind := map[ObservationKind]Observation{}
	for range 2 {
		o := <-obs
		byKind[o.Kind] = o
	}
	if rel := byKind[ObservedRelease]; rel.Token != first.Token() || rel.Err != nil {
		t.Fatalf("release observed as %+v", rel)
	}
	a := byKind[ObservedAcquire]
	if a.Token != second.Token() || a.Err != nil || !a.Contended || a.Holder != l.Owner() {
		t.Fatalf("the waiter's acquire observed as %+v", a)
	}
	if a.HandOff <= 0 || a.HandOff > time.Since(released) || a.HandOff > a.Waited {
		t.Fatalf("hand-off %v (waited %v, released %v ago)", a.HandOff, a.Waited, time.Since(released))
	}

	other := make(observations, 16)
	l2 := openEnv(t, db, nil).locker(t, &Options{Observe: other.observe})
	if _, err := l2.TryAcquire(ctx, "job"); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryAcquire of a held key: %v", err)
	}
	b := other.next(t, ObservedAcquire)
	if !errors.Is(b.Err, ErrLocked) || !b.Contended || b.Holder != l.Owner() || b.Token != 0 || b.Owner != l2.Owner() || b.HandOff != 0 {
		t.Fatalf("TryAcquire of a held key observed as %+v", b)
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	obs.next(t, ObservedRelease)
}

// A lease whose holding was force-released is lost by refusal when its
// next refresh finds out; one nobody refreshes is lost by expiry.
func TestObserveLoss(t *testing.T) {
	ctx := context.Background()
	e := openEnv(t, testkit.DBName(t), nil)
	obs := make(observations, 16)
	l := e.locker(t, &Options{DisableAutoRefresh: true, Observe: obs.observe})
	s, err := l.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	obs.next(t, ObservedAcquire)
	if ok, err := e.st.Locks().ForceRelease(ctx, "job"); err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v", ok, err)
	}
	if err := s.Refresh(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Refresh after a force-release: %v", err)
	}
	loss := obs.next(t, ObservedLoss)
	if loss.Cause != LostRefused || !errors.Is(loss.Err, ErrLeaseLost) || loss.Token != s.Token() || loss.Key != "job" {
		t.Fatalf("loss observed as %+v", loss)
	}
	if r := obs.next(t, ObservedRefresh); !errors.Is(r.Err, ErrLeaseLost) {
		t.Fatalf("the refused refresh observed as %+v", r)
	}
	if err := s.Release(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Release of a lost lease: %v", err)
	}
	obs.none(t) // a lost lease is not released again

	short := e.locker(t, &Options{TTL: MinTTL, DisableAutoRefresh: true, Observe: obs.observe})
	s2, err := short.Acquire(ctx, "brief")
	if err != nil {
		t.Fatal(err)
	}
	obs.next(t, ObservedAcquire)
	if err := waitDone(s2); err != ErrLeaseLost {
		t.Fatalf("an unrefreshed lease ended with %v", err)
	}
	if loss := obs.next(t, ObservedLoss); loss.Cause != LostExpired || loss.Token != s2.Token() || loss.Held <= 0 {
		t.Fatalf("loss at the deadline observed as %+v", loss)
	}
}
