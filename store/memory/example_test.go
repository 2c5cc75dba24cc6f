package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/warden-go/warden"
	_ "github.com/warden-go/warden/store/memory"
)

// Open a private in-memory store from a URL and take a lock through the
// store's checked lock primitives.
func Example() {
	ctx := context.Background()
	st, err := warden.Open(ctx, "memory://?prefix=billing:")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()

	locks := st.Locks()
	rec, acquired, err := locks.Acquire(ctx, "invoice-42", "worker-1", 30*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("worker-1 acquired:", acquired, "owner:", rec.Owner)

	_, acquired, _ = locks.Acquire(ctx, "invoice-42", "worker-2", 30*time.Second)
	fmt.Println("worker-2 acquired:", acquired)

	released, _ := locks.Release(ctx, "invoice-42", "worker-1", rec.Token)
	fmt.Println("released:", released)

	next, acquired, _ := locks.Acquire(ctx, "invoice-42", "worker-2", 30*time.Second)
	fmt.Println("worker-2 acquired:", acquired, "newer token:", next.Token > rec.Token)
	// Output:
	// worker-1 acquired: true owner: worker-1
	// worker-2 acquired: false
	// released: true
	// worker-2 acquired: true newer token: true
}
