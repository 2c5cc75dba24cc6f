package idempotency_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/store/memory"
)

// A retried request with the same idempotency key gets the first
// request's result; the charge runs once.
func Example() {
	ctx := context.Background()
	st := memory.New(&memory.Options{Prefix: "billing:"})
	defer st.Close()

	type Receipt struct {
		ID     string
		Amount int
	}
	charge := func(ctx context.Context) (Receipt, error) {
		fmt.Println("charging the card")
		return Receipt{ID: "rcpt-1", Amount: 4200}, nil
	}
	for range 2 {
		r, err := idempotency.Do(ctx, st, "order-77", &idempotency.Options{Fingerprint: "sha256:4f2a"}, charge)
		fmt.Println(r.ID, r.Amount, err)
	}
	// Output:
	// charging the card
	// rcpt-1 4200 <nil>
	// rcpt-1 4200 <nil>
}

// With CacheErrors a failure is stored too: duplicates get it back as an
// error, without running the operation again.
func ExampleDo_cacheErrors() {
	ctx := context.Background()
	st := memory.New(nil)
	defer st.Close()

	opts := &idempotency.Options{CacheErrors: true}
	for range 2 {
		_, err := idempotency.Do(ctx, st, "refund-9", opts, func(ctx context.Context) (int, error) {
			fmt.Println("refunding")
			return 0, errors.New("refund window closed")
		})
		fmt.Println("stored error:", errors.Is(err, idempotency.ErrStoredError), "-", err)
	}
	// Output:
	// refunding
	// stored error: false - refund window closed
	// stored error: true - idempotency: key "refund-9": stored error: refund window closed
}
