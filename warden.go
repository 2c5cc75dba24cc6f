package warden

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-go/warden/driver"
)

// Opener opens a driver store from a URL. Stores register one per scheme.
// logger is the Options.Logger given to OpenWith (never nil:
// slog.Default() when none was given); a store logs its own warnings
// there (a server without TTL indexes, say).
type Opener func(ctx context.Context, u *url.URL, logger *slog.Logger) (driver.Store, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]Opener{}
)

// Register makes a store available to Open under a URL scheme. Store
// packages call it from init, without I/O. It panics if the scheme is
// registered twice or open is nil, like sql.Register.
func Register(scheme string, open Opener) {
	registryMu.Lock()
	defer registryMu.Unlock()
	scheme = strings.ToLower(scheme)
	if open == nil {
		panic("warden: Register opener is nil")
	}
	if _, dup := registry[scheme]; dup {
		panic("warden: Register called twice for scheme " + scheme)
	}
	registry[scheme] = open
}

// Schemes returns the registered URL schemes, sorted.
func Schemes() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	s := make([]string, 0, len(registry))
	for k := range registry {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// Options configure a Store. The zero value (or nil) is ready to use.
type Options struct {
	// Hook observes every store operation. Nil: none.
	Hook Hook
	// Logger receives warnings of the portable packages (a lease lost, a
	// breaker failing open). Nil: slog.Default().
	Logger *slog.Logger
}

// Hook observes store operations, the way pgx tracers and go-redis hooks
// do. AfterOp is called once per operation, after it returns, on the
// caller's goroutine; it must be fast and safe for concurrent use.
type Hook interface {
	AfterOp(ctx context.Context, op OpInfo)
}

// OpInfo describes one finished store operation.
type OpInfo struct {
	Store    string        // backend name
	Op       string        // "lock.acquire", "cache.get", …
	Key      string        // key, name or task id; empty for namespace-wide operations
	Start    time.Time     // when the operation began
	Duration time.Duration // how long it took
	Err      error         // the error returned to the caller, nil on success
}

// HookFunc adapts a function to the Hook interface.
type HookFunc func(ctx context.Context, op OpInfo)

// AfterOp calls f.
func (f HookFunc) AfterOp(ctx context.Context, op OpInfo) { f(ctx, op) }

// Store is a connection to one database in one namespace: the handle every
// portable package (lock, breaker, cache, idempotency, checkpoint) takes.
//
// Store checks every argument before any I/O (keys, patterns, durations,
// value sizes), refuses calls after Close with ErrClosed, wraps driver
// errors once in *Error, returns context errors unchanged, and reports
// every operation to the Hook. It is safe for concurrent use.
type Store struct {
	drv    driver.Store
	hook   Hook
	logger *slog.Logger
	closed atomic.Bool

	closeOnce sync.Once
	closeErr  error
}

// New wraps a driver store. Store packages' constructors (sqlite.Open,
// postgres.New, …) return a *Store through it.
func New(drv driver.Store, opts *Options) *Store {
	if opts == nil {
		opts = &Options{}
	}
	s := &Store{drv: drv, hook: opts.Hook, logger: opts.Logger}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	return s
}

// Open opens a store from a URL: memory://, sqlite:///path/file.db (also
// sqlite://file.db), and the schemes of every store package imported:
// postgres:// and postgresql:// (store/postgres), mysql:// (store/mysql),
// mongodb:// and mongodb+srv:// (store/mongo), dynamodb://TABLE
// (store/dynamo), redis://, rediss:// and unix:// (store/redis). Every
// store accepts ?prefix= for its namespace; unknown parameters are errors.
// Errors never contain the URL's password.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	return OpenWith(ctx, rawURL, nil)
}

// OpenWith is Open with options.
func OpenWith(ctx context.Context, rawURL string, opts *Options) (*Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Parse quotes the raw URL in its error: never show it.
		return nil, fmt.Errorf("%w: cannot parse the store URL", driver.ErrBadURL)
	}
	scheme := strings.ToLower(u.Scheme)
	registryMu.RLock()
	open := registry[scheme]
	registryMu.RUnlock()
	if open == nil {
		return nil, fmt.Errorf("%w %q: registered schemes are %s (import a store package to register more)",
			ErrUnknownScheme, scheme, strings.Join(Schemes(), ", "))
	}
	if err := driver.ValidatePrefix(u.Query().Get("prefix")); err != nil {
		return nil, fmt.Errorf("warden: open %s: %w", driver.RedactURL(u), err)
	}
	logger := slog.Default()
	if opts != nil && opts.Logger != nil {
		logger = opts.Logger
	}
	drv, err := open(ctx, u, logger)
	if err != nil {
		if cerr := contextErr(ctx, err); cerr != nil {
			return nil, cerr
		}
		return nil, fmt.Errorf("warden: open %s: %w", driver.RedactURL(u), err)
	}
	return New(drv, opts), nil
}

// Driver returns the driver store, for store-specific features and tests.
// Calls made through it bypass the Store's checks.
func (s *Store) Driver() driver.Store { return s.drv }

// Name returns the backend's name: "memory", "sqlite", "postgres", …
func (s *Store) Name() string { return s.drv.Name() }

// Logger returns the logger the portable packages report to.
func (s *Store) Logger() *slog.Logger { return s.logger }

// Limits returns the store's size limits.
func (s *Store) Limits() driver.Limits { return s.drv.Limits() }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	return s.call(ctx, "ping", "", func() error { return s.drv.Ping(ctx) })
}

// Migrate creates the store's tables, collections and indexes if they are
// missing (most stores also do it on first use). It is idempotent; stores
// without a schema do nothing.
func (s *Store) Migrate(ctx context.Context) error {
	m, ok := s.drv.(driver.Migrator)
	if !ok {
		return s.call(ctx, "migrate", "", func() error { return nil })
	}
	return s.call(ctx, "migrate", "", func() error { return m.Migrate(ctx) })
}

// Purge deletes records kept past their expiry: expired cache entries and
// idempotency records, and lock records and checkpoint fence records (of
// tasks without checkpoints) idle for at least lockRetention (0 means 24
// hours). Lock records are kept after release so that fencing
// tokens keep increasing; see docs/design.md.
func (s *Store) Purge(ctx context.Context, lockRetention time.Duration) (int64, error) {
	if lockRetention == 0 {
		lockRetention = 24 * time.Hour
	}
	if lockRetention < 0 {
		return 0, s.argErr("purge", "", "negative lock retention")
	}
	p, ok := s.drv.(driver.Purger)
	var n int64
	err := s.call(ctx, "purge", "", func() (err error) {
		if ok {
			n, err = p.Purge(ctx, lockRetention)
		}
		return err
	})
	return n, err
}

// Close closes the store. Later calls return ErrClosed. Close is
// idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.closeErr = s.drv.Close()
	})
	return s.closeErr
}

// Closed reports whether Close was called.
func (s *Store) Closed() bool { return s.closed.Load() }

// call runs one driver operation with the Store's checks, error wrapping
// and hook.
func (s *Store) call(ctx context.Context, op, key string, f func() error) error {
	var err error
	start := time.Now()
	switch {
	case ctx == nil:
		err = s.wrap(op, key, fmt.Errorf("%w: nil context", ErrInvalidArgument))
	case s.closed.Load():
		err = s.wrap(op, key, ErrClosed)
	case ctx.Err() != nil:
		err = ctx.Err()
	default:
		if err = f(); err != nil {
			if cerr := contextErr(ctx, err); cerr != nil {
				err = cerr
			} else if s.closed.Load() {
				err = s.wrap(op, key, ErrClosed)
			} else {
				err = s.wrap(op, key, err)
			}
		}
	}
	if s.hook != nil {
		hctx := ctx
		if hctx == nil {
			hctx = context.Background()
		}
		s.hook.AfterOp(hctx, OpInfo{Store: s.drv.Name(), Op: op, Key: key, Start: start, Duration: time.Since(start), Err: err})
	}
	return err
}

func (s *Store) wrap(op, key string, err error) error {
	var we *Error
	if errors.As(err, &we) {
		return err
	}
	return &Error{Store: s.drv.Name(), Op: op, Key: key, Err: err}
}

// check runs a validation before call, reporting a failed validation as the
// operation's error (to the caller and the hook) without any I/O.
func (s *Store) check(ctx context.Context, op, key string, verr error, f func() error) error {
	if verr != nil {
		return s.call(ctx, op, key, func() error { return verr })
	}
	return s.call(ctx, op, key, f)
}

func (s *Store) argErr(op, key, msg string) error {
	return s.wrap(op, key, fmt.Errorf("%w: %s", ErrInvalidArgument, msg))
}
