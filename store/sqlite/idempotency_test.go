package sqlite

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
)

func TestIdempotencyFlow(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	id := st.Idempotency()

	rec, out, err := id.Claim(ctx, "pay-1", "w1", time.Minute, "fp-a")
	if err != nil || out != driver.Claimed || rec.Status != driver.IdemPending || rec.Owner != "w1" || rec.Fingerprint != "fp-a" || rec.Key != "pay-1" {
		t.Fatalf("Claim: %+v %v %v", rec, out, err)
	}
	rec2, out, err := id.Claim(ctx, "pay-1", "w2", time.Minute, "fp-b")
	if err != nil || out != driver.InProgress || rec2.Owner != "w1" || !rec2.ExpiresAt.Equal(rec.ExpiresAt) {
		t.Fatalf("duplicate Claim: %+v %v %v", rec2, out, err)
	}
	// The claimant itself re-claims: its lease is renewed.
	rec3, out, err := id.Claim(ctx, "pay-1", "w1", 2*time.Minute, "fp-a")
	if err != nil || out != driver.Claimed || !rec3.ExpiresAt.After(rec.ExpiresAt) {
		t.Fatalf("own re-claim: %+v %v %v", rec3, out, err)
	}
	if ok, err := id.Extend(ctx, "pay-1", "w2", time.Minute); err != nil || ok {
		t.Fatalf("Extend by non-claimant: %v %v", ok, err)
	}
	if ok, err := id.Extend(ctx, "pay-1", "w1", time.Minute); err != nil || !ok {
		t.Fatalf("Extend: %v %v", ok, err)
	}
	if ok, err := id.Complete(ctx, "pay-1", "w2", []byte("x"), 0); err != nil || ok {
		t.Fatalf("Complete by non-claimant: %v %v", ok, err)
	}
	if ok, err := id.Complete(ctx, "pay-1", "w1", []byte(`{"ok":true}`), time.Hour); err != nil || !ok {
		t.Fatalf("Complete: %v %v", ok, err)
	}
	if ok, err := id.Complete(ctx, "pay-1", "w1", []byte(`again`), time.Hour); err != nil || ok {
		t.Fatalf("second Complete: %v %v", ok, err)
	}
	rec4, out, err := id.Claim(ctx, "pay-1", "w3", time.Minute, "")
	if err != nil || out != driver.Completed || string(rec4.Result) != `{"ok":true}` || rec4.Status != driver.IdemCompleted || rec4.Owner != "w1" {
		t.Fatalf("Claim of completed: %+v %v %v", rec4, out, err)
	}
	got, found, err := id.Get(ctx, "pay-1")
	if err != nil || !found || got.Status != driver.IdemCompleted || string(got.Result) != `{"ok":true}` || got.ExpiresAt.IsZero() {
		t.Fatalf("Get: %+v %v %v", got, found, err)
	}
	if ok, err := id.Abandon(ctx, "pay-1", "w1"); err != nil || ok {
		t.Fatalf("Abandon of completed: %v %v", ok, err)
	}

	// Abandon gives the key back.
	if _, out, _ := id.Claim(ctx, "pay-2", "w1", time.Minute, ""); out != driver.Claimed {
		t.Fatal(out)
	}
	if ok, err := id.Abandon(ctx, "pay-2", "w2"); err != nil || ok {
		t.Fatalf("Abandon by non-claimant: %v %v", ok, err)
	}
	if ok, err := id.Abandon(ctx, "pay-2", "w1"); err != nil || !ok {
		t.Fatalf("Abandon: %v %v", ok, err)
	}
	if _, out, _ := id.Claim(ctx, "pay-2", "w2", time.Minute, ""); out != driver.Claimed {
		t.Fatalf("Claim after abandon: %v", out)
	}

	// Set and Delete, go-go-scope style; an empty result is kept as such.
	if err := id.Set(ctx, "direct", []byte{}, 0); err != nil {
		t.Fatal(err)
	}
	got, found, err = id.Get(ctx, "direct")
	if err != nil || !found || got.Status != driver.IdemCompleted || got.Result == nil || len(got.Result) != 0 || !got.ExpiresAt.IsZero() {
		t.Fatalf("Get after Set: %+v %v %v", got, found, err)
	}
	if ok, err := id.Delete(ctx, "direct"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ok, err := id.Delete(ctx, "direct"); err != nil || ok {
		t.Fatal(ok, err)
	}
	list, err := id.List(ctx, "pay-*")
	if err != nil || len(list) != 2 || list[0].Key != "pay-1" || list[1].Key != "pay-2" {
		t.Fatalf("List: %+v %v", list, err)
	}
}

func TestIdempotencyLeaseLapses(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	id := st.Idempotency()
	rec, _, err := id.Claim(ctx, "job", "dead", 20*time.Millisecond, "fp1")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(rec.ExpiresAt) + 5*time.Millisecond) // the lease must lapse
	if _, found, _ := id.Get(ctx, "job"); found {
		t.Fatal("lapsed claim is live")
	}
	rec2, out, err := id.Claim(ctx, "job", "heir", time.Minute, "fp2")
	if err != nil || out != driver.TakenOver || rec2.Owner != "heir" || rec2.Fingerprint != "fp2" {
		t.Fatalf("takeover: %+v %v %v", rec2, out, err)
	}
	if ok, _ := id.Complete(ctx, "job", "dead", []byte("late"), 0); ok {
		t.Fatal("the dead claimant completed after a takeover")
	}
	// A lapsed completed result is free to claim again.
	if err := id.Set(ctx, "res", []byte("r"), 15*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	got, _, _ := id.Get(ctx, "res")
	time.Sleep(time.Until(got.ExpiresAt) + 5*time.Millisecond)
	if _, out, err := id.Claim(ctx, "res", "w", time.Minute, ""); err != nil || out != driver.Claimed {
		t.Fatalf("claim after retention: %v %v", out, err)
	}
}

// TestIdempotencyOneClaimant: among concurrent claimers of a key, from two
// pools on one file, exactly one runs it.
func TestIdempotencyOneClaimant(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, &Options{Prefix: "x:"})
	st2 := openAt(t, path, &Options{Prefix: "x:"})
	for round := 0; round < 5; round++ {
		key := fmt.Sprint("k", round)
		var wg sync.WaitGroup
		var mu sync.Mutex
		outcomes := map[driver.ClaimOutcome]int{}
		for g := 0; g < 10; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := st
				if g%2 == 0 {
					s = st2
				}
				_, out, err := s.Idempotency().Claim(ctx, key, fmt.Sprint("g", g), time.Minute, "")
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				outcomes[out]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		if outcomes[driver.Claimed] != 1 || outcomes[driver.InProgress] != 9 {
			t.Fatalf("round %d outcomes %v", round, outcomes)
		}
	}
}
