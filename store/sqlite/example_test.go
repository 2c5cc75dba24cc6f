package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/recordlock"
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

// Records locks rows of the program's own table: lock one record, or
// skip it when another worker has it; and drain a queue of records with
// Claim, each handed to exactly one worker.
func ExampleRecords() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "warden-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// The program's own database and table.
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE jobs (id INTEGER PRIMARY KEY, status TEXT NOT NULL);
		INSERT INTO jobs (status) VALUES ('pending'), ('pending'), ('done'), ('pending')`); err != nil {
		log.Fatal(err)
	}

	jobs, err := sqlite.Records(db, "jobs", nil) // id, locked_until, locked_by, lock_token
	if err != nil {
		log.Fatal(err)
	}
	if err := jobs.Migrate(ctx); err != nil { // or run jobs.Migration() by hand
		log.Fatal(err)
	}
	a, err := recordlock.New(jobs, &recordlock.Options{Owner: "worker-a"})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	b, err := recordlock.New(jobs, &recordlock.Options{Owner: "worker-b"})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	// Lock → if locked elsewhere, skip → work → release.
	k, err := a.Lock(ctx, 2, time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := b.Lock(ctx, 2, time.Minute); errors.Is(err, recordlock.ErrLocked) {
		fmt.Println("worker-b skips job 2: locked elsewhere")
	}
	// … worker-a works on job 2 under k.Context(), then:
	if err := k.Release(ctx); err != nil {
		log.Fatal(err)
	}

	// The claim-next loop: take the next pending job nobody holds.
	pending := recordlock.SQL{Where: "status = ?", Args: []any{"pending"}}
	for {
		k, err := b.Claim(ctx, pending, time.Minute)
		if errors.Is(err, recordlock.ErrNothingToClaim) {
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		if _, err := db.ExecContext(k.Context(), `UPDATE jobs SET status = 'done' WHERE id = ?`, k.ID()); err != nil {
			log.Fatal(err)
		}
		fmt.Println("worker-b did job", k.ID())
		if err := k.Release(ctx); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// worker-b skips job 2: locked elsewhere
	// worker-b did job 1
	// worker-b did job 2
	// worker-b did job 4
}
