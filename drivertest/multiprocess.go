package drivertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// childEnv names the environment variable that tells Main it runs as a
// child process of the multi-process checks; it holds the child's
// configuration as JSON.
const childEnv = "WARDEN_DRIVERTEST_CHILD"

// Main is the TestMain of a store's test binary:
//
//	func TestMain(m *testing.M) { drivertest.Main(m) }
//
// When the suite re-executes the binary as a child process of the
// multi-process checks, Main runs the child's part and exits; otherwise it
// runs the tests and exits with their status.
func Main(m *testing.M) {
	if cfg, ok := os.LookupEnv(childEnv); ok {
		os.Exit(runChild(cfg))
	}
	os.Exit(m.Run())
}

// childConfig tells a child process what to do.
type childConfig struct {
	Role       string // "locks", "circuits", "idempotency" or a role of portableRoles
	URL        string // opens the store under test
	Dir        string // shared directory: barrier, marker, tokens, results
	ID         int
	Key        string
	Goroutines int
	Rounds     int
	Threshold  int
	// The portable checks' parameters (portable_multiprocess.go).
	TTL     time.Duration // lock TTL
	OpenFor time.Duration // breaker open period
	Pause   time.Duration // how long an operation or loader works
	StopAt  int           // checkpoint: the step after which the child blocks
	Total   int           // breaker: calls of the whole fleet in the probe round
	// Interval is the counting period of the circuit checks (FleetInterval).
	Interval time.Duration
}

// childResult is what a child reports back, in Dir/result-ID.json.
type childResult struct {
	ID       int
	Errors   []string
	Overlaps int      // locks: critical sections entered while another was inside
	Sections int      // locks: critical sections completed
	Counts   []int64  // circuits: failure counts returned
	States   []string // circuits: the state returned with each count
	Keys     []int    // idempotency: the key (round) of each claim
	Outcomes []string // idempotency: claim outcomes
	Owners   []string // idempotency: the claimant each answer named
	Values   []string // portable: the value each call returned
	Rejected int      // portable: calls a breaker rejected
}

const (
	childTimeout = 2 * time.Minute
	readyFile    = "ready-%d"
	goFile       = "go"
	markerFile   = "marker"
	tokensFile   = "tokens"
	resultFile   = "result-%d.json"
)

// runChild runs one child process and returns its exit code.
func runChild(cfgJSON string) int {
	var cfg childConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "drivertest child: bad %s: %v\n", childEnv, err)
		return 2
	}
	res := &childResult{ID: cfg.ID}
	var mu sync.Mutex
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		msg := fmt.Sprintf(format, args...)
		if len(res.Errors) < 20 {
			res.Errors = append(res.Errors, msg)
		}
		fmt.Fprintf(os.Stderr, "drivertest child %d: %s\n", cfg.ID, msg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	st, err := warden.Open(ctx, cfg.URL)
	if err != nil {
		fail("open: %v", err)
	} else {
		defer st.Close()
	}
	// Barrier: say ready, wait until the parent says go, so that the
	// children really run at the same time.
	if err := os.WriteFile(filepath.Join(cfg.Dir, fmt.Sprintf(readyFile, cfg.ID)), nil, 0o600); err != nil {
		fail("ready file: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(cfg.Dir, goFile)); err == nil {
			break
		}
		if !sleepCtx(ctx, 2*time.Millisecond) {
			fail("no go from the parent")
			break
		}
	}
	if st != nil && len(res.Errors) == 0 {
		switch cfg.Role {
		case "locks":
			childLocks(ctx, st, cfg, res, &mu, fail)
		case "circuits":
			childCircuits(ctx, st, cfg, res, &mu, fail)
		case "idempotency":
			childIdempotency(ctx, st, cfg, res, &mu, fail)
		default:
			if role := portableRoles[cfg.Role]; role != nil {
				role(ctx, st, cfg, res, &mu, fail)
			} else {
				fail("unknown role %q", cfg.Role)
			}
		}
	}
	b, err := json.Marshal(res)
	if err == nil {
		tmp := filepath.Join(cfg.Dir, fmt.Sprintf(resultFile+".tmp", cfg.ID))
		if err = os.WriteFile(tmp, b, 0o600); err == nil {
			err = os.Rename(tmp, filepath.Join(cfg.Dir, fmt.Sprintf(resultFile, cfg.ID)))
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "drivertest child %d: writing the result: %v\n", cfg.ID, err)
		return 2
	}
	if len(res.Errors) > 0 || res.Overlaps > 0 {
		return 1
	}
	return 0
}

// childLocks runs critical sections on one key from several goroutines.
// Inside each, it creates a marker file exclusively (failure: another
// holder is inside) and checks that its fencing token is above the last
// one recorded in the shared tokens file, then records it.
func childLocks(ctx context.Context, st *warden.Store, cfg childConfig, res *childResult, mu *sync.Mutex, fail func(string, ...any)) {
	l := st.Locks()
	marker := filepath.Join(cfg.Dir, markerFile)
	tokens := filepath.Join(cfg.Dir, tokensFile)
	var wg sync.WaitGroup
	for g := range cfg.Goroutines {
		wg.Go(func() {
			owner := fmt.Sprintf("child-%d-g%d", cfg.ID, g)
			for range cfg.Rounds {
				rec, err := acquireWait(ctx, l, cfg.Key, owner, 30*time.Second)
				if err != nil {
					fail("%s: Acquire: %v", owner, err)
					return
				}
				created := enterMarker(marker, owner, rec.Token, "process", res, mu, fail)
				recordToken(tokens, owner, rec.Token, fail)
				time.Sleep(300 * time.Microsecond)
				leaveMarker(marker, created, fail)
				ok, err := l.Release(ctx, cfg.Key, owner, rec.Token)
				if err != nil || !ok {
					fail("%s: Release of its holding (token %d): ok=%v err=%v", owner, rec.Token, ok, err)
				}
				mu.Lock()
				res.Sections++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// childCircuits records failures from several goroutines.
func childCircuits(ctx context.Context, st *warden.Store, cfg childConfig, res *childResult, mu *sync.Mutex, fail func(string, ...any)) {
	c := st.Circuits()
	var wg sync.WaitGroup
	for range cfg.Goroutines {
		wg.Go(func() {
			for range cfg.Rounds {
				rec, err := c.RecordFailure(ctx, cfg.Key, cfg.Threshold)
				if err != nil {
					fail("RecordFailure: %v", err)
					return
				}
				mu.Lock()
				res.Counts = append(res.Counts, rec.Failures)
				res.States = append(res.States, string(rec.State))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// childIdempotency claims Rounds keys, one after the other, from several
// goroutines.
func childIdempotency(ctx context.Context, st *warden.Store, cfg childConfig, res *childResult, mu *sync.Mutex, fail func(string, ...any)) {
	id := st.Idempotency()
	var wg sync.WaitGroup
	for g := range cfg.Goroutines {
		wg.Go(func() {
			owner := fmt.Sprintf("child-%d-g%d", cfg.ID, g)
			for r := range cfg.Rounds {
				rec, out, err := id.Claim(ctx, fmt.Sprintf("%s-%d", cfg.Key, r), owner, time.Minute, "fp")
				if err != nil {
					fail("Claim: %v", err)
					return
				}
				mu.Lock()
				res.Keys = append(res.Keys, r)
				res.Outcomes = append(res.Outcomes, out.String())
				res.Owners = append(res.Owners, rec.Owner)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// enterMarker creates the marker file exclusively as who enters a critical
// section with token, and reports whether it did. If the file exists, a
// holder (other names it: "process", "holder") is inside too: it counts an
// overlap and reports the failure.
func enterMarker(marker, who string, token int64, other string, res *childResult, mu *sync.Mutex, fail func(string, ...any)) bool {
	f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	created := err == nil
	switch {
	case created:
		f.Close()
	case errors.Is(err, fs.ErrExist):
		mu.Lock()
		res.Overlaps++
		mu.Unlock()
		fail("%s entered the critical section (token %d) while another %s was inside", who, token, other)
	default:
		fail("marker: %v", err)
	}
	return created
}

// leaveMarker removes the marker file on leaving a critical section, if
// enterMarker created it.
func leaveMarker(marker string, created bool, fail func(string, ...any)) {
	if created {
		if err := os.Remove(marker); err != nil {
			fail("marker: %v", err)
		}
	}
}

// recordToken checks that the fencing token of who is above the last one
// recorded in the tokens file, and records it.
func recordToken(tokens, who string, token int64, fail func(string, ...any)) {
	last, err := lastToken(tokens)
	if err != nil {
		fail("reading tokens: %v", err)
	} else if token <= last {
		fail("%s got token %d, not above the last recorded token %d", who, token, last)
	}
	if err := appendLine(tokens, fmt.Sprintf("%d %s", token, who)); err != nil {
		fail("recording the token: %v", err)
	}
}

// lastToken returns the last token recorded in the tokens file (0 if none).
func lastToken(path string) (int64, error) {
	lines, err := readLines(path)
	if err != nil || len(lines) == 0 {
		return 0, err
	}
	tok, _, _ := strings.Cut(lines[len(lines)-1], " ")
	return strconv.ParseInt(tok, 10, 64)
}

// appendLine appends one line to a file.
func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(line + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// ---------------------------------------------------------------------------
// the parent side

const children = 3

func (s *suite) multiProcess(t *testing.T) {
	group(t, []check{
		{"Locks", s.mpLocks},
		{"Circuits", s.mpCircuits},
		{"Idempotency", s.mpIdempotency},
	})
}

// spawn runs one child per configuration, releases them together and
// returns their results; it fails the check if a child fails.
func (s *suite) spawn(t *testing.T, cfgs []childConfig) []childResult {
	t.Helper()
	ctx := testCtx(t)
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	dir := cfgs[0].Dir
	var procs []*childProc
	t.Cleanup(func() {
		for _, p := range procs {
			<-p.done
		}
	})
	for i, cfg := range cfgs {
		procs = append(procs, startChild(ctx, t, exe, i, cfg))
	}
	// Wait until every child is ready (or one has exited early), then
	// release them all.
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		ready, exited := 0, false
		for i, p := range procs {
			if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf(readyFile, cfgs[i].ID))); err == nil {
				ready++
			}
			select {
			case <-p.done:
				exited = true
			default:
			}
		}
		if ready == len(procs) || exited {
			break
		}
		sleepCtx(ctx, 5*time.Millisecond)
	}
	if err := os.WriteFile(filepath.Join(dir, goFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	results := make([]childResult, len(procs))
	for i, p := range procs {
		<-p.done
		results[i] = p.result(t, i, filepath.Join(dir, fmt.Sprintf(resultFile, cfgs[i].ID)))
	}
	return results
}

// mpConfigs makes one configuration per child.
func (s *suite) mpConfigs(t *testing.T, role string, goroutines, rounds, threshold int) ([]childConfig, *warden.Store) {
	cfgs, st := s.fleetConfigs(t, role, children)
	for i := range cfgs {
		cfgs[i].Goroutines, cfgs[i].Rounds, cfgs[i].Threshold = goroutines, rounds, threshold
	}
	return cfgs, st
}

// mpLocks: processes competing for one lock never overlap, and fencing
// tokens increase across them.
func (s *suite) mpLocks(t *testing.T) {
	const goroutines, rounds = 3, 15
	cfgs, _ := s.mpConfigs(t, "locks", goroutines, rounds, 0)
	results := s.spawn(t, cfgs)
	sections, overlaps := 0, 0
	for _, r := range results {
		sections += r.Sections
		overlaps += r.Overlaps
	}
	if overlaps > 0 {
		t.Errorf("%d critical sections overlapped across processes: the lock is not exclusive", overlaps)
	}
	if want := children * goroutines * rounds; sections != want {
		t.Errorf("%d critical sections completed, want %d", sections, want)
	}
	b, err := os.ReadFile(filepath.Join(cfgs[0].Dir, tokensFile))
	fatalIf(t, "tokens", err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != children*goroutines*rounds {
		t.Errorf("%d tokens recorded, want %d", len(lines), children*goroutines*rounds)
	}
	tokensIncrease(t, lines, "token %d of %s recorded after token %d: fencing tokens must strictly increase across processes")
}

// tokensIncrease checks that the tokens of lines, recorded by recordToken,
// strictly increase. failf formats a failure from a token, its holder and
// the token recorded before it.
func tokensIncrease(t *testing.T, lines []string, failf string) {
	t.Helper()
	var prev int64
	for i, line := range lines {
		tok, who, _ := strings.Cut(line, " ")
		n, err := strconv.ParseInt(tok, 10, 64)
		if err != nil {
			t.Fatalf("tokens file line %d: %q", i+1, line)
		}
		if n <= prev {
			t.Errorf(failf, n, who, prev)
		}
		prev = n
	}
}

// mpCircuits: failures recorded from several processes are all counted.
func (s *suite) mpCircuits(t *testing.T) {
	const goroutines, rounds = 4, 10
	const total = children * goroutines * rounds
	cfgs, st := s.mpConfigs(t, "circuits", goroutines, rounds, total)
	results := s.spawn(t, cfgs)
	times := map[int64]int{}
	for _, r := range results {
		for i, n := range r.Counts {
			times[n]++
			want := driver.Closed
			if n >= total {
				want = driver.Open
			}
			if driver.CircuitState(r.States[i]) != want {
				t.Errorf("failure count %d (threshold %d) came with state %s, want %s", n, total, r.States[i], want)
			}
		}
	}
	var bad []string
	for n := int64(1); n <= total; n++ {
		if times[n] != 1 {
			bad = append(bad, fmt.Sprintf("count %d returned %d times", n, times[n]))
		}
	}
	if len(bad) > 0 {
		t.Errorf("failures recorded from %d processes did not return each count 1..%d once (increments lost): %s", children, total, quoteSome(bad))
	}
	rec, found, err := st.Circuits().Get(testCtx(t), cfgs[0].Key)
	fatalIf(t, "Get", err)
	if !found {
		t.Fatal("the circuit is absent after the children recorded failures")
	}
	wantCircuit(t, "after the children's failures", rec, cfgs[0].Key, driver.Open, total)
}

// mpIdempotency: among claimers in several processes exactly one claims
// each key.
func (s *suite) mpIdempotency(t *testing.T) {
	const goroutines, keys = 4, 10
	cfgs, st := s.mpConfigs(t, "idempotency", goroutines, keys, 0)
	results := s.spawn(t, cfgs)
	winners := make([][]string, keys)
	owners := make([][]string, keys)
	answers := 0
	for _, r := range results {
		for i, out := range r.Outcomes {
			answers++
			k := r.Keys[i]
			switch out {
			case driver.Claimed.String(), driver.TakenOver.String():
				winners[k] = append(winners[k], r.Owners[i])
			case driver.InProgress.String():
				owners[k] = append(owners[k], r.Owners[i])
			default:
				t.Errorf("first claims answered %s", out)
			}
		}
	}
	if answers != children*goroutines*keys {
		t.Errorf("%d claims answered, want %d", answers, children*goroutines*keys)
	}
	ctx := testCtx(t)
	for k := range keys {
		key := fmt.Sprintf("%s-%d", cfgs[0].Key, k)
		if len(winners[k]) != 1 {
			t.Errorf("%s: %d claimants across %d processes (%s), want exactly 1", key, len(winners[k]), children, quoteSome(winners[k]))
			continue
		}
		for _, o := range owners[k] {
			if o != winners[k][0] {
				t.Errorf("%s: an in-progress answer names %q, but %q claimed it", key, o, winners[k][0])
			}
		}
		rec, found, err := st.Idempotency().Get(ctx, key)
		if err != nil || !found || rec.Owner != winners[k][0] || rec.Status != driver.IdemPending {
			t.Errorf("%s: Get after the claims = %+v found=%v err=%v, want pending by %s", key, rec, found, err, winners[k][0])
		}
	}
}
