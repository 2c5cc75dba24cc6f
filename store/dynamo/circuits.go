package dynamo

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden/driver"
)

// circuits is the circuit-breaker driver. A circuit is one item (pk
// CB#<prefix>circuit:<name>, sk METADATA) with state, failures,
// lastFailure, lastSuccess, openedAt, probeOwner, probeUntil, version and
// updatedAt (times in Unix ms), and the counts and probe slots
// (successes, totalFailures, consecutiveSuccesses, intervalStart, probes,
// probeEpoch; absent attributes read 0).
//
// DynamoDB update expressions cannot branch, so each change has one
// conditional UpdateItem per starting state, with mutually exclusive
// conditions (ADD keeps concurrent increments). The store tries the
// variant for the state it saw last; when the condition fails, the
// endpoint's ALL_OLD copy of the item (or the next variant, on endpoints
// that do not return it) picks the right one. In the steady state each
// change is one round trip.
type circuits struct{ s *store }

func circRec(name string, it item) driver.CircuitRecord {
	st := driver.CircuitState(gS(it, aState))
	if !st.Valid() {
		st = driver.Closed
	}
	return driver.CircuitRecord{
		Name: name, State: st, Failures: gN(it, aFail),
		LastFailure: msTime(gN(it, aLastF)), LastSuccess: msTime(gN(it, aLastS)), OpenedAt: msTime(gN(it, aOpened)),
		ProbeOwner: gS(it, aProbe), ProbeUntil: msTime(gN(it, aProbeUntil)),
		Version: gN(it, aVersion), UpdatedAt: msTime(gN(it, aUpd)),
		Successes: gN(it, aSucc), TotalFailures: gN(it, aTotF), ConsecutiveSuccesses: gN(it, aConsOK),
		IntervalStart: msTime(gN(it, aIntStart)), Probes: gN(it, aProbes), ProbeEpoch: gN(it, aProbeEpoch),
	}
}

// The counts' attributes (absent in items of writers that do not keep
// them: they read 0).
const (
	aSucc     = "successes"
	aTotF     = "totalFailures"
	aConsOK   = "consecutiveSuccesses"
	aIntStart = "intervalStart"
	aProbes   = "probes"
	// aProbeEpoch names the current set of probe slots.
	aProbeEpoch = "probeEpoch"
)

// variant is one conditional form of a circuit change.
type variant struct {
	upd, cond string
}

const (
	// notMine guards every circuit change: a change the SDK resends after
	// it applied fails it (and is recognised by its request id) instead
	// of counting twice.
	notMine    = "(attribute_not_exists(#req) OR #req <> :req)"
	closedLike = "(attribute_not_exists(#state) OR NOT (#state IN (:open, :half)))"
	clearProbe = " REMOVE #probeOwner, #probeUntil"
	// closing clears the probe slots and openedAt: the closed period is
	// generation 0, so outcomes of the generation that probed no longer
	// apply.
	closing = clearProbe + ", #openedAt"
	bump    = " ADD #version :one"
	// newSlots bumps the version and begins a new set of probe slots.
	newSlots = " ADD #version :one, #probeEpoch :one"
)

// change applies a circuit change: variants[pick(old)] for the state the
// item is in; pick < 0: the change does not apply to that item, which is
// returned unchanged. The state seen last picks the variant tried first.
func (c circuits) change(ctx context.Context, op, name string, vals item, variants []variant, pick func(old item) int) (driver.CircuitRecord, error) {
	return c.changeGen(ctx, op, name, driver.AnyGeneration, 0, vals, variants, pick)
}

// itemGen is the generation of a circuit item (0 if absent or never
// opened): its openedAt in Unix ms.
func itemGen(it item) int64 {
	if it == nil {
		return 0
	}
	return gN(it, aOpened)
}

// otherGen reports whether an outcome of generation gen does not apply to
// the item (nil: absent).
func otherGen(it item, gen int64) bool {
	return gen != driver.AnyGeneration && itemGen(it) != gen
}

// otherEpoch reports whether a probe's outcome of probe epoch epoch (0:
// not a probe) does not apply to the item (nil: absent): its slot is no
// longer granted.
func otherEpoch(it item, epoch int64) bool {
	return epoch != 0 && (it == nil || gN(it, aProbeEpoch) != epoch)
}

// changeGen is change for an outcome of generation gen and, for a
// probe's outcome, probe epoch epoch (0: not a probe): every variant's
// condition also requires the item's generation (openedAt, absent for 0)
// and probe epoch, so the check and the change are one conditional
// UpdateItem; an absent item is created only for generation 0 or any,
// and never for a probe. When the condition fails because the generation
// or the probe slot is over, the current record is returned unchanged
// (closed if absent).
func (c circuits) changeGen(ctx context.Context, op, name string, gen, epoch int64, vals item, variants []variant, pick func(old item) int) (driver.CircuitRecord, error) {
	s := c.s
	genCond := ""
	switch {
	case gen == 0:
		genCond = "(attribute_not_exists(#openedAt) OR #openedAt = :gen)"
	case gen > 0:
		genCond = "#openedAt = :gen"
	}
	if genCond != "" {
		vals[":gen"] = vN(gen)
	}
	if epoch > 0 {
		if genCond != "" {
			genCond += " AND "
		}
		genCond += "#probeEpoch = :pe"
		vals[":pe"] = vN(epoch)
	}
	ignored := func(it item) driver.CircuitRecord {
		if it == nil {
			return driver.CircuitRecord{Name: name, State: driver.Closed}
		}
		return circRec(name, it)
	}
	pk := s.circPfx + name
	i := 0
	if g, ok := s.circGuess.Load(name); ok {
		i = max(pick(g.(item)), 0)
	}
	interval, periods := vals[":interval"]
	// One request id for every attempt of this change: once one attempt
	// has applied, notMine fails all later ones, and the id tells.
	req := reqID()
	tries := s.attempts(3*len(variants) + 6)
	tried := 0
	for tried < tries {
		tried++
		s.raced("step")
		now := nowMs()
		v := map[string]types.AttributeValue{}
		for k, x := range vals {
			v[k] = x
		}
		v[":now"], v[":req"], v[":one"] = vN(now), vS(req), vN(1)
		v[":open"], v[":half"], v[":closed"] = vS(string(driver.Open)), vS(string(driver.HalfOpen)), vS(string(driver.Closed))
		if periods {
			// The start of a period that is over by now.
			ms, _ := strconv.ParseInt(interval.(*types.AttributeValueMemberN).Value, 10, 64)
			v[":ts"] = vN(now - ms)
		}
		ev := s.evSet(s.circEvt, now, req, v)
		vr := variants[i]
		upd := "SET #updatedAt = :now, #req = :req" + lpkSet(s.circPfx, v) + ev + ", " + vr.upd
		cond := notMine
		if vr.cond != "" {
			cond = paren(vr.cond) + " AND " + notMine
		}
		if genCond != "" {
			cond = genCond + " AND " + cond
		}
		attrs, failed, old, err := s.update(ctx, op, pk, metaSK, upd, cond, v, types.ReturnValueAllNew)
		if err != nil {
			return driver.CircuitRecord{}, err
		}
		if !failed {
			s.remember(name, attrs)
			return circRec(name, attrs), nil
		}
		if old != nil {
			if gS(old, aReq) == req {
				return circRec(name, old), nil
			}
			if otherGen(old, gen) || otherEpoch(old, epoch) {
				return ignored(old), nil
			}
			if i = pick(old); i < 0 {
				return circRec(name, old), nil
			}
			continue
		}
		// Without ALL_OLD (an endpoint that does not return the item
		// with a failed condition), read it: the next attempt is then
		// the variant of the state it is in — or the item is one our
		// SDK retry changed. Trying the variants in turn instead lost
		// every attempt when the state changed faster than a round of
		// them (a short counting period renewed by several writers).
		it, err := s.get(ctx, "reading circuit", pk, metaSK)
		if err != nil {
			return driver.CircuitRecord{}, err
		}
		if it != nil && gS(it, aReq) == req {
			return circRec(name, it), nil
		}
		if otherGen(it, gen) || otherEpoch(it, epoch) {
			return ignored(it), nil
		}
		if it == nil {
			it = item{}
		}
		if i = pick(it); i < 0 {
			return ignored(it), nil
		}
	}
	// The circuit changed state under every attempt (extremely
	// contended).
	return driver.CircuitRecord{}, &contendedError{op: op, key: name, tries: tries}
}

// paren parenthesizes a condition unless one pair of parentheses already
// encloses all of it (DynamoDB refuses redundant parentheses).
func paren(cond string) string {
	if strings.HasPrefix(cond, "(") {
		depth := 0
		for i, r := range cond {
			switch r {
			case '(':
				depth++
			case ')':
				depth--
			}
			if depth == 0 {
				if i == len(cond)-1 {
					return cond
				}
				break
			}
		}
	}
	return "(" + cond + ")"
}

// remember keeps a circuit's state and failure count as the guess for its
// next change.
func (s *store) remember(name string, it item) {
	s.circGuess.Store(name, item{aState: vS(gS(it, aState)), aFail: vN(gN(it, aFail))})
}

func stateOf(it item) driver.CircuitState {
	st := driver.CircuitState(gS(it, aState))
	if !st.Valid() {
		return driver.Closed
	}
	return st
}

// RecordFailure implements driver.Circuits as RecordOutcome.
func (c circuits) RecordFailure(ctx context.Context, name string, threshold int, gen int64) (driver.CircuitRecord, error) {
	return c.RecordOutcome(ctx, name, driver.Failure(gen, threshold))
}

// RecordSuccess implements driver.Circuits as RecordOutcome.
func (c circuits) RecordSuccess(ctx context.Context, name string, gen int64) (driver.CircuitRecord, error) {
	return c.RecordOutcome(ctx, name, driver.Success(gen))
}

const (
	never       = "attribute_not_exists(#pk) AND attribute_exists(#pk)"
	resetCounts = ", #successes = :zero, #totalFailures = :zero, #consecutiveSuccesses = :zero"
	// periodOver: the closed state's counting period is over (:ts is now
	// minus the interval).
	periodOver = "#intervalStart <= :ts"
	inPeriod   = "(attribute_not_exists(#intervalStart) OR #intervalStart > :ts)"
)

// RecordOutcome implements driver.Circuits: one conditional UpdateItem per
// case of driver.Circuits.RecordOutcome (state, counting period,
// threshold, successes in a row), with mutually exclusive conditions,
// picked as change does.
func (c circuits) RecordOutcome(ctx context.Context, name string, o driver.Outcome) (driver.CircuitRecord, error) {
	th, closeAfter := int64(o.Threshold), int64(max(o.CloseAfter, 1))
	periods := o.Interval > 0
	vals := item{":zero": vN(0), ":b": vN(max(o.Successes, 0)), ":b1": vN(max(o.Successes, 0) + 1),
		":thm1": vN(th - 1), ":cam1": vN(closeAfter - 1), ":minus": vN(-1)}
	keepPeriod, running := "", ""
	if periods {
		vals[":interval"] = vN(driver.Millis(o.Interval))
		keepPeriod, running = ", #intervalStart = if_not_exists(#intervalStart, :now)", " AND "+inPeriod
	}
	// over and the picks below read the clock when they decide: an
	// attempt is sent with a fresh now, and a loop that outlasted the
	// period must not keep choosing the variant of a period that has
	// since ended (whose condition then fails every time).
	over := func(old item) bool {
		return periods && has(old, aIntStart) && gN(old, aIntStart) <= nowMs()-driver.Millis(o.Interval)
	}
	overCond := func(cond string) string {
		if !periods {
			return never
		}
		return cond
	}
	var variants []variant
	var pick func(old item) int
	var op string
	switch o.Kind {
	case driver.OutcomeFailure:
		op = "recording failure"
		below := " AND (attribute_not_exists(#failures) OR #failures < :thm1)"
		opens := "#state = :half OR (" + closedLike + " AND #failures >= :thm1" + running + ")"
		switch th {
		case 0:
			below, opens = "", "#state = :half"
		case 1:
			opens = closedLike + " OR #state = :half"
		}
		variants = []variant{
			// 0: closed, stays closed, within its period.
			{"#state = :closed, #lastFailure = :now, #consecutiveSuccesses = :zero" + keepPeriod +
				" ADD #failures :one, #totalFailures :one, #successes :b, #version :one",
				closedLike + below + running},
			// 1: closed, its period over: a new one, with this failure.
			{"#state = :closed, #lastFailure = :now, #failures = :one, #totalFailures = :one, #successes = :b, " +
				"#consecutiveSuccesses = :zero, #intervalStart = :now ADD #version :one",
				overCond(closedLike + " AND " + periodOver)},
			// 2: closed at the threshold, or half-open: opens.
			{"#state = :open, #openedAt = :now, #lastFailure = :now, #probes = :zero" + resetCounts + clearProbe +
				" ADD #failures :one, #version :one", opens},
			// 3: open stays open.
			{"#lastFailure = :now ADD #failures :one, #version :one", "#state = :open"},
		}
		if th == 1 {
			variants[0].cond, variants[1].cond = never, never
		}
		pick = func(old item) int {
			switch stateOf(old) {
			case driver.Open:
				return 3
			case driver.HalfOpen:
				return 2
			}
			switch {
			case th == 1:
				return 2
			case over(old):
				return 1
			case th > 1 && gN(old, aFail)+1 >= th:
				return 2
			}
			return 0
		}
	case driver.OutcomeSuccess:
		op = "recording success"
		more := "#state = :half AND (attribute_not_exists(#consecutiveSuccesses) OR #consecutiveSuccesses < :cam1)"
		closes := "#state = :half AND #consecutiveSuccesses >= :cam1"
		if closeAfter <= 1 {
			more, closes = never, "#state = :half"
		}
		variants = []variant{
			// 0: closed, within its period.
			{"#state = :closed, #failures = :zero, #lastSuccess = :now" + keepPeriod +
				" ADD #successes :b1, #consecutiveSuccesses :one, #version :one", closedLike + running},
			// 1: closed, its period over.
			{"#state = :closed, #failures = :zero, #lastSuccess = :now, #successes = :b1, #totalFailures = :zero, " +
				"#consecutiveSuccesses = :one, #intervalStart = :now ADD #version :one", overCond(closedLike + " AND " + periodOver)},
			// 2: half-open, the last success needed: closes.
			{"#state = :closed, #failures = :zero, #lastSuccess = :now, #probes = :zero, #intervalStart = :now" +
				resetCounts + closing + bump, closes},
			// 3: half-open, more needed; one live slot ends.
			{"#lastSuccess = :now ADD #successes :one, #consecutiveSuccesses :one, #probes :minus, #version :one",
				more + " AND #probeUntil > :now AND #probes >= :one"},
			// 4: half-open, more needed; no live slot.
			{"#lastSuccess = :now, #probes = :zero ADD #successes :one, #consecutiveSuccesses :one, #version :one",
				more + " AND (attribute_not_exists(#probeUntil) OR #probeUntil <= :now OR attribute_not_exists(#probes) OR #probes < :one)"},
			// 5: open stays open.
			{"#lastSuccess = :now" + bump, "#state = :open"},
		}
		pick = func(old item) int {
			switch stateOf(old) {
			case driver.Open:
				return 5
			case driver.HalfOpen:
				switch {
				case gN(old, aConsOK)+1 >= closeAfter:
					return 2
				case gN(old, aProbeUntil) > nowMs() && gN(old, aProbes) >= 1:
					return 3
				}
				return 4
			}
			if over(old) {
				return 1
			}
			return 0
		}
	default:
		op = "recording successes"
		variants = []variant{
			// 0: closed, within its period.
			{"#state = :closed" + keepPeriod + " ADD #successes :b, #version :one", closedLike + running},
			// 1: closed, its period over.
			{"#state = :closed, #successes = :b, #failures = :zero, #totalFailures = :zero, #consecutiveSuccesses = :zero, " +
				"#intervalStart = :now ADD #version :one", overCond(closedLike + " AND " + periodOver)},
		}
		pick = func(old item) int {
			switch {
			case stateOf(old) != driver.Closed:
				return -1 // successes count in the closed state only
			case over(old):
				return 1
			}
			return 0
		}
	}
	return c.changeGen(ctx, op, name, o.Gen, o.ProbeEpoch, vals, variants, pick)
}

// grant tries one conditional UpdateItem of a probe slot or a trip; when
// its condition fails, it returns the item as it is (from the endpoint's
// ALL_OLD copy or one consistent read; nil if absent) and applied=false,
// unless the item shows that this very request applied (an SDK retry).
func (c circuits) grant(ctx context.Context, op, name, upd, cond string, vals item) (it item, applied bool, err error) {
	s := c.s
	pk := s.circPfx + name
	now := nowMs()
	req := reqID()
	vals[":now"], vals[":req"], vals[":one"], vals[":zero"] = vN(now), vS(req), vN(1), vN(0)
	vals[":open"], vals[":half"], vals[":closed"] = vS(string(driver.Open)), vS(string(driver.HalfOpen)), vS(string(driver.Closed))
	upd = "SET #updatedAt = :now, #req = :req" + lpkSet(s.circPfx, vals) + s.evSet(s.circEvt, now, req, vals) + ", " + upd
	attrs, failed, old, err := s.update(ctx, op, pk, metaSK, upd, paren(cond)+" AND "+notMine, vals, types.ReturnValueAllNew)
	if err != nil {
		return nil, false, err
	}
	if !failed {
		s.remember(name, attrs)
		return attrs, true, nil
	}
	if old == nil {
		if old, err = s.get(ctx, "reading circuit", pk, metaSK); err != nil || old == nil {
			return nil, false, err
		}
	}
	s.remember(name, old)
	return old, gS(old, aReq) == req, nil
}

// Trip implements driver.Circuits: one conditional UpdateItem.
func (c circuits) Trip(ctx context.Context, name string, version int64) (driver.CircuitRecord, bool, error) {
	it, applied, err := c.grant(ctx, "tripping circuit", name,
		"#state = :open, #openedAt = :now, #probes = :zero"+resetCounts+clearProbe+bump,
		closedLike+" AND #version = :v", item{":v": vN(version)})
	if err != nil {
		return driver.CircuitRecord{}, false, err
	}
	if it == nil {
		return driver.CircuitRecord{Name: name, State: driver.Closed}, false, nil
	}
	return circRec(name, it), applied, nil
}

// TryProbe implements driver.Circuits as TryProbes with one slot.
func (c circuits) TryProbe(ctx context.Context, name, owner string, openFor, lease time.Duration) (driver.CircuitRecord, bool, error) {
	return c.TryProbes(ctx, name, owner, openFor, lease, 1)
}

// TryProbes implements driver.Circuits: one conditional UpdateItem per way
// of granting a slot, with mutually exclusive conditions; the state seen
// last picks the one tried first, and a failed condition's copy of the
// item the next one, or the refusal.
func (c circuits) TryProbes(ctx context.Context, name, owner string, openFor, lease time.Duration, maxProbes int) (driver.CircuitRecord, bool, error) {
	const setSlot = "#probeOwner = :o, #probeUntil = :until"
	variants := []variant{
		// 0: open and due: half-open, the first slot of a new set.
		{"#state = :half, #probes = :one, " + setSlot + resetCounts + newSlots,
			"#state = :open AND (attribute_not_exists(#openedAt) OR #openedAt <= :cut)"},
		// 1: the newest slot's holder again.
		{setSlot + ", #probes = if_not_exists(#probes, :one)" + bump,
			"#state = :half AND #probeOwner = :o AND #probeUntil > :now"},
		// 2: a free slot among live ones.
		{setSlot + " ADD #probes :one, #version :one",
			"#state = :half AND #probeUntil > :now AND (attribute_not_exists(#probeOwner) OR #probeOwner <> :o) AND " +
				"(attribute_not_exists(#probes) OR #probes < :max)"},
		// 3: every slot lapsed: the first slot of a new set.
		{setSlot + ", #probes = :one" + newSlots,
			"#state = :half AND (attribute_not_exists(#probeUntil) OR #probeUntil <= :now)"},
	}
	pick := func(it item) int {
		now := nowMs()
		switch stateOf(it) {
		case driver.Open:
			if !has(it, aOpened) || gN(it, aOpened) <= now-driver.Millis(openFor) {
				return 0
			}
		case driver.HalfOpen:
			switch {
			case gN(it, aProbeUntil) <= now:
				return 3
			case gS(it, aProbe) == owner:
				return 1
			case gN(it, aProbes) < int64(maxProbes):
				return 2
			}
		}
		return -1
	}
	i := 2
	if g, ok := c.s.circGuess.Load(name); ok && stateOf(g.(item)) == driver.Open {
		i = 0
	}
	for range c.s.attempts(8) {
		now := nowMs()
		vals := item{":o": vS(owner), ":until": vN(now + driver.Millis(lease)), ":cut": vN(now - driver.Millis(openFor)),
			":max": vN(int64(maxProbes))}
		it, applied, err := c.grant(ctx, "probing circuit", name, variants[i].upd, variants[i].cond, vals)
		switch {
		case err != nil:
			return driver.CircuitRecord{}, false, err
		case it == nil:
			return driver.CircuitRecord{Name: name, State: driver.Closed}, false, nil
		case applied:
			return circRec(name, it), true, nil
		}
		if i = pick(it); i < 0 {
			return circRec(name, it), false, nil
		}
	}
	return driver.CircuitRecord{}, false, &contendedError{op: "probing circuit", key: name, tries: c.s.attempts(8)}
}

// Get implements driver.Circuits: one consistent GetItem.
func (c circuits) Get(ctx context.Context, name string) (driver.CircuitRecord, bool, error) {
	it, err := c.s.get(ctx, "reading circuit", c.s.circPfx+name, metaSK)
	if err != nil || it == nil {
		return driver.CircuitRecord{}, false, err
	}
	return circRec(name, it), true, nil
}

// Set implements driver.Circuits: one UpdateItem.
func (c circuits) Set(ctx context.Context, name string, state driver.CircuitState) (driver.CircuitRecord, error) {
	var v variant
	switch state {
	case driver.Closed:
		v.upd = "#state = :closed, #failures = :zero, #intervalStart = :now"
	case driver.Open:
		v.upd = "#state = :open, #openedAt = :now"
	default:
		v.upd = "#state = :half"
	}
	v.upd += ", #probes = :zero" + resetCounts
	if state == driver.Closed {
		v.upd += closing + newSlots
	} else {
		v.upd += clearProbe + newSlots
	}
	return c.change(ctx, "setting circuit", name, item{":zero": vN(0)}, []variant{v}, func(item) int { return 0 })
}

// Delete implements driver.Circuits: one DeleteItem.
func (c circuits) Delete(ctx context.Context, name string) (bool, error) {
	old, _, err := c.s.del(ctx, "deleting circuit", c.s.circPfx+name, metaSK, "", nil)
	c.s.circGuess.Delete(name)
	return old != nil, err
}

// List implements driver.Circuits: see locks.List.
func (c circuits) List(ctx context.Context, pattern driver.Pattern) ([]driver.CircuitRecord, error) {
	s := c.s
	var out []driver.CircuitRecord
	err := s.list(ctx, "listing circuits", s.circPfx, pattern, func(it item) error {
		n, ok := cutPrefix(gS(it, aPk), s.circPfx)
		if ok && gS(it, aSk) == metaSK && pattern.Match(n) {
			out = append(out, circRec(n, it))
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, err
}
