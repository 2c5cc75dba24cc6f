package redis_test

import (
	"context"
	"fmt"
	"log"

	goredis "github.com/redis/go-redis/v9"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/store/redis"
)

// A store on the service's own go-redis client (a *redis.Client, a
// *redis.ClusterClient or a Sentinel failover client), which stays open
// when the store closes.
func ExampleNew() {
	client := goredis.NewClient(&goredis.Options{
		Addr: "127.0.0.1:6379",
		// warden's scripts are not resent after a late reply, and calls
		// end at their context's deadline.
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
	})
	defer client.Close()
	st, err := redis.New(client, &redis.Options{Prefix: "billing:"})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	locks, err := lock.New(st, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	ctx := context.Background()
	err = lock.Do(ctx, locks, "invoice-42", func(ctx context.Context) error {
		fmt.Println("exclusive work, fenced by the lease's token")
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Stores open from URLs once the package is imported: a single server,
// a cluster (cluster=true, more seeds with addr) or Sentinel (master_name).
func Example_uRL() {
	ctx := context.Background()
	st, err := warden.Open(ctx, "redis://127.0.0.1:7101?addr=127.0.0.1:7102&addr=127.0.0.1:7103&cluster=true&prefix=billing:")
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
}
