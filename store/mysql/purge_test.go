package mysql_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/mysql"
)

// TestPurge checks that Purge deletes exactly the namespace's idle and
// expired records, and that a purged lock's next token is still larger.
func TestPurge(t *testing.T) {
	ctx := context.Background()
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	open := func(prefix string) driver.Store {
		st, err := mysql.OpenDriver(ctx, serverURL(t, prefix), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	a, b := open("purgea"+tag+":"), open("purgeb"+tag+":")
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
		if err := st.Cache().Set(ctx, "gone", []byte("x"), time.Millisecond); err != nil {
			t.Fatal(err)
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
	// Wait until the millisecond TTLs have passed on the database clock,
	// however long that takes.
	for {
		_, found, err := a.Cache().Get(ctx, "gone")
		if err != nil {
			t.Fatal(err)
		}
		if !found {
			break
		}
		time.Sleep(time.Millisecond)
	}
	n, err := a.(driver.Purger).Purge(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	// released lock, expired cache entry, expired idempotency record, fence
	if n != 4 {
		t.Errorf("Purge deleted %d records, want 4", n)
	}
	if n, err := a.(driver.Purger).Purge(ctx, 0); err != nil || n != 0 {
		t.Errorf("second Purge: %d, %v; want 0", n, err)
	}
	if _, found, _ := a.Locks().Get(ctx, "held"); !found {
		t.Error("Purge deleted a live lock")
	}
	if _, found, _ := a.Cache().Get(ctx, "kept"); !found {
		t.Error("Purge deleted a cache entry without expiry")
	}
	// The other namespace is untouched: its released lock row still
	// continues the token sequence.
	if _, ok, err := b.Locks().Acquire(ctx, "l", "p", time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if n, err := b.(driver.Purger).Purge(ctx, time.Hour); err != nil || n != 2 {
		t.Errorf("Purge of namespace b with 1 h retention: %d, %v; want 2 (cache, idempotency)", n, err)
	}
	// A lock purged in a and acquired again gets a token above the
	// purged record's (TokenBase of a later millisecond).
	rec2, ok, err := a.Locks().Acquire(ctx, "l", "p", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if rec2.Token <= firstToken {
		t.Errorf("token after purge %d is not above the purged record's %d", rec2.Token, firstToken)
	}
}
