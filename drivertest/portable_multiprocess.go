package drivertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/cache"
	"github.com/warden-go/warden/checkpoint"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/lock"
)

// This file holds the multi-process checks of the portable packages: each
// child process opens the store by URL and uses lock, breaker,
// idempotency, cache or checkpoint as a service would, while the parent
// watches the shared outcome through files in a shared directory and
// through the store.

// childRole is the part a child process plays in a portable check.
type childRole func(ctx context.Context, st *warden.Store, cfg childConfig, res *childResult, mu *sync.Mutex, fail func(string, ...any))

// portableRoles are the child roles of the portable checks, dispatched by
// runChild.
var portableRoles = map[string]childRole{
	"portable-lock-exclusion": childLockExclusion,
	"portable-lock-holder":    childLockHolder,
	"portable-idempotency":    childIdempotencyDo,
	"portable-breaker":        childBreaker,
	"portable-cache":          childCacheLoad,
	"portable-checkpoint":     childCheckpointVictim,
}

// Files of the portable checks in the shared directory, besides those of
// multiprocess.go.
const (
	runsFile     = "runs"           // one line per run of an operation, loader or probe
	heldFile     = "held-%d"        // LockHandoff: the child holds the lock (round)
	releaseFile  = "release-%d"     // LockHandoff: the parent waits; release (round)
	releasedFile = "released-%d"    // LockHandoff: local UnixNano right before Release (round)
	takenFile    = "taken-%d"       // LockHandoff: the parent took the lock over (round)
	rejectedFile = "rejected-%d-%d" // BreakerProcesses: a call was rejected (child, goroutine)
	savedFile    = "saved"          // CheckpointResumeAfterKill: the step last saved
	stepReady    = "%s-ready-%d"    // a child reached a step (step, child)
	stepGo       = "%s-go"          // the parent lets the children past a step
)

// ---------------------------------------------------------------------------
// the child side

// childAwait waits until path exists or ctx ends.
func childAwait(ctx context.Context, path string) error {
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if !sleepCtx(ctx, 2*time.Millisecond) {
			return fmt.Errorf("waiting for %s: %w", filepath.Base(path), ctx.Err())
		}
	}
}

// childStep tells the parent that the child reached step and waits until
// the parent lets it go on.
func childStep(ctx context.Context, cfg childConfig, step string) error {
	if err := writeAtomic(filepath.Join(cfg.Dir, fmt.Sprintf(stepReady, step, cfg.ID)), nil); err != nil {
		return err
	}
	return childAwait(ctx, filepath.Join(cfg.Dir, fmt.Sprintf(stepGo, step)))
}

// writeAtomic writes a file that readers see whole or not at all.
func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// readLines returns the lines of a file; none if it does not exist.
func readLines(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return nil, nil
	}
	return strings.Split(s, "\n"), nil
}

// childLockExclusion runs critical sections on one key from Goroutines
// Lockers of its own, with lock.Do and with Acquire/Release in turn.
// Inside each it creates the marker file exclusively (failure: someone
// else is inside), checks that the store shows it as the holder and that
// its token is above the last one in the shared tokens file, and records
// its token.
func childLockExclusion(ctx context.Context, st *warden.Store, cfg childConfig, res *childResult, mu *sync.Mutex, fail func(string, ...any)) {
	marker := filepath.Join(cfg.Dir, markerFile)
	tokens := filepath.Join(cfg.Dir, tokensFile)
	var wg sync.WaitGroup
	for g := range cfg.Goroutines {
		wg.Go(func() {
			who := fmt.Sprintf("child-%d-g%d", cfg.ID, g)
			l, err := lock.New(st, &lock.Options{TTL: cfg.TTL, RetryMax: 50 * time.Millisecond})
			if err != nil {
				fail("%s: lock.New: %v", who, err)
				return
			}
			defer func() {
				if err := l.Close(); err != nil {
					fail("%s: Locker.Close: %v", who, err)
				}
			}()
			section := func(ctx context.Context, token int64) {
				created := enterMarker(marker, who, token, "holder", res, mu, fail)
				rec, found, err := st.Locks().Get(ctx, cfg.Key)
				switch {
				case err != nil:
					fail("%s: Get inside the critical section: %v", who, err)
				case !found || rec.Owner != l.Owner() || (token != 0 && rec.Token != token):
					fail("%s: inside the critical section the store shows %+v (found=%v), want the holder %q with token %d", who, rec, found, l.Owner(), token)
				case token == 0:
					token = rec.Token // lock.Do does not show the lease
				}
				recordToken(tokens, who, token, fail)
				time.Sleep(300 * time.Microsecond) // the work; an overlap would show meanwhile
				if ctx.Err() != nil {
					fail("%s: the lease (token %d) ended inside the critical section: %v", who, token, context.Cause(ctx))
				}
				leaveMarker(marker, created, fail)
				mu.Lock()
				res.Sections++
				mu.Unlock()
			}
			for r := range cfg.Rounds {
				if (g+r)%2 == 0 {
					if err := lock.Do(ctx, l, cfg.Key, func(ctx context.Context) error {
						section(ctx, 0)
						return nil
					}); err != nil {
						fail("%s: lock.Do: %v", who, err)
						return
					}
					continue
				}
				lease, err := l.Acquire(ctx, cfg.Key)
				if err != nil {
					fail("%s: Acquire: %v", who, err)
					return
				}
				section(lease.Context(), lease.Token())
				if err := lease.Release(ctx); err != nil {
					fail("%s: Release (token %d): %v", who, lease.Token(), err)
				}
			}
		})
	}
	wg.Wait()
}

// childLockHolder takes the lock in each round, says so, waits until the
// parent waits for it, writes the local time, releases it, and waits until
// the parent has taken it over.
func childLockHolder(ctx context.Context, st *warden.Store, cfg childConfig, res *childResult, mu *sync.Mutex, fail func(string, ...any)) {
	l, err := lock.New(st, &lock.Options{TTL: cfg.TTL, RetryMax: 50 * time.Millisecond})
	if err != nil {
		fail("lock.New: %v", err)
		return
	}
	defer func() {
		if err := l.Close(); err != nil {
			fail("Locker.Close: %v", err)
		}
	}()
	path := func(format string, r int) string { return filepath.Join(cfg.Dir, fmt.Sprintf(format, r)) }
	for r := range cfg.Rounds {
		lease, err := l.Acquire(ctx, cfg.Key)
		if err != nil {
			fail("round %d: Acquire: %v", r, err)
			return
		}
		if err := writeAtomic(path(heldFile, r), nil); err != nil {
			fail("round %d: %v", r, err)
		}
		if err := childAwait(ctx, path(releaseFile, r)); err != nil {
			fail("round %d: %v", r, err)
		}
		stamp := strconv.FormatInt(time.Now().UnixNano(), 10)
		if err := writeAtomic(path(releasedFile, r), []byte(stamp)); err != nil {
			fail("round %d: %v", r, err)
		}
		if err := lease.Release(ctx); err != nil {
			fail("round %d: Release: %v", r, err)
			return
		}
		// Let the parent's waiter take it before competing again.
		if err := childAwait(ctx, path(takenFile, r)); err != nil {
			fail("round %d: %v", r, err)
			return
		}
	}
}

// childIdempotencyDo makes Goroutines concurrent idempotency.Do calls with
// one key; fn records its run in the runs file.
func childIdempotencyDo(ctx context.Context, st *warden.Store, cfg childConfig, res *childResult, mu *sync.Mutex, fail func(string, ...any)) {
	runs := filepath.Join(cfg.Dir, runsFile)
	opts := &idempotency.Options{Lease: 10 * time.Second, PollMin: 10 * time.Millisecond, PollMax: 100 * time.Millisecond}
	warm := func() error {
		_, _, err := st.Idempotency().Get(ctx, cfg.Key)
		return err
	}
	startTogether(ctx, cfg, warm, fail, func(g int) {
		who := fmt.Sprintf("child-%d-g%d", cfg.ID, g)
		v, err := idempotency.Do(ctx, st, cfg.Key, opts, func(ctx context.Context) (string, error) {
			if err := appendLine(runs, who); err != nil {
				return "", err
			}
			sleepCtx(ctx, cfg.Pause) // the work, long enough for the duplicates to arrive
			return "result-of-" + who, nil
		})
		if err != nil {
			fail("%s: idempotency.Do: %v", who, err)
			return
		}
		mu.Lock()
		res.Values = append(res.Values, v)
		mu.Unlock()
	})
}

// startTogether runs call(0) … call(Goroutines-1) on goroutines of their
// own, started at once across the fleet: each goroutine first makes one
// harmless store request (warm, which opens its connection), then the
// child passes the "start" step, and all calls begin together. It returns
// when every call has.
func startTogether(ctx context.Context, cfg childConfig, warm func() error, fail func(string, ...any), call func(g int)) {
	start := make(chan struct{})
	var ready, wg sync.WaitGroup
	for g := range cfg.Goroutines {
		ready.Add(1)
		wg.Go(func() {
			err := warm()
			ready.Done()
			if err != nil {
				fail("warming up: %v", err)
				return
			}
			<-start
			call(g)
		})
	}
	ready.Wait()
	if err := childStep(ctx, cfg, "start"); err != nil {
		fail("%v", err)
	}
	close(start)
	wg.Wait()
}

// childBreaker plays its part of BreakerProcesses: Rounds failing calls on
// each of two circuits (thresholds Threshold and Threshold+1); then, once
// the parent has checked the counts, it reads the first circuit (open),
// and when the parent says the open period has passed, Goroutines calls
// of which only the fleet's one probe may run fn. The probe holds on until
// every other call of the fleet has been rejected, so that none can be let
// in by the circuit the probe closes.
func childBreaker(ctx context.Context, st *warden.Store, cfg childConfig, res *childResult, mu *sync.Mutex, fail func(string, ...any)) {
	newBreaker := func(name string, threshold int) *breaker.Breaker {
		b, err := breaker.New(st, name, &breaker.Options{
			Threshold:    threshold,
			OpenFor:      cfg.OpenFor,
			ProbeLease:   time.Minute,
			SyncInterval: 50 * time.Millisecond,
			// The fleet's counting is checked here, not the budget: a busy
			// test machine must not make a read count as an outage.
			StoreTimeout: 10 * time.Second,
		})
		if err != nil {
			fail("breaker.New: %v", err)
			return nil
		}
		return b
	}
	opened := newBreaker(cfg.Key, cfg.Threshold)
	closed := newBreaker(cfg.Key+"-closed", cfg.Threshold+1)
	if opened == nil || closed == nil {
		return
	}
	defer opened.Close()
	defer closed.Close()

	failing := func(context.Context) error { return errInjected }
	for i := range cfg.Rounds {
		for _, b := range []*breaker.Breaker{opened, closed} {
			if err := b.Do(ctx, failing); !errors.Is(err, errInjected) {
				fail("failing call %d on %q: got %v, want the injected failure (the circuit must stay closed below its threshold)", i+1, b.Name(), err)
			}
		}
	}
	// Writes the callers stopped waiting for land before the count.
	for _, b := range []*breaker.Breaker{opened, closed} {
		if err := b.Flush(ctx); err != nil {
			fail("Flush %q: %v", b.Name(), err)
		}
		if st := b.Stats(); st.StoreErrors > 0 {
			fail("%q: %d store errors (last %v): failures were not all recorded", b.Name(), st.StoreErrors, st.LastStoreError)
		}
	}
	if err := childStep(ctx, cfg, "counted"); err != nil {
		fail("%v", err)
		return
	}
	if state, err := opened.State(ctx); err != nil || state != breaker.Open {
		fail("State of %q after the fleet's %d failures: %s, %v; want open", opened.Name(), cfg.Threshold, state, err)
	}
	if err := childStep(ctx, cfg, "probe"); err != nil {
		fail("%v", err)
		return
	}
	runs := filepath.Join(cfg.Dir, runsFile)
	var wg sync.WaitGroup
	for g := range cfg.Goroutines {
		wg.Go(func() {
			who := fmt.Sprintf("child-%d-g%d", cfg.ID, g)
			err := opened.Do(ctx, func(ctx context.Context) error {
				if err := appendLine(runs, who); err != nil {
					return err
				}
				for {
					n, err := countFiles(cfg.Dir, "rejected-*")
					if err != nil {
						return err
					}
					if n >= cfg.Total-1 {
						return nil
					}
					if !sleepCtx(ctx, 2*time.Millisecond) {
						return ctx.Err()
					}
				}
			})
			switch {
			case err == nil:
			case errors.Is(err, breaker.ErrOpen):
				mu.Lock()
				res.Rejected++
				mu.Unlock()
				if err := writeAtomic(filepath.Join(cfg.Dir, fmt.Sprintf(rejectedFile, cfg.ID, g)), nil); err != nil {
					fail("%v", err)
				}
			default:
				fail("%s: a call after the open period: %v", who, err)
			}
		})
	}
	wg.Wait()
}

// countFiles counts the files of dir matching a glob.
func countFiles(dir, pattern string) (int, error) {
	m, err := filepath.Glob(filepath.Join(dir, pattern))
	return len(m), err
}

// childCacheLoad makes Goroutines concurrent GetOrLoad calls with one key
// through two Caches; the loader records its run in the runs file.
func childCacheLoad(ctx context.Context, st *warden.Store, cfg childConfig, res *childResult, mu *sync.Mutex, fail func(string, ...any)) {
	runs := filepath.Join(cfg.Dir, runsFile)
	var caches [2]*cache.Cache[string]
	for i := range caches {
		// StoreTimeout: a store slower than the default counts as down, and
		// a Cache then loads without the lease (by design); a loaded test
		// server must not pass for that here.
		c, err := cache.New[string](st, &cache.Options{TTL: time.Minute, LoadLease: 10 * time.Second, PollMax: 50 * time.Millisecond,
			StoreTimeout: time.Minute})
		if err != nil {
			fail("cache.New: %v", err)
			return
		}
		defer c.Close()
		caches[i] = c
	}
	warm := func() error {
		_, _, err := st.Cache().Get(ctx, cfg.Key)
		return err
	}
	startTogether(ctx, cfg, warm, fail, func(g int) {
		who := fmt.Sprintf("child-%d-g%d", cfg.ID, g)
		v, err := caches[g%2].GetOrLoad(ctx, cfg.Key, func(ctx context.Context) (string, error) {
			if err := appendLine(runs, who); err != nil {
				return "", err
			}
			sleepCtx(ctx, cfg.Pause) // the load, long enough for the others to arrive
			return "loaded-by-" + who, nil
		})
		if err != nil {
			fail("%s: GetOrLoad: %v", who, err)
			return
		}
		mu.Lock()
		res.Values = append(res.Values, v)
		mu.Unlock()
	})
}

// childCheckpointVictim runs the task Key under its lock, saves steps 1 to
// StopAt, writes StopAt to the saved file and blocks until it is killed.
func childCheckpointVictim(ctx context.Context, st *warden.Store, cfg childConfig, res *childResult, mu *sync.Mutex, fail func(string, ...any)) {
	err := checkpoint.Run(ctx, st, cfg.Key, &checkpoint.Options{Lock: true, LockOptions: &lock.Options{TTL: cfg.TTL}}, func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
		if v, ok := cp.State(); ok {
			return fmt.Errorf("a fresh task starts from state %d", v)
		}
		for step := 1; step <= cfg.StopAt; step++ {
			if err := cp.Save(ctx, step, 100*float64(step)/float64(cfg.Rounds)); err != nil {
				return err
			}
		}
		if err := writeAtomic(filepath.Join(cfg.Dir, savedFile), []byte(strconv.Itoa(cfg.StopAt))); err != nil {
			return err
		}
		<-ctx.Done() // the parent kills this process here
		return ctx.Err()
	})
	fail("the task was not killed: Run returned %v", err)
}

// ---------------------------------------------------------------------------
// the parent side

// fleet is the child processes of one portable check, sharing a
// directory. They are killed, if still running, when the check ends.
type fleet struct {
	ctx   context.Context
	dir   string
	cfgs  []childConfig
	procs []*childProc
}

// childProc is one child process.
type childProc struct {
	cmd  *exec.Cmd
	out  bytes.Buffer // read only after done
	done chan struct{}
	err  error // the exit status, set before done is closed
}

// fleetConfigs makes n child configurations of role on a fresh namespace
// and directory, and returns them with a store of that namespace. It skips
// the check without Harness.URL.
func (s *suite) fleetConfigs(t *testing.T, role string, n int) ([]childConfig, *warden.Store) {
	t.Helper()
	if s.h.URL == nil {
		t.Skipf("Harness.URL is nil: the multi-process checks need a URL that opens the %s database from another process", s.h.Name)
	}
	st, prefix := s.open(t)
	url := s.h.URL(t, prefix)
	dir := t.TempDir()
	cfgs := make([]childConfig, n)
	for i := range cfgs {
		cfgs[i] = childConfig{Role: role, URL: url, Dir: dir, ID: i, Key: "shared-" + role}
	}
	return cfgs, st
}

// startFleet starts one child per configuration. They wait at the start
// barrier until release.
func startFleet(t *testing.T, cfgs []childConfig) *fleet {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	f := &fleet{ctx: testCtx(t), dir: cfgs[0].Dir, cfgs: cfgs}
	t.Cleanup(func() {
		for _, p := range f.procs {
			select {
			case <-p.done:
			default:
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		}
	})
	for i, cfg := range cfgs {
		f.procs = append(f.procs, startChild(f.ctx, t, exe, i, cfg))
	}
	return f
}

// startChild starts child process i of a check with its configuration;
// the process is killed when ctx ends.
func startChild(ctx context.Context, t *testing.T, exe string, i int, cfg childConfig) *childProc {
	t.Helper()
	b, err := json.Marshal(cfg)
	fatalIf(t, "config", err)
	p := &childProc{done: make(chan struct{})}
	// -test.run=^$: if TestMain does not call Main, the child runs no
	// tests (instead of the whole suite again) and reports nothing.
	p.cmd = exec.CommandContext(ctx, exe, "-test.run=^$", "-test.count=1")
	p.cmd.Env = append(os.Environ(), childEnv+"="+string(b))
	p.cmd.Stdout = &p.out
	p.cmd.Stderr = &p.out
	p.cmd.WaitDelay = 5 * time.Second
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting child %d: %v", i, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p
}

// result reads the result that child i, which has exited, wrote to path;
// it fails the check if the child reported errors or failed.
func (p *childProc) result(t *testing.T, i int, path string) childResult {
	t.Helper()
	var res childResult
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("child %d wrote no result (exit: %v) — does the test binary's TestMain call drivertest.Main(m)? Output:\n%s", i, p.err, p.out.String())
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("child %d result: %v", i, err)
	}
	if len(res.Errors) > 0 {
		t.Errorf("child %d: %d errors: %s", i, len(res.Errors), strings.Join(res.Errors, "; "))
	}
	if p.err != nil {
		t.Errorf("child %d exited with %v; output:\n%s", i, p.err, p.out.String())
	}
	return res
}

// path names a file of the shared directory.
func (f *fleet) path(name string) string { return filepath.Join(f.dir, name) }

// exists reports whether a file of the shared directory exists.
func (f *fleet) exists(name string) bool {
	_, err := os.Stat(f.path(name))
	return err == nil
}

// await waits until cond holds, however long that takes. It fails the
// check if a child exits first.
func (f *fleet) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		for i, p := range f.procs {
			select {
			case <-p.done:
				if !cond() {
					t.Fatalf("child %d exited (%v) while the parent waited for %s; output:\n%s", i, p.err, what, p.out.String())
				}
				return
			default:
			}
		}
		if !sleepCtx(f.ctx, 2*time.Millisecond) {
			t.Fatalf("waiting for %s: %v", what, f.ctx.Err())
		}
	}
}

// release lets the children past the start barrier once all are ready.
func (f *fleet) release(t *testing.T) {
	t.Helper()
	f.await(t, "the children to start", func() bool {
		for _, c := range f.cfgs {
			if !f.exists(fmt.Sprintf(readyFile, c.ID)) {
				return false
			}
		}
		return true
	})
	fatalIf(t, "go", writeAtomic(f.path(goFile), nil))
}

// step waits until every child has reached step (childStep), runs between,
// and lets them go on.
func (f *fleet) step(t *testing.T, step string, between func()) {
	t.Helper()
	f.await(t, "every child to reach "+step, func() bool {
		for _, c := range f.cfgs {
			if !f.exists(fmt.Sprintf(stepReady, step, c.ID)) {
				return false
			}
		}
		return true
	})
	between()
	fatalIf(t, step, writeAtomic(f.path(fmt.Sprintf(stepGo, step)), nil))
}

// wait waits for every child to exit and returns their results; it fails
// the check if a child reported errors or failed.
func (f *fleet) wait(t *testing.T) []childResult {
	t.Helper()
	results := make([]childResult, len(f.procs))
	for i, p := range f.procs {
		select {
		case <-p.done:
		case <-f.ctx.Done():
			t.Fatalf("waiting for child %d: %v", i, f.ctx.Err())
		}
		results[i] = p.result(t, i, f.path(fmt.Sprintf(resultFile, f.cfgs[i].ID)))
	}
	return results
}

// kill kills child i (SIGKILL on Unix) and waits until it is gone.
func (f *fleet) kill(t *testing.T, i int) {
	t.Helper()
	p := f.procs[i]
	select {
	case <-p.done:
		t.Fatalf("child %d exited (%v) before it was killed; output:\n%s", i, p.err, p.out.String())
	default:
	}
	fatalIf(t, "kill", p.cmd.Process.Kill())
	<-p.done
}

// togetherFleet runs the fleet of a check in which calls concurrent calls
// of procs children of role (spread over them) start together, and each
// call's work takes pause. It returns the children's configurations, a
// store of their namespace, their results and the lines of the runs file.
func (s *suite) togetherFleet(t *testing.T, role string, procs, calls int, pause time.Duration) ([]childConfig, *warden.Store, []childResult, []string) {
	t.Helper()
	cfgs, st := s.fleetConfigs(t, role, procs)
	for i := range cfgs {
		cfgs[i].Goroutines, cfgs[i].Pause = spread(calls, procs, i), pause
	}
	f := startFleet(t, cfgs)
	f.release(t)
	f.step(t, "start", func() {})
	results := f.wait(t)
	runs, err := readLines(f.path(runsFile))
	fatalIf(t, "runs", err)
	return cfgs, st, results, runs
}

// tallyValues counts the values the children's calls returned, and
// returns their number and those of them that are not want.
func tallyValues(results []childResult, want string) (n int, wrong []string) {
	wrong = []string{}
	for _, r := range results {
		for _, v := range r.Values {
			n++
			if v != want {
				wrong = append(wrong, v)
			}
		}
	}
	return n, wrong
}

// spread splits total calls over n processes.
func spread(total, n, i int) int {
	k := total / n
	if i < total%n {
		k++
	}
	return k
}

// portableLockExclusion: Lockers in several processes, each with several
// goroutines, waiting with lock.Do and Acquire on one key, never overlap,
// and their fencing tokens increase.
func (s *suite) portableLockExclusion(t *testing.T) {
	const procs, goroutines, rounds = 3, 4, 6
	const sections = procs * goroutines * rounds
	cfgs, st := s.fleetConfigs(t, "portable-lock-exclusion", procs)
	// Every lease is released, so a long TTL costs nothing here; it keeps
	// a host that stalls a child for seconds (a loaded CI machine with a
	// slow test server) from ending a lease, rightly, inside its section.
	for i := range cfgs {
		cfgs[i].Goroutines, cfgs[i].Rounds, cfgs[i].TTL = goroutines, rounds, 30*time.Second
	}
	f := startFleet(t, cfgs)
	f.release(t)
	results := f.wait(t)
	done, overlaps := 0, 0
	for _, r := range results {
		done += r.Sections
		overlaps += r.Overlaps
	}
	if overlaps > 0 {
		t.Errorf("%d critical sections under lock.Do/Acquire overlapped across processes", overlaps)
	}
	if done != sections {
		t.Errorf("%d critical sections completed, want %d", done, sections)
	}
	lines, err := readLines(f.path(tokensFile))
	fatalIf(t, "tokens", err)
	if len(lines) != sections {
		t.Errorf("%d tokens recorded, want %d", len(lines), sections)
	}
	tokensIncrease(t, lines, "lease token %d of %s recorded after token %d: fencing tokens must strictly increase")
	if rec, found, err := st.Locks().Get(testCtx(t), cfgs[0].Key); err != nil || found {
		t.Errorf("after every lease was released the key is held: %+v found=%v err=%v", rec, found, err)
	}
}

// opCounter is a warden.Hook that counts one operation on one key.
type opCounter struct {
	op, key string
	n       atomic.Int64
}

// AfterOp counts the operation if it is the one counted.
func (c *opCounter) AfterOp(_ context.Context, op warden.OpInfo) {
	if op.Op == c.op && op.Key == c.key {
		c.n.Add(1)
	}
}

// portableLockHandoff: a holder in a child process releases while
// lock.Acquire waits in the parent; the parent gets the lock — woken by
// the release notification on stores that have them, by its back-off
// otherwise. Behaviour, not speed, is checked (the latencies are logged;
// bench/ measures them): on a store with notifications the waiter's
// back-off and the holder's TTL are far longer than the wait allowed, so
// only the notification can hand the lock over in time.
func (s *suite) portableLockHandoff(t *testing.T) {
	cfgs, st := s.fleetConfigs(t, "portable-lock-holder", 1)
	canWatch := st.Locks().CanWatch()
	rounds, retry, holderTTL := 8, time.Hour, 2*time.Hour
	if !canWatch {
		rounds, retry, holderTTL = 4, time.Second, 30*time.Second // each round takes about a second
	}
	cfgs[0].Rounds, cfgs[0].TTL = rounds, holderTTL
	key := cfgs[0].Key
	ctx := testCtx(t)
	// The parent's store counts its acquire attempts, to know when its
	// Acquire has found the key held and waits.
	hook := &opCounter{op: "lock.acquire", key: key}
	wst := warden.New(unclosed(st.Driver()), &warden.Options{Hook: hook, Logger: st.Logger()})
	locker, err := lock.New(wst, &lock.Options{TTL: holderTTL, RetryMin: retry, RetryMax: retry})
	fatalIf(t, "lock.New", err)
	defer locker.Close()

	f := startFleet(t, cfgs)
	f.release(t)
	type acquired struct {
		lease *lock.Lease
		at    time.Time
		err   error
	}
	var lat []time.Duration
	var waiters sync.WaitGroup
	t.Cleanup(waiters.Wait) // after the deferred Close, which ends a pending Acquire
	for r := range rounds {
		f.await(t, fmt.Sprintf("the child to hold the lock (round %d)", r), func() bool { return f.exists(fmt.Sprintf(heldFile, r)) })
		before := hook.n.Load()
		got := make(chan acquired, 1)
		waiters.Go(func() {
			lease, err := locker.Acquire(ctx, key)
			got <- acquired{lease, time.Now(), err}
		})
		f.await(t, "the parent's first attempt", func() bool { return hook.n.Load() > before })
		fatalIf(t, "release", writeAtomic(f.path(fmt.Sprintf(releaseFile, r)), nil))
		// With notifications the back-off is an hour: only the release's
		// notification can end this wait within the test's run.
		a := <-got
		fatalIf(t, fmt.Sprintf("round %d: Acquire", r), a.err)
		fatalIf(t, "taken", writeAtomic(f.path(fmt.Sprintf(takenFile, r)), nil))
		b, err := os.ReadFile(f.path(fmt.Sprintf(releasedFile, r)))
		if errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("round %d: the parent acquired the lock (token %d) before the holder in the child released it", r, a.lease.Token())
		}
		fatalIf(t, "release time", err)
		ns, err := strconv.ParseInt(string(b), 10, 64)
		fatalIf(t, "release time", err)
		lat = append(lat, a.at.Sub(time.Unix(0, ns)))
		fatalIf(t, fmt.Sprintf("round %d: Release", r), a.lease.Release(ctx))
	}
	f.wait(t)
	slices.Sort(lat)
	p50, worst := lat[len(lat)/2], lat[len(lat)-1]
	t.Logf("lock hand-off from a holder in another process to a waiting lock.Acquire on %s (notifications: %v): p50 %v, max %v over %d rounds",
		s.h.Name, canWatch, p50, worst, rounds)
}

// unclosed returns d with a Close that does nothing, and with d's lock
// notifications if it has them: the driver of a second warden.Store over
// the harness store's driver, which the harness's store closes.
func unclosed(d driver.Store) driver.Store {
	if n, ok := d.(driver.LockNotifier); ok {
		return &unclosedNotifier{unclosedStore{d}, n}
	}
	return &unclosedStore{d}
}

type unclosedStore struct{ driver.Store }

// Close does nothing.
func (u *unclosedStore) Close() error { return nil }

type unclosedNotifier struct {
	unclosedStore
	driver.LockNotifier
}

// portableIdempotency: concurrent idempotency.Do calls with one key from
// several processes run fn once and all return its result.
func (s *suite) portableIdempotency(t *testing.T) {
	const procs, calls = 3, 100
	cfgs, st, results, runs := s.togetherFleet(t, "portable-idempotency", procs, calls, 150*time.Millisecond)
	if len(runs) != 1 {
		t.Fatalf("fn ran %d times for %d concurrent calls with one key in %d processes (%s), want exactly once", len(runs), calls, procs, quoteSome(runs))
	}
	want := "result-of-" + runs[0]
	n, wrong := tallyValues(results, want)
	if n != calls {
		t.Errorf("%d calls returned a value, want %d", n, calls)
	}
	if len(wrong) > 0 {
		t.Errorf("%d calls returned another value than the one run's %q: %s", len(wrong), want, quoteSome(wrong))
	}
	rec, found, err := st.Idempotency().Get(testCtx(t), cfgs[0].Key)
	if err != nil || !found || rec.Status != driver.IdemCompleted {
		t.Errorf("the key's record after the calls: %+v found=%v err=%v, want completed", rec, found, err)
	}
}

// portableBreaker: failures of breaker.Do in several processes are all
// counted in one circuit, which opens exactly at its threshold; after the
// open period exactly one call in the whole fleet runs, as the probe.
func (s *suite) portableBreaker(t *testing.T) {
	const procs, k, callers = 4, 5, 2
	const threshold = procs * k
	const openFor = 300 * time.Millisecond
	cfgs, st := s.fleetConfigs(t, "portable-breaker", procs)
	for i := range cfgs {
		cfgs[i].Rounds, cfgs[i].Threshold, cfgs[i].OpenFor = k, threshold, openFor
		cfgs[i].Goroutines, cfgs[i].Total = callers, procs*callers
	}
	name := cfgs[0].Key
	ctx := testCtx(t)
	f := startFleet(t, cfgs)
	f.release(t)
	f.step(t, "counted", func() {
		rec, _, err := st.Circuits().Get(ctx, name)
		fatalIf(t, "Get", err)
		wantCircuit(t, fmt.Sprintf("threshold %d after %d failing calls in each of %d processes", threshold, k, procs), rec, name, driver.Open, threshold)
		rec, _, err = st.Circuits().Get(ctx, name+"-closed")
		fatalIf(t, "Get", err)
		wantCircuit(t, fmt.Sprintf("threshold %d after %d failing calls in each of %d processes", threshold+1, k, procs), rec, name+"-closed", driver.Closed, threshold)
	})
	f.step(t, "probe", func() {
		// Every child has seen the circuit open: let the open period pass.
		sleepCtx(ctx, openFor+100*time.Millisecond)
	})
	results := f.wait(t)
	runs, err := readLines(f.path(runsFile))
	fatalIf(t, "runs", err)
	if len(runs) != 1 {
		t.Errorf("after the open period %d of the %d concurrent calls in %d processes ran fn (%s), want exactly one probe", len(runs), procs*callers, procs, quoteSome(runs))
	}
	rejected := 0
	for _, r := range results {
		rejected += r.Rejected
	}
	if rejected != procs*callers-len(runs) {
		t.Errorf("%d calls were rejected with breaker.ErrOpen and %d ran, of %d", rejected, len(runs), procs*callers)
	}
	rec, _, err := st.Circuits().Get(ctx, name)
	fatalIf(t, "Get", err)
	wantCircuit(t, "after the successful probe", rec, name, driver.Closed, 0)
}

// portableCacheLoad: concurrent cache.GetOrLoad calls for one key from
// several processes call the loader once, and all get its value.
func (s *suite) portableCacheLoad(t *testing.T) {
	const procs, calls = 3, 50
	cfgs, st, results, runs := s.togetherFleet(t, "portable-cache", procs, calls, 200*time.Millisecond)
	if len(runs) != 1 {
		t.Fatalf("the loader ran %d times for %d concurrent GetOrLoad calls in %d processes (%s), want once", len(runs), calls, procs, quoteSome(runs))
	}
	want := "loaded-by-" + runs[0]
	n, wrong := tallyValues(results, want)
	if n != calls {
		t.Errorf("%d calls returned a value, want %d", n, calls)
	}
	if len(wrong) > 0 {
		t.Errorf("%d calls returned another value than the loaded %q: %s", len(wrong), want, quoteSome(wrong))
	}
	e, found, err := st.Cache().Get(testCtx(t), cfgs[0].Key)
	var stored string
	if err != nil || !found || json.Unmarshal(e.Value, &stored) != nil || stored != want {
		t.Errorf("the stored entry: %q found=%v err=%v, want the JSON of %q", e.Value, found, err, want)
	}
}

// portableCheckpointKill: a worker process killed in the middle of a task
// leaves its checkpoints and its lock; another worker waits for the lock
// to lapse, resumes from the last checkpoint, finishes, and the task's
// checkpoints are deleted.
func (s *suite) portableCheckpointKill(t *testing.T) {
	const steps, stopAt = 6, 3
	const ttl = time.Second
	ctx := testCtx(t)
	var (
		f    *fleet
		st   *warden.Store
		task string
		held driver.LockRecord
	)
	// A host that stalls the child for longer than its lease's TTL (a
	// loaded CI machine under -race) makes it lose its lease before it is
	// killed: its lock is gone when the parent looks. That is the lease
	// discipline at work, not the guarantee under test, so the check then
	// waits for that child to end and starts over, a bounded number of
	// times.
	for attempt := 1; ; attempt++ {
		var cfgs []childConfig
		cfgs, st = s.fleetConfigs(t, "portable-checkpoint", 1)
		cfgs[0].Rounds, cfgs[0].StopAt, cfgs[0].TTL = steps, stopAt, ttl
		task = cfgs[0].Key
		f = startFleet(t, cfgs)
		f.release(t)
		f.await(t, "the child's checkpoint", func() bool { return f.exists(savedFile) })
		b, err := os.ReadFile(f.path(savedFile))
		fatalIf(t, "saved", err)
		if string(b) != strconv.Itoa(stopAt) {
			t.Fatalf("the child saved up to %q, want %d", b, stopAt)
		}
		var found bool
		held, found, err = st.Locks().Get(ctx, checkpoint.LockKey(task))
		fatalIf(t, "Get", err)
		if found {
			break
		}
		if attempt == 3 {
			t.Fatalf("the running task's lock is not held, in each of %d attempts", attempt)
		}
		select {
		case <-f.procs[0].done:
			t.Logf("attempt %d: the child lost its lease before it was killed (a stalled host; it exited: %v); starting over", attempt, f.procs[0].err)
		case <-time.After(30 * ttl):
			// A child whose lease is gone ends within its TTL once it runs
			// again; one that still runs long after holds a task whose lock
			// the store does not show.
			t.Fatalf("the running task's lock is not held, and its child still runs %v later", 30*ttl)
		case <-ctx.Done():
			t.Fatalf("the running task's lock is not held, and its child still runs: %v", ctx.Err())
		}
	}
	state, last, err := checkpoint.Latest[int](ctx, st, task, nil)
	fatalIf(t, "checkpoint.Latest", err)
	if state != stopAt || last.Token != held.Token {
		t.Errorf("the child's latest checkpoint holds state %d with token %d, want %d with its lease's token %d", state, last.Token, stopAt, held.Token)
	}

	f.kill(t, 0)
	killed := time.Now()
	var (
		entered      time.Time
		from         int
		has, resumed bool
		token        int64
	)
	opts := &checkpoint.Options{Lock: true, LockOptions: &lock.Options{TTL: ttl}}
	err = checkpoint.Run(ctx, st, task, opts, func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
		entered = time.Now()
		from, has = cp.State()
		resumed, token = cp.Resumed(), cp.Token()
		for step := from + 1; step <= steps; step++ {
			if err := cp.Save(ctx, step, 100*float64(step)/steps); err != nil {
				return err
			}
		}
		return nil
	})
	fatalIf(t, "the run after the kill", err)
	if !has || from != stopAt || !resumed {
		t.Errorf("the run after the kill started from state %d (found=%v, resumed=%v), want %d", from, has, resumed, stopAt)
	}
	if token <= held.Token {
		t.Errorf("the run after the kill holds token %d, not above the killed worker's %d", token, held.Token)
	}
	cps, err := checkpoint.List(ctx, st, task)
	fatalIf(t, "checkpoint.List", err)
	if len(cps) != 0 {
		t.Errorf("%d checkpoints left after the task succeeded, want none", len(cps))
	}
	if rec, found, err := st.Locks().Get(ctx, checkpoint.LockKey(task)); err != nil || found {
		t.Errorf("the task's lock after the run: %+v found=%v err=%v, want released", rec, found, err)
	}
	t.Logf("the task resumed from step %d %v after its worker was killed (its lease of %v had to lapse)", stopAt, entered.Sub(killed), ttl)
}
