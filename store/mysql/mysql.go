// Package mysql is warden's MySQL and MariaDB store.
//
// It keeps warden's records in InnoDB tables (by default those of the
// go-go-scope adapters, plus a table of checkpoint fences), which a Node
// service using go-go-scope's MySQL adapter can share (docs/backends.md
// says what such a fleet must configure). Keys are utf8mb4 text under a
// binary NO PAD collation, so they are compared and ordered by code point
// (UTF-8 byte order), case and trailing spaces included; times are
// DATETIME(3) in UTC. The database clock (UTC_TIMESTAMP(3)) decides expiry
// inside every statement, so the clocks of the client machines do not
// matter. MySQL has no notifications; instead the store queues lock
// waiters on the server's named locks (GET_LOCK), which wake the first
// waiter the moment a holder releases a key (driver.LockWaiter; the lock
// row still decides who holds it). The other portable packages poll.
//
// Open a store with [Open], with [New] on an existing *sql.DB, or with
// warden.Open and a URL:
//
//	mysql://user:password@host:3306/dbname?prefix=billing:
//
// URL parameters: prefix, max_value_bytes, auto_migrate (default true),
// timeout (dial timeout), tls (the go-sql-driver tls setting), handoff
// (default true; false: lock waiters poll) and handoff_conns (see
// Options.HandoffConns).
package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	mysqldrv "github.com/go-sql-driver/mysql"
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

// DefaultMaxValueBytes is the default value limit; it is lowered to fit
// the server's max_allowed_packet.
const DefaultMaxValueBytes = 16 << 20

// Options configure a MySQL store. The zero value (or nil) is ready to use.
type Options struct {
	// Prefix is the store's namespace: empty, or a name followed by its
	// only ':' such as "billing:" (driver.ValidatePrefix).
	Prefix string
	// MaxValueBytes is the largest cache value, idempotency result or
	// checkpoint payload accepted. 0: 16 MiB, lowered to what the server's
	// max_allowed_packet can carry.
	MaxValueBytes int
	// DisableAutoMigrate skips creating the tables when the store opens;
	// call Migrate (warden.Store's Migrate) yourself. The zero value
	// migrates automatically.
	DisableAutoMigrate bool
	// Tables names the tables. Empty fields take the defaults.
	Tables Tables
	// HandoffConns bounds the connections the store keeps out of its
	// pool for lock hand-off (docs/backends.md, "Lock hand-off"): one per
	// lock held — its named lock queues the waiters — and one per waiter
	// blocked on a named lock. Beyond the bound a holding takes no named
	// lock and a waiter polls, as without hand-off. 0: 8, at most a
	// quarter of the pool's MaxOpenConns; negative: no hand-off (waiters
	// poll; the store still leaves a key just handed to a queued waiter
	// of another store to that waiter).
	HandoffConns int
}

// Tables names the store's tables. An empty field means the default name.
// Names must be plain identifiers: letters, digits and underscores.
type Tables struct {
	Locks           string // "": go_goscope_locks
	Circuits        string // "": go_goscope_circuit
	Cache           string // "": go_goscope_cache
	Idempotency     string // "": go_goscope_idempotency
	Checkpoints     string // "": go_goscope_checkpoints
	CheckpointTasks string // "": go_goscope_checkpoint_tasks
}

func init() {
	warden.Register("mysql", openURL)
}

// New returns a store on db, an open database/sql handle of the
// github.com/go-sql-driver/mysql driver. The DSN must set parseTime=true;
// the store leaves db open when it closes. Unless opts.DisableAutoMigrate,
// the tables are created first. Sessions should use UTC (time_zone) and
// may set clientFoundRows; the store's statements work either way.
func New(db *sql.DB, opts *Options) (*warden.Store, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := newStore(ctx, db, false, opts)
	if err != nil {
		return nil, err
	}
	return warden.New(s, nil), nil
}

// Open connects to the server named by dsnOrURL — a mysql:// URL or a
// go-sql-driver DSN ("user:pass@tcp(host:3306)/db") — and returns a store
// that closes its connections when it closes. A URL's ?prefix= and other
// parameters override opts.
func Open(ctx context.Context, dsnOrURL string, opts *Options) (*warden.Store, error) {
	s, err := OpenDriver(ctx, dsnOrURL, opts)
	if err != nil {
		return nil, err
	}
	return warden.New(s, nil), nil
}

// OpenDriver is Open without the warden.Store wrapper.
func OpenDriver(ctx context.Context, dsnOrURL string, opts *Options) (driver.Store, error) {
	var cfg *mysqldrv.Config
	if strings.HasPrefix(dsnOrURL, "mysql://") {
		u, err := url.Parse(dsnOrURL)
		if err != nil {
			return nil, fmt.Errorf("%w: mysql URL does not parse", driver.ErrBadURL)
		}
		c, o, err := parseURL(u, opts)
		if err != nil {
			return nil, err
		}
		cfg, opts = c, o
	} else {
		c, err := mysqldrv.ParseDSN(dsnOrURL)
		if err != nil {
			return nil, errors.New("mysql: the DSN does not parse")
		}
		cfg = c
	}
	return openConfig(ctx, cfg, opts)
}

func openURL(ctx context.Context, u *url.URL, _ *slog.Logger) (driver.Store, error) {
	cfg, opts, err := parseURL(u, nil)
	if err != nil {
		return nil, err
	}
	return openConfig(ctx, cfg, opts)
}

// parseURL translates a mysql:// URL to the driver's configuration.
func parseURL(u *url.URL, base *Options) (*mysqldrv.Config, *Options, error) {
	if u.Scheme != "mysql" || u.Opaque != "" || u.Host == "" {
		return nil, nil, fmt.Errorf("%w: want mysql://user:password@host:port/database", driver.ErrBadURL)
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return nil, nil, fmt.Errorf("%w: a mysql URL needs one database name in its path", driver.ErrBadURL)
	}
	cfg := mysqldrv.NewConfig()
	cfg.Net = "tcp"
	cfg.Addr = u.Host
	if u.Port() == "" {
		cfg.Addr = u.Host + ":3306"
	}
	cfg.DBName = db
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	o := Options{}
	if base != nil {
		o = *base
	}
	q := driver.NewParams(u)
	o.Prefix = q.String("prefix", o.Prefix)
	o.MaxValueBytes = q.Int("max_value_bytes", o.MaxValueBytes)
	o.DisableAutoMigrate = !q.Bool("auto_migrate", !o.DisableAutoMigrate)
	off := o.HandoffConns < 0
	o.HandoffConns = q.Int("handoff_conns", max(o.HandoffConns, 0))
	if !q.Bool("handoff", !off) {
		o.HandoffConns = -1
	}
	cfg.Timeout = q.Duration("timeout", 10*time.Second)
	if t := q.String("tls", ""); t != "" {
		switch t {
		case "true", "false", "skip-verify", "preferred":
			cfg.TLSConfig = t
		default:
			return nil, nil, fmt.Errorf("%w: tls must be true, false, skip-verify or preferred", driver.ErrBadURL)
		}
	}
	if err := q.Err(); err != nil {
		return nil, nil, err
	}
	return cfg, &o, nil
}

// openConfig opens a pool with the settings the store needs.
func openConfig(ctx context.Context, cfg *mysqldrv.Config, opts *Options) (driver.Store, error) {
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.MultiStatements = false
	cfg.ClientFoundRows = true
	cfg.InterpolateParams = true
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+00:00'"
	conn, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("mysql: %v", err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	db.SetConnMaxLifetime(time.Hour)
	s, err := newStore(ctx, db, true, opts)
	if err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// store is the MySQL driver store.
type store struct {
	db       *sql.DB
	ownDB    bool
	prefix   string
	maxValue int
	t        Tables
	q        queries
	layout   []tableDef

	lockPfx, circPfx, cachePfx string

	ho *handoff // lock hand-off through named locks (handoff.go)
}

func newStore(ctx context.Context, db *sql.DB, own bool, opts *Options) (*store, error) {
	if opts == nil {
		opts = &Options{}
	}
	if err := driver.ValidatePrefix(opts.Prefix); err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	if opts.MaxValueBytes < 0 {
		return nil, errors.New("mysql: negative MaxValueBytes")
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
			return nil, fmt.Errorf("mysql: table name %q is not a plain identifier", *n.p)
		}
		if seen[strings.ToLower(*n.p)] {
			return nil, fmt.Errorf("mysql: table name %q used twice", *n.p)
		}
		seen[strings.ToLower(*n.p)] = true
	}
	s := &store{db: db, ownDB: own, prefix: opts.Prefix, t: t,
		lockPfx: opts.Prefix + driver.TagLock, circPfx: opts.Prefix + driver.TagCircuit, cachePfx: opts.Prefix + driver.TagCache}
	coll, err := keyCollation(ctx, db)
	if err != nil {
		return nil, err
	}
	s.layout = newLayout(t, coll)
	var packet int64
	if err := db.QueryRowContext(ctx, "SELECT @@max_allowed_packet").Scan(&packet); err != nil {
		return nil, ctxErr(ctx, fmt.Errorf("mysql: %w", err))
	}
	// Values travel escaped inside the statement (up to twice their size).
	fit := int((packet - 64<<10) / 2)
	s.maxValue = opts.MaxValueBytes
	if s.maxValue == 0 {
		s.maxValue = min(DefaultMaxValueBytes, fit)
	}
	if !opts.DisableAutoMigrate {
		if err := s.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	// The checkpoints' timestamp holds Unix milliseconds (BIGINT, as
	// go-go-scope's adapter and warden create it), or times (the
	// DATETIME(3) of tables earlier warden releases created, kept).
	var tsType string
	err = db.QueryRowContext(ctx, `SELECT LOWER(DATA_TYPE) FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'timestamp'`, t.Checkpoints).Scan(&tsType)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, ctxErr(ctx, fmt.Errorf("mysql: %w", err))
	}
	s.q = buildQueries(t, strings.HasSuffix(tsType, "int"))
	if s.ho, err = newHandoff(ctx, s, opts.HandoffConns); err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	return s, nil
}

// keyCollation returns the collation of key columns: utf8mb4's binary NO
// PAD collation (MySQL 8's utf8mb4_0900_bin, MariaDB's utf8mb4_nopad_bin),
// under which "a" and "a " are different keys.
func keyCollation(ctx context.Context, db *sql.DB) (string, error) {
	var coll string
	err := db.QueryRowContext(ctx, `SELECT COLLATION_NAME FROM information_schema.COLLATIONS
		WHERE COLLATION_NAME IN ('utf8mb4_0900_bin', 'utf8mb4_nopad_bin') ORDER BY COLLATION_NAME LIMIT 1`).Scan(&coll)
	if errors.Is(err, sql.ErrNoRows) {
		return "", errors.New("mysql: the server has no binary NO PAD utf8mb4 collation (utf8mb4_0900_bin or utf8mb4_nopad_bin): warden needs MySQL 8.0 or MariaDB 10.2 or later")
	}
	if err != nil {
		return "", ctxErr(ctx, fmt.Errorf("mysql: %w", err))
	}
	return coll, nil
}

// Name implements driver.Store.
func (s *store) Name() string { return "mysql" }

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
func (s *store) Ping(ctx context.Context) error { return ctxErr(ctx, s.db.PingContext(ctx)) }

// Close implements driver.Store. A *sql.DB handed to New stays open.
func (s *store) Close() error {
	s.ho.close()
	if s.ownDB {
		return s.db.Close()
	}
	return nil
}

// ---------------------------------------------------------------------------
// helpers

// ctxErr returns ctx's error in place of err when ctx ended (or its
// deadline passed: a dial or read cut by the deadline may fail a moment
// before ctx reports it).
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

// retryable reports InnoDB deadlocks (1213) and lock wait timeouts (1205):
// the statement or transaction was rolled back and may be repeated.
func retryable(err error) bool {
	var me *mysqldrv.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
}

// retries counts deadlocks and lock wait timeouts the store retried (for
// the stress test).
var retries atomic.Int64

// retry runs f until it succeeds, fails otherwise, or ctx ends. f must be
// safe to repeat after a deadlock (InnoDB rolled it back).
func retry(ctx context.Context, f func() error) error {
	for attempt := 0; ; attempt++ {
		err := f()
		if err == nil || !retryable(err) || ctx.Err() != nil || attempt >= 20 {
			return ctxErr(ctx, err)
		}
		retries.Add(1)
		t := time.NewTimer(time.Duration(1+rand.N(1+attempt)) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// exec runs one statement (retrying deadlocks) and returns its result.
func (s *store) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	var res sql.Result
	err := retry(ctx, func() (err error) {
		res, err = s.db.ExecContext(ctx, query, args...)
		return err
	})
	return res, err
}

// execCount runs one statement and returns the rows it matched.
func (s *store) execCount(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := s.exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// marked runs an UPDATE whose SQL calls LAST_INSERT_ID(expr) and returns
// that value from the OK packet (0 if the statement did not call it). An
// UPDATE never inserts, so no AUTO_INCREMENT value takes its place.
func (s *store) marked(ctx context.Context, q querier, query string, args ...any) (int64, error) {
	res, err := q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

// outcome runs an upsert that leaves its outcome in @warden_out, then
// read, which reads @warden_out, on the same connection (q itself when it
// is a transaction), retrying deadlocks.
func (s *store) outcome(ctx context.Context, q querier, query string, args []any, read func(q querier) error) error {
	if q != nil {
		if _, err := q.ExecContext(ctx, query, args...); err != nil {
			return err
		}
		return read(q)
	}
	return retry(ctx, func() error {
		conn, err := s.db.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, query, args...); err != nil {
			return err
		}
		return read(conn)
	})
}

// jsonArg is a value as the JSON-or-bytes columns take it (jsonVal): the
// value as a string when it is UTF-8 JSON, or NULL.
func jsonArg(v []byte) any {
	if utf8.Valid(v) && json.Valid(v) {
		return string(v)
	}
	return nil
}

// valueOf returns the value of a JSON-or-bytes pair of columns: the JSON
// column when set (the go-go-scope adapters write only that one), else the
// bytes column.
func valueOf(js, bin []byte) []byte {
	if js != nil {
		return js
	}
	return nonNil(bin)
}

// querier is what *sql.DB, *sql.Conn and *sql.Tx have in common.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// tx runs f in one READ COMMITTED transaction (no gap locks on reads),
// retrying deadlocks.
func (s *store) tx(ctx context.Context, f func(tx *sql.Tx) error) error {
	return s.txIso(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted}, f)
}

// rowTx runs f in one transaction of the session's isolation level, for
// work on one row by primary key (one round trip less than tx).
func (s *store) rowTx(ctx context.Context, f func(tx *sql.Tx) error) error {
	return s.txIso(ctx, nil, f)
}

func (s *store) txIso(ctx context.Context, opts *sql.TxOptions, f func(tx *sql.Tx) error) error {
	return retry(ctx, func() error {
		tx, err := s.db.BeginTx(ctx, opts)
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

// keyRange restricts col to strings starting with prefix (index-usable).
// Key columns order by code point (binary collation), so the bound is the
// prefix with its last code point that has a successor incremented. The
// arguments are strings, compared under the column's collation.
func keyRange(col, prefix string) (string, []any) {
	rs := []rune(prefix)
	for i := len(rs) - 1; i >= 0; i-- {
		if rs[i] < utf8.MaxRune {
			next := rs[i] + 1
			if next == 0xD800 { // surrogates are not characters
				next = 0xE000
			}
			hi := string(rs[:i]) + string(next)
			return "(" + col + " >= ? AND " + col + " < ?)", []any{prefix, hi}
		}
	}
	return col + " >= ?", []any{prefix}
}

// likeCond is a LIKE on col's characters (not bytes), for a pattern.
func likeCond(col string) string {
	return "CONVERT(" + col + " USING utf8mb4) COLLATE utf8mb4_bin LIKE ? ESCAPE '!'"
}

// usec converts a duration to whole milliseconds, as microseconds for
// TIMESTAMPADD; nil for a zero duration (no expiry).
func usec(d time.Duration) any {
	if d <= 0 {
		return nil
	}
	return driver.Millis(d) * 1000
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

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }
