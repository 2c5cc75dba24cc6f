package drivertest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/driver"
)

// This file holds the checks of the gobreaker-style counts: RecordOutcome's
// counts and counting periods, Trip, and concurrent probe slots
// (TryProbes).

// counts is a record's counts as compared by the checks.
type counts struct{ successes, totalFailures, consecSuccesses, failures int64 }

func countsOf(r driver.CircuitRecord) counts {
	return counts{r.Successes, r.TotalFailures, r.ConsecutiveSuccesses, r.Failures}
}

func (c counts) String() string {
	return fmt.Sprintf("successes %d, total failures %d, consecutive successes %d, consecutive failures %d",
		c.successes, c.totalFailures, c.consecSuccesses, c.failures)
}

// wantCounts checks a record's state and counts.
func wantCounts(t *testing.T, what string, rec driver.CircuitRecord, state driver.CircuitState, want counts) {
	t.Helper()
	if rec.State != state || countsOf(rec) != want {
		t.Errorf("%s: got %s with %v; want %s with %v", what, rec.State, countsOf(rec), state, want)
	}
}

// outcome records o and fails the check on an error.
func outcome(t *testing.T, c *warden.Circuits, name string, o driver.Outcome) driver.CircuitRecord {
	t.Helper()
	rec, err := c.RecordOutcome(t.Context(), name, o)
	fatalIf(t, "RecordOutcome", err)
	return rec
}

// circuitCounts: RecordOutcome keeps gobreaker's counts exactly, in every
// state, and resets them when the state changes.
func (s *suite) circuitCounts(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Circuits()
	const name = "counts"
	fail := driver.Outcome{Kind: driver.OutcomeFailure}
	ok := driver.Outcome{Kind: driver.OutcomeSuccess}

	rec := outcome(t, c, name, ok)
	wantCounts(t, "a success on an absent circuit", rec, driver.Closed, counts{1, 0, 1, 0})
	if got := rec.Counts(); got != (driver.Counts{Requests: 1, TotalSuccesses: 1, ConsecutiveSuccesses: 1}) {
		t.Errorf("Counts() = %+v after one success", got)
	}
	checkTime(t, "LastSuccess", rec.LastSuccess)
	rec = outcome(t, c, name, fail)
	rec = outcome(t, c, name, fail)
	wantCounts(t, "two failures with threshold 0 (never by count)", rec, driver.Closed, counts{1, 2, 0, 2})
	if got := rec.Counts(); got != (driver.Counts{Requests: 3, TotalSuccesses: 1, TotalFailures: 2, ConsecutiveFailures: 2}) {
		t.Errorf("Counts() = %+v after a success and two failures", got)
	}
	batch := ok
	batch.Successes = 3
	rec = outcome(t, c, name, batch)
	wantCounts(t, "a success with 3 batched successes", rec, driver.Closed, counts{5, 2, 1, 0})
	rec = outcome(t, c, name, driver.Outcome{Successes: 2})
	wantCounts(t, "2 batched successes alone (OutcomeNone), which change no consecutive count", rec, driver.Closed, counts{7, 2, 1, 0})
	rec = outcome(t, c, name, driver.Outcome{Kind: driver.OutcomeFailure, Successes: 4})
	wantCounts(t, "a failure with 4 batched successes", rec, driver.Closed, counts{11, 3, 0, 1})

	before := rec
	for _, gen := range []int64{1, rec.Generation() + 12345} {
		for _, o := range []driver.Outcome{{Kind: driver.OutcomeFailure, Gen: gen, Successes: 5}, {Kind: driver.OutcomeSuccess, Gen: gen}, {Gen: gen, Successes: 5}} {
			rec = outcome(t, c, name, o)
			if !sameCircuit(rec, before) || countsOf(rec) != countsOf(before) {
				t.Errorf("outcome %+v of another generation (the circuit's is %d) changed the record: %v → %v", o, before.Generation(), countsOf(before), countsOf(rec))
			}
		}
	}

	// RecordFailure and RecordSuccess count too.
	rec, err := c.RecordFailure(ctx, name, 100)
	fatalIf(t, "RecordFailure", err)
	wantCounts(t, "RecordFailure", rec, driver.Closed, counts{11, 4, 0, 2})
	rec, err = c.RecordSuccess(ctx, name)
	fatalIf(t, "RecordSuccess", err)
	wantCounts(t, "RecordSuccess", rec, driver.Closed, counts{12, 4, 1, 0})

	// Opening at the threshold resets the counts; Failures is kept.
	th := fail
	th.Threshold = 2
	rec = outcome(t, c, name, th)
	wantCounts(t, "a failure below threshold 2", rec, driver.Closed, counts{12, 5, 0, 1})
	rec = outcome(t, c, name, th)
	wantCounts(t, "the failure at threshold 2", rec, driver.Open, counts{0, 0, 0, 2})
	checkTime(t, "OpenedAt", rec.OpenedAt)
	gen := rec.Generation()
	rec = outcome(t, c, name, driver.Outcome{Kind: driver.OutcomeSuccess, Gen: gen, Successes: 3})
	wantCounts(t, "a success (and batched successes) while open", rec, driver.Open, counts{0, 0, 0, 2})
	rec = outcome(t, c, name, driver.Outcome{Kind: driver.OutcomeFailure, Gen: gen})
	wantCounts(t, "a failure while open", rec, driver.Open, counts{0, 0, 0, 3})

	// Half-open: counts from 0, closing after CloseAfter successes in a row.
	rec, granted, err := c.TryProbes(ctx, name, "p1", 0, time.Minute, 2)
	fatalIf(t, "TryProbes", err)
	if !granted || rec.Probes != 1 {
		t.Fatalf("TryProbes after the open period: granted=%v probes %d, want granted, 1", granted, rec.Probes)
	}
	wantCounts(t, "half-open", rec, driver.HalfOpen, counts{0, 0, 0, 3})
	two := driver.Outcome{Kind: driver.OutcomeSuccess, Gen: gen, CloseAfter: 2, Successes: 9}
	rec = outcome(t, c, name, two)
	wantCounts(t, "the first of 2 successes that close (batched successes are not counted half-open)", rec, driver.HalfOpen, counts{1, 0, 1, 3})
	if rec.Probes != 0 {
		t.Errorf("the probe's success left %d probe slots, want 0", rec.Probes)
	}
	rec = outcome(t, c, name, two)
	wantCounts(t, "the second of 2 successes that close", rec, driver.Closed, counts{0, 0, 0, 0})
	checkTime(t, "IntervalStart after closing", rec.IntervalStart)
	if rec.ProbeOwner != "" || rec.Probes != 0 {
		t.Errorf("closing left probe owner %q and %d probe slots", rec.ProbeOwner, rec.Probes)
	}
	if rec.Generation() != 0 {
		t.Errorf("closing left the generation at %d, want 0 (closing clears OpenedAt)", rec.Generation())
	}

	// A failure half-open re-opens and resets the counts.
	th.Gen = rec.Generation()
	rec = outcome(t, c, name, th)
	rec = outcome(t, c, name, th)
	wantCounts(t, "re-opened at threshold 2", rec, driver.Open, counts{0, 0, 0, 2})
	_, granted, err = c.TryProbes(ctx, name, "p2", 0, time.Minute, 2)
	fatalIf(t, "TryProbes", err)
	if !granted {
		t.Fatal("TryProbes after the open period: not granted")
	}
	rec = outcome(t, c, name, driver.Outcome{Kind: driver.OutcomeSuccess, Gen: rec.Generation(), CloseAfter: 2})
	wantCounts(t, "one success half-open", rec, driver.HalfOpen, counts{1, 0, 1, 2})
	rec = outcome(t, c, name, driver.Outcome{Kind: driver.OutcomeFailure, Gen: rec.Generation(), Threshold: 100})
	wantCounts(t, "a failure half-open", rec, driver.Open, counts{0, 0, 0, 3})

	// Set resets the counts, and closed starts a period.
	rec, err = c.Set(ctx, name, driver.Closed)
	fatalIf(t, "Set", err)
	wantCounts(t, "Set closed", rec, driver.Closed, counts{0, 0, 0, 0})
	checkTime(t, "IntervalStart after Set closed", rec.IntervalStart)
	outcome(t, c, name, ok)
	rec, err = c.Set(ctx, name, driver.Open)
	fatalIf(t, "Set", err)
	wantCounts(t, "Set open", rec, driver.Open, counts{0, 0, 0, 0})
	got, _, err := c.Get(ctx, name)
	fatalIf(t, "Get", err)
	if !sameCircuit(got, rec) || countsOf(got) != countsOf(rec) || !got.IntervalStart.Equal(rec.IntervalStart) || got.Probes != rec.Probes {
		t.Errorf("Get = %+v, want the last write's record %+v", got, rec)
	}

	// Bad outcomes are refused before the store.
	for _, o := range []driver.Outcome{{Kind: 7}, {Successes: -1}, {Threshold: -1}, {CloseAfter: -1}, {Interval: -time.Second}, {Gen: -2}} {
		if _, err := c.RecordOutcome(ctx, name, o); !isInvalid(err) {
			t.Errorf("RecordOutcome(%+v): %v, want ErrInvalidArgument", o, err)
		}
	}
}

// circuitInterval: in the closed state a write that finds its counting
// period over (IntervalStart+Interval not after now, by the store's clock)
// resets the counts before counting, and starts a new period; a write
// within the period never does.
func (s *suite) circuitInterval(t *testing.T) {
	st, _ := s.open(t)
	c := st.Circuits()
	const name = "interval"
	hour := driver.Outcome{Kind: driver.OutcomeFailure, Interval: time.Hour}

	// A circuit written without a period has none: the first write with an
	// Interval starts it and keeps the counts.
	outcome(t, c, name, driver.Outcome{Kind: driver.OutcomeFailure})
	rec := outcome(t, c, name, hour)
	wantCounts(t, "the first write with an interval", rec, driver.Closed, counts{0, 2, 0, 2})
	checkTime(t, "IntervalStart", rec.IntervalStart)
	start := rec.IntervalStart
	rec = outcome(t, c, name, driver.Outcome{Kind: driver.OutcomeSuccess, Interval: time.Hour, Successes: 2})
	wantCounts(t, "a success within the hour", rec, driver.Closed, counts{3, 2, 1, 0})
	if !rec.IntervalStart.Equal(start) {
		t.Errorf("a write within the period moved IntervalStart %v → %v", start, rec.IntervalStart)
	}

	// Short periods: every write either stays in its period or renews it,
	// exactly as the store's clock (UpdatedAt) says.
	const interval = 30 * time.Millisecond
	short := driver.Outcome{Kind: driver.OutcomeFailure, Interval: interval}
	prev := outcome(t, c, name, short)
	// Writes go on until the period was renewed three times: a store that
	// never renews it keeps the check running until go test's -timeout.
	renewals := 0
	for renewals < 3 {
		rec := outcome(t, c, name, short)
		over := !prev.IntervalStart.Add(interval).After(rec.UpdatedAt)
		switch {
		case over && rec.IntervalStart.Equal(rec.UpdatedAt) && rec.TotalFailures == 1 && rec.Failures == 1 && rec.Successes == 0:
			renewals++
		case over:
			t.Fatalf("a write at %v found the period of %v from %v over, but the record is %v from %v (want a new period from the write, 1 failure)",
				rec.UpdatedAt, interval, prev.IntervalStart, countsOf(rec), rec.IntervalStart)
		case !rec.IntervalStart.Equal(prev.IntervalStart) || rec.TotalFailures != prev.TotalFailures+1:
			t.Fatalf("a write at %v within the period of %v from %v gave %v from %v (want the period kept, one more failure)",
				rec.UpdatedAt, interval, prev.IntervalStart, countsOf(rec), rec.IntervalStart)
		}
		prev = rec
		if !sleepCtx(t.Context(), 5*time.Millisecond) {
			t.Fatalf("%d renewals of a %v period when the test ended", renewals, interval)
		}
	}

	// Periods apply to the closed state only.
	rec = outcome(t, c, name, driver.Outcome{Kind: driver.OutcomeFailure, Threshold: 1})
	if rec.State != driver.Open {
		t.Fatalf("a failure at threshold 1: %s", rec.State)
	}
	_, granted, err := c.TryProbes(t.Context(), name, "p", 0, time.Minute, 3)
	fatalIf(t, "TryProbes", err)
	if !granted {
		t.Fatal("TryProbes after the open period: not granted")
	}
	o := driver.Outcome{Kind: driver.OutcomeSuccess, Gen: rec.Generation(), CloseAfter: 3, Interval: time.Millisecond}
	outcome(t, c, name, o)
	sleepCtx(t.Context(), 5*time.Millisecond)
	rec = outcome(t, c, name, o)
	wantCounts(t, "two successes half-open with a 1 ms interval", rec, driver.HalfOpen, counts{2, 0, 2, 2})
}

// circuitTrip: Trip opens a closed circuit only at the version it names.
func (s *suite) circuitTrip(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Circuits()
	const name = "trip"
	rec, tripped, err := c.Trip(ctx, name, 0)
	fatalIf(t, "Trip", err)
	if tripped || rec.State != driver.Closed {
		t.Errorf("Trip of an absent circuit: tripped=%v, %s", tripped, rec.State)
	}
	if _, found, _ := c.Get(ctx, name); found {
		t.Error("Trip of an absent circuit created it")
	}
	outcome(t, c, name, driver.Outcome{Kind: driver.OutcomeFailure})
	r2 := outcome(t, c, name, driver.Outcome{Kind: driver.OutcomeFailure})
	rec, tripped, err = c.Trip(ctx, name, r2.Version-1)
	fatalIf(t, "Trip", err)
	if tripped || !sameCircuit(rec, r2) {
		t.Errorf("Trip at an old version: tripped=%v, %+v; want not tripped, the current record", tripped, rec)
	}
	rec, tripped, err = c.Trip(ctx, name, r2.Version)
	fatalIf(t, "Trip", err)
	if !tripped {
		t.Fatalf("Trip at the current version: not tripped (%s, version %d)", rec.State, rec.Version)
	}
	wantCounts(t, "tripped", rec, driver.Open, counts{0, 0, 0, 2})
	checkTime(t, "OpenedAt", rec.OpenedAt)
	if rec.Version <= r2.Version || rec.Generation() == r2.Generation() {
		t.Errorf("Trip: version %d → %d, generation %d → %d; want both to change", r2.Version, rec.Version, r2.Generation(), rec.Generation())
	}
	again, tripped, err := c.Trip(ctx, name, rec.Version)
	fatalIf(t, "Trip", err)
	if tripped || !sameCircuit(again, rec) {
		t.Errorf("Trip of an open circuit: tripped=%v", tripped)
	}
	if _, _, err := c.Trip(ctx, name, -1); !isInvalid(err) {
		t.Errorf("Trip at version -1: %v, want ErrInvalidArgument", err)
	}
}

// circuitTripConcurrent: concurrent failures with a ReadyToTrip decided
// by the callers (total failures ≥ trip) lose no increment, and the
// circuit trips exactly once, at or after the trip-th failure.
func (s *suite) circuitTripConcurrent(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Circuits()
	const callers, trip = 48, 20
	const name = "trip-concurrent"
	ready := func(n driver.Counts) bool { return n.TotalFailures >= trip }
	counted := make([]int64, callers)
	trips := make([]bool, callers)
	var errs atomic.Int64
	parallel(callers, func(i int) {
		rec, err := c.RecordOutcome(ctx, name, driver.Outcome{Kind: driver.OutcomeFailure})
		if err != nil {
			errs.Add(1)
			t.Errorf("RecordOutcome: %v", err)
			return
		}
		if rec.Generation() == 0 {
			counted[i] = rec.TotalFailures
		}
		for rec.State == driver.Closed && ready(rec.Counts()) {
			var tripped bool
			rec, tripped, err = c.Trip(ctx, name, rec.Version)
			if err != nil {
				t.Errorf("Trip: %v", err)
				return
			}
			if tripped {
				trips[i] = true
				break
			}
		}
	})
	if errs.Load() > 0 {
		return
	}
	var got []int64
	nTrips := 0
	for i := range callers {
		if counted[i] > 0 {
			got = append(got, counted[i])
		}
		if trips[i] {
			nTrips++
		}
	}
	sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
	for i, n := range got {
		if n != int64(i+1) {
			t.Fatalf("the failures counted before the trip returned total failures %v, want 1..%d each once (increments lost)", got, len(got))
		}
	}
	if len(got) < trip {
		t.Errorf("the circuit tripped after %d failures, want at least %d", len(got), trip)
	}
	if nTrips != 1 {
		t.Errorf("%d callers tripped the circuit, want exactly 1", nTrips)
	}
	rec, _, err := c.Get(ctx, name)
	fatalIf(t, "Get", err)
	wantCircuit(t, "after the trip", rec, name, driver.Open, int64(len(got)))
}

// circuitProbesConcurrent: of many concurrent TryProbes with maxProbes n,
// exactly n are granted fleet-wide; a probe's success frees its slot; the
// circuit closes at the n-th success in a row; slots whose lease lapsed
// are granted again.
func (s *suite) circuitProbesConcurrent(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Circuits()
	const callers, maxProbes = 24, 3
	const name = "probes"
	opened, _ := openCircuit(t, c, name)
	gen := opened.Generation()
	grants := func(lease time.Duration) (granted []string, last driver.CircuitRecord) {
		owners := make([]string, callers)
		recs := make([]driver.CircuitRecord, callers)
		parallel(callers, func(i int) {
			owner := fmt.Sprintf("p%d-%d", time.Now().UnixNano()%1e6, i)
			rec, ok, err := c.TryProbes(ctx, name, owner, 0, lease, maxProbes)
			if err != nil {
				t.Errorf("TryProbes: %v", err)
				return
			}
			if ok {
				owners[i], recs[i] = owner, rec
			}
		})
		for i, o := range owners {
			if o != "" {
				granted = append(granted, o)
				if recs[i].Version > last.Version {
					last = recs[i]
				}
			}
		}
		return granted, last
	}
	granted, last := grants(time.Minute)
	if len(granted) != maxProbes {
		t.Fatalf("%d concurrent TryProbes with maxProbes %d: %d granted (%s), want exactly %d", callers, maxProbes, len(granted), quoteSome(granted), maxProbes)
	}
	if last.State != driver.HalfOpen || last.Probes != maxProbes {
		t.Errorf("the last grant's record: %s with %d probes, want half-open with %d", last.State, last.Probes, maxProbes)
	}
	// The newest holder asking again keeps its slot without taking another.
	rec, ok, err := c.TryProbes(ctx, name, last.ProbeOwner, 0, time.Minute, maxProbes)
	fatalIf(t, "TryProbes", err)
	if !ok || rec.Probes != maxProbes {
		t.Errorf("the newest slot holder asking again: granted=%v with %d probes, want granted with %d", ok, rec.Probes, maxProbes)
	}
	// A success frees one slot: exactly one more is granted.
	succ := driver.Outcome{Kind: driver.OutcomeSuccess, Gen: gen, CloseAfter: maxProbes}
	rec = outcome(t, c, name, succ)
	wantCounts(t, "the first probe's success", rec, driver.HalfOpen, counts{1, 0, 1, 1})
	if rec.Probes != maxProbes-1 {
		t.Errorf("after a probe's success %d probe slots, want %d", rec.Probes, maxProbes-1)
	}
	more, _ := grants(time.Minute)
	if len(more) != 1 {
		t.Errorf("after one probe's success %d more slots granted (%s), want 1", len(more), quoteSome(more))
	}
	// Concurrent successes: the circuit closes exactly at the maxProbes-th.
	recs := make([]driver.CircuitRecord, maxProbes-1)
	parallel(maxProbes-1, func(i int) {
		var err error
		recs[i], err = c.RecordOutcome(ctx, name, succ)
		errorIf(t, "RecordOutcome", err)
	})
	closed := 0
	for _, r := range recs {
		if r.State == driver.Closed {
			closed++
			wantCounts(t, "closed by the last success", r, driver.Closed, counts{0, 0, 0, 0})
		}
	}
	if closed != 1 {
		t.Errorf("%d of the last %d successes closed the circuit, want 1", closed, maxProbes-1)
	}

	// Lapsed slots: once the newest grant's lease has passed, maxProbes
	// slots are granted again.
	timing(t, 150*time.Millisecond, func(lease time.Duration) bool {
		name := fmt.Sprintf("probes-lapse-%d", lease.Milliseconds())
		openCircuit(t, c, name)
		var first []string
		var err error
		sp := timed(func() {
			for i := range maxProbes {
				var ok bool
				_, ok, err = c.TryProbes(ctx, name, fmt.Sprintf("dead-%d", i), 0, lease, maxProbes)
				if err != nil || !ok {
					break
				}
				first = append(first, fmt.Sprint(i))
			}
		})
		fatalIf(t, "TryProbes", err)
		if len(first) != maxProbes {
			t.Fatalf("%d slots of %d granted one after the other", len(first), maxProbes)
		}
		_, ok, err := c.TryProbes(ctx, name, "early", 0, lease, maxProbes)
		tb := time.Now()
		fatalIf(t, "TryProbes", err)
		if ok {
			if early(sp.end, lease, tb) {
				t.Errorf("a slot beyond maxProbes was granted %v after the last grant of a %v lease", tb.Sub(sp.end), lease)
				return true
			}
			return false
		}
		sleepUntil(t, ctx, sp.end.Add(lease+50*time.Millisecond))
		n := 0
		for i := range maxProbes + 1 {
			rec, ok, err := c.TryProbes(ctx, name, fmt.Sprintf("next-%d", i), 0, time.Minute, maxProbes)
			fatalIf(t, "TryProbes", err)
			if ok {
				n++
				if rec.Probes != int64(n) {
					t.Errorf("grant %d after the lapse: %d probe slots", n, rec.Probes)
				}
			}
		}
		if n != maxProbes {
			t.Errorf("after every lease lapsed %d of %d asks granted, want %d", n, maxProbes+1, maxProbes)
		}
		return true
	})

	for _, m := range []int{0, -1} {
		if _, _, err := c.TryProbes(ctx, name, "x", 0, time.Minute, m); !isInvalid(err) {
			t.Errorf("TryProbes with maxProbes %d: %v, want ErrInvalidArgument", m, err)
		}
	}
}

// isInvalid reports whether err matches warden.ErrInvalidArgument.
func isInvalid(err error) bool { return errors.Is(err, warden.ErrInvalidArgument) }

// ---------------------------------------------------------------------------
// several processes share one circuit

func init() {
	portableRoles["circuit-trips"] = childCircuitTrips
	portableRoles["circuit-probes"] = childCircuitProbes
	portableRoles["breaker-gobreaker"] = childBreakerGobreaker
	portableRoles["circuit-interval"] = childCircuitInterval
}

// mpMaxProbes is the concurrent probes of the multi-process checks.
const mpMaxProbes = 3

// childCircuitTrips records Rounds failures from each of Goroutines
// goroutines with threshold 0 and trips the circuit as a Breaker with
// ReadyToTrip "total failures ≥ Threshold" does. It reports the total
// failures of every failure counted (Counts) and "tripped" (Values) for
// each Trip that opened the circuit.
func childCircuitTrips(ctx context.Context, st *warden.Store, cfg childConfig, res *childResult, mu *sync.Mutex, fail func(string, ...any)) {
	c := st.Circuits()
	startTogether(ctx, cfg, func() error { _, _, err := c.Get(ctx, cfg.Key); return err }, fail, func(int) {
		for range cfg.Rounds {
			rec, err := c.RecordOutcome(ctx, cfg.Key, driver.Outcome{Kind: driver.OutcomeFailure})
			if err != nil {
				fail("RecordOutcome: %v", err)
				return
			}
			counted, n := rec.Generation() == 0, rec.TotalFailures
			tripped := false
			for counted && rec.State == driver.Closed && rec.TotalFailures >= int64(cfg.Threshold) {
				if rec, tripped, err = c.Trip(ctx, cfg.Key, rec.Version); err != nil {
					fail("Trip: %v", err)
					return
				}
				if tripped {
					break
				}
			}
			mu.Lock()
			if counted {
				res.Counts = append(res.Counts, n)
			}
			if tripped {
				res.Values = append(res.Values, "tripped")
			}
			mu.Unlock()
		}
	})
}

// childCircuitProbes asks for a probe slot (of mpMaxProbes) from each of
// Goroutines goroutines at once, and reports "granted" (Values) for each
// slot granted.
func childCircuitProbes(ctx context.Context, st *warden.Store, cfg childConfig, res *childResult, mu *sync.Mutex, fail func(string, ...any)) {
	c := st.Circuits()
	startTogether(ctx, cfg, func() error { _, _, err := c.Get(ctx, cfg.Key); return err }, fail, func(g int) {
		_, ok, err := c.TryProbes(ctx, cfg.Key, fmt.Sprintf("child-%d-g%d", cfg.ID, g), 0, time.Minute, mpMaxProbes)
		if err != nil {
			fail("TryProbes: %v", err)
			return
		}
		if ok {
			mu.Lock()
			res.Values = append(res.Values, "granted")
			mu.Unlock()
		}
	})
}

// mpCircuitTrips: failures recorded from several processes with a trip
// decided by the callers lose no increment and trip the circuit once; of
// concurrent probe requests from several processes exactly mpMaxProbes
// are granted.
func (s *suite) mpCircuitTrips(t *testing.T) {
	const procs, goroutines, rounds, trip = 3, 4, 6, 40
	cfgs, st := s.fleetConfigs(t, "circuit-trips", procs)
	for i := range cfgs {
		cfgs[i].Goroutines, cfgs[i].Rounds, cfgs[i].Threshold = goroutines, rounds, trip
	}
	f := startFleet(t, cfgs)
	f.release(t)
	f.step(t, "start", func() {})
	results := f.wait(t)
	var counts []int64
	trips := 0
	for _, r := range results {
		counts = append(counts, r.Counts...)
		trips += len(r.Values)
	}
	sort.Slice(counts, func(i, j int) bool { return counts[i] < counts[j] })
	if trips != 1 {
		t.Errorf("%d Trips opened the circuit across %d processes, want exactly 1", trips, procs)
	}
	for i, n := range counts {
		if n != int64(i+1) {
			t.Fatalf("failures counted before the trip returned total failures %v, want 1..%d each once (increments lost)", counts, len(counts))
		}
	}
	m := int64(len(counts))
	rec, _, err := st.Circuits().Get(testCtx(t), cfgs[0].Key)
	fatalIf(t, "Get", err)
	wantCircuit(t, "after the fleet's failures", rec, cfgs[0].Key, driver.Open, m)
	if m < trip {
		t.Errorf("the circuit tripped after %d failures, want at least %d", m, trip)
	}

	// Concurrent probes from several processes.
	cfgs, st = s.fleetConfigs(t, "circuit-probes", procs)
	for i := range cfgs {
		cfgs[i].Goroutines = goroutines
	}
	openCircuit(t, st.Circuits(), cfgs[0].Key)
	f = startFleet(t, cfgs)
	f.release(t)
	f.step(t, "start", func() {})
	n, _ := tallyValues(f.wait(t), "granted")
	if n != mpMaxProbes {
		t.Errorf("%d of %d concurrent TryProbes in %d processes were granted, want exactly %d", n, procs*goroutines, procs, mpMaxProbes)
	}
	rec, _, err = st.Circuits().Get(testCtx(t), cfgs[0].Key)
	fatalIf(t, "Get", err)
	if rec.State != driver.HalfOpen || rec.Probes != mpMaxProbes {
		t.Errorf("after the probes: %s with %d probe slots, want half-open with %d", rec.State, rec.Probes, mpMaxProbes)
	}
}

// childBreakerGobreaker plays its part of BreakerGobreaker: Rounds
// successful then Rounds failing calls through a Breaker whose ReadyToTrip
// wants the whole fleet's calls (Threshold failures and as many
// successes), which only exact fleet-wide counts satisfy, and only at the
// fleet's last failure. Then, once the parent has checked, it reads the
// circuit (open), and when the parent says the open period has passed,
// Goroutines calls of which HalfOpenProbes (mpMaxProbes) run as probes,
// each holding on until every other call of the fleet has been rejected.
func childBreakerGobreaker(ctx context.Context, st *warden.Store, cfg childConfig, res *childResult, mu *sync.Mutex, fail func(string, ...any)) {
	total := int64(cfg.Threshold)
	b, err := breaker.New(st, cfg.Key, &breaker.Options{
		ReadyToTrip: func(c breaker.Counts) bool {
			return int64(c.TotalFailures) >= total && int64(c.TotalSuccesses) >= total
		},
		OpenFor:        cfg.OpenFor,
		HalfOpenProbes: mpMaxProbes,
		ProbeLease:     time.Minute,
		SyncInterval:   time.Hour, // the flush happens with the failures
		StoreTimeout:   10 * time.Second,
	})
	if err != nil {
		fail("breaker.New: %v", err)
		return
	}
	defer b.Close()
	for i := range cfg.Rounds {
		if err := b.Do(ctx, func(context.Context) error { return nil }); err != nil {
			fail("successful call %d: %v", i+1, err)
		}
	}
	for i := range cfg.Rounds {
		if err := b.Do(ctx, func(context.Context) error { return errInjected }); !errors.Is(err, errInjected) {
			fail("failing call %d: got %v, want the injected failure (the fleet's counts are not complete before the last failure)", i+1, err)
		}
	}
	if err := b.Flush(ctx); err != nil {
		fail("Flush: %v", err)
	}
	if st := b.Stats(); st.StoreErrors > 0 {
		fail("%d store errors (last %v)", st.StoreErrors, st.LastStoreError)
	}
	if err := childStep(ctx, cfg, "counted"); err != nil {
		fail("%v", err)
		return
	}
	if state, err := b.State(ctx); err != nil || state != breaker.Open {
		fail("State after the fleet's calls: %s, %v; want open", state, err)
	}
	if err := childStep(ctx, cfg, "probe"); err != nil {
		fail("%v", err)
		return
	}
	runs := filepath.Join(cfg.Dir, runsFile)
	var wg sync.WaitGroup
	for g := range cfg.Goroutines {
		wg.Go(func() {
			who := fmt.Sprintf("child-%d-g%d", cfg.ID, g)
			err := b.Do(ctx, func(ctx context.Context) error {
				if err := appendLine(runs, who); err != nil {
					return err
				}
				// The probe holds until every other call of the fleet was
				// rejected: a store granting more probes than allowed lets
				// another call run instead (counted in runs), and then
				// this wait ends only with the child's context.
				for {
					n, err := countFiles(cfg.Dir, "rejected-*")
					if err != nil {
						return err
					}
					if n >= cfg.Total-mpMaxProbes {
						return nil
					}
					if !sleepCtx(ctx, 2*time.Millisecond) {
						fail("%s probes, but only %d of the fleet's other calls were rejected when the child's context ended", who, n)
						return ctx.Err()
					}
				}
			})
			switch {
			case err == nil:
			case errors.Is(err, breaker.ErrOpen):
				mu.Lock()
				res.Rejected++
				mu.Unlock()
				if err := writeAtomic(filepath.Join(cfg.Dir, fmt.Sprintf(rejectedFile, cfg.ID, g)), nil); err != nil {
					fail("%v", err)
				}
			default:
				fail("%s: a call after the open period: %v", who, err)
			}
		})
	}
	wg.Wait()
}

// breakerGobreaker: Breakers in several processes with a gobreaker-style
// ReadyToTrip over fleet-wide counts trip at exactly the fleet's last
// failure (the successes of every process, written with its failures,
// are counted), and after the open period exactly HalfOpenProbes calls of
// the fleet run at once, as probes whose successes close the circuit.
func (s *suite) breakerGobreaker(t *testing.T) {
	const procs, rounds, callers = 3, 4, 3
	const openFor = 300 * time.Millisecond
	cfgs, st := s.fleetConfigs(t, "breaker-gobreaker", procs)
	for i := range cfgs {
		cfgs[i].Rounds, cfgs[i].Threshold, cfgs[i].OpenFor = rounds, procs*rounds, openFor
		cfgs[i].Goroutines, cfgs[i].Total = callers, procs*callers
	}
	name := cfgs[0].Key
	ctx := testCtx(t)
	f := startFleet(t, cfgs)
	f.release(t)
	f.step(t, "counted", func() {
		rec, _, err := st.Circuits().Get(ctx, name)
		fatalIf(t, "Get", err)
		// (Every child's failing calls ran: it opened at the last one.
		// Failures is the consecutive count, which a success written
		// between other processes' failures resets.)
		if rec.State != driver.Open || rec.Failures < 1 || rec.Failures > procs*rounds {
			t.Errorf("after %d successes then %d failures in each of %d processes: %s with %d consecutive failures, want open",
				rounds, rounds, procs, rec.State, rec.Failures)
		}
	})
	f.step(t, "probe", func() { sleepCtx(ctx, openFor+100*time.Millisecond) })
	results := f.wait(t)
	runs, err := readLines(f.path(runsFile))
	fatalIf(t, "runs", err)
	if len(runs) != mpMaxProbes {
		t.Errorf("after the open period %d of the %d concurrent calls in %d processes ran fn (%s), want exactly %d probes", len(runs), procs*callers, procs, quoteSome(runs), mpMaxProbes)
	}
	rejected := 0
	for _, r := range results {
		rejected += r.Rejected
	}
	if rejected != procs*callers-len(runs) {
		t.Errorf("%d calls were rejected with breaker.ErrOpen and %d ran, of %d", rejected, len(runs), procs*callers)
	}
	rec, _, err := st.Circuits().Get(ctx, name)
	fatalIf(t, "Get", err)
	wantCircuit(t, "after the successful probes", rec, name, driver.Closed, 0)
}

// childCircuitInterval records Rounds failures from each of Goroutines
// goroutines, with counting period Interval and no threshold, pausing a
// few milliseconds between two, and reports each record returned (Values:
// "IntervalStart UpdatedAt TotalFailures Failures", times in Unix
// milliseconds) and its state (States).
func childCircuitInterval(ctx context.Context, st *warden.Store, cfg childConfig, res *childResult, mu *sync.Mutex, fail func(string, ...any)) {
	c := st.Circuits()
	startTogether(ctx, cfg, func() error { _, _, err := c.Get(ctx, cfg.Key); return err }, fail, func(int) {
		for range cfg.Rounds {
			rec, err := c.RecordOutcome(ctx, cfg.Key, driver.Outcome{Kind: driver.OutcomeFailure, Interval: cfg.Interval})
			if err != nil {
				fail("RecordOutcome: %v", err)
				return
			}
			mu.Lock()
			res.Values = append(res.Values, fmt.Sprintf("%d %d %d %d", rec.IntervalStart.UnixMilli(), rec.UpdatedAt.UnixMilli(), rec.TotalFailures, rec.Failures))
			res.States = append(res.States, string(rec.State))
			mu.Unlock()
			sleepCtx(ctx, cfg.Pause)
		}
	})
}

// mpCircuitInterval: failures recorded from several processes with a short
// counting period (Interval) renew the period exactly as the store's clock
// says, atomically with the counting: within each period (the records
// that returned one IntervalStart) the total failures returned are 1..n,
// each once — no increment lost, no period reset twice or counted into
// another — the write that opened a period is the one that returned
// total 1, stamped with the period's start, and periods begin at least
// Interval apart. (A write's UpdatedAt may precede the start of the
// period it counted in: SQL stores read their clock before waiting for
// the row, which a concurrent writer may have renewed meanwhile. The
// count is still exact.) The fleet writes for longer
// than the period (the pauses alone last several periods), so the period
// is renewed while processes write concurrently.
func (s *suite) mpCircuitInterval(t *testing.T) {
	const procs, goroutines, rounds = 3, 2, 20
	const interval, pause = 20 * time.Millisecond, 5 * time.Millisecond
	cfgs, st := s.fleetConfigs(t, "circuit-interval", procs)
	for i := range cfgs {
		cfgs[i].Goroutines, cfgs[i].Rounds, cfgs[i].Interval, cfgs[i].Pause = goroutines, rounds, interval, pause
	}
	f := startFleet(t, cfgs)
	f.release(t)
	f.step(t, "start", func() {})
	results := f.wait(t)

	type write struct{ start, updated, total, failures int64 }
	periods := map[int64][]write{}
	n := 0
	for _, r := range results {
		for i, v := range r.Values {
			var w write
			if _, err := fmt.Sscanf(v, "%d %d %d %d", &w.start, &w.updated, &w.total, &w.failures); err != nil {
				t.Fatalf("child %d reported %q: %v", r.ID, v, err)
			}
			if r.States[i] != string(driver.Closed) {
				t.Errorf("a failure without a threshold left the circuit %s", r.States[i])
			}
			if w.failures != w.total {
				t.Errorf("a write returned %d consecutive failures but %d total failures in a period of failures only", w.failures, w.total)
			}
			periods[w.start] = append(periods[w.start], w)
			n++
		}
	}
	if want := procs * goroutines * rounds; n != want {
		t.Fatalf("%d writes reported, want %d", n, want)
	}
	if len(periods) < 2 {
		t.Fatalf("one counting period of %v for writes that lasted at least %v: the period was never renewed", interval, time.Duration(rounds)*pause)
	}
	starts := make([]int64, 0, len(periods))
	for start := range periods {
		starts = append(starts, start)
	}
	sort.Slice(starts, func(i, j int) bool { return starts[i] < starts[j] })
	for i, start := range starts {
		if i > 0 && start-starts[i-1] < interval.Milliseconds() {
			t.Errorf("a period began at %d, %d ms after the one from %d: a period of %v was cut short (reset twice)",
				start, start-starts[i-1], starts[i-1], interval)
		}
		ws := periods[start]
		sort.Slice(ws, func(i, j int) bool { return ws[i].total < ws[j].total })
		for i, w := range ws {
			if w.total != int64(i+1) {
				totals := make([]int64, len(ws))
				for j := range ws {
					totals[j] = ws[j].total
				}
				t.Fatalf("the period from %d returned total failures %v, want 1..%d each once (increments lost, or a period reset twice)", start, totals, len(ws))
			}
		}
		if ws[0].updated != start {
			t.Errorf("the write that opened the period from %d was made at %d", start, ws[0].updated)
		}
	}
	rec, _, err := st.Circuits().Get(testCtx(t), cfgs[0].Key)
	fatalIf(t, "Get", err)
	last := starts[len(starts)-1]
	if rec.IntervalStart.UnixMilli() != last || rec.TotalFailures != int64(len(periods[last])) {
		t.Errorf("the circuit ends in the period from %d with %d total failures, want the last period reported (from %d, %d failures)",
			rec.IntervalStart.UnixMilli(), rec.TotalFailures, last, len(periods[last]))
	}
}
