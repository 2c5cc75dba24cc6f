package postgres

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
)

// circuits is the circuit-breaker driver. Each change is one statement
// that returns the record it produced (or, when it changed nothing, the
// current one) and notifies watchers of the change.
type circuits struct{ s *store }

// circRow holds the scan targets of one circuit row.
type circRow struct {
	sk, state                        string
	probe                            sql.NullString
	failures, version                int64
	lastF, lastS, opened, until, upd sql.NullTime
	succ, tf, cs, probes, epoch      int64
	ist                              sql.NullTime
}

func (r *circRow) dest() []any {
	return []any{&r.sk, &r.state, &r.failures, &r.lastF, &r.lastS, &r.opened, &r.probe, &r.until, &r.version, &r.upd,
		&r.succ, &r.tf, &r.cs, &r.ist, &r.probes, &r.epoch}
}

func (c circuits) record(r *circRow) driver.CircuitRecord {
	st := driver.CircuitState(r.state)
	if !st.Valid() {
		st = driver.Closed
	}
	return driver.CircuitRecord{
		Name: strings.TrimPrefix(r.sk, c.s.circPfx), State: st, Failures: r.failures,
		LastFailure: utc(r.lastF), LastSuccess: utc(r.lastS), OpenedAt: utc(r.opened),
		ProbeOwner: r.probe.String, ProbeUntil: utc(r.until), Version: r.version, UpdatedAt: utc(r.upd),
		Successes: r.succ, TotalFailures: r.tf, ConsecutiveSuccesses: r.cs, IntervalStart: utc(r.ist), Probes: r.probes,
		ProbeEpoch: r.epoch,
	}
}

// write runs a change statement that returns the row it produced, or the
// current row when it changed nothing (with a count of notifications:
// changed reports whether it changed the row). A statement that returns
// no row changed nothing: if retry, it lost a race to a concurrent first
// insert and runs again; otherwise the circuit is read (absent: closed).
func (c circuits) write(ctx context.Context, name string, retryEmpty bool, query string, args ...any) (rec driver.CircuitRecord, changed bool, err error) {
	for range raceAttempts {
		var r circRow
		var events int64
		found, err := c.s.row(ctx, query, args, append(r.dest(), &events)...)
		if err != nil {
			return driver.CircuitRecord{}, false, err
		}
		if found {
			return c.record(&r), events > 0, nil
		}
		if retryEmpty {
			continue
		}
		rec, found, err = c.Get(ctx, name)
		if err != nil {
			return driver.CircuitRecord{}, false, err
		}
		if !found {
			rec = driver.CircuitRecord{Name: name, State: driver.Closed}
		}
		return rec, false, nil
	}
	return driver.CircuitRecord{}, false, errRace
}

// RecordFailure implements driver.Circuits.
func (c circuits) RecordFailure(ctx context.Context, name string, threshold int, gen int64) (driver.CircuitRecord, error) {
	return c.RecordOutcome(ctx, name, driver.Failure(gen, threshold))
}

// RecordSuccess implements driver.Circuits.
func (c circuits) RecordSuccess(ctx context.Context, name string, gen int64) (driver.CircuitRecord, error) {
	return c.RecordOutcome(ctx, name, driver.Success(gen))
}

// RecordOutcome implements driver.Circuits in one statement. An outcome
// of generation 0 or any applies to an absent circuit (creating it); one
// of a later generation, or a probe's, needs the circuit, so for it an
// empty answer means another generation or probe epoch.
func (c circuits) RecordOutcome(ctx context.Context, name string, o driver.Outcome) (driver.CircuitRecord, error) {
	var kind int32
	switch o.Kind {
	case driver.OutcomeSuccess:
		kind = 1
	case driver.OutcomeFailure:
		kind = 2
	}
	var iv int64
	if o.Interval > 0 {
		iv = driver.Millis(o.Interval)
	}
	rec, _, err := c.write(ctx, name, o.Gen <= 0 && o.ProbeEpoch == 0, c.s.q.circOutcome, c.s.prefix, c.s.circPfx+name, kind, o.Gen,
		max(o.Successes, 0), int64(o.Threshold), int64(o.CloseAfter), iv, o.ProbeEpoch)
	return rec, err
}

// Trip implements driver.Circuits in one conditional update.
func (c circuits) Trip(ctx context.Context, name string, version int64) (driver.CircuitRecord, bool, error) {
	return c.write(ctx, name, false, c.s.q.circTrip, c.s.prefix, c.s.circPfx+name, version)
}

// TryProbe implements driver.Circuits.
func (c circuits) TryProbe(ctx context.Context, name, owner string, openFor, lease time.Duration) (driver.CircuitRecord, bool, error) {
	return c.TryProbes(ctx, name, owner, openFor, lease, 1)
}

// TryProbes implements driver.Circuits in one conditional update.
func (c circuits) TryProbes(ctx context.Context, name, owner string, openFor, lease time.Duration, maxProbes int) (driver.CircuitRecord, bool, error) {
	var ofMS int64
	if openFor > 0 {
		ofMS = driver.Millis(openFor)
	}
	return c.write(ctx, name, false, c.s.q.circProbes, c.s.prefix, c.s.circPfx+name, owner, ofMS, driver.Millis(lease), int64(maxProbes))
}

// Get implements driver.Circuits.
func (c circuits) Get(ctx context.Context, name string) (driver.CircuitRecord, bool, error) {
	var r circRow
	found, err := c.s.row(ctx, c.s.q.circGet, []any{c.s.prefix, c.s.circPfx + name}, r.dest()...)
	if err != nil || !found {
		return driver.CircuitRecord{}, false, err
	}
	return c.record(&r), true, nil
}

// Set implements driver.Circuits in one upsert.
func (c circuits) Set(ctx context.Context, name string, state driver.CircuitState) (driver.CircuitRecord, error) {
	rec, _, err := c.write(ctx, name, false, c.s.q.circSet, c.s.prefix, c.s.circPfx+name, string(state))
	return rec, err
}

// Delete implements driver.Circuits.
func (c circuits) Delete(ctx context.Context, name string) (bool, error) {
	var n, events int64
	_, err := c.s.row(ctx, c.s.q.circDelete, []any{c.s.prefix, c.s.circPfx + name}, &n, &events)
	return n > 0, err
}

// List implements driver.Circuits.
func (c circuits) List(ctx context.Context, pattern driver.Pattern) ([]driver.CircuitRecord, error) {
	var out []driver.CircuitRecord
	err := c.s.list(ctx, c.s.q.circList, c.s.circPfx, pattern, func(rows rowsIter) (string, error) {
		var r circRow
		if err := rows.Scan(r.dest()...); err != nil {
			return "", err
		}
		if rec := c.record(&r); strings.HasPrefix(r.sk, c.s.circPfx) && pattern.Match(rec.Name) {
			out = append(out, rec)
		}
		return r.sk, nil
	})
	return out, err
}
