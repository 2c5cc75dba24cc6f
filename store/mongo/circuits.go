package mongo

import (
	"context"
	"errors"
	"sort"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// circuits is the circuit-breaker driver.
//
// A circuit document: key (prefix + "circuit:" + name), namespace, state,
// failureCount, lastFailureTime, lastSuccessTime, openedAt, probeOwner,
// probeUntil, version, updatedAt, createdAt, and the counts and probe
// slots (successes, totalFailures, consecutiveSuccesses, intervalStart,
// probes, probeEpoch; absent fields read 0). Every change is one
// findOneAndUpdate with $inc/$set whose filter names the states it applies
// to; a state transition classic operators cannot compute in one update
// (closed → open at the threshold) is a second, disjoint filter tried when
// the first matches nothing. No update is ever lost: each is one atomic
// conditional update on the server.
type circuits struct{ s *store }

type circDoc struct {
	Key         string     `bson:"key"`
	State       string     `bson:"state"`
	Failures    int64      `bson:"failureCount"`
	LastFailure *time.Time `bson:"lastFailureTime"`
	LastSuccess *time.Time `bson:"lastSuccessTime"`
	OpenedAt    *time.Time `bson:"openedAt"`
	ProbeOwner  *string    `bson:"probeOwner"`
	ProbeUntil  *time.Time `bson:"probeUntil"`
	Version     int64      `bson:"version"`
	UpdatedAt   *time.Time `bson:"updatedAt"`
	// The counts (absent in documents of writers that do not keep them:
	// they read 0).
	Successes     int64      `bson:"successes"`
	TotalFailures int64      `bson:"totalFailures"`
	ConsecOK      int64      `bson:"consecutiveSuccesses"`
	IntervalStart *time.Time `bson:"intervalStart"`
	Probes        int64      `bson:"probes"`
	// ProbeEpoch names the current set of probe slots (absent: 0).
	ProbeEpoch int64 `bson:"probeEpoch"`
}

func (d *circDoc) record(name string) driver.CircuitRecord {
	st := driver.CircuitState(d.State)
	if !st.Valid() {
		st = driver.Closed
	}
	r := driver.CircuitRecord{Name: name, State: st, Failures: d.Failures, LastFailure: utc(d.LastFailure),
		LastSuccess: utc(d.LastSuccess), OpenedAt: utc(d.OpenedAt), ProbeUntil: utc(d.ProbeUntil),
		Version: d.Version, UpdatedAt: utc(d.UpdatedAt),
		Successes: d.Successes, TotalFailures: d.TotalFailures, ConsecutiveSuccesses: d.ConsecOK,
		IntervalStart: utc(d.IntervalStart), Probes: d.Probes, ProbeEpoch: d.ProbeEpoch}
	if d.ProbeOwner != nil {
		r.ProbeOwner = *d.ProbeOwner
	}
	return r
}

var circAfter = options.FindOneAndUpdate().SetReturnDocument(options.After)

// step is one conditional update of a circuit.
type step struct {
	filter bson.D
	update bson.D
	upsert bool
}

// apply tries the steps in order until one matches, starting over (with
// fresh times) when none does; it returns the new document. op names the
// change in the error of a change that gave up.
func (c circuits) apply(ctx context.Context, op, name string, steps func(t time.Time) []step) (circDoc, error) {
	d, _, err := c.applyGen(ctx, op, name, driver.AnyGeneration, 0, steps)
	return d, err
}

// genFilter restricts a step to the circuit's generation gen: openedAt
// equal to gen's time, or null/missing for generation 0.
func genFilter(gen int64) bson.D {
	switch {
	case gen == driver.AnyGeneration:
		return nil
	case gen == 0:
		return set("openedAt", nil)
	}
	return set("openedAt", time.UnixMilli(gen).UTC())
}

// applyGen is apply for an outcome of generation gen and, for a probe's
// outcome, probe epoch epoch (0: not a probe): every step's filter also
// names the generation and the probe epoch (a step that would insert an
// absent circuit does so only for generation 0 or any, and never for a
// probe), so each step applies atomically to its generation and probe
// slots only. When no step matches, one read tells whether the outcome's
// generation or probe slot is over (then applied=false and the current
// document, zero if absent) or the circuit changed in between (try again).
func (c circuits) applyGen(ctx context.Context, op, name string, gen, epoch int64, steps func(t time.Time) []step) (d circDoc, applied bool, err error) {
	s := c.s
	sk := s.circPfx + name
	gf := genFilter(gen)
	if epoch > 0 {
		gf = append(gf, set("probeEpoch", epoch)...)
	}
	for range s.tries {
		t := now()
		for _, st := range steps(t) {
			s.raced("step")
			var d circDoc
			update := st.update
			upsert := st.upsert && gen <= 0 && epoch == 0
			if upsert {
				update = s.withIdent(update, sk)
			}
			filter := append(append(s.nsKey(sk), gf...), st.filter...)
			err := s.circs.FindOneAndUpdate(ctx, filter, update,
				options.FindOneAndUpdate().SetReturnDocument(options.After).SetUpsert(upsert)).Decode(&d)
			if err == nil {
				s.emitCircuit(ctx, sk, &d, t)
				return d, true, nil
			}
			if !isDup(err) && !errors.Is(err, mongo.ErrNoDocuments) {
				return circDoc{}, false, ctxErr(ctx, err)
			}
		}
		if gen != driver.AnyGeneration || epoch > 0 {
			var cur circDoc
			err := s.circs.FindOne(ctx, s.nsKey(sk)).Decode(&cur)
			switch {
			case errors.Is(err, mongo.ErrNoDocuments):
				if gen > 0 || epoch > 0 {
					return circDoc{}, false, nil
				}
			case err != nil:
				return circDoc{}, false, ctxErr(ctx, err)
			case gen != driver.AnyGeneration && cur.record(name).Generation() != gen,
				epoch > 0 && cur.ProbeEpoch != epoch:
				return cur, false, nil
			}
		}
		if err := ctx.Err(); err != nil {
			return circDoc{}, false, err
		}
	}
	return circDoc{}, false, s.busy(op, name)
}

// outcomeRecord is the record an outcome returns: the new one, or the
// current one (closed if absent) when the outcome's generation was over.
func outcomeRecord(d circDoc, applied bool, name string) driver.CircuitRecord {
	if !applied && d.Key == "" {
		return driver.CircuitRecord{Name: name, State: driver.Closed}
	}
	return d.record(name)
}

func set(kv ...any) bson.D {
	d := make(bson.D, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		d = append(d, bson.E{Key: kv[i].(string), Value: kv[i+1]})
	}
	return d
}

// RecordFailure implements driver.Circuits as RecordOutcome.
func (c circuits) RecordFailure(ctx context.Context, name string, threshold int, gen int64) (driver.CircuitRecord, error) {
	return c.RecordOutcome(ctx, name, driver.Failure(gen, threshold))
}

// RecordSuccess implements driver.Circuits as RecordOutcome.
func (c circuits) RecordSuccess(ctx context.Context, name string, gen int64) (driver.CircuitRecord, error) {
	return c.RecordOutcome(ctx, name, driver.Success(gen))
}

// Field values shared by the steps.
var (
	incVersion = bson.E{Key: "version", Value: int64(1)}
	// countsReset are the $set fields of a new counting period (with
	// intervalStart) or of a state change.
	countsReset = set("successes", int64(0), "totalFailures", int64(0), "consecutiveSuccesses", int64(0))
	// opened are the $set fields of an opening but for the times.
	opened = append(set("state", string(driver.Open), "probeOwner", nil, "probeUntil", nil, "probes", int64(0)), countsReset...)
)

// cat concatenates field lists.
func cat(ds ...bson.D) bson.D {
	var out bson.D
	for _, d := range ds {
		out = append(out, d...)
	}
	return out
}

// periodFilters returns, for a closed circuit and a counting interval
// (> 0) at time t, the filters of a period still running, of an absent
// period, and of a period over.
func periodFilters(t time.Time, interval time.Duration) (running, absent, over bson.D) {
	ts := t.Add(-time.Duration(driver.Millis(interval)) * time.Millisecond)
	return set("intervalStart", set("$gt", ts)), set("intervalStart", nil), set("intervalStart", set("$lte", ts))
}

// RecordOutcome implements driver.Circuits: the steps below have disjoint
// filters, one per case of driver.Circuits.RecordOutcome (state, counting
// period, threshold, successes in a row), each one atomic update with
// classic operators; the first that matches is the outcome, in one round
// trip for the case tried first.
func (c circuits) RecordOutcome(ctx context.Context, name string, o driver.Outcome) (driver.CircuitRecord, error) {
	op := map[driver.OutcomeKind]string{driver.OutcomeFailure: "recording circuit failure",
		driver.OutcomeSuccess: "recording circuit success", driver.OutcomeNone: "recording circuit successes"}[o.Kind]
	d, applied, err := c.applyGen(ctx, op, name, o.Gen, o.ProbeEpoch, func(t time.Time) []step {
		return outcomeSteps(o, t)
	})
	if err != nil {
		return driver.CircuitRecord{}, err
	}
	return outcomeRecord(d, applied, name), nil
}

// outcomeSteps are RecordOutcome's steps for o at time t.
func outcomeSteps(o driver.Outcome, t time.Time) []step {
	closed := set("state", string(driver.Closed))
	insert := bson.E{Key: "$setOnInsert", Value: set("createdAt", t)}
	insertOpen := bson.E{Key: "$setOnInsert", Value: set("lastSuccessTime", nil, "createdAt", t)}
	b := max(o.Successes, 0)
	// closedSteps returns the steps of a closed circuit: inc and sets are
	// the change within a running period; reset the $set of a new period
	// (the period's first counts included). below restricts them (the
	// threshold).
	closedSteps := func(below bson.D, inc, sets, reset bson.D) []step {
		upd := func(inc, sets bson.D) bson.D {
			u := bson.D{{Key: "$set", Value: sets}, insert}
			if len(inc) > 0 {
				u = append(u, bson.E{Key: "$inc", Value: inc})
			}
			return u
		}
		if o.Interval <= 0 {
			return []step{{filter: cat(closed, below), update: upd(inc, sets), upsert: true}}
		}
		running, absent, over := periodFilters(t, o.Interval)
		return []step{
			{filter: cat(closed, below, running), update: upd(inc, sets)},
			{filter: cat(closed, below, absent), update: upd(inc, cat(sets, set("intervalStart", t))), upsert: true},
			{filter: cat(closed, over), update: upd(set("version", int64(1)), cat(sets, reset, set("intervalStart", t)))},
		}
	}
	var steps []step
	switch o.Kind {
	case driver.OutcomeFailure:
		th := int64(o.Threshold)
		times := set("lastFailureTime", t, "updatedAt", t)
		openUpd := bson.D{{Key: "$set", Value: cat(opened, set("openedAt", t), times)},
			{Key: "$inc", Value: set("failureCount", int64(1), "version", int64(1))}, insertOpen}
		if th != 1 {
			var below bson.D
			if th > 1 {
				below = set("failureCount", set("$lt", th-1))
			}
			steps = closedSteps(below,
				set("failureCount", int64(1), "totalFailures", int64(1), "successes", b, "version", int64(1)),
				cat(set("consecutiveSuccesses", int64(0)), times),
				set("failureCount", int64(1), "totalFailures", int64(1), "successes", b))
		}
		// Opening: half-open, or closed at the threshold within its period
		// (a period over restarts the count at 1, below any threshold > 1).
		opens := bson.A{set("state", string(driver.HalfOpen))}
		switch {
		case th == 1:
			opens = append(opens, closed)
		case th > 1 && o.Interval <= 0:
			opens = append(opens, cat(closed, set("failureCount", set("$gte", th-1))))
		case th > 1:
			running, absent, _ := periodFilters(t, o.Interval)
			opens = append(opens, cat(closed, set("failureCount", set("$gte", th-1)), running),
				cat(closed, set("failureCount", set("$gte", th-1)), absent))
		}
		steps = append(steps,
			step{filter: set("$or", opens), update: openUpd, upsert: th == 1},
			step{filter: set("state", string(driver.Open)),
				update: bson.D{{Key: "$inc", Value: set("failureCount", int64(1), "version", int64(1))}, {Key: "$set", Value: times}}})
	case driver.OutcomeSuccess:
		times := set("lastSuccessTime", t, "updatedAt", t)
		steps = closedSteps(nil,
			set("successes", b+1, "consecutiveSuccesses", int64(1), "version", int64(1)),
			cat(set("failureCount", int64(0)), times),
			set("successes", b+1, "totalFailures", int64(0), "consecutiveSuccesses", int64(1)))
		halfOpen := set("state", string(driver.HalfOpen))
		closes, more := halfOpen, bson.D(nil)
		if n := int64(o.CloseAfter); n > 1 {
			closes = cat(halfOpen, set("consecutiveSuccesses", set("$gte", n-1)))
			more = cat(halfOpen, set("consecutiveSuccesses", set("$not", set("$gte", n-1))))
		}
		steps = append(steps, step{filter: closes, update: bson.D{
			{Key: "$set", Value: cat(set("state", string(driver.Closed), "failureCount", int64(0), "openedAt", nil, "probeOwner", nil,
				"probeUntil", nil, "probes", int64(0), "intervalStart", t), countsReset, times)},
			{Key: "$inc", Value: set("version", int64(1))}}})
		if more != nil {
			inc := set("successes", int64(1), "consecutiveSuccesses", int64(1), "version", int64(1))
			steps = append(steps,
				step{ // one live slot ends
					filter: cat(more, set("probeUntil", set("$gt", t), "probes", set("$gte", int64(1)))),
					update: bson.D{{Key: "$inc", Value: cat(inc, set("probes", int64(-1)))}, {Key: "$set", Value: times}},
				},
				step{ // no live slot
					filter: cat(more, set("$or", bson.A{set("probeUntil", set("$not", set("$gt", t))), set("probes", set("$not", set("$gte", int64(1))))})),
					update: bson.D{{Key: "$inc", Value: inc}, {Key: "$set", Value: cat(set("probes", int64(0)), times)}},
				})
		}
		steps = append(steps, step{filter: set("state", string(driver.Open)),
			update: bson.D{{Key: "$set", Value: times}, {Key: "$inc", Value: set("version", int64(1))}}})
	default: // successes alone: closed only; other states are left as they are
		steps = closedSteps(nil, set("successes", b, "version", int64(1)), set("updatedAt", t),
			set("successes", b, "totalFailures", int64(0), "consecutiveSuccesses", int64(0), "failureCount", int64(0)))
		steps = append(steps, step{filter: set("state", set("$ne", string(driver.Closed))),
			update: bson.D{{Key: "$inc", Value: set("version", int64(0))}}})
	}
	return steps
}

// Trip implements driver.Circuits: one update of the closed circuit at
// version; when it matches nothing, one read returns the current record.
func (c circuits) Trip(ctx context.Context, name string, version int64) (driver.CircuitRecord, bool, error) {
	s := c.s
	sk := s.circPfx + name
	t := now()
	f := append(s.nsKey(sk), set("state", string(driver.Closed), "version", version)...)
	u := bson.D{{Key: "$set", Value: cat(opened, set("openedAt", t, "updatedAt", t))}, {Key: "$inc", Value: set("version", int64(1))}}
	var d circDoc
	err := s.circs.FindOneAndUpdate(ctx, f, u, circAfter).Decode(&d)
	if err == nil {
		s.emitCircuit(ctx, sk, &d, t)
		return d.record(name), true, nil
	}
	if !errors.Is(err, mongo.ErrNoDocuments) {
		return driver.CircuitRecord{}, false, ctxErr(ctx, err)
	}
	rec, _, err := c.Get(ctx, name)
	return rec, false, err
}

// TryProbe implements driver.Circuits as TryProbes with one slot.
func (c circuits) TryProbe(ctx context.Context, name, owner string, openFor, lease time.Duration) (driver.CircuitRecord, bool, error) {
	return c.TryProbes(ctx, name, owner, openFor, lease, 1)
}

// TryProbes implements driver.Circuits. There are four ways of granting a
// slot, each one conditional update with a filter of its own (open and
// due; the newest holder again; a free slot among live ones; every slot
// lapsed). The first — an open circuit's first probe, the common case — is
// tried at once: one round trip. When it matches nothing, one read of the
// circuit tells which of the others can apply, and only that one is tried
// (a refusal costs two round trips); if the circuit changed in between,
// the store starts over, and gives up after its tries with ErrBusy.
func (c circuits) TryProbes(ctx context.Context, name, owner string, openFor, lease time.Duration, maxProbes int) (driver.CircuitRecord, bool, error) {
	s := c.s
	sk := s.circPfx + name
	try := func(st step, t time.Time) (driver.CircuitRecord, bool, error) {
		var d circDoc
		err := s.circs.FindOneAndUpdate(ctx, append(s.nsKey(sk), st.filter...), st.update, circAfter).Decode(&d)
		if err == nil {
			s.emitCircuit(ctx, sk, &d, t)
			return d.record(name), true, nil
		}
		if !errors.Is(err, mongo.ErrNoDocuments) {
			return driver.CircuitRecord{}, false, ctxErr(ctx, err)
		}
		return driver.CircuitRecord{}, false, nil
	}
	for range s.tries {
		t := now()
		due := t.Add(-time.Duration(driver.Millis(openFor)) * time.Millisecond)
		steps := probeSteps(owner, t, due, after(t, lease), maxProbes)
		if rec, ok, err := try(steps.due, t); ok || err != nil {
			return rec, ok, err
		}
		var cur circDoc
		err := s.circs.FindOne(ctx, s.nsKey(sk)).Decode(&cur)
		if errors.Is(err, mongo.ErrNoDocuments) {
			return driver.CircuitRecord{Name: name, State: driver.Closed}, false, nil
		}
		if err != nil {
			return driver.CircuitRecord{}, false, ctxErr(ctx, err)
		}
		var next *step
		live := cur.ProbeUntil != nil && cur.ProbeUntil.After(t)
		switch driver.CircuitState(cur.State) {
		case driver.Open:
			// Not due when the first step ran; due now means it became due
			// in between: start over.
			if at := openedAtOf(&cur); at == nil || at.After(due) {
				return cur.record(name), false, nil
			}
		case driver.HalfOpen:
			switch {
			case live && cur.ProbeOwner != nil && *cur.ProbeOwner == owner:
				next = &steps.again
			case live && cur.Probes < int64(maxProbes):
				next = &steps.free
			case !live:
				next = &steps.lapsed
			default:
				return cur.record(name), false, nil
			}
		default:
			return cur.record(name), false, nil
		}
		if next != nil {
			s.raced("probe")
			if rec, ok, err := try(*next, t); ok || err != nil {
				return rec, ok, err
			}
		}
		if err := ctx.Err(); err != nil {
			return driver.CircuitRecord{}, false, err
		}
	}
	return driver.CircuitRecord{}, false, s.busy("granting a probe", name)
}

// openedAtOf is when an open circuit opened, as TryProbes' first step
// judges it: openedAt; for a circuit the go-go-scope adapter opened (no
// openedAt), its last failure or, without one, its last update; for one
// the adapter re-opened after a failed probe (it leaves openedAt and the
// probe fields as they were, while warden's own openings clear
// probeOwner), its last update.
func openedAtOf(d *circDoc) *time.Time {
	switch {
	case d.ProbeOwner != nil:
		return d.UpdatedAt
	case d.OpenedAt != nil:
		return d.OpenedAt
	case d.LastFailure != nil:
		return d.LastFailure
	}
	return d.UpdatedAt
}

// probeStepSet holds TryProbes' four ways of granting a slot, their
// filters disjoint.
type probeStepSet struct{ due, again, free, lapsed step }

// probeSteps returns the ways of granting owner a slot at time t, for a
// circuit due if it opened at or before due, the slots lasting until
// until, at most maxProbes live at once.
func probeSteps(owner string, t, due, until time.Time, maxProbes int) probeStepSet {
	grant := set("probeOwner", owner, "probeUntil", until, "updatedAt", t)
	// The first slot (from open, or after every slot lapsed) begins a new
	// set of slots.
	newSet := set("version", int64(1), "probeEpoch", int64(1))
	halfOpen := set("state", string(driver.HalfOpen))
	live := set("probeUntil", set("$gt", t))
	return probeStepSet{
		due: step{
			filter: set("$or", bson.A{
				set("state", string(driver.Open), "probeOwner", nil, "openedAt", set("$lte", due)),
				// A circuit the go-go-scope adapter opened has no openedAt: it
				// opened at its last failure, or, without one, its last update.
				set("state", string(driver.Open), "probeOwner", nil, "openedAt", nil, "lastFailureTime", set("$lte", due)),
				set("state", string(driver.Open), "probeOwner", nil, "openedAt", nil, "lastFailureTime", nil, "updatedAt", set("$lte", due)),
				// One the adapter re-opened after a failed probe keeps its
				// probe owner (see openedAtOf): it opened at its last update.
				set("state", string(driver.Open), "probeOwner", set("$ne", nil), "updatedAt", set("$lte", due)),
			}),
			update: bson.D{{Key: "$set", Value: cat(set("state", string(driver.HalfOpen), "probes", int64(1)), countsReset, grant)},
				{Key: "$inc", Value: newSet}},
		},
		again: step{
			filter: cat(halfOpen, live, set("probeOwner", owner)),
			update: bson.D{{Key: "$set", Value: grant}, {Key: "$max", Value: set("probes", int64(1))}, {Key: "$inc", Value: set("version", int64(1))}},
		},
		free: step{
			filter: cat(halfOpen, live, set("probeOwner", set("$ne", owner)), set("probes", set("$not", set("$gte", int64(maxProbes))))),
			update: bson.D{{Key: "$set", Value: grant}, {Key: "$inc", Value: set("probes", int64(1), "version", int64(1))}},
		},
		lapsed: step{
			filter: cat(halfOpen, set("probeUntil", set("$not", set("$gt", t)))),
			update: bson.D{{Key: "$set", Value: cat(set("probes", int64(1)), grant)}, {Key: "$inc", Value: newSet}},
		},
	}
}

// Get implements driver.Circuits. An absent circuit reads as closed.
func (c circuits) Get(ctx context.Context, name string) (driver.CircuitRecord, bool, error) {
	s := c.s
	var d circDoc
	err := s.circs.FindOne(ctx, s.nsKey(s.circPfx+name)).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return driver.CircuitRecord{Name: name, State: driver.Closed}, false, nil
	}
	if err != nil {
		return driver.CircuitRecord{}, false, ctxErr(ctx, err)
	}
	return d.record(name), true, nil
}

// Set implements driver.Circuits: one upsert.
func (c circuits) Set(ctx context.Context, name string, state driver.CircuitState) (driver.CircuitRecord, error) {
	d, err := c.apply(ctx, "setting circuit", name, func(t time.Time) []step {
		st := cat(set("state", string(state), "probeOwner", nil, "probeUntil", nil, "probes", int64(0), "updatedAt", t), countsReset)
		ins := set("lastFailureTime", nil, "lastSuccessTime", nil, "createdAt", t)
		if state == driver.Closed {
			st = append(st, bson.E{Key: "failureCount", Value: int64(0)}, bson.E{Key: "intervalStart", Value: t})
		} else {
			ins = append(ins, bson.E{Key: "failureCount", Value: int64(0)})
		}
		switch state {
		case driver.Open:
			st = append(st, bson.E{Key: "openedAt", Value: t})
		case driver.Closed: // the closed period is generation 0
			st = append(st, bson.E{Key: "openedAt", Value: nil})
		default:
			ins = append(ins, bson.E{Key: "openedAt", Value: nil})
		}
		return []step{{
			update: bson.D{{Key: "$set", Value: st}, {Key: "$inc", Value: set("version", int64(1), "probeEpoch", int64(1))},
				{Key: "$setOnInsert", Value: ins}},
			upsert: true,
		}}
	})
	if err != nil {
		return driver.CircuitRecord{}, err
	}
	return d.record(name), nil
}

// Delete implements driver.Circuits.
func (c circuits) Delete(ctx context.Context, name string) (bool, error) {
	s := c.s
	sk := s.circPfx + name
	res, err := s.circs.DeleteOne(ctx, s.nsKey(sk))
	if err != nil {
		return false, ctxErr(ctx, err)
	}
	if res.DeletedCount == 0 {
		return false, nil
	}
	s.emitCircuit(ctx, sk, nil, now())
	return true, nil
}

// List implements driver.Circuits.
func (c circuits) List(ctx context.Context, pattern driver.Pattern) ([]driver.CircuitRecord, error) {
	s := c.s
	var out []driver.CircuitRecord
	err := findAll(ctx, s.circs, s.keyRange("key", s.circPfx+pattern.Prefix()), nil, func(d *circDoc) {
		if name, ok := strings.CutPrefix(d.Key, s.circPfx); ok && pattern.Match(name) {
			out = append(out, d.record(name))
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, err
}
