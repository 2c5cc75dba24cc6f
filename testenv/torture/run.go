package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/internal/faultproxy"
)

// Network faults, injected on one worker's proxy at a time.
const (
	faultDelay        = "delay"
	faultBlackhole    = "blackhole"
	faultCut          = "cut"
	faultReset        = "reset"
	faultResetReplies = "reset-replies"
)

// target is how the torture reaches one store.
type target struct {
	// url returns the store URL in namespace prefix, reaching the server
	// through addr (a proxy's host:port; "" for the server itself).
	url func(prefix, addr string) string
	// upstream is the server's host:port; "" for stores without a network
	// (SQLite, memory): only process faults apply.
	upstream string
	procs    int             // worker processes
	faults   []string        // the fault kinds injected
	ttls     []time.Duration // lease TTLs, unless -ttls is given
}

// envVars name the variable giving each server's URL (testenv/up.sh).
var envVars = map[string]string{
	"postgres": "WARDEN_TEST_POSTGRES_URL",
	"mysql":    "WARDEN_TEST_MYSQL_URL",
	"redis":    "WARDEN_TEST_REDIS_URL",
	"mongodb":  "WARDEN_TEST_MONGODB_URL",
	"dynamodb": "WARDEN_TEST_DYNAMODB_ENDPOINT",
}

// mongoDatabase is the torture's own MongoDB database: never the test
// suite's.
const mongoDatabase = "warden_torture"

// newTarget describes store name, or says why it cannot run (skip, with
// err nil, when the server is not configured; err when the configuration
// is wrong).
func newTarget(name, dir string, o *options) (t *target, skip string, err error) {
	all := []string{faultDelay, faultBlackhole, faultCut, faultReset, faultResetReplies, faultKill, faultStop}
	switch name {
	case "memory":
		// A memory store lives in one process: one worker, no faults (a
		// killed worker would take the store with it).
		return &target{procs: 1, url: func(prefix, _ string) string {
			return "memory://torture?prefix=" + url.QueryEscape(prefix)
		}}, "", nil
	case "sqlite":
		path := filepath.Join(dir, "torture.db")
		return &target{procs: o.procs, faults: []string{faultKill, faultStop}, url: func(prefix, _ string) string {
			return "sqlite://" + path + "?prefix=" + url.QueryEscape(prefix)
		}}, "", nil
	}
	raw := os.Getenv(envVars[name])
	if raw == "" {
		return nil, envVars[name] + " is not set", nil
	}
	// dynalite and FerretDB answer in tens to hundreds of milliseconds on
	// a loaded machine (a lease is proven for TTL − ClockSkew and refreshed
	// every third of that): with 300 ms most leases would be lost to
	// latency alone, so these two get longer TTLs.
	var slow []time.Duration
	if name == "dynamodb" || name == "mongodb" {
		slow = []time.Duration{800 * time.Millisecond, 1200 * time.Millisecond, 1600 * time.Millisecond}
	}
	if name == "dynamodb" {
		ep, err := url.Parse(raw)
		if err != nil || ep.Scheme != "http" || ep.Host == "" {
			return nil, "", fmt.Errorf("%s must be an http://host:port endpoint", envVars[name])
		}
		return &target{procs: o.procs, faults: all, ttls: slow, upstream: hostPort(ep, "80"), url: func(prefix, addr string) string {
			q := url.Values{"endpoint": {"http://" + cmp.Or(addr, ep.Host)}, "region": {"us-east-1"}, "prefix": {prefix}}
			return "dynamodb://warden_torture?" + q.Encode()
		}}, "", nil
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, "", fmt.Errorf("%s is not a URL with a host", envVars[name])
	}
	ports := map[string]string{"postgres": "5432", "mysql": "3306", "redis": "6379", "mongodb": "27017"}
	return &target{procs: o.procs, faults: all, ttls: slow, upstream: hostPort(u, ports[name]), url: func(prefix, addr string) string {
		v := *u
		v.Host = cmp.Or(addr, u.Host)
		q := v.Query()
		q.Set("prefix", prefix)
		if name == "mongodb" {
			v.Path = "/" + mongoDatabase
			q.Del("database")
			q.Set("directConnection", "true")
		}
		v.RawQuery = q.Encode()
		return v.String()
	}}, "", nil
}

// hostPort returns u's host:port, with port def if it names none.
func hostPort(u *url.URL, def string) string {
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), def)
	}
	return u.Host
}

// proc is one worker process.
type proc struct {
	slot   int
	cmd    *exec.Cmd
	pid    int
	done   chan struct{} // closed when the process has been waited for
	stderr *tail
	log    string // its log file
	err    error  // Wait's result, set before done is closed

	// Set by the orchestrator before signalling.
	killed, stopping bool
}

// tail keeps the last bytes written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2048 {
		t.buf = t.buf[len(t.buf)-2048:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}

// storeRun is the orchestrator's side of one store's torture.
type storeRun struct {
	name    string
	o       *options
	t       *target
	dir     string
	prefix  string
	fence   *fence
	proxies []*faultproxy.Proxy // per slot; nil without network
	rng     *rand.Rand

	procs  []*proc // live worker per slot
	exits  []Exit
	faults []Fault
	logs   []string
	starts int
}

// runStore runs the torture for one store and returns its summary line
// and whether it failed. Details of a failure go to standard error.
func runStore(name, runID string, o *options) (line string, failed bool) {
	dir := filepath.Join(o.dir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Sprintf("torture store=%s result=FAIL: %v", name, err), true
	}
	t, skip, err := newTarget(name, dir, o)
	switch {
	case err != nil:
		return fmt.Sprintf("torture store=%s result=FAIL: %v", name, err), true
	case skip != "" && o.require:
		return fmt.Sprintf("torture store=%s result=FAIL: %s (WARDEN_TEST_REQUIRE=all)", name, skip), true
	case skip != "":
		return fmt.Sprintf("torture store=%s skipped: %s", name, skip), false
	}
	if t.ttls == nil || o.ttlsSet {
		t.ttls = o.ttls
	}
	r := &storeRun{name: name, o: o, t: t, dir: dir, prefix: "torture-" + runID + ":",
		rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))}
	rep, err := r.run()
	if err != nil {
		return fmt.Sprintf("torture store=%s result=FAIL: %v", name, err), true
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(os.Stderr, "torture store=%s: %s\n", name, p)
	}
	return rep.Line(), !rep.Pass()
}

// run prepares the store, runs the workers under faults for the duration,
// stops them and checks the outcome.
func (r *storeRun) run() (*Report, error) {
	// One direct open first: the server answers, and the schema (the
	// DynamoDB table, SQLite's file) exists before the workers race for it.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	st, err := warden.OpenWith(ctx, r.t.url(r.prefix, ""), &warden.Options{Logger: slog.New(slog.DiscardHandler)})
	if err == nil {
		err = errors.Join(st.Ping(ctx), st.Close())
	}
	cancel()
	if err != nil {
		return nil, fmt.Errorf("the server does not answer: %w", err)
	}
	if r.fence, err = newFence(); err != nil {
		return nil, err
	}
	defer r.fence.Close()
	r.procs = make([]*proc, r.t.procs)
	for slot := range r.procs {
		if r.t.upstream != "" {
			px, err := faultproxy.New(r.t.upstream)
			if err != nil {
				return nil, err
			}
			defer px.Close()
			r.proxies = append(r.proxies, px)
		}
		if err := r.start(slot); err != nil {
			r.stopAll()
			return nil, err
		}
	}
	end := r.inject(time.Now().Add(r.o.duration))
	r.stopAll()

	run := Run{Store: r.name, Duration: r.o.duration, End: end, Faults: r.faults,
		Writes: r.fence.Writes(), Exits: r.exits}
	for _, path := range r.logs {
		evs, err := readEvents(path)
		if err != nil {
			return nil, err
		}
		run.Events = append(run.Events, evs...)
	}
	slices.SortStableFunc(run.Events, func(a, b Event) int { return cmp.Compare(a.T, b.T) })
	rep := Check(run)
	if rep.Pass() && !r.o.keep {
		os.RemoveAll(r.dir)
	} else {
		fmt.Fprintf(os.Stderr, "torture store=%s: logs in %s\n", r.name, r.dir)
	}
	return rep, nil
}

// start starts the worker of slot.
func (r *storeRun) start(slot int) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r.starts++
	addr := ""
	if r.proxies != nil {
		addr = r.proxies[slot].Addr()
	}
	keys := make([]string, r.o.keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	cfg := &workerConfig{URL: r.t.url(r.prefix, addr), Keys: keys, Goroutines: r.o.goroutines, TTLs: r.t.ttls,
		Fence: r.fence.URL(), Log: filepath.Join(r.dir, fmt.Sprintf("worker-%d-%d.jsonl", slot, r.starts)),
		Slot: slot, Warm: 5 * time.Second}
	p := &proc{slot: slot, done: make(chan struct{}), stderr: &tail{}, log: cfg.Log}
	p.cmd = exec.Command(exe, cfg.args()...)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("starting a worker: %w", err)
	}
	p.pid = p.cmd.Process.Pid
	r.logs = append(r.logs, cfg.Log)
	r.procs[slot] = p
	// The waiter's owner is the storeRun: every process is waited for
	// (reap) before run returns.
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return nil
}

// reap records how a process ended; it must have ended.
func (r *storeRun) reap(p *proc, crashed bool) {
	<-p.done
	code := 0
	var xe *exec.ExitError
	if errors.As(p.err, &xe) {
		code = xe.ExitCode()
	} else if p.err != nil {
		code = -1
	}
	clean := false
	if evs, err := readEvents(p.log); err == nil && len(evs) > 0 {
		clean = evs[len(evs)-1].Ev == "exit"
	}
	r.exits = append(r.exits, Exit{Slot: p.slot, PID: p.pid, Killed: p.killed, Code: code,
		Clean: clean, Stderr: p.stderr.String(), Crashed: crashed})
}

// sleep waits d.
func sleep(d time.Duration) { time.Sleep(d) }

// between returns a random duration in [lo, hi).
func (r *storeRun) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.rng.Int64N(int64(hi-lo)))
}

// inject injects faults, one at a time, until deadline, and returns when
// it stopped (Unix ns). A worker that died by itself is recorded and
// restarted.
func (r *storeRun) inject(deadline time.Time) int64 {
	maxTTL := slices.Max(r.t.ttls)
	for time.Now().Before(deadline) {
		sleep(r.between(800*time.Millisecond, 2*time.Second))
		for slot, p := range r.procs {
			select {
			case <-p.done:
				r.reap(p, true)
				if err := r.start(slot); err != nil {
					fmt.Fprintf(os.Stderr, "torture store=%s: %v\n", r.name, err)
				}
			default:
			}
		}
		if len(r.t.faults) == 0 || !time.Now().Before(deadline) {
			continue
		}
		kind := r.t.faults[r.rng.IntN(len(r.t.faults))]
		slot := r.rng.IntN(len(r.procs))
		p := r.procs[slot]
		f := Fault{Kind: kind, Slot: slot, PID: p.pid, Start: now()}
		switch kind {
		case faultDelay, faultBlackhole, faultCut, faultResetReplies:
			px := r.proxies[slot]
			var hold time.Duration
			switch kind {
			case faultDelay:
				d := r.between(150*time.Millisecond, 500*time.Millisecond)
				px.Delay(d, d)
				hold = r.between(time.Second, 3*time.Second)
			case faultBlackhole:
				px.Blackhole()
				hold = r.between(time.Second, 3*time.Second)
			case faultCut:
				px.Cut()
				hold = r.between(500*time.Millisecond, 2*time.Second)
			case faultResetReplies:
				px.ResetReplies()
				hold = r.between(500*time.Millisecond, 1500*time.Millisecond)
			}
			sleep(hold)
			px.Pass()
			f.End = now()
		case faultReset:
			r.proxies[slot].Reset()
			f.End = f.Start
		case faultKill:
			p.killed = true
			f.Start = now()
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			f.End = f.Start
			r.reap(p, false)
			if err := r.start(slot); err != nil {
				fmt.Fprintf(os.Stderr, "torture store=%s: %v\n", r.name, err)
			}
		case faultStop:
			f.Start = now()
			_ = p.cmd.Process.Signal(syscall.SIGSTOP)
			sleep(maxTTL + r.between(200*time.Millisecond, 1500*time.Millisecond))
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			f.End = now()
		}
		r.faults = append(r.faults, f)
		if kind == faultKill || kind == faultStop {
			// Keep the network healthy while the hand-over is due, so that
			// the stuck-lock check sees only the process fault.
			sleep(maxTTL + defaultMargin)
		}
	}
	return now()
}

// stopAll stops every live worker: SIGTERM, then up to 30 s to release
// what it holds and exit (SIGKILL after that, an unclean exit).
func (r *storeRun) stopAll() {
	for _, px := range r.proxies {
		px.Pass()
	}
	for _, p := range r.procs {
		if p == nil {
			continue
		}
		p.stopping = true
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range r.procs {
		if p == nil {
			continue
		}
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
		}
		r.reap(p, false)
	}
}
