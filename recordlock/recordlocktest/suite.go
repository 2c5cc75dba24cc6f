package recordlocktest

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/recordlock"
)

// Run runs the suite against the store h reaches. Each check uses tables
// of its own, dropped when it ends. The multi-process checks re-execute
// the test binary: its TestMain must call Child(h) first.
func Run[F any](t *testing.T, h Harness[F]) {
	t.Helper()
	for _, f := range []struct {
		name string
		fn   func(*testing.T, Harness[F])
	}{
		{"LockCycle", lockCycle[F]},
		{"NotFoundCreatesNothing", notFound[F]},
		{"UserFieldsUntouched", userFields[F]},
		{"HostileIDs", hostileIDs[F]},
		{"HostileFilter", hostileFilter[F]},
		{"ExpiredClaimableAtOnce", expiredClaimable[F]},
		{"TokensIncrease", tokensIncrease[F]},
		{"ForceReleaseEndsTheHolding", forceRelease[F]},
		{"DeadlineFromSendTime", deadlineRule[F]},
		{"ExtendNeverShortens", extendNeverShortens[F]},
		{"ClaimOrder", claimOrder[F]},
		{"Exclusion", exclusion[F]},
		{"ClaimEachOnce", claimEachOnce[F]},
		{"MultiProcess/Exclusion", mpExclusion[F]},
		{"MultiProcess/ExpiryHandover", mpExpiry[F]},
		{"MultiProcess/ClaimEachOnce", mpClaim[F]},
	} {
		t.Run(f.name, func(t *testing.T) { f.fn(t, h) })
	}
}

// table creates a table for one check and returns its name and a Locker
// over it (closed, with the table dropped, when the check ends).
func table[F any](t *testing.T, h Harness[F], rows []Row, opts *recordlock.Options) (string, *recordlock.Locker[F], driver.Records[F]) {
	t.Helper()
	ctx := testCtx(t, h)
	var b [4]byte
	_, _ = crand.Read(b[:])
	name := "rl_" + strings.ToLower(strings.NewReplacer("/", "_").Replace(t.Name()))
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	name = "rl_" + hex.EncodeToString(b[:]) + "_" + strings.TrimLeft(name, "_")
	name = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, name)
	if err := h.Create(ctx, name, rows); err != nil {
		t.Fatalf("create table %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := h.Drop(context.Background(), name); err != nil {
			t.Errorf("drop table %s: %v", name, err)
		}
	})
	d, l := open(t, h, name, opts)
	return name, l, d
}

// open returns a new driver and Locker over table.
func open[F any](t *testing.T, h Harness[F], name string, opts *recordlock.Options) (driver.Records[F], *recordlock.Locker[F]) {
	t.Helper()
	d, closeFn, err := h.Open(testCtx(t, h), name)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	l, err := recordlock.New(d, opts)
	if err != nil {
		closeFn()
		t.Fatalf("recordlock.New: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("close locker: %v", err)
		}
		closeFn()
	})
	return d, l
}

func rows(n int, status string) []Row {
	out := make([]Row, n)
	for i := range out {
		out[i] = Row{N: i + 1, Status: status, Rank: n - i, Note: fmt.Sprintf("note %d", i+1)}
	}
	return out
}

func testCtx[F any](t *testing.T, h Harness[F]) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), h.timeout())
	t.Cleanup(cancel)
	return ctx
}

const long = time.Minute

func lockCycle[F any](t *testing.T, h Harness[F]) {
	ctx := testCtx(t, h)
	name, a, d := table(t, h, rows(3, "todo"), &recordlock.Options{Owner: "a"})
	_, b := open(t, h, name, &recordlock.Options{Owner: "b"})
	id := h.ID(2)

	k, err := a.Lock(ctx, id, long)
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	if k.Token() < 1 || k.Err() != nil || !strings.HasPrefix(k.Owner(), a.Owner()+".") {
		t.Fatalf("lock: token %d, err %v, owner %q (want ≥ 1, nil, %q.N)", k.Token(), k.Err(), k.Owner(), a.Owner())
	}
	st, err := b.Locked(ctx, id)
	if err != nil || !st.Locked || st.Owner != k.Owner() || st.Token != k.Token() || !st.Until.Equal(k.Until()) {
		t.Fatalf("Locked = %+v, %v; want locked by %q with token %d until %v", st, err, k.Owner(), k.Token(), k.Until())
	}
	_, err = b.Lock(ctx, id, long)
	var le *recordlock.LockedError
	if !errors.As(err, &le) || !errors.Is(err, recordlock.ErrLocked) || le.Owner != k.Owner() || !le.Until.Equal(k.Until()) {
		t.Fatalf("second Lock: %v; want a LockedError naming %q until %v", err, k.Owner(), k.Until())
	}
	if _, err := b.Claim(ctx, h.ByStatus("todo"), long); err != nil {
		t.Fatalf("Claim beside a lock: %v", err)
	}

	prev := k.Until()
	if err := k.Extend(ctx, 2*long); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if !k.Until().After(prev) {
		t.Errorf("Extend by %v did not move the expiry: %v then %v", 2*long, prev, k.Until())
	}
	rec, _, err := d.Get(ctx, id)
	if err != nil || !rec.Until.Equal(k.Until()) || rec.Until.Sub(rec.Now) <= long {
		t.Errorf("after Extend the record says %+v (%v); want until %v, more than %v after its clock", rec, err, k.Until(), long)
	}
	if err := k.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if !errors.Is(context.Cause(k.Context()), recordlock.ErrReleased) {
		t.Errorf("released lock's context cause: %v", context.Cause(k.Context()))
	}
	if err := k.Release(ctx); err != nil {
		t.Errorf("second Release: %v", err)
	}
	st, err = b.Locked(ctx, id)
	if err != nil || st.Locked || st.Owner != "" || st.Token != k.Token() {
		t.Fatalf("after Release, Locked = %+v, %v; want unlocked, token %d kept", st, err, k.Token())
	}
	k2, err := b.Lock(ctx, id, long)
	if err != nil {
		t.Fatalf("Lock after Release: %v", err)
	}
	if k2.Token() != k.Token()+1 {
		t.Errorf("token after release: %d, want %d", k2.Token(), k.Token()+1)
	}
	live, err := d.List(ctx, 10)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(live) != 2 {
		t.Errorf("List: %d live locks, want 2 (the claimed record and %v)", len(live), id)
	}
	for _, r := range live {
		if !strings.HasPrefix(r.Owner, b.Owner()+".") || !r.Live() {
			t.Errorf("List: %+v, want live locks of %q", r, b.Owner())
		}
	}
}

func notFound[F any](t *testing.T, h Harness[F]) {
	ctx := testCtx(t, h)
	name, l, _ := table(t, h, rows(3, "todo"), nil)
	missing := h.ID(999)
	if _, err := l.Lock(ctx, missing, long); !errors.Is(err, recordlock.ErrNotFound) {
		t.Fatalf("Lock of a missing record: %v, want ErrNotFound", err)
	}
	if _, err := l.Locked(ctx, missing); !errors.Is(err, recordlock.ErrNotFound) {
		t.Errorf("Locked of a missing record: %v, want ErrNotFound", err)
	}
	if _, found, err := h.Read(ctx, name, missing); err != nil || found {
		t.Errorf("after Lock of a missing record it exists (%v, %v): recordlock must never create records", found, err)
	}
	if n, err := h.Count(ctx, name); err != nil || n != 3 {
		t.Errorf("count after Lock of a missing record: %d, %v; want 3", n, err)
	}
	if _, err := l.Claim(ctx, h.ByStatus("nope"), long); !errors.Is(err, recordlock.ErrNothingToClaim) {
		t.Errorf("Claim with nothing matching: %v, want ErrNothingToClaim", err)
	}
	if n, err := h.Count(ctx, name); err != nil || n != 3 {
		t.Errorf("count after an empty Claim: %d, %v; want 3", n, err)
	}
}

func userFields[F any](t *testing.T, h Harness[F]) {
	ctx := testCtx(t, h)
	in := rows(4, "todo")
	name, l, _ := table(t, h, in, &recordlock.Options{NoAutoExtend: true})
	id := h.ID(1)
	k, err := l.Lock(ctx, id, long)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.SetNote(ctx, name, id, "edited while locked"); err != nil {
		t.Fatal(err)
	}
	if err := k.Extend(ctx, long); err != nil {
		t.Fatal(err)
	}
	c, err := l.Claim(ctx, h.ByStatus("todo"), long)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range in {
		want := r
		if r.N == 1 {
			want.Note = "edited while locked"
		}
		got, found, err := h.Read(ctx, name, h.ID(r.N))
		got.N = r.N
		if err != nil || !found || got != want {
			t.Errorf("record %v after lock, extend, claim and release: %+v (found %v, %v); want %+v", h.ID(r.N), got, found, err, want)
		}
	}
}

func hostileIDs[F any](t *testing.T, h Harness[F]) {
	ctx := testCtx(t, h)
	_, l, d := table(t, h, rows(3, "todo"), nil)
	for _, id := range h.HostileIDs {
		k, err := l.Lock(ctx, id, long)
		if err == nil {
			t.Errorf("Lock(%#v) locked record %v: a hostile id must not match another record", id, k.ID())
			continue
		}
		if !errors.Is(err, recordlock.ErrNotFound) && !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Lock(%#v): %v; want ErrNotFound or ErrInvalidArgument", id, err)
		}
		if len(fmt.Sprint(err)) > 400 {
			t.Errorf("Lock(%#v): error of %d bytes: ids must be cut short in messages", id, len(err.Error()))
		}
	}
	for _, id := range []any{nil, "", strings.Repeat("x", 100_000)} {
		if _, err := l.Lock(ctx, id, long); !errors.Is(err, warden.ErrInvalidArgument) && !errors.Is(err, recordlock.ErrNotFound) {
			t.Errorf("Lock(%.20q…): %v; want ErrInvalidArgument", fmt.Sprint(id), err)
		} else if len(err.Error()) > 400 {
			t.Errorf("Lock of a huge id: error of %d bytes, want it cut short", len(err.Error()))
		}
	}
	if live, err := d.List(ctx, 10); err != nil || len(live) != 0 {
		t.Errorf("after hostile ids, live locks: %+v (%v); want none", live, err)
	}
}

func hostileFilter[F any](t *testing.T, h Harness[F]) {
	ctx := testCtx(t, h)
	_, l, d := table(t, h, rows(3, "todo"), nil)
	for _, v := range []string{"x' OR '1'='1", "todo' OR 'a'='a", "%", "*", ".*", "todo%", `{"$ne": ""}`, "todo\x00", "' OR 1=1 --"} {
		if k, err := l.Claim(ctx, h.ByStatus(v), long); !errors.Is(err, recordlock.ErrNothingToClaim) {
			if err == nil {
				t.Errorf("Claim(status = %q) claimed %v: a filter value widened the match", v, k.ID())
			} else if !errors.Is(err, warden.ErrInvalidArgument) {
				t.Errorf("Claim(status = %q): %v; want ErrNothingToClaim", v, err)
			}
		}
	}
	if live, err := d.List(ctx, 10); err != nil || len(live) != 0 {
		t.Errorf("after hostile filters, live locks: %+v (%v); want none", live, err)
	}
}

// waitExpired waits until the store's clock says record id's holding has
// expired.
func waitExpired[F any](t *testing.T, ctx context.Context, d driver.Records[F], id any) driver.RecordLock {
	t.Helper()
	for {
		rec, found, err := d.Get(ctx, id)
		if err != nil || !found {
			t.Fatalf("Get: %v, found %v", err, found)
		}
		if !rec.Live() {
			return rec
		}
		select {
		case <-ctx.Done():
			t.Fatal("the holding never expired on the store's clock")
		case <-time.After(min(rec.Until.Sub(rec.Now), 50*time.Millisecond) + time.Millisecond):
		}
	}
}

func expiredClaimable[F any](t *testing.T, h Harness[F]) {
	ctx := testCtx(t, h)
	in := rows(3, "done")
	in[1].Status = "todo"
	name, a, d := table(t, h, in, &recordlock.Options{NoAutoExtend: true})
	_, b := open(t, h, name, nil)
	id := h.ID(2)
	k, err := a.Lock(ctx, id, recordlock.MinDuration)
	if err != nil {
		t.Fatal(err)
	}
	<-k.Done() // the holder learns first …
	if !errors.Is(context.Cause(k.Context()), recordlock.ErrLeaseLost) {
		t.Errorf("lapsed lock's cause: %v, want ErrLeaseLost", context.Cause(k.Context()))
	}
	waitExpired(t, ctx, d, id) // … then the store lets others in
	c, err := b.Claim(ctx, h.ByStatus("todo"), long)
	if err != nil {
		t.Fatalf("Claim of an expired lock's record: %v; it must be claimable at once", err)
	}
	if !sameID(c.ID(), id) || c.Token() != k.Token()+1 {
		t.Errorf("claimed %v with token %d; want %v with token %d", c.ID(), c.Token(), id, k.Token()+1)
	}
	if err := k.Release(ctx); !errors.Is(err, recordlock.ErrNotHeld) {
		t.Errorf("Release of the lapsed lock: %v, want ErrNotHeld", err)
	}
	if st, err := b.Locked(ctx, id); err != nil || !st.Locked || st.Owner != c.Owner() {
		t.Errorf("the lapsed holder's Release touched the new holding: %+v, %v", st, err)
	}
	// The same through Lock.
	k3, err := a.Lock(ctx, h.ID(3), recordlock.MinDuration)
	if err != nil {
		t.Fatal(err)
	}
	waitExpired(t, ctx, d, h.ID(3))
	if _, err := b.Lock(ctx, h.ID(3), long); err != nil {
		t.Errorf("Lock of an expired record: %v", err)
	}
	_ = k3
}

func sameID(a, b any) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

func tokensIncrease[F any](t *testing.T, h Harness[F]) {
	ctx := testCtx(t, h)
	name, a, _ := table(t, h, rows(2, "todo"), nil)
	_, b := open(t, h, name, nil)
	var prev int64
	for i := range 20 {
		l := a
		if i%2 == 1 {
			l = b
		}
		var k *recordlock.Lock
		var err error
		if i%3 == 0 {
			k, err = l.Claim(ctx, h.ByStatus("todo"), long)
		} else {
			k, err = l.Lock(ctx, h.ID(1), long)
		}
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if !sameID(k.ID(), h.ID(1)) {
			// Claim picks by rank: row 1 has the higher rank, row 2 first.
			if err := k.Release(ctx); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if k.Token() <= prev {
			t.Errorf("round %d: token %d after %d; tokens must strictly increase", i, k.Token(), prev)
		}
		prev = k.Token()
		if err := k.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func forceRelease[F any](t *testing.T, h Harness[F]) {
	ctx := testCtx(t, h)
	name, a, d := table(t, h, rows(1, "todo"), &recordlock.Options{NoAutoExtend: true})
	_, b := open(t, h, name, nil)
	id := h.ID(1)
	k, err := a.Lock(ctx, id, long)
	if err != nil {
		t.Fatal(err)
	}
	was, found, err := d.ForceRelease(ctx, id)
	if err != nil || !found || was.Owner != k.Owner() || was.Token != k.Token() {
		t.Fatalf("ForceRelease: %+v, %v, %v", was, found, err)
	}
	k2, err := b.Lock(ctx, id, long)
	if err != nil {
		t.Fatalf("Lock after ForceRelease: %v", err)
	}
	if err := k.Extend(ctx, long); !errors.Is(err, recordlock.ErrLeaseLost) {
		t.Errorf("Extend of a force-released lock: %v, want ErrLeaseLost", err)
	}
	if k.Context().Err() == nil || !errors.Is(context.Cause(k.Context()), recordlock.ErrLeaseLost) {
		t.Errorf("a force-released lock's context after a refused extension: %v, %v", k.Context().Err(), context.Cause(k.Context()))
	}
	if err := k.Release(ctx); !errors.Is(err, recordlock.ErrNotHeld) {
		t.Errorf("Release of the lost lock: %v, want ErrNotHeld", err)
	}
	if st, err := b.Locked(ctx, id); err != nil || st.Owner != k2.Owner() || st.Token != k2.Token() {
		t.Errorf("the old holder's calls touched the new holding: %+v, %v", st, err)
	}
	// Auto-extension notices the loss by itself.
	_, c := open(t, h, name, nil)
	if _, _, err := d.ForceRelease(ctx, id); err != nil {
		t.Fatal(err)
	}
	k3, err := c.Lock(ctx, id, recordlock.MinDuration*3)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.ForceRelease(ctx, id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-k3.Done():
	case <-ctx.Done():
		t.Fatal("an auto-extended lock kept living after it was force-released")
	}
	if !errors.Is(context.Cause(k3.Context()), recordlock.ErrLeaseLost) {
		t.Errorf("auto-extended lock after force-release: cause %v, want ErrLeaseLost", context.Cause(k3.Context()))
	}
}

func deadlineRule[F any](t *testing.T, h Harness[F]) {
	ctx := testCtx(t, h)
	_, l, _ := table(t, h, rows(1, "todo"), &recordlock.Options{NoAutoExtend: true, ClockSkew: 20 * time.Millisecond})
	for range 5 {
		before := time.Now()
		k, err := l.Lock(ctx, h.ID(1), time.Second)
		after := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		// deadline = send time + duration − margin, the send time lying
		// between before and after.
		lo, hi := before.Add(time.Second-20*time.Millisecond), after.Add(time.Second-20*time.Millisecond)
		if dl := k.Deadline(); dl.Before(lo) || dl.After(hi) {
			t.Errorf("Deadline %v not in [%v, %v]: it must be the send time plus the duration less the margin", dl, lo, hi)
		}
		before = time.Now()
		if err := k.Extend(ctx, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		after = time.Now()
		lo, hi = before.Add(2*time.Second-20*time.Millisecond), after.Add(2*time.Second-20*time.Millisecond)
		if dl := k.Deadline(); dl.Before(lo) || dl.After(hi) {
			t.Errorf("Deadline after Extend %v not in [%v, %v]", dl, lo, hi)
		}
		if err := k.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// extendNeverShortens: the driver's Extend sets the expiry to the later of
// the current one and now + d, so that an extension that reaches the
// server after a later, longer one cannot move the expiry before the
// holder's deadline.
func extendNeverShortens[F any](t *testing.T, h Harness[F]) {
	ctx := testCtx(t, h)
	_, _, d := table(t, h, rows(1, "todo"), nil)
	id := h.ID(1)
	rec, found, ok, err := d.Lock(ctx, id, "holder-a.1", time.Hour)
	if err != nil || !found || !ok {
		t.Fatalf("Lock: %+v %v %v %v", rec, found, ok, err)
	}
	long := rec.Until
	got, found, ok, err := d.Extend(ctx, id, "holder-a.1", rec.Token, time.Second)
	if err != nil || !found || !ok {
		t.Fatalf("Extend by less than what is left: %+v %v %v %v; want applied (a no-op)", got, found, ok, err)
	}
	back, _, err := d.Get(ctx, id)
	if err != nil || back.Until.Before(long) || got.Until.Before(long) {
		t.Errorf("Extend by 1s moved the expiry from %v to %v (answer %v, %v): an extension must never shorten a holding", long, back.Until, got.Until, err)
	}
}

func claimOrder[F any](t *testing.T, h Harness[F]) {
	ctx := testCtx(t, h)
	in := rows(6, "todo")
	in[2].Status = "done"
	_, l, _ := table(t, h, in, nil)
	// ByStatus orders by rank: rows(…) gives row i the rank n−i+1.
	var got []string
	for range 10 { // more than the records: a claim that takes a held record shows
		k, err := l.Claim(ctx, h.ByStatus("todo"), long)
		if errors.Is(err, recordlock.ErrNothingToClaim) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprint(k.ID()))
	}
	want := []string{fmt.Sprint(h.ID(6)), fmt.Sprint(h.ID(5)), fmt.Sprint(h.ID(4)), fmt.Sprint(h.ID(2)), fmt.Sprint(h.ID(1))}
	if !slices.Equal(got, want) {
		t.Errorf("claim order %v, want %v (by rank, the done record skipped)", got, want)
	}
}

// lockRetry locks id, retrying while it is locked.
func lockRetry[F any](ctx context.Context, l *recordlock.Locker[F], id any, d time.Duration) (*recordlock.Lock, error) {
	for {
		k, err := l.Lock(ctx, id, d)
		if !errors.Is(err, recordlock.ErrLocked) {
			return k, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(1+rand.IntN(4)) * time.Millisecond):
		}
	}
}

func exclusion[F any](t *testing.T, h Harness[F]) {
	ctx := testCtx(t, h)
	name, _, _ := table(t, h, rows(1, "todo"), nil)
	const goroutines, rounds = 16, 5
	var inside, overlaps, sections atomic.Int64
	var tokMu sync.Mutex
	var tokens []int64
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for range goroutines {
		_, l := open(t, h, name, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				k, err := lockRetry(ctx, l, h.ID(1), 10*time.Second)
				if err != nil {
					errs <- err
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				tokMu.Lock()
				tokens = append(tokens, k.Token())
				tokMu.Unlock()
				time.Sleep(time.Millisecond) // the critical section's work
				inside.Add(-1)
				sections.Add(1)
				if err := k.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if overlaps.Load() != 0 {
		t.Errorf("%d critical sections overlapped: the record lock is not exclusive", overlaps.Load())
	}
	if sections.Load() != goroutines*rounds {
		t.Errorf("%d sections, want %d", sections.Load(), goroutines*rounds)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Errorf("token %d after %d: tokens in lock order must strictly increase", tokens[i], tokens[i-1])
		}
	}
}

func claimEachOnce[F any](t *testing.T, h Harness[F]) {
	ctx := testCtx(t, h)
	const n, workers = 300, 8
	name, _, _ := table(t, h, rows(n, "todo"), nil)
	var mu sync.Mutex
	got := map[string]int{}
	var wg sync.WaitGroup
	for range workers {
		_, l := open(t, h, name, &recordlock.Options{NoAutoExtend: true})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2 * n { // bounded: a claim that takes a held record shows
				k, err := l.Claim(ctx, h.ByStatus("todo"), h.timeout())
				if errors.Is(err, recordlock.ErrNothingToClaim) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				got[fmt.Sprint(k.ID())]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	checkClaims(t, h, n, got)
}

func checkClaims[F any](t *testing.T, h Harness[F], n int, got map[string]int) {
	t.Helper()
	missing, twice := 0, 0
	for i := 1; i <= n; i++ {
		switch c := got[fmt.Sprint(h.ID(i))]; {
		case c == 0:
			missing++
		case c > 1:
			twice++
			if twice <= 5 {
				t.Errorf("record %v claimed %d times", h.ID(i), c)
			}
		}
	}
	if missing > 0 || twice > 0 || len(got) != n {
		t.Errorf("%d records: %d never claimed, %d claimed more than once, %d distinct ids claimed; want each claimed exactly once", n, missing, twice, len(got))
	}
}
