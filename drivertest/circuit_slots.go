package drivertest

import (
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// slotLease is the shortest probe lease the API accepts.
const slotLease = time.Millisecond

// grantAfterLapse asks for a probe slot for owner (with a minute's lease)
// until the store grants it: the slots held lapse by the store's own
// clock, which the check polls rather than guesses.
func grantAfterLapse(t *testing.T, c *warden.Circuits, name, owner string, maxProbes int) driver.CircuitRecord {
	t.Helper()
	ctx := testCtx(t)
	for {
		rec, granted, err := c.TryProbes(ctx, name, owner, 0, time.Minute, maxProbes)
		fatalIf(t, "TryProbes", err)
		if granted {
			return rec
		}
		if rec.State != driver.HalfOpen {
			t.Fatalf("%s: waiting for the probe slots to lapse, the circuit is %s, want half-open", short(name), rec.State)
		}
		if !sleepCtx(ctx, time.Millisecond) { // the polling interval
			t.Fatal(ctx.Err())
		}
	}
}

// unchangedSlots is unchanged, also comparing the probe slots' count and
// epoch.
func unchangedSlots(t *testing.T, c *warden.Circuits, what string, got, want driver.CircuitRecord) {
	t.Helper()
	unchanged(t, c, what, got, want)
	if got.Probes != want.Probes || got.ProbeEpoch != want.ProbeEpoch {
		t.Errorf("%s: %d probe slots of epoch %d, want %d of epoch %d", what, got.Probes, got.ProbeEpoch, want.Probes, want.ProbeEpoch)
	}
}

// circuitProbeSlots: a probe's outcome names its slot (the ProbeEpoch its
// grant returned), and the store ignores it, in the same atomic step,
// once the slot is no longer granted. Slot A is granted with the shortest
// lease, lapses, and slot B is granted (to another owner, standing for
// another process): A's late success and failure change nothing — they
// neither close nor re-open the circuit nor free B's slot — and B's
// success closes it. With two slots, A's ignored success frees no slot, so
// no third probe starts. Set clears the slots: a probe running then no
// longer decides either.
func (s *suite) circuitProbeSlots(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Circuits()

	// One slot.
	const one = "slot-one"
	opened, _ := openCircuit(t, c, one)
	g := opened.Generation()
	a, granted, err := c.TryProbe(ctx, one, "a", 0, slotLease)
	fatalIf(t, "TryProbe", err)
	if !granted || a.State != driver.HalfOpen {
		t.Fatalf("TryProbe for a on the due circuit: granted=%v state %s, want granted, half-open", granted, a.State)
	}
	if a.ProbeEpoch <= opened.ProbeEpoch {
		t.Errorf("the grant that turned the circuit half-open: probe epoch %d, want above the open circuit's %d", a.ProbeEpoch, opened.ProbeEpoch)
	}
	b := grantAfterLapse(t, c, one, "b", 1)
	if b.ProbeOwner != "b" || b.Probes != 1 || b.Generation() != g {
		t.Fatalf("the slot granted after a's lapsed: owner %q, %d slots, generation %d; want b, 1, %d", b.ProbeOwner, b.Probes, b.Generation(), g)
	}
	if b.ProbeEpoch == a.ProbeEpoch {
		t.Errorf("the grant after every slot lapsed kept probe epoch %d: a's outcomes would still apply", b.ProbeEpoch)
	}
	r, err := c.RecordOutcome(ctx, one, driver.Outcome{Kind: driver.OutcomeSuccess, Gen: g, ProbeEpoch: a.ProbeEpoch})
	fatalIf(t, "RecordOutcome", err)
	unchangedSlots(t, c, "the late success of a probe whose slot lapsed and was granted again", r, b)
	r, err = c.RecordOutcome(ctx, one, driver.Outcome{Kind: driver.OutcomeFailure, Gen: g, ProbeEpoch: a.ProbeEpoch, Threshold: 1})
	fatalIf(t, "RecordOutcome", err)
	unchangedSlots(t, c, "the late failure of a probe whose slot lapsed and was granted again", r, b)
	r, err = c.RecordOutcome(ctx, one, driver.Outcome{Kind: driver.OutcomeSuccess, Gen: g, ProbeEpoch: b.ProbeEpoch})
	fatalIf(t, "RecordOutcome", err)
	wantCircuit(t, "the success of the probe holding the slot", r, one, driver.Closed, 0)

	// Two slots.
	const two = "slot-two"
	opened, _ = openCircuit(t, c, two)
	g = opened.Generation()
	// Both slots lapse a lease after the newest grant: a's (a minute)
	// holds until a2's (the shortest) is granted, then both lapse soon.
	for _, p := range []struct {
		owner string
		lease time.Duration
	}{{"a", time.Minute}, {"a2", slotLease}} {
		a, granted, err = c.TryProbes(ctx, two, p.owner, 0, p.lease, 2)
		if err != nil || !granted {
			t.Fatalf("TryProbes for %s of 2: granted=%v err=%v, want granted", p.owner, granted, err)
		}
	}
	if a.Probes != 2 {
		t.Fatalf("after two grants of 2 slots: %d slots, want 2", a.Probes)
	}
	b = grantAfterLapse(t, c, two, "b", 2)
	if b.Probes != 1 || b.ProbeEpoch == a.ProbeEpoch {
		t.Fatalf("the slot granted after both lapsed: %d slots of epoch %d (the lapsed ones' %d), want 1 of a new epoch", b.Probes, b.ProbeEpoch, a.ProbeEpoch)
	}
	r, err = c.RecordOutcome(ctx, two, driver.Outcome{Kind: driver.OutcomeSuccess, Gen: g, ProbeEpoch: a.ProbeEpoch, CloseAfter: 2})
	fatalIf(t, "RecordOutcome", err)
	unchangedSlots(t, c, "the late success of a lapsed probe, 2 slots", r, b)
	if _, granted, err := c.TryProbes(ctx, two, "c", 0, time.Minute, 2); err != nil || !granted {
		t.Fatalf("TryProbes for c, the second of 2 slots: granted=%v err=%v, want granted", granted, err)
	}
	if rec, granted, err := c.TryProbes(ctx, two, "d", 0, time.Minute, 2); err != nil || granted {
		t.Errorf("TryProbes for d with b and c probing, 2 slots: granted=%v (%d slots) err=%v, want refused: a lapsed probe's success freed a slot", granted, rec.Probes, err)
	}
	r, err = c.RecordOutcome(ctx, two, driver.Outcome{Kind: driver.OutcomeFailure, Gen: g, ProbeEpoch: b.ProbeEpoch, Threshold: 5})
	fatalIf(t, "RecordOutcome", err)
	wantCircuit(t, "the failure of a probe holding a slot", r, two, driver.Open, 2)

	// Set clears the slots.
	const set = "slot-set"
	openCircuit(t, c, set)
	a, granted, err = c.TryProbe(ctx, set, "a", 0, time.Minute)
	fatalIf(t, "TryProbe", err)
	if !granted {
		t.Fatalf("TryProbe for a on the due circuit: not granted (%s)", a.State)
	}
	half, err := c.Set(ctx, set, driver.HalfOpen)
	fatalIf(t, "Set", err)
	if half.ProbeEpoch == a.ProbeEpoch {
		t.Errorf("Set(half-open) kept probe epoch %d: the probe running still decides", half.ProbeEpoch)
	}
	r, err = c.RecordOutcome(ctx, set, driver.Outcome{Kind: driver.OutcomeSuccess, Gen: a.Generation(), ProbeEpoch: a.ProbeEpoch})
	fatalIf(t, "RecordOutcome", err)
	unchangedSlots(t, c, "the success of a probe whose slot Set cleared", r, half)
}
