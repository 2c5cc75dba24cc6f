package mongo_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden/store/mongo"
)

// TestAcquireTokensAndExclusion walks the acquire's steps (the
// findOneAndUpdate with upsert, the E11000 fallback's read, the renewal of
// the caller's own holding, the token compare-and-swap): token order
// within and across milliseconds, takeover of an expired holding, and
// exclusion among concurrent acquirers.
func TestAcquireTokensAndExclusion(t *testing.T) {
	db := testDB(t, nil)
	prefix := fmt.Sprintf("acquire-%d:", time.Now().UnixNano())
	st, err := mongo.New(db, &mongo.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cleanNamespace(t, prefix, mongo.Collections{})
	ctx := t.Context()
	lk := st.Driver().Locks()

	first, ok, err := lk.Acquire(ctx, "k", "a", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire: ok=%v err=%v", ok, err)
	}
	if _, ok, err := lk.Acquire(ctx, "k", "b", time.Minute); err != nil || ok {
		t.Fatalf("Acquire of a held lock: ok=%v err=%v", ok, err)
	}
	again, ok, err := lk.Acquire(ctx, "k", "a", time.Minute)
	if err != nil || !ok || again.Token != first.Token {
		t.Fatalf("re-acquire by the holder: ok=%v err=%v token %d, want %d", ok, err, again.Token, first.Token)
	}
	if ok, err := lk.Release(ctx, "k", "a", first.Token); err != nil || !ok {
		t.Fatalf("Release: ok=%v err=%v", ok, err)
	}
	// Within the same millisecond or not, the next holding's token is
	// greater (candidate or compare-and-swap).
	last := first.Token
	for i := range 20 {
		r, ok, err := lk.Acquire(ctx, "k", fmt.Sprint("o", i), time.Minute)
		if err != nil || !ok || r.Token <= last {
			t.Fatalf("acquire %d: ok=%v err=%v token %d after %d", i, ok, err, r.Token, last)
		}
		last = r.Token
		if ok, err := lk.Release(ctx, "k", r.Owner, r.Token); err != nil || !ok {
			t.Fatalf("Release %d: ok=%v err=%v", i, ok, err)
		}
	}
	// An expired holding is taken over at once.
	if _, ok, err := lk.Acquire(ctx, "e", "a", time.Millisecond); err != nil || !ok {
		t.Fatalf("Acquire: ok=%v err=%v", ok, err)
	}
	time.Sleep(3 * time.Millisecond)
	if _, ok, err := lk.Acquire(ctx, "e", "b", time.Minute); err != nil || !ok {
		t.Fatalf("takeover of an expired holding: ok=%v err=%v", ok, err)
	}

	// Concurrent acquirers: at most one holder at a time, tokens strictly
	// increasing in the order of the holdings.
	var mu sync.Mutex
	inside, holdings := 0, 0
	var tokens []int64
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			owner := fmt.Sprint("w", g)
			for got := 0; got < 4; {
				r, ok, err := lk.Acquire(ctx, "shared", owner, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					continue
				}
				got++
				mu.Lock()
				inside++
				if inside > 1 {
					t.Errorf("two holders at once")
				}
				if n := len(tokens); n > 0 && r.Token <= tokens[n-1] {
					t.Errorf("token %d after %d", r.Token, tokens[n-1])
				}
				tokens = append(tokens, r.Token)
				holdings++
				mu.Unlock()
				time.Sleep(time.Millisecond) // hold it a moment
				mu.Lock()
				inside--
				mu.Unlock()
				if ok, err := lk.Release(ctx, "shared", owner, r.Token); err != nil || !ok {
					t.Errorf("Release: ok=%v err=%v", ok, err)
				}
			}
		})
	}
	wg.Wait()
	if holdings != 24 {
		t.Errorf("%d holdings, want 24", holdings)
	}
}
