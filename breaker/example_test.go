package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/store/memory"
)

// A circuit opens after Threshold consecutive failures; calls on an open
// circuit fail fast without running fn.
func Example() {
	ctx := context.Background()
	st := memory.New(&memory.Options{Prefix: "shop:"})
	defer st.Close()

	b, err := breaker.New(st, "payments-api", &breaker.Options{Threshold: 2, OpenFor: time.Minute})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	errUnavailable := errors.New("payments: 503 service unavailable")
	for range 3 {
		err := b.Do(ctx, func(ctx context.Context) error {
			fmt.Println("calling payments")
			return errUnavailable
		})
		fmt.Println("open:", errors.Is(err, breaker.ErrOpen), "err is the call's:", errors.Is(err, errUnavailable))
	}
	state, _ := b.State(ctx)
	fmt.Println("state:", state)
	// Output:
	// calling payments
	// open: false err is the call's: true
	// calling payments
	// open: false err is the call's: true
	// open: true err is the call's: false
	// state: open
}

// Call runs a function that returns a value through the breaker.
func ExampleCall() {
	ctx := context.Background()
	st := memory.New(nil)
	defer st.Close()
	b, _ := breaker.New(st, "pricing", nil)
	defer b.Close()

	price, err := breaker.Call(ctx, b, func(ctx context.Context) (float64, error) {
		return 9.99, nil
	})
	fmt.Println(price, err)
	// Output:
	// 9.99 <nil>
}
