// Package fairtest runs the workers of one child process of a
// cross-process lock fairness check (the stores' hand-off tests): each
// worker takes one key in turn with a lock.Locker of its own and, holding
// it, bumps a counter shared by every process. testkit.CheckFair reads
// the children's results.
package fairtest

import (
	"context"
	"sync"
	"time"

	"github.com/warden-go/warden/internal/testkit"
	"github.com/warden-go/warden/lock"
)

// Run has every Locker of lockers take key in turn until the shared
// counter — incremented by bump while the key is held, returning its new
// value — passes total. Each holding lasts hold after the bump. It
// returns how many counts each worker made and the (count, fencing token)
// of each, with the first error any worker met.
func Run(ctx context.Context, lockers []*lock.Locker, key string, total int, hold time.Duration, bump func(context.Context) (int64, error)) testkit.FairResult {
	res := testkit.FairResult{Counts: make([]int, len(lockers))}
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if res.Err == "" {
			res.Err = err.Error()
		}
	}
	var wg sync.WaitGroup
	for w, l := range lockers {
		wg.Go(func() {
			for ctx.Err() == nil {
				lease, err := l.Acquire(ctx, key)
				if err != nil {
					fail(err)
					return
				}
				// Under the lock: one holder at a time bumps the counter.
				n, err := bump(ctx)
				if hold > 0 {
					time.Sleep(hold) // the holding's length: the scenario, not a synchronisation
				}
				if err == nil && n <= int64(total) {
					mu.Lock()
					res.Counts[w]++
					res.Turns = append(res.Turns, [2]int64{n, lease.Token()})
					mu.Unlock()
				}
				if rerr := lease.Release(ctx); err == nil {
					err = rerr
				}
				if err != nil {
					fail(err)
					return
				}
				if n >= int64(total) {
					return
				}
			}
		})
	}
	wg.Wait()
	return res
}

// Acquired is what an Acquire started by AcquireAsync returned.
type Acquired struct {
	Lease *lock.Lease
	Err   error
}

// AcquireAsync starts l.Acquire(ctx, key) and delivers its outcome on the
// channel returned.
func AcquireAsync(ctx context.Context, l *lock.Locker, key string) <-chan Acquired {
	ch := make(chan Acquired, 1)
	go func() {
		lease, err := l.Acquire(ctx, key)
		ch <- Acquired{lease, err}
	}()
	return ch
}
