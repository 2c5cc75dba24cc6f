package dynamo

import (
	"context"
	"errors"
	"sort"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden/driver"
)

// circuits is the circuit-breaker driver. A circuit is one item (pk
// CB#<prefix>circuit:<name>, sk METADATA) with state, failures,
// lastFailure, lastSuccess, openedAt, probeOwner, probeUntil, version and
// updatedAt (times in Unix ms).
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
	}
}

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
	bump       = " ADD #version :one"
)

// change applies a circuit change: variants[pick(old)] for the state the
// item is in. guess is the variant to try first.
func (c circuits) change(ctx context.Context, op, name string, vals item, variants []variant, pick func(old item) int) (driver.CircuitRecord, error) {
	return c.changeGen(ctx, op, name, driver.AnyGeneration, vals, variants, pick)
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

// changeGen is change for an outcome of generation gen: every variant's
// condition also requires the item's generation (openedAt, absent for 0),
// so the check and the change are one conditional UpdateItem; an absent
// item is created only for generation 0 or any. When the condition fails
// because the generation is over, the current record is returned
// unchanged (closed if absent).
func (c circuits) changeGen(ctx context.Context, op, name string, gen int64, vals item, variants []variant, pick func(old item) int) (driver.CircuitRecord, error) {
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
	ignored := func(it item) driver.CircuitRecord {
		if it == nil {
			return driver.CircuitRecord{Name: name, State: driver.Closed}
		}
		return circRec(name, it)
	}
	pk := s.circPfx + name
	i := 0
	if g, ok := s.circGuess.Load(name); ok {
		i = pick(g.(item))
	}
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
		ev := s.evSet(s.circEvt, now, req, v)
		vr := variants[i]
		upd := "SET #updatedAt = :now, #req = :req" + ev + ", " + vr.upd
		cond := notMine
		if vr.cond != "" {
			cond = "(" + vr.cond + ") AND " + notMine
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
			if otherGen(old, gen) {
				return ignored(old), nil
			}
			i = pick(old)
			continue
		}
		if tried%len(variants) == 0 {
			// Without ALL_OLD, a full round of variants failed: the item
			// may be one our SDK retry changed. Read it.
			it, err := s.get(ctx, "reading circuit", pk, metaSK)
			if err != nil {
				return driver.CircuitRecord{}, err
			}
			if it != nil && gS(it, aReq) == req {
				return circRec(name, it), nil
			}
			if otherGen(it, gen) {
				return ignored(it), nil
			}
			if it == nil {
				it = item{}
			}
			i = pick(it)
			continue
		}
		i = (i + 1) % len(variants)
	}
	// The circuit changed state under every attempt (extremely
	// contended).
	return driver.CircuitRecord{}, &contendedError{op: op, key: name, tries: tries}
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

// RecordFailure implements driver.Circuits.
func (c circuits) RecordFailure(ctx context.Context, name string, threshold int, gen int64) (driver.CircuitRecord, error) {
	th := int64(threshold)
	fail := "#lastFailure = :now ADD #failures :one, #version :one"
	variants := []variant{
		// 0: closed, stays closed.
		{"#state = :closed, " + fail, closedLike + " AND (attribute_not_exists(#failures) OR #failures < :thm1)"},
		// 1: closed reaching the threshold, or half-open: opens.
		{"#state = :open, #openedAt = :now, #lastFailure = :now" + clearProbe + " ADD #failures :one, #version :one",
			"(" + closedLike + " AND #failures >= :thm1) OR #state = :half"},
		// 2: open stays open.
		{fail, "#state = :open"},
	}
	if th <= 1 {
		variants[0].cond = "attribute_not_exists(#pk) AND attribute_exists(#pk)" // never
		variants[1].cond = closedLike + " OR #state = :half"
	}
	pick := func(old item) int {
		switch stateOf(old) {
		case driver.Open:
			return 2
		case driver.HalfOpen:
			return 1
		}
		if gN(old, aFail)+1 >= th {
			return 1
		}
		return 0
	}
	return c.changeGen(ctx, "recording failure", name, gen, item{":thm1": vN(th - 1)}, variants, pick)
}

// RecordSuccess implements driver.Circuits.
func (c circuits) RecordSuccess(ctx context.Context, name string, gen int64) (driver.CircuitRecord, error) {
	variants := []variant{
		{"#state = :closed, #failures = :zero, #lastSuccess = :now" + clearProbe + bump,
			"attribute_not_exists(#state) OR #state <> :open"},
		{"#lastSuccess = :now" + bump, "#state = :open"},
	}
	pick := func(old item) int {
		if stateOf(old) == driver.Open && has(old, aState) {
			return 1
		}
		return 0
	}
	return c.changeGen(ctx, "recording success", name, gen, item{":zero": vN(0)}, variants, pick)
}

// TryProbe implements driver.Circuits: one conditional UpdateItem; when it
// does not apply, the record comes from the endpoint's ALL_OLD copy or one
// consistent read.
func (c circuits) TryProbe(ctx context.Context, name, owner string, openFor, lease time.Duration) (driver.CircuitRecord, bool, error) {
	s := c.s
	pk := s.circPfx + name
	now := nowMs()
	req := reqID()
	vals := item{":now": vN(now), ":req": vS(req), ":one": vN(1), ":o": vS(owner),
		":until": vN(now + driver.Millis(lease)), ":cut": vN(now - driver.Millis(openFor)),
		":open": vS(string(driver.Open)), ":half": vS(string(driver.HalfOpen))}
	upd := "SET #state = :half, #probeOwner = :o, #probeUntil = :until, #updatedAt = :now, #req = :req" +
		s.evSet(s.circEvt, now, req, vals) + bump
	cond := "((#state = :open AND (attribute_not_exists(#openedAt) OR #openedAt <= :cut)) OR " +
		"(#state = :half AND (attribute_not_exists(#probeOwner) OR #probeOwner = :o OR attribute_not_exists(#probeUntil) OR #probeUntil <= :now))) AND " + notMine
	attrs, failed, old, err := s.update(ctx, "probing circuit", pk, metaSK, upd, cond, vals, types.ReturnValueAllNew)
	if err != nil {
		return driver.CircuitRecord{}, false, err
	}
	if !failed {
		s.remember(name, attrs)
		return circRec(name, attrs), true, nil
	}
	if old == nil {
		if old, err = s.get(ctx, "reading circuit", pk, metaSK); err != nil {
			return driver.CircuitRecord{}, false, err
		}
	}
	if old == nil {
		return driver.CircuitRecord{Name: name, State: driver.Closed}, false, nil
	}
	s.remember(name, old)
	return circRec(name, old), gS(old, aReq) == req, nil
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
		v.upd = "#state = :closed, #failures = :zero" + clearProbe + bump
	case driver.Open:
		v.upd = "#state = :open, #openedAt = :now" + clearProbe + bump
	default:
		v.upd = "#state = :half" + clearProbe + bump
	}
	return c.change(ctx, "setting circuit", name, item{":zero": vN(0)}, []variant{v}, func(item) int { return 0 })
}

// Delete implements driver.Circuits: one DeleteItem.
func (c circuits) Delete(ctx context.Context, name string) (bool, error) {
	old, _, err := c.s.del(ctx, "deleting circuit", c.s.circPfx+name, metaSK, "", nil)
	c.s.circGuess.Delete(name)
	return old != nil, err
}

// List implements driver.Circuits: a filtered Scan (see locks.List).
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

// errNoCounts is returned by the gobreaker-parity operations until this
// store implements them.
var errNoCounts = errors.New("dynamo: circuit counts, trips and concurrent probes are not implemented yet: " + errors.ErrUnsupported.Error())

// RecordOutcome implements driver.Circuits.
func (c circuits) RecordOutcome(ctx context.Context, name string, o driver.Outcome) (driver.CircuitRecord, error) {
	return driver.CircuitRecord{}, errNoCounts
}

// Trip implements driver.Circuits.
func (c circuits) Trip(ctx context.Context, name string, version int64) (driver.CircuitRecord, bool, error) {
	return driver.CircuitRecord{}, false, errNoCounts
}

// TryProbes implements driver.Circuits.
func (c circuits) TryProbes(ctx context.Context, name, owner string, openFor, lease time.Duration, maxProbes int) (driver.CircuitRecord, bool, error) {
	return driver.CircuitRecord{}, false, errNoCounts
}
