package sqlite

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
)

func TestLockLifecycle(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	l := st.Locks()
	before := time.Now().Add(-time.Millisecond)

	rec, ok, err := l.Acquire(ctx, "job", "alice", 10*time.Second)
	if err != nil || !ok {
		t.Fatalf("Acquire: %v %v", ok, err)
	}
	if rec.Key != "job" || rec.Owner != "alice" || rec.Token <= 0 {
		t.Fatalf("record %+v", rec)
	}
	if rec.AcquiredAt.Before(before.Truncate(time.Millisecond)) || rec.AcquiredAt.Location() != time.UTC {
		t.Fatalf("AcquiredAt %v", rec.AcquiredAt)
	}
	if d := rec.ExpiresAt.Sub(rec.AcquiredAt); d != 10*time.Second {
		t.Fatalf("ExpiresAt - AcquiredAt = %v", d)
	}
	first := rec.Token

	// Someone else: not acquired, told who holds it.
	other, ok, err := l.Acquire(ctx, "job", "bob", time.Second)
	if err != nil || ok {
		t.Fatalf("second owner acquired: %v %v", ok, err)
	}
	if other.Owner != "alice" || other.Token != first {
		t.Fatalf("holder record %+v", other)
	}

	// Same owner again: refreshed, same token and acquisition time.
	again, ok, err := l.Acquire(ctx, "job", "alice", 20*time.Second)
	if err != nil || !ok || again.Token != first || !again.AcquiredAt.Equal(rec.AcquiredAt) || !again.ExpiresAt.After(rec.ExpiresAt) {
		t.Fatalf("re-acquire: %+v %v %v (first %+v)", again, ok, err, rec)
	}

	// Refresh with the wrong token or owner fails.
	if _, ok, err := l.Refresh(ctx, "job", "alice", first+1, time.Second); err != nil || ok {
		t.Fatalf("refresh with wrong token: %v %v", ok, err)
	}
	if _, ok, err := l.Refresh(ctx, "job", "bob", first, time.Second); err != nil || ok {
		t.Fatalf("refresh by non-holder: %v %v", ok, err)
	}
	ref, ok, err := l.Refresh(ctx, "job", "alice", first, 1500*time.Millisecond)
	if err != nil || !ok || ref.Token != first {
		t.Fatalf("Refresh: %+v %v %v", ref, ok, err)
	}

	got, found, err := l.Get(ctx, "job")
	if err != nil || !found || got.Owner != "alice" || got.Token != first || !got.ExpiresAt.Equal(ref.ExpiresAt) {
		t.Fatalf("Get: %+v %v %v", got, found, err)
	}

	// Release by a stranger or with a wrong token: not held.
	if ok, err := l.Release(ctx, "job", "bob", first); err != nil || ok {
		t.Fatalf("release by non-holder: %v %v", ok, err)
	}
	if ok, err := l.Release(ctx, "job", "alice", first+7); err != nil || ok {
		t.Fatalf("release with wrong token: %v %v", ok, err)
	}
	if ok, err := l.Release(ctx, "job", "alice", first); err != nil || !ok {
		t.Fatalf("Release: %v %v", ok, err)
	}
	if ok, err := l.Release(ctx, "job", "alice", first); err != nil || ok {
		t.Fatalf("second Release: %v %v", ok, err)
	}
	if _, found, err := l.Get(ctx, "job"); err != nil || found {
		t.Fatalf("Get after release: %v %v", found, err)
	}
	if _, ok, err := l.Refresh(ctx, "job", "alice", first, time.Second); err != nil || ok {
		t.Fatalf("refresh after release: %v %v", ok, err)
	}

	// The next holding, even by the same owner, has a greater token.
	next, ok, err := l.Acquire(ctx, "job", "alice", time.Second)
	if err != nil || !ok || next.Token <= first {
		t.Fatalf("acquire after release: %+v %v %v", next, ok, err)
	}
	bob, ok, err := func() (driver.LockRecord, bool, error) {
		if ok, err := l.ForceRelease(ctx, "job"); err != nil || !ok {
			return driver.LockRecord{}, ok, fmt.Errorf("ForceRelease: %v %v", ok, err)
		}
		return l.Acquire(ctx, "job", "bob", time.Second)
	}()
	if err != nil || !ok || bob.Token <= next.Token {
		t.Fatalf("acquire after force release: %+v %v %v", bob, ok, err)
	}
	if ok, err := l.ForceRelease(ctx, "nothing"); err != nil || ok {
		t.Fatalf("ForceRelease of a free key: %v %v", ok, err)
	}
	// The displaced holder cannot release bob's holding.
	if ok, err := l.Release(ctx, "job", "alice", next.Token); err != nil || ok {
		t.Fatalf("stale release: %v %v", ok, err)
	}
}

func TestLockFirstTokenFromClock(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	before := driver.TokenBase(time.Now())
	rec, ok, err := st.Locks().Acquire(ctx, "fresh", "o", time.Second)
	after := driver.TokenBase(time.Now())
	if err != nil || !ok || rec.Token < before || rec.Token > after {
		t.Fatalf("first token %d not in [%d, %d]: %v %v", rec.Token, before, after, ok, err)
	}
}

func TestLockExpiry(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	l := st.Locks()
	rec, ok, err := l.Acquire(ctx, "short", "alice", 30*time.Millisecond)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	// Millisecond TTLs are kept, not rounded to seconds.
	if d := rec.ExpiresAt.Sub(rec.AcquiredAt); d != 30*time.Millisecond {
		t.Fatalf("TTL stored as %v", d)
	}
	time.Sleep(time.Until(rec.ExpiresAt) + 5*time.Millisecond) // waiting for the TTL is the point
	if _, found, err := l.Get(ctx, "short"); err != nil || found {
		t.Fatalf("expired lock still live: %v %v", found, err)
	}
	if _, ok, err := l.Refresh(ctx, "short", "alice", rec.Token, time.Second); err != nil || ok {
		t.Fatalf("refresh of expired lock: %v %v", ok, err)
	}
	if list, err := l.List(ctx, ""); err != nil || len(list) != 0 {
		t.Fatalf("List shows expired lock: %v %v", list, err)
	}
	if ok, err := l.ForceRelease(ctx, "short"); err != nil || ok {
		t.Fatalf("ForceRelease of expired lock: %v %v", ok, err)
	}
	// The same owner re-acquiring an expired holding gets a new token.
	again, ok, err := l.Acquire(ctx, "short", "alice", time.Second)
	if err != nil || !ok || again.Token <= rec.Token {
		t.Fatalf("re-acquire after expiry: %+v %v %v", again, ok, err)
	}
	// The expired holder can no longer release.
	if ok, err := l.Release(ctx, "short", "alice", rec.Token); err != nil || ok {
		t.Fatalf("release of a taken-over holding: %v %v", ok, err)
	}

	// An expired holding not taken over may still be released by its holder.
	rec2, _, err := l.Acquire(ctx, "short2", "carol", 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(rec2.ExpiresAt) + 5*time.Millisecond)
	if ok, err := l.Release(ctx, "short2", "carol", rec2.Token); err != nil || !ok {
		t.Fatalf("release of own expired holding: %v %v", ok, err)
	}
	// Another owner takes an expired lock.
	rec3, _, err := l.Acquire(ctx, "short3", "dave", 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(rec3.ExpiresAt) + 5*time.Millisecond)
	erin, ok, err := l.Acquire(ctx, "short3", "erin", time.Second)
	if err != nil || !ok || erin.Token <= rec3.Token || erin.Owner != "erin" {
		t.Fatalf("takeover of expired lock: %+v %v %v", erin, ok, err)
	}
}

func TestLockKeysExact(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	l := st.Locks()
	keys := []string{"Key", "key", "KEY", "a%b", "a_b", "a*b", "a?b", "a[b]", `a\b`, "a.b", "a$b", `a"b`, "a'b", "a:b", "a#b", "a b", "ключ", "日本", "🔒"}
	for i, k := range keys {
		if _, ok, err := l.Acquire(ctx, k, fmt.Sprint("o", i), time.Minute); err != nil || !ok {
			t.Fatalf("Acquire(%q): %v %v", k, ok, err)
		}
	}
	for i, k := range keys {
		rec, found, err := l.Get(ctx, k)
		if err != nil || !found || rec.Key != k || rec.Owner != fmt.Sprint("o", i) {
			t.Fatalf("Get(%q): %+v %v %v", k, rec, found, err)
		}
	}
	all, err := l.List(ctx, "*")
	if err != nil || len(all) != len(keys) {
		t.Fatalf("List(*) = %d records, %v", len(all), err)
	}
	for i := 1; i < len(all); i++ {
		if all[i-1].Key >= all[i].Key {
			t.Fatalf("List not sorted: %q before %q", all[i-1].Key, all[i].Key)
		}
	}
	for _, c := range []struct {
		pattern string
		want    []string
	}{
		{"key", []string{"key"}},
		{"k*", []string{"key"}},
		{"K*", []string{"KEY", "Key"}},
		{"a_b", []string{"a_b"}},
		{"a%b", []string{"a%b"}},
		{`a\*b`, []string{"a*b"}},
		{`a\?b`, []string{"a?b"}},
		{"a[b]", []string{"a[b]"}},
		{`a\\b`, []string{`a\b`}},
		{"a?b", []string{"a b", `a"b`, "a#b", "a$b", "a%b", "a'b", "a*b", "a.b", "a:b", "a?b", `a\b`, "a_b"}},
		{"??", []string{"日本"}},
		{"?", []string{"🔒"}},
		{"ключ", []string{"ключ"}},
		{"nothing*", nil},
	} {
		got, err := l.List(ctx, c.pattern)
		if err != nil {
			t.Fatalf("List(%q): %v", c.pattern, err)
		}
		var keys []string
		for _, r := range got {
			keys = append(keys, r.Key)
		}
		if fmt.Sprint(keys) != fmt.Sprint(c.want) {
			t.Errorf("List(%q) = %q, want %q", c.pattern, keys, c.want)
		}
	}
}

func TestLockNamespaces(t *testing.T) {
	ctx := context.Background()
	stA, path := openTest(t, &Options{Prefix: "a:"})
	stB := openAt(t, path, &Options{Prefix: "b:"})
	if _, ok, err := stA.Locks().Acquire(ctx, "k", "alice", time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, ok, err := stB.Locks().Acquire(ctx, "k", "bob", time.Minute); err != nil || !ok {
		t.Fatalf("other namespace blocked: %v %v", ok, err)
	}
	if l, err := stA.Locks().List(ctx, ""); err != nil || len(l) != 1 || l[0].Owner != "alice" {
		t.Fatalf("List in a: %+v %v", l, err)
	}
	if ok, err := stB.Locks().ForceRelease(ctx, "k"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if r, found, err := stA.Locks().Get(ctx, "k"); err != nil || !found || r.Owner != "alice" {
		t.Fatalf("force release in b touched a: %+v %v %v", r, found, err)
	}
}

// TestLockConcurrentFirstAcquire: many goroutines race for a new key; exactly
// one wins and nobody gets an error.
func TestLockConcurrentFirstAcquire(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, nil)
	st2 := openAt(t, path, nil) // a second pool on the same file
	for round := 0; round < 5; round++ {
		key := fmt.Sprint("race-", round)
		var wg sync.WaitGroup
		var mu sync.Mutex
		winners := 0
		var errs []error
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := st
				if g%2 == 1 {
					s = st2
				}
				rec, ok, err := s.Locks().Acquire(ctx, key, fmt.Sprint("g", g), time.Minute)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				}
				if ok {
					winners++
				} else if rec.Owner == "" || rec.Token == 0 {
					errs = append(errs, fmt.Errorf("loser got no holder: %+v", rec))
				}
			}()
		}
		wg.Wait()
		if winners != 1 || len(errs) > 0 {
			t.Fatalf("round %d: %d winners, errors %v", round, winners, errs)
		}
	}
}

// TestLockTokensIncrease: tokens handed out for a key strictly increase
// across many holdings by concurrent owners.
func TestLockTokensIncrease(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	l := st.Locks()
	var mu sync.Mutex
	var tokens []int64
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprint("g", g)
			for n := 0; n < 20; {
				rec, ok, err := l.Acquire(ctx, "counter", owner, time.Minute)
				if err != nil {
					errc <- err
					return
				}
				if !ok {
					continue
				}
				mu.Lock()
				tokens = append(tokens, rec.Token)
				mu.Unlock()
				if ok, err := l.Release(ctx, "counter", owner, rec.Token); err != nil || !ok {
					errc <- fmt.Errorf("release: %v %v", ok, err)
					return
				}
				n++
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if len(tokens) != 160 {
		t.Fatalf("%d holdings", len(tokens))
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("token %d after %d", tokens[i], tokens[i-1])
		}
	}
}

func TestPurge(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, &Options{Prefix: "p:"})
	other := openAt(t, path, &Options{Prefix: "q:"})
	l := st.Locks()
	rec, _, err := l.Acquire(ctx, "released", "o", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := l.Release(ctx, "released", "o", rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, _, err := l.Acquire(ctx, "live", "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, _, err := other.Locks().Acquire(ctx, "x", "o", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := st.Cache().Set(ctx, "gone", []byte("v"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := st.Cache().Set(ctx, "kept", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	if err := other.Cache().Set(ctx, "gone", []byte("v"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := st.Idempotency().Set(ctx, "gone", []byte("r"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // let the 1 ms TTLs pass

	// A long retention keeps the released lock record.
	n, err := st.Purge(ctx, time.Hour)
	if err != nil || n != 2 {
		t.Fatalf("Purge(1h) = %d, %v; want 2 (cache + idempotency)", n, err)
	}
	n, err = st.Purge(ctx, time.Millisecond)
	if err != nil || n != 1 {
		t.Fatalf("Purge(1ms) = %d, %v; want 1 (released lock)", n, err)
	}
	// The live lock and the other namespace are untouched.
	if _, found, _ := l.Get(ctx, "live"); !found {
		t.Fatal("live lock purged")
	}
	db := st.Driver().(*store).db
	var cnt int
	db.QueryRow(`SELECT count(*) FROM go_goscope_locks WHERE key LIKE 'q:%'`).Scan(&cnt)
	if cnt != 1 {
		t.Fatalf("other namespace's lock purged (%d left)", cnt)
	}
	db.QueryRow(`SELECT count(*) FROM go_goscope_cache WHERE key LIKE 'q:%'`).Scan(&cnt)
	if cnt != 1 {
		t.Fatalf("other namespace's cache purged (%d left)", cnt)
	}
	// After a purge of the record, a new holding's token is still above
	// the old ones (the clock-based base).
	rec2, ok, err := l.Acquire(ctx, "released", "o", time.Minute)
	if err != nil || !ok || rec2.Token <= rec.Token {
		t.Fatalf("token after purge %d, before %d (%v %v)", rec2.Token, rec.Token, ok, err)
	}
}

// TestLockTokenNeverBackwards: a row another program rewrote (token 0, as
// go-go-scope's adapter leaves it) does not make the next token go back:
// it is at least the clock's token base.
func TestLockTokenNeverBackwards(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	l := st.Locks()
	first, ok, err := l.Acquire(ctx, "shared", "go", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	// The other program takes the lock only once it expired, at least a
	// millisecond after it was granted: the clock's token base has moved.
	for driver.TokenBase(time.Now()) <= first.Token {
		time.Sleep(time.Millisecond)
	}
	db := st.Driver().(*store).db
	if _, err := db.ExecContext(ctx, `UPDATE go_goscope_locks SET owner = 'node', token = 0, released_at = NULL, expires_at = 0 WHERE key = 'lock:shared'`); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := l.Acquire(ctx, "shared", "go", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if rec.Token <= first.Token {
		t.Fatalf("token went from %d to %d after another program's rewrite", first.Token, rec.Token)
	}
}

// TestLockTokensAfterForeignDelete: another program deleting the lock row
// right after each acquisition (as go-go-scope's cleanup and forceRelease
// do) never makes the next holder's token equal to or below the previous
// one, though the row is recreated within the same millisecond.
func TestLockTokensAfterForeignDelete(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	l := st.Locks()
	db := st.Driver().(*store).db
	var last int64
	for i := range 2000 {
		rec, ok, err := l.Acquire(ctx, "t", fmt.Sprint("go-", i), time.Minute)
		if err != nil || !ok {
			t.Fatalf("round %d: ok=%v err=%v", i, ok, err)
		}
		if rec.Token <= last {
			t.Fatalf("round %d: token %d after %d", i, rec.Token, last)
		}
		last = rec.Token
		if _, err := db.ExecContext(ctx, `DELETE FROM go_goscope_locks WHERE key = 'lock:t'`); err != nil {
			t.Fatal(err)
		}
	}
}
