package bench

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/warden-go/warden/lock"
)

// HandoffMetric is the metric a hand-off case reports: the median time from
// a holder's Release to a lock.Acquire waiting on another connection
// holding the lock, in microseconds.
const HandoffMetric = "handoff-p50-µs"

// handoff measures lock hand-off between two connections (two stores, two
// Lockers) on the database at u: with notifications the waiter wakes on the
// release event; without, it wakes at its next back-off retry (between
// lock.DefaultRetryMin and lock.DefaultRetryMax).
func handoff(b *testing.B, u string) {
	ctx := context.Background()
	holder, err := lock.New(open(b, u), &lock.Options{TTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { holder.Close() })
	waiter, err := lock.New(open(b, u), &lock.Options{TTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { waiter.Close() })
	var lat []time.Duration
	for b.Loop() {
		held, err := holder.TryAcquire(ctx, "handoff")
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		errc := make(chan error, 1)
		go func() {
			l, err := waiter.Acquire(ctx, "handoff")
			if err != nil {
				errc <- err
				return
			}
			got <- time.Now()
			errc <- l.Release(ctx)
		}()
		// Give the waiter time to find the lock held and start waiting
		// (a benchmark, not a test: this only shapes the scenario).
		time.Sleep(20 * time.Millisecond)
		released := time.Now()
		if err := held.Release(ctx); err != nil {
			b.Fatal(err)
		}
		select {
		case at := <-got:
			lat = append(lat, at.Sub(released))
		case err := <-errc:
			b.Fatal(err)
		}
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), HandoffMetric)
}
