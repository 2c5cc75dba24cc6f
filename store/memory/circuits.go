package memory

import (
	"context"
	"sort"
	"time"

	"github.com/warden-go/warden/driver"
)

// circuits is the store's circuit-breaker driver.
type circuits store

func (c *circuits) s() *store { return (*store)(c) }

// closedRecord is how an absent circuit reads.
func closedRecord(name string) driver.CircuitRecord {
	return driver.CircuitRecord{Name: name, State: driver.Closed}
}

// load returns the circuit's record, a new closed one if absent; db.mu is
// held. The caller stores it back with save.
func load(sp *space, name string) driver.CircuitRecord {
	if r := sp.circuits[name]; r != nil {
		return *r
	}
	return closedRecord(name)
}

// save stores a changed record (bumping its version) and tells the
// watchers; db.mu is held.
func (c *circuits) save(sp *space, r driver.CircuitRecord, now time.Time) driver.CircuitRecord {
	r.Version++
	r.UpdatedAt = now
	sp.circuits[r.Name] = &r
	c.s().notifyCircuit(r)
	return r
}

func openCircuit(r *driver.CircuitRecord, now time.Time) {
	r.State = driver.Open
	r.OpenedAt = now
	r.ProbeOwner, r.ProbeUntil, r.Probes = "", time.Time{}, 0
	resetCounts(r)
}

// resetCounts starts a new counting period; Failures is kept.
func resetCounts(r *driver.CircuitRecord) {
	r.Successes, r.TotalFailures, r.ConsecutiveSuccesses = 0, 0, 0
}

// closeCircuit closes r: counts (Failures included) reset, a new period
// starts, the probe slots are cleared and OpenedAt is cleared (the closed
// period is generation 0, so outcomes of the probing generation no longer
// apply).
func closeCircuit(r *driver.CircuitRecord, now time.Time) {
	r.State = driver.Closed
	r.Failures = 0
	r.OpenedAt = time.Time{}
	resetCounts(r)
	r.IntervalStart = now
	r.ProbeOwner, r.ProbeUntil, r.Probes = "", time.Time{}, 0
}

// otherGen reports whether an outcome of generation gen belongs to
// another generation than r's.
func otherGen(r driver.CircuitRecord, gen int64) bool {
	return gen != driver.AnyGeneration && gen != r.Generation()
}

// otherEpoch reports whether a probe's outcome of probe epoch epoch comes
// from a slot r no longer grants (0: not a probe).
func otherEpoch(r driver.CircuitRecord, epoch int64) bool {
	return epoch != 0 && epoch != r.ProbeEpoch
}

// RecordFailure adds one failure, opening the circuit at threshold or from
// half-open; a failure of another generation changes nothing.
func (c *circuits) RecordFailure(ctx context.Context, name string, threshold int, gen int64) (driver.CircuitRecord, error) {
	return c.RecordOutcome(ctx, name, driver.Failure(gen, threshold))
}

// RecordSuccess records a success: closed resets the failures, half-open
// closes, open stays open; a success of another generation changes
// nothing.
func (c *circuits) RecordSuccess(ctx context.Context, name string, gen int64) (driver.CircuitRecord, error) {
	return c.RecordOutcome(ctx, name, driver.Success(gen))
}

// RecordOutcome records o under the store's lock; see driver.Circuits.
func (c *circuits) RecordOutcome(ctx context.Context, name string, o driver.Outcome) (driver.CircuitRecord, error) {
	s := c.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return driver.CircuitRecord{}, err
	}
	defer s.end()
	r := load(sp, name)
	if otherGen(r, o.Gen) || otherEpoch(r, o.ProbeEpoch) {
		return r, nil
	}
	if r.State == driver.Closed {
		if o.Interval > 0 {
			switch {
			case r.IntervalStart.IsZero():
				r.IntervalStart = now
			case !after(r.IntervalStart, o.Interval).After(now):
				resetCounts(&r)
				r.Failures = 0
				r.IntervalStart = now
			}
		}
		r.Successes += max(o.Successes, 0)
	}
	switch o.Kind {
	case driver.OutcomeFailure:
		r.Failures++
		r.LastFailure = now
		switch r.State {
		case driver.Closed:
			r.TotalFailures++
			r.ConsecutiveSuccesses = 0
			if o.Threshold > 0 && r.Failures >= int64(o.Threshold) {
				openCircuit(&r, now)
			}
		case driver.HalfOpen:
			openCircuit(&r, now)
		}
	case driver.OutcomeSuccess:
		r.LastSuccess = now
		switch r.State {
		case driver.Closed:
			r.Failures = 0
			r.Successes++
			r.ConsecutiveSuccesses++
		case driver.HalfOpen:
			r.Successes++
			r.ConsecutiveSuccesses++
			if live := r.LiveProbes(now); live > 0 {
				r.Probes = live - 1
			} else {
				r.Probes = 0
			}
			if r.ConsecutiveSuccesses >= int64(max(o.CloseAfter, 1)) {
				closeCircuit(&r, now)
			}
		}
	}
	return c.save(sp, r, now), nil
}

// Trip opens a closed circuit still at version.
func (c *circuits) Trip(ctx context.Context, name string, version int64) (driver.CircuitRecord, bool, error) {
	s := c.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return driver.CircuitRecord{}, false, err
	}
	defer s.end()
	r := load(sp, name)
	if r.State != driver.Closed || r.Version != version || sp.circuits[name] == nil {
		return r, false, nil
	}
	openCircuit(&r, now)
	return c.save(sp, r, now), true, nil
}

// TryProbe grants the half-open probe slot to one caller.
func (c *circuits) TryProbe(ctx context.Context, name, owner string, openFor, lease time.Duration) (driver.CircuitRecord, bool, error) {
	return c.TryProbes(ctx, name, owner, openFor, lease, 1)
}

// TryProbes grants one of maxProbes probe slots.
func (c *circuits) TryProbes(ctx context.Context, name, owner string, openFor, lease time.Duration, maxProbes int) (driver.CircuitRecord, bool, error) {
	s := c.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return driver.CircuitRecord{}, false, err
	}
	defer s.end()
	r := load(sp, name)
	switch r.State {
	case driver.Open:
		if after(r.OpenedAt, openFor).After(now) {
			return r, false, nil
		}
		r.State = driver.HalfOpen
		resetCounts(&r)
		r.Probes = 1
		r.ProbeEpoch++
	case driver.HalfOpen:
		live := r.LiveProbes(now)
		switch {
		case !r.ProbeUntil.After(now): // every slot lapsed: a new set
			r.Probes = 1
			r.ProbeEpoch++
		case r.ProbeOwner == owner:
			r.Probes = max(live, 1)
		case live < int64(maxProbes):
			r.Probes = live + 1
		default:
			return r, false, nil
		}
	default:
		return r, false, nil
	}
	r.ProbeOwner, r.ProbeUntil = owner, after(now, lease)
	return c.save(sp, r, now), true, nil
}

// Get returns the circuit's record.
func (c *circuits) Get(ctx context.Context, name string) (driver.CircuitRecord, bool, error) {
	s := c.s()
	sp, _, err := s.begin(ctx)
	if err != nil {
		return driver.CircuitRecord{}, false, err
	}
	defer s.end()
	if r := sp.circuits[name]; r != nil {
		return *r, true, nil
	}
	return closedRecord(name), false, nil
}

// Set forces a state.
func (c *circuits) Set(ctx context.Context, name string, state driver.CircuitState) (driver.CircuitRecord, error) {
	s := c.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return driver.CircuitRecord{}, err
	}
	defer s.end()
	r := load(sp, name)
	r.State = state
	r.ProbeOwner, r.ProbeUntil, r.Probes = "", time.Time{}, 0
	r.ProbeEpoch++
	resetCounts(&r)
	switch state {
	case driver.Closed:
		r.Failures = 0
		r.IntervalStart = now
		r.OpenedAt = time.Time{}
	case driver.Open:
		r.OpenedAt = now
	}
	return c.save(sp, r, now), nil
}

// Delete removes the circuit's record. Watchers receive the record as it
// reads afterwards: closed, version 0.
func (c *circuits) Delete(ctx context.Context, name string) (bool, error) {
	s := c.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return false, err
	}
	defer s.end()
	if sp.circuits[name] == nil {
		return false, nil
	}
	delete(sp.circuits, name)
	r := closedRecord(name)
	r.UpdatedAt = now
	s.notifyCircuit(r)
	return true, nil
}

// List returns the circuits whose names match pattern, sorted by name.
func (c *circuits) List(ctx context.Context, pattern driver.Pattern) ([]driver.CircuitRecord, error) {
	s := c.s()
	sp, _, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer s.end()
	recs := []driver.CircuitRecord{}
	for name, r := range sp.circuits {
		if pattern.Match(name) {
			recs = append(recs, *r)
		}
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Name < recs[j].Name })
	return recs, nil
}
