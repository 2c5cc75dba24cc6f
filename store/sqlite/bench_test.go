package sqlite

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

func benchStore(b *testing.B) *store {
	b.Helper()
	s, err := openStore(context.Background(), filepath.Join(b.TempDir(), "bench.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// BenchmarkLockAcquireRelease: one uncontended lock cycle.
func BenchmarkLockAcquireRelease(b *testing.B) {
	ctx := context.Background()
	l := benchStore(b).Locks()
	for b.Loop() {
		rec, ok, err := l.Acquire(ctx, "k", "o", time.Minute)
		if err != nil || !ok {
			b.Fatal(ok, err)
		}
		if ok, err := l.Release(ctx, "k", "o", rec.Token); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkLockAcquireHeld: a try-acquire that loses.
func BenchmarkLockAcquireHeld(b *testing.B) {
	ctx := context.Background()
	l := benchStore(b).Locks()
	if _, _, err := l.Acquire(ctx, "k", "holder", time.Hour); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, ok, err := l.Acquire(ctx, "k", "o", time.Minute); err != nil || ok {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkCacheGet: a cache hit.
func BenchmarkCacheGet(b *testing.B) {
	ctx := context.Background()
	c := benchStore(b).Cache()
	if err := c.Set(ctx, "k", []byte("value"), 0); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, ok, err := c.Get(ctx, "k"); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}
