package main

import (
	"context"
	"strconv"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

func breakerCommands() []*command {
	return []*command{
		{
			path:     "breaker ls",
			readOnly: true,
			args:     "[PATTERN]",
			summary:  "list circuit breakers with their state and failure count",
			maxArgs:  1,
			help: `
Lists the circuit breakers whose names match the glob PATTERN ('*' any run,
'?' one character, '\' escapes; default: all), sorted by name. A breaker
that never recorded anything has no record and is closed.`,
			example: `warden breaker ls 'payments-*'`,
			setup:   noFlags(breakerLs),
		},
		{
			path:     "breaker show",
			readOnly: true,
			args:     "NAME",
			summary:  "show a circuit breaker; exits 3 if it is not closed",
			need:     []string{"NAME"},
			maxArgs:  1,
			help: `
Shows the shared state of the circuit breaker NAME: state (closed, open,
half-open), consecutive failures, last failure and success, when it opened,
the counts of the current counting period (successes, failures, successes
in a row, when the period began), the half-open probe slots granted and
their newest holder, version. Exits 3 when the circuit is open or
half-open (calls through it are refused, but for its probes), so that
scripts can test it. A circuit without a record (never failed, or reset)
is closed: it is shown as "closed (no record)" and exits 0.`,
			example: `warden breaker show payments-api || echo "payments are off"`,
			setup:   noFlags(breakerShow),
		},
		{
			path:    "breaker open",
			args:    "NAME",
			summary: "force a circuit breaker open",
			need:    []string{"NAME"},
			maxArgs: 1,
			help: `
Forces the circuit breaker NAME open, in every process that uses it: calls
fail fast until its open period passes and a probe succeeds, or until
'warden breaker close'.`,
			example: `warden breaker open payments-api`,
			setup:   noFlags(breakerSetter(driver.Open)),
		},
		{
			path:     "breaker close",
			noCreate: true,
			args:     "NAME",
			summary:  "force a circuit breaker closed, resetting its failures",
			need:     []string{"NAME"},
			maxArgs:  1,
			help: `
Forces the circuit breaker NAME closed and resets its failure count, in
every process that uses it. Exits 4, creating nothing, if NAME has no
record: such a circuit already reads as closed.`,
			example: `warden breaker close payments-api`,
			setup:   noFlags(breakerSetter(driver.Closed)),
		},
		{
			path:     "breaker reset",
			noCreate: true,
			args:     "NAME",
			summary:  "delete a circuit breaker's record (it reads as closed)",
			need:     []string{"NAME"},
			maxArgs:  1,
			help: `
Deletes the record of the circuit breaker NAME: it reads as closed with no
failures, as if it had never recorded anything. Exits 4 if it has no
record.`,
			example: `warden breaker reset payments-api`,
			setup:   noFlags(breakerReset),
		},
	}
}

// circuitJSON is a circuit breaker's JSON form.
type circuitJSON struct {
	Name        string   `json:"name"`
	State       string   `json:"state"`
	Failures    int64    `json:"failures"`
	LastFailure jsonTime `json:"last_failure"`
	LastSuccess jsonTime `json:"last_success"`
	OpenedAt    jsonTime `json:"opened_at"`
	// The counts of the current counting period (breaker.Options.Interval
	// in the closed state; since turning half-open in the half-open one).
	Successes            int64    `json:"successes"`
	TotalFailures        int64    `json:"total_failures"`
	ConsecutiveSuccesses int64    `json:"consecutive_successes"`
	IntervalStart        jsonTime `json:"interval_start"`
	Probes               int64    `json:"probes"`
	ProbeOwner           string   `json:"probe_owner"`
	ProbeUntil           jsonTime `json:"probe_until"`
	Version              int64    `json:"version"`
	UpdatedAt            jsonTime `json:"updated_at"`
	// Recorded is false for a circuit without a record (breaker show),
	// which is closed.
	Recorded bool `json:"recorded"`
}

func toCircuitJSON(r driver.CircuitRecord) circuitJSON {
	return circuitJSON{
		Name: r.Name, State: string(r.State), Failures: r.Failures,
		LastFailure: jsonTime(r.LastFailure), LastSuccess: jsonTime(r.LastSuccess),
		OpenedAt:  jsonTime(r.OpenedAt),
		Successes: r.Successes, TotalFailures: r.TotalFailures,
		ConsecutiveSuccesses: r.ConsecutiveSuccesses, IntervalStart: jsonTime(r.IntervalStart),
		Probes: r.Probes, ProbeOwner: r.ProbeOwner, ProbeUntil: jsonTime(r.ProbeUntil),
		Version: r.Version, UpdatedAt: jsonTime(r.UpdatedAt), Recorded: true,
	}
}

func breakerLs(ctx context.Context, c *cli, args []string) error {
	var recs []driver.CircuitRecord
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		recs, err = st.Circuits().List(ctx, argOr(args, 0, ""))
		return err
	})
	if err != nil {
		return err
	}
	if c.isJSON() {
		out := make([]circuitJSON, 0, len(recs))
		for _, r := range recs {
			out = append(out, toCircuitJSON(r))
		}
		return c.printJSON(out)
	}
	tw := c.table("NAME", "STATE", "FAILURES", "LAST FAILURE", "OPENED", "UPDATED")
	for _, r := range recs {
		row(tw, cell(r.Name), string(r.State), strconv.FormatInt(r.Failures, 10), tableTime(r.LastFailure), tableTime(r.OpenedAt), tableTime(r.UpdatedAt))
	}
	return tw.Flush()
}

// printCircuit shows one circuit breaker; recorded is false for a circuit
// without a record (shown closed).
func (c *cli) printCircuit(r driver.CircuitRecord, recorded bool) error {
	if c.isJSON() {
		j := toCircuitJSON(r)
		j.Recorded = recorded
		return c.printJSON(j)
	}
	state := string(r.State)
	if !recorded {
		state += " (no record)"
	}
	return c.printFields([]field{
		{"name", cell(r.Name)},
		{"state", state},
		{"failures", strconv.FormatInt(r.Failures, 10)},
		{"last_failure", tableTime(r.LastFailure)},
		{"last_success", tableTime(r.LastSuccess)},
		{"opened_at", tableTime(r.OpenedAt)},
		{"successes", strconv.FormatInt(r.Successes, 10)},
		{"total_failures", strconv.FormatInt(r.TotalFailures, 10)},
		{"consecutive_successes", strconv.FormatInt(r.ConsecutiveSuccesses, 10)},
		{"interval_start", tableTime(r.IntervalStart)},
		{"probes", strconv.FormatInt(r.Probes, 10)},
		{"probe_owner", cell(r.ProbeOwner)},
		{"probe_until", tableTime(r.ProbeUntil)},
		{"version", strconv.FormatInt(r.Version, 10)},
		{"updated_at", tableTime(r.UpdatedAt)},
	})
}

func breakerShow(ctx context.Context, c *cli, args []string) error {
	var rec driver.CircuitRecord
	var found bool
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		rec, found, err = st.Circuits().Get(ctx, args[0])
		return err
	})
	if err != nil {
		return err
	}
	if !found {
		// Never recorded anything, or reset: closed, as every process
		// using it reads it.
		rec = driver.CircuitRecord{Name: args[0], State: driver.Closed}
	}
	if err := c.printCircuit(rec, found); err != nil {
		return err
	}
	if rec.State != driver.Closed {
		return exitf(exitHeld, "circuit breaker %s is %s", quoteShort(args[0]), rec.State)
	}
	return nil
}

// breakerSetter returns the command that forces a circuit into state.
func breakerSetter(state driver.CircuitState) runFunc {
	return func(ctx context.Context, c *cli, args []string) error {
		var rec driver.CircuitRecord
		err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
			if state == driver.Closed {
				// A circuit without a record already reads as closed:
				// closing a mistyped name must not create one.
				if _, found, err := st.Circuits().Get(ctx, args[0]); err != nil || !found {
					if err == nil {
						err = notFoundf("circuit breaker %s has no record (it reads as closed; nothing to close)", quoteShort(args[0]))
					}
					return err
				}
			}
			rec, err = st.Circuits().Set(ctx, args[0], state)
			return err
		})
		if err != nil {
			return err
		}
		return c.printCircuit(rec, true)
	}
}

func breakerReset(ctx context.Context, c *cli, args []string) error {
	var ok bool
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		ok, err = st.Circuits().Delete(ctx, args[0])
		return err
	})
	if err != nil {
		return err
	}
	if !ok {
		return notFoundf("circuit breaker %s has no record", quoteShort(args[0]))
	}
	if c.isJSON() {
		return c.printJSON(struct {
			Name  string `json:"name"`
			Reset bool   `json:"reset"`
		}{args[0], true})
	}
	return c.printf("reset circuit breaker %s (it reads as closed)", cell(args[0]))
}
