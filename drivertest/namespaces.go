package drivertest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

func (s *suite) namespaces(t *testing.T) {
	group(t, []check{
		{"Locks", s.nsLocks},
		{"Circuits", s.nsCircuits},
		{"Cache", s.nsCache},
		{"Idempotency", s.nsIdempotency},
		{"Checkpoints", s.nsCheckpoints},
	})
}

// nsSuffixes make namespaces that break naive prefix matching: names that
// are prefixes of each other ("…a:" and "…ab:"), and prefixes with LIKE,
// glob and regex metacharacters whose naive patterns match the others
// ("p%_*:" as LIKE matches "pzz*:", as a glob "p%_x:", as a regex "p%:").
// Each ends the namespace's name with its only ':' (driver.ValidatePrefix).
var nsSuffixes = []string{"a:", "ab:", "p%_*:", "pzz*:", "p%_x:", "p%:", "p.:", "p[%]:"}

// nsKeys are the keys every namespace writes.
var nsKeys = []string{"k1", "k2", "shared", "b:x", "*", "%"}

// openNamespaces opens one store per namespace on the same database.
func (s *suite) openNamespaces(t *testing.T) []*warden.Store {
	base := strings.TrimSuffix(namespace(t), ":")
	stores := make([]*warden.Store, len(nsSuffixes))
	for i, suffix := range nsSuffixes {
		stores[i] = s.openPrefix(t, base+suffix)
	}
	return stores
}

// nsLocks: every namespace holds its own locks under the same keys.
func (s *suite) nsLocks(t *testing.T) {
	ctx := testCtx(t)
	stores := s.openNamespaces(t)
	for i, st := range stores {
		for _, k := range nsKeys {
			rec, ok, err := st.Locks().Acquire(ctx, k, fmt.Sprintf("ns-%d", i), time.Minute)
			fatalIf(t, "Acquire", err)
			if !ok {
				t.Errorf("namespace %q: Acquire %q refused, held by %q: namespaces share locks", nsSuffixes[i], k, rec.Owner)
			}
		}
	}
	for i := range stores {
		l := stores[i].Locks()
		owner := fmt.Sprintf("ns-%d", i)
		for _, k := range nsKeys {
			rec, found, err := l.Get(ctx, k)
			if err != nil || !found || rec.Owner != owner {
				t.Errorf("namespace %q: Get %q = owner %q found=%v err=%v, want %q", nsSuffixes[i], k, rec.Owner, found, err, owner)
			}
		}
		recs, err := l.List(ctx, "*")
		fatalIf(t, "List", err)
		var keys []string
		for _, r := range recs {
			keys = append(keys, r.Key)
			if r.Owner != owner {
				t.Errorf("namespace %q: List shows %q held by %q, want %q", nsSuffixes[i], r.Key, r.Owner, owner)
			}
		}
		sameKeys(t, fmt.Sprintf("namespace %q: List *", nsSuffixes[i]), keys, matching(nsKeys, "*"))
	}
	for _, k := range nsKeys {
		if ok, err := stores[0].Locks().ForceRelease(ctx, k); err != nil || !ok {
			t.Errorf("ForceRelease %q: ok=%v err=%v", k, ok, err)
		}
	}
	l2 := stores[2].Locks()
	for _, k := range nsKeys {
		rec, _, err := l2.Get(ctx, k)
		fatalIf(t, "Get", err)
		if ok, err := l2.Release(ctx, k, rec.Owner, rec.Token); err != nil || !ok {
			t.Errorf("Release %q: ok=%v err=%v", k, ok, err)
		}
	}
	// The other namespaces must be untouched.
	for i := range stores {
		if i == 0 || i == 2 {
			continue
		}
		owner := fmt.Sprintf("ns-%d", i)
		for _, k := range nsKeys {
			rec, found, err := stores[i].Locks().Get(ctx, k)
			if err != nil || !found || rec.Owner != owner {
				t.Errorf("after releases in other namespaces, namespace %q: Get %q = owner %q found=%v err=%v", nsSuffixes[i], k, rec.Owner, found, err)
			}
		}
	}
	for _, i := range []int{0, 2} {
		recs, err := stores[i].Locks().List(ctx, "*")
		if err != nil || len(recs) != 0 {
			t.Errorf("namespace %q after releasing everything: %d locks, err=%v", nsSuffixes[i], len(recs), err)
		}
	}
}

// nsCircuits: every namespace keeps its own circuits under the same names.
func (s *suite) nsCircuits(t *testing.T) {
	ctx := testCtx(t)
	stores := s.openNamespaces(t)
	for i, st := range stores {
		for _, k := range nsKeys {
			for range i + 1 {
				if _, err := st.Circuits().RecordFailure(ctx, k, 100); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if _, err := stores[0].Circuits().Delete(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if _, err := stores[1].Circuits().Set(ctx, "k2", driver.Open); err != nil {
		t.Fatal(err)
	}
	for i, st := range stores {
		c := st.Circuits()
		want := append([]string(nil), nsKeys...)
		if i == 0 {
			want = want[1:]
		}
		recs, err := c.List(ctx, "*")
		fatalIf(t, "List", err)
		var names []string
		for _, r := range recs {
			names = append(names, r.Name)
			if r.Failures != int64(i+1) && !(i == 1 && r.Name == "k2") {
				t.Errorf("namespace %q: circuit %q has %d failures, want %d: namespaces share circuits", nsSuffixes[i], r.Name, r.Failures, i+1)
			}
			if (r.State == driver.Open) != (i == 1 && r.Name == "k2") {
				t.Errorf("namespace %q: circuit %q is %s", nsSuffixes[i], r.Name, r.State)
			}
		}
		sameKeys(t, fmt.Sprintf("namespace %q: List *", nsSuffixes[i]), names, matching(want, "*"))
	}
}

// nsCache: every namespace keeps its own entries; Keys and Clear stay in
// their namespace.
func (s *suite) nsCache(t *testing.T) {
	ctx := testCtx(t)
	stores := s.openNamespaces(t)
	for i, st := range stores {
		for _, k := range nsKeys {
			fatalIf(t, "Set", st.Cache().Set(ctx, k, []byte(fmt.Sprintf("%d:%s", i, k)), 0))
		}
	}
	verify := func(i int, want []string) {
		t.Helper()
		c := stores[i].Cache()
		keys, err := c.Keys(ctx, "*")
		fatalIf(t, "Keys", err)
		sameKeys(t, fmt.Sprintf("namespace %q: Keys *", nsSuffixes[i]), keys, want)
		for _, k := range want {
			e, found, err := c.Get(ctx, k)
			if err != nil || !found {
				t.Errorf("namespace %q: Get %q found=%v err=%v", nsSuffixes[i], k, found, err)
				continue
			}
			wantValue(t, fmt.Sprintf("namespace %q: Get %q", nsSuffixes[i], k), e.Value, []byte(fmt.Sprintf("%d:%s", i, k)))
		}
	}
	for i := range stores {
		verify(i, matching(nsKeys, "*"))
	}
	// Clear the metacharacter namespace and a prefix of another.
	for _, i := range []int{2, 0} {
		n, err := stores[i].Cache().Clear(ctx)
		fatalIf(t, "Clear", err)
		if n != int64(len(nsKeys)) {
			t.Errorf("namespace %q: Clear deleted %d, want %d", nsSuffixes[i], n, len(nsKeys))
		}
	}
	if ok, err := stores[1].Cache().Delete(ctx, "k1"); err != nil || !ok {
		t.Errorf("Delete: ok=%v err=%v", ok, err)
	}
	for i := range stores {
		switch i {
		case 0, 2:
			verify(i, nil)
		case 1:
			verify(i, matching(nsKeys[1:], "*"))
		default:
			verify(i, matching(nsKeys, "*"))
		}
	}
}

// nsIdempotency: every namespace keeps its own idempotency records.
func (s *suite) nsIdempotency(t *testing.T) {
	ctx := testCtx(t)
	stores := s.openNamespaces(t)
	for i, st := range stores {
		id := st.Idempotency()
		owner := fmt.Sprintf("ns-%d", i)
		for _, k := range nsKeys {
			rec, out, err := id.Claim(ctx, k, owner, time.Minute, "")
			fatalIf(t, "Claim", err)
			if out != driver.Claimed {
				t.Errorf("namespace %q: Claim %q: %v (owner %q): namespaces share idempotency keys", nsSuffixes[i], k, out, rec.Owner)
				continue
			}
			if ok, err := id.Complete(ctx, k, owner, []byte(owner), 0); err != nil || !ok {
				t.Errorf("Complete: ok=%v err=%v", ok, err)
			}
		}
	}
	if ok, err := stores[0].Idempotency().Delete(ctx, "shared"); err != nil || !ok {
		t.Errorf("Delete: ok=%v err=%v", ok, err)
	}
	for i, st := range stores {
		want := matching(nsKeys, "*")
		if i == 0 {
			want = matching([]string{"k1", "k2", "b:x", "*", "%"}, "*")
		}
		recs, err := st.Idempotency().List(ctx, "*")
		fatalIf(t, "List", err)
		var keys []string
		for _, r := range recs {
			keys = append(keys, r.Key)
			wantValue(t, fmt.Sprintf("namespace %q: result of %q", nsSuffixes[i], r.Key), r.Result, []byte(fmt.Sprintf("ns-%d", i)))
		}
		sameKeys(t, fmt.Sprintf("namespace %q: List *", nsSuffixes[i]), keys, want)
	}
}

// nsCheckpoints: every namespace keeps its own tasks and sequences.
func (s *suite) nsCheckpoints(t *testing.T) {
	ctx := testCtx(t)
	stores := s.openNamespaces(t)
	for i, st := range stores {
		for _, task := range nsKeys {
			for range i + 1 {
				if _, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: task, Data: []byte(fmt.Sprint(i))}); err != nil || !ok {
					t.Fatalf("Save: ok=%v err=%v", ok, err)
				}
			}
		}
	}
	if _, err := stores[0].Checkpoints().DeleteAll(ctx, "shared"); err != nil {
		t.Fatal(err)
	}
	if _, err := stores[2].Checkpoints().Cleanup(ctx, "k1", 0); err != nil {
		t.Fatal(err)
	}
	for i, st := range stores {
		c := st.Checkpoints()
		want := append([]string(nil), nsKeys...)
		switch i {
		case 0:
			want = []string{"k1", "k2", "b:x", "*", "%"}
		case 2:
			want = []string{"k2", "shared", "b:x", "*", "%"}
		}
		tasks, err := c.Tasks(ctx, "*")
		fatalIf(t, "Tasks", err)
		sameKeys(t, fmt.Sprintf("namespace %q: Tasks *", nsSuffixes[i]), tasks, matching(want, "*"))
		for _, task := range want {
			cps, err := c.List(ctx, task)
			fatalIf(t, "List", err)
			wantSequences(t, fmt.Sprintf("namespace %q: task %q", nsSuffixes[i], task), cps, seqRange(1, int64(i+1))...)
			for _, cp := range cps {
				if string(cp.Data) != fmt.Sprint(i) {
					t.Errorf("namespace %q: task %q holds data %q, want %q", nsSuffixes[i], task, cp.Data, fmt.Sprint(i))
				}
			}
			if latest, found, err := c.Latest(ctx, task); err != nil || !found || latest.Sequence != int64(i+1) {
				t.Errorf("namespace %q: Latest %q: sequence %d found=%v err=%v", nsSuffixes[i], task, latest.Sequence, found, err)
			}
		}
	}
}
