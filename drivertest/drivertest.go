package drivertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// Harness tells the suite how to reach the store under test.
type Harness struct {
	// Name names the store in messages ("postgres", "memory", …).
	Name string
	// Open returns a NEW store (a new connection) on the harness's one
	// database, in namespace prefix. The suite closes it when the test
	// ends. Open reports its own failures with t.Fatal.
	Open func(t testing.TB, prefix string) *warden.Store
	// URL, if non-nil, returns a URL that opens the same database in
	// namespace prefix from another OS process with warden.Open. It
	// enables the multi-process checks; the test binary's TestMain must
	// then call Main.
	URL func(t testing.TB, prefix string) string
	// Upstream and ProxiedURL, if both are non-nil, enable the Faults
	// group, which puts a fault-injecting TCP proxy (delay, blackhole,
	// reset, cut) on the loopback interface between each of several
	// worker processes and the server. Upstream returns the host:port of
	// the server that URL's stores reach: the address the proxies forward
	// to. ProxiedURL returns what URL(t, prefix) returns except that the
	// store it opens reaches the server only through proxyAddr (a
	// 127.0.0.1:port): every connection it makes — including those of a
	// client's monitoring and discovery — must go there, never to
	// Upstream or another host. The test binary's TestMain must call Main.
	Upstream   func(t testing.TB) string
	ProxiedURL func(t testing.TB, prefix, proxyAddr string) string
	// Groups, if non-nil, names the top-level groups to run ("Locks",
	// "Lifecycle", …; see Run); nil runs them all. A store's second harness
	// whose stores run the same statements as a first, full one — a store
	// made by New on the caller's client instead of opened by URL, say —
	// runs the groups where the way it was made shows: Leaks, Namespaces,
	// Lifecycle, Notifications, MultiProcess (see ConstructionGroups). A
	// name the suite does not know fails the test.
	Groups []string
}

// ConstructionGroups are the groups that check what depends on how a
// store was made rather than on the statements it runs: connections and
// goroutines it owns (Leaks), names and isolation of its tables or
// collections (Namespaces), Close and the caller's handle (Lifecycle),
// its event streams (Notifications) and stores of other processes on the
// same data (MultiProcess). A harness that repeats a full one on another
// constructor sets Harness.Groups to them.
var ConstructionGroups = []string{"Leaks", "Namespaces", "Lifecycle", "Notifications", "MultiProcess"}

// Run runs the conformance suite (the groups Harness.Groups names, or all)
// against the store h opens. Every check is a parallel subtest with its
// own namespace; the checks start when the calling test function returns,
// so Run returns before they have run and the harness's resources must be
// released with t.Cleanup.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Open == nil {
		t.Fatal("drivertest: Harness.Open is nil")
	}
	if h.Name == "" {
		h.Name = "store"
	}
	s := &suite{h: h}
	groups := []check{
		{"Leaks", s.leaks}, // first and alone: it counts the process's goroutines and files
		{"Locks", s.locks},
		{"Circuits", s.circuits},
		{"Cache", s.cache},
		{"HostileKeys", s.hostile},
		{"Idempotency", s.idempotency},
		{"Checkpoints", s.checkpoints},
		{"Namespaces", s.namespaces},
		{"Lifecycle", s.lifecycle},
		{"Notifications", s.notifications},
		{"MultiProcess", s.multiProcess},
		{"Portable", s.portable},
		{"Faults", s.faults},
	}
	run := map[string]bool{}
	for _, name := range h.Groups {
		known := false
		for _, g := range groups {
			known = known || g.name == name
		}
		if !known {
			t.Fatalf("drivertest: Harness.Groups names %q, which is not a group of the suite", name)
		}
		run[name] = true
	}
	for _, g := range groups {
		if h.Groups == nil || run[g.name] {
			t.Run(g.name, g.fn)
		}
	}
}

// suite carries the harness through the checks.
type suite struct {
	h Harness
}

// check is one named subtest of a group.
type check struct {
	name string
	fn   func(t *testing.T)
}

// group runs checks as parallel subtests of a parallel group.
func group(t *testing.T, checks []check) {
	t.Parallel()
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t)
		})
	}
}

// namespace returns a fresh prefix for t: the end of its name and a random
// suffix, ending in ':'.
func namespace(t testing.TB) string {
	name := t.Name()
	b := make([]byte, 0, len(name))
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
			b = append(b, c)
		default:
			b = append(b, '-')
		}
	}
	if len(b) > 40 {
		b = b[len(b)-40:]
	}
	return fmt.Sprintf("wdt-%s-%08x:", b, rand.Uint32())
}

// open opens a store in a fresh namespace and returns it with the prefix.
func (s *suite) open(t *testing.T) (*warden.Store, string) {
	t.Helper()
	prefix := namespace(t)
	return s.openPrefix(t, prefix), prefix
}

// openPrefix opens a store in namespace prefix; it is closed when t ends.
func (s *suite) openPrefix(t testing.TB, prefix string) *warden.Store {
	t.Helper()
	st := s.h.Open(t, prefix)
	if st == nil {
		t.Fatalf("%s: Harness.Open returned nil", s.h.Name)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("%s: Close: %v", s.h.Name, err)
		}
	})
	return st
}

// testCtx is the context of a check's store calls: t's, which ends with
// the check. It sets no deadline of its own: checks assert what a store
// does, not how fast, and a store that hangs is reported by go test's
// -timeout, with the stack of the call that hangs.
func testCtx(t *testing.T) context.Context {
	return t.Context()
}

// parallel runs f(0) … f(n-1) on n goroutines released together, and
// waits for all of them.
func parallel(n int, f func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			f(i)
		})
	}
	close(start)
	wg.Wait()
}

// sleepCtx sleeps for d or until ctx ends; it reports whether it slept
// the whole time.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// sleepUntil waits until the local clock passes at (waiting for a TTL to
// run out is inherent to the checks that use it).
func sleepUntil(t *testing.T, ctx context.Context, at time.Time) {
	t.Helper()
	if !sleepCtx(ctx, time.Until(at)) {
		t.Fatalf("context ended while waiting: %v", ctx.Err())
	}
}

// span is the local monotonic time interval of one store call.
type span struct{ start, end time.Time }

// timed runs f and returns the interval it took.
func timed(f func()) span {
	start := time.Now()
	f()
	return span{start, time.Now()}
}

// precisionSlack absorbs the millisecond truncation of store timestamps.
const precisionSlack = 2 * time.Millisecond

// checkDelta checks the difference of two expiries computed by the store's
// clock as now+ttl in calls a (earlier) and b (later): got = e_b - e_a must
// be want (ttl_b - ttl_a) plus the store-clock time between the two calls,
// which lies between b.start-a.end and b.end-a.start. A store that rounds
// TTLs to seconds misses this by hundreds of milliseconds.
func checkDelta(t *testing.T, what string, got, want time.Duration, a, b span) {
	t.Helper()
	lo := want + b.start.Sub(a.end) - precisionSlack
	hi := want + b.end.Sub(a.start) + precisionSlack
	if got < lo || got > hi {
		t.Errorf("%s: expiries differ by %v, want %v plus the %v–%v between the calls: the store does not keep TTLs to the millisecond",
			what, got, want, b.start.Sub(a.end), b.end.Sub(a.start))
	}
}

// early reports whether at, the end of a call, proves that the call ran
// before a TTL of d started at start (the local time before the call that
// set it) had run out. The store clock's millisecond truncation is allowed
// for.
func early(start time.Time, d time.Duration, at time.Time) bool {
	return at.Before(start.Add(d - precisionSlack))
}

// checkTime checks a time the store returned: set, UTC, whole milliseconds.
func checkTime(t *testing.T, what string, tm time.Time) {
	t.Helper()
	switch {
	case tm.IsZero():
		t.Errorf("%s is zero", what)
	case tm.Location() != time.UTC:
		t.Errorf("%s = %v is not in UTC (location %q)", what, tm, tm.Location())
	case !tm.Equal(tm.Truncate(time.Millisecond)):
		t.Errorf("%s = %v is not a whole millisecond", what, tm.Format(time.RFC3339Nano))
	}
}

// timing runs f with d, 2d, 4d, … until f reports that its timing was
// conclusive. f returns false when the machine was too slow for the check
// to decide anything (a call that had to happen before a deadline was
// issued after it); it reports real failures with t.Errorf itself. A
// slow machine is no failure: the duration doubles until the check can
// decide, however many times that takes.
func timing(t *testing.T, d time.Duration, f func(d time.Duration) (conclusive bool)) {
	t.Helper()
	for !f(d) {
		t.Logf("timing inconclusive with %v (slow machine), retrying with %v", d, 2*d)
		d *= 2
	}
}

// globEscape returns a glob that matches s literally.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r == '*' || r == '?' || r == '\\' {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// matching returns the keys that match the glob pattern, sorted, as every
// listing must return them.
func matching(keys []string, pattern string) []string {
	p := driver.MustPattern(pattern)
	var out []string
	for _, k := range keys {
		if p.Match(k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// sameKeys compares a listing with the keys it should hold, in order.
func sameKeys(t *testing.T, what string, got, want []string) bool {
	t.Helper()
	if slices.Equal(got, want) || (len(got) == 0 && len(want) == 0) {
		return true
	}
	gotSet := map[string]bool{}
	for _, k := range got {
		gotSet[k] = true
	}
	wantSet := map[string]bool{}
	for _, k := range want {
		wantSet[k] = true
	}
	var extra, missing []string
	for _, k := range got {
		if !wantSet[k] {
			extra = append(extra, k)
		}
	}
	for _, k := range want {
		if !gotSet[k] {
			missing = append(missing, k)
		}
	}
	switch {
	case len(extra) > 0 || len(missing) > 0:
		t.Errorf("%s: got %d keys, want %d; unexpected %s; missing %s", what, len(got), len(want), quoteSome(extra), quoteSome(missing))
	case len(got) != len(want):
		t.Errorf("%s: got %d keys (with duplicates), want %d", what, len(got), len(want))
	default:
		t.Errorf("%s: keys not sorted in byte order: got %s", what, quoteSome(got))
	}
	return false
}

// quoteSome quotes the first few strings of a list.
func quoteSome(ss []string) string {
	if len(ss) == 0 {
		return "none"
	}
	const max = 8
	var parts []string
	for i, s := range ss {
		if i == max {
			parts = append(parts, fmt.Sprintf("… (%d more)", len(ss)-max))
			break
		}
		if len(s) > 40 {
			s = s[:40] + "…"
		}
		parts = append(parts, fmt.Sprintf("%q", s))
	}
	return strings.Join(parts, ", ")
}

// short shortens a key for messages.
func short(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%q… (%d bytes)", s[:40], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// wantErr checks that err matches target with errors.Is.
func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: got error %v, want %v", what, err, target)
	}
}

// fatalIf stops the check on an unexpected error.
func fatalIf(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// errorIf reports an unexpected error and tells whether there was one.
func errorIf(t *testing.T, what string, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return true
	}
	return false
}

// errList collects errors from many goroutines and reports the first few.
type errList struct {
	mu   sync.Mutex
	n    int
	msgs []string
}

func (e *errList) add(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	if len(e.msgs) < 5 {
		e.msgs = append(e.msgs, fmt.Sprintf(format, args...))
	}
}

func (e *errList) report(t *testing.T, what string) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n > 0 {
		t.Errorf("%s: %d failures, first: %s", what, e.n, strings.Join(e.msgs, "; "))
	}
}

// errorCap reports the first few of many similar errors and counts the
// rest; call done at the end. It is for one goroutine.
type errorCap struct {
	t    *testing.T
	n    int
	what string
}

func newErrorCap(t *testing.T, what string) *errorCap { return &errorCap{t: t, what: what} }

func (c *errorCap) Errorf(format string, args ...any) {
	c.t.Helper()
	c.n++
	if c.n <= 5 {
		c.t.Errorf(format, args...)
	}
}

func (c *errorCap) done() {
	c.t.Helper()
	if c.n > 5 {
		c.t.Errorf("%s: %d more errors like the above", c.what, c.n-5)
	}
}

func (e *errList) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}
