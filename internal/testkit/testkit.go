// Package testkit holds the helpers that the tests of several warden
// packages share: fresh memory databases, stores closed at the end of a
// test, polling with a deadline, an operation-counting hook, a log buffer
// safe for concurrent use, and a check that no goroutine outlives a test
// binary's tests.
//
// It is imported only from _test.go files.
package testkit

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/memory"
)

// Prefix is the namespace prefix of the stores that MemoryDriver opens.
const Prefix = "p:"

var dbSeq atomic.Int64

// DBName returns a memory database name that no other call in this test
// binary returns: the test's name and a sequence number.
func DBName(t testing.TB) string {
	return fmt.Sprintf("%s-%d", t.Name(), dbSeq.Add(1))
}

// MemoryDriver returns a memory driver on the shared memory database db
// with the namespace Prefix, like one more process connecting to the same
// server.
func MemoryDriver(db string) driver.Store {
	return memory.NewDriver(&memory.Options{Name: db, Prefix: Prefix})
}

// Open returns warden.New(drv, opts), closed at the end of the test.
func Open(t testing.TB, drv driver.Store, opts *warden.Options) *warden.Store {
	t.Helper()
	st := warden.New(drv, opts)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// Stores opens n stores with opts on one fresh memory database, like n
// processes connected to one server. They are closed at the end of the
// test.
func Stores(t testing.TB, n int, opts *warden.Options) []*warden.Store {
	t.Helper()
	name := DBName(t)
	out := make([]*warden.Store, n)
	for i := range out {
		out[i] = Open(t, MemoryDriver(name), opts)
	}
	return out
}

// Eventually polls cond every 2ms until it holds; what describes the
// condition. It never fails the test for taking long: tests assert what
// happens, not how fast (latency belongs in bench/). If cond still does
// not hold after within, it logs that it is still waiting for what, once,
// and goes on; a condition that never holds is reported by go test's
// -timeout, with every goroutine's stack.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	logAt := time.Now().Add(within)
	for !cond() {
		if !logAt.IsZero() && time.Now().After(logAt) {
			t.Logf("still waiting for %s after %v", what, within)
			logAt = time.Time{}
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// OpCounter is a warden.Hook that counts operations by name (OpInfo.Op).
// The zero value counts from zero; it is safe for concurrent use.
type OpCounter struct {
	mu sync.Mutex
	n  map[string]int
}

// AfterOp counts op.
func (c *OpCounter) AfterOp(_ context.Context, op warden.OpInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[op.Op]++
}

// Get returns how many operations named op were counted.
func (c *OpCounter) Get(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[op]
}

// Sum returns the number of counted operations whose name satisfies
// match.
func (c *OpCounter) Sum(match func(op string) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for op, k := range c.n {
		if match(op) {
			n += k
		}
	}
	return n
}

// Reset forgets every count.
func (c *OpCounter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n = nil
}

// LogBuffer collects log output, for example of a slog handler, and is
// safe for concurrent use. The zero value is empty and ready.
type LogBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// Write appends p.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// MainNoLeaks is a TestMain that runs the tests of m and exits with their
// status. When they pass, it fails the run if goroutines for whose stack
// traces leaks reports true are still running two seconds later, and
// prints their stacks under the heading label.
func MainNoLeaks(m *testing.M, label string, leaks func(stack string) bool) {
	code := m.Run()
	if code == 0 {
		if stacks := Leaked(2*time.Second, leaks); stacks != "" {
			fmt.Fprintln(os.Stderr, label+":\n"+stacks)
			code = 1
		}
	}
	os.Exit(code)
}

// Leaked waits up to within for every goroutine for whose stack trace
// leaks reports true to end. It returns "" once none runs, or else the stack traces
// of those still running at the deadline.
func Leaked(within time.Duration, leaks func(stack string) bool) string {
	deadline := time.Now().Add(within)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var bad []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if leaks(g) {
				bad = append(bad, g)
			}
		}
		if len(bad) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(bad, "\n\n")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// FairResult is what one child process of a cross-process fairness check
// reports: how many acquisitions each of its workers counted, and the
// (count, fencing token) of each, where count is the value of a counter
// shared by all processes that the holder increments inside its holding.
type FairResult struct {
	Counts []int
	Turns  [][2]int64
	Err    string
}

// FairTwice runs a fairness check (run reports whether attempt n was
// fair) and runs it once more if it was not: the test fails only if the
// second run is unfair too, since a machine loaded by other tests can
// stall a whole process past a turn. Overlaps and tokens going backwards
// (t.Failed) end it at once, in either run.
func FairTwice(t *testing.T, run func(attempt int) bool) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		if run(attempt) || t.Failed() {
			return
		}
		if attempt == 2 {
			t.Error("unfair hand-off in two runs in a row (want min/max ≥ 0.5)")
			return
		}
		t.Logf("run %d was unfair; running again", attempt)
	}
}

// CheckFair checks the results of a fairness check's children (workers
// each) against the total acquisitions they were to make: the counts add
// up to total, and, in counter order, no two holdings saw one count and
// tokens only grow (else two holders overlapped). It logs the
// acquisitions per worker and reports whether the hand-off was fair:
// the least served worker got at least half as many as the most served.
func CheckFair(t testing.TB, results []FairResult, workers, total int) bool {
	t.Helper()
	var counts []int
	var turns [][2]int64
	for i, r := range results {
		if r.Err != "" {
			t.Errorf("child %d: %s", i, r.Err)
		}
		counts = append(counts, r.Counts...)
		turns = append(turns, r.Turns...)
	}
	if len(counts) == 0 {
		t.Error("no worker reported")
		return false
	}
	sum := 0
	for _, c := range counts {
		sum += c
	}
	lo, hi := slices.Min(counts), slices.Max(counts)
	t.Logf("%d processes × %d workers, %d acquisitions: per worker %v (min/max %.2f)", len(results), workers, sum, counts, float64(lo)/float64(max(hi, 1)))
	if sum != total {
		t.Errorf("%d acquisitions counted, want %d", sum, total)
	}
	fair := float64(lo) >= 0.5*float64(hi)
	if !fair {
		t.Logf("unfair hand-off: a worker got %d acquisitions, another %d", lo, hi)
	}
	slices.SortFunc(turns, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	for i := 1; i < len(turns); i++ {
		if turns[i][0] == turns[i-1][0] || turns[i][1] <= turns[i-1][1] {
			t.Errorf("holdings overlap or tokens go backwards: count %d token %d, then count %d token %d",
				turns[i-1][0], turns[i-1][1], turns[i][0], turns[i][1])
			break
		}
	}
	return fair
}
