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

// A gobreaker-style ReadyToTrip over the fleet's counts: open once at
// least 3 calls were counted and 60% of them failed, counting per minute
// (Interval), with 2 probes at once when half-open (HalfOpenProbes, which
// is gobreaker's MaxRequests).
func ExampleOptions_readyToTrip() {
	ctx := context.Background()
	st := memory.New(&memory.Options{Prefix: "shop:"})
	defer st.Close()

	b, err := breaker.New(st, "inventory", &breaker.Options{
		ReadyToTrip: func(c breaker.Counts) bool {
			failureRatio := float64(c.TotalFailures) / float64(c.Requests)
			return c.Requests >= 3 && failureRatio >= 0.6
		},
		Interval:       time.Minute,
		HalfOpenProbes: 2,
		OpenFor:        30 * time.Second,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	errTimeout := errors.New("inventory: timeout")
	for _, fails := range []bool{false, true, false, true, true} {
		err := b.Do(ctx, func(ctx context.Context) error {
			if fails {
				return errTimeout
			}
			return nil
		})
		state, _ := b.State(ctx)
		fmt.Printf("call err=%v, state %s\n", err, state)
	}
	// Output:
	// call err=<nil>, state closed
	// call err=inventory: timeout, state closed
	// call err=<nil>, state closed
	// call err=inventory: timeout, state closed
	// call err=inventory: timeout, state open
}
