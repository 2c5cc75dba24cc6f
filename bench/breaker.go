package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/warden-go/warden/breaker"
)

// The breaker's in-process fast paths beside sony/gobreaker/v2, the
// in-process breaker users pick instead: a call rejected on an open
// circuit, and a successful call on a closed one. warden's Breaker runs
// on the memory store, which delivers circuit notifications, so neither
// path reads the store: both run on the Breaker's local view. Each case
// reports allocs/op beside the time.

const (
	groupBreakerOpen   = "in-process breaker, call rejected on an open circuit"
	groupBreakerClosed = "in-process breaker, successful call on a closed circuit"
)

// errBench is the failure that opens the circuits.
var errBench = errors.New("bench: dependency failed")

func breakerCases() []Case {
	var cases []Case
	for _, g := range []struct {
		group   string
		tripped bool
	}{{groupBreakerOpen, true}, {groupBreakerClosed, false}} {
		tripped := g.tripped
		cases = append(cases,
			Case{Group: g.group, Name: "sony/gobreaker/v2 Execute", Baseline: true, Allocs: true, Run: func(b *testing.B) { breakerLoop(b, gobreakerOp(b, tripped)) }},
			Case{Group: g.group, Name: "warden breaker.Do (memory store)", Allocs: true, Run: func(b *testing.B) { breakerLoop(b, wardenBreakerOp(b, tripped)) }},
			Case{Group: g.group, Name: "both alternating, paired (µs: warden's half)", Metric: BreakerPairedMetric, Run: func(b *testing.B) { breakerPaired(b, tripped) }},
		)
	}
	return cases
}

// breakerLoop runs op b.N times, counting allocations.
func breakerLoop(b *testing.B, op func()) {
	b.ReportAllocs()
	for b.Loop() {
		op()
	}
}

// BreakerPairedMetric is the time per call (µs) of warden's half of a
// paired breaker run; PairedRatio, reported beside it, is warden's half's
// total time over gobreaker's. Each iteration of a paired run makes
// breakerBatch calls through one breaker, then as many through the other,
// in alternating order, so that both meet the same load on a shared
// machine and the clock is read once per batch, not once per call.
const BreakerPairedMetric = "warden-µs/op"

const breakerBatch = 64

// breakerPaired runs gobreaker and warden's Breaker alternating, in
// batches, and reports BreakerPairedMetric and PairedRatio.
func breakerPaired(b *testing.B, tripped bool) {
	peer, warden := gobreakerOp(b, tripped), wardenBreakerOp(b, tripped)
	var tp, tw time.Duration
	n := 0
	batch := func(op func(), total *time.Duration) {
		start := time.Now()
		for range breakerBatch {
			op()
		}
		*total += time.Since(start)
	}
	for b.Loop() {
		if n%2 == 0 {
			batch(peer, &tp)
			batch(warden, &tw)
		} else {
			batch(warden, &tw)
			batch(peer, &tp)
		}
		n++
	}
	b.ReportMetric(float64(tw.Nanoseconds())/1000/float64(n*breakerBatch), BreakerPairedMetric)
	b.ReportMetric(float64(tw)/float64(tp), PairedRatio)
}

// gobreakerOp returns a call through a gobreaker that trips on one failure
// and stays open for an hour, opened first if tripped; the function called
// succeeds.
func gobreakerOp(b *testing.B, tripped bool) func() {
	cb := gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "bench",
		Timeout:     time.Hour,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 1 },
	})
	if tripped {
		_, _ = cb.Execute(func() (struct{}, error) { return struct{}{}, errBench })
		if cb.State() != gobreaker.StateOpen {
			b.Fatalf("gobreaker is %s, want open", cb.State())
		}
	}
	fn := func() (struct{}, error) { return struct{}{}, nil }
	return func() {
		if _, err := cb.Execute(fn); tripped != (err != nil) {
			b.Fatal(err)
		}
	}
}

// wardenBreakerOp is gobreakerOp with warden's Breaker on the memory store
// (Threshold 1, OpenFor an hour).
func wardenBreakerOp(b *testing.B, tripped bool) func() {
	ctx := context.Background()
	br, err := breaker.New(open(b, "memory://"), "bench", &breaker.Options{Threshold: 1, OpenFor: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { br.Close() })
	if tripped {
		_ = br.Do(ctx, func(context.Context) error { return errBench })
		if s := br.Stats().State; s != breaker.Open {
			b.Fatalf("warden's breaker is %s, want open", s)
		}
	}
	fn := func(context.Context) error { return nil }
	return func() {
		if err := br.Do(ctx, fn); tripped != errors.Is(err, breaker.ErrOpen) {
			b.Fatal(err)
		}
	}
}
