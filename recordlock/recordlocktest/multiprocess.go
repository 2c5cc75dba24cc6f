package recordlocktest

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/recordlock"
)

// childEnv holds a child process's configuration as JSON.
const childEnv = "WARDEN_RECORDLOCKTEST_CHILD"

// children is how many processes the multi-process checks start.
const children = 2

type childConfig struct {
	Role       string // "exclusion", "expiry" or "claim"
	Table      string
	Dir        string // shared: barrier, marker, tokens, results
	ID         int
	Goroutines int
	Rounds     int
	Records    int
	Children   int // how many children run together
}

type childResult struct {
	Errors   []string
	Overlaps int
	Sections int
	Tokens   []int64  // exclusion: the token of each section
	Claimed  []string // claim: the ids claimed
	Grants   []grant  // expiry: every holding, in the order taken
}

// grant is one holding of the expiry check, in Unix nanoseconds on the
// host's wall clock, which every process of the check shares.
type grant struct {
	Token    int64
	Returned int64 // when Lock returned the holding
	End      int64 // its local deadline, or when its Release was sent if sooner
	Released bool
}

// Child runs this process as a child of the multi-process checks if the
// suite started it so, and exits; otherwise it returns at once. Call it
// first in the store's TestMain:
//
//	func TestMain(m *testing.M) {
//		recordlocktest.Child(harness)
//		drivertest.Main(m)
//	}
func Child[F any](h Harness[F]) {
	cfgJSON, ok := os.LookupEnv(childEnv)
	if !ok {
		return
	}
	var cfg childConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "recordlocktest child: bad %s: %v\n", childEnv, err)
		os.Exit(2)
	}
	res := &childResult{}
	var mu sync.Mutex
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(res.Errors) < 20 {
			res.Errors = append(res.Errors, fmt.Sprintf(format, args...))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.timeout())
	defer cancel()
	runChild(ctx, h, cfg, res, &mu, fail)
	b, _ := json.Marshal(res)
	path := filepath.Join(cfg.Dir, fmt.Sprintf("result-%d.json", cfg.ID))
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil || os.Rename(path+".tmp", path) != nil {
		fmt.Fprintf(os.Stderr, "recordlocktest child: writing the result: %v\n", err)
		os.Exit(2)
	}
	os.Exit(0)
}

func runChild[F any](ctx context.Context, h Harness[F], cfg childConfig, res *childResult, mu *sync.Mutex, fail func(string, ...any)) {
	var lockers []*recordlock.Locker[F]
	for range cfg.Goroutines {
		d, closeFn, err := h.Open(ctx, cfg.Table)
		if err != nil {
			fail("open: %v", err)
			return
		}
		defer closeFn()
		l, err := recordlock.New(d, &recordlock.Options{Owner: fmt.Sprintf("child%d", cfg.ID), NoAutoExtend: cfg.Role != "exclusion"})
		if err != nil {
			fail("new: %v", err)
			return
		}
		defer l.Close()
		lockers = append(lockers, l)
	}
	// Barrier: ready, then wait for go.
	_ = os.WriteFile(filepath.Join(cfg.Dir, fmt.Sprintf("ready-%d", cfg.ID)), nil, 0o600)
	for {
		if _, err := os.Stat(filepath.Join(cfg.Dir, "go")); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			fail("no go from the parent")
			return
		case <-time.After(2 * time.Millisecond):
		}
	}
	marker := filepath.Join(cfg.Dir, "marker")
	var wg sync.WaitGroup
	for _, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch cfg.Role {
			case "exclusion":
				for range cfg.Rounds {
					k, err := lockRetry(ctx, l, h.ID(1), 10*time.Second)
					if err != nil {
						fail("lock: %v", err)
						return
					}
					f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
					entered := err == nil
					if !entered {
						mu.Lock()
						res.Overlaps++
						mu.Unlock()
					} else {
						f.Close()
					}
					mu.Lock()
					res.Tokens = append(res.Tokens, k.Token())
					mu.Unlock()
					time.Sleep(time.Millisecond) // the critical section's work
					if k.Err() != nil {
						fail("lock ended inside the section: %v", context.Cause(k.Context()))
					}
					if entered {
						_ = os.Remove(marker)
					}
					mu.Lock()
					res.Sections++
					mu.Unlock()
					if err := k.Release(ctx); err != nil {
						fail("release: %v", err)
					}
				}
			case "expiry":
				for i := range cfg.Rounds {
					k, err := lockAfter(ctx, l, h.ID(1), recordlock.MinDuration)
					returned := time.Now()
					if err != nil {
						fail("lock: %v", err)
						return
					}
					g := grant{Token: k.Token(), Returned: returned.UnixNano(), End: k.Deadline().UnixNano()}
					if i%2 == 1 { // every other holding is released early
						if sent := time.Now(); sent.Before(k.Deadline()) {
							g.End, g.Released = sent.UnixNano(), true
							if err := k.Release(ctx); err != nil && !errors.Is(err, recordlock.ErrLeaseLost) {
								fail("release: %v", err)
							}
						}
					}
					mu.Lock()
					res.Grants = append(res.Grants, g)
					mu.Unlock()
				}
			case "claim":
				for range 2 * cfg.Records { // bounded: a claim that takes a held record shows
					k, err := l.Claim(ctx, h.ByStatus("todo"), h.timeout())
					if errors.Is(err, recordlock.ErrNothingToClaim) {
						return
					}
					if err != nil {
						fail("claim: %v", err)
						return
					}
					mu.Lock()
					res.Claimed = append(res.Claimed, fmt.Sprint(k.ID()))
					mu.Unlock()
				}
			default:
				fail("unknown role %q", cfg.Role)
			}
		}()
	}
	wg.Wait()
	// Claims stay held until every child has finished claiming: a child
	// that closed its Lockers (releasing its claims) while another still
	// claims would hand records out twice — by the suite's doing.
	_ = os.WriteFile(filepath.Join(cfg.Dir, fmt.Sprintf("done-%d", cfg.ID)), nil, 0o600)
	for i := 0; i < cfg.Children; {
		if _, err := os.Stat(filepath.Join(cfg.Dir, fmt.Sprintf("done-%d", i))); err == nil {
			i++
			continue
		}
		select {
		case <-ctx.Done():
			fail("child %d never finished", i)
			return
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// spawn runs one child per configuration, releases them together and
// returns their results.
func spawn[F any](t *testing.T, h Harness[F], cfgs []childConfig) []childResult {
	t.Helper()
	ctx := testCtx(t, h)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := cfgs[0].Dir
	type proc struct {
		cmd *exec.Cmd
		out strings.Builder
	}
	procs := make([]*proc, len(cfgs))
	for i, cfg := range cfgs {
		b, _ := json.Marshal(cfg)
		p := &proc{cmd: exec.CommandContext(ctx, exe, "-test.run=^$")}
		p.cmd.Env = append(os.Environ(), childEnv+"="+string(b))
		p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[i] = p
	}
	for {
		ready := 0
		for i := range cfgs {
			if _, err := os.Stat(filepath.Join(dir, "ready-"+strconv.Itoa(cfgs[i].ID))); err == nil {
				ready++
			}
		}
		if ready == len(cfgs) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("children never got ready")
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	results := make([]childResult, len(cfgs))
	for i, p := range procs {
		if err := p.cmd.Wait(); err != nil {
			t.Errorf("child %d: %v\n%s", i, err, p.out.String())
		}
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("result-%d.json", cfgs[i].ID)))
		if err != nil {
			t.Fatalf("child %d result: %v\n%s", i, err, p.out.String())
		}
		if err := json.Unmarshal(b, &results[i]); err != nil {
			t.Fatal(err)
		}
		for _, e := range results[i].Errors {
			t.Errorf("child %d: %s", i, e)
		}
	}
	return results
}

// runRole runs the children in role over a new table of records rows,
// each child with goroutines Lockers doing rounds rounds, and returns
// their results. It skips a store that cannot be shared across processes.
func runRole[F any](t *testing.T, h Harness[F], role string, records, goroutines, rounds int) []childResult {
	t.Helper()
	if h.SingleProcess {
		t.Skip("the store cannot be shared with another process")
	}
	name, _, _ := table(t, h, rows(records, "todo"), nil)
	dir := t.TempDir()
	var cfgs []childConfig
	for i := range children {
		cfgs = append(cfgs, childConfig{Role: role, Table: name, Dir: dir, ID: i, Goroutines: goroutines, Rounds: rounds, Records: records, Children: children})
	}
	return spawn(t, h, cfgs)
}

func mpExclusion[F any](t *testing.T, h Harness[F]) {
	const goroutines, rounds = 16, 4
	results := runRole(t, h, "exclusion", 1, goroutines, rounds)
	sections, overlaps := 0, 0
	var tokens []int64
	for _, r := range results {
		sections += r.Sections
		overlaps += r.Overlaps
		tokens = append(tokens, r.Tokens...)
	}
	if overlaps != 0 {
		t.Errorf("%d critical sections overlapped across processes: the record lock is not exclusive", overlaps)
	}
	if want := children * goroutines * rounds; sections != want {
		t.Errorf("%d sections, want %d", sections, want)
	}
	slices.Sort(tokens)
	for i := 1; i < len(tokens); i++ {
		if tokens[i] == tokens[i-1] {
			t.Errorf("token %d issued twice across processes", tokens[i])
		}
	}
}

// mpExpiry checks the deadline rule across processes at the shortest
// duration: holdings of one record that are left to lapse (NoAutoExtend,
// never released) or released early, taken by 2 processes × 3
// goroutines. Each holding's local deadline is its send time plus the
// duration less the margin, and the store's expiry is its clock at the
// grant plus the duration; so a process may be granted the record only
// after the previous holding's local deadline (or its Release). Compared
// on the host's wall clock, which the processes share: the next
// holding's Lock must return no sooner than the previous one ended.
func mpExpiry[F any](t *testing.T, h Harness[F]) {
	const goroutines, rounds = 3, 8
	results := runRole(t, h, "expiry", 1, goroutines, rounds)
	var grants []grant
	for _, r := range results {
		grants = append(grants, r.Grants...)
	}
	if want := children * goroutines * rounds; len(grants) != want {
		t.Errorf("%d holdings, want %d", len(grants), want)
	}
	slices.SortFunc(grants, func(a, b grant) int { return cmp.Compare(a.Token, b.Token) })
	for i := 1; i < len(grants); i++ {
		prev, g := grants[i-1], grants[i]
		if g.Token == prev.Token {
			t.Errorf("token %d issued twice across processes", g.Token)
			continue
		}
		if g.Returned < prev.End {
			how := "its deadline"
			if prev.Released {
				how = "its release was sent"
			}
			t.Errorf("token %d was granted %v before the holding of token %d ended (%s): two live holders",
				g.Token, time.Duration(prev.End-g.Returned), prev.Token, how)
		}
	}
}

// lockAfter locks id for d, waiting out each holding it meets until the
// expiry the store reported (a few ms more, spread), as a careful caller
// would rather than polling. A grant the store answered after its
// deadline (warden.ErrStoreTooSlow: a slow test server at the shortest
// duration) was given back; it tries again.
func lockAfter[F any](ctx context.Context, l *recordlock.Locker[F], id any, d time.Duration) (*recordlock.Lock, error) {
	for {
		k, err := l.Lock(ctx, id, d)
		var le *recordlock.LockedError
		wait := time.Duration(rand.IntN(3000)) * time.Microsecond
		switch {
		case errors.As(err, &le):
			wait += min(max(time.Until(le.Until), 0), d)
		case errors.Is(err, warden.ErrStoreTooSlow):
		default:
			return k, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

func mpClaim[F any](t *testing.T, h Harness[F]) {
	const n, goroutines = 1000, 4
	results := runRole(t, h, "claim", n, goroutines, 0)
	got := map[string]int{}
	for i, r := range results {
		if len(r.Claimed) == 0 {
			t.Errorf("child %d claimed nothing: the two processes did not share the work", i)
		}
		for _, id := range r.Claimed {
			got[id]++
		}
	}
	checkClaims(t, h, n, got)
}
