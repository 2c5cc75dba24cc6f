package scope_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/checkpoint"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/internal/scopetest"
	"github.com/warden-go/warden/internal/testkit"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/scope"
	"github.com/warden-go/warden/store/memory"
)

// TestMain fails the run if a goroutine of scope, or of the Lockers and
// Breakers its scopes make, outlives the tests.
func TestMain(m *testing.M) {
	testkit.MainNoLeaks(m, "leaked goroutines", func(g string) bool {
		return strings.Contains(g, "warden/scope.") || strings.Contains(g, "warden/lock.") ||
			strings.Contains(g, "warden/breaker.")
	})
}

// quietStore is a fresh memory store that drops the warnings the tests
// provoke (lost leases); hook, if not nil, sees its operations.
func quietStore(t *testing.T, hook warden.Hook) *warden.Store {
	t.Helper()
	return testkit.Open(t, memory.NewDriver(&memory.Options{Name: testkit.DBName(t)}),
		&warden.Options{Logger: slog.New(slog.DiscardHandler), Hook: hook})
}

// scopeGoroutines returns the stacks of running goroutines with a frame
// in package scope, and of those the ones doing more than ending: a task
// goroutine that has counted itself out (Scope.exit) may still be
// returning — no Go program can wait for a goroutine's last instructions —
// but one with any other frame of scope runs a task, a layer or a wait.
func scopeGoroutines() (all, busy []string) {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	ending := []string{"scope.runTask[", "scope.(*Scope).exit("}
	for _, g := range strings.Split(string(buf), "\n\n") {
		mine, other := false, false
		for _, line := range strings.Split(g, "\n") {
			if strings.HasPrefix(line, "created by ") || !strings.Contains(line, "warden/scope.") {
				continue
			}
			mine = true
			if !slices.ContainsFunc(ending, func(e string) bool { return strings.Contains(line, e) }) {
				other = true
			}
		}
		if mine {
			all = append(all, g)
			if other {
				busy = append(busy, g)
			}
		}
	}
	return all, busy
}

// TestNoGoroutineOutlivesRun: right after Run returns — not after a grace
// period — no goroutine of the scope does anything but return, whatever
// its tasks did: fail, panic, retry, time out, hold locks and lose one,
// start tasks from tasks and nested scopes, wait for a concurrency slot;
// and those returning are gone soon after (waited for without a limit).
func TestNoGoroutineOutlivesRun(t *testing.T) {
	st := quietStore(t, nil)
	hook := &scopetest.Recorder{}
	var held atomic.Int64 // lock tasks that got their lock
	for round := range 20 {
		err := scope.Run(t.Context(), func(s *scope.Scope) error {
			for i := range 8 {
				s.Go(func(ctx context.Context) error {
					held.Add(1)
					s.Go(func(ctx context.Context) error { // a task started by a task
						runtime.Gosched()
						return nil
					})
					err := scope.Run(ctx, func(inner *scope.Scope) error { // a nested scope
						inner.Go(func(ctx context.Context) error { <-ctx.Done(); return nil }, scope.Timeout(time.Millisecond))
						return nil
					})
					if i == 0 && err == nil { // keeps lock-0 until it is lost or the scope ends
						<-ctx.Done()
						return ctx.Err()
					}
					return err
				}, scope.Lock(fmt.Sprint("lock-", i)))
			}
			s.Go(func(ctx context.Context) error { return errors.New("x") },
				scope.Retry(scope.RetryPolicy{Attempts: 3, Min: time.Millisecond, Max: time.Millisecond}), scope.Breaker("b"))
			s.Go(func(ctx context.Context) error { panic("boom") })
			s.Go(func(ctx context.Context) error {
				if _, err := st.Locks().ForceRelease(ctx, "lock-0"); err != nil {
					return err
				}
				<-ctx.Done()
				return nil
			})
			return nil
		}, scope.WithStore(st), scope.WithHook(hook), scope.WithLimit(3+round%4),
			scope.WithLockOptions(&lock.Options{TTL: lock.MinTTL}))
		if err == nil {
			t.Fatal("Run = nil, want a task's error")
		}
		if _, busy := scopeGoroutines(); len(busy) > 0 {
			t.Fatalf("round %d: %d goroutines of the scope still run after Run returned:\n%s", round, len(busy), strings.Join(busy, "\n\n"))
		}
		for all, _ := scopeGoroutines(); len(all) > 0; all, _ = scopeGoroutines() {
			runtime.Gosched()
		}
	}
	if held.Load() == 0 {
		t.Fatal("no lock task ever held its lock: the check exercised no lease")
	}
}

// TestRunWaitsForTasksStartedLate: a task started by a task after the body
// returned and the scope was cancelled still holds Run until it ends.
func TestRunWaitsForTasksStartedLate(t *testing.T) {
	gate, lateStarted, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var lateEnded atomic.Bool
	runErr := make(chan error, 1)
	go func() {
		runErr <- scope.Run(t.Context(), func(s *scope.Scope) error {
			s.Go(func(ctx context.Context) error {
				<-gate
				s.Go(func(ctx context.Context) error {
					close(lateStarted)
					<-release
					lateEnded.Store(true)
					return nil
				})
				return errors.New("first")
			})
			return nil // the body ends before either task
		})
	}()
	close(gate)
	<-lateStarted
	select {
	case err := <-runErr:
		t.Fatalf("Run returned (%v) before the late task ended", err)
	default:
	}
	close(release)
	if err := <-runErr; err == nil || !strings.Contains(err.Error(), "first") {
		t.Fatalf("Run = %v, want the first task's error", err)
	}
	if !lateEnded.Load() {
		t.Fatal("Run returned before the late task ended")
	}
}

// TestHandlesEndBeforeRunReturns: every handle is done when Run returns,
// and Wait gives the task's own (unwrapped) error and value.
func TestHandlesEndBeforeRunReturns(t *testing.T) {
	errOwn := errors.New("own")
	var hs []*scope.Handle[int]
	err := scope.Run(t.Context(), func(s *scope.Scope) error {
		for i := range 10 {
			hs = append(hs, scope.Go(s, func(ctx context.Context) (int, error) {
				if i == 9 {
					return i, errOwn
				}
				return i, nil
			}, scope.Name(fmt.Sprint("t", i))))
		}
		return nil
	}, scope.WithCollectErrors())
	if err == nil || err.Error() != `scope: task "t9": own` || !errors.Is(err, errOwn) {
		t.Fatalf("Run = %v, want the named task's error", err)
	}
	for i, h := range hs {
		select {
		case <-h.Done():
		default:
			t.Fatalf("handle %d not done after Run returned", i)
		}
		v, err := h.Wait(context.Background())
		if v != i || (i == 9) != (err == errOwn) || (i != 9 && err != nil) {
			t.Errorf("handle %d: %v, %v", i, v, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = scope.Run(t.Context(), func(s *scope.Scope) error {
		block := make(chan struct{})
		h := s.Go(func(ctx context.Context) error { <-block; return nil })
		if _, err := h.Wait(ctx); !errors.Is(err, context.Canceled) {
			t.Errorf("Wait with an ended ctx = %v, want its error", err)
		}
		close(block)
		return nil
	})
}

// TestPanicsBecomeErrors: panics in a task, in the body, with an error
// value, and runtime.Goexit in a task are errors carrying the stack.
func TestPanicsBecomeErrors(t *testing.T) {
	err := scope.Run(t.Context(), func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error { explode(); return nil })
		return nil
	})
	var pe *scope.PanicError
	if !errors.As(err, &pe) || pe.Value != "kaboom" || !strings.Contains(string(pe.Stack), "explode") {
		t.Fatalf("task panic: Run = %v, want a *PanicError whose stack names the panicking function", err)
	}
	if !strings.Contains(err.Error(), "kaboom") || !strings.Contains(err.Error(), "explode") {
		t.Errorf("the message lacks the value or the stack: %v", err)
	}

	err = scope.Run(t.Context(), func(s *scope.Scope) error { explode(); return nil })
	if !errors.As(err, &pe) || pe.Value != "kaboom" {
		t.Fatalf("body panic: Run = %v, want a *PanicError", err)
	}

	sentinel := errors.New("sentinel")
	err = scope.Run(t.Context(), func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error { panic(sentinel) })
		return nil
	})
	if !errors.Is(err, sentinel) || !errors.As(err, &pe) {
		t.Fatalf("panic(err): Run = %v, want a *PanicError matching err", err)
	}

	err = scope.Run(t.Context(), func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error { runtime.Goexit(); return nil })
		return nil
	})
	if !errors.As(err, &pe) || pe.Value != nil || !strings.Contains(err.Error(), "Goexit") {
		t.Fatalf("Goexit: Run = %v, want a *PanicError without value", err)
	}
}

func explode() { panic("kaboom") }

// TestFirstErrorCancels: the first error cancels the siblings with itself
// as the cause, and tasks started afterwards do not run.
func TestFirstErrorCancels(t *testing.T) {
	errFirst := errors.New("first")
	ran := false
	var cause error
	err := scope.Run(t.Context(), func(s *scope.Scope) error {
		up := make(chan struct{})
		sib := s.Go(func(ctx context.Context) error {
			close(up)
			<-ctx.Done()
			cause = context.Cause(ctx)
			return ctx.Err()
		})
		<-up
		first := s.Go(func(ctx context.Context) error { return errFirst }, scope.Name("first"))
		_, _ = first.Wait(context.Background())
		_, _ = sib.Wait(context.Background())
		late := s.Go(func(ctx context.Context) error { ran = true; return nil })
		if _, err := late.Wait(context.Background()); !errors.Is(err, context.Canceled) {
			t.Errorf("a task started after the error: %v, want context.Canceled", err)
		}
		return nil
	})
	if !errors.Is(err, errFirst) || !errors.Is(cause, errFirst) || ran {
		t.Fatalf("Run = %v, sibling's cause %v, late task ran %v", err, cause, ran)
	}
	if err.Error() != `scope: task "first": first` {
		t.Errorf("Run = %q", err)
	}
}

// TestCollectErrors: with WithCollectErrors no error cancels the others,
// and Run joins them all.
func TestCollectErrors(t *testing.T) {
	var finished atomic.Int64
	err := scope.Run(t.Context(), func(s *scope.Scope) error {
		for i := range 5 {
			s.Go(func(ctx context.Context) error {
				if i%2 == 0 {
					return fmt.Errorf("e%d", i)
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
				finished.Add(1)
				return nil
			})
		}
		return errors.New("body")
	}, scope.WithCollectErrors())
	msg := fmt.Sprint(err)
	for _, want := range []string{"body", "e0", "e2", "e4"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Run = %q, lacks %q", msg, want)
		}
	}
	if finished.Load() != 2 {
		t.Errorf("%d tasks finished normally, want 2: collecting must not cancel", finished.Load())
	}
}

// TestLimit: with WithLimit(2), exactly two of five blocked tasks run at
// once and the others start as slots free up.
func TestLimit(t *testing.T) {
	var running, most atomic.Int64
	started := make(chan struct{}, 5)
	release := make(chan struct{})
	runErr := make(chan error, 1)
	go func() {
		runErr <- scope.Run(t.Context(), func(s *scope.Scope) error {
			for range 5 {
				s.Go(func(ctx context.Context) error {
					n := running.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					started <- struct{}{}
					<-release
					running.Add(-1)
					return nil
				})
			}
			return nil
		}, scope.WithLimit(2))
	}()
	<-started
	<-started
	for range 3 { // free one slot at a time
		release <- struct{}{}
		<-started
	}
	close(release)
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	if most.Load() != 2 {
		t.Fatalf("at most %d tasks ran at once, want 2", most.Load())
	}
}

// TestAfterRun: Go, Locker and Breaker of a scope whose Run returned
// refuse with warden.ErrClosed; the scope's leases were released.
func TestAfterRun(t *testing.T) {
	st := quietStore(t, nil)
	var kept *scope.Scope
	err := scope.Run(t.Context(), func(s *scope.Scope) error {
		kept = s
		l, err := s.Locker()
		if err != nil {
			return err
		}
		_, err = l.Acquire(s.Context(), "kept") // never released by the body
		return err
	}, scope.WithStore(st))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kept.Go(func(context.Context) error { return nil }).Wait(t.Context()); !errors.Is(err, warden.ErrClosed) {
		t.Errorf("Go after Run = %v, want warden.ErrClosed", err)
	}
	if _, err := kept.Locker(); !errors.Is(err, warden.ErrClosed) {
		t.Errorf("Locker after Run = %v, want warden.ErrClosed", err)
	}
	if _, err := kept.Breaker("b"); !errors.Is(err, warden.ErrClosed) {
		t.Errorf("Breaker after Run = %v, want warden.ErrClosed", err)
	}
	if _, held, err := st.Locks().Get(t.Context(), "kept"); err != nil || held {
		t.Errorf("the lease taken with the scope's Locker is still held (%v) after Run", err)
	}
	if kept.Context().Err() == nil {
		t.Error("the scope's context is live after Run returned")
	}
}

// TestInvalidArguments: every bad argument is an error matching
// warden.ErrInvalidArgument (or warden.ErrInvalidKey), never a panic.
func TestInvalidArguments(t *testing.T) {
	st := quietStore(t, nil)
	ok := func(context.Context) error { return nil }
	runs := map[string]error{
		"nil body":            scope.Run(t.Context(), nil),
		"nil store":           scope.Run(t.Context(), func(*scope.Scope) error { return nil }, scope.WithStore(nil)),
		"negative limit":      scope.Run(t.Context(), func(*scope.Scope) error { return nil }, scope.WithLimit(-1)),
		"bad lock options":    runTask(t, st, ok, scope.Lock("k")),
		"timeout under 1ms":   runTask(t, nil, ok, scope.Timeout(time.Microsecond)),
		"negative timeout":    runTask(t, nil, ok, scope.Timeout(-time.Second)),
		"negative attempts":   runTask(t, nil, ok, scope.Retry(scope.RetryPolicy{Attempts: -1})),
		"retry min under":     runTask(t, nil, ok, scope.Retry(scope.RetryPolicy{Min: time.Nanosecond})),
		"retry max negative":  runTask(t, nil, ok, scope.Retry(scope.RetryPolicy{Max: -time.Millisecond})),
		"resume only alone":   runTask(t, st, ok, scope.ResumeOnly()),
		"lock without store":  runTask(t, nil, ok, scope.Lock("k")),
		"idempotent no store": runTask(t, nil, ok, scope.Idempotent("k")),
		"checkpoint no store": runTask(t, nil, ok, scope.Checkpoint[int]("k")),
		"breaker no store":    runTask(t, nil, ok, scope.Breaker("k")),
		"nil task function":   runTask(t, nil, nil),
	}
	// The lock options are checked when the scope first needs its Locker.
	runs["bad lock options"] = scope.Run(t.Context(), func(s *scope.Scope) error {
		s.Go(ok, scope.Lock("k"))
		return nil
	}, scope.WithStore(st), scope.WithLockOptions(&lock.Options{TTL: time.Millisecond}))
	for name, err := range runs {
		if !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("%s: %v, want warden.ErrInvalidArgument", name, err)
		}
	}
	if err := runTask(t, st, ok, scope.Lock("")); !errors.Is(err, warden.ErrInvalidKey) {
		t.Errorf("empty lock key: %v, want warden.ErrInvalidKey", err)
	}
	if _, err := scope.Go[int](nil, func(context.Context) (int, error) { return 0, nil }).Wait(t.Context()); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("nil scope: %v", err)
	}
}

// runTask runs one task with opts in a scope on st (none if nil).
func runTask(t *testing.T, st *warden.Store, fn func(context.Context) error, opts ...scope.TaskOption) error {
	t.Helper()
	var sopts []scope.Option
	if st != nil {
		sopts = append(sopts, scope.WithStore(st))
	}
	return scope.Run(t.Context(), func(s *scope.Scope) error {
		s.Go(fn, opts...)
		return nil
	}, sopts...)
}

// TestHookReports: the hook hears start, retries with their attempt and
// end, under the task's name, with the store's name, in order.
func TestHookReports(t *testing.T) {
	st := quietStore(t, nil)
	rec := &scopetest.Recorder{}
	var attempts []int
	var mu sync.Mutex
	hook := warden.HookFunc(func(ctx context.Context, op warden.OpInfo) {
		rec.AfterOp(ctx, op)
		if op.Op == scope.OpRetry || op.Op == scope.OpTask {
			info, _ := scope.TaskFromContext(ctx)
			mu.Lock()
			attempts = append(attempts, info.Attempt)
			mu.Unlock()
		}
	})
	errFlaky := errors.New("flaky")
	n := 0
	err := scope.Run(t.Context(), func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error {
			if n++; n < 3 {
				return errFlaky
			}
			return nil
		}, scope.Idempotent("job-1"), scope.Retry(scope.RetryPolicy{Min: time.Millisecond, Max: time.Millisecond}))
		return nil
	}, scope.WithStore(st), scope.WithHook(hook))
	if err != nil {
		t.Fatal(err)
	}
	var seq []string
	for _, op := range rec.Ops("") {
		seq = append(seq, op.Op)
		if op.Key != "job-1" || op.Store != "memory" {
			t.Errorf("%s reported with key %q, store %q; want the task's name and the store", op.Op, op.Key, op.Store)
		}
		if op.Op == scope.OpRetry && !errors.Is(op.Err, errFlaky) {
			t.Errorf("retry reported with %v", op.Err)
		}
	}
	want := []string{scope.OpTaskStart, scope.OpRetry, scope.OpRetry, scope.OpTask}
	if !slices.Equal(seq, want) || !slices.Equal(attempts, []int{1, 2, 3}) {
		t.Fatalf("reports %v (attempts %v), want %v (attempts [1 2 3]: the retried ones, then the last)", seq, attempts, want)
	}
	end := rec.Ops(scope.OpTask)[0]
	if end.Err != nil || end.Duration <= 0 || end.Start.IsZero() {
		t.Errorf("end report %+v", end)
	}
}

// TestCompositionOrder: the store sees the claim before the task's lock,
// the task's lock before the checkpoint's lock and fence and the reading
// of the state, and the result stored after the lock was released; a
// duplicate of the finished task touches no lock at all.
func TestCompositionOrder(t *testing.T) {
	rec := &scopetest.Recorder{}
	st := quietStore(t, rec)
	task := func(ctx context.Context) (int, error) {
		return 7, scope.CursorFromContext[int](ctx).Save(ctx, 1, 50)
	}
	opts := []scope.TaskOption{scope.Timeout(time.Minute), scope.Breaker("dep"), scope.Retry(scope.RetryPolicy{}),
		scope.Checkpoint[int]("job"), scope.Lock("res"), scope.Idempotent("req-1")}
	run := func() int {
		var v int
		err := scope.Run(t.Context(), func(s *scope.Scope) error {
			var err error
			v, err = scope.Go(s, task, opts...).Wait(t.Context())
			return err
		}, scope.WithStore(st))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := run(); v != 7 {
		t.Fatalf("result %d", v)
	}
	var seq []string
	for _, op := range rec.Ops("") {
		switch op.Op {
		case "idempotency.claim", "idempotency.complete", "checkpoint.fence", "checkpoint.latest", "checkpoint.save":
			seq = append(seq, op.Op)
		case "lock.acquire", "lock.release":
			seq = append(seq, op.Op+" "+op.Key)
		}
	}
	want := []string{
		"idempotency.claim",
		"lock.acquire res",
		"lock.acquire checkpoint:job",
		"checkpoint.fence",
		"checkpoint.latest",
		"checkpoint.save",
		"lock.release checkpoint:job",
		"lock.release res",
		"idempotency.complete",
	}
	if !slices.Equal(seq, want) {
		t.Fatalf("store operations in order:\n%s\nwant:\n%s", strings.Join(seq, "\n"), strings.Join(want, "\n"))
	}
	before := len(rec.Ops("lock.acquire"))
	if v := run(); v != 7 {
		t.Fatalf("duplicate result %d", v)
	}
	if after := len(rec.Ops("lock.acquire")); after != before {
		t.Fatalf("the duplicate of a finished task took %d locks, want none", after-before)
	}
}

// TestTimeoutCountsForBreaker: attempts that time out are failures the
// breaker counts (Breaker outside Timeout), and the open circuit ends the
// retries.
func TestTimeoutCountsForBreaker(t *testing.T) {
	st := quietStore(t, nil)
	var calls atomic.Int64
	err := runTaskOpts(t, []scope.Option{scope.WithStore(st), scope.WithBreakerOptions(&breaker.Options{Threshold: 2, OpenFor: time.Hour})},
		func(ctx context.Context) error {
			calls.Add(1)
			<-ctx.Done()
			return ctx.Err()
		}, scope.Timeout(2*time.Millisecond), scope.Breaker("slow"), scope.Retry(scope.RetryPolicy{Attempts: 10, Min: time.Millisecond, Max: time.Millisecond}))
	if !errors.Is(err, breaker.ErrOpen) || calls.Load() != 2 {
		t.Fatalf("Run = %v after %d calls, want breaker.ErrOpen after 2", err, calls.Load())
	}
}

func runTaskOpts(t *testing.T, sopts []scope.Option, fn func(context.Context) error, opts ...scope.TaskOption) error {
	t.Helper()
	return scope.Run(t.Context(), func(s *scope.Scope) error {
		s.Go(fn, opts...)
		return nil
	}, sopts...)
}

// TestRetryPolicy: attempts run out with the last error; If and the
// never-retried errors stop at once; a cancelled scope stops the back-off.
func TestRetryPolicy(t *testing.T) {
	fast := scope.RetryPolicy{Attempts: 4, Min: time.Millisecond, Max: time.Millisecond}
	count := func(err error) (*atomic.Int64, func(context.Context) error) {
		var n atomic.Int64
		return &n, func(context.Context) error { n.Add(1); return err }
	}
	errX := errors.New("x")
	n, fn := count(errX)
	if err := runTask(t, nil, fn, scope.Retry(fast)); !errors.Is(err, errX) || n.Load() != 4 {
		t.Errorf("exhausted: %v after %d calls, want x after 4", err, n.Load())
	}
	n, fn = count(errX)
	if err := runTask(t, nil, fn, scope.Retry(scope.RetryPolicy{Min: time.Millisecond, Max: time.Millisecond})); !errors.Is(err, errX) || n.Load() != scope.DefaultAttempts {
		t.Errorf("default attempts: %d calls", n.Load())
	}
	p := fast
	p.If = func(err error) bool { return !errors.Is(err, errX) }
	n, fn = count(errX)
	if err := runTask(t, nil, fn, scope.Retry(p)); !errors.Is(err, errX) || n.Load() != 1 {
		t.Errorf("If false: %d calls, want 1", n.Load())
	}
	for _, stop := range []error{warden.ErrLeaseLost, warden.ErrInvalidArgument, warden.ErrClosed, breaker.ErrOpen} {
		n, fn = count(fmt.Errorf("wrapped: %w", stop))
		if err := runTask(t, nil, fn, scope.Retry(fast)); !errors.Is(err, stop) || n.Load() != 1 {
			t.Errorf("%v: %d calls, want 1", stop, n.Load())
		}
	}
	var panics atomic.Int64
	err := runTask(t, nil, func(context.Context) error { panics.Add(1); panic("p") }, scope.Retry(fast))
	var pe *scope.PanicError
	if !errors.As(err, &pe) || panics.Load() != 1 {
		t.Errorf("panic: %v after %d calls, want one call", err, panics.Load())
	}
	// A scope cancelled during the back-off ends the retries.
	ctx, cancel := context.WithCancel(t.Context())
	var calls atomic.Int64
	err = scope.Run(ctx, func(s *scope.Scope) error {
		s.Go(func(context.Context) error {
			if calls.Add(1) == 1 {
				cancel()
			}
			return errX
		}, scope.Retry(scope.RetryPolicy{Attempts: 5, Min: time.Hour}))
		return nil
	})
	if !errors.Is(err, errX) || calls.Load() != 1 {
		t.Errorf("cancelled back-off: %v after %d calls", err, calls.Load())
	}
}

// TestCheckpointRetryContinues: an attempt after a failure continues from
// the cursor's last save (Checkpoint outside Retry).
func TestCheckpointRetryContinues(t *testing.T) {
	st := quietStore(t, nil)
	var seen []int
	err := runTaskOpts(t, []scope.Option{scope.WithStore(st)}, func(ctx context.Context) error {
		cp := scope.CursorFromContext[int](ctx)
		s, _ := cp.State()
		seen = append(seen, s)
		if s < 2 {
			if err := cp.Save(ctx, s+1, 0); err != nil {
				return err
			}
			return errors.New("again")
		}
		return nil
	}, scope.Checkpoint[int]("steps"), scope.Retry(scope.RetryPolicy{Attempts: 5, Min: time.Millisecond, Max: time.Millisecond}))
	if err != nil || !slices.Equal(seen, []int{0, 1, 2}) {
		t.Fatalf("Run = %v, states seen %v; want [0 1 2]", err, seen)
	}
	if scope.CursorFromContext[string](context.Background()) != nil {
		t.Error("a cursor outside a task")
	}
}

// TestNested: a nested Run inherits the store, hook and options of the
// scope whose task it runs in, keeps its own limit and error policy, and
// may override the store.
func TestNested(t *testing.T) {
	outerSt, innerSt := quietStore(t, nil), quietStore(t, nil)
	rec := &scopetest.Recorder{}
	var inherited, overridden *warden.Store
	err := scope.Run(t.Context(), func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error {
			if err := scope.Run(ctx, func(in *scope.Scope) error {
				inherited = in.Store()
				in.Go(func(ctx context.Context) error { return nil }, scope.Name("inner"))
				return nil
			}); err != nil {
				return err
			}
			return scope.Run(ctx, func(in *scope.Scope) error {
				overridden = in.Store()
				return nil
			}, scope.WithStore(innerSt))
		}, scope.Name("outer"))
		return nil
	}, scope.WithStore(outerSt), scope.WithHook(rec), scope.WithLimit(1))
	if err != nil {
		t.Fatal(err) // with the outer limit of 1 inherited, the inner task would wait forever
	}
	if inherited != outerSt || overridden != innerSt {
		t.Errorf("nested stores: inherited %p (want %p), overridden %p (want %p)", inherited, outerSt, overridden, innerSt)
	}
	var names []string
	for _, op := range rec.Ops(scope.OpTask) {
		names = append(names, op.Key)
	}
	if !slices.Equal(names, []string{"inner", "outer"}) {
		t.Errorf("the hook heard tasks %v, want the nested one too", names)
	}
}

// TestDefaultNames: a task is named after its first key, else by its
// number.
func TestDefaultNames(t *testing.T) {
	st := quietStore(t, nil)
	var names []string
	var mu sync.Mutex
	record := func(ctx context.Context) error {
		info, _ := scope.TaskFromContext(ctx)
		mu.Lock()
		names = append(names, info.Name)
		mu.Unlock()
		return nil
	}
	err := scope.Run(t.Context(), func(s *scope.Scope) error {
		for _, opts := range [][]scope.TaskOption{
			{scope.Lock("l"), scope.Idempotent("i")},
			{scope.Lock("l2"), scope.Checkpoint[int]("c")},
			{scope.Breaker("b"), scope.Lock("l3")},
			{scope.Breaker("b")},
			{},
			{scope.Name("n"), scope.Lock("l4")},
		} {
			_, _ = s.Go(record, opts...).Wait(s.Context())
		}
		return nil
	}, scope.WithStore(st))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"i", "c", "l3", "b", "task-5", "n"}; !slices.Equal(names, want) {
		t.Fatalf("names %v, want %v", names, want)
	}
	if _, ok := scope.TaskFromContext(t.Context()); ok {
		t.Error("TaskFromContext outside a task")
	}
}

// TestIdempotentErrorsNotStored: a failed idempotent task is run again
// by the next scope (idempotency's default), and its retries happen
// under one claim.
func TestIdempotentErrorsNotStored(t *testing.T) {
	st := quietStore(t, nil)
	var calls atomic.Int64
	fail := true
	for range 2 {
		_ = scope.Run(t.Context(), func(s *scope.Scope) error {
			s.Go(func(context.Context) error {
				calls.Add(1)
				if fail {
					return errors.New("down")
				}
				return nil
			}, scope.Idempotent("k"), scope.Retry(scope.RetryPolicy{Attempts: 2, Min: time.Millisecond, Max: time.Millisecond}))
			return nil
		}, scope.WithStore(st))
		fail = false
	}
	if calls.Load() != 3 {
		t.Fatalf("%d calls, want 2 (first scope, retried) + 1 (second scope)", calls.Load())
	}
	if _, found, err := idempotency.Result[struct{}](t.Context(), st, "k", nil); err != nil || !found {
		t.Fatalf("the success was not stored: %v %v", found, err)
	}
}

// TestCheckpointLockExcludes: two scopes running one checkpointed task
// never run it at once.
func TestCheckpointLockExcludes(t *testing.T) {
	st := quietStore(t, nil)
	var inside, overlaps atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			_ = scope.Run(t.Context(), func(s *scope.Scope) error {
				s.Go(func(ctx context.Context) error {
					if inside.Add(1) > 1 {
						overlaps.Add(1)
					}
					runtime.Gosched()
					inside.Add(-1)
					return scope.CursorFromContext[int](ctx).Save(ctx, 1, 1)
				}, scope.Checkpoint[int]("single"))
				return nil
			}, scope.WithStore(st))
		})
	}
	wg.Wait()
	if overlaps.Load() != 0 {
		t.Fatalf("%d overlapping runs of one checkpointed task", overlaps.Load())
	}
	if _, err := checkpoint.List(t.Context(), st, "single"); err != nil {
		t.Fatal(err)
	}
}
