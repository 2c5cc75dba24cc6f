package lock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"strings"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/lock"
	_ "github.com/warden-go/warden/store/memory" // registers memory://
)

// A lease protects a piece of work; its fencing token goes with every
// write to the protected resource.
func Example() {
	ctx := context.Background()
	st, err := warden.Open(ctx, "memory://")
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	locker, err := lock.New(st, &lock.Options{TTL: 10 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locker.Close()

	lease, err := locker.Acquire(ctx, "reports/nightly")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("holding", lease.Key(), "token > 0:", lease.Token() > 0)
	// … work with lease.Context(), sending lease.Token() with each write …
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(lease.Err())
	// Output:
	// holding reports/nightly token > 0: true
	// lock: lease released
}

func ExampleNew() {
	ctx := context.Background()
	st, err := warden.Open(ctx, "memory://?prefix=billing:")
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	locker, err := lock.New(st, &lock.Options{
		Owner: "invoicer-1",
		TTL:   15 * time.Second, // refreshed every 5 s by default
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locker.Close()
	// The label plus a suffix unique to this Locker.
	fmt.Println(label(locker.Owner()), locker.TTL())
	// Output:
	// invoicer-1 15s
}

func ExampleLocker_TryAcquire() {
	ctx := context.Background()
	st, err := warden.Open(ctx, "memory://")
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	a, err := lock.New(st, &lock.Options{Owner: "worker-a"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	b, err := lock.New(st, &lock.Options{Owner: "worker-b"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	lease, err := a.TryAcquire(ctx, "reports/nightly")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)

	_, err = b.TryAcquire(ctx, "reports/nightly")
	var held *lock.HeldError
	if errors.As(err, &held) {
		fmt.Println(errors.Is(err, lock.ErrLocked), "held by", label(held.Owner))
	}
	// Output:
	// true held by worker-a
}

func ExampleDo() {
	ctx := context.Background()
	st, err := warden.Open(ctx, "memory://")
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	locker, err := lock.New(st, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locker.Close()

	err = lock.Do(ctx, locker, "migrations", func(ctx context.Context) error {
		// ctx is cancelled, with cause lock.ErrLeaseLost, if the lock is
		// lost while this runs; the lease's token fences every write.
		token := lock.LeaseFromContext(ctx).Token()
		fmt.Println("migrating, token > 0:", token > 0)
		return nil
	})
	fmt.Println("done:", err)
	// Output:
	// migrating, token > 0: true
	// done: <nil>
}

func ExampleLocker_Watch() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := warden.Open(ctx, "memory://")
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	locker, err := lock.New(st, &lock.Options{Owner: "worker-a"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locker.Close()

	events, err := locker.Watch(ctx, "jobs/*")
	if err != nil {
		log.Fatal(err)
	}
	lease, err := locker.Acquire(ctx, "jobs/42")
	if err != nil {
		log.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	for range 2 {
		ev := <-events
		fmt.Println(ev.Kind, ev.Key, "by", label(ev.Owner))
	}
	// Output:
	// acquired jobs/42 by worker-a
	// released jobs/42 by worker-a
}

// A lease's context ends the moment the lease is lost — here because an
// operator force-released the lock and the next refresh was refused.
func ExampleLease_Context() {
	ctx := context.Background()
	// Lease losses are logged at Warn to the store's logger; this example
	// discards them.
	st, err := warden.OpenWith(ctx, "memory://", &warden.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	locker, err := lock.New(st, &lock.Options{RefreshInterval: 10 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locker.Close()

	lease, err := locker.Acquire(ctx, "reports/nightly")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := st.Locks().ForceRelease(ctx, "reports/nightly"); err != nil {
		log.Fatal(err)
	}
	<-lease.Context().Done()
	fmt.Println(context.Cause(lease.Context()))
	fmt.Println(lease.Release(ctx))
	// Output:
	// warden: lease lost
	// lock: not held: warden: lease lost
}

// label is an owner's label: its identity without the Locker's suffix.
func label(owner string) string { return owner[:strings.LastIndex(owner, "#")] }
