package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/recordlock"
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

// Lock rows of the application's own jobs table (mongoose-lock-release
// for Go): add the lock columns once, then lock one job by id — skipping
// it if another process has it — and drain the pending ones with Claim.
// (Compiled, not run: it needs a server.)
func ExampleRecords() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	jobs, err := postgres.Records(pool, "jobs", nil) // id, locked_until, locked_by, lock_token
	if err != nil {
		log.Fatal(err)
	}
	if err := jobs.Migrate(ctx); err != nil { // or run jobs.Migration() by hand
		log.Fatal(err)
	}
	locker, err := recordlock.New(jobs, &recordlock.Options{Owner: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	k, err := locker.Lock(ctx, int64(42), time.Minute)
	switch {
	case errors.Is(err, recordlock.ErrLocked):
		fmt.Println("job 42 is being handled elsewhere")
	case err != nil:
		log.Fatal(err)
	default:
		// … work on job 42, under k.Context() …
		_ = k.Release(ctx)
	}

	pending := recordlock.SQL{Where: "status = $1", Args: []any{"pending"}, OrderBy: "priority DESC, id"}
	for {
		k, err := locker.Claim(ctx, pending, time.Minute)
		if errors.Is(err, recordlock.ErrNothingToClaim) {
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		// … handle job k.ID(), set its status, then:
		_ = k.Release(ctx)
	}
}
