package sqlite_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/sqlite"
)

func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "warden-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// Every process that opens this file shares the same locks, breakers,
	// cache, idempotency keys and checkpoints.
	st, err := sqlite.Open(ctx, filepath.Join(dir, "warden.db"), &sqlite.Options{Prefix: "billing:"})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()

	locks := st.Locks()
	lease, ok, err := locks.Acquire(ctx, "invoices/2024-06", "worker-1", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("worker-1 acquired:", ok)

	holder, ok, err := locks.Acquire(ctx, "invoices/2024-06", "worker-2", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("worker-2 acquired:", ok, "- held by", holder.Owner)

	if _, err := locks.Release(ctx, "invoices/2024-06", "worker-1", lease.Token); err != nil {
		log.Fatal(err)
	}
	next, _, err := locks.Acquire(ctx, "invoices/2024-06", "worker-2", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("fencing token increased:", next.Token > lease.Token)

	if err := st.Cache().Set(ctx, "rate:EUR", []byte("1.08"), time.Minute); err != nil {
		log.Fatal(err)
	}
	e, _, err := st.Cache().Get(ctx, "rate:EUR")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("cached:", string(e.Value))

	cp, _, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "export", Progress: 50, Data: []byte(`{"page":7}`)})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("checkpoint:", cp.ID)

	// Output:
	// worker-1 acquired: true
	// worker-2 acquired: false - held by worker-1
	// fencing token increased: true
	// cached: 1.08
	// checkpoint: export:1
}

// The sqlite scheme is registered when the package is imported.
func Example_url() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "warden-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	st, err := warden.Open(ctx, "sqlite://"+filepath.Join(dir, "warden.db")+"?prefix=app:&busy_timeout=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	fmt.Println(st.Name())
	// Output: sqlite
}
