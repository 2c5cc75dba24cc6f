package postgres_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/postgres"
)

// TestPurge: Purge deletes exactly the namespace's expired and idle
// records, more than one batch of them, and a purged lock's next token is
// still larger.
func TestPurge(t *testing.T) {
	ctx := t.Context() // no deadline: a hang is reported by go test's -timeout
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	open := func(prefix string) driver.Store {
		st, err := postgres.OpenDriver(ctx, serverURL(t, prefix), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	a, b := open("purgea"+tag+":"), open("purgeb"+tag+":")
	const expired = 1100 // more than one purge batch
	var firstToken int64
	for _, st := range []driver.Store{a, b} {
		rec, ok, err := st.Locks().Acquire(ctx, "l", "o", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if st == a {
			firstToken = rec.Token
		}
		if _, err := st.Locks().Release(ctx, "l", "o", rec.Token); err != nil {
			t.Fatal(err)
		}
		if _, _, err := st.Locks().Acquire(ctx, "held", "o", time.Minute); err != nil {
			t.Fatal(err)
		}
		for i := range expired {
			if err := st.Cache().Set(ctx, fmt.Sprint("gone", i), []byte("x"), time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.Cache().Set(ctx, "kept", []byte("x"), 0); err != nil {
			t.Fatal(err)
		}
		if err := st.Idempotency().Set(ctx, "gone", []byte("r"), time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if ok, err := st.Checkpoints().Fence(ctx, "task", 7); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	// Wait until the last millisecond TTL has passed on the database clock.
	for {
		_, live, err := b.Idempotency().Get(ctx, "gone")
		if err != nil {
			t.Fatal(err)
		}
		if !live {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the idempotency record never expired")
		}
	}
	n, err := a.(driver.Purger).Purge(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The released lock, the expired cache entries, the idempotency record
	// and the fence of a task without checkpoints.
	if want := int64(1 + expired + 1 + 1); n != want {
		t.Errorf("Purge deleted %d records, want %d", n, want)
	}
	if n, err := a.(driver.Purger).Purge(ctx, 0); err != nil || n != 0 {
		t.Errorf("second Purge: %d, %v; want nothing left", n, err)
	}
	if _, ok, err := a.Locks().Get(ctx, "held"); err != nil || !ok {
		t.Errorf("the held lock was purged: %v %v", ok, err)
	}
	if ok, err := a.Cache().Has(ctx, "kept"); err != nil || !ok {
		t.Errorf("the live cache entry was purged: %v %v", ok, err)
	}
	// The other namespace keeps everything: its purge finds the same.
	if n, err := b.(driver.Purger).Purge(ctx, time.Hour); err != nil || n != expired+1 {
		t.Errorf("the other namespace's Purge (1 h retention) deleted %d, %v; want its %d expired records", n, err, expired+1)
	}
	rec, ok, err := a.Locks().Acquire(ctx, "l", "o", time.Minute)
	if err != nil || !ok || rec.Token <= firstToken {
		t.Errorf("after the purge: token %d (ok=%v, %v), want above %d", rec.Token, ok, err, firstToken)
	}
}
