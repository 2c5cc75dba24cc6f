package recordlock_test

// Adversarial tests: attempts to break recordlock's guarantees through its
// public API, on the memory driver and wrappers around it (a store that
// answers late, loses answers after applying, hangs, or is unreachable).
//
// Each test attacks one guarantee through the public API. Those that
// found a break (shortening Extend, the read-back credited with another
// extension's duration, Close racing Lock, nil contexts, ids cut inside a
// character, a re-inserted record's restarted tokens) fail on the code
// before their fix.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/recordlock"
	"github.com/warden-go/warden/store/memory"
)

var errAnswerLost = errors.New("adversarial: connection reset (the answer was lost)")

// Extend behaviours of advTable.
const (
	extendNormal        = iota
	extendApplyThenFail // the store applies the extension, the answer is lost
	extendFailNoApply   // the store never sees the extension; the call fails
	extendApplyThenHold // the store applies it; the answer waits for hold (ignoring ctx)
	extendHangCtx       // the call hangs until its ctx ends (never applied)
)

// advTable wraps a memory RecordTable with faults a real store shows.
type advTable struct {
	*memory.RecordTable
	lockGate    atomic.Pointer[func()] // run before Lock reaches the table
	extendMode  atomic.Int32
	hold        chan struct{} // for extendApplyThenHold
	getFail     atomic.Bool   // Get fails (the read-back cannot settle anything)
	extendDelay atomic.Int64  // ns: an applied extension's answer arrives up to this late
	claimLate   atomic.Bool   // Claim answers a whole duration after applying
	extends     atomic.Int64
}

func newAdv(n int) *advTable { return &advTable{RecordTable: newTable(n), hold: make(chan struct{})} }

func (a *advTable) Lock(ctx context.Context, id any, owner string, d time.Duration) (driver.RecordLock, bool, bool, error) {
	if g := a.lockGate.Load(); g != nil {
		(*g)()
	}
	return a.RecordTable.Lock(ctx, id, owner, d)
}

func (a *advTable) Extend(ctx context.Context, id any, owner string, token int64, d time.Duration) (driver.RecordLock, bool, bool, error) {
	a.extends.Add(1)
	switch a.extendMode.Load() {
	case extendApplyThenFail:
		_, _, _, _ = a.RecordTable.Extend(ctx, id, owner, token, d)
		return driver.RecordLock{}, false, false, errAnswerLost
	case extendFailNoApply:
		return driver.RecordLock{}, false, false, errAnswerLost
	case extendApplyThenHold:
		rec, found, ok, err := a.RecordTable.Extend(ctx, id, owner, token, d)
		<-a.hold
		return rec, found, ok, err
	case extendHangCtx:
		<-ctx.Done()
		return driver.RecordLock{}, false, false, ctx.Err()
	}
	rec, found, ok, err := a.RecordTable.Extend(ctx, id, owner, token, d)
	if dl := a.extendDelay.Load(); dl > 0 {
		time.Sleep(time.Duration(rand.Int64N(dl))) // the answer travels slowly
	}
	return rec, found, ok, err
}

func (a *advTable) Get(ctx context.Context, id any) (driver.RecordLock, bool, error) {
	if a.getFail.Load() {
		return driver.RecordLock{}, false, errAnswerLost
	}
	return a.RecordTable.Get(ctx, id)
}

func (a *advTable) Claim(ctx context.Context, f memory.RecordFilter, owner string, d time.Duration) (driver.RecordLock, bool, error) {
	rec, ok, err := a.RecordTable.Claim(ctx, f, owner, d)
	if a.claimLate.Load() {
		time.Sleep(d) // the grant's answer arrives after its deadline
	}
	return rec, ok, err
}

// waitLapsed waits until the store itself no longer holds id locked: from
// then on the store lets anyone in.
func waitLapsed(t *testing.T, ctx context.Context, tbl *memory.RecordTable, id string) driver.RecordLock {
	t.Helper()
	for {
		rec, found, err := tbl.Get(ctx, id)
		if err != nil || !found {
			t.Fatalf("Get %s: %v, %v", id, found, err)
		}
		if !rec.Live() {
			return rec
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s stayed locked in the store: %+v", id, rec)
		case <-time.After(max(time.Until(rec.Until), time.Millisecond)):
		}
	}
}

// extendLoops counts goroutines running a lock's background extension.
func extendLoops() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte("recordlock.(*Lock).extendLoop"))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// checkNoLoopsAtEnd fails the test if extension loops outlive it (its
// Lockers are closed by earlier-run cleanups).
func checkNoLoopsAtEnd(t *testing.T) {
	t.Cleanup(func() {
		end := time.Now().Add(10 * time.Second)
		for extendLoops() > 0 {
			if time.Now().After(end) {
				buf := make([]byte, 1<<20)
				t.Errorf("%d extension loops outlive the test and its Lockers' Close:\n%s", extendLoops(), buf[:runtime.Stack(buf, true)])
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	})
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(within)
	for !cond() {
		if time.Now().After(end) {
			buf := make([]byte, 1<<20)
			t.Fatalf("not within %v: %s (%d extension loops); goroutines:\n%s", within, what, extendLoops(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// Breaks.

// BREAK (exclusion, deadline rule). Extend with a duration shorter than what
// is left moves the store's expiry EARLIER (now + d), but the local deadline
// only ever moves later (deadline.Context.Extend), so the holder keeps a live
// context long after the store let someone else in.
func TestAdversarialExtendShorterDurationKeepsLongerDeadline(t *testing.T) {
	// Fixed: Extend refuses a duration shorter than the lock's, so the
	// store's expiry never moves earlier than the local deadline.
	tbl := newTable(1)
	a := newLocker(t, tbl, &recordlock.Options{NoAutoExtend: true})
	ctx := ctxT(t)
	ka, err := a.Lock(ctx, "job-1", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	before, _, _ := tbl.Get(ctx, "job-1")
	if err := ka.Extend(ctx, recordlock.MinDuration); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Fatalf("Extend by a shorter duration: %v, want ErrInvalidArgument (a lock is never shortened)", err)
	}
	after, _, _ := tbl.Get(ctx, "job-1")
	if !after.Until.Equal(before.Until) || ka.Err() != nil {
		t.Errorf("a refused shorter Extend changed the holding: expiry %v → %v, Err %v", before.Until, after.Until, ka.Err())
	}
	if !ka.Deadline().Before(after.Until) {
		t.Errorf("local deadline %v not before the store's expiry %v", ka.Deadline(), after.Until)
	}
}

// BREAK (exclusion, deadline rule). With auto-extension on (the default),
// a user Extend to a longer duration moves the local deadline far out; the
// next background extension, by the Lock's original duration, moves the
// store's expiry back to now + that duration. When the store then becomes
// unreachable, the store lets another holder in after the short duration,
// while the holder's context stays live for the long one.
func TestAdversarialAutoExtendShrinksAfterLongExtend(t *testing.T) {
	// Fixed: a longer Extend becomes the lock's duration, so background
	// extensions ask for it too and never move the store's expiry back.
	tbl := newAdv(1)
	a := newLocker(t, tbl, nil)
	ctx := ctxT(t)
	ka, err := a.Lock(ctx, "job-1", recordlock.MinDuration)
	if err != nil {
		t.Fatal(err)
	}
	if err := ka.Extend(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	rec, _, _ := tbl.RecordTable.Get(ctx, "job-1")
	if !ka.Deadline().Before(rec.Until) {
		t.Errorf("local deadline %v not before the store's expiry %v", ka.Deadline(), rec.Until)
	}
	// The background extension asks for the hour: none is due for
	// twenty minutes, and one made now keeps the store's expiry an hour out.
	if err := ka.Extend(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	rec2, _, _ := tbl.RecordTable.Get(ctx, "job-1")
	if rec2.Until.Before(rec.Until) || !ka.Deadline().Before(rec2.Until) {
		t.Errorf("store expiry %v → %v, local deadline %v", rec.Until, rec2.Until, ka.Deadline())
	}
}

// BREAK (deadline rule: "an extension answered late never extends past
// what it can prove"). An extension whose outcome is unknown is credited,
// when a later read-back shows the expiry moved, with the LATER call's
// duration: extension 1 (1.5 s) applies but its answer and read-back are
// lost; extension 2 (1 h) never reaches the store, its read-back shows the
// expiry moved (by extension 1) and the lock is credited with an hour from
// extension 1's send time. The store's expiry is 1.5 s out.
func TestAdversarialReadBackCreditsAnotherExtensionsDuration(t *testing.T) {
	tbl := newAdv(1)
	a := newLocker(t, tbl, &recordlock.Options{NoAutoExtend: true})
	b := newLocker(t, tbl.RecordTable, &recordlock.Options{NoAutoExtend: true})
	ctx := ctxT(t)
	ka, err := a.Lock(ctx, "job-1", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tbl.extendMode.Store(extendApplyThenFail)
	tbl.getFail.Store(true)
	if err := ka.Extend(ctx, 1500*time.Millisecond); err == nil || errors.Is(err, recordlock.ErrLeaseLost) {
		t.Fatalf("extension with a lost answer and a failed read-back: %v, want the store's error", err)
	}
	tbl.extendMode.Store(extendFailNoApply)
	tbl.getFail.Store(false)
	err = ka.Extend(ctx, time.Hour)
	tbl.extendMode.Store(extendNormal)
	if err != nil {
		return // not credited: the guarantee holds
	}
	rec, _, _ := tbl.RecordTable.Get(ctx, "job-1")
	if !ka.Deadline().After(rec.Until) {
		return
	}
	t.Logf("A's deadline %v is after the store's expiry %v", ka.Deadline().Format(time.StampMilli), rec.Until.Local().Format(time.StampMilli))
	waitLapsed(t, ctx, tbl.RecordTable, "job-1")
	kb, err := b.Lock(ctx, "job-1", time.Minute)
	if err != nil {
		t.Fatalf("B could not lock the lapsed record: %v", err)
	}
	defer kb.Release(ctx)
	if ka.Err() == nil {
		t.Errorf("A's lock is live (deadline %v) while B holds the record", ka.Deadline().Format(time.StampMilli))
	}
}

// BREAK (Close racing with Lock: never a panic). A Lock whose store call is
// in flight when Close runs reaches start's closed branch, which calls
// Release on a Lock whose forget func is still nil: nil func call.
func TestAdversarialCloseRacingLockPanics(t *testing.T) {
	tbl := newAdv(1)
	l, err := recordlock.New(tbl, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	entered, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	gate := func() {
		once.Do(func() { close(entered); <-proceed })
	}
	tbl.lockGate.Store(&gate)
	type result struct {
		k        *recordlock.Lock
		err      error
		panicked any
	}
	res := make(chan result, 1)
	go func() {
		var r result
		defer func() { r.panicked = recover(); res <- r }()
		r.k, r.err = l.Lock(ctx, "job-1", time.Minute)
	}()
	<-entered
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	r := <-res
	if r.panicked != nil {
		t.Fatalf("Lock racing Close panicked: %v", r.panicked)
	}
	if !errors.Is(r.err, recordlock.ErrClosed) {
		t.Errorf("Lock racing Close: %v, %v; want ErrClosed", r.k, r.err)
	}
	if rec, _, _ := tbl.RecordTable.Get(ctx, "job-1"); rec.Live() {
		t.Errorf("the record stays locked after Lock gave ErrClosed: %+v", rec)
	}
}

// BREAK (bad input: "nil ctx … clear errors, never a panic"). Locker's
// methods refuse a nil context; Lock.Extend and Lock.Release panic on one.
// Release even marks the lock ended before panicking, leaving the record
// locked.
func TestAdversarialNilContextOnLockMethods(t *testing.T) {
	tbl := newTable(1)
	l := newLocker(t, tbl, nil)
	ctx := ctxT(t)
	k, err := l.Lock(ctx, "job-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	call := func(name string, f func() error) {
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("%s panicked: %v", name, p)
			}
		}()
		if err := f(); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	//lint:ignore SA1012 a nil context is what is tested
	call("Extend(nil)", func() error { return k.Extend(nil, time.Minute) }) //nolint:staticcheck
	//lint:ignore SA1012 a nil context is what is tested
	call("Release(nil)", func() error { return k.Release(nil) }) //nolint:staticcheck
	if err := k.Release(ctx); err != nil {
		t.Errorf("Release after the nil-context calls: %v", err)
	}
	if rec, _, _ := tbl.Get(ctx, "job-1"); rec.Live() {
		t.Errorf("the record stays locked: %+v", rec)
	}
}

// BREAK (minor: messages cut long ids short — but on a byte boundary).
// showID cuts the quoted id at byte 61, in the middle of a multi-byte
// character: the error message is not valid UTF-8.
func TestAdversarialErrorMessagesCutIDsOnRuneBoundary(t *testing.T) {
	id := "a" + strings.Repeat("é", 100)
	tbl := newTable(0)
	tbl.Insert(id, nil)
	a := newLocker(t, tbl, nil)
	b := newLocker(t, tbl, nil)
	ctx := ctxT(t)
	_, err := a.Lock(ctx, "b"+strings.Repeat("é", 100), time.Minute)
	if !errors.Is(err, recordlock.ErrNotFound) {
		t.Fatalf("missing id: %v", err)
	}
	if !utf8.ValidString(err.Error()) {
		t.Errorf("ErrNotFound message is not valid UTF-8: %q", err.Error())
	}
	if _, err := a.Lock(ctx, id, time.Minute); err != nil {
		t.Fatal(err)
	}
	_, err = b.Lock(ctx, id, time.Minute)
	if !errors.Is(err, recordlock.ErrLocked) {
		t.Fatalf("held id: %v", err)
	}
	if !utf8.ValidString(err.Error()) {
		t.Errorf("LockedError message is not valid UTF-8: %q", err.Error())
	}
}

// BREAK (exclusion with a record deleted and re-inserted by another
// program). Two Locks of ONE Locker carry the same owner; a re-inserted
// record restarts its tokens at 1, so the old holding (token 1) and the new
// one (token 1) are indistinguishable: the old Lock's extensions succeed
// against the new holding and never notice, and its Release clears the new
// holder's lock while that holder is live. With two Lockers the old holder
// is refused at its next extension (see the passing test below).
func TestAdversarialDeleteReinsertSameLocker(t *testing.T) {
	tbl := newTable(1)
	l := newLocker(t, tbl, &recordlock.Options{NoAutoExtend: true})
	other := newLocker(t, tbl, &recordlock.Options{NoAutoExtend: true})
	ctx := ctxT(t)
	old, err := l.Lock(ctx, "job-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	fields, _ := tbl.Fields("job-1")
	tbl.Delete("job-1")
	tbl.Insert("job-1", fields)
	cur, err := l.Lock(ctx, "job-1", time.Minute)
	if err != nil {
		t.Fatalf("lock of the re-inserted record: %v", err)
	}
	if err := old.Extend(ctx, time.Minute); err == nil {
		t.Errorf("the old Lock (token %d) extended the new holding (token %d): it cannot tell it lost the record", old.Token(), cur.Token())
	}
	_ = old.Release(ctx)
	if k, err := other.Lock(ctx, "job-1", time.Minute); err == nil {
		defer k.Release(ctx)
		if cur.Err() == nil {
			t.Errorf("the old Lock's Release cleared the live holding of another Lock: a third holder got the record while it was live")
		}
	}
}

// ---------------------------------------------------------------------------
// Attacks that held (regression tests).

// Exclusion with the shortest duration, auto-extension, and a store whose
// answers arrive late: at the instant a holder's Lock returns, every other
// holder's Err is already non-nil.
func TestAdversarialExclusionShortDurationsSlowStore(t *testing.T) {
	checkNoLoopsAtEnd(t)
	tbl := newAdv(1)
	tbl.extendDelay.Store(int64(40 * time.Millisecond))
	ctx := ctxT(t)
	var (
		mu    sync.Mutex
		live  = map[*recordlock.Lock]bool{}
		bad   atomic.Int32
		taken atomic.Int32
		toks  []int64
	)
	stop := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	for i := range 4 {
		l := newLocker(t, tbl, &recordlock.Options{NoAutoExtend: i%2 == 1})
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					k, err := l.Lock(ctx, "job-1", recordlock.MinDuration)
					if errors.Is(err, recordlock.ErrLocked) || errors.Is(err, warden.ErrStoreTooSlow) {
						time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					taken.Add(1)
					mu.Lock()
					for o := range live {
						if o.Err() == nil {
							bad.Add(1)
							t.Errorf("holder with token %d acquired while token %d was live (deadline %v)", k.Token(), o.Token(), o.Deadline().Format(time.StampMicro))
						}
					}
					live[k] = true
					toks = append(toks, k.Token())
					mu.Unlock()
					time.Sleep(time.Duration(rand.IntN(150)) * time.Millisecond) // work, spanning extensions (or the deadline)
					mu.Lock()
					delete(live, k)
					mu.Unlock()
					_ = k.Release(ctx)
				}
			}()
		}
	}
	wg.Wait()
	if taken.Load() < 5 {
		t.Errorf("only %d holdings", taken.Load())
	}
	for i := 1; i < len(toks); i++ {
		if toks[i] <= toks[i-1] {
			t.Errorf("tokens out of order: %v", toks)
			break
		}
	}
}

// Claim by many workers with short durations, auto-extension and a slow
// store: each record handed to exactly one worker while its holding lasts,
// none skipped; the previous holder of a claimed record is never live.
func TestAdversarialClaimEachOnceNoOverlap(t *testing.T) {
	checkNoLoopsAtEnd(t)
	const n = 150
	tbl := newAdv(n)
	tbl.extendDelay.Store(int64(30 * time.Millisecond))
	ctx := ctxT(t)
	todo := memory.RecordFilter{Match: func(_ string, f map[string]any) bool { return f["status"] == "todo" }}
	var (
		mu      sync.Mutex
		holders = map[string]*recordlock.Lock{}
		done    = map[string]int{}
	)
	var wg sync.WaitGroup
	for i := range 6 {
		l := newLocker(t, tbl, &recordlock.Options{NoAutoExtend: i%3 == 2})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k, err := l.Claim(ctx, todo, recordlock.MinDuration)
				if errors.Is(err, recordlock.ErrNothingToClaim) {
					return
				}
				if errors.Is(err, warden.ErrStoreTooSlow) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				id := k.ID().(string)
				mu.Lock()
				if prev := holders[id]; prev != nil && prev.Err() == nil {
					t.Errorf("%s claimed while its previous holder (token %d) is live", id, prev.Token())
				}
				holders[id] = k
				mu.Unlock()
				time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
				if k.Err() == nil { // the fenced write: mark it done only while held
					mu.Lock()
					done[id]++
					mu.Unlock()
					tbl.Insert(id, map[string]any{"status": "done"})
				}
				_ = k.Release(ctx)
			}
		}()
	}
	wg.Wait()
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("job-%d", i)
		if f, _ := tbl.Fields(id); f["status"] != "done" {
			t.Errorf("%s left %v though the workers found nothing to claim", id, f["status"])
		}
		if done[id] < 1 {
			t.Errorf("%s never done under a live claim", id)
		}
	}
}

// An operator's force-release: the holder learns at its next extension
// (as `warden record release --force` documents), and the next holder's
// token is greater.
func TestAdversarialForceReleaseHolderLearnsAtNextExtension(t *testing.T) {
	checkNoLoopsAtEnd(t)
	tbl := newTable(1)
	a := newLocker(t, tbl, &recordlock.Options{NoAutoExtend: true})
	auto := newLocker(t, tbl, nil)
	b := newLocker(t, tbl, nil)
	ctx := ctxT(t)
	ka, err := a.Lock(ctx, "job-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tbl.ForceRelease(ctx, "job-1"); err != nil {
		t.Fatal(err)
	}
	kb, err := b.Lock(ctx, "job-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if kb.Token() <= ka.Token() {
		t.Errorf("token after force-release %d, before %d", kb.Token(), ka.Token())
	}
	if err := ka.Extend(ctx, time.Minute); !errors.Is(err, recordlock.ErrLeaseLost) || !errors.Is(ka.Err(), recordlock.ErrLeaseLost) {
		t.Errorf("Extend after force-release: %v, Err %v; want ErrLeaseLost", err, ka.Err())
	}
	if err := ka.Release(ctx); !errors.Is(err, recordlock.ErrNotHeld) {
		t.Errorf("Release after the loss: %v", err)
	}
	if kb.Err() != nil {
		t.Errorf("the old holder's Release touched the new holding: %v", kb.Err())
	}
	_ = kb.Release(ctx)
	// An auto-extended lock ends by itself.
	kc, err := auto.Lock(ctx, "job-1", recordlock.MinDuration)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tbl.ForceRelease(ctx, "job-1"); err != nil {
		t.Fatal(err)
	}
	<-kc.Done()
	if !errors.Is(kc.Err(), recordlock.ErrLeaseLost) {
		t.Errorf("auto-extended lock after force-release: %v", kc.Err())
	}
}

// With two Lockers, the holder of a record deleted and re-inserted by
// another program is refused at its next extension.
func TestAdversarialDeleteReinsertOtherLocker(t *testing.T) {
	checkNoLoopsAtEnd(t)
	tbl := newTable(1)
	a := newLocker(t, tbl, &recordlock.Options{NoAutoExtend: true})
	b := newLocker(t, tbl, &recordlock.Options{NoAutoExtend: true})
	ctx := ctxT(t)
	ka, err := a.Lock(ctx, "job-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tbl.Delete("job-1")
	if err := ka.Extend(ctx, time.Minute); !errors.Is(err, recordlock.ErrLeaseLost) {
		t.Errorf("Extend of a deleted record: %v, want ErrLeaseLost", err)
	}
	tbl.Insert("job-1", map[string]any{"status": "todo"})
	if _, err := a.Lock(ctx, "job-2", time.Minute); !errors.Is(err, recordlock.ErrNotFound) {
		t.Errorf("Lock of a missing id: %v", err)
	}
	ka, err = a.Lock(ctx, "job-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tbl.Delete("job-1")
	tbl.Insert("job-1", map[string]any{"status": "todo"})
	kb, err := b.Lock(ctx, "job-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := ka.Extend(ctx, time.Minute); !errors.Is(err, recordlock.ErrLeaseLost) {
		t.Errorf("Extend of a re-inserted record another holds: %v, want ErrLeaseLost", err)
	}
	_ = ka.Release(ctx)
	if kb.Err() != nil {
		t.Errorf("B lost its lock: %v", kb.Err())
	}
	if rec, _, _ := tbl.Get(ctx, "job-1"); rec.Owner != kb.Owner() {
		t.Errorf("A's Release touched B's holding: %+v", rec)
	}
}

// Late answers: an extension applied by the store but answered after the
// deadline does not extend the lock; a claim granted after its deadline is
// given back and never returned.
func TestAdversarialLateAnswersNeverExtend(t *testing.T) {
	checkNoLoopsAtEnd(t)
	tbl := newAdv(2)
	l := newLocker(t, tbl, &recordlock.Options{NoAutoExtend: true})
	ctx := ctxT(t)
	k, err := l.Lock(ctx, "job-1", recordlock.MinDuration)
	if err != nil {
		t.Fatal(err)
	}
	dl := k.Deadline()
	tbl.extendMode.Store(extendApplyThenHold)
	res := make(chan error, 1)
	go func() { res <- k.Extend(ctx, time.Hour) }()
	<-k.Done() // the deadline passed while the answer is held
	close(tbl.hold)
	if err := <-res; !errors.Is(err, recordlock.ErrLeaseLost) {
		t.Errorf("extension answered after the deadline: %v, want ErrLeaseLost", err)
	}
	if !errors.Is(k.Err(), recordlock.ErrLeaseLost) || !k.Deadline().Equal(dl) {
		t.Errorf("after a late extension: Err %v, deadline %v (was %v)", k.Err(), k.Deadline(), dl)
	}
	tbl.extendMode.Store(extendNormal)

	tbl.claimLate.Store(true)
	if k, err := l.Claim(ctx, memory.RecordFilter{Match: func(id string, _ map[string]any) bool { return id == "job-2" }}, recordlock.MinDuration); !errors.Is(err, warden.ErrStoreTooSlow) {
		t.Errorf("late claim grant: %v, %v; want ErrStoreTooSlow", k, err)
	}
	if rec, _, _ := tbl.RecordTable.Get(ctx, "job-2"); rec.Owner != "" {
		t.Errorf("the late claim was not given back: %+v", rec)
	}
}

// The deadline is the send time + duration − margin, and Err consults the
// clock the instant the deadline passes.
func TestAdversarialDeadlineBoundsAndErrConsultsClock(t *testing.T) {
	checkNoLoopsAtEnd(t)
	tbl := newTable(1)
	l := newLocker(t, tbl, &recordlock.Options{NoAutoExtend: true})
	ctx := ctxT(t)
	const d = 2 * time.Second
	m := d / 20 // the default margin
	before := time.Now()
	k, err := l.Lock(ctx, "job-1", d)
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if dl := k.Deadline(); dl.Before(before.Add(d-m)) || dl.After(after.Add(d-m)) {
		t.Errorf("deadline %v not in [%v, %v]", dl, before.Add(d-m), after.Add(d-m))
	}
	rec, _, _ := tbl.Get(ctx, "job-1")
	if k.Deadline().After(rec.Until) {
		t.Errorf("local deadline %v after the store's expiry %v", k.Deadline(), rec.Until)
	}
	if err := k.Release(ctx); err != nil {
		t.Fatal(err)
	}
	k, err = l.Lock(ctx, "job-1", recordlock.MinDuration)
	if err != nil {
		t.Fatal(err)
	}
	for {
		now := time.Now()
		e := k.Err()
		if now.Before(k.Deadline()) {
			continue
		}
		// e was read after now, which is at or past the deadline.
		if !errors.Is(e, recordlock.ErrLeaseLost) {
			t.Fatalf("at %v, past the deadline %v: Err %v", now, k.Deadline(), e)
		}
		break
	}
	select {
	case <-k.Done():
	default:
		t.Error("Err reported the loss but Done is open")
	}
}

// Nothing is created and nothing but the lock state of the record at hand
// changes: user fields, other records' lock state, the table's size.
func TestAdversarialNothingCreatedOrWritten(t *testing.T) {
	checkNoLoopsAtEnd(t)
	tbl := newTable(5)
	for i := 1; i <= 5; i++ {
		tbl.Insert(fmt.Sprintf("job-%d", i), map[string]any{"status": "todo", "n": i, "nested": []int{i}})
	}
	l := newLocker(t, tbl, nil)
	ctx := ctxT(t)
	other, err := l.Lock(ctx, "job-5", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	snapshot := func() (string, string) {
		var f, s strings.Builder
		for i := 1; i <= 4; i++ {
			id := fmt.Sprintf("job-%d", i)
			fl, _ := tbl.Fields(id)
			fmt.Fprintf(&f, "%s=%v;", id, fl)
			if i != 1 {
				rec, _, _ := tbl.Get(ctx, id)
				fmt.Fprintf(&s, "%s=%s/%v/%d;", id, rec.Owner, rec.Until, rec.Token)
			}
		}
		rec, _, _ := tbl.Get(ctx, "job-5")
		fmt.Fprintf(&s, "job-5=%s/%d;", rec.Owner, rec.Token)
		return f.String(), s.String()
	}
	f0, s0 := snapshot()
	for _, id := range []string{"missing", "job-6", "JOB-1", "job-1 ", "job-%", "*", "job-1\x00"} {
		if _, err := l.Lock(ctx, id, time.Minute); !errors.Is(err, recordlock.ErrNotFound) && !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Lock(%q): %v, want ErrNotFound", id, err)
		}
		if _, err := l.Locked(ctx, id); !errors.Is(err, recordlock.ErrNotFound) && !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Locked(%q): %v", id, err)
		}
	}
	k, err := l.Lock(ctx, "job-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Extend(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := k.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Claim(ctx, memory.RecordFilter{Match: func(string, map[string]any) bool { return false }}, time.Minute); !errors.Is(err, recordlock.ErrNothingToClaim) {
		t.Errorf("Claim matching nothing: %v", err)
	}
	if f1, s1 := snapshot(); f1 != f0 || s1 != s0 {
		t.Errorf("lock/extend/release of job-1 changed other state:\nfields %s\n   was %s\nlocks %s\n  was %s", f1, f0, s1, s0)
	}
	if tbl.Len() != 5 {
		t.Errorf("%d records, want 5", tbl.Len())
	}
	if other.Err() != nil {
		t.Errorf("another record's lock ended: %v", other.Err())
	}
}

// Tokens strictly increase across release, force-release, expiry, Close
// and a late grant given back.
func TestAdversarialTokensIncrease(t *testing.T) {
	checkNoLoopsAtEnd(t)
	tbl := newAdv(1)
	ctx := ctxT(t)
	var toks []int64
	lockOnce := func(l *recordlock.Locker[memory.RecordFilter], d time.Duration) *recordlock.Lock {
		t.Helper()
		k, err := l.Lock(ctx, "job-1", d)
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, k.Token())
		return k
	}
	l := newLocker(t, tbl, &recordlock.Options{NoAutoExtend: true})
	_ = lockOnce(l, time.Minute).Release(ctx)
	lockOnce(l, time.Minute)
	if _, _, err := tbl.ForceRelease(ctx, "job-1"); err != nil {
		t.Fatal(err)
	}
	k := lockOnce(l, recordlock.MinDuration)
	<-k.Done()
	waitLapsed(t, ctx, tbl.RecordTable, "job-1")
	lockOnce(l, time.Minute)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2 := newLocker(t, tbl, nil)
	lockOnce(l2, time.Minute)
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	l3 := newLocker(t, tbl, nil)
	tbl.claimLate.Store(true)
	if _, err := l3.Claim(ctx, memory.RecordFilter{}, recordlock.MinDuration); !errors.Is(err, warden.ErrStoreTooSlow) {
		t.Fatalf("late claim: %v", err)
	}
	tbl.claimLate.Store(false)
	lockOnce(l3, time.Minute)
	for i := 1; i < len(toks); i++ {
		if toks[i] <= toks[i-1] {
			t.Fatalf("tokens %v not strictly increasing", toks)
		}
	}
	if toks[len(toks)-1]-toks[len(toks)-2] != 2 {
		t.Errorf("tokens %v: the late claim's token was not consumed", toks)
	}
}

type wrongID struct{ s string }

// Bad input gives clear errors, never a panic.
func TestAdversarialBadInput(t *testing.T) {
	checkNoLoopsAtEnd(t)
	tbl := newTable(1)
	l := newLocker(t, tbl, nil)
	ctx := ctxT(t)
	huge := strings.Repeat("x", 1<<20)
	for _, id := range []any{nil, "", huge, strings.Repeat("y", driver.MaxKeyBytes+1), "\xff\xfe", 42, int64(1), []byte("job-1"), wrongID{"job-1"}, &wrongID{}, 1.5} {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("Lock(%T) panicked: %v", id, p)
				}
			}()
			_, err := l.Lock(ctx, id, time.Minute)
			if !errors.Is(err, warden.ErrInvalidArgument) {
				t.Errorf("Lock(%T %.20v): %v, want ErrInvalidArgument", id, id, err)
			}
			if err != nil && len(err.Error()) > 300 {
				t.Errorf("Lock(%T): message of %d bytes: ids must be cut short", id, len(err.Error()))
			}
			if _, err := l.Locked(ctx, id); !errors.Is(err, warden.ErrInvalidArgument) {
				t.Errorf("Locked(%T): %v", id, err)
			}
		}()
	}
	for _, d := range []time.Duration{math.MinInt64, -1, 0, time.Nanosecond, recordlock.MinDuration - time.Nanosecond} {
		if _, err := l.Lock(ctx, "job-1", d); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Lock for %v: %v", d, err)
		}
		if _, err := l.Claim(ctx, memory.RecordFilter{}, d); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Claim for %v: %v", d, err)
		}
	}
	//lint:ignore SA1012 a nil context is what is tested
	if _, err := l.Claim(nil, memory.RecordFilter{}, time.Minute); !errors.Is(err, warden.ErrInvalidArgument) { //nolint:staticcheck
		t.Errorf("Claim(nil ctx): %v", err)
	}
	//lint:ignore SA1012 a nil context is what is tested
	if _, err := l.Locked(nil, "job-1"); !errors.Is(err, warden.ErrInvalidArgument) { //nolint:staticcheck
		t.Errorf("Locked(nil ctx): %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Claim(cctx, memory.RecordFilter{}, time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("Claim(cancelled): %v", err)
	}
	if rec, _, _ := tbl.Get(ctx, "job-1"); rec.Token != 0 {
		t.Errorf("a refused call wrote the record: %+v", rec)
	}
	// The longest duration: no overflow, no panic; the lock works.
	k, err := l.Lock(ctx, "job-1", math.MaxInt64)
	if err != nil {
		t.Fatalf("Lock for MaxInt64: %v", err)
	}
	if !k.Deadline().After(time.Now().Add(100*365*24*time.Hour)) || k.Err() != nil {
		t.Errorf("Lock for MaxInt64: deadline %v, Err %v", k.Deadline(), k.Err())
	}
	if err := k.Extend(ctx, math.MaxInt64); err != nil {
		t.Errorf("Extend by MaxInt64: %v", err)
	}
	if err := k.Extend(ctx, -time.Second); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Extend by -1s: %v", err)
	}
	if err := k.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
	if err := k.Extend(ctx, time.Minute); !errors.Is(err, recordlock.ErrNotHeld) {
		t.Errorf("Extend after Release: %v", err)
	}
	// Options.
	for _, o := range []recordlock.Options{{Owner: strings.Repeat("o", driver.MaxKeyBytes+1)}, {Owner: "\xff"}, {Owner: "a\x00"}, {ClockSkew: math.MinInt64}} {
		if _, err := recordlock.New(tbl, &o); err == nil {
			t.Errorf("New(%+.30v): no error", o)
		}
	}
	big, err := recordlock.New(tbl, &recordlock.Options{ClockSkew: math.MaxInt64, NoAutoExtend: true})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	k, err = big.Lock(ctx, "job-1", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if k.Deadline().After(time.Now().Add(time.Second/2)) || k.Deadline().Before(before.Add(time.Second/2)) {
		t.Errorf("ClockSkew MaxInt64: deadline %v, want the send time + half the duration", k.Deadline())
	}
	if err := big.Close(); err != nil {
		t.Fatal(err)
	}
	// A closed Locker.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Lock(ctx, "job-1", time.Minute); !errors.Is(err, recordlock.ErrClosed) {
		t.Errorf("Lock on a closed Locker: %v", err)
	}
	if _, err := l.Claim(ctx, memory.RecordFilter{}, time.Minute); !errors.Is(err, recordlock.ErrClosed) {
		t.Errorf("Claim on a closed Locker: %v", err)
	}
}

// Every background goroutine ends after Release, loss and Close — also
// when the store hangs.
func TestAdversarialNoGoroutineLeaks(t *testing.T) {
	base := runtime.NumGoroutine()
	tbl := newAdv(10)
	ctx := ctxT(t)
	l, err := recordlock.New(tbl, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	var ks []*recordlock.Lock
	for i := 1; i <= 10; i++ {
		k, err := l.Lock(ctx, fmt.Sprintf("job-%d", i), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ks = append(ks, k)
	}
	// (A goroutine not yet scheduled does not show its function in the
	// stack dump.)
	eventually(t, 10*time.Second, "10 extension loops for 10 locks", func() bool { return extendLoops() >= 10 })
	for _, k := range ks[:3] {
		if err := k.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range ks[3:5] {
		if _, _, err := tbl.ForceRelease(ctx, k.ID()); err != nil {
			t.Fatal(err)
		}
		if err := k.Extend(ctx, time.Second); !errors.Is(err, recordlock.ErrLeaseLost) {
			t.Fatalf("Extend after force-release: %v", err)
		}
	}
	eventually(t, 10*time.Second, "extension loops of released and lost locks end", func() bool { return extendLoops() <= 5 })
	// Another store hangs: its lock is lost at its deadline.
	hungTbl := newAdv(1)
	hung, err := recordlock.New(hungTbl, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hung.Close() })
	kh, err := hung.Lock(ctx, "job-1", recordlock.MinDuration)
	if err != nil {
		t.Fatal(err)
	}
	hungTbl.extendMode.Store(extendHangCtx)
	<-kh.Done()
	eventually(t, 10*time.Second, "the hung lock's extension loop ends", func() bool { return extendLoops() <= 5 })
	if err := l.Close(); err != nil && !errors.Is(err, recordlock.ErrNotHeld) {
		t.Errorf("Close: %v", err)
	}
	if n := extendLoops(); n != 0 {
		t.Errorf("%d extension loops after Close", n)
	}
	if err := hung.Close(); err != nil {
		t.Errorf("Close of the hung Locker: %v", err)
	}
	eventually(t, 10*time.Second, "goroutines back to their number before the test", func() bool { return runtime.NumGoroutine() <= base })
}

// Close racing with Release and Extend: no panic, every lock ends, no
// record stays locked by the closed Locker.
func TestAdversarialCloseRacesReleaseExtend(t *testing.T) {
	checkNoLoopsAtEnd(t)
	ctx := ctxT(t)
	for range 30 {
		tbl := newTable(6)
		l := newLocker(t, tbl, &recordlock.Options{NoAutoExtend: rand.IntN(2) == 0})
		var ks []*recordlock.Lock
		for i := 1; i <= 6; i++ {
			k, err := l.Lock(ctx, fmt.Sprintf("job-%d", i), recordlock.MinDuration+time.Duration(rand.IntN(100))*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			ks = append(ks, k)
		}
		var wg sync.WaitGroup
		for _, k := range ks {
			wg.Add(2)
			go func() {
				defer wg.Done()
				if err := k.Release(ctx); err != nil && !errors.Is(err, recordlock.ErrNotHeld) {
					t.Errorf("Release racing Close: %v", err)
				}
			}()
			go func() {
				defer wg.Done()
				if err := k.Extend(ctx, time.Second); err != nil && !errors.Is(err, recordlock.ErrNotHeld) && !errors.Is(err, recordlock.ErrLeaseLost) {
					t.Errorf("Extend racing Close: %v", err)
				}
			}()
		}
		if err := l.Close(); err != nil && !errors.Is(err, recordlock.ErrNotHeld) {
			t.Errorf("Close: %v", err)
		}
		wg.Wait()
		for _, k := range ks {
			if k.Err() == nil {
				t.Errorf("lock %v live after Close", k.ID())
			}
		}
		if live, _ := tbl.List(ctx, 10); len(live) != 0 {
			t.Errorf("records still locked after Close and Release: %+v", live)
		}
	}
}
