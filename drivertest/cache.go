package drivertest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

func (s *suite) cache(t *testing.T) {
	group(t, []check{
		{"Basic", s.cacheBasic},
		{"TTL", s.cacheTTL},
		{"TTLPrecision", s.cacheTTLPrecision},
		{"SetIfAbsent", s.cacheSetIfAbsent},
		{"Clear", s.cacheClear},
		{"KeysPaging", s.cacheKeysPaging},
		{"Values", s.cacheValues},
		{"ValueTooLarge", s.valueTooLarge},
	})
}

// valueCase is a value that must round-trip byte for byte.
type valueCase struct {
	name string
	v    []byte
}

// valueCases are values stores tend to mangle: empty, binary, invalid
// UTF-8, JSON that a JSON column would normalise, text with line ends.
func valueCases(max int) []valueCase {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	cases := []valueCase{
		{"nil", nil},
		{"empty", []byte{}},
		{"zero byte", []byte{0}},
		{"all bytes", all},
		{"zeros", make([]byte, 1000)},
		{"invalid UTF-8", []byte("\xff\xfe\xfd\xc3")},
		{"JSON with spacing and key order", []byte(`{"b": 1,  "a":[1.0, 2e3, 1.10], "s":"\u00e9", "a":2}`)},
		{"JSON number", []byte("1.0")},
		{"JSON string", []byte(`"x"`)},
		{"JSON null", []byte("null")},
		{"not JSON", []byte("{not json")},
		{"text", []byte("hello, 世界 😀")},
		{"line ends", []byte("a\r\nb\rc\n")},
		{"trailing spaces", []byte("value   ")},
		{"BOM", []byte("\xef\xbb\xbfx")},
	}
	if max >= 1<<20 {
		big := make([]byte, 1<<20)
		r := rand.NewChaCha8([32]byte{1, 2, 3})
		_, _ = r.Read(big)
		cases = append(cases, valueCase{"1 MiB random", big})
	}
	return cases
}

// wantValue compares a value read back with the one written.
func wantValue(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		g, w := got, want
		if len(g) > 40 {
			g = g[:40]
		}
		if len(w) > 40 {
			w = w[:40]
		}
		t.Errorf("%s: value %q (%d bytes), want %q (%d bytes)", what, g, len(got), w, len(want))
	}
}

// cacheBasic: Get, Set, Delete, Has.
func (s *suite) cacheBasic(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Cache()
	if _, found, err := c.Get(ctx, "k"); err != nil || found {
		t.Errorf("Get of an absent key: found=%v err=%v", found, err)
	}
	if ok, err := c.Has(ctx, "k"); err != nil || ok {
		t.Errorf("Has of an absent key: %v err=%v", ok, err)
	}
	if ok, err := c.Delete(ctx, "k"); err != nil || ok {
		t.Errorf("Delete of an absent key: ok=%v err=%v", ok, err)
	}
	fatalIf(t, "Set", c.Set(ctx, "k", []byte("v1"), 0))
	e, found, err := c.Get(ctx, "k")
	fatalIf(t, "Get", err)
	if !found || e.Key != "k" || !e.ExpiresAt.IsZero() {
		t.Errorf("Get after Set without TTL = %+v found=%v; want key k, no expiry", e, found)
	}
	wantValue(t, "Get after Set", e.Value, []byte("v1"))
	if ok, err := c.Has(ctx, "k"); err != nil || !ok {
		t.Errorf("Has after Set: %v err=%v", ok, err)
	}
	fatalIf(t, "Set again", c.Set(ctx, "k", []byte("v2"), 0))
	e, _, err = c.Get(ctx, "k")
	fatalIf(t, "Get", err)
	wantValue(t, "Get after replacing", e.Value, []byte("v2"))
	fatalIf(t, "Set other", c.Set(ctx, "k2", []byte("other"), 0))
	keys, err := c.Keys(ctx, "*")
	fatalIf(t, "Keys", err)
	sameKeys(t, "Keys *", keys, []string{"k", "k2"})
	if ok, err := c.Delete(ctx, "k"); err != nil || !ok {
		t.Errorf("Delete: ok=%v err=%v", ok, err)
	}
	if _, found, err := c.Get(ctx, "k"); err != nil || found {
		t.Errorf("Get after Delete: found=%v err=%v", found, err)
	}
	if ok, err := c.Has(ctx, "k"); err != nil || ok {
		t.Errorf("Has after Delete: %v err=%v", ok, err)
	}
	if ok, err := c.Delete(ctx, "k"); err != nil || ok {
		t.Errorf("second Delete: ok=%v err=%v", ok, err)
	}
	e, found, err = c.Get(ctx, "k2")
	if err != nil || !found || string(e.Value) != "other" {
		t.Errorf("Delete of k touched k2: %+v found=%v err=%v", e, found, err)
	}
}

// cacheTTL: entries expire after their TTL, not before, and are treated as
// absent by every call at once; TTL 0 never expires.
func (s *suite) cacheTTL(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Cache()
	timing(t, 150*time.Millisecond, func(ttl time.Duration) bool {
		k := func(name string) string { return fmt.Sprintf("%s-%d", name, ttl.Milliseconds()) }
		var err error
		a := timed(func() { err = c.Set(ctx, k("short"), []byte("v"), ttl) })
		fatalIf(t, "Set", err)
		fatalIf(t, "Set", c.Set(ctx, k("forever"), []byte("v"), 0))
		fatalIf(t, "Set", c.Set(ctx, k("made-permanent"), []byte("v1"), ttl))
		fatalIf(t, "Set", c.Set(ctx, k("made-permanent"), []byte("v2"), 0))
		e, found, err := c.Get(ctx, k("short"))
		tb := time.Now()
		fatalIf(t, "Get", err)
		if !found {
			if early(a.start, ttl, tb) {
				t.Errorf("entry with a %v TTL gone after %v", ttl, tb.Sub(a.start))
				return true
			}
			return false
		}
		checkTime(t, "ExpiresAt", e.ExpiresAt)
		sleepUntil(t, ctx, a.end.Add(ttl+50*time.Millisecond))
		if _, found, err := c.Get(ctx, k("short")); err != nil || found {
			t.Errorf("Get after the TTL: found=%v err=%v, want absent", found, err)
		}
		if ok, err := c.Has(ctx, k("short")); err != nil || ok {
			t.Errorf("Has after the TTL: %v err=%v", ok, err)
		}
		keys, err := c.Keys(ctx, k("*"))
		fatalIf(t, "Keys", err)
		sameKeys(t, "Keys after the TTL", keys, []string{k("forever"), k("made-permanent")})
		if ok, err := c.Delete(ctx, k("short")); err != nil || ok {
			t.Errorf("Delete of an expired entry: ok=%v err=%v, want ok=false (no live entry)", ok, err)
		}
		e, found, err = c.Get(ctx, k("forever"))
		if err != nil || !found || !e.ExpiresAt.IsZero() {
			t.Errorf("entry without TTL: %+v found=%v err=%v", e, found, err)
		}
		e, found, err = c.Get(ctx, k("made-permanent"))
		if err != nil || !found || !e.ExpiresAt.IsZero() {
			t.Errorf("entry Set again without TTL: found=%v ExpiresAt %v err=%v; want kept, no expiry", found, e.ExpiresAt, err)
		} else {
			wantValue(t, "entry Set again without TTL", e.Value, []byte("v2"))
		}
		fatalIf(t, "Set", c.Set(ctx, k("expired-then-absent"), []byte("old"), time.Millisecond))
		sleepUntil(t, ctx, time.Now().Add(20*time.Millisecond))
		stored, err := c.SetIfAbsent(ctx, k("expired-then-absent"), []byte("new"), 0)
		if err != nil || !stored {
			t.Errorf("SetIfAbsent over an expired entry: stored=%v err=%v, want stored", stored, err)
		}
		return true
	})
}

// cacheTTLPrecision: cache TTLs are kept to the millisecond.
func (s *suite) cacheTTLPrecision(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Cache()
	var e1, e2 error
	// An hour plus milliseconds: a loaded machine cannot let them lapse
	// before the reads, and the milliseconds must survive.
	a := timed(func() { e1 = c.Set(ctx, "k1", []byte("v"), time.Hour+1234*time.Millisecond) })
	b := timed(func() { e2 = c.Set(ctx, "k2", []byte("v"), time.Hour+2345*time.Millisecond) })
	fatalIf(t, "Set", e1)
	fatalIf(t, "Set", e2)
	r1, f1, err := c.Get(ctx, "k1")
	fatalIf(t, "Get", err)
	r2, f2, err := c.Get(ctx, "k2")
	fatalIf(t, "Get", err)
	if !f1 || !f2 {
		t.Fatalf("entries with TTLs over a second not found right away: %v %v", f1, f2)
	}
	checkTime(t, "ExpiresAt", r1.ExpiresAt)
	checkTime(t, "ExpiresAt", r2.ExpiresAt)
	checkDelta(t, "cache TTL 2345 ms after 1234 ms", r2.ExpiresAt.Sub(r1.ExpiresAt), 1111*time.Millisecond, a, b)
}

// cacheSetIfAbsent: SetIfAbsent stores only into a free key, and among
// concurrent callers exactly one stores.
func (s *suite) cacheSetIfAbsent(t *testing.T) {
	ec := newErrorCap(t, "cacheSetIfAbsent")
	defer ec.done()
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Cache()
	stored, err := c.SetIfAbsent(ctx, "k", []byte("first"), 0)
	if err != nil || !stored {
		t.Fatalf("SetIfAbsent on a free key: stored=%v err=%v", stored, err)
	}
	stored, err = c.SetIfAbsent(ctx, "k", []byte("second"), 0)
	if err != nil || stored {
		ec.Errorf("SetIfAbsent on a set key: stored=%v err=%v", stored, err)
	}
	e, _, err := c.Get(ctx, "k")
	fatalIf(t, "Get", err)
	wantValue(t, "after a refused SetIfAbsent", e.Value, []byte("first"))

	const callers, keys = 16, 10
	for k := range keys {
		key := fmt.Sprintf("race-%d", k)
		won := make([]bool, callers)
		errs := make([]error, callers)
		parallel(callers, func(i int) {
			won[i], errs[i] = c.SetIfAbsent(ctx, key, []byte(fmt.Sprintf("value-%d", i)), time.Minute)
		})
		winner := -1
		for i := range callers {
			if errorIf(t, "SetIfAbsent", errs[i]) {
				continue
			}
			if won[i] {
				if winner >= 0 {
					ec.Errorf("%s: concurrent SetIfAbsent stored for both caller %d and %d", key, winner, i)
				}
				winner = i
			}
		}
		if winner < 0 {
			ec.Errorf("%s: no concurrent SetIfAbsent stored", key)
			continue
		}
		e, found, err := c.Get(ctx, key)
		if err != nil || !found {
			ec.Errorf("Get %s: found=%v err=%v", key, found, err)
			continue
		}
		wantValue(t, key+": the stored value", e.Value, []byte(fmt.Sprintf("value-%d", winner)))
	}
}

// cacheClear: Clear deletes the namespace's cache entries and nothing else:
// not another namespace's, not the namespace's other records.
func (s *suite) cacheClear(t *testing.T) {
	ctx := testCtx(t)
	a, _ := s.open(t)
	b, _ := s.open(t)
	keys := []string{"x1", "x2", "x3", "lock:x1", "*"}
	fill := func(st *warden.Store, tag string) {
		for _, k := range keys {
			fatalIf(t, "Set", st.Cache().Set(ctx, k, []byte(tag+k), 0))
		}
		if _, ok, err := st.Locks().Acquire(ctx, "x1", "owner-"+tag, time.Minute); err != nil || !ok {
			t.Fatalf("Acquire: ok=%v err=%v", ok, err)
		}
		if _, err := st.Circuits().RecordFailure(ctx, "x1", 10); err != nil {
			t.Fatal(err)
		}
		fatalIf(t, "idempotency Set", st.Idempotency().Set(ctx, "x1", []byte(tag), 0))
		if _, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "x1", Data: []byte(tag)}); err != nil || !ok {
			t.Fatalf("checkpoint Save: ok=%v err=%v", ok, err)
		}
	}
	fill(a, "a:")
	fill(b, "b:")
	n, err := a.Cache().Clear(ctx)
	fatalIf(t, "Clear", err)
	if n != int64(len(keys)) {
		t.Errorf("Clear returned %d, want %d", n, len(keys))
	}
	got, err := a.Cache().Keys(ctx, "*")
	fatalIf(t, "Keys", err)
	sameKeys(t, "Keys after Clear", got, nil)
	for _, k := range keys {
		if _, found, err := a.Cache().Get(ctx, k); err != nil || found {
			t.Errorf("Get %q after Clear: found=%v err=%v", k, found, err)
		}
	}
	for _, st := range []*warden.Store{a, b} {
		if rec, found, err := st.Locks().Get(ctx, "x1"); err != nil || !found {
			t.Errorf("cache Clear touched a lock record: found=%v err=%v %+v", found, err, rec)
		}
		if _, found, err := st.Circuits().Get(ctx, "x1"); err != nil || !found {
			t.Errorf("cache Clear touched a circuit record: found=%v err=%v", found, err)
		}
		if _, found, err := st.Idempotency().Get(ctx, "x1"); err != nil || !found {
			t.Errorf("cache Clear touched an idempotency record: found=%v err=%v", found, err)
		}
		if _, found, err := st.Checkpoints().Latest(ctx, "x1"); err != nil || !found {
			t.Errorf("cache Clear touched a checkpoint: found=%v err=%v", found, err)
		}
	}
	got, err = b.Cache().Keys(ctx, "*")
	fatalIf(t, "Keys", err)
	want := matching(keys, "*")
	sameKeys(t, "other namespace's Keys after Clear", got, want)
	for _, k := range keys {
		e, found, err := b.Cache().Get(ctx, k)
		if err != nil || !found {
			t.Errorf("other namespace's %q after Clear: found=%v err=%v", k, found, err)
			continue
		}
		wantValue(t, "other namespace's "+k, e.Value, []byte("b:"+k))
	}
	if n, err := a.Cache().Clear(ctx); err != nil || n != 0 {
		t.Errorf("second Clear: %d err=%v, want 0", n, err)
	}
}

// cacheKeysPaging: Keys and Clear see every entry, past any page size.
func (s *suite) cacheKeysPaging(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Cache()
	const n = 1100
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%04d", i)
	}
	var errs errList
	parallel(8, func(g int) {
		for i := g; i < n; i += 8 {
			if err := c.Set(ctx, keys[i], []byte{byte(i)}, 0); err != nil {
				errs.add("Set %s: %v", keys[i], err)
			}
		}
	})
	errs.report(t, "Set")
	got, err := c.Keys(ctx, "*")
	fatalIf(t, "Keys", err)
	sameKeys(t, "Keys *", got, keys)
	got, err = c.Keys(ctx, "k10*")
	fatalIf(t, "Keys", err)
	sameKeys(t, "Keys k10*", got, matching(keys, "k10*"))
	got, err = c.Keys(ctx, "k??9?")
	fatalIf(t, "Keys", err)
	sameKeys(t, "Keys k??9?", got, matching(keys, "k??9?"))
	cleared, err := c.Clear(ctx)
	fatalIf(t, "Clear", err)
	if cleared != n {
		t.Errorf("Clear returned %d, want %d", cleared, n)
	}
	got, err = c.Keys(ctx, "*")
	fatalIf(t, "Keys", err)
	sameKeys(t, "Keys after Clear", got, nil)
}

// cacheValues: values round-trip byte for byte.
func (s *suite) cacheValues(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Cache()
	for _, vc := range valueCases(st.Limits().MaxValueBytes) {
		if errorIf(t, "Set "+vc.name, c.Set(ctx, vc.name, vc.v, 0)) {
			continue
		}
		e, found, err := c.Get(ctx, vc.name)
		if errorIf(t, "Get "+vc.name, err) {
			continue
		}
		if !found {
			t.Errorf("Get %s: not found", vc.name)
			continue
		}
		wantValue(t, vc.name, e.Value, vc.v)
		key := "ifabsent " + vc.name
		if stored, err := c.SetIfAbsent(ctx, key, vc.v, time.Hour); err != nil || !stored {
			t.Errorf("SetIfAbsent %s: stored=%v err=%v", vc.name, stored, err)
			continue
		}
		e, _, err = c.Get(ctx, key)
		if !errorIf(t, "Get", err) {
			wantValue(t, "SetIfAbsent "+vc.name, e.Value, vc.v)
		}
	}
}

// valueTooLarge: a value over the store's limit is refused with
// ErrValueTooLarge in every capability and nothing is written; a value of
// exactly the limit is accepted.
func (s *suite) valueTooLarge(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	max := st.Limits().MaxValueBytes
	switch {
	case max <= 0:
		t.Fatalf("Limits().MaxValueBytes = %d: a store must declare the largest value it accepts", max)
	case max > 64<<20:
		t.Logf("Limits().MaxValueBytes = %d is over 64 MiB: the oversized writes are not tried", max)
		return
	}
	exact := bytes.Repeat([]byte("0123456789abcdef"), max/16+1)[:max]
	over := append(exact[:max:max], 'x')

	c := st.Cache()
	if !errorIf(t, "cache Set of exactly the limit", c.Set(ctx, "exact", exact, 0)) {
		e, found, err := c.Get(ctx, "exact")
		if err != nil || !found || !bytes.Equal(e.Value, exact) {
			t.Errorf("cache value of exactly the limit (%d bytes): found=%v err=%v, %d bytes back", max, found, err, len(e.Value))
		}
	}
	fatalIf(t, "Set", c.Set(ctx, "keep", []byte("small"), 0))
	wantErr(t, "cache Set over the limit", c.Set(ctx, "over", over, 0), warden.ErrValueTooLarge)
	wantErr(t, "cache Set over the limit on an existing key", c.Set(ctx, "keep", over, 0), warden.ErrValueTooLarge)
	_, err := c.SetIfAbsent(ctx, "over2", over, 0)
	wantErr(t, "cache SetIfAbsent over the limit", err, warden.ErrValueTooLarge)
	if _, found, err := c.Get(ctx, "over"); err != nil || found {
		t.Errorf("refused Set wrote something: found=%v err=%v", found, err)
	}
	if ok, err := c.Has(ctx, "over2"); err != nil || ok {
		t.Errorf("refused SetIfAbsent wrote something: %v err=%v", ok, err)
	}
	if e, _, err := c.Get(ctx, "keep"); err != nil || string(e.Value) != "small" {
		t.Errorf("refused Set changed the existing value: %d bytes, err=%v", len(e.Value), err)
	}

	id := st.Idempotency()
	if _, out, err := id.Claim(ctx, "exact", "owner", time.Minute, ""); err != nil || out != driver.Claimed {
		t.Fatalf("Claim: %v err=%v", out, err)
	}
	if ok, err := id.Complete(ctx, "exact", "owner", exact, 0); err != nil || !ok {
		t.Errorf("Complete with a result of exactly the limit: ok=%v err=%v", ok, err)
	} else if rec, _, err := id.Get(ctx, "exact"); err != nil || !bytes.Equal(rec.Result, exact) {
		t.Errorf("result of exactly the limit: %d bytes back, err=%v", len(rec.Result), err)
	}
	if _, out, err := id.Claim(ctx, "over", "owner", time.Minute, ""); err != nil || out != driver.Claimed {
		t.Fatalf("Claim: %v err=%v", out, err)
	}
	_, err = id.Complete(ctx, "over", "owner", over, 0)
	wantErr(t, "idempotency Complete over the limit", err, warden.ErrValueTooLarge)
	if rec, found, err := id.Get(ctx, "over"); err != nil || !found || rec.Status != driver.IdemPending {
		t.Errorf("refused Complete changed the claim: %+v found=%v err=%v", rec.Status, found, err)
	}
	wantErr(t, "idempotency Set over the limit", id.Set(ctx, "over-set", over, 0), warden.ErrValueTooLarge)
	if _, found, err := id.Get(ctx, "over-set"); err != nil || found {
		t.Errorf("refused idempotency Set wrote something: found=%v err=%v", found, err)
	}

	cp := st.Checkpoints()
	if saved, ok, err := cp.Save(ctx, driver.CheckpointInput{TaskID: "exact", Data: exact}); err != nil || !ok {
		t.Errorf("checkpoint Save of exactly the limit: ok=%v err=%v", ok, err)
	} else if got, found, err := cp.Load(ctx, saved.ID); err != nil || !found || !bytes.Equal(got.Data, exact) {
		t.Errorf("checkpoint data of exactly the limit: found=%v err=%v, %d bytes back", found, err, len(got.Data))
	}
	_, _, err = cp.Save(ctx, driver.CheckpointInput{TaskID: "over", Data: over})
	wantErr(t, "checkpoint Save over the limit", err, warden.ErrValueTooLarge)
	if cps, err := cp.List(ctx, "over"); err != nil || len(cps) != 0 {
		t.Errorf("refused checkpoint Save wrote %d checkpoints, err=%v", len(cps), err)
	}
}
