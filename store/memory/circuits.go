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
	r.ProbeOwner, r.ProbeUntil = "", time.Time{}
}

// otherGen reports whether an outcome of generation gen belongs to
// another generation than r's.
func otherGen(r driver.CircuitRecord, gen int64) bool {
	return gen != driver.AnyGeneration && gen != r.Generation()
}

// RecordFailure adds one failure, opening the circuit at threshold or from
// half-open; a failure of another generation changes nothing.
func (c *circuits) RecordFailure(ctx context.Context, name string, threshold int, gen int64) (driver.CircuitRecord, error) {
	s := c.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return driver.CircuitRecord{}, err
	}
	defer s.end()
	r := load(sp, name)
	if otherGen(r, gen) {
		return r, nil
	}
	r.Failures++
	r.LastFailure = now
	switch r.State {
	case driver.Closed:
		if r.Failures >= int64(threshold) {
			openCircuit(&r, now)
		}
	case driver.HalfOpen:
		openCircuit(&r, now)
	}
	return c.save(sp, r, now), nil
}

// RecordSuccess records a success: closed resets the failures, half-open
// closes, open stays open; a success of another generation changes
// nothing.
func (c *circuits) RecordSuccess(ctx context.Context, name string, gen int64) (driver.CircuitRecord, error) {
	s := c.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return driver.CircuitRecord{}, err
	}
	defer s.end()
	r := load(sp, name)
	if otherGen(r, gen) {
		return r, nil
	}
	r.LastSuccess = now
	switch r.State {
	case driver.Closed:
		r.Failures = 0
	case driver.HalfOpen:
		r.State = driver.Closed
		r.Failures = 0
		r.ProbeOwner, r.ProbeUntil = "", time.Time{}
	}
	return c.save(sp, r, now), nil
}

// TryProbe grants the half-open probe slot to one caller.
func (c *circuits) TryProbe(ctx context.Context, name, owner string, openFor, lease time.Duration) (driver.CircuitRecord, bool, error) {
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
	case driver.HalfOpen:
		if r.ProbeOwner != owner && r.ProbeUntil.After(now) {
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
	r.ProbeOwner, r.ProbeUntil = "", time.Time{}
	switch state {
	case driver.Closed:
		r.Failures = 0
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
