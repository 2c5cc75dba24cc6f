// Package scopetest holds the checks of package scope that run on a real
// store, in goroutines and in separate OS processes, so that the memory
// store (scope's own tests) and SQLite (its module's tests) run the same
// ones:
//
//   - a task whose lock is force-released elsewhere is cancelled, its
//     siblings too, and Run returns an error matching warden.ErrLeaseLost
//     (the hook hears scope.OpLeaseLost);
//   - concurrent scopes — goroutines, and two processes — running the same
//     Idempotent task run it once and all get its result;
//   - a Checkpoint task that failed (goroutines) or whose process was
//     killed with SIGKILL (processes) resumes from its last save in the
//     next run, and ResumeOnly refuses a task without checkpoints;
//   - Retry stops when the Breaker opens: after exactly Threshold calls
//     when the task's own failures open it, and at once when another
//     process opens it;
//   - Run returns only after every task ended and released its lock.
//
// The process checks re-execute the test binary: it must have a test
// named HelperTest whose body is HelperProcess, and import the store
// package whose URLs Harness.URL returns.
//
// It is imported only from _test.go files.
package scopetest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/checkpoint"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/scope"
)

// HelperTest is the name of the test that re-executed children run.
const HelperTest = "TestScopeHelperProcess"

// childEnv carries a child's configuration, as JSON.
const childEnv = "WARDEN_SCOPETEST_CHILD"

// Harness says how to reach the store under test.
type Harness struct {
	// Name names the store in messages.
	Name string
	// Open returns a new store (a new connection) on the harness's one
	// database in namespace prefix; the checks close it.
	Open func(t testing.TB, prefix string) *warden.Store
	// URL returns a URL that opens the same database in namespace
	// prefix from another process through warden.Open. Nil: the process
	// checks are skipped.
	URL func(t testing.TB, prefix string) string
}

// Run runs the checks as subtests of t, one after the other, each in a
// namespace of its own.
func Run(t *testing.T, h Harness) {
	checks := []struct {
		name  string
		procs bool // re-executes the test binary
		run   func(*testing.T, Harness, string)
	}{
		{"LeaseLost", false, leaseLost},
		{"IdempotentOnce", false, idempotentOnce},
		{"CheckpointResume", false, checkpointResume},
		{"RetriesStopWhenBreakerOpens", false, retriesStop},
		{"RunWaitsForTasks", false, runWaits},
		{"Processes/LeaseLost", true, procLeaseLost},
		{"Processes/IdempotentOnce", true, procIdempotent},
		{"Processes/CheckpointKilled", true, procCheckpointKill},
		{"Processes/RetriesStopWhenAnotherOpensBreaker", true, procBreaker},
	}
	stamp := time.Now().UnixNano()
	for i, c := range checks {
		prefix := fmt.Sprintf("scope%x-%d:", stamp, i)
		t.Run(c.name, func(t *testing.T) {
			if c.procs && h.URL == nil {
				t.Skip(h.Name + ": no URL for other processes")
			}
			c.run(t, h, prefix)
		})
	}
}

func open(t *testing.T, h Harness, prefix string) *warden.Store {
	t.Helper()
	st := h.Open(t, prefix)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// Recorder is a warden.Hook that keeps every report.
type Recorder struct {
	mu  sync.Mutex
	ops []warden.OpInfo
}

// AfterOp records op.
func (r *Recorder) AfterOp(_ context.Context, op warden.OpInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, op)
}

// Ops returns the reports named name ("" for all), in order.
func (r *Recorder) Ops(name string) []warden.OpInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []warden.OpInfo
	for _, op := range r.ops {
		if name == "" || op.Op == name {
			out = append(out, op)
		}
	}
	return out
}

// lostReported reports whether r heard OpLeaseLost for key with an error
// matching warden.ErrLeaseLost.
func lostReported(r *Recorder, key string) bool {
	for _, op := range r.Ops(scope.OpLeaseLost) {
		if op.Key == key && errors.Is(op.Err, warden.ErrLeaseLost) {
			return true
		}
	}
	return false
}

var errFail = errors.New("dependency failed")

// leaseTTL is the TTL of the checks' leases: short, so that a loss is
// found at the next refresh (every TTL/3) and a dead process's lease
// lapses soon, but long enough that a loaded machine still refreshes in
// time — a lease lost for being late would pass for the loss the check
// provokes, or end the victim of CheckpointKilled before its saves.
const leaseTTL = 2 * time.Second

// leaseLost: an operator force-releases the lock a task holds; the task
// and its sibling are cancelled and Run returns the loss.
func leaseLost(t *testing.T, h Harness, prefix string) {
	ctx := t.Context()
	st, operator := open(t, h, prefix), open(t, h, prefix)
	rec := &Recorder{}
	inside, siblingUp := make(chan struct{}), make(chan struct{})
	var siblingCause error
	runErr := make(chan error, 1)
	go func() {
		runErr <- scope.Run(ctx, func(s *scope.Scope) error {
			s.Go(func(ctx context.Context) error {
				close(siblingUp)
				<-ctx.Done()
				siblingCause = context.Cause(ctx)
				return ctx.Err()
			}, scope.Name("sibling"))
			s.Go(func(ctx context.Context) error {
				close(inside)
				<-ctx.Done()
				return ctx.Err()
			}, scope.Lock("k"))
			return nil
		}, scope.WithStore(st), scope.WithHook(rec), scope.WithLockOptions(&lock.Options{TTL: leaseTTL}))
	}()
	<-inside
	<-siblingUp
	ok, err := operator.Locks().ForceRelease(ctx, "k")
	if err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v; want the task's holding released", ok, err)
	}
	err = <-runErr
	if !errors.Is(err, warden.ErrLeaseLost) {
		t.Fatalf("Run = %v, want an error matching warden.ErrLeaseLost", err)
	}
	if !errors.Is(siblingCause, warden.ErrLeaseLost) {
		t.Errorf("the sibling's context was cancelled with %v, want the lost lease", siblingCause)
	}
	if !lostReported(rec, "k") {
		t.Errorf("the hook did not hear %s for k: %+v", scope.OpLeaseLost, rec.Ops(""))
	}
}

// idempotentOnce: sixteen scopes on two connections run one Idempotent
// task at once; it runs once and every scope gets its result.
func idempotentOnce(t *testing.T, h Harness, prefix string) {
	ctx := t.Context()
	stores := []*warden.Store{open(t, h, prefix), open(t, h, prefix)}
	const n = 16
	var runs atomic.Int64
	entered, gate := make(chan struct{}), make(chan struct{})
	values, errs := make([]string, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			errs[i] = scope.Run(ctx, func(s *scope.Scope) error {
				hd := scope.Go(s, func(ctx context.Context) (string, error) {
					if runs.Add(1) == 1 {
						close(entered)
					}
					<-gate
					return fmt.Sprint("value-", i), nil
				}, scope.Idempotent("once"))
				var err error
				values[i], err = hd.Wait(ctx)
				return err
			}, scope.WithStore(stores[i%2]),
				scope.WithIdempotencyOptions(&idempotency.Options{PollMin: 2 * time.Millisecond, PollMax: 20 * time.Millisecond}))
		})
	}
	<-entered
	close(gate)
	wg.Wait()
	if got := runs.Load(); got != 1 {
		t.Fatalf("the task ran %d times, want once", got)
	}
	for i := range n {
		if errs[i] != nil || values[i] != values[0] {
			t.Errorf("scope %d: %q, %v; want %q", i, values[i], errs[i], values[0])
		}
	}
}

// checkpointResume: a checkpointed task fails after three saves; the
// next run, on another connection and with ResumeOnly, resumes from the
// third; after its success a ResumeOnly run finds nothing to resume.
func checkpointResume(t *testing.T, h Harness, prefix string) {
	ctx := t.Context()
	first, second := open(t, h, prefix), open(t, h, prefix)
	opts := []scope.Option{scope.WithLockOptions(&lock.Options{TTL: leaseTTL})}
	err := scope.Run(ctx, func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error {
			cp := scope.CursorFromContext[int](ctx)
			if _, ok := cp.State(); ok {
				return errors.New("a fresh task has a state")
			}
			for i := 1; i <= 3; i++ {
				if err := cp.Save(ctx, i, float64(i)*10); err != nil {
					return err
				}
			}
			return errFail
		}, scope.Checkpoint[int]("job"))
		return nil
	}, append(opts, scope.WithStore(first))...)
	if !errors.Is(err, errFail) {
		t.Fatalf("first run = %v, want its task's error", err)
	}
	var resumedAt int
	var resumed bool
	err = scope.Run(ctx, func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error {
			cp := scope.CursorFromContext[int](ctx)
			resumedAt, _ = cp.State()
			resumed = cp.Resumed()
			return cp.Save(ctx, resumedAt+1, 100)
		}, scope.Checkpoint[int]("job"), scope.ResumeOnly())
		return nil
	}, append(opts, scope.WithStore(second))...)
	if err != nil || !resumed || resumedAt != 3 {
		t.Fatalf("second run = %v, resumed %v at %d; want a resumption at 3", err, resumed, resumedAt)
	}
	if cps, err := checkpoint.List(ctx, first, "job"); err != nil || len(cps) != 0 {
		t.Fatalf("after success the task keeps %d checkpoints (%v), want none", len(cps), err)
	}
	ran := false
	err = scope.Run(ctx, func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error { ran = true; return nil }, scope.Checkpoint[int]("job"), scope.ResumeOnly())
		return nil
	}, append(opts, scope.WithStore(first))...)
	if !errors.Is(err, checkpoint.ErrNotFound) || ran {
		t.Fatalf("ResumeOnly without checkpoints = %v (ran: %v), want checkpoint.ErrNotFound without running", err, ran)
	}
}

// retriesStop: a task retrying a failing call through a breaker with
// Threshold 3 makes exactly three calls; the fourth attempt is rejected
// by the open circuit and ends the retries.
func retriesStop(t *testing.T, h Harness, prefix string) {
	ctx := t.Context()
	st := open(t, h, prefix)
	rec := &Recorder{}
	var calls atomic.Int64
	err := scope.Run(ctx, func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error {
			calls.Add(1)
			return errFail
		}, scope.Breaker("flaky"), scope.Retry(scope.RetryPolicy{Attempts: 10, Min: time.Millisecond, Max: 2 * time.Millisecond}))
		return nil
	}, scope.WithStore(st), scope.WithHook(rec), scope.WithBreakerOptions(&breaker.Options{Threshold: 3, OpenFor: time.Hour}))
	if !errors.Is(err, breaker.ErrOpen) {
		t.Fatalf("Run = %v, want the open circuit's rejection", err)
	}
	if got := calls.Load(); got != 3 {
		t.Errorf("the call ran %d times, want 3 (the threshold)", got)
	}
	retries := rec.Ops(scope.OpRetry)
	if len(retries) != 3 {
		t.Fatalf("the hook heard %d retries, want 3: %+v", len(retries), retries)
	}
	for _, op := range retries {
		if !errors.Is(op.Err, errFail) {
			t.Errorf("retry reported with %v, want the call's error", op.Err)
		}
	}
}

// runWaits: tasks holding locks keep running after a sibling's error
// cancelled them; Run returns only once they have all ended, and their
// locks are free by then.
func runWaits(t *testing.T, h Harness, prefix string) {
	ctx := t.Context()
	st, other := open(t, h, prefix), open(t, h, prefix)
	const n = 4
	var cancelled, ended atomic.Int64
	allCancelled, release := make(chan struct{}), make(chan struct{})
	runErr := make(chan error, 1)
	go func() {
		runErr <- scope.Run(ctx, func(s *scope.Scope) error {
			var inside sync.WaitGroup
			inside.Add(n)
			for i := range n {
				s.Go(func(ctx context.Context) error {
					inside.Done()
					<-ctx.Done()
					if cancelled.Add(1) == n {
						close(allCancelled)
					}
					<-release // clean-up that outlasts the cancellation
					ended.Add(1)
					return ctx.Err()
				}, scope.Lock(fmt.Sprint("w-", i)))
			}
			inside.Wait()
			s.Go(func(ctx context.Context) error { return errFail }, scope.Name("failing"))
			return nil
		}, scope.WithStore(st), scope.WithLockOptions(&lock.Options{TTL: 5 * time.Second}))
	}()
	<-allCancelled
	select {
	case err := <-runErr:
		t.Fatalf("Run returned (%v) while its tasks were still running", err)
	default:
	}
	close(release)
	if err := <-runErr; !errors.Is(err, errFail) {
		t.Fatalf("Run = %v, want the failing task's error", err)
	}
	if got := ended.Load(); got != n {
		t.Fatalf("Run returned with %d of %d tasks ended", got, n)
	}
	for i := range n {
		if rec, held, err := other.Locks().Get(ctx, fmt.Sprint("w-", i)); err != nil || held {
			t.Errorf("lock w-%d after Run: held %v by %q (%v), want free", i, held, rec.Owner, err)
		}
	}
}

// ---------------------------------------------------------------------------
// the process checks

// childConfig tells a child process what to do.
type childConfig struct {
	Mode  string // "lease", "idempotent", "cp-victim", "cp-resume", "breaker"
	URL   string
	Dir   string
	ID    int
	Key   string
	TTL   time.Duration // lock TTL
	Calls int           // idempotent: concurrent scopes
}

// childResult is what a child reports, in Dir/result-ID.json.
type childResult struct {
	Err       string   // Run's error
	LeaseLost bool     // lease: Run's error matches warden.ErrLeaseLost
	HookLost  bool     // lease: the hook heard OpLeaseLost
	Values    []string // idempotent: each scope's result
	State     int      // cp-resume: the state resumed from
	Resumed   bool     // cp-resume: Cursor.Resumed
	Calls     int64    // breaker: calls made
	Open      bool     // breaker: Run's error matches breaker.ErrOpen
}

// HelperProcess is the body of the test named HelperTest: in a child of
// the process checks it does the child's part and exits; otherwise it
// skips.
func HelperProcess(t *testing.T) {
	raw, ok := os.LookupEnv(childEnv)
	if !ok {
		t.Skip("helper process of the scope process checks")
	}
	if err := runChild(raw); err != nil {
		fmt.Fprintln(os.Stderr, "scopetest child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runChild(raw string) error {
	var cfg childConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := warden.Open(ctx, cfg.URL)
	if err != nil {
		return err
	}
	defer st.Close()
	var res childResult
	lockOpts := scope.WithLockOptions(&lock.Options{TTL: cfg.TTL})
	switch cfg.Mode {
	case "lease":
		rec := &Recorder{}
		err = scope.Run(ctx, func(s *scope.Scope) error {
			s.Go(func(ctx context.Context) error {
				if err := touch(cfg.Dir, "inside"); err != nil {
					return err
				}
				<-ctx.Done()
				return ctx.Err()
			}, scope.Lock(cfg.Key))
			return nil
		}, scope.WithStore(st), scope.WithHook(rec), lockOpts)
		res.LeaseLost, res.HookLost = errors.Is(err, warden.ErrLeaseLost), lostReported(rec, cfg.Key)
	case "idempotent":
		res.Values = make([]string, cfg.Calls)
		errs := make([]error, cfg.Calls)
		var wg sync.WaitGroup
		var started sync.WaitGroup
		started.Add(cfg.Calls)
		for g := range cfg.Calls {
			wg.Go(func() {
				errs[g] = scope.Run(ctx, func(s *scope.Scope) error {
					hd := scope.Go(s, func(ctx context.Context) (string, error) {
						if err := appendLine(filepath.Join(cfg.Dir, "runs"), fmt.Sprint(cfg.ID, "-", g)); err != nil {
							return "", err
						}
						if err := touch(cfg.Dir, "entered"); err != nil {
							return "", err
						}
						if err := await(ctx, filepath.Join(cfg.Dir, "release")); err != nil {
							return "", err
						}
						return fmt.Sprint("value-", cfg.ID, "-", g), nil
					}, scope.Idempotent(cfg.Key))
					started.Done()
					var err error
					res.Values[g], err = hd.Wait(ctx)
					return err
				}, scope.WithStore(st), scope.WithIdempotencyOptions(&idempotency.Options{PollMin: 2 * time.Millisecond, PollMax: 20 * time.Millisecond}))
			})
		}
		started.Wait()
		if err := touch(cfg.Dir, fmt.Sprint("ready-", cfg.ID)); err != nil {
			return err
		}
		wg.Wait()
		err = errors.Join(errs...)
	case "cp-victim":
		err = scope.Run(ctx, func(s *scope.Scope) error {
			s.Go(func(ctx context.Context) error {
				cp := scope.CursorFromContext[int](ctx)
				for i := 1; i <= 3; i++ {
					if err := cp.Save(ctx, i, float64(i)*10); err != nil {
						return err
					}
				}
				if err := touch(cfg.Dir, "saved"); err != nil {
					return err
				}
				<-ctx.Done() // until killed
				return ctx.Err()
			}, scope.Checkpoint[int](cfg.Key))
			return nil
		}, scope.WithStore(st), lockOpts)
		return fmt.Errorf("the victim was not killed: %v", err)
	case "cp-resume":
		err = scope.Run(ctx, func(s *scope.Scope) error {
			s.Go(func(ctx context.Context) error {
				cp := scope.CursorFromContext[int](ctx)
				res.State, _ = cp.State()
				res.Resumed = cp.Resumed()
				return cp.Save(ctx, res.State+1, 100)
			}, scope.Checkpoint[int](cfg.Key), scope.ResumeOnly())
			return nil
		}, scope.WithStore(st), lockOpts)
	case "breaker":
		var calls atomic.Int64
		err = scope.Run(ctx, func(s *scope.Scope) error {
			s.Go(func(ctx context.Context) error {
				if calls.Add(1) == 1 {
					if err := touch(cfg.Dir, "attempt"); err != nil {
						return err
					}
					if err := await(ctx, filepath.Join(cfg.Dir, "opened")); err != nil {
						return err
					}
				}
				return errFail
			}, scope.Breaker(cfg.Key), scope.Retry(scope.RetryPolicy{Attempts: 1 << 20, Min: time.Millisecond, Max: 2 * time.Millisecond}))
			return nil
		}, scope.WithStore(st), scope.WithBreakerOptions(&breaker.Options{Threshold: 1000, OpenFor: time.Hour}))
		res.Calls, res.Open = calls.Load(), errors.Is(err, breaker.ErrOpen)
	default:
		return fmt.Errorf("unknown mode %q", cfg.Mode)
	}
	if err != nil {
		res.Err = err.Error()
	}
	data, merr := json.Marshal(res)
	if merr != nil {
		return merr
	}
	return os.WriteFile(filepath.Join(cfg.Dir, fmt.Sprint("result-", cfg.ID, ".json")), data, 0o644)
}

// touch creates the marker file name in dir.
func touch(dir, name string) error {
	return os.WriteFile(filepath.Join(dir, name), nil, 0o644)
}

// appendLine appends one line to the file at path.
func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// await waits for the file at path to exist, or ctx to end.
func await(ctx context.Context, path string) error {
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", filepath.Base(path), ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// child is a running child process.
type child struct {
	cmd    *exec.Cmd
	out    strings.Builder
	cfg    childConfig
	exited chan struct{}
	err    error // cmd.Wait's, once exited is closed
}

func startChild(t *testing.T, cfg childConfig) *child {
	t.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cfg: cfg, exited: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^"+HelperTest+"$")
	c.cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	c.cmd.Stdout, c.cmd.Stderr = &syncWriter{b: &c.out}, &syncWriter{b: &c.out}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.exited
	})
	return c
}

// syncWriter serialises the writes of a child's stdout and stderr.
type syncWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (c *child) output() string {
	<-c.exited
	return c.out.String()
}

// awaitFile waits for the file at path to exist; it fails the test if a
// child exits first.
func awaitFile(t *testing.T, path string, children ...*child) {
	t.Helper()
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		for _, c := range children {
			select {
			case <-c.exited:
				t.Fatalf("child %s %d exited (%v) before %s appeared:\n%s", c.cfg.Mode, c.cfg.ID, c.err, filepath.Base(path), c.output())
			default:
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// result waits for the child to exit and returns its report.
func (c *child) result(t *testing.T) childResult {
	t.Helper()
	<-c.exited
	if c.err != nil {
		t.Fatalf("child %s %d: %v\n%s", c.cfg.Mode, c.cfg.ID, c.err, c.output())
	}
	data, err := os.ReadFile(filepath.Join(c.cfg.Dir, fmt.Sprint("result-", c.cfg.ID, ".json")))
	if err != nil {
		t.Fatalf("child %s %d wrote no result: %v\n%s", c.cfg.Mode, c.cfg.ID, err, c.output())
	}
	var res childResult
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

// procLeaseLost: the lock a task holds in another process is
// force-released here; that process's Run returns the loss.
func procLeaseLost(t *testing.T, h Harness, prefix string) {
	st := open(t, h, prefix)
	dir := t.TempDir()
	c := startChild(t, childConfig{Mode: "lease", URL: h.URL(t, prefix), Dir: dir, Key: "k", TTL: leaseTTL})
	awaitFile(t, filepath.Join(dir, "inside"), c)
	ok, err := st.Locks().ForceRelease(t.Context(), "k")
	if err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v; want the child's holding released", ok, err)
	}
	res := c.result(t)
	if !res.LeaseLost || !res.HookLost {
		t.Fatalf("child: Run = %q (lease lost: %v), hook heard the loss: %v; want both", res.Err, res.LeaseLost, res.HookLost)
	}
}

// procIdempotent: two processes with four scopes each run one
// Idempotent task at once; it runs once in the fleet.
func procIdempotent(t *testing.T, h Harness, prefix string) {
	dir := t.TempDir()
	const procs, calls = 2, 4
	var children []*child
	for i := range procs {
		children = append(children, startChild(t, childConfig{Mode: "idempotent", URL: h.URL(t, prefix), Dir: dir, ID: i, Key: "once", Calls: calls}))
	}
	for i := range procs {
		awaitFile(t, filepath.Join(dir, fmt.Sprint("ready-", i)), children...)
	}
	awaitFile(t, filepath.Join(dir, "entered"), children...)
	if err := touch(dir, "release"); err != nil {
		t.Fatal(err)
	}
	var values []string
	for _, c := range children {
		res := c.result(t)
		if res.Err != "" {
			t.Errorf("child %d: %s", c.cfg.ID, res.Err)
		}
		values = append(values, res.Values...)
	}
	runs, err := readLines(filepath.Join(dir, "runs"))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 {
		t.Fatalf("the task ran %d times in the fleet (%v), want once", len(runs), runs)
	}
	for _, v := range values {
		if v != values[0] || v == "" {
			t.Fatalf("results %v, want one value everywhere", values)
		}
	}
	if len(values) != procs*calls {
		t.Fatalf("%d results, want %d", len(values), procs*calls)
	}
}

func readLines(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines, sc.Err()
}

// procCheckpointKill: a process running a checkpointed task is killed
// with SIGKILL after three saves; a new process resumes from the third
// once the dead one's lease has lapsed, and its success deletes the
// checkpoints.
func procCheckpointKill(t *testing.T, h Harness, prefix string) {
	st := open(t, h, prefix)
	dir := t.TempDir()
	cfg := childConfig{Mode: "cp-victim", URL: h.URL(t, prefix), Dir: dir, Key: "import", TTL: leaseTTL}
	victim := startChild(t, cfg)
	awaitFile(t, filepath.Join(dir, "saved"), victim)
	if err := victim.cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	<-victim.exited
	cfg.Mode, cfg.ID = "cp-resume", 1
	res := startChild(t, cfg).result(t)
	if res.Err != "" || !res.Resumed || res.State != 3 {
		t.Fatalf("the new process: Run = %q, resumed %v from %d; want a resumption from 3", res.Err, res.Resumed, res.State)
	}
	if cps, err := checkpoint.List(t.Context(), st, "import"); err != nil || len(cps) != 0 {
		t.Fatalf("after success the task keeps %d checkpoints (%v), want none", len(cps), err)
	}
}

// procBreaker: a task in another process retries a failing call through
// a breaker whose threshold it cannot reach soon; this process opens the
// shared circuit while the first call runs, and the retries stop with
// breaker.ErrOpen long before the attempts run out.
func procBreaker(t *testing.T, h Harness, prefix string) {
	st := open(t, h, prefix)
	dir := t.TempDir()
	c := startChild(t, childConfig{Mode: "breaker", URL: h.URL(t, prefix), Dir: dir, Key: "upstream"})
	awaitFile(t, filepath.Join(dir, "attempt"), c)
	b, err := breaker.New(st, "upstream", &breaker.Options{Threshold: 1, OpenFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_ = b.Do(t.Context(), func(context.Context) error { return errFail })
	if state, err := b.State(t.Context()); err != nil || state != breaker.Open {
		t.Fatalf("this process's failure left the circuit %v (%v), want open", state, err)
	}
	if err := touch(dir, "opened"); err != nil {
		t.Fatal(err)
	}
	res := c.result(t)
	if !res.Open {
		t.Fatalf("child: Run = %q after %d calls, want the open circuit's rejection", res.Err, res.Calls)
	}
	t.Logf("%s: the retries stopped after %d calls", h.Name, res.Calls)
}
