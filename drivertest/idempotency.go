package drivertest

import (
	"fmt"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
)

func (s *suite) idempotency(t *testing.T) {
	group(t, []check{
		{"ConcurrentClaim", s.idemConcurrentClaim},
		{"Complete", s.idemComplete},
		{"Reclaim", s.idemReclaim},
		{"Takeover", s.idemTakeover},
		{"Extend", s.idemExtend},
		{"Abandon", s.idemAbandon},
		{"Operators", s.idemOperators},
		{"Retention", s.idemRetention},
		{"Values", s.idemValues},
	})
}

// idemConcurrentClaim: among concurrent claimers exactly one runs the
// operation; the others see it in progress, then completed.
func (s *suite) idemConcurrentClaim(t *testing.T) {
	ec := newErrorCap(t, "idemConcurrentClaim")
	defer ec.done()
	ctx := testCtx(t)
	st, _ := s.open(t)
	id := st.Idempotency()
	const claimers, keys = 16, 10
	for k := range keys {
		key := fmt.Sprintf("request-%d", k)
		recs := make([]driver.IdemRecord, claimers)
		outs := make([]driver.ClaimOutcome, claimers)
		errs := make([]error, claimers)
		parallel(claimers, func(i int) {
			recs[i], outs[i], errs[i] = id.Claim(ctx, key, fmt.Sprintf("owner-%d", i), time.Minute, fmt.Sprintf("fp-%d", i))
		})
		winner := -1
		for i := range claimers {
			if errorIf(t, "Claim", errs[i]) {
				continue
			}
			switch outs[i] {
			case driver.Claimed:
				if winner >= 0 {
					ec.Errorf("%s: both owner-%d and owner-%d claimed it: duplicates would run", key, winner, i)
				}
				winner = i
			case driver.InProgress:
			default:
				ec.Errorf("%s: concurrent first claim answered %v, want claimed or in-progress", key, outs[i])
			}
		}
		if winner < 0 {
			ec.Errorf("%s: none of %d concurrent claimers got the claim", key, claimers)
			continue
		}
		owner := fmt.Sprintf("owner-%d", winner)
		w := recs[winner]
		if w.Key != key || w.Owner != owner || w.Status != driver.IdemPending || w.Fingerprint != fmt.Sprintf("fp-%d", winner) {
			ec.Errorf("%s: winner's record %+v", key, w)
		}
		checkTime(t, "claim ExpiresAt", w.ExpiresAt)
		checkTime(t, "claim CreatedAt", w.CreatedAt)
		for i := range claimers {
			if errs[i] == nil && outs[i] == driver.InProgress {
				r := recs[i]
				if r.Owner != owner || r.Status != driver.IdemPending || r.Fingerprint != w.Fingerprint || r.ExpiresAt.IsZero() {
					ec.Errorf("%s: in-progress answer shows owner %q status %s fingerprint %q expiry %v; want %s's pending claim", key, r.Owner, r.Status, r.Fingerprint, r.ExpiresAt, owner)
				}
			}
		}
		if ok, err := id.Complete(ctx, key, owner, []byte("result-"+key), 0); err != nil || !ok {
			ec.Errorf("%s: Complete by the claimant: ok=%v err=%v", key, ok, err)
			continue
		}
		parallel(claimers, func(i int) {
			recs[i], outs[i], errs[i] = id.Claim(ctx, key, fmt.Sprintf("late-%d", i), time.Minute, "")
		})
		for i := range claimers {
			if errorIf(t, "Claim", errs[i]) {
				continue
			}
			if outs[i] != driver.Completed {
				ec.Errorf("%s: claim after completion answered %v, want completed", key, outs[i])
				continue
			}
			wantValue(t, key+": stored result", recs[i].Result, []byte("result-"+key))
		}
	}
}

// idemComplete: only the claimant completes; afterwards every claim gets
// the result.
func (s *suite) idemComplete(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	id := st.Idempotency()
	const key = "pay-42"
	if _, found, err := id.Get(ctx, key); err != nil || found {
		t.Errorf("Get of a new key: found=%v err=%v", found, err)
	}
	if _, out, err := id.Claim(ctx, key, "alice", time.Minute, "fp"); err != nil || out != driver.Claimed {
		t.Fatalf("Claim: %v err=%v", out, err)
	}
	rec, found, err := id.Get(ctx, key)
	fatalIf(t, "Get", err)
	if !found || rec.Status != driver.IdemPending || rec.Owner != "alice" || rec.Fingerprint != "fp" {
		t.Errorf("Get of a pending claim = %+v found=%v", rec, found)
	}
	if ok, err := id.Complete(ctx, key, "bob", []byte("forged"), 0); err != nil || ok {
		t.Errorf("Complete by a non-claimant: ok=%v err=%v, want refused", ok, err)
	}
	if ok, err := id.Complete(ctx, "never-claimed", "bob", []byte("forged"), 0); err != nil || ok {
		t.Errorf("Complete of a key never claimed: ok=%v err=%v, want refused", ok, err)
	}
	if _, found, err := id.Get(ctx, "never-claimed"); err != nil || found {
		t.Errorf("refused Complete created a record: found=%v err=%v", found, err)
	}
	rec, out, err := id.Claim(ctx, key, "bob", time.Minute, "fp")
	if err != nil || out != driver.InProgress || rec.Owner != "alice" {
		t.Errorf("Claim by another while pending: %v owner %q err=%v, want in-progress by alice", out, rec.Owner, err)
	}
	result := []byte(`{"charged":42}`)
	if ok, err := id.Complete(ctx, key, "alice", result, 0); err != nil || !ok {
		t.Fatalf("Complete by the claimant: ok=%v err=%v", ok, err)
	}
	if ok, err := id.Complete(ctx, key, "alice", []byte("again"), 0); err != nil || ok {
		t.Errorf("second Complete: ok=%v err=%v, want refused (no longer pending)", ok, err)
	}
	if ok, err := id.Extend(ctx, key, "alice", time.Minute); err != nil || ok {
		t.Errorf("Extend after Complete: ok=%v err=%v, want refused", ok, err)
	}
	if ok, err := id.Abandon(ctx, key, "alice"); err != nil || ok {
		t.Errorf("Abandon after Complete: ok=%v err=%v, want refused", ok, err)
	}
	for _, owner := range []string{"bob", "alice"} {
		rec, out, err := id.Claim(ctx, key, owner, time.Minute, "fp")
		if err != nil || out != driver.Completed || rec.Status != driver.IdemCompleted {
			t.Errorf("Claim by %s after Complete: %v status %s err=%v, want completed", owner, out, rec.Status, err)
			continue
		}
		wantValue(t, "result", rec.Result, result)
	}
	rec, found, err = id.Get(ctx, key)
	fatalIf(t, "Get", err)
	if !found || rec.Status != driver.IdemCompleted || rec.Owner != "alice" || !rec.ExpiresAt.IsZero() || rec.Key != key {
		t.Errorf("Get after Complete without retention = %+v found=%v; want completed by alice, no expiry", rec, found)
	}
	wantValue(t, "Get result", rec.Result, result)
}

// idemReclaim: the claimant claiming again renews its lease, to the
// millisecond.
func (s *suite) idemReclaim(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	id := st.Idempotency()
	const key = "renew"
	var r1, r2 driver.IdemRecord
	var o1, o2 driver.ClaimOutcome
	var e1, e2 error
	a := timed(func() { r1, o1, e1 = id.Claim(ctx, key, "alice", 1234*time.Millisecond, "fp") })
	b := timed(func() { r2, o2, e2 = id.Claim(ctx, key, "alice", 2345*time.Millisecond, "fp") })
	fatalIf(t, "Claim", e1)
	fatalIf(t, "Claim again", e2)
	if o1 != driver.Claimed || o2 != driver.Claimed {
		t.Fatalf("Claim, Claim again by the claimant: %v, %v; want claimed twice", o1, o2)
	}
	checkTime(t, "ExpiresAt", r1.ExpiresAt)
	checkTime(t, "ExpiresAt", r2.ExpiresAt)
	checkDelta(t, "claim lease 2345 ms after 1234 ms", r2.ExpiresAt.Sub(r1.ExpiresAt), 1111*time.Millisecond, a, b)
	rec, out, err := id.Claim(ctx, key, "bob", time.Minute, "")
	if err != nil || out != driver.InProgress || rec.Owner != "alice" || !rec.ExpiresAt.Equal(r2.ExpiresAt) {
		t.Errorf("Claim by bob: %v owner %q expires %v err=%v; want in progress by alice until %v", out, rec.Owner, rec.ExpiresAt, err, r2.ExpiresAt)
	}
}

// idemTakeover: after the claimant's lease lapses, another claimer takes
// over and the old claimant can no longer complete.
func (s *suite) idemTakeover(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	id := st.Idempotency()
	timing(t, 150*time.Millisecond, func(lease time.Duration) bool {
		key := fmt.Sprintf("zombie-%d", lease.Milliseconds())
		var err error
		var out driver.ClaimOutcome
		a := timed(func() { _, out, err = id.Claim(ctx, key, "alice", lease, "fp") })
		fatalIf(t, "Claim", err)
		if out != driver.Claimed {
			t.Fatalf("Claim of a new key: %v", out)
		}
		rec, out, err := id.Claim(ctx, key, "bob", lease, "fp")
		tb := time.Now()
		fatalIf(t, "Claim by bob", err)
		if out != driver.InProgress {
			if early(a.start, lease, tb) {
				t.Errorf("bob's claim %v after alice's with a %v lease: %v, want in-progress", tb.Sub(a.start), lease, out)
				return true
			}
			return false
		}
		if rec.Owner != "alice" {
			t.Errorf("in-progress answer names %q, want alice", rec.Owner)
		}
		sleepUntil(t, ctx, a.end.Add(lease+50*time.Millisecond))
		if _, found, err := id.Get(ctx, key); err != nil || found {
			t.Errorf("Get of a lapsed claim: found=%v err=%v, want absent", found, err)
		}
		rec, out, err = id.Claim(ctx, key, "bob", time.Minute, "fp2")
		fatalIf(t, "Claim after the lease", err)
		if out != driver.TakenOver {
			t.Errorf("Claim after alice's lease lapsed: %v, want taken-over", out)
			return true
		}
		if rec.Owner != "bob" || rec.Status != driver.IdemPending {
			t.Errorf("taken-over record: owner %q status %s, want bob pending", rec.Owner, rec.Status)
		}
		if ok, err := id.Complete(ctx, key, "alice", []byte("late"), 0); err != nil || ok {
			t.Errorf("Complete by the lapsed claimant after a takeover: ok=%v err=%v, want refused", ok, err)
		}
		if ok, err := id.Extend(ctx, key, "alice", time.Minute); err != nil || ok {
			t.Errorf("Extend by the lapsed claimant after a takeover: ok=%v err=%v, want refused", ok, err)
		}
		if ok, err := id.Abandon(ctx, key, "alice"); err != nil || ok {
			t.Errorf("Abandon by the lapsed claimant after a takeover: ok=%v err=%v, want refused", ok, err)
		}
		if ok, err := id.Complete(ctx, key, "bob", []byte("bob's"), 0); err != nil || !ok {
			t.Errorf("Complete by the new claimant: ok=%v err=%v", ok, err)
		}
		rec, out, err = id.Claim(ctx, key, "carol", time.Minute, "")
		if err != nil || out != driver.Completed {
			t.Errorf("Claim after the takeover completed: %v err=%v", out, err)
		} else {
			wantValue(t, "result", rec.Result, []byte("bob's"))
		}
		return true
	})
}

// idemExtend: the claimant can extend its lease; nobody else can.
func (s *suite) idemExtend(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	id := st.Idempotency()
	const key = "long-job"
	const lease = 150 * time.Millisecond
	var out driver.ClaimOutcome
	var err error
	a := timed(func() { _, out, err = id.Claim(ctx, key, "alice", lease, "") })
	fatalIf(t, "Claim", err)
	if out != driver.Claimed {
		t.Fatalf("Claim: %v", out)
	}
	if ok, err := id.Extend(ctx, key, "alice", time.Minute); err != nil || !ok {
		t.Fatalf("Extend by the claimant: ok=%v err=%v", ok, err)
	}
	if ok, err := id.Extend(ctx, key, "bob", time.Minute); err != nil || ok {
		t.Errorf("Extend by a non-claimant: ok=%v err=%v, want refused", ok, err)
	}
	if ok, err := id.Extend(ctx, "never-claimed", "alice", time.Minute); err != nil || ok {
		t.Errorf("Extend of a key never claimed: ok=%v err=%v, want refused", ok, err)
	}
	sleepUntil(t, ctx, a.end.Add(lease+50*time.Millisecond))
	rec, out, err := id.Claim(ctx, key, "bob", time.Minute, "")
	if err != nil || out != driver.InProgress || rec.Owner != "alice" {
		t.Errorf("Claim after the original lease but within the extension: %v owner %q err=%v; want in progress by alice", out, rec.Owner, err)
	}
	if rec, found, err := id.Get(ctx, key); err != nil || !found || rec.Owner != "alice" {
		t.Errorf("Get within the extension: found=%v owner %q err=%v", found, rec.Owner, err)
	}
	if ok, err := id.Complete(ctx, key, "alice", []byte("done"), 0); err != nil || !ok {
		t.Errorf("Complete after Extend: ok=%v err=%v", ok, err)
	}
}

// idemAbandon: the claimant gives the key back; the next claim is a fresh
// one.
func (s *suite) idemAbandon(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	id := st.Idempotency()
	const key = "failed-job"
	if _, out, err := id.Claim(ctx, key, "alice", time.Minute, ""); err != nil || out != driver.Claimed {
		t.Fatalf("Claim: %v err=%v", out, err)
	}
	if ok, err := id.Abandon(ctx, key, "bob"); err != nil || ok {
		t.Errorf("Abandon by a non-claimant: ok=%v err=%v, want refused", ok, err)
	}
	if rec, found, err := id.Get(ctx, key); err != nil || !found || rec.Owner != "alice" {
		t.Errorf("after a refused Abandon: found=%v owner %q err=%v", found, rec.Owner, err)
	}
	if ok, err := id.Abandon(ctx, key, "alice"); err != nil || !ok {
		t.Errorf("Abandon by the claimant: ok=%v err=%v", ok, err)
	}
	if _, found, err := id.Get(ctx, key); err != nil || found {
		t.Errorf("Get after Abandon: found=%v err=%v", found, err)
	}
	if ok, err := id.Abandon(ctx, key, "alice"); err != nil || ok {
		t.Errorf("second Abandon: ok=%v err=%v", ok, err)
	}
	rec, out, err := id.Claim(ctx, key, "bob", time.Minute, "")
	if err != nil || out != driver.Claimed || rec.Owner != "bob" {
		t.Errorf("Claim after Abandon: %v owner %q err=%v; want claimed by bob", out, rec.Owner, err)
	}
}

// idemOperators: Set, Get, Delete, List.
func (s *suite) idemOperators(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	id := st.Idempotency()
	fatalIf(t, "Set", id.Set(ctx, "op-1", []byte("r1"), 0))
	rec, found, err := id.Get(ctx, "op-1")
	fatalIf(t, "Get", err)
	if !found || rec.Status != driver.IdemCompleted || rec.Key != "op-1" || !rec.ExpiresAt.IsZero() {
		t.Errorf("Get after Set = %+v found=%v", rec, found)
	}
	wantValue(t, "Get after Set", rec.Result, []byte("r1"))
	rec, out, err := id.Claim(ctx, "op-1", "alice", time.Minute, "")
	if err != nil || out != driver.Completed {
		t.Errorf("Claim after Set: %v err=%v, want completed", out, err)
	} else {
		wantValue(t, "Claim after Set", rec.Result, []byte("r1"))
	}
	fatalIf(t, "Set replacing", id.Set(ctx, "op-1", []byte("r2"), 0))
	rec, _, err = id.Get(ctx, "op-1")
	fatalIf(t, "Get", err)
	wantValue(t, "Get after replacing", rec.Result, []byte("r2"))

	if _, out, err := id.Claim(ctx, "op-2", "alice", time.Minute, ""); err != nil || out != driver.Claimed {
		t.Fatalf("Claim: %v err=%v", out, err)
	}
	fatalIf(t, "Set over a pending claim", id.Set(ctx, "op-2", []byte("forced"), 0))
	if rec, _, err := id.Get(ctx, "op-2"); err != nil || rec.Status != driver.IdemCompleted {
		t.Errorf("Set over a pending claim: status %s err=%v, want completed", rec.Status, err)
	}
	if ok, err := id.Complete(ctx, "op-2", "alice", []byte("late"), 0); err != nil || ok {
		t.Errorf("Complete after an operator's Set: ok=%v err=%v, want refused", ok, err)
	}
	if _, out, err := id.Claim(ctx, "other-3", "carol", time.Minute, ""); err != nil || out != driver.Claimed {
		t.Fatalf("Claim: %v err=%v", out, err)
	}
	keys := []string{"op-1", "op-2", "other-3"}
	for _, p := range []string{"*", "op-*", "op-?", "*3", "x*"} {
		recs, err := id.List(ctx, p)
		if errorIf(t, "List "+p, err) {
			continue
		}
		var got []string
		for _, r := range recs {
			got = append(got, r.Key)
			want, _, err := id.Get(ctx, r.Key)
			if err == nil && (want.Status != r.Status || want.Owner != r.Owner || string(want.Result) != string(r.Result)) {
				t.Errorf("List %q returned %+v, Get returns %+v", p, r, want)
			}
		}
		sameKeys(t, fmt.Sprintf("List %q", p), got, matching(keys, p))
	}
	if ok, err := id.Delete(ctx, "op-1"); err != nil || !ok {
		t.Errorf("Delete: ok=%v err=%v", ok, err)
	}
	if _, found, err := id.Get(ctx, "op-1"); err != nil || found {
		t.Errorf("Get after Delete: found=%v err=%v", found, err)
	}
	if ok, err := id.Delete(ctx, "op-1"); err != nil || ok {
		t.Errorf("second Delete: ok=%v err=%v", ok, err)
	}
	if ok, err := id.Delete(ctx, "other-3"); err != nil || !ok {
		t.Errorf("Delete of a pending claim: ok=%v err=%v", ok, err)
	}
	if _, out, err := id.Claim(ctx, "op-1", "dave", time.Minute, ""); err != nil || out != driver.Claimed {
		t.Errorf("Claim after Delete: %v err=%v, want claimed", out, err)
	}
}

// idemRetention: a completed result is kept for its retention, then
// treated as absent at once.
func (s *suite) idemRetention(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	id := st.Idempotency()

	var e1, e2 error
	a := timed(func() { e1 = id.Set(ctx, "p1", []byte("v"), 1234*time.Millisecond) })
	b := timed(func() { e2 = id.Set(ctx, "p2", []byte("v"), 2345*time.Millisecond) })
	fatalIf(t, "Set", e1)
	fatalIf(t, "Set", e2)
	r1, _, err := id.Get(ctx, "p1")
	fatalIf(t, "Get", err)
	r2, _, err := id.Get(ctx, "p2")
	fatalIf(t, "Get", err)
	checkTime(t, "ExpiresAt", r1.ExpiresAt)
	checkDelta(t, "retention 2345 ms after 1234 ms", r2.ExpiresAt.Sub(r1.ExpiresAt), 1111*time.Millisecond, a, b)

	timing(t, 150*time.Millisecond, func(retain time.Duration) bool {
		key := fmt.Sprintf("kept-%d", retain.Milliseconds())
		set := fmt.Sprintf("set-%d", retain.Milliseconds())
		if _, out, err := id.Claim(ctx, key, "alice", time.Minute, ""); err != nil || out != driver.Claimed {
			t.Fatalf("Claim: %v err=%v", out, err)
		}
		var ok bool
		var err error
		a := timed(func() { ok, err = id.Complete(ctx, key, "alice", []byte("r"), retain) })
		if err != nil || !ok {
			t.Fatalf("Complete: ok=%v err=%v", ok, err)
		}
		fatalIf(t, "Set", id.Set(ctx, set, []byte("r"), retain))
		_, found, err := id.Get(ctx, key)
		tb := time.Now()
		fatalIf(t, "Get", err)
		if !found {
			if early(a.start, retain, tb) {
				t.Errorf("result retained for %v gone after %v", retain, tb.Sub(a.start))
				return true
			}
			return false
		}
		sleepUntil(t, ctx, time.Now().Add(retain+50*time.Millisecond))
		for _, k := range []string{key, set} {
			if _, found, err := id.Get(ctx, k); err != nil || found {
				t.Errorf("Get %s after its retention: found=%v err=%v", k, found, err)
			}
		}
		recs, err := id.List(ctx, "*")
		fatalIf(t, "List", err)
		for _, r := range recs {
			if r.Key == key || r.Key == set {
				t.Errorf("List shows %s after its retention", r.Key)
			}
		}
		if ok, err := id.Delete(ctx, set); err != nil || ok {
			t.Errorf("Delete of a lapsed record: ok=%v err=%v, want ok=false", ok, err)
		}
		rec, out, err := id.Claim(ctx, key, "bob", time.Minute, "")
		if err != nil || out != driver.Claimed || rec.Owner != "bob" {
			t.Errorf("Claim after the retention: %v owner %q err=%v; want claimed (fresh) by bob", out, rec.Owner, err)
		}
		return true
	})
}

// idemValues: results round-trip byte for byte.
func (s *suite) idemValues(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	id := st.Idempotency()
	for _, vc := range valueCases(st.Limits().MaxValueBytes) {
		if _, out, err := id.Claim(ctx, vc.name, "owner", time.Minute, ""); err != nil || out != driver.Claimed {
			t.Errorf("Claim %s: %v err=%v", vc.name, out, err)
			continue
		}
		if ok, err := id.Complete(ctx, vc.name, "owner", vc.v, 0); err != nil || !ok {
			t.Errorf("Complete %s: ok=%v err=%v", vc.name, ok, err)
			continue
		}
		rec, found, err := id.Get(ctx, vc.name)
		if err != nil || !found {
			t.Errorf("Get %s: found=%v err=%v", vc.name, found, err)
			continue
		}
		wantValue(t, "Complete "+vc.name, rec.Result, vc.v)
		key := "set " + vc.name
		if errorIf(t, "Set", id.Set(ctx, key, vc.v, time.Hour)) {
			continue
		}
		rec, _, err = id.Get(ctx, key)
		if !errorIf(t, "Get", err) {
			wantValue(t, "Set "+vc.name, rec.Result, vc.v)
		}
	}
}
