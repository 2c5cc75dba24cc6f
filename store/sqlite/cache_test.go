package sqlite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
)

func TestCacheBasics(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	c := st.Cache()
	if _, found, err := c.Get(ctx, "k"); err != nil || found {
		t.Fatal(found, err)
	}
	bin := []byte{0, 1, 2, 0xFF, 0xFE, 0, 'x'}
	if err := c.Set(ctx, "k", bin, 0); err != nil {
		t.Fatal(err)
	}
	e, found, err := c.Get(ctx, "k")
	if err != nil || !found || !bytes.Equal(e.Value, bin) || !e.ExpiresAt.IsZero() || e.Key != "k" {
		t.Fatalf("Get: %+v %v %v", e, found, err)
	}
	// An empty value is a value, not absence.
	if err := c.Set(ctx, "empty", nil, 0); err != nil {
		t.Fatal(err)
	}
	e, found, err = c.Get(ctx, "empty")
	if err != nil || !found || e.Value == nil || len(e.Value) != 0 {
		t.Fatalf("empty value: %+v %v %v", e, found, err)
	}
	if ok, err := c.Has(ctx, "k"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if stored, err := c.SetIfAbsent(ctx, "k", []byte("other"), 0); err != nil || stored {
		t.Fatalf("SetIfAbsent over a live entry: %v %v", stored, err)
	}
	if stored, err := c.SetIfAbsent(ctx, "new", []byte("v"), time.Minute); err != nil || !stored {
		t.Fatalf("SetIfAbsent: %v %v", stored, err)
	}
	e, _, _ = c.Get(ctx, "new")
	if e.ExpiresAt.IsZero() || time.Until(e.ExpiresAt) > time.Minute {
		t.Fatalf("ExpiresAt %v", e.ExpiresAt)
	}
	if ok, err := c.Delete(ctx, "k"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ok, err := c.Delete(ctx, "k"); err != nil || ok {
		t.Fatal(ok, err)
	}
	if ok, err := c.Has(ctx, "k"); err != nil || ok {
		t.Fatal(ok, err)
	}
}

func TestCacheExpiry(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	c := st.Cache()
	if err := c.Set(ctx, "k", []byte("v"), 25*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	e, _, _ := c.Get(ctx, "k")
	time.Sleep(time.Until(e.ExpiresAt) + 5*time.Millisecond) // the TTL must pass
	if _, found, err := c.Get(ctx, "k"); err != nil || found {
		t.Fatalf("expired entry found: %v %v", found, err)
	}
	if ok, _ := c.Has(ctx, "k"); ok {
		t.Fatal("Has on expired entry")
	}
	if keys, _ := c.Keys(ctx, "*"); len(keys) != 0 {
		t.Fatalf("Keys shows expired entry: %q", keys)
	}
	if ok, err := c.Delete(ctx, "k"); err != nil || ok {
		t.Fatalf("Delete of expired entry reported live: %v %v", ok, err)
	}
	if err := c.Set(ctx, "k2", []byte("old"), 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	e, _, _ = c.Get(ctx, "k2")
	time.Sleep(time.Until(e.ExpiresAt) + 5*time.Millisecond)
	if stored, err := c.SetIfAbsent(ctx, "k2", []byte("new"), 0); err != nil || !stored {
		t.Fatalf("SetIfAbsent over an expired entry: %v %v", stored, err)
	}
	if e, _, _ := c.Get(ctx, "k2"); string(e.Value) != "new" {
		t.Fatalf("value %q", e.Value)
	}
}

func TestCacheClearAndKeysStayInNamespace(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, &Options{Prefix: "a:"})
	other := openAt(t, path, &Options{Prefix: "b:"})
	noPrefix := openAt(t, path, nil)
	for _, k := range []string{"x1", "x2", "y%", "y_"} {
		if err := st.Cache().Set(ctx, k, []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
		if err := other.Cache().Set(ctx, k, []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Cache().Set(ctx, "gone", []byte("v"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// A lock with a cache-like name in the same namespace is not cache.
	if _, _, err := st.Locks().Acquire(ctx, "x3", "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	keys, err := st.Cache().Keys(ctx, "x*")
	if err != nil || fmt.Sprint(keys) != "[x1 x2]" {
		t.Fatalf("Keys(x*) = %q %v", keys, err)
	}
	keys, err = st.Cache().Keys(ctx, "y_")
	if err != nil || fmt.Sprint(keys) != "[y_]" {
		t.Fatalf("Keys(y_) = %q %v", keys, err)
	}
	time.Sleep(3 * time.Millisecond) // let "gone" expire
	n, err := st.Cache().Clear(ctx)
	if err != nil || n != 4 {
		t.Fatalf("Clear = %d, %v; want 4 live entries", n, err)
	}
	if keys, _ := st.Cache().Keys(ctx, ""); len(keys) != 0 {
		t.Fatalf("after Clear: %q", keys)
	}
	if keys, _ := other.Cache().Keys(ctx, ""); len(keys) != 4 {
		t.Fatalf("Clear crossed namespaces: other has %q", keys)
	}
	if _, found, _ := st.Locks().Get(ctx, "x3"); !found {
		t.Fatal("Clear deleted a lock")
	}
	// A store without a prefix has its own namespace (keys "cache:…"):
	// it sees none of the prefixed stores' entries.
	if keys, _ := noPrefix.Cache().Keys(ctx, "*"); len(keys) != 0 {
		t.Fatalf("no-prefix store sees %q", keys)
	}
}

func TestCacheConcurrentSetIfAbsent(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, nil)
	st2 := openAt(t, path, nil)
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for g := 0; g < 12; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := st
			if g%2 == 0 {
				s = st2
			}
			ok, err := s.Cache().SetIfAbsent(ctx, "lease", []byte(fmt.Sprint(g)), time.Minute)
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				won++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if won != 1 {
		t.Fatalf("%d winners", won)
	}
}

func TestValueLimits(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, &Options{MaxValueBytes: 1000})
	if got := st.Limits().MaxValueBytes; got != 1000 {
		t.Fatalf("Limits = %d", got)
	}
	big := bytes.Repeat([]byte("x"), 1001)
	if err := st.Cache().Set(ctx, "big", big, 0); !errors.Is(err, warden.ErrValueTooLarge) {
		t.Fatalf("oversized Set: %v", err)
	}
	if _, found, _ := st.Cache().Get(ctx, "big"); found {
		t.Fatal("oversized value written")
	}
	exact := bytes.Repeat([]byte("y"), 1000)
	if err := st.Cache().Set(ctx, "exact", exact, 0); err != nil {
		t.Fatal(err)
	}
	if e, _, _ := st.Cache().Get(ctx, "exact"); !bytes.Equal(e.Value, exact) {
		t.Fatalf("value of %d bytes came back as %d bytes", len(exact), len(e.Value))
	}
	// A large value (1 MiB) round-trips intact.
	st2, _ := openTest(t, nil)
	large := make([]byte, 1<<20)
	for i := range large {
		large[i] = byte(i * 7)
	}
	if err := st2.Cache().Set(ctx, "large", large, 0); err != nil {
		t.Fatal(err)
	}
	if e, _, _ := st2.Cache().Get(ctx, "large"); !bytes.Equal(e.Value, large) {
		t.Fatal("large value changed")
	}
}

func TestContextCancelled(t *testing.T) {
	st, _ := openTest(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := st.Locks().Acquire(ctx, "k", "o", time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with cancelled ctx: %v", err)
	}
	// The driver itself returns the context's error.
	drv := st.Driver()
	if _, _, err := drv.Locks().Acquire(ctx, "k", "o", time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("driver Acquire with cancelled ctx: %v", err)
	}
	if _, _, err := drv.Cache().Get(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("driver Get with cancelled ctx: %v", err)
	}
}

func TestClosedStore(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Cache().Set(ctx, "k", []byte("v"), 0); !errors.Is(err, warden.ErrClosed) {
		t.Fatalf("Set after Close: %v", err)
	}
	if err := st.Driver().Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
