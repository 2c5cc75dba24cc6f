// Command quickstart is the README's example, whole: a report that one
// process at a time writes under a lock, and a charge made once per order
// id however often the request is retried — on the embedded SQLite store.
// CI builds and runs it from a module outside this repository, the way the
// README says to use warden (testenv/outside.sh).
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/lock"
	_ "github.com/warden-go/warden/store/sqlite" // registers sqlite://
)

// Receipt is what a charge returns.
type Receipt struct {
	ID    string
	Cents int
}

func main() {
	ctx := context.Background()
	// SQLite coordinates the processes of one host. To coordinate hosts,
	// open a server store instead: postgres://, mysql://, redis://,
	// mongodb:// or dynamodb://.
	st, err := warden.Open(ctx, "sqlite://quickstart.db?prefix=billing:")
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()

	// One report at a time: Do waits for the lock, refreshes it while fn
	// runs, and cancels fn's context if the lock is ever lost.
	locker, err := lock.New(st, &lock.Options{TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	err = lock.Do(ctx, locker, "nightly-report", func(ctx context.Context) error {
		token := lock.LeaseFromContext(ctx).Token() // fencing token: send it with every write
		return writeReport(ctx, token)
	})
	if err != nil {
		log.Fatal(err)
	}

	// One charge per order id, even when the request is retried
	// concurrently: duplicates get the stored receipt.
	receipt, err := idempotency.Do(ctx, st, "charge:order-42", nil, func(ctx context.Context) (Receipt, error) {
		return charge(ctx, 4200)
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("receipt %s for %d cents\n", receipt.ID, receipt.Cents)
}

// writeReport stands for the work done under the lock; a real one passes
// token to every write so that the store it writes to can refuse a late
// writer's.
func writeReport(ctx context.Context, token int64) error {
	if err := ctx.Err(); err != nil {
		return err // the lock was lost: stop before writing
	}
	fmt.Println("report written under the lock, fencing token > 0:", token > 0)
	return nil
}

// charge stands for a payment call.
func charge(ctx context.Context, cents int) (Receipt, error) {
	return Receipt{ID: "r-42", Cents: cents}, ctx.Err()
}
