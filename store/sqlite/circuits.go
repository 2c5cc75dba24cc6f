package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
)

// circuits is the circuit-breaker driver.
type circuits struct{ s *store }

// scanCircuit reads the columns of circCols and strips the prefix from the
// key; ok=false if the key is not in the namespace.
func (c circuits) scan(r rowScanner) (driver.CircuitRecord, bool, error) {
	var (
		key, state, probeOwner          sql.NullString
		failures, version               sql.NullInt64
		lastFail, lastOK, opened, until sql.NullInt64
		updated                         sql.NullInt64
		succ, totF, consOK, intStart    sql.NullInt64
		probes, epoch                   sql.NullInt64
	)
	if err := r.Scan(&key, &state, &failures, &lastFail, &lastOK, &opened, &probeOwner, &until, &version, &updated,
		&succ, &totF, &consOK, &intStart, &probes, &epoch); err != nil {
		return driver.CircuitRecord{}, false, err
	}
	name, ok := strings.CutPrefix(key.String, c.s.circPfx)
	st := driver.CircuitState(state.String)
	if !st.Valid() {
		st = driver.Closed
	}
	return driver.CircuitRecord{
		Name:        name,
		State:       st,
		Failures:    failures.Int64,
		LastFailure: nullMsTime(lastFail),
		LastSuccess: nullMsTime(lastOK),
		OpenedAt:    nullMsTime(opened),
		ProbeOwner:  probeOwner.String,
		ProbeUntil:  nullMsTime(until),
		Version:     version.Int64,
		UpdatedAt:   nullMsTime(updated),

		Successes:            succ.Int64,
		TotalFailures:        totF.Int64,
		ConsecutiveSuccesses: consOK.Int64,
		IntervalStart:        nullMsTime(intStart),
		Probes:               probes.Int64,
		ProbeEpoch:           epoch.Int64,
	}, ok, nil
}

// writeRow runs one upsert … RETURNING as the process's writer.
func (c circuits) writeRow(ctx context.Context, query string, args func(now int64) []any) (driver.CircuitRecord, error) {
	var rec driver.CircuitRecord
	err := c.s.write(ctx, func() error {
		r, _, err := c.scan(c.s.queryRow(ctx, nil, query, args(nowMs())...))
		rec = r
		return err
	})
	return rec, err
}

// RecordFailure implements driver.Circuits as RecordOutcome.
func (c circuits) RecordFailure(ctx context.Context, name string, threshold int, gen int64) (driver.CircuitRecord, error) {
	return c.RecordOutcome(ctx, name, driver.Failure(gen, threshold))
}

// RecordSuccess implements driver.Circuits as RecordOutcome.
func (c circuits) RecordSuccess(ctx context.Context, name string, gen int64) (driver.CircuitRecord, error) {
	return c.RecordOutcome(ctx, name, driver.Success(gen))
}

// outcomeKinds are the :kind values of the outcome statements.
var outcomeKinds = map[driver.OutcomeKind]int64{driver.OutcomeNone: 0, driver.OutcomeSuccess: 1, driver.OutcomeFailure: 2}

// RecordOutcome implements driver.Circuits in one upsert (generation 0 or
// any, no probe epoch) or update (a generation above 0, or a probe's
// outcome: the circuit must exist), conditional on the generation and
// the probe epoch; an outcome that does not apply (another generation, a
// probe slot no longer granted, or successes alone on a circuit that is
// not closed) returns the current record.
func (c circuits) RecordOutcome(ctx context.Context, name string, o driver.Outcome) (driver.CircuitRecord, error) {
	q := c.s.q.circOutcome
	if o.Gen > 0 || o.ProbeEpoch > 0 {
		q = c.s.q.circOutcomeGen
	}
	return c.outcome(ctx, name, q, func(now int64) []any {
		return []any{sql.Named("key", c.s.circPfx+name), sql.Named("now", now), sql.Named("gen", o.Gen), sql.Named("pe", o.ProbeEpoch),
			sql.Named("kind", outcomeKinds[o.Kind]), sql.Named("b", max(o.Successes, 0)), sql.Named("th", int64(o.Threshold)),
			sql.Named("ca", int64(o.CloseAfter)), sql.Named("iv", driver.Millis(o.Interval))}
	})
}

// Trip implements driver.Circuits in one conditional update.
func (c circuits) Trip(ctx context.Context, name string, version int64) (driver.CircuitRecord, bool, error) {
	rec, err := c.writeRow(ctx, c.s.q.circTrip, func(now int64) []any {
		return []any{sql.Named("key", c.s.circPfx+name), sql.Named("now", now), sql.Named("v", version)}
	})
	if err == nil {
		return rec, true, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return rec, false, err
	}
	rec, found, err := c.Get(ctx, name)
	if err == nil && !found {
		rec = driver.CircuitRecord{Name: name, State: driver.Closed}
	}
	return rec, false, err
}

// outcome runs an outcome's upsert; when it applies to nothing (the
// outcome's generation is over) it returns the current record.
func (c circuits) outcome(ctx context.Context, name, query string, args func(now int64) []any) (driver.CircuitRecord, error) {
	rec, err := c.writeRow(ctx, query, args)
	if !errors.Is(err, sql.ErrNoRows) {
		return rec, err
	}
	rec, found, err := c.Get(ctx, name)
	if err == nil && !found {
		rec = driver.CircuitRecord{Name: name, State: driver.Closed}
	}
	return rec, err
}

// TryProbe implements driver.Circuits as TryProbes with one slot.
func (c circuits) TryProbe(ctx context.Context, name, owner string, openFor, lease time.Duration) (driver.CircuitRecord, bool, error) {
	return c.TryProbes(ctx, name, owner, openFor, lease, 1)
}

// TryProbes implements driver.Circuits. The grant is one conditional
// update; when it does not apply, the record returned tells why.
func (c circuits) TryProbes(ctx context.Context, name, owner string, openFor, lease time.Duration, maxProbes int) (driver.CircuitRecord, bool, error) {
	s := c.s
	sk := s.circPfx + name
	var rec driver.CircuitRecord
	var granted bool
	try := func(tx *sql.Tx) error {
		now := nowMs()
		r, _, err := c.scan(s.queryRow(ctx, tx, s.q.circProbe,
			sql.Named("key", sk), sql.Named("owner", owner), sql.Named("now", now),
			sql.Named("until", now+driver.Millis(lease)), sql.Named("openfor", driver.Millis(openFor)), sql.Named("max", int64(maxProbes))))
		switch {
		case err == nil:
			rec, granted = r, true
		case errors.Is(err, sql.ErrNoRows):
		default:
			return err
		}
		return nil
	}
	err := s.write(ctx, func() error { return try(nil) })
	if err != nil || granted {
		return rec, granted, err
	}
	// Read the record without the write lock: if it refuses the probe now,
	// that is a consistent answer; otherwise it changed in between, and
	// the attempt is repeated in a transaction.
	cur, found, err := c.Get(ctx, name)
	if err != nil {
		return cur, false, err
	}
	if !found {
		return driver.CircuitRecord{Name: name, State: driver.Closed}, false, nil
	}
	if !probeAllowed(cur, owner, openFor, maxProbes, msTime(nowMs())) {
		return cur, false, nil
	}
	err = s.tx(ctx, func(tx *sql.Tx) error {
		if err := try(tx); err != nil || granted {
			return err
		}
		r, _, err := c.scan(s.queryRow(ctx, tx, s.q.circGet, sql.Named("key", sk)))
		switch {
		case err == nil:
			rec = r
		case errors.Is(err, sql.ErrNoRows):
			rec = driver.CircuitRecord{Name: name, State: driver.Closed}
		default:
			return err
		}
		return nil
	})
	return rec, granted, err
}

// probeAllowed is the grant condition of circProbe, evaluated on a record.
func probeAllowed(r driver.CircuitRecord, owner string, openFor time.Duration, maxProbes int, now time.Time) bool {
	switch r.State {
	case driver.Open:
		return !r.OpenedAt.Add(time.Duration(driver.Millis(openFor)) * time.Millisecond).After(now)
	case driver.HalfOpen:
		return r.ProbeOwner == owner || r.LiveProbes(now) < int64(maxProbes) || !r.ProbeUntil.After(now)
	}
	return false
}

// Get implements driver.Circuits.
func (c circuits) Get(ctx context.Context, name string) (driver.CircuitRecord, bool, error) {
	rec, _, err := c.scan(c.s.readRow(ctx, c.s.q.circGet, sql.Named("key", c.s.circPfx+name)))
	if errors.Is(err, sql.ErrNoRows) {
		return driver.CircuitRecord{}, false, nil
	}
	if err != nil {
		return driver.CircuitRecord{}, false, ctxErr(ctx, err)
	}
	return rec, true, nil
}

// Set implements driver.Circuits in one upsert.
func (c circuits) Set(ctx context.Context, name string, state driver.CircuitState) (driver.CircuitRecord, error) {
	return c.writeRow(ctx, c.s.q.circSet, func(now int64) []any {
		return []any{sql.Named("key", c.s.circPfx+name), sql.Named("state", string(state)), sql.Named("now", now)}
	})
}

// Delete implements driver.Circuits.
func (c circuits) Delete(ctx context.Context, name string) (bool, error) {
	return c.s.execOK(ctx, c.s.q.circDelete, func(int64) []any {
		return []any{sql.Named("key", c.s.circPfx+name)}
	})
}

// List implements driver.Circuits.
func (c circuits) List(ctx context.Context, pattern driver.Pattern) ([]driver.CircuitRecord, error) {
	s := c.s
	cond, args := s.nsRange("key", s.circPfx+pattern.Prefix())
	args = append(args, pattern.SQLiteGlob(s.circPfx))
	rows, err := s.readQuery(ctx, fmt.Sprintf(s.q.circList, cond), args...)
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	defer rows.Close()
	var out []driver.CircuitRecord
	for rows.Next() {
		rec, ok, err := c.scan(rows)
		if err != nil {
			return nil, ctxErr(ctx, err)
		}
		if ok && pattern.Match(rec.Name) {
			out = append(out, rec)
		}
	}
	return out, ctxErr(ctx, rows.Err())
}
