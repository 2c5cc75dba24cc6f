package dynamo

import (
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
)

// lockItem is a lock item as the events index returns it.
func lockItem(s *store, key, owner string, token, acq, exp, rel, written int64) item {
	it := item{aPk: vS(s.lockPfx + key), aSk: vS(metaSK), aOwner: vS(owner), aVersion: vN(token),
		aAcq: vN(acq), aExp: vN(exp), aGsk: vS(gskOf(written, "r"))}
	if rel > 0 {
		it[aRel] = vN(rel)
	}
	return it
}

func kinds(evs []driver.LockEvent) []driver.LockEventKind {
	var out []driver.LockEventKind
	for _, e := range evs {
		out = append(out, e.Kind)
	}
	return out
}

func sameKinds(a, b []driver.LockEventKind) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestLockEventDerivation checks how the watcher turns the states of lock
// items it reads from the events index into events.
func TestLockEventDerivation(t *testing.T) {
	s := &store{lockPfx: "LOCK#p:lock:", lookback: 2 * time.Second}
	start := int64(1_000_000)
	st := &watchState{start: start, locks: map[string]*lockSeen{}, circs: map[string]*circSeen{}}
	A, R, E := driver.LockAcquired, driver.LockReleased, driver.LockExpired
	steps := []struct {
		name string
		it   item
		want []driver.LockEventKind
		gap  bool
	}{
		// A holding that began and ended between two polls: both events.
		{"acquired and released unseen", lockItem(s, "k", "a", 10, start+5, start+60_000, start+7, start+7), []driver.LockEventKind{A, R}, false},
		// The same state read again: nothing.
		{"same state again", lockItem(s, "k", "a", 10, start+5, start+60_000, start+7, start+7), nil, false},
		// The next holding.
		{"next holder", lockItem(s, "k", "b", 11, start+20, start+60_000, 0, start+20), []driver.LockEventKind{A}, false},
		// Its release.
		{"released", lockItem(s, "k", "b", 11, start+20, start+60_000, start+30, start+30), []driver.LockEventKind{R}, false},
		// Two holdings skipped: the token jumps by 3.
		{"holdings skipped", lockItem(s, "k", "c", 14, start+50, start+60_000, 0, start+50), []driver.LockEventKind{A}, true},
		// A takeover after the holding expired unseen.
		{"takeover after expiry", lockItem(s, "k", "d", 15, start+70_000, start+130_000, 0, start+70_000), []driver.LockEventKind{E, A}, false},
		// An older state read late from the index: ignored.
		{"stale state", lockItem(s, "k", "c", 14, start+50, start+60_000, start+55, start+55), nil, false},
		// A lock acquired long before the watcher started, released now:
		// only the release.
		{"old holding released", lockItem(s, "old", "e", 3, start-3_600_000, start+60_000, start+80, start+80), []driver.LockEventKind{R}, false},
	}
	for _, step := range steps {
		evs, gap := st.lockEvents(s, []item{step.it})
		if !sameKinds(kinds(evs), step.want) || gap != step.gap {
			t.Errorf("%s: events %v gap %v, want %v gap %v", step.name, kinds(evs), gap, step.want, step.gap)
		}
		for _, e := range evs {
			if e.Key != gS(step.it, aPk)[len(s.lockPfx):] {
				t.Errorf("%s: event key %q", step.name, e.Key)
			}
		}
	}
	// Pruning keeps live holdings and forgets ended ones once the index
	// no longer returns them.
	st.prune(start+200_000, start+100_000)
	if _, ok := st.locks[s.lockPfx+"k"]; !ok {
		t.Error("prune forgot a live holding")
	}
	if _, ok := st.locks[s.lockPfx+"old"]; ok {
		t.Error("prune kept a released lock")
	}
}

// TestCircuitEventDerivation: each new write of a circuit is delivered
// once; skipped versions make a gap.
func TestCircuitEventDerivation(t *testing.T) {
	s := &store{circPfx: "CB#p:circuit:"}
	st := &watchState{locks: map[string]*lockSeen{}, circs: map[string]*circSeen{}}
	c := func(version, written int64, req string) item {
		return item{aPk: vS(s.circPfx + "c"), aSk: vS(metaSK), aState: vS("closed"), aVersion: vN(version), aGsk: vS(gskOf(written, req))}
	}
	if recs, gap := st.circEvents(s, []item{c(1, 100, "a")}); len(recs) != 1 || gap || recs[0].Name != "c" {
		t.Errorf("first write: %v %v", recs, gap)
	}
	if recs, _ := st.circEvents(s, []item{c(1, 100, "a")}); len(recs) != 0 {
		t.Errorf("same write again: %v", recs)
	}
	if recs, gap := st.circEvents(s, []item{c(2, 101, "b")}); len(recs) != 1 || gap {
		t.Errorf("next write: %v %v", recs, gap)
	}
	if recs, gap := st.circEvents(s, []item{c(5, 105, "c")}); len(recs) != 1 || !gap {
		t.Errorf("versions skipped: %v gap=%v, want a gap", recs, gap)
	}
	if recs, _ := st.circEvents(s, []item{c(4, 104, "d")}); len(recs) != 0 {
		t.Errorf("an older write delivered: %v", recs)
	}
	// A deleted and recreated circuit starts at version 1 again, later.
	if recs, gap := st.circEvents(s, []item{c(1, 200, "e")}); len(recs) != 1 || gap {
		t.Errorf("recreated circuit: %v %v", recs, gap)
	}
}
