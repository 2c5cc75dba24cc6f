// Package postgres is warden's PostgreSQL store, built on pgx v5.
//
// It keeps warden's records in tables named as the go-go-scope adapters
// name theirs (plus a table of checkpoint fences), with keys in text
// columns of the "C" collation (compared and ordered byte for byte) and
// times in timestamptz(3). Every primitive is one statement: an
// INSERT … ON CONFLICT … DO UPDATE … WHERE … RETURNING or a conditional
// UPDATE … RETURNING, deciding expiry with the database clock
// (clock_timestamp(), read once per statement), so the clocks of the
// client machines do not matter. Lock and circuit changes are announced
// with pg_notify in the same statement, so a NOTIFY is delivered exactly
// when its change committed; each store that is watched keeps one
// dedicated LISTEN connection.
//
// Open a store with [Open] and a URL, with [New] on an existing
// *pgxpool.Pool, with [NewDB] on a *sql.DB of the pgx stdlib driver, or
// with warden.Open:
//
//	postgres://user:password@host:5432/dbname?sslmode=disable&prefix=billing:
//
// The postgresql:// scheme is accepted too. URL parameters: prefix,
// schema, max_value_bytes, auto_migrate (default true), and the
// connection parameters of pgx (sslmode, connect_timeout,
// application_name, pool_max_conns, …).
package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// Default table names: those of the go-go-scope adapters, plus warden's
// checkpoint fence table.
const (
	DefaultLocksTable       = "go_goscope_locks"
	DefaultCircuitsTable    = "go_goscope_circuit"
	DefaultCacheTable       = "go_goscope_cache"
	DefaultIdempotencyTable = "go_goscope_idempotency"
	DefaultCheckpointsTable = "go_goscope_checkpoints"
	// DefaultCheckpointTasksTable holds each task's checkpoint fence (its
	// greatest fencing token and last sequence).
	DefaultCheckpointTasksTable = "go_goscope_checkpoint_tasks"
)

// DefaultMaxValueBytes is the default value limit.
const DefaultMaxValueBytes = 16 << 20

// maxValueBytes is the largest limit accepted: a bytea holds at most 1 GiB.
const maxValueBytes = 1 << 30

// Options configure a PostgreSQL store. The zero value (or nil) is ready
// to use.
type Options struct {
	// Prefix is the store's namespace: empty, or a name followed by its
	// only ':' such as "billing:" (driver.ValidatePrefix).
	Prefix string
	// Schema is the PostgreSQL schema of the tables. "": unqualified
	// names, found through the connection's search_path (usually
	// "public").
	Schema string
	// MaxValueBytes is the largest cache value, idempotency result or
	// checkpoint payload accepted. 0: 16 MiB. At most 1 GiB.
	MaxValueBytes int
	// DisableAutoMigrate skips creating the tables when the store opens;
	// call Migrate (warden.Store's Migrate) yourself. The zero value
	// migrates automatically.
	DisableAutoMigrate bool
	// Tables names the tables. Empty fields take the defaults.
	Tables Tables
	// Logger receives the store's warnings (the LISTEN connection
	// dropping, say). Nil: slog.Default().
	Logger *slog.Logger
}

// Tables names the store's tables. An empty field means the default name.
// Names must be plain identifiers: letters, digits and underscores, at
// most 63 bytes.
type Tables struct {
	Locks           string // "": go_goscope_locks
	Circuits        string // "": go_goscope_circuit
	Cache           string // "": go_goscope_cache
	Idempotency     string // "": go_goscope_idempotency
	Checkpoints     string // "": go_goscope_checkpoints
	CheckpointTasks string // "": go_goscope_checkpoint_tasks
}

func init() {
	warden.Register("postgres", openURL)
	warden.Register("postgresql", openURL)
}

// New returns a store on pool, which stays open when the store closes.
// Unless opts.DisableAutoMigrate, the tables are created first. Watching
// locks or circuits opens one more connection with pool's settings, for
// LISTEN.
func New(pool *pgxpool.Pool, opts *Options) (*warden.Store, error) {
	if pool == nil {
		return nil, errors.New("postgres: New: nil pool")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := newStore(ctx, poolDB{p: pool}, opts)
	if err != nil {
		return nil, err
	}
	return warden.New(s, nil), nil
}

// NewDB returns a store on db, a database/sql handle of the pgx stdlib
// driver (github.com/jackc/pgx/v5/stdlib), which stays open when the
// store closes. Unless opts.DisableAutoMigrate, the tables are created
// first. Watching locks or circuits opens one more connection with the
// settings of db's connections, for LISTEN.
func NewDB(db *sql.DB, opts *Options) (*warden.Store, error) {
	if db == nil {
		return nil, errors.New("postgres: NewDB: nil *sql.DB")
	}
	if _, ok := db.Driver().(*stdlib.Driver); !ok {
		return nil, fmt.Errorf("postgres: NewDB needs a *sql.DB of the pgx stdlib driver, not %T", db.Driver())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := newStore(ctx, sqlDB{db: db, config: stdlibConfig(db)}, opts)
	if err != nil {
		return nil, err
	}
	return warden.New(s, nil), nil
}

// stdlibConfig returns the connection settings of db's connections.
func stdlibConfig(db *sql.DB) func(ctx context.Context) (*pgx.ConnConfig, error) {
	return func(ctx context.Context) (*pgx.ConnConfig, error) {
		c, err := db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		var cfg *pgx.ConnConfig
		err = c.Raw(func(dc any) error {
			sc, ok := dc.(*stdlib.Conn)
			if !ok {
				return fmt.Errorf("postgres: the *sql.DB's connections are %T, not pgx stdlib ones", dc)
			}
			cfg = sc.Conn().Config().Copy()
			return nil
		})
		return cfg, err
	}
}

// Open connects to the server named by a postgres:// or postgresql:// URL
// (or a pgx connection string) and returns a store that closes its pool
// when it closes. The URL's prefix, schema, max_value_bytes and
// auto_migrate parameters override opts.
func Open(ctx context.Context, connString string, opts *Options) (*warden.Store, error) {
	s, err := OpenDriver(ctx, connString, opts)
	if err != nil {
		return nil, err
	}
	return warden.New(s, nil), nil
}

// OpenDriver is Open without the warden.Store wrapper.
func OpenDriver(ctx context.Context, connString string, opts *Options) (driver.Store, error) {
	if strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://") {
		u, err := url.Parse(connString)
		if err != nil {
			return nil, fmt.Errorf("%w: postgres URL does not parse", driver.ErrBadURL)
		}
		cfg, o, err := parseURL(u, opts)
		if err != nil {
			return nil, err
		}
		return openConfig(ctx, cfg, o)
	}
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, errors.New("postgres: the connection string does not parse")
	}
	return openConfig(ctx, cfg, opts)
}

func openURL(ctx context.Context, u *url.URL, logger *slog.Logger) (driver.Store, error) {
	cfg, opts, err := parseURL(u, &Options{Logger: logger})
	if err != nil {
		return nil, err
	}
	return openConfig(ctx, cfg, opts)
}

// pgxParams are the URL parameters passed on to pgx: libpq's connection
// parameters that pgx understands and pgxpool's own.
var pgxParams = map[string]bool{
	"sslmode": true, "sslrootcert": true, "sslcert": true, "sslkey": true, "sslpassword": true,
	"sslsni": true, "sslnegotiation": true, "connect_timeout": true, "application_name": true,
	"target_session_attrs": true, "options": true, "search_path": true, "service": true,
	"servicefile": true, "passfile": true, "krbsrvname": true, "krbspn": true,
	"statement_cache_capacity": true, "description_cache_capacity": true, "default_query_exec_mode": true,
	"pool_max_conns": true, "pool_min_conns": true, "pool_min_idle_conns": true, "pool_max_conn_lifetime": true,
	"pool_max_conn_lifetime_jitter": true, "pool_max_conn_idle_time": true, "pool_health_check_period": true,
	"timezone": true, "TimeZone": true,
}

// parseURL splits a postgres:// URL into pgx's pool configuration and the
// store's options.
func parseURL(u *url.URL, base *Options) (*pgxpool.Config, *Options, error) {
	if (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Opaque != "" || u.Host == "" {
		return nil, nil, fmt.Errorf("%w: want postgres://user:password@host:port/database", driver.ErrBadURL)
	}
	o := Options{}
	if base != nil {
		o = *base
	}
	q := driver.NewParams(u)
	o.Prefix = q.String("prefix", o.Prefix)
	o.Schema = q.String("schema", o.Schema)
	o.MaxValueBytes = q.Int("max_value_bytes", o.MaxValueBytes)
	o.DisableAutoMigrate = !q.Bool("auto_migrate", !o.DisableAutoMigrate)
	pass := q.Rest()
	for name := range pass {
		if !pgxParams[name] {
			return nil, nil, fmt.Errorf("%w: unknown parameter %q", driver.ErrBadURL, name)
		}
	}
	if err := q.Err(); err != nil {
		return nil, nil, err
	}
	cu := *u
	cu.Scheme = "postgres"
	// Spaces as %20: pgx reads a '+' in the query literally (a literal '+'
	// is %2B after Encode).
	cu.RawQuery = strings.ReplaceAll(pass.Encode(), "+", "%20")
	cfg, err := pgxpool.ParseConfig(cu.String())
	if err != nil {
		return nil, nil, fmt.Errorf("%w: postgres: the connection parameters do not parse", driver.ErrBadURL)
	}
	if !pass.Has("pool_max_conns") && cfg.MaxConns < defaultMaxConns {
		cfg.MaxConns = defaultMaxConns
	}
	return cfg, &o, nil
}

// defaultMaxConns is the least pool size of a store opened by URL without
// pool_max_conns (pgx's default is the number of CPUs, at least 4).
const defaultMaxConns = 8

// openConfig opens a pool with cfg and a store on it.
func openConfig(ctx context.Context, cfg *pgxpool.Config, opts *Options) (driver.Store, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, ctxErr(ctx, fmt.Errorf("postgres: %v", err))
	}
	s, err := newStore(ctx, poolDB{p: pool, own: true}, opts)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// store is the PostgreSQL driver store.
type store struct {
	db       database
	prefix   string
	schema   string
	maxValue int
	t        Tables
	q        queries
	layout   []tableDef
	channel  string // the NOTIFY channel of the store's tables
	log      *slog.Logger
	hub      *hub

	lockPfx, circPfx, cachePfx string
}

func newStore(ctx context.Context, db database, opts *Options) (*store, error) {
	if opts == nil {
		opts = &Options{}
	}
	if err := driver.ValidatePrefix(opts.Prefix); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if opts.MaxValueBytes < 0 || opts.MaxValueBytes > maxValueBytes {
		return nil, fmt.Errorf("postgres: MaxValueBytes must be between 0 and %d", maxValueBytes)
	}
	if opts.Schema != "" && !identRe.MatchString(opts.Schema) {
		return nil, fmt.Errorf("postgres: schema name %q is not a plain identifier", opts.Schema)
	}
	t := opts.Tables
	seen := map[string]bool{}
	for _, n := range []struct {
		p   *string
		def string
	}{
		{&t.Locks, DefaultLocksTable}, {&t.Circuits, DefaultCircuitsTable}, {&t.Cache, DefaultCacheTable},
		{&t.Idempotency, DefaultIdempotencyTable}, {&t.Checkpoints, DefaultCheckpointsTable},
		{&t.CheckpointTasks, DefaultCheckpointTasksTable},
	} {
		if *n.p == "" {
			*n.p = n.def
		}
		if !identRe.MatchString(*n.p) {
			return nil, fmt.Errorf("postgres: table name %q is not a plain identifier", *n.p)
		}
		if seen[strings.ToLower(*n.p)] {
			return nil, fmt.Errorf("postgres: table name %q used twice", *n.p)
		}
		seen[strings.ToLower(*n.p)] = true
	}
	s := &store{db: db, prefix: opts.Prefix, schema: opts.Schema, t: t, log: opts.Logger,
		lockPfx: opts.Prefix + driver.TagLock, circPfx: opts.Prefix + driver.TagCircuit, cachePfx: opts.Prefix + driver.TagCache}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.maxValue = opts.MaxValueBytes
	if s.maxValue == 0 {
		s.maxValue = DefaultMaxValueBytes
	}
	h := fnv.New64a()
	h.Write([]byte(opts.Schema + "." + t.Locks + "." + t.Circuits))
	s.channel = fmt.Sprintf("warden_%016x", h.Sum64())
	s.q = buildQueries(t, s.ident, s.channel)
	s.layout = newLayout(t)
	s.hub = newHub(s)
	if err := ctxErr(ctx, db.ping(ctx)); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if !opts.DisableAutoMigrate {
		if err := s.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// ident returns a table's name, quoted and qualified with the schema.
func (s *store) ident(table string) string {
	if s.schema == "" {
		return pgx.Identifier{table}.Sanitize()
	}
	return pgx.Identifier{s.schema, table}.Sanitize()
}

// Name implements driver.Store.
func (s *store) Name() string { return "postgres" }

// Limits implements driver.Store.
func (s *store) Limits() driver.Limits { return driver.Limits{MaxValueBytes: s.maxValue} }

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
func (s *store) Ping(ctx context.Context) error { return s.wrap(ctx, s.db.ping(ctx)) }

// Close implements driver.Store: it ends the watches and their LISTEN
// connection, and closes the pool if the store opened it. A pool or
// *sql.DB handed to New or NewDB stays open.
func (s *store) Close() error {
	s.hub.Close()
	s.db.close()
	return nil
}

// ---------------------------------------------------------------------------
// helpers

// ctxErr returns ctx's error in place of err when ctx ended (or its
// deadline passed: a read cut by the deadline may fail a moment before
// ctx reports it).
func ctxErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if e := ctx.Err(); e != nil {
		return e
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return err
}

// wrap returns ctx's error if ctx ended, else err prefixed with the store
// name (nil stays nil).
func (s *store) wrap(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if e := ctxErr(ctx, err); e != err {
		return e
	}
	return fmt.Errorf("postgres: %w", err)
}

// retry runs f until it succeeds, fails with an error that is not a
// serialization failure or deadlock, or ctx ends.
func retry(ctx context.Context, f func() error) error {
	for attempt := 0; ; attempt++ {
		err := f()
		if err == nil || !retryable(err) || ctx.Err() != nil || attempt >= 20 {
			return err
		}
		t := time.NewTimer(time.Duration(1+rand.N(1+attempt)) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// exec runs one statement and returns the rows it affected.
func (s *store) exec(ctx context.Context, query string, args ...any) (int64, error) {
	var n int64
	err := retry(ctx, func() (err error) {
		n, err = s.db.exec(ctx, query, args...)
		return err
	})
	return n, s.wrap(ctx, err)
}

// row runs one statement that returns at most one row and scans it;
// found=false if it returned none.
func (s *store) row(ctx context.Context, query string, args []any, dest ...any) (bool, error) {
	err := retry(ctx, func() error { return s.db.queryRow(ctx, query, args...).Scan(dest...) })
	if isNoRows(err) {
		return false, nil
	}
	return err == nil, s.wrap(ctx, err)
}

// inTx runs f in one transaction (the session's isolation level),
// repeating it after a serialization failure or deadlock.
func (s *store) inTx(ctx context.Context, f func(tx txn) error) error {
	return s.wrap(ctx, s.inTxRaw(ctx, f))
}

// keyRange returns the bounds of the stored keys that start with prefix,
// in the "C" collation's byte order: lo ≤ key < hi, or lo ≤ key when hi is
// "" (no upper bound). Incrementing the last ASCII byte (and cutting what
// follows) keeps hi valid UTF-8.
func keyRange(prefix string) (lo, hi string) {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0x7F {
			b[i]++
			return prefix, string(b[:i+1])
		}
	}
	return prefix, ""
}

// millis converts a duration to whole milliseconds; nil for zero (no
// expiry).
func millis(d time.Duration) any {
	if d <= 0 {
		return nil
	}
	return driver.Millis(d)
}

func nonNil(v []byte) []byte {
	if v == nil {
		return []byte{}
	}
	return v
}

func utc(t sql.NullTime) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time.UTC().Truncate(time.Millisecond)
}
