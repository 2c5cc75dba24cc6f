// Command nightly shows warden's embedded default at work: a "nightly
// report" that must run on one host at a time. Start it in two shells at
// once; the second one finds the lock held and says by whom.
//
//	go run ./examples/nightly            # uses ./warden.db
//	go run ./examples/nightly -store sqlite:///tmp/shared.db -work 5s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/warden-go/warden"
	_ "github.com/warden-go/warden/store/sqlite"
)

func main() {
	storeURL := flag.String("store", "sqlite://warden.db", "store URL")
	work := flag.Duration("work", 3*time.Second, "how long the report takes")
	flag.Parse()
	if err := run(*storeURL, *work); err != nil {
		fmt.Fprintln(os.Stderr, "nightly:", err)
		if errors.Is(err, errHeld) {
			os.Exit(3)
		}
		os.Exit(1)
	}
}

var errHeld = errors.New("lock held")

func run(storeURL string, work time.Duration) error {
	ctx := context.Background()
	st, err := warden.Open(ctx, storeURL)
	if err != nil {
		return err
	}
	defer st.Close()

	host, _ := os.Hostname()
	owner := fmt.Sprintf("%s:%d", host, os.Getpid())
	ttl := work + 10*time.Second

	rec, ok, err := st.Locks().Acquire(ctx, "nightly-report", owner, ttl)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: nightly-report is held by %s until %s", errHeld, rec.Owner, rec.ExpiresAt.Format(time.RFC3339Nano))
	}
	fmt.Printf("%s holds nightly-report (fencing token %d); working for %v\n", owner, rec.Token, work)
	time.Sleep(work) // the report itself
	released, err := st.Locks().Release(ctx, "nightly-report", owner, rec.Token)
	if err != nil {
		return err
	}
	if !released {
		return errors.New("the lock was lost before the report finished")
	}
	fmt.Println("report done, lock released")
	return nil
}
