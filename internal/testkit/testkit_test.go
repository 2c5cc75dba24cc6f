package testkit_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/internal/testkit"
)

func TestDBNameUnique(t *testing.T) {
	a, b := testkit.DBName(t), testkit.DBName(t)
	if a == b || !strings.HasPrefix(a, t.Name()+"-") {
		t.Fatalf("DBName = %q, then %q; want distinct names starting with the test's", a, b)
	}
}

func TestStoresShareOneDatabase(t *testing.T) {
	ctx := context.Background()
	sts := testkit.Stores(t, 2, nil)
	if err := sts[0].Cache().Set(ctx, "k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	e, found, err := sts[1].Cache().Get(ctx, "k")
	if err != nil || !found || string(e.Value) != "v" {
		t.Fatalf("the other store reads %q found=%v err=%v, want v", e.Value, found, err)
	}
	other := testkit.Stores(t, 1, nil)[0]
	if _, found, err := other.Cache().Get(ctx, "k"); err != nil || found {
		t.Fatalf("a store of another fresh database finds the key: found=%v err=%v", found, err)
	}
}

func TestOpCounter(t *testing.T) {
	var c testkit.OpCounter
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			c.AfterOp(ctx, warden.OpInfo{Op: "lock.acquire"})
			c.AfterOp(ctx, warden.OpInfo{Op: "lock.release"})
		})
	}
	c.AfterOp(ctx, warden.OpInfo{Op: "cache.get"})
	wg.Wait()
	if got := c.Get("lock.acquire"); got != 10 {
		t.Errorf("Get(lock.acquire) = %d, want 10", got)
	}
	if got := c.Sum(func(op string) bool { return strings.HasPrefix(op, "lock.") }); got != 20 {
		t.Errorf("Sum of lock operations = %d, want 20", got)
	}
	c.Reset()
	if got := c.Sum(func(string) bool { return true }); got != 0 {
		t.Errorf("Sum after Reset = %d, want 0", got)
	}
	c.AfterOp(ctx, warden.OpInfo{Op: "cache.get"})
	if got := c.Get("cache.get"); got != 1 {
		t.Errorf("Get(cache.get) after Reset and one op = %d, want 1", got)
	}
}

func TestLogBuffer(t *testing.T) {
	var l testkit.LogBuffer
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() { fmt.Fprintf(&l, "line %d\n", i) })
	}
	wg.Wait()
	if got := strings.Count(l.String(), "\n"); got != 10 {
		t.Fatalf("%d lines written, want 10:\n%s", got, l.String())
	}
}

// logTB records Logf and fails on Fatalf or Errorf.
type logTB struct {
	testing.TB
	mu   sync.Mutex
	logs []string
}

func (f *logTB) Helper() {}

func (f *logTB) Logf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logs = append(f.logs, fmt.Sprintf(format, args...))
}

func (f *logTB) logged() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.logs...)
}

func TestEventually(t *testing.T) {
	n := 0
	testkit.Eventually(t, 5*time.Second, "the third poll", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}

	// Past within it does not fail: it says once that it is still
	// waiting, and waits on until the condition holds.
	f := &logTB{TB: t}
	polls := 0
	testkit.Eventually(f, time.Millisecond, "the log line", func() bool {
		polls++
		return len(f.logged()) > 0 && polls > 10
	})
	if logs := f.logged(); len(logs) != 1 || !strings.Contains(logs[0], "still waiting for the log line") {
		t.Fatalf("logged %q, want one line saying it is still waiting", logs)
	}
}

// blockedInTestkitTest says it started, then blocks until stop is closed;
// Leaked finds it by name.
func blockedInTestkitTest(started chan<- struct{}, stop <-chan struct{}) {
	close(started)
	<-stop
}

func TestLeaked(t *testing.T) {
	match := func(g string) bool { return strings.Contains(g, "blockedInTestkitTest") }
	started, stop := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { blockedInTestkitTest(started, stop) })
	<-started
	stacks := testkit.Leaked(20*time.Millisecond, match)
	close(stop)
	wg.Wait()
	if !strings.Contains(stacks, "blockedInTestkitTest") {
		t.Fatalf("Leaked = %q, want the running goroutine's stack", stacks)
	}
	if stacks := testkit.Leaked(5*time.Second, match); stacks != "" {
		t.Fatalf("Leaked after the goroutine ended = %q, want none", stacks)
	}
}
