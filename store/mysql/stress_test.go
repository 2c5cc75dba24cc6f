package mysql_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/warden-go/warden/store/mysql"
)

// Environment of the stress test's child processes.
const (
	stressChildEnv = "WARDEN_MYSQL_STRESS_CHILD" // JSON stressConfig
	// StressDurationEnv sets how long the stress test runs (a Go
	// duration); the default is 5 s, the acceptance run uses 30s.
	stressDurationEnv = "WARDEN_MYSQL_STRESS_DURATION"
)

type stressConfig struct {
	URL        string
	Out        string
	ID         int
	Goroutines int
	Keys       []string
	Duration   time.Duration
}

// holding is one lock holding as a holder saw it: between Start and End
// (Unix nanoseconds, wall clock of the one machine) it was the holder.
type holding struct {
	Key        string
	Token      int64
	Start, End int64
	Proc       int
}

type stressResult struct {
	Holdings      []holding
	Attempts      int64
	DeadlockErrs  int64 // 1213, 1205 or duplicate key (1062) reaching the caller
	OtherErrs     int64
	FirstErr      string
	DriverRetries int64
}

// runStressChild is the body of a stress child process.
func runStressChild(js string) int {
	var cfg stressConfig
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx := context.Background()
	st, err := mysql.Open(ctx, cfg.URL, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer st.Close()
	var mu sync.Mutex
	var res stressResult
	deadline := time.Now().Add(cfg.Duration)
	var wg sync.WaitGroup
	for g := range cfg.Goroutines {
		wg.Go(func() {
			owner := fmt.Sprintf("p%d-g%d", cfg.ID, g)
			var local stressResult
			for time.Now().Before(deadline) {
				key := cfg.Keys[rand.N(len(cfg.Keys))]
				local.Attempts++
				rec, ok, err := st.Locks().Acquire(ctx, key, owner, 10*time.Second)
				if err != nil {
					var me *mysqldrv.MySQLError
					if errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205 || me.Number == 1062) {
						local.DeadlockErrs++
					} else {
						local.OtherErrs++
					}
					if local.FirstErr == "" {
						local.FirstErr = err.Error()
					}
					continue
				}
				if !ok {
					continue
				}
				h := holding{Key: key, Token: rec.Token, Start: time.Now().UnixNano(), Proc: cfg.ID}
				// Work a little while holding, so that an overlapping
				// holding would show as intersecting intervals.
				time.Sleep(time.Duration(rand.N(500)) * time.Microsecond)
				h.End = time.Now().UnixNano()
				if _, err := st.Locks().Release(ctx, key, owner, rec.Token); err != nil {
					local.OtherErrs++
					if local.FirstErr == "" {
						local.FirstErr = err.Error()
					}
				}
				local.Holdings = append(local.Holdings, h)
			}
			mu.Lock()
			res.Holdings = append(res.Holdings, local.Holdings...)
			res.Attempts += local.Attempts
			res.DeadlockErrs += local.DeadlockErrs
			res.OtherErrs += local.OtherErrs
			if res.FirstErr == "" {
				res.FirstErr = local.FirstErr
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	res.DriverRetries = mysql.Retries()
	b, _ := json.Marshal(res)
	if err := os.WriteFile(cfg.Out, b, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}

// TestStressLocks has 2 processes × 32 goroutines acquire and release 4
// keys for a bounded time (WARDEN_MYSQL_STRESS_DURATION, default 5 s) and
// checks that no call failed (in particular with a deadlock, lock wait
// timeout or duplicate key), that the driver never had to retry one, and
// that no two holdings of a key overlapped, with tokens increasing.
func TestStressLocks(t *testing.T) {
	if testing.Short() {
		t.Skip("stress test skipped in -short mode")
	}
	d := 5 * time.Second
	if s := os.Getenv(stressDurationEnv); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatalf("%s: %v", stressDurationEnv, err)
		}
	}
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	u := serverURL(t, "stress"+tag+":")
	keys := []string{"k0", "k1", "k2", "k3"}
	dir := t.TempDir()
	const procs = 2
	var cmds []*exec.Cmd
	for i := range procs {
		cfg := stressConfig{URL: u, Out: filepath.Join(dir, fmt.Sprintf("out%d.json", i)), ID: i, Goroutines: 32, Keys: keys, Duration: d}
		js, _ := json.Marshal(cfg)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), stressChildEnv+"="+string(js))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	var all []holding
	var attempts, deadlocks, others, retried int64
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("out%d.json", i)))
		if err != nil {
			t.Fatal(err)
		}
		var r stressResult
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		all = append(all, r.Holdings...)
		attempts += r.Attempts
		deadlocks += r.DeadlockErrs
		others += r.OtherErrs
		retried += r.DriverRetries
		if r.FirstErr != "" {
			t.Errorf("child %d: first error: %s", i, r.FirstErr)
		}
	}
	byKey := map[string][]holding{}
	for _, h := range all {
		byKey[h.Key] = append(byKey[h.Key], h)
	}
	overlaps, tokenErrs := 0, 0
	for k, hs := range byKey {
		sort.Slice(hs, func(i, j int) bool { return hs[i].Start < hs[j].Start })
		for i := 1; i < len(hs); i++ {
			if hs[i].Start <= hs[i-1].End {
				overlaps++
				if overlaps <= 5 {
					t.Errorf("key %s: holding %+v overlaps %+v", k, hs[i], hs[i-1])
				}
			}
			if hs[i].Token <= hs[i-1].Token {
				tokenErrs++
				if tokenErrs <= 5 {
					t.Errorf("key %s: token %d after %d", k, hs[i].Token, hs[i-1].Token)
				}
			}
		}
	}
	t.Logf("%v × %d processes × 32 goroutines on %d keys: %d attempts, %d acquisitions, %d deadlock/lock-wait/duplicate-key errors, %d other errors, %d driver retries, %d overlaps, %d token inversions",
		d, procs, len(keys), attempts, len(all), deadlocks, others, retried, overlaps, tokenErrs)
	if deadlocks != 0 || others != 0 || retried != 0 {
		t.Errorf("errors: %d deadlock/lock-wait/duplicate-key, %d other, %d retried in the driver; want none", deadlocks, others, retried)
	}
	if len(all) == 0 {
		t.Error("no lock was ever acquired")
	}
}
