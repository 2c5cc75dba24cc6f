package scope_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/checkpoint"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/scope"
	"github.com/warden-go/warden/store/memory"
)

// Run returns once every task has ended; the handles give the typed
// results.
func ExampleRun() {
	ctx := context.Background()
	err := scope.Run(ctx, func(s *scope.Scope) error {
		user := scope.Go(s, func(ctx context.Context) (string, error) { return "ada", nil })
		posts := scope.Go(s, func(ctx context.Context) (int, error) { return 3, nil })
		name, _ := user.Wait(ctx)
		n, _ := posts.Wait(ctx)
		fmt.Println(name, "has", n, "posts")
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// ada has 3 posts
	// err: <nil>
}

// The first error cancels the other tasks and is what Run returns.
func ExampleRun_firstErrorCancels() {
	err := scope.Run(context.Background(), func(s *scope.Scope) error {
		started := make(chan struct{})
		s.Go(func(ctx context.Context) error {
			close(started)
			<-ctx.Done() // cancelled by the sibling's error
			fmt.Println("cancelled because:", context.Cause(ctx))
			return ctx.Err()
		}, scope.Name("waiter"))
		<-started // (a task started after the error would not run at all)
		s.Go(func(ctx context.Context) error { return errors.New("disk full") }, scope.Name("writer"))
		return nil
	})
	fmt.Println("Run:", err)
	// Output:
	// cancelled because: scope: task "writer": disk full
	// Run: scope: task "writer": disk full
}

// A Run inside a task is nested: it inherits the store (and the hook and
// options) of the outer scope.
func ExampleRun_nested() {
	ctx := context.Background()
	st := memory.New(nil)
	defer st.Close()
	_ = scope.Run(ctx, func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error {
			return scope.Run(ctx, func(inner *scope.Scope) error {
				fmt.Println("same store:", inner.Store() == st)
				return nil
			})
		})
		return nil
	}, scope.WithStore(st))
	// Output:
	// same store: true
}

// Go starts a task with a typed result.
func ExampleGo() {
	ctx := context.Background()
	_ = scope.Run(ctx, func(s *scope.Scope) error {
		h := scope.Go(s, func(ctx context.Context) (float64, error) { return 9.99, nil })
		price, err := h.Wait(ctx)
		fmt.Println(price, err)
		return nil
	})
	// Output:
	// 9.99 <nil>
}

// Scope.Go starts a task without a result.
func ExampleScope_Go() {
	ctx := context.Background()
	var sent atomic.Int64
	_ = scope.Run(ctx, func(s *scope.Scope) error {
		for range 3 {
			s.Go(func(ctx context.Context) error { sent.Add(1); return nil })
		}
		return nil
	})
	fmt.Println("sent:", sent.Load()) // Run waited for all three
	// Output:
	// sent: 3
}

// WithStore gives the tasks their store, so that they name only keys.
func ExampleWithStore() {
	ctx := context.Background()
	st := memory.New(&memory.Options{Prefix: "shop:"})
	defer st.Close()
	_ = scope.Run(ctx, func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error {
			fmt.Println("holding", lock.LeaseFromContext(ctx).Key())
			return nil
		}, scope.Lock("inventory"))
		return nil
	}, scope.WithStore(st))
	// Output:
	// holding inventory
}

// WithLimit lets at most n tasks run at once.
func ExampleWithLimit() {
	var running, most atomic.Int64
	_ = scope.Run(context.Background(), func(s *scope.Scope) error {
		for range 10 {
			s.Go(func(ctx context.Context) error {
				n := running.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				running.Add(-1)
				return nil
			})
		}
		return nil
	}, scope.WithLimit(2))
	fmt.Println("at most 2 at once:", most.Load() <= 2)
	// Output:
	// at most 2 at once: true
}

// WithCollectErrors lets every task finish and joins their errors.
func ExampleWithCollectErrors() {
	err := scope.Run(context.Background(), func(s *scope.Scope) error {
		a := s.Go(func(ctx context.Context) error { return errors.New("a failed") }, scope.Name("a"))
		<-a.Done() // so that the errors come in a known order
		s.Go(func(ctx context.Context) error { return errors.New("b failed") }, scope.Name("b"))
		return nil
	}, scope.WithCollectErrors())
	fmt.Println(err)
	// Output:
	// scope: task "a": a failed
	// scope: task "b": b failed
}

// WithHook reports every task's start, end, retries and lost leases to
// a warden.Hook, the interface that also reports store operations.
func ExampleWithHook() {
	hook := warden.HookFunc(func(ctx context.Context, op warden.OpInfo) {
		info, _ := scope.TaskFromContext(ctx)
		fmt.Printf("%s %s attempt=%d err=%v\n", op.Op, op.Key, info.Attempt, op.Err)
	})
	tries := 0
	_ = scope.Run(context.Background(), func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error {
			if tries++; tries == 1 {
				return errors.New("flaky")
			}
			return nil
		}, scope.Name("sync"), scope.Retry(scope.RetryPolicy{Min: time.Millisecond, Max: time.Millisecond}))
		return nil
	}, scope.WithHook(hook))
	// Output:
	// scope.task.start sync attempt=1 err=<nil>
	// scope.task.retry sync attempt=1 err=flaky
	// scope.task sync attempt=2 err=<nil>
}

// WithLockOptions configures the scope's Locker: here, leases of one
// second, refreshed in the background while the task runs.
func ExampleWithLockOptions() {
	st := memory.New(nil)
	defer st.Close()
	_ = scope.Run(context.Background(), func(s *scope.Scope) error {
		l, err := s.Locker()
		if err != nil {
			return err
		}
		fmt.Println("ttl:", l.TTL())
		return nil
	}, scope.WithStore(st), scope.WithLockOptions(&lock.Options{TTL: time.Second}))
	// Output:
	// ttl: 1s
}

// Lock runs a task under a lock; its context is the lease's, so a lost
// lease cancels it and its error matches warden.ErrLeaseLost.
func ExampleLock() {
	ctx := context.Background()
	st := memory.New(nil)
	defer st.Close()
	err := scope.Run(ctx, func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error {
			fmt.Println("fencing token > 0:", lock.LeaseFromContext(ctx).Token() > 0)
			// An operator force-releases the lock; the next refresh is
			// refused and the lease is lost.
			if _, err := st.Locks().ForceRelease(ctx, "nightly-report"); err != nil {
				return err
			}
			_ = lock.LeaseFromContext(ctx).Refresh(ctx)
			<-ctx.Done()
			return ctx.Err()
		}, scope.Lock("nightly-report"))
		return nil
	}, scope.WithStore(st))
	fmt.Println("lease lost:", errors.Is(err, warden.ErrLeaseLost))
	// Output:
	// fencing token > 0: true
	// lease lost: true
}

// Breaker runs each attempt through a circuit breaker shared with every
// process on the store; WithBreakerOptions configures it.
func ExampleBreaker() {
	st := memory.New(nil)
	defer st.Close()
	_ = scope.Run(context.Background(), func(s *scope.Scope) error {
		for i := range 3 {
			h := s.Go(func(ctx context.Context) error {
				return errors.New("payments: 503")
			}, scope.Breaker("payments"))
			_, err := h.Wait(s.Context())
			fmt.Println("call", i+1, "rejected:", errors.Is(err, breaker.ErrOpen))
		}
		return nil
	}, scope.WithStore(st), scope.WithCollectErrors(),
		scope.WithBreakerOptions(&breaker.Options{Threshold: 2, OpenFor: time.Minute}))
	// Output:
	// call 1 rejected: false
	// call 2 rejected: false
	// call 3 rejected: true
}

// WithBreakerOptions sets the options of the scope's Breakers;
// Scope.Breaker gives one to read its state.
func ExampleWithBreakerOptions() {
	ctx := context.Background()
	st := memory.New(nil)
	defer st.Close()
	_ = scope.Run(ctx, func(s *scope.Scope) error {
		h := s.Go(func(ctx context.Context) error { return errors.New("down") }, scope.Breaker("search"))
		_, _ = h.Wait(ctx)
		b, err := s.Breaker("search")
		if err != nil {
			return err
		}
		state, _ := b.State(ctx)
		fmt.Println("search:", state)
		return nil
	}, scope.WithStore(st), scope.WithCollectErrors(), scope.WithBreakerOptions(&breaker.Options{Threshold: 1}))
	// Output:
	// search: open
}

// Idempotent runs a task once per key; duplicates get the stored result.
func ExampleIdempotent() {
	ctx := context.Background()
	st := memory.New(nil)
	defer st.Close()
	charges := 0
	for range 2 { // two requests with the same key: one charge
		_ = scope.Run(ctx, func(s *scope.Scope) error {
			h := scope.Go(s, func(ctx context.Context) (string, error) {
				charges++
				return "receipt-1", nil
			}, scope.Idempotent("charge:order-42"))
			receipt, err := h.Wait(ctx)
			fmt.Println(receipt, err)
			return nil
		}, scope.WithStore(st))
	}
	fmt.Println("charges:", charges)
	// Output:
	// receipt-1 <nil>
	// receipt-1 <nil>
	// charges: 1
}

// WithIdempotencyOptions configures the idempotency.Do calls: here, keep
// results for an hour and store failures too.
func ExampleWithIdempotencyOptions() {
	ctx := context.Background()
	st := memory.New(nil)
	defer st.Close()
	for range 2 {
		_ = scope.Run(ctx, func(s *scope.Scope) error {
			h := s.Go(func(ctx context.Context) error { return errors.New("card declined") }, scope.Idempotent("charge:7"))
			_, err := h.Wait(ctx)
			fmt.Println("stored failure:", errors.Is(err, idempotency.ErrStoredError))
			return nil
		}, scope.WithStore(st), scope.WithCollectErrors(),
			scope.WithIdempotencyOptions(&idempotency.Options{Retain: time.Hour, CacheErrors: true}))
	}
	// Output:
	// stored failure: false
	// stored failure: true
}

// Checkpoint makes a task resumable: after a failure, the next run of the
// same task id continues from its last save.
func ExampleCheckpoint() {
	ctx := context.Background()
	st := memory.New(nil)
	defer st.Close()
	rows := []string{"a", "b", "c", "d"}
	importRows := func(failAt int) error {
		return scope.Run(ctx, func(s *scope.Scope) error {
			s.Go(func(ctx context.Context) error {
				cp := scope.CursorFromContext[int](ctx)
				next, _ := cp.State() // 0 on a fresh start
				fmt.Println("starting at row", next)
				for ; next < len(rows); next++ {
					if next == failAt {
						return errors.New("connection reset")
					}
					if err := cp.Save(ctx, next+1, 100*float64(next+1)/float64(len(rows))); err != nil {
						return err
					}
				}
				return nil
			}, scope.Checkpoint[int]("import"))
			return nil
		}, scope.WithStore(st))
	}
	fmt.Println(importRows(2))
	fmt.Println(importRows(-1))
	// Output:
	// starting at row 0
	// scope: task "import": connection reset
	// starting at row 2
	// <nil>
}

// WithCheckpointOptions configures the checkpoint.Run calls: here, keep
// the checkpoints after the task succeeds.
func ExampleWithCheckpointOptions() {
	ctx := context.Background()
	st := memory.New(nil)
	defer st.Close()
	_ = scope.Run(ctx, func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error {
			return scope.CursorFromContext[string](ctx).Save(ctx, "done", 100)
		}, scope.Checkpoint[string]("export"))
		return nil
	}, scope.WithStore(st), scope.WithCheckpointOptions(&checkpoint.Options{KeepOnSuccess: true}))
	state, _, err := checkpoint.Latest[string](ctx, st, "export", nil)
	fmt.Println(state, err)
	// Output:
	// done <nil>
}

// ResumeOnly runs a checkpointed task only if it has a checkpoint to
// resume from: go-go-scope's resumeTask with requireExisting.
func ExampleResumeOnly() {
	ctx := context.Background()
	st := memory.New(nil)
	defer st.Close()
	err := scope.Run(ctx, func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error {
			fmt.Println("not run")
			return nil
		}, scope.Checkpoint[int]("migration"), scope.ResumeOnly())
		return nil
	}, scope.WithStore(st))
	fmt.Println("nothing to resume:", errors.Is(err, checkpoint.ErrNotFound))
	// Output:
	// nothing to resume: true
}

// Retry runs a task again after errors, with a jittered exponential
// back-off; an open circuit ends the retries.
func ExampleRetry() {
	st := memory.New(nil)
	defer st.Close()
	calls := 0
	err := scope.Run(context.Background(), func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error {
			calls++
			return errors.New("inventory: 503")
		}, scope.Breaker("inventory"), scope.Retry(scope.RetryPolicy{Attempts: 10, Min: time.Millisecond, Max: 5 * time.Millisecond}))
		return nil
	}, scope.WithStore(st), scope.WithBreakerOptions(&breaker.Options{Threshold: 3, OpenFor: time.Minute}))
	fmt.Println("calls:", calls, "stopped by the open circuit:", errors.Is(err, breaker.ErrOpen))
	// Output:
	// calls: 3 stopped by the open circuit: true
}

// Timeout bounds each attempt; an attempt that overruns fails with an
// error matching context.DeadlineExceeded.
func ExampleTimeout() {
	err := scope.Run(context.Background(), func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error {
			<-ctx.Done() // a call that does not answer
			return ctx.Err()
		}, scope.Name("lookup"), scope.Timeout(10*time.Millisecond))
		return nil
	})
	fmt.Println(err)
	fmt.Println(errors.Is(err, context.DeadlineExceeded))
	// Output:
	// scope: task "lookup": scope: attempt timed out after 10ms: context deadline exceeded
	// true
}

// Name names a task in errors and in the hook's reports.
func ExampleName() {
	err := scope.Run(context.Background(), func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error {
			info, _ := scope.TaskFromContext(ctx)
			fmt.Println("running", info.Name)
			return errors.New("no such bucket")
		}, scope.Name("upload"))
		return nil
	})
	fmt.Println(err)
	// Output:
	// running upload
	// scope: task "upload": no such bucket
}

// Scope.Locker is go-go-scope's s.acquireLock: take a lease directly; it
// is released at the latest when Run returns.
func ExampleScope_Locker() {
	ctx := context.Background()
	st := memory.New(nil)
	defer st.Close()
	_ = scope.Run(ctx, func(s *scope.Scope) error {
		l, err := s.Locker()
		if err != nil {
			return err
		}
		lease, err := l.TryAcquire(ctx, "resource:123")
		if err != nil {
			return err
		}
		_, err = l.TryAcquire(ctx, "resource:123")
		fmt.Println("second try locked:", errors.Is(err, lock.ErrLocked))
		return lease.Release(ctx)
	}, scope.WithStore(st))
	// Output:
	// second try locked: true
}

// A panicking task becomes an error carrying the panic value and stack.
func ExamplePanicError() {
	err := scope.Run(context.Background(), func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error {
			var m map[string]int
			m["x"] = 1 // panics
			return nil
		})
		return nil
	})
	var pe *scope.PanicError
	if errors.As(err, &pe) {
		fmt.Println("panic:", pe.Value)
		fmt.Println("stack recorded:", len(pe.Stack) > 0)
	}
	// Output:
	// panic: assignment to entry in nil map
	// stack recorded: true
}
