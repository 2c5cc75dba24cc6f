package drivertest_test

// The suite must be able to fail. Each double below wraps the memory
// driver and breaks ONE guarantee the way real stores have broken it; the
// suite runs against it in a subprocess, which must fail, naming the check
// that guards the guarantee. A "control" double that breaks nothing must
// pass the whole suite with nothing skipped.

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/drivertest"
	"github.com/warden-go/warden/internal/rpcstore"
	"github.com/warden-go/warden/store/memory"
)

// doubleEnv names the double a TestBrokenDouble subprocess runs against.
const doubleEnv = "WARDEN_DRIVERTEST_DOUBLE"

// double is a store broken in one way.
type double struct {
	name string
	// run selects the suite's checks below TestBrokenDouble/<name>/.
	run string
	// fails are the checks (below TestBrokenDouble/<name>/) that must fail.
	fails []string
	// wrap breaks the memory driver of one namespace.
	wrap func(b *broken)
}

// broken is a driver store whose capabilities a double may replace.
type broken struct {
	driver.Store
	prefix   string
	locks    driver.Locks
	circuits driver.Circuits
	cache    driver.Cache
	idem     driver.Idempotency
	cps      driver.Checkpoints
}

func (b *broken) Locks() driver.Locks             { return b.locks }
func (b *broken) Circuits() driver.Circuits       { return b.circuits }
func (b *broken) Cache() driver.Cache             { return b.cache }
func (b *broken) Idempotency() driver.Idempotency { return b.idem }
func (b *broken) Checkpoints() driver.Checkpoints { return b.cps }

func (b *broken) WatchLocks(ctx context.Context) (<-chan driver.LockEvent, error) {
	return b.Store.(driver.LockNotifier).WatchLocks(ctx)
}

func (b *broken) WatchCircuits(ctx context.Context) (<-chan driver.CircuitRecord, error) {
	return b.Store.(driver.CircuitNotifier).WatchCircuits(ctx)
}

// newBroken wraps a memory driver of namespace prefix with double d.
func newBroken(d double, db, prefix string) driver.Store {
	inner := memory.NewDriver(&memory.Options{Name: db, Prefix: prefix})
	b := &broken{
		Store:    inner,
		prefix:   prefix,
		locks:    inner.Locks(),
		circuits: inner.Circuits(),
		cache:    inner.Cache(),
		idem:     inner.Idempotency(),
		cps:      inner.Checkpoints(),
	}
	if d.wrap != nil {
		d.wrap(b)
	}
	return b
}

// shared is state a double keeps across the stores of the process,
// guarded by one mutex (the doubles break atomicity at the database level,
// never Go's memory model).
var shared = struct {
	sync.Mutex
	m      map[string]any
	caches []driver.Cache
}{m: map[string]any{}}

// pause stands for the round trip between the two halves of a
// non-atomic operation.
func pause() { time.Sleep(time.Millisecond) }

var doubles = []double{
	{
		name: "control",
		run:  "",
	},
	{
		// Acquire lets a second owner in now and then.
		name:  "lock-second-owner",
		run:   "^(Locks|MultiProcess)$/^(Exclusion|Locks)$",
		fails: []string{"Locks/Exclusion", "MultiProcess/Locks"},
		wrap:  func(b *broken) { b.locks = &secondOwner{Locks: b.locks} },
	},
	{
		// No new fencing token when an expired holding is taken over.
		name:  "lock-token-stuck",
		run:   "^Locks$",
		fails: []string{"Locks/FencingTokens", "Locks/Expiry"},
		wrap:  func(b *broken) { b.locks = &stuckTokens{Locks: b.locks, prefix: b.prefix} },
	},
	{
		// TTLs rounded up to whole seconds (MySQL DATETIME(0), Redis SETEX).
		name:  "lock-ttl-seconds",
		run:   "^Locks$/^(TTLPrecision|Expiry)$",
		fails: []string{"Locks/TTLPrecision", "Locks/Expiry"},
		wrap:  func(b *broken) { b.locks = secondsTTL{Locks: b.locks} },
	},
	{
		// An expired lock blocks acquisition until a TTL monitor would
		// delete it (acquire by insert only).
		name:  "lock-expired-blocks",
		run:   "^Locks$/^Expiry$",
		fails: []string{"Locks/Expiry"},
		wrap:  func(b *broken) { b.locks = &expiredBlocks{Locks: b.locks, prefix: b.prefix} },
	},
	{
		// Concurrent first acquires of a new key fail with a unique
		// violation instead of "not acquired".
		name:  "lock-first-acquire-error",
		run:   "^Locks$/^FirstAcquire$",
		fails: []string{"Locks/FirstAcquire"},
		wrap:  func(b *broken) { b.locks = &firstAcquireError{Locks: b.locks, prefix: b.prefix} },
	},
	{
		// Release as GET-then-DEL: anyone releases the current holding.
		name:  "lock-release-any",
		run:   "^Locks$/^NotOwner$",
		fails: []string{"Locks/NotOwner"},
		wrap:  func(b *broken) { b.locks = releaseAny{Locks: b.locks} },
	},
	{
		// RecordFailure as read-modify-write: increments are lost.
		name:  "circuit-lost-increments",
		run:   "^(Circuits|MultiProcess)$/^(ConcurrentFailures|Circuits)$",
		fails: []string{"Circuits/ConcurrentFailures", "MultiProcess/Circuits"},
		wrap:  func(b *broken) { b.circuits = lostIncrements{Circuits: b.circuits} },
	},
	{
		// Outcomes applied whatever their generation.
		name:  "circuit-any-generation",
		run:   "^Circuits$/^Generations",
		fails: []string{"Circuits/Generations", "Circuits/GenerationsConcurrent"},
		wrap:  func(b *broken) { b.circuits = anyGeneration{Circuits: b.circuits} },
	},
	{
		// Probe outcomes applied whatever their slot: a probe whose slot
		// lapsed and was granted again still decides the circuit.
		name:  "circuit-any-probe-epoch",
		run:   "^Circuits$/^ProbeSlots$",
		fails: []string{"Circuits/ProbeSlots"},
		wrap:  func(b *broken) { b.circuits = anyProbeEpoch{Circuits: b.circuits} },
	},
	{
		// The counting period renewed on a read made before the write:
		// two writers that both read "over" both reset the counts.
		name:  "circuit-interval-read-then-reset",
		run:   "^Circuits$/^FleetInterval$",
		fails: []string{"Circuits/FleetInterval"},
		wrap:  func(b *broken) { b.circuits = intervalReadThenReset{Circuits: b.circuits} },
	},
	{
		// SetIfAbsent as Has-then-Set.
		name:  "cache-setifabsent-racy",
		run:   "^Cache$/^SetIfAbsent$",
		fails: []string{"Cache/SetIfAbsent"},
		wrap:  func(b *broken) { b.cache = racySetIfAbsent{Cache: b.cache} },
	},
	{
		// Keys ignores the namespace.
		name:  "cache-keys-all-namespaces",
		run:   "^(Cache|Namespaces)$/^(Clear|Cache)$",
		fails: []string{"Cache/Clear", "Namespaces/Cache"},
		wrap: func(b *broken) {
			shared.Lock()
			shared.caches = append(shared.caches, b.cache)
			shared.Unlock()
			b.cache = keysEverywhere{Cache: b.cache}
		},
	},
	{
		// Keys reads only the first page.
		name:  "cache-keys-first-page",
		run:   "^Cache$/^KeysPaging$",
		fails: []string{"Cache/KeysPaging"},
		wrap:  func(b *broken) { b.cache = firstPage{Cache: b.cache} },
	},
	{
		// Cache TTLs rounded up to whole seconds.
		name:  "cache-ttl-seconds",
		run:   "^Cache$/^TTLPrecision$",
		fails: []string{"Cache/TTLPrecision"},
		wrap:  func(b *broken) { b.cache = cacheSeconds{Cache: b.cache} },
	},
	{
		// Listings pass the glob on as a regular expression.
		name:  "list-pattern-regex",
		run:   "^(HostileKeys|Locks)$/^(Patterns|GetList)$",
		fails: []string{"HostileKeys/Patterns", "Locks/GetList"},
		wrap: func(b *broken) {
			b.locks = regexLocks{Locks: b.locks}
			b.cache = regexCache{Cache: b.cache}
		},
	},
	{
		// Checkpoint sequences computed as latest+1 outside the write.
		name:  "checkpoint-racy-sequence",
		run:   "^Checkpoints$/^ConcurrentSave$",
		fails: []string{"Checkpoints/ConcurrentSave"},
		wrap:  func(b *broken) { b.cps = racySequence{Checkpoints: b.cps} },
	},
	{
		// Checkpoints listed in string order (…:10 before …:9).
		name:  "checkpoint-string-order",
		run:   "^Checkpoints$/^Order$",
		fails: []string{"Checkpoints/Order"},
		wrap:  func(b *broken) { b.cps = stringOrder{Checkpoints: b.cps} },
	},
	{
		// Saves ignore the fencing token.
		name:  "checkpoint-no-token-guard",
		run:   "^Checkpoints$/^TokenGuard$",
		fails: []string{"Checkpoints/TokenGuard"},
		wrap:  func(b *broken) { b.cps = noTokenGuard{Checkpoints: b.cps} },
	},
	{
		// Fence does nothing: fencing only by the tokens saves carry.
		name:  "checkpoint-fence-ignored",
		run:   "^Checkpoints$/^(Fence|FenceConcurrent)$",
		fails: []string{"Checkpoints/Fence", "Checkpoints/FenceConcurrent"},
		wrap:  func(b *broken) { b.cps = fenceIgnored{Checkpoints: b.cps} },
	},
	{
		// DeleteAll and Cleanup forget the task's fence and sequence, as
		// a store that derives both from the kept checkpoints does.
		name:  "checkpoint-fence-forgotten",
		run:   "^Checkpoints$/^(FenceSurvivesDeleteAll|SequencesContinue)$",
		fails: []string{"Checkpoints/FenceSurvivesDeleteAll", "Checkpoints/SequencesContinue"},
		wrap: func(b *broken) {
			b.cps = fenceForgotten{Checkpoints: b.cps, purger: b.Store.(driver.Purger)}
		},
	},
	{
		// Save in two writes (fence, then checkpoint) with reads that do
		// not skip the checkpoints a deletion has covered.
		name:  "checkpoint-late-save-visible",
		run:   "^Checkpoints$/^(LateSaveHidden|RunAfterZombieSave)$",
		fails: []string{"Checkpoints/LateSaveHidden", "Checkpoints/RunAfterZombieSave"},
		wrap:  func(b *broken) { b.cps = twoWriteSave{Checkpoints: b.cps, pausing: pausing{b.prefix}} },
	},
	{
		// Cleanup and DeleteAll ignore the caller's token.
		name:  "checkpoint-delete-unfenced",
		run:   "^Checkpoints$/^FencedDelete$",
		fails: []string{"Checkpoints/FencedDelete"},
		wrap:  func(b *broken) { b.cps = unfencedDelete{Checkpoints: b.cps} },
	},
	{
		// Deletions check the fence, then delete whatever is there.
		name:  "checkpoint-delete-two-step",
		run:   "^Checkpoints$/^LateDeleteSparesSuccessor$",
		fails: []string{"Checkpoints/LateDeleteSparesSuccessor"},
		wrap:  func(b *broken) { b.cps = twoStepDelete{Checkpoints: b.cps, pausing: pausing{b.prefix}} },
	},
	{
		// Idempotency claim as get-then-set.
		name:  "idem-get-then-set",
		run:   "^(Idempotency|MultiProcess)$/^(ConcurrentClaim|Idempotency)$",
		fails: []string{"Idempotency/ConcurrentClaim", "MultiProcess/Idempotency"},
		wrap:  func(b *broken) { b.idem = getThenSet{Idempotency: b.idem} },
	},
	{
		// A context ending mid-flight surfaces as a connection error.
		name:  "ctx-error-swallowed",
		run:   "^Lifecycle$/^CancelMidFlight$",
		fails: []string{"Lifecycle/CancelMidFlight"},
		wrap:  func(b *broken) { b.cache = swallowCtx{Cache: b.cache} },
	},
}

// TestBrokenDouble runs, in a subprocess per double, the suite against
// the broken doubles, and checks that each fails in the check that guards
// what it breaks. In a subprocess (doubleEnv set) it runs the suite
// against the named double.
func TestBrokenDouble(t *testing.T) {
	if name := os.Getenv(doubleEnv); name != "" {
		runDouble(t, name)
		return
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range doubles {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			run := "^TestBrokenDouble$/^" + regexp.QuoteMeta(d.name) + "$"
			if d.run != "" {
				run += "/" + d.run
			}
			cmd := exec.CommandContext(t.Context(), exe, "-test.run="+run, "-test.count=1", "-test.v", "-test.timeout=5m")
			cmd.Env = append(os.Environ(), doubleEnv+"="+d.name)
			out, err := cmd.CombinedOutput()
			text := string(out)
			if strings.Contains(text, "WARNING: DATA RACE") || strings.Contains(text, "panic:") {
				t.Fatalf("the suite against %s raced or panicked:\n%s", d.name, text)
			}
			if len(d.fails) == 0 {
				if err != nil {
					t.Fatalf("the suite failed against the control double: %v\n%s", err, text)
				}
				passed := strings.Count(text, "--- PASS: TestBrokenDouble/"+d.name+"/")
				// The Faults group needs a server to put a proxy in front
				// of; the doubles have none, so it alone may skip.
				skips := strings.Count(text, "--- SKIP") - strings.Count(text, "--- SKIP: TestBrokenDouble/"+d.name+"/Faults")
				if skips > 0 || passed < 70 {
					t.Errorf("against the control double %d checks passed, and some were skipped or missing:\n%s", passed, text)
				}
				return
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("the suite against %s did not fail as tests fail (err %v):\n%s", d.name, err, text)
			}
			for _, f := range d.fails {
				if !strings.Contains(text, "--- FAIL: TestBrokenDouble/"+d.name+"/"+f+" ") {
					t.Errorf("the suite against %s did not fail %s:\n%s", d.name, f, text)
				}
			}
		})
	}
}

// runDouble runs the suite against one double, in the subprocess.
func runDouble(t *testing.T, name string) {
	i := -1
	for j, d := range doubles {
		if d.name == name {
			i = j
		}
	}
	if i < 0 {
		t.Fatalf("no double %q", name)
	}
	d := doubles[i]
	db := "double-" + name
	srv := rpcstore.Serve(t, func(prefix string) driver.Store { return newBroken(d, db, prefix) })
	t.Run(name, func(t *testing.T) {
		drivertest.Run(t, drivertest.Harness{
			Name: name,
			Open: func(t testing.TB, prefix string) *warden.Store {
				return warden.New(newBroken(d, db, prefix), nil)
			},
			URL: func(t testing.TB, prefix string) string { return srv.URL(prefix) },
		})
	})
}

// ---------------------------------------------------------------------------
// lock doubles

var refusals atomic.Int64

type secondOwner struct{ driver.Locks }

func (l *secondOwner) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	rec, ok, err := l.Locks.Acquire(ctx, key, owner, ttl)
	if err == nil && !ok && refusals.Add(1)%4 == 0 {
		rec.Owner = owner
		return rec, true, nil
	}
	return rec, ok, err
}

// stuckTokens does not advance the fencing token when a new owner takes
// over an expired holding (a store that bumps the counter only on
// release): the new holder shows the expired holder's token.
type stuckTokens struct {
	driver.Locks
	prefix string
}

// tokenState is what stuckTokens remembers of a key's last holding.
type tokenState struct {
	owner       string
	real, shown int64
	released    bool
}

func (l *stuckTokens) state(key string) (string, tokenState) {
	k := "stuck\x00" + l.prefix + "\x00" + key
	st, _ := shared.m[k].(tokenState)
	return k, st
}

// show maps a real token to the one shown.
func (l *stuckTokens) show(key string, real int64) int64 {
	shared.Lock()
	defer shared.Unlock()
	if _, st := l.state(key); st.real == real && real != 0 {
		return st.shown
	}
	return real
}

// real maps a shown token back.
func (l *stuckTokens) real(key string, shown int64) int64 {
	shared.Lock()
	defer shared.Unlock()
	if _, st := l.state(key); st.shown == shown && shown != 0 {
		return st.real
	}
	return shown
}

func (l *stuckTokens) released(key string) {
	shared.Lock()
	defer shared.Unlock()
	if k, st := l.state(key); st.real != 0 {
		st.released = true
		shared.m[k] = st
	}
}

func (l *stuckTokens) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	rec, ok, err := l.Locks.Acquire(ctx, key, owner, ttl)
	if err != nil {
		return rec, ok, err
	}
	if !ok {
		rec.Token = l.show(key, rec.Token)
		return rec, ok, err
	}
	shared.Lock()
	k, prev := l.state(key)
	shown := rec.Token
	switch {
	case prev.real == rec.Token:
		shown = prev.shown // the holder again
	case prev.real != 0 && !prev.released:
		shown = prev.shown // took over an expired holding: no new token
	}
	shared.m[k] = tokenState{owner: owner, real: rec.Token, shown: shown}
	shared.Unlock()
	rec.Token = shown
	return rec, ok, err
}

func (l *stuckTokens) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	rec, ok, err := l.Locks.Refresh(ctx, key, owner, l.real(key, token), ttl)
	rec.Token = l.show(key, rec.Token)
	return rec, ok, err
}

func (l *stuckTokens) Release(ctx context.Context, key, owner string, token int64) (bool, error) {
	ok, err := l.Locks.Release(ctx, key, owner, l.real(key, token))
	if ok {
		l.released(key)
	}
	return ok, err
}

func (l *stuckTokens) ForceRelease(ctx context.Context, key string) (bool, error) {
	ok, err := l.Locks.ForceRelease(ctx, key)
	if ok {
		l.released(key)
	}
	return ok, err
}

func (l *stuckTokens) Get(ctx context.Context, key string) (driver.LockRecord, bool, error) {
	rec, found, err := l.Locks.Get(ctx, key)
	rec.Token = l.show(key, rec.Token)
	return rec, found, err
}

type secondsTTL struct{ driver.Locks }

func ceilSeconds(d time.Duration) time.Duration {
	return (d + time.Second - 1) / time.Second * time.Second
}

func (l secondsTTL) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	return l.Locks.Acquire(ctx, key, owner, ceilSeconds(ttl))
}

func (l secondsTTL) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	return l.Locks.Refresh(ctx, key, owner, token, ceilSeconds(ttl))
}

type expiredBlocks struct {
	driver.Locks
	prefix string
}

type holding struct {
	rec     driver.LockRecord
	expires time.Time
}

func (l *expiredBlocks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	k := "expired\x00" + l.prefix + "\x00" + key
	shared.Lock()
	h, held := shared.m[k].(holding)
	shared.Unlock()
	if held && h.rec.Owner != owner && time.Now().Before(h.expires.Add(time.Minute)) {
		if _, live, err := l.Locks.Get(ctx, key); err == nil && !live {
			return h.rec, false, nil // the expired document is still there
		}
	}
	rec, ok, err := l.Locks.Acquire(ctx, key, owner, ttl)
	if ok {
		shared.Lock()
		shared.m[k] = holding{rec, rec.ExpiresAt}
		shared.Unlock()
	}
	return rec, ok, err
}

func (l *expiredBlocks) Release(ctx context.Context, key, owner string, token int64) (bool, error) {
	ok, err := l.Locks.Release(ctx, key, owner, token)
	if ok {
		shared.Lock()
		delete(shared.m, "expired\x00"+l.prefix+"\x00"+key)
		shared.Unlock()
	}
	return ok, err
}

type firstAcquireError struct {
	driver.Locks
	prefix string
}

func (l *firstAcquireError) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	k := "seen\x00" + l.prefix + "\x00" + key
	shared.Lock()
	seen := shared.m[k] != nil
	shared.Unlock()
	pause()
	rec, ok, err := l.Locks.Acquire(ctx, key, owner, ttl)
	shared.Lock()
	shared.m[k] = true
	shared.Unlock()
	if err == nil && !ok && !seen {
		return rec, false, errors.New(`duplicate key value violates unique constraint "locks_pkey"`)
	}
	return rec, ok, err
}

type releaseAny struct{ driver.Locks }

func (l releaseAny) Release(ctx context.Context, key, owner string, token int64) (bool, error) {
	rec, found, err := l.Locks.Get(ctx, key)
	if err != nil || !found {
		return l.Locks.Release(ctx, key, owner, token)
	}
	return l.Locks.Release(ctx, key, rec.Owner, rec.Token)
}

// ---------------------------------------------------------------------------
// circuit doubles

type lostIncrements struct{ driver.Circuits }

func (c lostIncrements) RecordFailure(ctx context.Context, name string, threshold int, gen int64) (driver.CircuitRecord, error) {
	before, _, err := c.Circuits.Get(ctx, name)
	if err != nil {
		return before, err
	}
	pause()
	shared.Lock()
	defer shared.Unlock()
	cur, _, err := c.Circuits.Get(ctx, name)
	if err != nil {
		return cur, err
	}
	if cur.Failures != before.Failures {
		// Someone wrote in between: this write overwrites theirs.
		cur.Failures = before.Failures + 1
		return cur, nil
	}
	return c.Circuits.RecordFailure(ctx, name, threshold, gen)
}

// anyGeneration records every outcome whatever its generation: a late
// success of a call admitted before the circuit re-opened closes it.
type anyGeneration struct{ driver.Circuits }

func (c anyGeneration) RecordFailure(ctx context.Context, name string, threshold int, _ int64) (driver.CircuitRecord, error) {
	return c.Circuits.RecordFailure(ctx, name, threshold, driver.AnyGeneration)
}

func (c anyGeneration) RecordSuccess(ctx context.Context, name string, _ int64) (driver.CircuitRecord, error) {
	return c.Circuits.RecordSuccess(ctx, name, driver.AnyGeneration)
}

// anyProbeEpoch records a probe's outcome whatever its slot: the late
// success of a probe whose slot lapsed and was granted again closes the
// circuit while the newer probe runs.
type anyProbeEpoch struct{ driver.Circuits }

func (c anyProbeEpoch) RecordOutcome(ctx context.Context, name string, o driver.Outcome) (driver.CircuitRecord, error) {
	o.ProbeEpoch = 0
	return c.Circuits.RecordOutcome(ctx, name, o)
}

// intervalReadThenReset decides whether the counting period is over on a
// read, then writes: a write that found the period over asks the store to
// reset by an interval of one millisecond, however many other writers
// reset it meanwhile.
type intervalReadThenReset struct{ driver.Circuits }

func (c intervalReadThenReset) RecordOutcome(ctx context.Context, name string, o driver.Outcome) (driver.CircuitRecord, error) {
	if o.Interval <= 0 {
		return c.Circuits.RecordOutcome(ctx, name, o)
	}
	rec, found, err := c.Circuits.Get(ctx, name)
	if err != nil {
		return rec, err
	}
	over := found && !rec.IntervalStart.IsZero() && !rec.IntervalStart.Add(o.Interval).After(time.Now())
	o.Interval = 24 * time.Hour // within the period: no reset
	if over {
		time.Sleep(15 * time.Millisecond) // the window other writers read "over" in too
		o.Interval = time.Millisecond
	}
	return c.Circuits.RecordOutcome(ctx, name, o)
}

// ---------------------------------------------------------------------------
// cache doubles

type racySetIfAbsent struct{ driver.Cache }

func (c racySetIfAbsent) SetIfAbsent(ctx context.Context, key string, value []byte, ttl time.Duration) (bool, error) {
	has, err := c.Cache.Has(ctx, key)
	if err != nil || has {
		return false, err
	}
	pause()
	return true, c.Cache.Set(ctx, key, value, ttl)
}

type keysEverywhere struct{ driver.Cache }

func (c keysEverywhere) Keys(ctx context.Context, p driver.Pattern) ([]string, error) {
	shared.Lock()
	caches := append([]driver.Cache(nil), shared.caches...)
	shared.Unlock()
	set := map[string]bool{}
	for _, cc := range caches {
		keys, err := cc.Keys(ctx, p)
		if err != nil {
			continue // a closed store
		}
		for _, k := range keys {
			set[k] = true
		}
	}
	var out []string
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out, nil
}

type firstPage struct{ driver.Cache }

func (c firstPage) Keys(ctx context.Context, p driver.Pattern) ([]string, error) {
	keys, err := c.Cache.Keys(ctx, p)
	if len(keys) > 1000 {
		keys = keys[:1000]
	}
	return keys, err
}

type cacheSeconds struct{ driver.Cache }

func (c cacheSeconds) Set(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	return c.Cache.Set(ctx, key, value, ceilSeconds(ttl))
}

type swallowCtx struct{ driver.Cache }

func (c swallowCtx) Set(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	err := c.Cache.Set(ctx, key, value, ttl)
	time.Sleep(300 * time.Microsecond) // the reply is on its way
	if ctx.Err() != nil {
		return errors.New("read tcp 127.0.0.1:5432: connection reset by peer")
	}
	return err
}

func (c swallowCtx) Get(ctx context.Context, key string) (driver.CacheEntry, bool, error) {
	e, found, err := c.Cache.Get(ctx, key)
	time.Sleep(300 * time.Microsecond)
	if ctx.Err() != nil {
		return e, false, errors.New("driver: bad connection")
	}
	return e, found, err
}

// ---------------------------------------------------------------------------
// listing doubles

// naiveRegexp treats a glob as a regular expression, as a careless
// MongoDB or Redis store would.
func naiveRegexp(p driver.Pattern) (*regexp.Regexp, error) {
	return regexp.Compile(p.String())
}

type regexLocks struct{ driver.Locks }

func (l regexLocks) List(ctx context.Context, p driver.Pattern) ([]driver.LockRecord, error) {
	re, err := naiveRegexp(p)
	if err != nil {
		return nil, err
	}
	all, err := l.Locks.List(ctx, driver.AllKeys)
	var out []driver.LockRecord
	for _, r := range all {
		if re.MatchString(r.Key) {
			out = append(out, r)
		}
	}
	return out, err
}

type regexCache struct{ driver.Cache }

func (c regexCache) Keys(ctx context.Context, p driver.Pattern) ([]string, error) {
	re, err := naiveRegexp(p)
	if err != nil {
		return nil, err
	}
	all, err := c.Cache.Keys(ctx, driver.AllKeys)
	var out []string
	for _, k := range all {
		if re.MatchString(k) {
			out = append(out, k)
		}
	}
	return out, err
}

// ---------------------------------------------------------------------------
// checkpoint doubles

type racySequence struct{ driver.Checkpoints }

func (c racySequence) Save(ctx context.Context, in driver.CheckpointInput) (driver.Checkpoint, bool, error) {
	latest, _, err := c.Checkpoints.Latest(ctx, in.TaskID)
	if err != nil {
		return latest, false, err
	}
	next := latest.Sequence + 1
	pause()
	cp, ok, err := c.Checkpoints.Save(ctx, in)
	cp.Sequence, cp.ID = next, driver.CheckpointID(in.TaskID, next)
	return cp, ok, err
}

type stringOrder struct{ driver.Checkpoints }

func (c stringOrder) List(ctx context.Context, task string) ([]driver.Checkpoint, error) {
	cps, err := c.Checkpoints.List(ctx, task)
	sort.Slice(cps, func(i, j int) bool { return cps[i].ID < cps[j].ID })
	return cps, err
}

type noTokenGuard struct{ driver.Checkpoints }

func (c noTokenGuard) Save(ctx context.Context, in driver.CheckpointInput) (driver.Checkpoint, bool, error) {
	token := in.Token
	in.Token = 0
	cp, ok, err := c.Checkpoints.Save(ctx, in)
	cp.Token = token
	return cp, ok, err
}

type fenceIgnored struct{ driver.Checkpoints }

func (c fenceIgnored) Fence(ctx context.Context, task string, token int64) (bool, error) {
	return true, ctx.Err()
}

// fenceForgotten drops the fence records of the namespace's tasks without
// checkpoints (the memory store's Purge with no retention) whenever
// checkpoints are deleted.
type fenceForgotten struct {
	driver.Checkpoints
	purger driver.Purger
}

func (c fenceForgotten) DeleteAll(ctx context.Context, task string, token int64) (int64, bool, error) {
	n, ok, err := c.Checkpoints.DeleteAll(ctx, task, token)
	if err == nil {
		_, err = c.purger.Purge(ctx, 0)
	}
	return n, ok, err
}

func (c fenceForgotten) Cleanup(ctx context.Context, task string, keep int, token int64) (int64, bool, error) {
	n, ok, err := c.Checkpoints.Cleanup(ctx, task, keep, token)
	if err == nil {
		_, err = c.purger.Purge(ctx, 0)
	}
	return n, ok, err
}

// cpPauses are the pauses the suite asks of the two-write doubles
// (drivertest.CheckpointPauser): namespace + task → f.
var cpPauses sync.Map

type pausing struct{ prefix string }

func (p pausing) PauseCheckpoint(task string, f func()) { cpPauses.Store(p.prefix+task, f) }

func (p pausing) pauseBetween(task string) {
	if f, ok := cpPauses.LoadAndDelete(p.prefix + task); ok {
		f.(func())()
	}
}

// twoWriteSave saves in two writes, as the MongoDB and DynamoDB stores
// do — the fence check, then the checkpoint — but its reads do not skip
// what a deletion has covered: a zombie's save that passed the fence
// writes its checkpoint after the newer holder's DeleteAll, and it is
// read back. (The checkpoint is written unfenced, with its token kept
// aside and put back on reads.)
type twoWriteSave struct {
	driver.Checkpoints
	pausing
}

func (c twoWriteSave) tokenKey(id string) string { return "twoWriteSave " + c.prefix + id }

func (c twoWriteSave) Save(ctx context.Context, in driver.CheckpointInput) (driver.Checkpoint, bool, error) {
	if in.Token > 0 {
		if ok, err := c.Checkpoints.Fence(ctx, in.TaskID, in.Token); err != nil || !ok {
			return driver.Checkpoint{}, false, err
		}
	}
	c.pauseBetween(in.TaskID)
	token := in.Token
	in.Token = 0
	cp, ok, err := c.Checkpoints.Save(ctx, in)
	if ok {
		shared.Lock()
		shared.m[c.tokenKey(cp.ID)] = token
		shared.Unlock()
		cp.Token = token
	}
	return cp, ok, err
}

func (c twoWriteSave) token(cp driver.Checkpoint) driver.Checkpoint {
	shared.Lock()
	defer shared.Unlock()
	if token, ok := shared.m[c.tokenKey(cp.ID)].(int64); ok {
		cp.Token = token
	}
	return cp
}

func (c twoWriteSave) Load(ctx context.Context, id string) (driver.Checkpoint, bool, error) {
	cp, found, err := c.Checkpoints.Load(ctx, id)
	return c.token(cp), found, err
}

func (c twoWriteSave) Latest(ctx context.Context, task string) (driver.Checkpoint, bool, error) {
	cp, found, err := c.Checkpoints.Latest(ctx, task)
	return c.token(cp), found, err
}

func (c twoWriteSave) List(ctx context.Context, task string) ([]driver.Checkpoint, error) {
	cps, err := c.Checkpoints.List(ctx, task)
	for i := range cps {
		cps[i] = c.token(cps[i])
	}
	return cps, err
}

// unfencedDelete: Cleanup and DeleteAll ignore the caller's token.
type unfencedDelete struct{ driver.Checkpoints }

func (c unfencedDelete) Cleanup(ctx context.Context, task string, keep int, token int64) (int64, bool, error) {
	return c.Checkpoints.Cleanup(ctx, task, keep, 0)
}

func (c unfencedDelete) DeleteAll(ctx context.Context, task string, token int64) (int64, bool, error) {
	return c.Checkpoints.DeleteAll(ctx, task, 0)
}

// twoStepDelete checks the fence, then deletes whatever the task holds
// when the deletion arrives (MongoDB's DeleteAll before fenced
// deletions): a zombie's deletion that passed the fence deletes the
// checkpoints its successor saved meanwhile.
type twoStepDelete struct {
	driver.Checkpoints
	pausing
}

func (c twoStepDelete) check(ctx context.Context, task string, token int64) (bool, error) {
	if token == 0 {
		return true, nil
	}
	return c.Checkpoints.Fence(ctx, task, token) // a no-op for the holder
}

func (c twoStepDelete) Cleanup(ctx context.Context, task string, keep int, token int64) (int64, bool, error) {
	if ok, err := c.check(ctx, task, token); err != nil || !ok {
		return 0, false, err
	}
	c.pauseBetween(task)
	return c.Checkpoints.Cleanup(ctx, task, keep, 0)
}

func (c twoStepDelete) DeleteAll(ctx context.Context, task string, token int64) (int64, bool, error) {
	if ok, err := c.check(ctx, task, token); err != nil || !ok {
		return 0, false, err
	}
	c.pauseBetween(task)
	return c.Checkpoints.DeleteAll(ctx, task, 0)
}

// ---------------------------------------------------------------------------
// idempotency doubles

type getThenSet struct{ driver.Idempotency }

func (i getThenSet) Claim(ctx context.Context, key, owner string, lease time.Duration, fp string) (driver.IdemRecord, driver.ClaimOutcome, error) {
	rec, found, err := i.Idempotency.Get(ctx, key)
	if err != nil {
		return rec, 0, err
	}
	if found && rec.Status == driver.IdemCompleted {
		return rec, driver.Completed, nil
	}
	if found && rec.Owner != owner {
		return rec, driver.InProgress, nil
	}
	pause()
	rec, out, err := i.Idempotency.Claim(ctx, key, owner, lease, fp)
	if out == driver.InProgress {
		// The set overwrote the other claim: both run.
		rec.Owner, out = owner, driver.Claimed
	}
	return rec, out, err
}
