// Package memory is warden's in-process store: every capability (locks,
// circuit breakers, cache, idempotency keys, checkpoints) kept in Go maps
// behind one mutex per database. It is the reference driver: the portable
// packages and the conformance suite run on it in a plain `go test`, and it
// suits tests of code that uses warden and single-process programs.
//
// Open it with New, or through warden.Open once this package is imported:
//
//	memory://                    a private database (only this store sees it)
//	memory://NAME                the process-wide database called NAME
//	memory://NAME?prefix=app:    … in the namespace "app:"
//
// Query parameters: prefix (the namespace, default none) and
// max_value_bytes (default 16 MiB). Unknown parameters are errors.
//
// Several stores opened on the same named database behave like several
// connections to one server: stores with the same prefix see the same
// records and each other's lock and circuit notifications, stores with
// different prefixes never see each other's records. A named database
// lives as long as the process; a private one as long as its store is
// referenced.
//
// The clock is the process's clock (time.Now), truncated to milliseconds,
// in UTC. Lock records are kept after release so that fencing tokens keep
// increasing: a record starts at driver.TokenBase of its creation time and
// each new holding adds one. Each task has a fence record (its greatest
// fencing token and last checkpoint sequence) that outlives its
// checkpoints, so sequences continue after DeleteAll. Purge deletes idle
// lock records and idle fence records of tasks without checkpoints after a
// retention, and expired cache entries and idempotency records.
package memory

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// DefaultMaxValueBytes is the largest value a memory store accepts when
// Options.MaxValueBytes is zero: 16 MiB.
const DefaultMaxValueBytes = 16 << 20

// watchBuffer is how many events a watcher queues for a slow receiver
// before it drops events and owes the receiver an EventsLost marker.
const watchBuffer = 256

// Options configure a memory store. The zero value (or nil) is a private
// database without a prefix and with a 16 MiB value limit.
type Options struct {
	// Prefix is the store's namespace: records of other prefixes are
	// invisible to it. "": no prefix (its own namespace, distinct from
	// every non-empty prefix). The memory store keeps each namespace
	// apart, so any string works here; URLs (and stores that keep the
	// prefix inside stored keys) require the form of driver.ValidatePrefix,
	// such as "billing:".
	Prefix string
	// Name selects the database. "": a private database that only this
	// store uses. Otherwise the process-wide database of that name, shared
	// by every store opened with the same Name, like connections to one
	// server; it lives until the process exits.
	Name string
	// MaxValueBytes is the largest value (cache value, idempotency result,
	// checkpoint data) the store accepts. 0: DefaultMaxValueBytes (16 MiB).
	MaxValueBytes int
}

func init() {
	warden.Register("memory", openURL)
}

// openURL opens memory:// (private) and memory://NAME (shared) URLs.
func openURL(ctx context.Context, u *url.URL, _ *slog.Logger) (driver.Store, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if u.Opaque != "" {
		return nil, fmt.Errorf("%w: write memory://NAME, not memory:NAME", driver.ErrBadURL)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%w: a memory URL takes no user or password", driver.ErrBadURL)
	}
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("%w: a memory URL has no path (write memory://NAME)", driver.ErrBadURL)
	}
	if u.Fragment != "" {
		return nil, fmt.Errorf("%w: a memory URL has no fragment", driver.ErrBadURL)
	}
	q := driver.NewParams(u)
	opts := &Options{
		Name:          u.Host,
		Prefix:        q.String("prefix", ""),
		MaxValueBytes: q.Int("max_value_bytes", 0),
	}
	if err := q.Err(); err != nil {
		return nil, err
	}
	return NewDriver(opts), nil
}

// New opens a memory store wrapped in a *warden.Store (nil opts: defaults).
func New(opts *Options) *warden.Store {
	return warden.New(NewDriver(opts), nil)
}

// NewDriver opens a memory store as a raw driver.Store (nil opts:
// defaults), for tests and wrappers that need the driver itself. Calls on
// it bypass warden.Store's argument checks.
func NewDriver(opts *Options) driver.Store {
	if opts == nil {
		opts = &Options{}
	}
	s := &store{
		prefix:   opts.Prefix,
		maxValue: opts.MaxValueBytes,
		stop:     make(chan struct{}),
	}
	if s.maxValue <= 0 {
		s.maxValue = DefaultMaxValueBytes
	}
	if opts.Name == "" {
		s.db = newDatabase()
	} else {
		s.db = sharedDatabase(opts.Name)
	}
	return s
}

// ---------------------------------------------------------------------------
// databases

var (
	sharedMu  sync.Mutex
	sharedDBs = map[string]*database{}
)

func sharedDatabase(name string) *database {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	db := sharedDBs[name]
	if db == nil {
		db = newDatabase()
		sharedDBs[name] = db
	}
	return db
}

// database is one in-memory database: the namespaces' records and the
// registered watchers, all guarded by mu. Every driver method holds mu for
// its whole duration, which makes it atomic.
type database struct {
	mu       sync.Mutex
	spaces   map[string]*space // by prefix
	lockW    map[string]map[*watcher[driver.LockEvent]]struct{}
	circuitW map[string]map[*watcher[driver.CircuitRecord]]struct{}
}

func newDatabase() *database {
	return &database{
		spaces:   map[string]*space{},
		lockW:    map[string]map[*watcher[driver.LockEvent]]struct{}{},
		circuitW: map[string]map[*watcher[driver.CircuitRecord]]struct{}{},
	}
}

// space holds one namespace's records, each kind in its own map keyed by
// the key without prefix. Keeping namespaces apart (rather than in one map
// keyed by prefix + kind tag + key) means no prefix can ever read another's
// records, even when one prefix is another one followed by a kind tag.
type space struct {
	locks    map[string]*lockRec
	circuits map[string]*driver.CircuitRecord
	cache    map[string]*cacheRec
	idem     map[string]*driver.IdemRecord
	tasks    map[string][]driver.Checkpoint // by task id, in sequence order
	fences   map[string]*fence              // by task id; outlive the checkpoints
	// lastToken is the greatest fencing token the namespace handed out:
	// a lock record created after its key's record was purged starts
	// above it, however soon.
	lastToken int64
}

// space returns the namespace's records, creating them; db.mu must be held.
func (db *database) space(prefix string) *space {
	sp := db.spaces[prefix]
	if sp == nil {
		sp = &space{
			locks:    map[string]*lockRec{},
			circuits: map[string]*driver.CircuitRecord{},
			cache:    map[string]*cacheRec{},
			idem:     map[string]*driver.IdemRecord{},
			tasks:    map[string][]driver.Checkpoint{},
			fences:   map[string]*fence{},
		}
		db.spaces[prefix] = sp
	}
	return sp
}

// ---------------------------------------------------------------------------
// the store

// errClosed is returned by every method after Close.
var errClosed = warden.ErrClosed

// store is one connection to a database in one namespace.
type store struct {
	db       *database
	prefix   string
	maxValue int

	closed atomic.Bool
	mu     sync.Mutex // guards done and wg.Add against Close
	stop   chan struct{}
	done   bool
	wg     sync.WaitGroup // watcher goroutines
}

var (
	_ driver.Store           = (*store)(nil)
	_ driver.LockNotifier    = (*store)(nil)
	_ driver.CircuitNotifier = (*store)(nil)
	_ driver.Purger          = (*store)(nil)
)

// Name returns "memory".
func (s *store) Name() string { return "memory" }

// Limits returns the store's value limit.
func (s *store) Limits() driver.Limits { return driver.Limits{MaxValueBytes: s.maxValue} }

// Locks returns the lock driver.
func (s *store) Locks() driver.Locks { return (*locks)(s) }

// Circuits returns the circuit-breaker driver.
func (s *store) Circuits() driver.Circuits { return (*circuits)(s) }

// Cache returns the cache driver.
func (s *store) Cache() driver.Cache { return (*cache)(s) }

// Idempotency returns the idempotency driver.
func (s *store) Idempotency() driver.Idempotency { return (*idempotency)(s) }

// Checkpoints returns the checkpoint driver.
func (s *store) Checkpoints() driver.Checkpoints { return (*checkpoints)(s) }

// Ping reports whether the store is open.
func (s *store) Ping(ctx context.Context) error { return s.check(ctx) }

// Close stops the store's watchers (their channels are closed) and makes
// later calls fail. The database itself stays for the other stores that
// share it. Close is idempotent.
func (s *store) Close() error {
	s.mu.Lock()
	if !s.done {
		s.done = true
		s.closed.Store(true)
		close(s.stop)
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// check is called first by every method.
func (s *store) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return errClosed
	}
	return nil
}

// begin checks the store and locks the database, returning the store's
// namespace and the time of the operation. The caller must call s.end().
func (s *store) begin(ctx context.Context) (*space, time.Time, error) {
	if err := s.check(ctx); err != nil {
		return nil, time.Time{}, err
	}
	s.db.mu.Lock()
	return s.db.space(s.prefix), now(), nil
}

func (s *store) end() { s.db.mu.Unlock() }

func (s *store) checkValue(v []byte) error {
	if len(v) > s.maxValue {
		return fmt.Errorf("%w: %d bytes, the memory store's limit is %d", warden.ErrValueTooLarge, len(v), s.maxValue)
	}
	return nil
}

// now is the store clock: the process's clock in UTC, truncated to
// milliseconds.
func now() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }

// after returns t+d with d rounded up to whole milliseconds.
func after(t time.Time, d time.Duration) time.Time {
	return t.Add(time.Duration(driver.Millis(d)) * time.Millisecond)
}

// clone copies a byte slice, keeping nil and empty apart.
func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}

// purge deletes expired cache and idempotency records, lock records idle
// for at least lockRetention and the fence records of tasks without
// checkpoints whose fence has not changed for lockRetention; db.mu is
// held.
func purge(sp *space, now time.Time, lockRetention time.Duration) int64 {
	var n int64
	for key, r := range sp.cache {
		if !r.live(now) {
			delete(sp.cache, key)
			n++
		}
	}
	for key, r := range sp.idem {
		if !idemLive(r, now) {
			delete(sp.idem, key)
			n++
		}
	}
	cutoff := now.Add(-lockRetention)
	for key, r := range sp.locks {
		if !r.live(now) && !r.idleSince().After(cutoff) {
			delete(sp.locks, key)
			n++
		}
	}
	for task, f := range sp.fences {
		if len(sp.tasks[task]) == 0 && !f.updatedAt.After(cutoff) {
			delete(sp.fences, task)
			n++
		}
	}
	return n
}

// Purge deletes, in the store's namespace, expired cache entries and
// idempotency records, lock records idle (released or expired) for at
// least lockRetention, and the fence records of tasks that have no
// checkpoint and whose fence has not changed for lockRetention.
func (s *store) Purge(ctx context.Context, lockRetention time.Duration) (int64, error) {
	sp, now, err := s.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer s.end()
	return purge(sp, now, lockRetention), nil
}
