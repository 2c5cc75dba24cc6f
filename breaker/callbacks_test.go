package breaker_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/internal/testkit"
)

// logBuffer collects a logger's output for inspection.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// A panic in IsFailure during a probe is a failure: the probe's slot is
// given back (the failure re-opens the circuit), the panic surfaces from
// Do in the caller's goroutine, and the Breaker probes again later.
func TestIsFailurePanicIsAFailure(t *testing.T) {
	t.Parallel()
	const openFor = 50 * time.Millisecond
	ctx := context.Background()
	st := openStore(t, testkit.DBName(t), nil)
	errX := errors.New("x")
	b := newBreaker(t, st, "api", &breaker.Options{Threshold: 1, OpenFor: openFor, SyncInterval: time.Hour,
		IsFailure: func(err error) bool {
			if err == errX {
				panic("isfailure")
			}
			return true
		}})
	if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	first := record(t, st, "api")
	if first.State != breaker.Open {
		t.Fatalf("after one failure with Threshold 1: %s", first.State)
	}
	var panicked any
	testkit.Eventually(t, 5*time.Second, "a probe runs", func() bool {
		ran := false
		func() {
			defer func() { panicked = recover() }()
			_ = b.Do(ctx, func(context.Context) error { ran = true; return errX })
		}()
		return ran
	})
	if panicked != "isfailure" {
		t.Fatalf("the probe's IsFailure panicked, Do recovered %v, want the panic to surface from Do", panicked)
	}
	if rec := record(t, st, "api"); rec.State != breaker.Open || !rec.OpenedAt.After(first.OpenedAt) {
		t.Fatalf("after a probe whose IsFailure panicked the circuit is %s (opened at %v, first at %v), want re-opened: the panic was not recorded as a failure", rec.State, rec.OpenedAt, first.OpenedAt)
	}
	if s := b.Stats(); s.CallFailures != 2 {
		t.Fatalf("stats %+v, want 2 call failures", s)
	}
	testkit.Eventually(t, 5*time.Second, "a later probe closes the circuit", func() bool {
		return b.Do(ctx, succeed) == nil
	})
	if rec := record(t, st, "api"); rec.State != breaker.Closed {
		t.Fatalf("after a successful probe: %s", rec.State)
	}
}

// A panic in OnStateChange, which the Breaker calls from its own
// goroutines (outcome writes, notifications) as well as from callers',
// neither ends the process nor wedges the Breaker: it is logged, and the
// circuit opens, is probed and closes as usual.
func TestOnStateChangePanicIsContained(t *testing.T) {
	t.Parallel()
	const openFor = 50 * time.Millisecond
	ctx := context.Background()
	logs := &logBuffer{}
	st := testkit.Open(t, testkit.MemoryDriver(testkit.DBName(t)), &warden.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	b := newBreaker(t, st, "api", &breaker.Options{Threshold: 1, OpenFor: openFor,
		OnStateChange: func(string, breaker.State, breaker.State) { panic("onchange") }})
	if err := b.Do(ctx, fail); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	if rec := record(t, st, "api"); rec.State != breaker.Open {
		t.Fatalf("after one failure with Threshold 1: %s", rec.State)
	}
	testkit.Eventually(t, 5*time.Second, "a probe closes the circuit", func() bool {
		return b.Do(ctx, succeed) == nil
	})
	if rec := record(t, st, "api"); rec.State != breaker.Closed {
		t.Fatalf("after a successful probe: %s", rec.State)
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if s := b.Stats(); s.State != breaker.Closed || s.Probes != 1 {
		t.Fatalf("stats %+v", s)
	}
	if !strings.Contains(logs.String(), "OnStateChange panicked") {
		t.Fatalf("the panics were not logged: %q", logs.String())
	}
}
