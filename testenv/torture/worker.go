package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/lock"
)

// workerConfig is what a worker process is told on its command line.
type workerConfig struct {
	URL        string
	Keys       []string
	Goroutines int
	TTLs       []time.Duration
	Fence      string // the fenced resource's base URL
	Log        string
	Slot       int
	Warm       time.Duration
}

// Worker flags (the orchestrator re-executes itself with -worker).
func (c *workerConfig) args() []string {
	ttls := make([]string, len(c.TTLs))
	for i, t := range c.TTLs {
		ttls[i] = t.String()
	}
	return []string{"-worker", "-url", c.URL, "-keys", strings.Join(c.Keys, ","),
		"-goroutines", strconv.Itoa(c.Goroutines), "-ttls", strings.Join(ttls, ","),
		"-fence", c.Fence, "-log", c.Log, "-slot", strconv.Itoa(c.Slot), "-warm", c.Warm.String()}
}

// parseWorker reads a worker's flags.
func parseWorker(args []string) (*workerConfig, error) {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	c := &workerConfig{}
	var keys, ttls string
	fs.Bool("worker", true, "run as a worker")
	fs.StringVar(&c.URL, "url", "", "store URL")
	fs.StringVar(&keys, "keys", "", "keys, comma-separated")
	fs.IntVar(&c.Goroutines, "goroutines", 4, "goroutines, each with a Locker of its own")
	fs.StringVar(&ttls, "ttls", "", "TTLs, comma-separated; goroutine g uses TTL g mod len")
	fs.StringVar(&c.Fence, "fence", "", "fenced resource URL")
	fs.StringVar(&c.Log, "log", "", "log file (JSON lines)")
	fs.IntVar(&c.Slot, "slot", 0, "worker slot")
	fs.DurationVar(&c.Warm, "warm", 5*time.Second, "warm-up before the first goroutine/fd sample")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	c.Keys = strings.Split(keys, ",")
	for _, s := range strings.Split(ttls, ",") {
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, fmt.Errorf("-ttls: %w", err)
		}
		c.TTLs = append(c.TTLs, d)
	}
	return c, nil
}

// worker is one worker process: Goroutines goroutines, each with a Locker
// of its own, taking random keys, writing to the fenced resource inside
// their leases, and logging what happened.
type worker struct {
	cfg   *workerConfig
	pid   int
	st    *warden.Store
	fence *http.Client

	logMu sync.Mutex
	log   *os.File
}

// runWorker runs a worker process until SIGTERM, then releases what it
// holds, closes everything and returns nil for exit status 0.
func runWorker(args []string) error {
	cfg, err := parseWorker(args)
	if err != nil {
		return err
	}
	// The log is written unbuffered, one write per line, so that a worker
	// killed with SIGKILL loses at most the line being written.
	f, err := os.OpenFile(cfg.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	w := &worker{cfg: cfg, pid: os.Getpid(), log: f,
		fence: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Goroutines}}}
	defer w.fence.CloseIdleConnections()
	w.emit(Event{Ev: "start", T: now()})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// The store is opened through the worker's proxy, which may be
	// faulted right now (a restarted worker): retry until it opens or the
	// worker is told to stop.
	var st *warden.Store
	for st == nil {
		octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
		st, err = warden.OpenWith(octx, cfg.URL, &warden.Options{Logger: slog.New(slog.DiscardHandler)})
		ocancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			w.emit(Event{Ev: "exit", T: now()})
			return nil
		}
		w.emit(Event{Ev: "openfail", T: now(), Err: err.Error()})
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	w.st = st

	lockers := make([]*lock.Locker, cfg.Goroutines)
	for g := range lockers {
		l, err := lock.New(st, &lock.Options{TTL: cfg.TTLs[g%len(cfg.TTLs)], RetryMax: 100 * time.Millisecond,
			Owner: fmt.Sprintf("torture-%d-%d", w.pid, g)})
		if err != nil {
			return err
		}
		lockers[g] = l
	}
	var wg sync.WaitGroup
	for g, l := range lockers {
		wg.Go(func() { w.loop(ctx, g, l) })
	}
	// The warm-up sample, taken once the worker has run a while; the end
	// sample is taken when SIGTERM arrives, before anything stops, so
	// that both see a running worker.
	warm := time.NewTimer(cfg.Warm)
	select {
	case <-warm.C:
		w.sample("warm")
		<-ctx.Done()
	case <-ctx.Done():
		warm.Stop()
	}
	w.sample("end")
	wg.Wait() // each goroutine releases its lease before it returns
	var errs []error
	for _, l := range lockers {
		errs = append(errs, l.Close())
	}
	errs = append(errs, st.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing: %w", err)
	}
	w.emit(Event{Ev: "exit", T: now()})
	return nil
}

// now is the wall clock in Unix ns.
func now() int64 { return time.Now().UnixNano() }

// emit appends an event to the worker's log.
func (w *worker) emit(e Event) {
	e.PID, e.Slot = w.pid, w.cfg.Slot
	b, err := json.Marshal(e)
	if err != nil {
		panic(err)
	}
	w.logMu.Lock()
	defer w.logMu.Unlock()
	if _, err := w.log.Write(append(b, '\n')); err != nil {
		fmt.Fprintln(os.Stderr, "torture worker: log:", err)
	}
}

// sample logs the worker's goroutines and open file descriptors.
func (w *worker) sample(phase string) {
	fds := -1
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		fds = len(ents)
	}
	w.emit(Event{Ev: "stats", T: now(), Phase: phase, Goroutines: runtime.NumGoroutine(), FDs: fds})
}

// loop takes random keys with Locker l until ctx ends.
func (w *worker) loop(ctx context.Context, g int, l *lock.Locker) {
	seq := 0
	for ctx.Err() == nil {
		key := w.cfg.Keys[rand.IntN(len(w.cfg.Keys))]
		w.emit(Event{Ev: "wait", T: now(), G: g, Key: key})
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		le, err := l.Acquire(actx, key)
		// The lease began when Acquire returned; the clock is read at once.
		// A process stopped in between logs a later begin, which only
		// shortens the lease as seen — and a begin after the lease's
		// deadline makes it empty (see lease.empty).
		begin := now()
		cancel()
		if err != nil {
			w.emit(Event{Ev: "acqfail", T: now(), G: g, Key: key, Err: err.Error()})
			continue
		}
		seq++
		id := fmt.Sprintf("%d-%d-%d", w.pid, g, seq)
		w.emit(Event{Ev: "begin", T: begin, G: g, Key: key, Lease: id, Token: le.Token(),
			Deadline: le.Deadline().UnixNano(), TTL: int64(l.TTL())})
		w.hold(ctx, g, id, l.TTL(), le)
	}
}

// hold works under a lease: it writes the lease's token to the fenced
// resource at once, then again after each stretch of "work", for a random
// 0.2–2 TTLs, then releases the lease. Each stretch starts only while the
// lease is live, but the write after it is sent without looking again:
// that is the check-then-act gap fencing exists for — a lease lost
// meanwhile (by the clock, or because the process was stopped) makes a
// stale write, which the resource must refuse once a newer holder wrote.
//
// The end of the lease is logged by a callback on the lease's context,
// run the moment the context is done (its timer fired at the deadline, a
// refresh was refused, or Release cancelled it), so that a worker killed
// afterwards has logged it. The instant logged is when the context ended,
// taken conservatively (never before it):
//   - released: the clock read just before Release, capped by the lease's
//     deadline. Release cancels the context before it tells the store, and
//     no one else can take the key before the store is told or the holding
//     lapses (after the deadline), so no other lease can begin between
//     that reading and the cancellation.
//   - lost: when the callback ran, capped by the lease's deadline (the
//     context is done at the deadline at the latest, even when its timer
//     fires late or the process was stopped).
//
// A lease of a killed worker that logged no end ended when the worker was
// killed (see collectLeases).
func (w *worker) hold(ctx context.Context, g int, id string, ttl time.Duration, le *lock.Lease) {
	var releaseAt atomic.Int64
	ended := make(chan struct{})
	context.AfterFunc(le.Context(), func() {
		defer close(ended)
		end := min(now(), le.Deadline().UnixNano())
		how := "lost"
		if errors.Is(context.Cause(le.Context()), lock.ErrReleased) {
			how = "released"
			end = min(end, releaseAt.Load())
		}
		w.emit(Event{Ev: "end", T: end, G: g, Key: le.Key(), Lease: id, Token: le.Token(), How: how,
			Obs: now(), Deadline: le.Deadline().UnixNano()})
	})
	until := time.Now().Add(time.Duration(float64(ttl) * (0.2 + 1.8*rand.Float64())))
	first := true
	for le.Err() == nil && ctx.Err() == nil && (first || time.Now().Before(until)) {
		if !first {
			// The work: up to a third of the TTL, not interrupted by the
			// lease ending (only by the worker stopping).
			t := time.NewTimer(time.Duration(rand.Int64N(int64(ttl / 3))))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		first = false
		w.write(g, id, le)
	}
	releaseAt.Store(now())
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	err := le.Release(rctx)
	cancel()
	<-ended // Release has cancelled the context, if nothing else did
	if err != nil && !errors.Is(err, lock.ErrNotHeld) {
		w.emit(Event{Ev: "relfail", T: now(), G: g, Key: le.Key(), Lease: id, Token: le.Token(), Err: err.Error()})
	}
}

// write sends one fenced write of the lease's token.
func (w *worker) write(g int, id string, le *lock.Lease) {
	sent := now()
	q := url.Values{"key": {le.Key()}, "token": {strconv.FormatInt(le.Token(), 10)}, "lease": {id}}
	resp, err := w.fence.Post(w.cfg.Fence+"/write?"+q.Encode(), "", nil)
	result := "error"
	errText := ""
	if err != nil {
		errText = err.Error()
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			result = "accepted"
		case http.StatusConflict:
			result = "refused"
		default:
			errText = resp.Status
		}
	}
	w.emit(Event{Ev: "write", T: sent, G: g, Key: le.Key(), Lease: id, Token: le.Token(), Result: result, Err: errText})
}
