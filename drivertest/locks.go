package drivertest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

func (s *suite) locks(t *testing.T) {
	group(t, []check{
		{"Exclusion", s.lockExclusion},
		{"FirstAcquire", s.lockFirstAcquire},
		{"Reacquire", s.lockReacquire},
		{"TTLPrecision", s.lockTTLPrecision},
		{"Expiry", s.lockExpiry},
		{"ReleaseAfterExpiry", s.lockReleaseAfterExpiry},
		{"NotOwner", s.lockNotOwner},
		{"FencingTokens", s.lockFencing},
		{"GetList", s.lockGetList},
		{"ListPaging", s.lockListPaging},
		{"ForceRelease", s.lockForceRelease},
	})
}

// acquireWait polls Acquire with a short jittered back-off until owner
// holds key or ctx ends.
func acquireWait(ctx context.Context, l *warden.Locks, key, owner string, ttl time.Duration) (driver.LockRecord, error) {
	backoff := 100 * time.Microsecond
	for {
		rec, ok, err := l.Acquire(ctx, key, owner, ttl)
		if err != nil {
			return rec, err
		}
		if ok {
			return rec, nil
		}
		if !sleepCtx(ctx, 50*time.Microsecond+time.Duration(rand.Int64N(int64(backoff)))) {
			return rec, ctx.Err()
		}
		if backoff < 2*time.Millisecond {
			backoff *= 2
		}
	}
}

// checkLockRecord checks a record a lock call returned.
func checkLockRecord(t *testing.T, what string, rec driver.LockRecord, key, owner string) {
	t.Helper()
	if rec.Key != key || rec.Owner != owner {
		t.Errorf("%s: record is key %s owner %s, want key %s owner %s", what, short(rec.Key), short(rec.Owner), short(key), short(owner))
	}
	if rec.Token <= 0 {
		t.Errorf("%s: fencing token %d is not positive", what, rec.Token)
	}
	checkTime(t, what+": AcquiredAt", rec.AcquiredAt)
	checkTime(t, what+": ExpiresAt", rec.ExpiresAt)
	if !rec.ExpiresAt.After(rec.AcquiredAt) {
		t.Errorf("%s: ExpiresAt %v is not after AcquiredAt %v", what, rec.ExpiresAt, rec.AcquiredAt)
	}
}

// sameLock compares two lock records.
func sameLock(a, b driver.LockRecord) bool {
	return a.Key == b.Key && a.Owner == b.Owner && a.Token == b.Token &&
		a.AcquiredAt.Equal(b.AcquiredAt) && a.ExpiresAt.Equal(b.ExpiresAt)
}

// lockExclusion: many goroutines compete for one key, each running many
// short critical sections; exactly one may be inside at any time.
func (s *suite) lockExclusion(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	l := st.Locks()
	const key = "exclusion"
	const workers, rounds = 16, 20

	type section struct {
		owner      string
		token      int64
		begin, end time.Time
	}
	var (
		inside   atomic.Int32
		overlaps atomic.Int32
		mu       sync.Mutex
		sections []section
		errs     errList
	)
	parallel(workers, func(w int) {
		owner := fmt.Sprintf("worker-%d", w)
		for r := 0; r < rounds; r++ {
			rec, err := acquireWait(ctx, l, key, owner, 30*time.Second)
			if err != nil {
				errs.add("%s: Acquire: %v", owner, err)
				return
			}
			if inside.Add(1) != 1 {
				overlaps.Add(1)
			}
			begin := time.Now()
			cur, found, err := l.Get(ctx, key)
			switch {
			case err != nil:
				errs.add("%s: Get inside the critical section: %v", owner, err)
			case !found || cur.Owner != owner || cur.Token != rec.Token:
				errs.add("%s holds token %d but Get says found=%v owner %q token %d", owner, rec.Token, found, cur.Owner, cur.Token)
			}
			time.Sleep(100 * time.Microsecond)
			end := time.Now()
			inside.Add(-1)
			mu.Lock()
			sections = append(sections, section{owner, rec.Token, begin, end})
			mu.Unlock()
			ok, err := l.Release(ctx, key, owner, rec.Token)
			if err != nil || !ok {
				errs.add("%s: Release of its own holding (token %d): ok=%v err=%v", owner, rec.Token, ok, err)
			}
		}
	})
	errs.report(t, "workers")
	if n := overlaps.Load(); n > 0 {
		t.Errorf("%d times a worker entered the critical section while another was inside: the lock is not exclusive", n)
	}
	if len(sections) != workers*rounds && errs.count() == 0 {
		t.Errorf("%d critical sections ran, want %d", len(sections), workers*rounds)
	}
	sort.Slice(sections, func(i, j int) bool { return sections[i].begin.Before(sections[j].begin) })
	var overlapping, unordered int
	for i := 1; i < len(sections); i++ {
		p, c := sections[i-1], sections[i]
		if c.begin.Before(p.end) {
			if overlapping == 0 {
				t.Errorf("critical sections overlap: %s (token %d) began before %s (token %d) ended", c.owner, c.token, p.owner, p.token)
			}
			overlapping++
		}
		if c.token <= p.token {
			if unordered == 0 {
				t.Errorf("fencing tokens do not increase with the holdings: %s got %d after %s had %d", c.owner, c.token, p.owner, p.token)
			}
			unordered++
		}
	}
	if overlapping > 1 || unordered > 1 {
		t.Errorf("%d overlapping sections, %d tokens out of order in all", overlapping, unordered)
	}
}

// lockFirstAcquire: concurrent acquires of a new (then released,
// force-released and expired) key: exactly one winner, no errors.
func (s *suite) lockFirstAcquire(t *testing.T) {
	ec := newErrorCap(t, "lockFirstAcquire")
	defer ec.done()
	ctx := testCtx(t)
	st, _ := s.open(t)
	l := st.Locks()
	const contenders, keys = 8, 20
	type result struct {
		rec driver.LockRecord
		ok  bool
		err error
	}
	lastToken := map[string]int64{}
	var lastEnd time.Time
	round := func(phase string, ttl time.Duration) {
		for k := range keys {
			key := fmt.Sprintf("first-%d", k)
			res := make([]result, contenders)
			sp := timed(func() {
				parallel(contenders, func(i int) {
					r := &res[i]
					r.rec, r.ok, r.err = l.Acquire(ctx, key, fmt.Sprintf("%s-owner-%d", phase, i), ttl)
				})
			})
			lastEnd = sp.end
			// With a short TTL, a slow machine may let a contender in
			// legitimately after the winner's holding expired.
			expiredMeanwhile := sp.end.Sub(sp.start) >= ttl
			winner := -1
			for i, r := range res {
				if r.err != nil {
					ec.Errorf("%s: concurrent Acquire of %s returned an error (want acquired=false): %v", phase, key, r.err)
					continue
				}
				if r.ok {
					if winner >= 0 && !expiredMeanwhile {
						ec.Errorf("%s: %s acquired by both %s and %s", phase, key, res[winner].rec.Owner, r.rec.Owner)
					}
					if winner < 0 || r.rec.Token > res[winner].rec.Token {
						winner = i
					}
				}
			}
			if winner < 0 {
				ec.Errorf("%s: none of %d concurrent Acquires of %s won", phase, contenders, key)
				continue
			}
			w := res[winner].rec
			for _, r := range res {
				if r.err == nil && !r.ok && !expiredMeanwhile && (r.rec.Owner != w.Owner || r.rec.Token != w.Token) {
					ec.Errorf("%s: a loser was told the holder is %q token %d, but %q won with token %d", phase, r.rec.Owner, r.rec.Token, w.Owner, w.Token)
				}
			}
			if w.Token <= lastToken[key] {
				ec.Errorf("%s: %s token %d is not above the previous holding's %d", phase, key, w.Token, lastToken[key])
			}
			lastToken[key] = w.Token
			switch phase {
			case "new":
				ok, err := l.Release(ctx, key, w.Owner, w.Token)
				if err != nil || !ok {
					ec.Errorf("Release %s: ok=%v err=%v", key, ok, err)
				}
			case "released":
				ok, err := l.ForceRelease(ctx, key)
				if err != nil || !ok {
					ec.Errorf("ForceRelease %s: ok=%v err=%v", key, ok, err)
				}
			}
		}
	}
	round("new", 30*time.Second)
	round("released", 30*time.Second)
	const shortTTL = 300 * time.Millisecond
	round("force-released", shortTTL)
	sleepUntil(t, ctx, lastEnd.Add(shortTTL+50*time.Millisecond))
	round("expired", 30*time.Second)
}

// lockReacquire: the owner acquiring again keeps its token and extends.
func (s *suite) lockReacquire(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	l := st.Locks()
	const key = "reacquire"
	r1, ok, err := l.Acquire(ctx, key, "alice", 10*time.Second)
	fatalIf(t, "Acquire", err)
	if !ok {
		t.Fatal("Acquire of a free key: not acquired")
	}
	checkLockRecord(t, "first Acquire", r1, key, "alice")
	r2, ok, err := l.Acquire(ctx, key, "alice", 20*time.Second)
	fatalIf(t, "Acquire again", err)
	if !ok {
		t.Fatal("the holder acquiring again: not acquired")
	}
	checkLockRecord(t, "Acquire again", r2, key, "alice")
	if r2.Token != r1.Token {
		t.Errorf("the holder acquiring again got token %d, want its token %d kept", r2.Token, r1.Token)
	}
	if !r2.AcquiredAt.Equal(r1.AcquiredAt) {
		t.Errorf("acquiring again moved AcquiredAt from %v to %v; it is when the holding began", r1.AcquiredAt, r2.AcquiredAt)
	}
	if !r2.ExpiresAt.After(r1.ExpiresAt) || r2.ExpiresAt.Sub(r2.AcquiredAt) < 20*time.Second {
		t.Errorf("acquiring again with a 20 s TTL: ExpiresAt %v (was %v, acquired %v), want renewed to 20 s from now",
			r2.ExpiresAt, r1.ExpiresAt, r2.AcquiredAt)
	}
	got, found, err := l.Get(ctx, key)
	fatalIf(t, "Get", err)
	if !found || !sameLock(got, r2) {
		t.Errorf("Get = %+v found=%v, want %+v", got, found, r2)
	}
	other, ok, err := l.Acquire(ctx, key, "bob", 10*time.Second)
	fatalIf(t, "Acquire by another owner", err)
	if ok {
		t.Fatal("another owner acquired a held lock")
	}
	if !sameLock(other, r2) {
		t.Errorf("the refused Acquire reported holder %+v, want %+v", other, r2)
	}
	r3, ok, err := l.Refresh(ctx, key, "alice", r1.Token, 60*time.Second)
	fatalIf(t, "Refresh", err)
	if !ok {
		t.Fatal("Refresh by the holder: not ok")
	}
	checkLockRecord(t, "Refresh", r3, key, "alice")
	if r3.Token != r1.Token || !r3.AcquiredAt.Equal(r1.AcquiredAt) {
		t.Errorf("Refresh changed the token or AcquiredAt: %+v, was %+v", r3, r1)
	}
	if r3.ExpiresAt.Sub(r2.ExpiresAt) < 30*time.Second {
		t.Errorf("Refresh to 60 s moved ExpiresAt only from %v to %v", r2.ExpiresAt, r3.ExpiresAt)
	}
}

// lockTTLPrecision: TTLs are kept to the millisecond, never rounded to
// seconds.
func (s *suite) lockTTLPrecision(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	l := st.Locks()
	for _, ttl := range []time.Duration{1234 * time.Millisecond, 999 * time.Millisecond, 61001 * time.Millisecond} {
		key := fmt.Sprintf("ttl-%d", ttl.Milliseconds())
		rec, ok, err := l.Acquire(ctx, key, "owner", ttl)
		fatalIf(t, "Acquire", err)
		if !ok {
			t.Fatalf("Acquire %s: not acquired", key)
		}
		checkLockRecord(t, "Acquire", rec, key, "owner")
		if d := rec.ExpiresAt.Sub(rec.AcquiredAt); d != ttl {
			t.Errorf("Acquire with TTL %v: ExpiresAt-AcquiredAt = %v, want exactly %v", ttl, d, ttl)
		}
	}

	const key = "precision"
	var r1, r2, r3 driver.LockRecord
	var ok1, ok2, ok3 bool
	var err1, err2, err3 error
	a := timed(func() { r1, ok1, err1 = l.Acquire(ctx, key, "owner", 1234*time.Millisecond) })
	b := timed(func() { r2, ok2, err2 = l.Refresh(ctx, key, "owner", r1.Token, 2345*time.Millisecond) })
	c := timed(func() { r3, ok3, err3 = l.Acquire(ctx, key, "owner", 1777*time.Millisecond) })
	fatalIf(t, "Acquire", err1)
	fatalIf(t, "Refresh", err2)
	fatalIf(t, "Acquire again", err3)
	if !ok1 || !ok2 || !ok3 {
		t.Fatalf("Acquire, Refresh, Acquire again by the holder: ok = %v, %v, %v", ok1, ok2, ok3)
	}
	checkTime(t, "Refresh: ExpiresAt", r2.ExpiresAt)
	checkTime(t, "Acquire again: ExpiresAt", r3.ExpiresAt)
	checkDelta(t, "Refresh 2345 ms after Acquire 1234 ms", r2.ExpiresAt.Sub(r1.ExpiresAt), 1111*time.Millisecond, a, b)
	checkDelta(t, "Acquire again 1777 ms after Refresh 2345 ms", r3.ExpiresAt.Sub(r2.ExpiresAt), -568*time.Millisecond, b, c)
}

// lockExpiry: a lock with a short TTL cannot be taken before it expires and
// is taken over at once after.
func (s *suite) lockExpiry(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	l := st.Locks()
	timing(t, 150*time.Millisecond, func(ttl time.Duration) bool {
		key := fmt.Sprintf("expiry-%d", ttl.Milliseconds())
		var ra driver.LockRecord
		var ok bool
		var err error
		a := timed(func() { ra, ok, err = l.Acquire(ctx, key, "alice", ttl) })
		fatalIf(t, "Acquire", err)
		if !ok {
			t.Fatal("Acquire of a free key: not acquired")
		}
		rb, ok, err := l.Acquire(ctx, key, "bob", ttl)
		tb := time.Now()
		fatalIf(t, "Acquire by another owner", err)
		if ok {
			if early(a.start, ttl, tb) {
				t.Errorf("bob acquired %s %v after alice did with a %v TTL: expired early", key, tb.Sub(a.start), ttl)
				return true
			}
			return false
		}
		if rb.Owner != "alice" || rb.Token != ra.Token {
			t.Errorf("refused Acquire reported holder %q token %d, want alice token %d", rb.Owner, rb.Token, ra.Token)
		}
		if d := ra.ExpiresAt.Sub(ra.AcquiredAt); d != ttl {
			t.Errorf("ExpiresAt-AcquiredAt = %v, want %v", d, ttl)
		}

		sleepUntil(t, ctx, a.end.Add(ttl+50*time.Millisecond))
		if _, found, err := l.Get(ctx, key); err != nil || found {
			t.Errorf("Get of an expired lock: found=%v err=%v, want absent", found, err)
		}
		if recs, err := l.List(ctx, globEscape(key)); err != nil || len(recs) != 0 {
			t.Errorf("List of an expired lock: %d records, err %v; want none", len(recs), err)
		}
		// The very first attempt after expiry must succeed: no waiting for
		// a TTL monitor or garbage collection.
		rb, ok, err = l.Acquire(ctx, key, "bob", 10*time.Second)
		fatalIf(t, "Acquire after expiry", err)
		if !ok {
			t.Errorf("Acquire %v after alice's %v lock expired: not acquired (holder %q, expires %v): expired locks must be taken over at once",
				time.Since(a.end), ttl, rb.Owner, rb.ExpiresAt)
			return true
		}
		checkLockRecord(t, "takeover", rb, key, "bob")
		if rb.Token <= ra.Token {
			t.Errorf("takeover token %d is not above the expired holding's %d", rb.Token, ra.Token)
		}
		if rb.AcquiredAt.Before(ra.ExpiresAt) {
			t.Errorf("takeover AcquiredAt %v is before the expired holding's ExpiresAt %v (store clock)", rb.AcquiredAt, ra.ExpiresAt)
		}
		if _, ok, err := l.Refresh(ctx, key, "alice", ra.Token, ttl); err != nil || ok {
			t.Errorf("Refresh by the expired holder after a takeover: ok=%v err=%v, want refused", ok, err)
		}
		if ok, err := l.Release(ctx, key, "alice", ra.Token); err != nil || ok {
			t.Errorf("Release by the expired holder after a takeover: ok=%v err=%v, want refused", ok, err)
		}
		if _, ok, err := l.Acquire(ctx, key, "alice", ttl); err != nil || ok {
			t.Errorf("Acquire by alice while bob holds it: ok=%v err=%v, want refused", ok, err)
		}
		got, found, err := l.Get(ctx, key)
		if err != nil || !found || got.Owner != "bob" || got.Token != rb.Token {
			t.Errorf("after the takeover Get = %+v found=%v err=%v, want bob's holding", got, found, err)
		}
		return true
	})
}

// lockReleaseAfterExpiry: an expired holding nobody took over can still be
// released by its holder, but not refreshed.
func (s *suite) lockReleaseAfterExpiry(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	l := st.Locks()
	const key = "lapsed"
	const ttl = 100 * time.Millisecond
	var rec driver.LockRecord
	var ok bool
	var err error
	a := timed(func() { rec, ok, err = l.Acquire(ctx, key, "alice", ttl) })
	fatalIf(t, "Acquire", err)
	if !ok {
		t.Fatal("Acquire of a free key: not acquired")
	}
	sleepUntil(t, ctx, a.end.Add(ttl+50*time.Millisecond))
	if _, ok, err := l.Refresh(ctx, key, "alice", rec.Token, time.Second); err != nil || ok {
		t.Errorf("Refresh of an expired holding: ok=%v err=%v, want refused", ok, err)
	}
	if ok, err := l.Release(ctx, key, "alice", rec.Token); err != nil || !ok {
		t.Errorf("Release of an expired holding nobody took over: ok=%v err=%v, want released", ok, err)
	}
	if ok, err := l.Release(ctx, key, "alice", rec.Token); err != nil || ok {
		t.Errorf("second Release: ok=%v err=%v, want refused", ok, err)
	}
	rb, ok, err := l.Acquire(ctx, key, "bob", time.Second)
	if err != nil || !ok || rb.Token <= rec.Token {
		t.Errorf("Acquire after release: ok=%v err=%v token %d (previous %d)", ok, err, rb.Token, rec.Token)
	}
}

// lockNotOwner: refresh and release by a non-owner or with a stale token
// are refused without error and change nothing.
func (s *suite) lockNotOwner(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	l := st.Locks()
	const key = "owned"
	rec, ok, err := l.Acquire(ctx, key, "alice", 30*time.Second)
	fatalIf(t, "Acquire", err)
	if !ok {
		t.Fatal("Acquire of a free key: not acquired")
	}
	attempts := []struct {
		what  string
		owner string
		token int64
	}{
		{"another owner with the holder's token", "bob", rec.Token},
		{"the holder with a greater token", "alice", rec.Token + 1},
		{"the holder with a smaller token", "alice", rec.Token - 1},
		{"another owner with another token", "bob", rec.Token + 7},
		{"an owner differing in case", "Alice", rec.Token},
	}
	for _, a := range attempts {
		if _, ok, err := l.Refresh(ctx, key, a.owner, a.token, time.Hour); err != nil || ok {
			t.Errorf("Refresh by %s: ok=%v err=%v, want ok=false and no error", a.what, ok, err)
		}
		if ok, err := l.Release(ctx, key, a.owner, a.token); err != nil || ok {
			t.Errorf("Release by %s: ok=%v err=%v, want ok=false and no error", a.what, ok, err)
		}
	}
	if ok, err := l.Release(ctx, "never-held", "alice", rec.Token); err != nil || ok {
		t.Errorf("Release of a key never held: ok=%v err=%v, want ok=false and no error", ok, err)
	}
	if _, ok, err := l.Refresh(ctx, "never-held", "alice", rec.Token, time.Second); err != nil || ok {
		t.Errorf("Refresh of a key never held: ok=%v err=%v, want ok=false and no error", ok, err)
	}
	got, found, err := l.Get(ctx, key)
	fatalIf(t, "Get", err)
	if !found || !sameLock(got, rec) {
		t.Errorf("after refused refreshes and releases Get = %+v found=%v, want the holding unchanged: %+v", got, found, rec)
	}
	if ok, err := l.Release(ctx, key, "alice", rec.Token); err != nil || !ok {
		t.Errorf("Release by the holder: ok=%v err=%v", ok, err)
	}
	if ok, err := l.Release(ctx, key, "alice", rec.Token); err != nil || ok {
		t.Errorf("Release of a released lock: ok=%v err=%v, want ok=false", ok, err)
	}
	if _, ok, err := l.Refresh(ctx, key, "alice", rec.Token, time.Second); err != nil || ok {
		t.Errorf("Refresh of a released lock: ok=%v err=%v, want ok=false", ok, err)
	}
	if _, found, err := l.Get(ctx, key); err != nil || found {
		t.Errorf("Get of a released lock: found=%v err=%v", found, err)
	}
}

// lockFencing: tokens strictly increase across acquire, release, expiry
// and takeover, force-release, a new connection and re-acquire.
func (s *suite) lockFencing(t *testing.T) {
	ctx := testCtx(t)
	st, prefix := s.open(t)
	l := st.Locks()
	const key = "fenced"
	var tokens []int64
	var steps []string
	acquire := func(l *warden.Locks, owner string, ttl time.Duration, step string) driver.LockRecord {
		t.Helper()
		rec, ok, err := l.Acquire(ctx, key, owner, ttl)
		fatalIf(t, step, err)
		if !ok {
			t.Fatalf("%s: not acquired (holder %q)", step, rec.Owner)
		}
		tokens = append(tokens, rec.Token)
		steps = append(steps, step)
		return rec
	}
	release := func(l *warden.Locks, rec driver.LockRecord) {
		t.Helper()
		if ok, err := l.Release(ctx, key, rec.Owner, rec.Token); err != nil || !ok {
			t.Fatalf("Release by %s: ok=%v err=%v", rec.Owner, ok, err)
		}
	}

	r := acquire(l, "a", time.Minute, "first acquire")
	release(l, r)
	// The first holding lasts long enough for a slow server to answer the
	// re-acquire within it; the re-acquire shortens it to 100 ms.
	r = acquire(l, "b", 5*time.Second, "acquire after release")
	again := acquire(l, "b", 100*time.Millisecond, "re-acquire by the holder")
	if again.Token != r.Token {
		t.Errorf("re-acquire by the holder changed the token from %d to %d", r.Token, again.Token)
	}
	tokens, steps = tokens[:len(tokens)-1], steps[:len(steps)-1]
	sleepUntil(t, ctx, time.Now().Add(150*time.Millisecond))
	acquire(l, "c", time.Minute, "takeover after expiry")
	if ok, err := l.ForceRelease(ctx, key); err != nil || !ok {
		t.Fatalf("ForceRelease: ok=%v err=%v", ok, err)
	}
	r = acquire(l, "d", time.Minute, "acquire after force-release")
	release(l, r)

	// A new connection must continue from the stored state, not from a
	// counter kept in the client.
	st2 := s.openPrefix(t, prefix)
	r = acquire(st2.Locks(), "e", time.Minute, "acquire through a new connection")
	release(st2.Locks(), r)
	if err := st2.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	r = acquire(l, "a", time.Minute, "the first owner again")
	release(l, r)

	seen := map[int64]string{}
	for i, tok := range tokens {
		if prev, dup := seen[tok]; dup {
			t.Errorf("token %d handed out twice: %s and %s", tok, prev, steps[i])
		}
		seen[tok] = steps[i]
		if i > 0 && tok <= tokens[i-1] {
			t.Errorf("token of %q (%d) is not above the token of %q (%d)", steps[i], tok, steps[i-1], tokens[i-1])
		}
	}
}

// lockGetList: Get and List show only live holdings; List matches globs
// literally and sorts by key.
func (s *suite) lockGetList(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	l := st.Locks()
	live := []string{"a1", "a2", "b1", "a%1", "a_1", "a.1", "a*1", "a?1", "[a]1", "A1"}
	held := map[string]driver.LockRecord{}
	for i, key := range live {
		rec, ok, err := l.Acquire(ctx, key, fmt.Sprintf("owner-%d", i), time.Minute)
		fatalIf(t, "Acquire "+key, err)
		if !ok {
			t.Fatalf("Acquire %s: not acquired", key)
		}
		held[key] = rec
	}
	var okx bool
	var errx error
	a := timed(func() { _, okx, errx = l.Acquire(ctx, "a-expired", "owner-x", 100*time.Millisecond) })
	if errx != nil || !okx {
		t.Fatalf("Acquire a-expired: ok=%v err=%v", okx, errx)
	}
	rel, ok, err := l.Acquire(ctx, "a-released", "owner-y", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire a-released: ok=%v err=%v", ok, err)
	}
	if ok, err := l.Release(ctx, "a-released", "owner-y", rel.Token); err != nil || !ok {
		t.Fatalf("Release a-released: ok=%v err=%v", ok, err)
	}
	sleepUntil(t, ctx, a.end.Add(100*time.Millisecond+50*time.Millisecond))

	for key, want := range held {
		got, found, err := l.Get(ctx, key)
		if errorIf(t, "Get "+key, err) {
			continue
		}
		if !found || !sameLock(got, want) {
			t.Errorf("Get %q = %+v found=%v, want %+v", key, got, found, want)
		}
	}
	for _, key := range []string{"a-expired", "a-released", "never"} {
		if _, found, err := l.Get(ctx, key); err != nil || found {
			t.Errorf("Get %q: found=%v err=%v, want absent", key, found, err)
		}
	}
	for _, pattern := range []string{"*", "", "a*", "a?", "a%1", "a_1", "a.1", `a\*1`, `a\?1`, "a*1", "[a]*", "?1", "a-*", "A*", "a%", "a_"} {
		recs, err := l.List(ctx, pattern)
		if errorIf(t, "List "+pattern, err) {
			continue
		}
		var keys []string
		for _, rec := range recs {
			keys = append(keys, rec.Key)
			if want, ok := held[rec.Key]; !ok || !sameLock(rec, want) {
				t.Errorf("List %q returned %+v, want %+v", pattern, rec, want)
			}
		}
		sameKeys(t, fmt.Sprintf("List %q", pattern), keys, matching(live, pattern))
	}
}

// lockListPaging: List returns every holding, past any page size.
func (s *suite) lockListPaging(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	l := st.Locks()
	const n = 1050
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("page-%04d", i)
	}
	var errs errList
	parallel(8, func(g int) {
		for i := g; i < n; i += 8 {
			// An hour: the check is about paging, and acquiring a thousand
			// keys may take a minute on a slow test server (FerretDB scans
			// the collection for each upsert).
			if _, ok, err := l.Acquire(ctx, keys[i], "owner", time.Hour); err != nil || !ok {
				errs.add("Acquire %s: ok=%v err=%v", keys[i], ok, err)
			}
		}
	})
	errs.report(t, "Acquire")
	recs, err := l.List(ctx, "*")
	fatalIf(t, "List", err)
	got := make([]string, len(recs))
	for i, r := range recs {
		got[i] = r.Key
	}
	sameKeys(t, "List *", got, keys)
	recs, err = l.List(ctx, "page-10*")
	fatalIf(t, "List page-10*", err)
	got = got[:0]
	for _, r := range recs {
		got = append(got, r.Key)
	}
	sameKeys(t, "List page-10*", got, matching(keys, "page-10*"))
}

// lockForceRelease: ForceRelease ends any live holding; the holder can no
// longer refresh or release it; the next holder gets a greater token.
func (s *suite) lockForceRelease(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	l := st.Locks()
	const key = "forced"
	if ok, err := l.ForceRelease(ctx, key); err != nil || ok {
		t.Errorf("ForceRelease of a key never held: ok=%v err=%v, want ok=false", ok, err)
	}
	rec, ok, err := l.Acquire(ctx, key, "alice", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire: ok=%v err=%v", ok, err)
	}
	if ok, err := l.ForceRelease(ctx, key); err != nil || !ok {
		t.Fatalf("ForceRelease of a held lock: ok=%v err=%v", ok, err)
	}
	if _, found, err := l.Get(ctx, key); err != nil || found {
		t.Errorf("Get after ForceRelease: found=%v err=%v", found, err)
	}
	if ok, err := l.ForceRelease(ctx, key); err != nil || ok {
		t.Errorf("second ForceRelease: ok=%v err=%v, want ok=false", ok, err)
	}
	if _, ok, err := l.Refresh(ctx, key, "alice", rec.Token, time.Minute); err != nil || ok {
		t.Errorf("Refresh by the force-released holder: ok=%v err=%v, want refused", ok, err)
	}
	if ok, err := l.Release(ctx, key, "alice", rec.Token); err != nil || ok {
		t.Errorf("Release by the force-released holder: ok=%v err=%v, want refused", ok, err)
	}
	rb, ok, err := l.Acquire(ctx, key, "bob", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire after ForceRelease: ok=%v err=%v", ok, err)
	}
	if rb.Token <= rec.Token {
		t.Errorf("token after ForceRelease %d is not above %d", rb.Token, rec.Token)
	}
	// An expired holding is not live: ForceRelease reports false.
	_, ok, err = l.Acquire(ctx, "forced-expired", "carol", 50*time.Millisecond)
	if err != nil || !ok {
		t.Fatalf("Acquire forced-expired: ok=%v err=%v", ok, err)
	}
	sleepUntil(t, ctx, time.Now().Add(100*time.Millisecond))
	if ok, err := l.ForceRelease(ctx, "forced-expired"); err != nil || ok {
		t.Errorf("ForceRelease of an expired holding: ok=%v err=%v, want ok=false (none live)", ok, err)
	}
	keys, err := l.List(ctx, "*")
	fatalIf(t, "List", err)
	if len(keys) != 1 || keys[0].Key != key || keys[0].Owner != "bob" || slices.ContainsFunc(keys, func(r driver.LockRecord) bool { return r.Owner == "alice" }) {
		t.Errorf("List after force-releases = %+v, want only bob's holding", keys)
	}
}
