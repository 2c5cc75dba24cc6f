package postgres_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/store/postgres"
)

// Open a store from a URL and run a job under a lock. (Compiled, not run:
// it needs a server.)
func ExampleOpen() {
	ctx := context.Background()
	st, err := postgres.Open(ctx, "postgres://app@db.internal:5432/app?sslmode=require&prefix=billing:", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	locker, err := lock.New(st, &lock.Options{TTL: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	err = lock.Do(ctx, locker, "nightly-invoices", func(ctx context.Context) error {
		fmt.Println("only one process runs this at a time")
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A service that already has a pgxpool.Pool hands it to New; the pool
// stays open when the store closes.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	st, err := postgres.New(pool, &postgres.Options{Prefix: "billing:", Schema: "coordination"})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
}
