package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"

	sqlitelib "modernc.org/sqlite" // also registers the "sqlite" database/sql driver
	sqlite3 "modernc.org/sqlite/lib"
)

// Defaults of Options.
const (
	DefaultBusyTimeout   = 5 * time.Second
	DefaultMaxValueBytes = 16 << 20
	DefaultPollInterval  = 5 * time.Millisecond

	// maxSQLiteLength is SQLite's default SQLITE_MAX_LENGTH: no string or
	// blob can be larger.
	maxSQLiteLength = 1_000_000_000
)

// Default table names: those of the go-go-scope adapters, plus warden's
// events table.
const (
	DefaultLocksTable       = "go_goscope_locks"
	DefaultCircuitsTable    = "go_goscope_circuit"
	DefaultCacheTable       = "go_goscope_cache"
	DefaultIdempotencyTable = "go_goscope_idempotency"
	DefaultCheckpointsTable = "go_goscope_checkpoints"
	// DefaultCheckpointTasksTable holds each task's checkpoint fence (its
	// greatest fencing token and last sequence); warden's own table.
	DefaultCheckpointTasksTable = "go_goscope_checkpoint_tasks"
	DefaultEventsTable          = "go_goscope_events"
)

// Options configure a SQLite store. The zero value (or nil) is ready to
// use.
type Options struct {
	// Prefix is the store's namespace: empty, or a name followed by its
	// only ':' such as "billing:" (driver.ValidatePrefix). It is put in
	// front of every stored key and kept in each record's namespace
	// column. Empty: the unprefixed namespace.
	Prefix string
	// BusyTimeout is how long an operation waits for other connections or
	// processes to release SQLite's write lock before failing with
	// "database is locked". 0: 5 seconds.
	BusyTimeout time.Duration
	// MaxValueBytes is the largest cache value, idempotency result or
	// checkpoint payload accepted. 0: 16 MiB. It cannot exceed SQLite's
	// own limit of 1e9 bytes.
	MaxValueBytes int
	// PollInterval is how often the notification watcher checks the
	// database for changes made by any connection or process. 0: 5 ms.
	PollInterval time.Duration
	// Tables names the tables. Empty fields take the defaults.
	Tables Tables
	// ReadOnly opens the file for reading only (URL: ?mode=ro): the file
	// must exist (no file is created; a missing one is an error that
	// errors.Is(err, fs.ErrNotExist)) and already hold warden's tables;
	// WAL is not enabled and the schema not touched, and writes fail —
	// but for a watch's registration as a watcher, which Watch writes
	// through a read-write connection of its own (package documentation,
	// Notifications). When SQLite cannot open the file even so (a WAL
	// file whose -shm cannot be created in a read-only directory), it is
	// opened immutable: what was committed when it was opened. false:
	// read-write, created if missing.
	ReadOnly bool
}

// Tables names the store's tables. An empty field means the default name
// (the Default…Table constants). Names must be plain SQL identifiers:
// letters, digits and underscores, not starting with a digit.
type Tables struct {
	Locks       string // "": go_goscope_locks
	Circuits    string // "": go_goscope_circuit
	Cache       string // "": go_goscope_cache
	Idempotency string // "": go_goscope_idempotency
	Checkpoints string // "": go_goscope_checkpoints
	// CheckpointTasks is the table of checkpoint fences, one row per task.
	CheckpointTasks string // "": go_goscope_checkpoint_tasks
	Events          string // "": go_goscope_events
}

// ErrNoDirectory is matched (errors.Is) by the error of opening a database
// whose directory does not exist. The store creates the database file but
// never its directory: a directory is the application's to create, with
// the owner and permissions it chooses, and a mistyped path should fail
// rather than leave a new directory tree behind. The error also matches
// fs.ErrNotExist.
var ErrNoDirectory = errors.New("sqlite: the database file's directory does not exist")

// noDirError is the error of opening path, whose directory dir does not
// exist.
type noDirError struct{ path, dir string }

func (e *noDirError) Error() string {
	dir := strconv.Quote(e.dir)
	if abs, err := filepath.Abs(e.dir); err == nil && abs != e.dir {
		dir += " (" + abs + ")"
	}
	return fmt.Sprintf("sqlite: opening %q: directory %s does not exist (the store creates the database file, not its directory)", e.path, dir)
}

func (e *noDirError) Is(target error) bool {
	return target == ErrNoDirectory || target == fs.ErrNotExist
}

// checkDir returns a *noDirError if the directory of path does not exist.
// Other failures (a path through a file, no permission) are left to SQLite
// to report.
func checkDir(path string) error {
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return &noDirError{path: path, dir: dir}
	}
	return nil
}

func init() {
	warden.Register("sqlite", openURL)
}

// Open opens (creating if needed) the SQLite database file at path, creates
// or upgrades warden's tables, and returns a checked warden.Store.
// The file's directory must exist: Open creates the file, never a
// directory, and a missing one is an error that names it and matches
// [ErrNoDirectory] and fs.ErrNotExist.
func Open(ctx context.Context, path string, opts *Options) (*warden.Store, error) {
	drv, err := OpenDriver(ctx, path, opts)
	if err != nil {
		return nil, err
	}
	return warden.New(drv, nil), nil
}

// OpenDriver is Open without the warden.Store wrapper: the raw driver, for
// tests and for callers that wrap it themselves. The returned store also
// implements driver.Migrator, driver.Purger, driver.LockNotifier,
// driver.CircuitNotifier and driver.LockWaiter (turns.go).
func OpenDriver(ctx context.Context, path string, opts *Options) (driver.Store, error) {
	return openStore(ctx, path, opts)
}

// openURL is the warden.Opener for the "sqlite" scheme.
func openURL(ctx context.Context, u *url.URL, _ *slog.Logger) (driver.Store, error) {
	path, opts, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	return OpenDriver(ctx, path, opts)
}

// parseURL turns a sqlite:// URL into a file path and options.
func parseURL(u *url.URL) (string, *Options, error) {
	if u.User != nil {
		return "", nil, fmt.Errorf("%w: a sqlite URL takes no user or password", driver.ErrBadURL)
	}
	if u.Fragment != "" {
		return "", nil, fmt.Errorf("%w: a sqlite URL takes no #fragment", driver.ErrBadURL)
	}
	var path string
	switch {
	case u.Opaque != "":
		// sqlite:file.db
		p, err := url.PathUnescape(u.Opaque)
		if err != nil {
			return "", nil, fmt.Errorf("%w: bad escape in the path", driver.ErrBadURL)
		}
		path = p
	case u.Host != "":
		// sqlite://dir/file.db: the host is the first path segment of a
		// relative path.
		path = u.Host + u.Path
	default:
		// sqlite:///abs/file.db
		path = u.Path
	}
	if path == "" || strings.HasSuffix(path, "/") {
		return "", nil, fmt.Errorf("%w: a sqlite URL needs a file path: sqlite:///abs/path/file.db or sqlite://relative/file.db", driver.ErrBadURL)
	}
	q := driver.NewParams(u)
	opts := &Options{
		Prefix:        q.String("prefix", ""),
		BusyTimeout:   q.Duration("busy_timeout", 0),
		MaxValueBytes: q.Int("max_value_bytes", 0),
		PollInterval:  q.Duration("poll_interval", 0),
	}
	switch mode := q.String("mode", ""); mode {
	case "", "rw", "rwc":
	case "ro":
		opts.ReadOnly = true
	default:
		return "", nil, fmt.Errorf("%w: mode=%s: want ro (read-only) or rwc (the default)", driver.ErrBadURL, mode)
	}
	if err := q.Err(); err != nil {
		return "", nil, err
	}
	return path, opts, nil
}

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// config is Options with defaults applied and checked.
type config struct {
	prefix      string
	busy        time.Duration
	maxValue    int
	poll        time.Duration
	locks       string
	circuits    string
	cache       string
	idempotency string
	checkpoints string
	cpTasks     string
	events      string
	watchers    string // events + "_watchers": the stores watching a namespace
	turns       string // locks + "_turns": the queues of lock waiters (turns.go)
	readOnly    bool
}

func newConfig(opts *Options) (config, error) {
	if opts == nil {
		opts = &Options{}
	}
	c := config{
		prefix:      opts.Prefix,
		busy:        opts.BusyTimeout,
		maxValue:    opts.MaxValueBytes,
		poll:        opts.PollInterval,
		locks:       opts.Tables.Locks,
		circuits:    opts.Tables.Circuits,
		cache:       opts.Tables.Cache,
		idempotency: opts.Tables.Idempotency,
		checkpoints: opts.Tables.Checkpoints,
		cpTasks:     opts.Tables.CheckpointTasks,
		events:      opts.Tables.Events,
		readOnly:    opts.ReadOnly,
	}
	switch {
	case c.busy < 0:
		return c, errors.New("sqlite: negative BusyTimeout")
	case c.busy == 0:
		c.busy = DefaultBusyTimeout
	}
	switch {
	case c.maxValue < 0:
		return c, errors.New("sqlite: negative MaxValueBytes")
	case c.maxValue == 0:
		c.maxValue = DefaultMaxValueBytes
	case c.maxValue > maxSQLiteLength:
		return c, fmt.Errorf("sqlite: MaxValueBytes %d exceeds SQLite's limit of %d", c.maxValue, maxSQLiteLength)
	}
	switch {
	case c.poll < 0:
		return c, errors.New("sqlite: negative PollInterval")
	case c.poll == 0:
		c.poll = DefaultPollInterval
	}
	if err := driver.ValidatePrefix(c.prefix); err != nil {
		return c, fmt.Errorf("sqlite: %w", err)
	}
	names := []struct {
		p   *string
		def string
	}{
		{&c.locks, DefaultLocksTable},
		{&c.circuits, DefaultCircuitsTable},
		{&c.cache, DefaultCacheTable},
		{&c.idempotency, DefaultIdempotencyTable},
		{&c.checkpoints, DefaultCheckpointsTable},
		{&c.cpTasks, DefaultCheckpointTasksTable},
		{&c.events, DefaultEventsTable},
	}
	seen := map[string]bool{}
	for _, n := range names {
		if *n.p == "" {
			*n.p = n.def
		}
		if !identRe.MatchString(*n.p) || strings.HasPrefix(strings.ToLower(*n.p), "sqlite_") {
			return c, fmt.Errorf("sqlite: table name %q is not a plain SQL identifier", *n.p)
		}
		if seen[strings.ToLower(*n.p)] {
			return c, fmt.Errorf("sqlite: table name %q used twice", *n.p)
		}
		seen[strings.ToLower(*n.p)] = true
	}
	c.watchers = c.events + "_watchers"
	if seen[strings.ToLower(c.watchers)] {
		return c, fmt.Errorf("sqlite: table name %q is the watchers table of events table %q", c.watchers, c.events)
	}
	seen[strings.ToLower(c.watchers)] = true
	c.turns = c.locks + "_turns"
	if seen[strings.ToLower(c.turns)] {
		return c, fmt.Errorf("sqlite: table name %q is the waiters' table of locks table %q", c.turns, c.locks)
	}
	return c, nil
}

// dsn builds the modernc.org/sqlite data source name for path: a file: URI
// (so that any character of the path is safe) with the pragmas every
// connection runs when it opens. modernc.org/sqlite runs the _pragma
// parameters on each new connection of the pool, so every connection the
// store ever uses (the watcher's too) has them.
//
// synchronous=FULL: in WAL mode, SQLite then syncs the WAL at every commit,
// so a commit has reached the disk when the statement returns. With NORMAL
// it syncs only at checkpoints, and a power loss can roll back the last
// commits: an acquire, claim or fence the caller was told succeeded could
// vanish, and its fencing token be handed out again.
//
// extra is appended as it is: "&mode=ro", "&mode=ro&immutable=1" or "".
func dsn(path string, busy time.Duration, extra string) string {
	var b strings.Builder
	b.WriteString("file:")
	for i := 0; i < len(path); i++ {
		c := path[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("/._-~", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	ms := driver.Millis(min(busy, busyAttempt))
	b.WriteString("?_pragma=busy_timeout(" + strconv.FormatInt(ms, 10) + ")")
	b.WriteString("&_pragma=synchronous(" + syncMode + ")")
	b.WriteString("&_txlock=immediate")
	b.WriteString(extra)
	return b.String()
}

// sqlDriver is the database/sql driver the store opens: modernc.org/sqlite's
// (tests count statements with a driver wrapping it).
var sqlDriver = "sqlite"

// syncMode is the PRAGMA synchronous of every connection (see dsn).
const syncMode = "FULL"

// maxOpenConns bounds the connection pool. Writers of one process are
// serialised anyway; readers run in parallel under WAL.
const maxOpenConns = 16

// store is the SQLite driver store.
type store struct {
	db     *sql.DB
	cfg    config
	q      queries
	gate   *fileGate // one writer of this process at a time, per file
	hub    *hub
	turns  turns // this store's owners queued for a key (turns.go)
	closed atomic.Bool

	path      string // the database file
	immutable bool   // opened read-only and immutable (sees no other commits)

	stmtMu sync.Mutex
	stmts  map[string]*sql.Stmt // prepared statements by SQL text

	// key prefixes: namespace + kind tag
	lockPfx, circPfx, cachePfx string
}

func openStore(ctx context.Context, path string, opts *Options) (*store, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if path == "" {
		return nil, errors.New("sqlite: empty database path")
	}
	if path == ":memory:" || strings.HasPrefix(path, "file::memory:") {
		return nil, errors.New("sqlite: an in-memory database cannot be shared by the store's connections; use the memory:// store")
	}
	path = filepath.Clean(path)
	if err := checkDir(path); err != nil {
		return nil, err
	}
	if !cfg.readOnly {
		return openFile(ctx, path, cfg, "")
	}
	if _, err := os.Stat(path); err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("sqlite: opening %q read-only: %w", path, err)
	}
	s, err := openFile(ctx, path, cfg, "&mode=ro")
	if code := sqliteCode(err); code == sqlite3.SQLITE_CANTOPEN || code == sqlite3.SQLITE_READONLY {
		// A WAL file without its -shm in a directory this process cannot
		// write: no connection has it open, so what is committed is in
		// the file itself.
		s, err = openFile(ctx, path, cfg, "&mode=ro&immutable=1")
	}
	return s, err
}

// sqliteCode is the primary SQLite result code of err, or 0.
func sqliteCode(err error) int {
	var se *sqlitelib.Error
	if errors.As(err, &se) {
		return se.Code() & 0xFF
	}
	return 0
}

// openFile opens the database file at path with the dsn's extra
// parameters and initialises the store.
func openFile(ctx context.Context, path string, cfg config, extra string) (*store, error) {
	db, err := sql.Open(sqlDriver, dsn(path, cfg.busy, extra))
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(maxOpenConns)
	db.SetMaxIdleConns(maxOpenConns)
	s := &store{
		db:        db,
		cfg:       cfg,
		gate:      openGate(path),
		path:      path,
		immutable: strings.Contains(extra, "immutable=1"),
		stmts:     map[string]*sql.Stmt{},
		lockPfx:   cfg.prefix + driver.TagLock,
		circPfx:   cfg.prefix + driver.TagCircuit,
		cachePfx:  cfg.prefix + driver.TagCache,
	}
	s.hub = newHub(s)
	if err := s.init(ctx); err != nil {
		db.Close()
		s.gate.close()
		return nil, err
	}
	return s, nil
}

// fileGate queues the writers of every store of this process that opens
// one database file, so that SQLite's busy handler (which polls with
// sleeps and is not fair) only arbitrates between processes. Waiting on a
// channel is first come, first served.
type fileGate struct {
	key  string
	sem  chan struct{}
	refs int
}

var gates = struct {
	sync.Mutex
	m map[string]*fileGate
}{m: map[string]*fileGate{}}

// fileKey identifies a database file: its absolute path with the
// directory's symbolic links resolved.
func fileKey(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	dir, base := filepath.Split(abs)
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	return filepath.Join(dir, base)
}

func openGate(path string) *fileGate {
	key := fileKey(path)
	gates.Lock()
	defer gates.Unlock()
	g := gates.m[key]
	if g == nil {
		g = &fileGate{key: key, sem: make(chan struct{}, 1)}
		gates.m[key] = g
	}
	g.refs++
	return g
}

func (g *fileGate) close() {
	gates.Lock()
	defer gates.Unlock()
	if g.refs--; g.refs == 0 {
		delete(gates.m, g.key)
	}
}

// init switches the file to WAL and creates or upgrades the schema.
func (s *store) init(ctx context.Context) error {
	if !s.cfg.readOnly {
		if err := s.enableWAL(ctx); err != nil {
			return err
		}
	}
	var ok bool
	var legacy legacy
	err := s.retry(ctx, func() (err error) {
		ok, legacy, err = s.schemaCurrent(ctx)
		return err
	})
	if err != nil {
		return err
	}
	if !ok && s.cfg.readOnly {
		return errors.New("sqlite: the database lacks warden's tables or columns, and was opened read-only (mode=ro): open it read-write once, or run warden migrate, to create them")
	}
	if !ok {
		if legacy, err = s.migrate(ctx); err != nil {
			return err
		}
	}
	s.q = buildQueries(s.cfg, legacy)
	s.turns.off = legacy.noTurns
	return nil
}

// enableWAL sets journal_mode=WAL, which is persistent in the file. Setting
// it needs a moment of exclusive access when the file is new, so a busy
// answer (another process creating the file at the same time) is retried
// until the busy timeout.
func (s *store) enableWAL(ctx context.Context) error {
	deadline := time.Now().Add(s.cfg.busy)
	delay := time.Millisecond
	for {
		var mode string
		err := s.db.QueryRowContext(ctx, "PRAGMA journal_mode=WAL").Scan(&mode)
		if err == nil {
			if !strings.EqualFold(mode, "wal") {
				return fmt.Errorf("sqlite: the database cannot use WAL journaling (journal_mode is %q)", mode)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !isBusy(err) || time.Now().After(deadline) {
			return fmt.Errorf("sqlite: enabling WAL: %w", err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		if delay < 50*time.Millisecond {
			delay *= 2
		}
	}
}

// isBusy reports whether err is SQLite's SQLITE_BUSY or SQLITE_LOCKED.
func isBusy(err error) bool {
	var se *sqlitelib.Error
	if errors.As(err, &se) {
		code := se.Code() & 0xFF
		return code == sqlite3.SQLITE_BUSY || code == sqlite3.SQLITE_LOCKED
	}
	return false
}

// Name implements driver.Store.
func (s *store) Name() string { return "sqlite" }

// Limits implements driver.Store.
func (s *store) Limits() driver.Limits { return driver.Limits{MaxValueBytes: s.cfg.maxValue} }

// Locks implements driver.Store.
func (s *store) Locks() driver.Locks { return locks{s} }

// Circuits implements driver.Store.
func (s *store) Circuits() driver.Circuits { return circuits{s} }

// Cache implements driver.Store.
func (s *store) Cache() driver.Cache { return cache{s} }

// Idempotency implements driver.Store.
func (s *store) Idempotency() driver.Idempotency { return idempotency{s} }

// Checkpoints implements driver.Store.
func (s *store) Checkpoints() driver.Checkpoints { return checkpoints{s} }

// Ping implements driver.Store.
func (s *store) Ping(ctx context.Context) error {
	var one int
	return s.retry(ctx, func() error { return s.db.QueryRowContext(ctx, "SELECT 1").Scan(&one) })
}

// Close implements driver.Store: it stops the watcher, closes every watch
// channel and closes the database.
func (s *store) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	s.hub.Close()
	// The watcher goroutine deletes the registrations when it ends; this
	// deletes those it left (none ran, or its delete failed).
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.busy)
	s.hub.sync(ctx, nil)
	cancel()
	s.hub.closeRW()
	s.leaveAll()
	s.stmtMu.Lock()
	for _, st := range s.stmts {
		st.Close()
	}
	clear(s.stmts)
	s.stmtMu.Unlock()
	err := s.db.Close()
	s.gate.close()
	return err
}

// Migrate implements driver.Migrator: it creates missing tables, columns,
// indexes and triggers in one IMMEDIATE transaction.
func (s *store) Migrate(ctx context.Context) error {
	_, err := s.migrate(ctx)
	return ctxErr(ctx, err)
}

// ---------------------------------------------------------------------------
// helpers

// nowMs is the store clock: the process clock in Unix milliseconds.
func nowMs() int64 { return time.Now().UnixMilli() }

// msTime converts Unix milliseconds to a UTC time.
func msTime(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// nullMsTime converts a nullable Unix-milliseconds column to a time (zero if
// NULL).
func nullMsTime(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return msTime(v.Int64)
}

// ctxErr returns ctx's error in place of err when ctx ended: an interrupted
// SQLite call reports its own error, the contract wants the context's.
func ctxErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// busyAttempt is the busy timeout SQLite applies to one attempt. SQLite's
// own busy handler sleeps longer and longer (up to 100 ms) between tries,
// so a writer that has waited a while would rarely catch the lock between
// the back-to-back writes of other processes. The store therefore lets
// SQLite wait only a few milliseconds per attempt and retries SQLITE_BUSY
// itself, every millisecond or so, until Options.BusyTimeout.
const busyAttempt = 5 * time.Millisecond

// retry runs f until it succeeds or fails with an error other than
// SQLITE_BUSY, ctx ends, or the busy timeout has passed. f must be safe to
// repeat after SQLITE_BUSY: a statement or an IMMEDIATE transaction that
// got SQLITE_BUSY did nothing (SQLite takes the write lock, or the read
// snapshot, before it reads or writes anything).
func (s *store) retry(ctx context.Context, f func() error) error {
	var deadline time.Time
	var t *time.Timer
	for {
		err := f()
		if err == nil || !isBusy(err) || ctx.Err() != nil {
			return ctxErr(ctx, err)
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(s.cfg.busy - busyAttempt)
		}
		if now.After(deadline) {
			return err
		}
		d := 200*time.Microsecond + rand.N(800*time.Microsecond)
		if t == nil {
			t = time.NewTimer(d)
			defer t.Stop()
		} else {
			t.Reset(d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// readRow runs a one-row read, retrying SQLITE_BUSY (which a reader meets
// only while another connection recovers the WAL).
func (s *store) readRow(ctx context.Context, query string, args ...any) rowScanner {
	return retryRow{s: s, ctx: ctx, query: query, args: args}
}

type retryRow struct {
	s     *store
	ctx   context.Context
	query string
	args  []any
}

func (r retryRow) Scan(dest ...any) error {
	return r.s.retry(r.ctx, func() error { return r.s.queryRow(r.ctx, nil, r.query, r.args...).Scan(dest...) })
}

// readQuery runs a read, retrying SQLITE_BUSY.
func (s *store) readQuery(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	var rows *sql.Rows
	err := s.retry(ctx, func() (err error) {
		rows, err = s.query(ctx, query, args...)
		return err
	})
	return rows, err
}

// write runs f as the only writer of this process on the store's file.
// SQLite admits one writer at a time; queueing in the process spares
// SQLite's busy-wait back-off to writers of the same process, so that only
// other processes' writers ever wait on it.
func (s *store) write(ctx context.Context, f func() error) error {
	select {
	case s.gate.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.gate.sem }()
	return s.retry(ctx, f)
}

// tx runs f in one BEGIN IMMEDIATE transaction (the pool's _txlock), as the
// process's only writer, and commits if f succeeds.
func (s *store) tx(ctx context.Context, f func(tx *sql.Tx) error) error {
	return s.write(ctx, func() error {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := f(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	})
}

// stmt returns query prepared, preparing it once per store: compiling a
// statement (with the triggers it fires) costs more than running it.
// database/sql re-prepares it on each pool connection as needed, and SQLite
// re-prepares it after a schema change.
func (s *store) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	s.stmtMu.Lock()
	st := s.stmts[query]
	s.stmtMu.Unlock()
	if st != nil {
		return st, nil
	}
	st, err := s.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	s.stmtMu.Lock()
	defer s.stmtMu.Unlock()
	if s.closed.Load() {
		st.Close()
		return nil, errClosed
	}
	if prev := s.stmts[query]; prev != nil {
		st.Close()
		return prev, nil
	}
	s.stmts[query] = st
	return st, nil
}

// errRow is a row whose Scan reports an error.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// withNS adds the named argument :ns, the store's namespace, to named
// arguments; every statement with named parameters may use it.
func (s *store) withNS(args []any) []any {
	if len(args) > 0 {
		if _, named := args[0].(sql.NamedArg); named {
			return append(args, sql.Named("ns", s.cfg.prefix))
		}
	}
	return args
}

// queryRow runs a prepared query returning at most one row, in tx if not
// nil.
func (s *store) queryRow(ctx context.Context, tx *sql.Tx, query string, args ...any) rowScanner {
	args = s.withNS(args)
	st, err := s.stmt(ctx, query)
	if err != nil {
		return errRow{err}
	}
	if tx != nil {
		st = tx.StmtContext(ctx, st)
	}
	return st.QueryRowContext(ctx, args...)
}

// query runs a prepared query.
func (s *store) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	args = s.withNS(args)
	st, err := s.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// exec runs a prepared statement.
func (s *store) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	args = s.withNS(args)
	st, err := s.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

// nsRange returns a condition restricting col to the strings that start
// with prefix, usable by the (namespace, col) index, and its arguments
// preceded by the namespace (for a query that starts with "namespace = ?").
func (s *store) nsRange(col, prefix string) (string, []any) {
	cond, args := keyRange(col, prefix)
	return cond, append([]any{s.cfg.prefix}, args...)
}

// keyRange returns a condition restricting col to the strings that start
// with prefix, and its arguments.
func keyRange(col, prefix string) (string, []any) {
	if prefix == "" {
		return "1", nil
	}
	hi, ok := successor(prefix)
	if !ok {
		return col + " >= ?", []any{prefix}
	}
	return "(" + col + " >= ? AND " + col + " < ?)", []any{prefix, hi}
}

// successor returns the smallest string greater than every string that
// starts with p, in byte order; ok=false if there is none.
func successor(p string) (string, bool) {
	b := []byte(p)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xFF {
			b[i]++
			return string(b[:i+1]), true
		}
	}
	return "", false
}

// nonNil returns v, or an empty non-nil slice: SQLite stores a nil slice
// as NULL.
func nonNil(v []byte) []byte {
	if v == nil {
		return []byte{}
	}
	return v
}

// nullMs returns a nullable expiry: NULL for a zero duration.
func expiry(now int64, d time.Duration) any {
	if d <= 0 {
		return nil
	}
	return now + driver.Millis(d)
}
