package mongo_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/store/mongo"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func openPrefix(t *testing.T, name string) *warden.Store {
	t.Helper()
	st, err := mongo.Open(t.Context(), serverURL(t, fmt.Sprintf("%s-%d:", name, time.Now().UnixNano())), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestExpiredLockTakenOverAtOnce: a lock document whose 50 ms holding
// has expired is acquired by someone else immediately — the acquire's
// filter treats it as free; nothing waits for a TTL monitor (FerretDB has
// none at all).
func TestExpiredLockTakenOverAtOnce(t *testing.T) {
	st := openPrefix(t, "expiry")
	ctx := t.Context()
	lk := st.Driver().Locks()
	first, ok, err := lk.Acquire(ctx, "k", "a", 50*time.Millisecond)
	if err != nil || !ok {
		t.Fatalf("Acquire: ok=%v err=%v", ok, err)
	}
	if _, ok, _ := lk.Acquire(ctx, "k", "b", time.Minute); ok {
		t.Fatal("a live 50 ms holding was taken over")
	}
	// Wait until the holding has expired by the store's clock (the
	// client's): Get reports it gone.
	for {
		if _, found, err := lk.Get(ctx, "k"); err != nil {
			t.Fatal(err)
		} else if !found {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	rec, ok, err := lk.Acquire(ctx, "k", "b", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire of the expired lock: ok=%v err=%v", ok, err)
	}
	t.Logf("expired lock re-acquired in %v", time.Since(start))
	if rec.Token <= first.Token {
		t.Errorf("token %d after %d: fencing tokens must increase", rec.Token, first.Token)
	}
	// The document was updated in place, not deleted and recreated.
	if ok, err := lk.Release(ctx, "k", "a", first.Token); err != nil || ok {
		t.Errorf("the expired holder released the new holding: ok=%v err=%v", ok, err)
	}
}

// TestDefaultValueLimit: a value of DefaultMaxValueBytes fits in a
// document with the record's other fields, and one byte more is refused
// before any I/O.
func TestDefaultValueLimit(t *testing.T) {
	u := serverURL(t, fmt.Sprintf("limit-%d:", time.Now().UnixNano()))
	st, err := mongo.Open(t.Context(), u+"&max_value_bytes=0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := st.Limits().MaxValueBytes; got != mongo.DefaultMaxValueBytes {
		t.Fatalf("MaxValueBytes %d, want %d", got, mongo.DefaultMaxValueBytes)
	}
	ctx := t.Context()
	big := bytes.Repeat([]byte{0xA5}, mongo.DefaultMaxValueBytes)
	if err := st.Cache().Set(ctx, "big", big, time.Minute); err != nil {
		t.Fatalf("a value of exactly the limit: %v", err)
	}
	e, found, err := st.Cache().Get(ctx, "big")
	if err != nil || !found || !bytes.Equal(e.Value, big) {
		t.Fatalf("read back: found=%v err=%v len=%d", found, err, len(e.Value))
	}
	if err := st.Cache().Set(ctx, "big", append(big, 0), time.Minute); !errorsIs(err, warden.ErrValueTooLarge) {
		t.Errorf("a value over the limit: %v, want ErrValueTooLarge", err)
	}
	if _, err := st.Cache().Delete(ctx, "big"); err != nil {
		t.Fatal(err)
	}
}

// TestMigrateIdempotent: Migrate runs again on existing collections and
// indexes (also those of a store opened earlier), and the documents keep
// the go-go-scope field names.
func TestMigrateIdempotent(t *testing.T) {
	st := openPrefix(t, "migrate")
	ctx := t.Context()
	for range 2 {
		if err := st.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	if _, _, err := st.Driver().Locks().Acquire(ctx, "k", "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	db := testDB(t, nil)
	var doc bson.M
	if err := db.Collection(mongo.DefaultLocksCollection).FindOne(ctx, bson.D{{Key: "owner", Value: "o"}, {Key: "key", Value: bson.D{{Key: "$regex", Value: "^migrate-.*:lock:k$"}}}}).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"key", "owner", "expiresAt", "createdAt", "token", "namespace"} {
		if _, ok := doc[f]; !ok {
			t.Errorf("lock document lacks %q: %v", f, doc)
		}
	}
	if _, ok := doc["expiresAt"].(bson.DateTime); !ok {
		t.Errorf("expiresAt is %T, want a BSON date", doc["expiresAt"])
	}
}

// TestPurge: Purge deletes the namespace's expired cache entries and lapsed
// idempotency records at once, lock documents after the retention, and
// nothing of another namespace.
func TestPurge(t *testing.T) {
	st := openPrefix(t, "purge")
	other := openPrefix(t, "purge-other")
	ctx := t.Context()
	d := st.Driver()
	for _, s := range []*warden.Store{st, other} {
		if err := s.Driver().Cache().Set(ctx, "gone", []byte("x"), time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Cache().Set(ctx, "kept", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Idempotency().Claim(ctx, "lapsed", "o", time.Millisecond, ""); err != nil {
		t.Fatal(err)
	}
	rec, _, err := d.Locks().Acquire(ctx, "l", "o", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Locks().Release(ctx, "l", "o", rec.Token); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // past the 1 ms expiries
	n, err := st.Purge(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("Purge with a 1 h lock retention deleted %d records, want 2 (cache entry, idempotency record)", n)
	}
	n, err = st.Purge(ctx, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("Purge with a 1 ms lock retention deleted %d records, want 1 (the released lock)", n)
	}
	if ok, _ := d.Cache().Has(ctx, "kept"); !ok {
		t.Error("Purge deleted a live cache entry")
	}
	if n, err := other.Purge(ctx, time.Hour); err != nil || n != 1 {
		t.Errorf("the other namespace's Purge: %d, %v; want its own expired entry", n, err)
	}
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }
