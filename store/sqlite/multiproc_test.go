package sqlite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// The multi-process tests re-run this test binary as child processes
// (TestHelperProcess) that share one database file with each other and
// with the parent.

const helperEnv = "WARDEN_SQLITE_HELPER"

// helperResult is what a child process reports, as JSON in a file.
type helperResult struct {
	Rounds      int      // critical sections (or iterations) completed
	Overlaps    int      // critical sections entered while another was inside
	TokenErrors int      // fencing tokens not above the last one seen
	Errors      []string // every error returned by the store
}

func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		t.Skip("helper process of the multi-process tests")
	}
	var err error
	switch mode {
	case "hammer":
		err = helperHammer()
	case "mixed":
		err = helperMixed()
	case "notify":
		err = helperNotify()
	case "watch":
		err = helperWatch()
	case "fair":
		err = helperFair()
	case "queue":
		err = helperQueue()
	default:
		err = fmt.Errorf("unknown helper mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func envInt(name string) int {
	n, _ := strconv.Atoi(os.Getenv(name))
	return n
}

// runHelpers starts n children in mode with the given environment and
// waits for them; each child's id is its index.
func runHelpers(t *testing.T, mode string, n int, env ...string) []helperResult {
	t.Helper()
	type child struct {
		cmd *exec.Cmd
		out bytes.Buffer
	}
	children := make([]*child, n)
	resultDir := t.TempDir()
	for i := range children {
		c := &child{cmd: exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")}
		c.cmd.Env = append(os.Environ(), append(env,
			helperEnv+"="+mode,
			"WARDEN_SQLITE_ID="+strconv.Itoa(i),
			"WARDEN_SQLITE_RESULT="+filepath.Join(resultDir, fmt.Sprint("result-", i, ".json")),
		)...)
		c.cmd.Stdout = &c.out
		c.cmd.Stderr = &c.out
		children[i] = c
	}
	for _, c := range children {
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
	}
	results := make([]helperResult, n)
	for i, c := range children {
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("child %d: %v\n%s", i, err, c.out.String())
			continue
		}
		data, err := os.ReadFile(filepath.Join(resultDir, fmt.Sprint("result-", i, ".json")))
		if err != nil {
			t.Errorf("child %d wrote no result: %v\n%s", i, err, c.out.String())
			continue
		}
		if err := json.Unmarshal(data, &results[i]); err != nil {
			t.Errorf("child %d result: %v", i, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return results
}

func writeResult(res helperResult) error {
	data, err := json.Marshal(res)
	if err != nil {
		return err
	}
	return os.WriteFile(os.Getenv("WARDEN_SQLITE_RESULT"), data, 0o644)
}

// helperHammer: several goroutines take turns on one lock with the other
// processes, checking mutual exclusion with a marker file and fencing
// tokens with a shared file.
func helperHammer() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := os.Getenv("WARDEN_SQLITE_DIR")
	id := os.Getenv("WARDEN_SQLITE_ID")
	goroutines, rounds := envInt("WARDEN_SQLITE_GOROUTINES"), envInt("WARDEN_SQLITE_ROUNDS")
	st, err := Open(ctx, filepath.Join(dir, "shared.db"), nil)
	if err != nil {
		return err
	}
	defer st.Close()
	marker := filepath.Join(dir, "inside")
	lastFile := filepath.Join(dir, "last-token")
	logFile := filepath.Join(dir, "tokens.log")

	var mu sync.Mutex
	var res helperResult
	fail := func(err error) {
		mu.Lock()
		res.Errors = append(res.Errors, err.Error())
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("p%s-g%d", id, g)
			l := st.Locks()
			for r := 0; r < rounds; r++ {
				var rec driver.LockRecord
				for {
					var ok bool
					var err error
					rec, ok, err = l.Acquire(ctx, "shared", owner, 30*time.Second)
					if err != nil {
						fail(fmt.Errorf("acquire: %w", err))
						return
					}
					if ok {
						break
					}
					// Retry back-off: the lock is held by someone else.
					time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
				}
				overlap, tokenErr, err := criticalSection(marker, lastFile, logFile, rec.Token)
				if err != nil {
					fail(err)
				}
				ok, err := l.Release(ctx, "shared", owner, rec.Token)
				if err != nil || !ok {
					fail(fmt.Errorf("release: ok=%v err=%v", ok, err))
					return
				}
				mu.Lock()
				res.Rounds++
				if overlap {
					res.Overlaps++
				}
				if tokenErr {
					res.TokenErrors++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return writeResult(res)
}

// criticalSection is run while holding the lock: it creates the marker
// file exclusively (failing if another holder is inside), checks the
// token against the last one written and records it.
func criticalSection(marker, lastFile, logFile string, token int64) (overlap, tokenErr bool, err error) {
	f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if errors.Is(err, fs.ErrExist) {
		overlap = true
	} else if err != nil {
		return false, false, err
	} else {
		f.Close()
		defer os.Remove(marker)
	}
	data, err := os.ReadFile(lastFile)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return overlap, false, err
	}
	if len(data) > 0 {
		last, err := strconv.ParseInt(string(data), 10, 64)
		if err != nil {
			return overlap, false, err
		}
		tokenErr = token <= last
	}
	if err := os.WriteFile(lastFile, []byte(strconv.FormatInt(token, 10)), 0o644); err != nil {
		return overlap, tokenErr, err
	}
	lf, err := os.OpenFile(logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return overlap, tokenErr, err
	}
	defer lf.Close()
	_, err = fmt.Fprintln(lf, token)
	return overlap, tokenErr, err
}

// TestMultiProcessLockExclusion: 3 processes × 4 goroutines share one lock
// in one new database file: never two holders at once, strictly increasing
// fencing tokens, no error (no "database is locked"), every round done.
func TestMultiProcessLockExclusion(t *testing.T) {
	const procs, goroutines, rounds = 3, 4, 15
	dir := t.TempDir()
	results := runHelpers(t, "hammer", procs,
		"WARDEN_SQLITE_DIR="+dir,
		"WARDEN_SQLITE_GOROUTINES="+strconv.Itoa(goroutines),
		"WARDEN_SQLITE_ROUNDS="+strconv.Itoa(rounds))
	total := 0
	for i, r := range results {
		if len(r.Errors) > 0 {
			t.Errorf("child %d errors: %q", i, r.Errors)
		}
		if r.Overlaps != 0 || r.TokenErrors != 0 {
			t.Errorf("child %d: %d overlaps, %d token errors", i, r.Overlaps, r.TokenErrors)
		}
		total += r.Rounds
	}
	if total != procs*goroutines*rounds {
		t.Errorf("%d rounds completed, want %d", total, procs*goroutines*rounds)
	}
	data, err := os.ReadFile(filepath.Join(dir, "tokens.log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(data))
	if len(lines) != procs*goroutines*rounds {
		t.Fatalf("%d tokens logged, want %d", len(lines), procs*goroutines*rounds)
	}
	var prev int64
	for i, s := range lines {
		tok, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && tok <= prev {
			t.Fatalf("token %d follows %d (line %d)", tok, prev, i+1)
		}
		prev = tok
	}
}

// helperMixed hammers every write path of the store at once.
func helperMixed() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := os.Getenv("WARDEN_SQLITE_DIR")
	id := os.Getenv("WARDEN_SQLITE_ID")
	goroutines, rounds := envInt("WARDEN_SQLITE_GOROUTINES"), envInt("WARDEN_SQLITE_ROUNDS")
	st, err := Open(ctx, filepath.Join(dir, "shared.db"), nil)
	if err != nil {
		return err
	}
	defer st.Close()
	var mu sync.Mutex
	var res helperResult
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			me := fmt.Sprintf("p%s-g%d", id, g)
			for i := 0; i < rounds; i++ {
				err := mixedRound(ctx, st, me, i)
				mu.Lock()
				if err != nil {
					res.Errors = append(res.Errors, err.Error())
				} else {
					res.Rounds++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return writeResult(res)
}

func mixedRound(ctx context.Context, st *warden.Store, me string, i int) error {
	key := fmt.Sprintf("%s-%d", me, i)
	if _, err := st.Circuits().RecordFailure(ctx, "shared", 1<<30); err != nil {
		return err
	}
	if _, _, err := st.Circuits().TryProbe(ctx, "shared", me, 0, time.Millisecond); err != nil {
		return err
	}
	if err := st.Cache().Set(ctx, key, []byte(key), time.Minute); err != nil {
		return err
	}
	if _, err := st.Cache().SetIfAbsent(ctx, "lease", []byte(me), 5*time.Millisecond); err != nil {
		return err
	}
	if _, out, err := st.Idempotency().Claim(ctx, key, me, time.Minute, ""); err != nil || out != driver.Claimed {
		return fmt.Errorf("claim: %v %v", out, err)
	}
	if _, _, err := st.Idempotency().Claim(ctx, "shared", me, time.Millisecond, ""); err != nil {
		return err
	}
	if ok, err := st.Idempotency().Complete(ctx, key, me, []byte("done"), 0); err != nil || !ok {
		return fmt.Errorf("complete: %v %v", ok, err)
	}
	if _, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "shared", Progress: 1, Data: []byte(key)}); err != nil || !ok {
		return fmt.Errorf("save: %v %v", ok, err)
	}
	rec, ok, err := st.Locks().Acquire(ctx, "mixed-"+me, me, time.Minute)
	if err != nil || !ok {
		return fmt.Errorf("acquire: %v %v", ok, err)
	}
	if _, _, err := st.Locks().Acquire(ctx, "contended", me, time.Millisecond); err != nil {
		return err
	}
	if ok, err := st.Locks().Release(ctx, "mixed-"+me, me, rec.Token); err != nil || !ok {
		return fmt.Errorf("release: %v %v", ok, err)
	}
	if i%5 == 0 {
		if _, err := st.Purge(ctx, time.Hour); err != nil {
			return err
		}
		if err := st.Migrate(ctx); err != nil {
			return err
		}
	}
	return nil
}

// TestMultiProcessWrites: every kind of write from 3 processes at once
// succeeds (no "database is locked"), and no update is lost.
func TestMultiProcessWrites(t *testing.T) {
	const procs, goroutines, rounds = 3, 3, 10
	dir := t.TempDir()
	results := runHelpers(t, "mixed", procs,
		"WARDEN_SQLITE_DIR="+dir,
		"WARDEN_SQLITE_GOROUTINES="+strconv.Itoa(goroutines),
		"WARDEN_SQLITE_ROUNDS="+strconv.Itoa(rounds))
	const total = procs * goroutines * rounds
	done := 0
	for i, r := range results {
		if len(r.Errors) > 0 {
			t.Errorf("child %d errors: %q", i, r.Errors)
		}
		done += r.Rounds
	}
	if done != total {
		t.Fatalf("%d rounds done, want %d", done, total)
	}
	ctx := context.Background()
	st := openAt(t, filepath.Join(dir, "shared.db"), nil)
	c, _, err := st.Circuits().Get(ctx, "shared")
	if err != nil || c.Failures != total {
		t.Errorf("circuit failures %d, want %d (%v)", c.Failures, total, err)
	}
	cps, err := st.Checkpoints().List(ctx, "shared")
	if err != nil || len(cps) != total {
		t.Fatalf("%d checkpoints, want %d (%v)", len(cps), total, err)
	}
	for i, cp := range cps {
		if cp.Sequence != int64(i+1) {
			t.Fatalf("checkpoint %d has sequence %d", i, cp.Sequence)
		}
	}
	keys, err := st.Cache().Keys(ctx, "p*")
	if err != nil || len(keys) != total {
		t.Errorf("%d cache keys, want %d (%v)", len(keys), total, err)
	}
	recs, err := st.Idempotency().List(ctx, "p*")
	if err != nil || len(recs) != total {
		t.Errorf("%d idempotency records, want %d (%v)", len(recs), total, err)
	}
	for _, r := range recs {
		if r.Status != driver.IdemCompleted || string(r.Result) != "done" {
			t.Fatalf("record %+v", r)
		}
	}
}

// helperNotify takes and releases a lock and opens a circuit, for the
// parent process to watch.
func helperNotify() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := Open(ctx, filepath.Join(os.Getenv("WARDEN_SQLITE_DIR"), "shared.db"), &Options{Prefix: "note:"})
	if err != nil {
		return err
	}
	defer st.Close()
	rec, ok, err := st.Locks().Acquire(ctx, "job", "child", time.Minute)
	if err != nil || !ok {
		return fmt.Errorf("acquire: %v %v", ok, err)
	}
	if _, err := st.Circuits().RecordFailure(ctx, "net", 1); err != nil {
		return err
	}
	if ok, err := st.Locks().Release(ctx, "job", "child", rec.Token); err != nil || !ok {
		return fmt.Errorf("release: %v %v", ok, err)
	}
	return writeResult(helperResult{Rounds: 1})
}

// TestMultiProcessNotify: lock and circuit changes made by another process
// reach this process's watchers.
func TestMultiProcessNotify(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	st := openAt(t, filepath.Join(dir, "shared.db"), &Options{Prefix: "note:"})
	locks, err := st.Locks().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	circs, err := st.Circuits().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	runHelpers(t, "notify", 1, "WARDEN_SQLITE_DIR="+dir)
	acq := nextLock(t, locks)
	if acq.Kind != driver.LockAcquired || acq.Key != "job" || acq.Owner != "child" || acq.Token == 0 {
		t.Fatalf("first event %+v", acq)
	}
	expectLock(t, locks, driver.LockReleased, "job", "child", acq.Token)
	c := nextCircuit(t, circs)
	if c.Name != "net" || c.State != driver.Open || c.Failures != 1 {
		t.Fatalf("circuit event %+v", c)
	}
}
