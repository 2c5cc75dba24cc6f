package mysql

import (
	"context"
	"database/sql"
	"errors"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/warden-go/warden/driver"
)

// circuits is the circuit-breaker driver. Each change is one conditional
// upsert or update followed by a read of the row, in one transaction.
type circuits struct{ s *store }

// circSQL are the circuit statements of one circuits table. The outcome
// statements name their parameters (see named).
type circSQL struct {
	outcome, outcomeGen         named
	trip, probe, get, set, list string
}

// named is a statement whose parameters are named in its text (:kind,
// :b, :th, :ca, :iv, :gen, :pe, :ns, :key) and rendered as ?, in order.
type named struct {
	query string
	names []string
}

var paramRe = regexp.MustCompile(`:(kind|b|th|ca|iv|gen|pe|ns|key)\b`)

func newNamed(query string) named {
	var n named
	n.query = paramRe.ReplaceAllStringFunc(query, func(m string) string {
		n.names = append(n.names, m[1:])
		return "?"
	})
	return n
}

// args returns the statement's arguments from their values by name.
func (n named) args(vals map[string]any) []any {
	out := make([]any, len(n.names))
	for i, name := range n.names {
		out[i] = vals[name]
	}
	return out
}

// circStatements caches the statements by table name.
var circStatements sync.Map

// sql returns the store's circuit statements.
func (c circuits) sql() *circSQL {
	if q, ok := circStatements.Load(c.s.t.Circuits); ok {
		return q.(*circSQL)
	}
	q := buildCircSQL(c.s.t.Circuits)
	circStatements.Store(c.s.t.Circuits, q)
	return q
}

const circColumns = "`key`, state, failure_count, last_failure_time, last_success_time, opened_at, probe_owner, probe_until, version, updated_at, " +
	"successes, total_failures, consecutive_successes, interval_start, probes, probe_epoch"

// buildCircSQL renders the circuit statements for table.
//
// RecordOutcome is one statement (:kind: 2 failure, 1 success, 0
// successes alone; :b: batched successes; :th: threshold, 0 never; :ca:
// successes that close; :iv: counting interval in µs, 0 none; :gen; :pe:
// a probe's probe epoch, 0 for other calls). The parameters are bound
// where they are used. The first assignment (of the ON DUPLICATE KEY
// UPDATE clause, or of the plain UPDATE of a generation above 0 or of a
// probe's outcome) computes, from the row as it was, every decision into
// session variables (@w_ok: the outcome applies — its generation and
// probe epoch are the circuit's; @w_cl: closed; @w_ho:
// half-open; @w_ov: the counting period is over; @w_f0: the failures of
// the running period; @w_op: it opens; @w_cs: it closes; @w_lv: a live
// probe slot). MySQL runs the assignments left to right, each seeing the
// columns assigned before it, so every later assignment uses only these
// variables and its own column's old value.
func buildCircSQL(table string) *circSQL {
	r := strings.NewReplacer("{C}", "`"+table+"`", "NOW", nowSQL, "EXP(?)", expSQL)
	const kkey = "(namespace = ? OR namespace = '') AND `key` = ?"
	const kns = "(namespace = ? OR namespace = '')"
	// The decisions, from the row as it was; a sum and ANDs evaluate
	// every assignment in order (none can be folded away: each depends on
	// the row).
	flags := `((@w_cl := state NOT IN ('open', 'half-open'))
			+ (@w_ho := state = 'half-open')
			+ (@w_ov := (:iv > 0 AND interval_start IS NOT NULL AND TIMESTAMPADD(MICROSECOND, :iv, interval_start) <= NOW))
			+ (@w_f0 := IF(@w_ov, 0, failure_count))
			+ (@w_lv := (COALESCE(probe_until, '1970-01-01') > NOW AND probes >= 1))) >= 0
		AND (@w_op := (:kind = 2 AND (@w_ho OR (@w_cl AND :th > 0 AND @w_f0 + 1 >= :th)))) >= 0
		AND (@w_cs := (:kind = 1 AND @w_ho AND consecutive_successes + 1 >= GREATEST(:ca, 1))) >= 0
		AND (@w_ok := (:gen < 0 OR COALESCE(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', opened_at) DIV 1000, 0) = :gen)
			AND (:pe = 0 OR probe_epoch = :pe)
			AND NOT (:kind = 0 AND NOT @w_cl))`
	changes := `,
	failure_count = IF(@w_ok, CASE
		WHEN :kind = 2 AND @w_cl THEN @w_f0 + 1
		WHEN :kind = 2 THEN failure_count + 1
		WHEN @w_cs OR (:kind = 1 AND @w_cl) THEN 0
		WHEN @w_cl THEN @w_f0
		ELSE failure_count END, failure_count),
	successes = IF(@w_ok, CASE
		WHEN @w_op OR @w_cs THEN 0
		WHEN @w_cl THEN IF(@w_ov, 0, successes) + :b + (:kind = 1)
		WHEN @w_ho AND :kind = 1 THEN successes + 1
		ELSE successes END, successes),
	total_failures = IF(@w_ok, CASE
		WHEN @w_op OR @w_cs THEN 0
		WHEN @w_cl THEN IF(@w_ov, 0, total_failures) + (:kind = 2)
		ELSE total_failures END, total_failures),
	consecutive_successes = IF(@w_ok, CASE
		WHEN @w_op OR @w_cs OR (:kind = 2 AND @w_cl) THEN 0
		WHEN @w_cl THEN IF(@w_ov, 0, consecutive_successes) + (:kind = 1)
		WHEN @w_ho AND :kind = 1 THEN consecutive_successes + 1
		ELSE consecutive_successes END, consecutive_successes),
	interval_start = IF(@w_ok, CASE
		WHEN @w_cs THEN NOW
		WHEN @w_op THEN interval_start
		WHEN @w_cl AND :iv > 0 AND (interval_start IS NULL OR @w_ov) THEN NOW
		ELSE interval_start END, interval_start),
	probes = IF(@w_ok, CASE
		WHEN @w_op OR @w_cs THEN 0
		WHEN @w_ho AND :kind = 1 THEN IF(@w_lv, probes - 1, 0)
		ELSE probes END, probes),
	opened_at = IF(@w_ok AND @w_op, NOW, IF(@w_ok AND @w_cs, NULL, opened_at)),
	probe_owner = IF(@w_ok AND (@w_op OR @w_cs), NULL, probe_owner),
	probe_until = IF(@w_ok AND (@w_op OR @w_cs), NULL, probe_until),
	last_failure_time = IF(@w_ok AND :kind = 2, NOW, last_failure_time),
	last_success_time = IF(@w_ok AND :kind = 1, NOW, last_success_time),
	state = IF(@w_ok, IF(@w_op, 'open', IF(@w_cs OR @w_cl, 'closed', state)), state),
	updated_at = IF(@w_ok, NOW, updated_at)`
	insOpens := "(:kind = 2 AND :th = 1)"
	q := &circSQL{}
	q.outcome = newNamed(r.Replace(`INSERT INTO {C} (namespace, ` + "`key`" + `, state, failure_count, last_failure_time, last_success_time, opened_at,
	probe_owner, probe_until, version, updated_at, successes, total_failures, consecutive_successes, interval_start, probes)
VALUES (:ns, :key, IF(` + insOpens + `, 'open', 'closed'), :kind = 2, IF(:kind = 2, NOW, NULL),
	IF(:kind = 1, NOW, NULL), IF(` + insOpens + `, NOW, NULL), NULL, NULL, 1, NOW,
	IF(` + insOpens + `, 0, :b + (:kind = 1)), IF(` + insOpens + `, 0, :kind = 2), :kind = 1,
	IF(:iv > 0 AND NOT ` + insOpens + `, NOW, NULL), 0)
ON DUPLICATE KEY UPDATE
	version = IF(` + flags + `, version + 1, version)` + changes))
	q.outcomeGen = newNamed(r.Replace(`UPDATE {C} SET
	version = IF(` + flags + `, version + 1, version)` + changes + `
WHERE (namespace = :ns OR namespace = '') AND ` + "`key`" + ` = :key
	AND (:gen < 0 OR COALESCE(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', opened_at) DIV 1000, 0) = :gen)`))
	q.trip = r.Replace(`UPDATE {C} SET state = 'open', opened_at = NOW, probe_owner = NULL, probe_until = NULL, probes = 0,
	successes = 0, total_failures = 0, consecutive_successes = 0, version = version + 1, updated_at = NOW
WHERE ` + kkey + ` AND state NOT IN ('open', 'half-open') AND version = ?`)
	// A probe slot: open and due → half-open, the first slot; every slot
	// lapsed → the first slot; the newest slot's holder → its slot again;
	// a free slot among live ones → one more. A circuit the go-go-scope
	// adapter opened has no opened_at: it opened when it was last written.
	// Neither has one the adapter re-opened after a failed probe: it writes
	// state 'open' and leaves opened_at and the probe columns as they
	// were, while warden's own openings clear probe_owner; an open row
	// with a probe owner also opened when it was last written. A first
	// slot begins a new set of slots (probe_epoch + 1); assigned first, it
	// sees the row as it was.
	q.probe = r.Replace(`UPDATE {C} SET
	probe_epoch = IF(state = 'open' OR COALESCE(probe_until, '1970-01-01') <= NOW, probe_epoch + 1, probe_epoch),
	probes = CASE
		WHEN state = 'open' OR COALESCE(probe_until, '1970-01-01') <= NOW THEN 1
		WHEN probe_owner = ? THEN GREATEST(probes, 1)
		ELSE probes + 1 END,
	successes = IF(state = 'open', 0, successes),
	total_failures = IF(state = 'open', 0, total_failures),
	consecutive_successes = IF(state = 'open', 0, consecutive_successes),
	state = 'half-open', probe_owner = ?, probe_until = EXP(?), version = version + 1, updated_at = NOW
WHERE ` + kkey + ` AND (
	(state = 'open' AND TIMESTAMPADD(MICROSECOND, ?,
		IF(probe_owner IS NULL, COALESCE(opened_at, updated_at, '1970-01-01'), COALESCE(updated_at, '1970-01-01'))) <= NOW)
	OR (state = 'half-open' AND (COALESCE(probe_until, '1970-01-01') <= NOW OR probe_owner = ? OR probes < ?)))`)
	q.get = r.Replace(`SELECT ` + circColumns + ` FROM {C} WHERE ` + kkey)
	q.set = r.Replace(`INSERT INTO {C} (namespace, ` + "`key`" + `, state, failure_count, last_failure_time, last_success_time, opened_at,
	probe_owner, probe_until, version, updated_at, successes, total_failures, consecutive_successes, interval_start, probes, probe_epoch)
VALUES (?, ?, ?, 0, NULL, NULL, IF(? = 'open', NOW, NULL), NULL, NULL, 1, NOW, 0, 0, 0, IF(? = 'closed', NOW, NULL), 0, 1)
ON DUPLICATE KEY UPDATE
	failure_count = IF(VALUES(state) = 'closed', 0, failure_count),
	opened_at = CASE VALUES(state) WHEN 'open' THEN NOW WHEN 'closed' THEN NULL ELSE opened_at END,
	interval_start = IF(VALUES(state) = 'closed', NOW, interval_start),
	state = VALUES(state),
	probe_owner = NULL,
	probe_until = NULL,
	probes = 0, successes = 0, total_failures = 0, consecutive_successes = 0,
	probe_epoch = probe_epoch + 1,
	version = version + 1,
	updated_at = NOW`)
	q.list = r.Replace(`SELECT `+circColumns+` FROM {C} WHERE `+kns+` AND %s AND `) + likeCond("`key`") + " ORDER BY `key`"
	return q
}

func (c circuits) scan(r rowScanner) (driver.CircuitRecord, error) {
	var (
		sk, probe                        []byte
		state                            string
		failures, version                int64
		lastF, lastS, opened, until, upd sql.NullTime
		succ, totF, consOK, probes       sql.NullInt64
		epoch                            sql.NullInt64
		intStart                         sql.NullTime
	)
	if err := r.Scan(&sk, &state, &failures, &lastF, &lastS, &opened, &probe, &until, &version, &upd,
		&succ, &totF, &consOK, &intStart, &probes, &epoch); err != nil {
		return driver.CircuitRecord{}, err
	}
	st := driver.CircuitState(state)
	if !st.Valid() {
		st = driver.Closed
	}
	return driver.CircuitRecord{
		Name: strings.TrimPrefix(string(sk), c.s.circPfx), State: st, Failures: failures,
		LastFailure: utc(lastF), LastSuccess: utc(lastS), OpenedAt: utc(opened),
		ProbeOwner: string(probe), ProbeUntil: utc(until), Version: version, UpdatedAt: utc(upd),
		Successes: succ.Int64, TotalFailures: totF.Int64, ConsecutiveSuccesses: consOK.Int64,
		IntervalStart: utc(intStart), Probes: probes.Int64, ProbeEpoch: epoch.Int64,
	}, nil
}

// write runs a change and reads the row back in one transaction, so the
// record returned is the one the change produced (four round trips:
// START TRANSACTION, the change, the read, COMMIT), with the number of
// rows the change affected.
func (c circuits) write(ctx context.Context, name string, query string, args ...any) (driver.CircuitRecord, int64, error) {
	var rec driver.CircuitRecord
	var n int64
	err := c.s.rowTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, query, args...)
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil {
			return err
		}
		rec, err = c.scan(tx.QueryRowContext(ctx, c.sql().get, c.s.prefix, c.s.circPfx+name))
		if errors.Is(err, sql.ErrNoRows) {
			rec, err = driver.CircuitRecord{Name: name, State: driver.Closed}, nil
		}
		return err
	})
	return rec, n, err
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

// RecordOutcome implements driver.Circuits: an upsert whose assignments
// keep every column unless the outcome applies (generation 0 or any, not
// a probe's), or an update of that generation and probe epoch (the
// circuit must exist); see buildCircSQL.
func (c circuits) RecordOutcome(ctx context.Context, name string, o driver.Outcome) (driver.CircuitRecord, error) {
	vals := map[string]any{"kind": outcomeKinds[o.Kind], "b": max(o.Successes, 0), "th": int64(o.Threshold),
		"ca": int64(o.CloseAfter), "iv": driver.Millis(o.Interval) * 1000, "gen": o.Gen, "pe": o.ProbeEpoch,
		"ns": c.s.prefix, "key": c.s.circPfx + name}
	q := c.sql().outcome
	if o.Gen > 0 || o.ProbeEpoch > 0 {
		q = c.sql().outcomeGen
	}
	rec, _, err := c.write(ctx, name, q.query, q.args(vals)...)
	return rec, err
}

// Trip implements driver.Circuits.
func (c circuits) Trip(ctx context.Context, name string, version int64) (driver.CircuitRecord, bool, error) {
	rec, n, err := c.write(ctx, name, c.sql().trip, c.s.prefix, c.s.circPfx+name, version)
	if err != nil {
		return driver.CircuitRecord{}, false, err
	}
	return rec, n > 0, nil
}

// TryProbe implements driver.Circuits as TryProbes with one slot.
func (c circuits) TryProbe(ctx context.Context, name, owner string, openFor, lease time.Duration) (driver.CircuitRecord, bool, error) {
	return c.TryProbes(ctx, name, owner, openFor, lease, 1)
}

// TryProbes implements driver.Circuits.
func (c circuits) TryProbes(ctx context.Context, name, owner string, openFor, lease time.Duration, maxProbes int) (driver.CircuitRecord, bool, error) {
	rec, n, err := c.write(ctx, name, c.sql().probe, owner, owner, usec(lease), c.s.prefix, c.s.circPfx+name,
		driver.Millis(openFor)*1000, owner, int64(maxProbes))
	if err != nil {
		return driver.CircuitRecord{}, false, err
	}
	return rec, n > 0, nil
}

// Get implements driver.Circuits.
func (c circuits) Get(ctx context.Context, name string) (driver.CircuitRecord, bool, error) {
	rec, err := c.scan(c.s.db.QueryRowContext(ctx, c.sql().get, c.s.prefix, c.s.circPfx+name))
	if errors.Is(err, sql.ErrNoRows) {
		return driver.CircuitRecord{}, false, nil
	}
	if err != nil {
		return driver.CircuitRecord{}, false, ctxErr(ctx, err)
	}
	return rec, true, nil
}

// Set implements driver.Circuits.
func (c circuits) Set(ctx context.Context, name string, state driver.CircuitState) (driver.CircuitRecord, error) {
	st := string(state)
	rec, _, err := c.write(ctx, name, c.sql().set, c.s.prefix, c.s.circPfx+name, st, st, st)
	return rec, err
}

// Delete implements driver.Circuits.
func (c circuits) Delete(ctx context.Context, name string) (bool, error) {
	n, err := c.s.execCount(ctx, c.s.q.circDelete, c.s.prefix, c.s.circPfx+name)
	return n > 0, err
}

// List implements driver.Circuits.
func (c circuits) List(ctx context.Context, pattern driver.Pattern) ([]driver.CircuitRecord, error) {
	var out []driver.CircuitRecord
	err := c.s.list(ctx, c.sql().list, "`key`", c.s.circPfx, pattern, func(rows *sql.Rows) error {
		rec, err := c.scan(rows)
		if err != nil {
			return err
		}
		if pattern.Match(rec.Name) {
			out = append(out, rec)
		}
		return nil
	})
	return out, err
}
