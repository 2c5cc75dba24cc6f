// Package mongo is warden's MongoDB store.
//
// It keeps warden's records in the collections of the go-go-scope MongoDB
// adapter (go_goscope_locks, go_goscope_circuit, go_goscope_cache,
// go_goscope_idempotency, go_goscope_checkpoints), plus a collection of
// checkpoint fences and a capped collection of lock and circuit events.
// Every operation is one conditional update (findOneAndUpdate, updateOne
// with upsert, …) using classic update operators only, so it works on
// MongoDB 5 and later and on MongoDB-compatible servers such as FerretDB.
//
// Expiry is decided by the client's clock: MongoDB has no "now" usable in a
// query filter without aggregation expressions. The clocks of the machines
// sharing a database must agree to well within the lock TTLs (NTP keeps
// them within milliseconds); see docs/design.md.
//
// Lock and circuit changes are published to every process through a capped
// collection read with a tailable, awaitData cursor (no replica set
// needed), so lock waiters wake on a release instead of polling.
//
// Open a store with [Open], with [New] on an existing *mongo.Database, or
// with warden.Open and a URL:
//
//	mongodb://user:password@host:27017/dbname?prefix=billing:
//	mongodb+srv://user:password@cluster.example.net/?database=dbname
//
// URL parameters: database (instead of the path), prefix,
// max_value_bytes, auto_migrate (default true), auto_index (default true),
// events (default true), events_collection, events_size,
// events_retention, timeout
// (connect and server selection), the collection names locks_collection,
// circuits_collection, cache_collection, idempotency_collection,
// checkpoints_collection, fences_collection; every other parameter is a
// MongoDB connection-string option (w, replicaSet, authSource, tls, …).
//
// Whatever the URL (or the database handed to New) says, locks,
// circuits, idempotency keys, checkpoints and fences are read from the
// primary with majority read concern and written with majority write
// concern, so that no read of coordination state comes from a lagging
// secondary and nothing granted is rolled back by a failover. The
// connection string's read preference, read concern and write concern
// apply to the cache and the event collection.
package mongo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/handoff"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"
)

// Default collection names: those of the go-go-scope adapter, plus warden's
// checkpoint fences and event collection.
const (
	DefaultLocksCollection       = "go_goscope_locks"
	DefaultCircuitsCollection    = "go_goscope_circuit"
	DefaultCacheCollection       = "go_goscope_cache"
	DefaultIdempotencyCollection = "go_goscope_idempotency"
	DefaultCheckpointsCollection = "go_goscope_checkpoints"
	// DefaultFencesCollection holds each task's checkpoint fence (its
	// greatest fencing token and last sequence).
	DefaultFencesCollection = "go_goscope_checkpoint_tasks"
	// DefaultEventsCollection is the capped collection of lock and circuit
	// events.
	DefaultEventsCollection = "go_goscope_events"
)

// DefaultMaxValueBytes is the default value limit: MongoDB's 16 MiB
// document limit less room for the record's other fields.
const DefaultMaxValueBytes = 16<<20 - 64<<10

// maxDocValueBytes is the largest value limit accepted.
const maxDocValueBytes = DefaultMaxValueBytes

// DefaultEventsSize is the default size of the capped event collection.
const DefaultEventsSize = 8 << 20

// DefaultEventsRetention is how long events are kept by default.
const DefaultEventsRetention = time.Minute

// DefaultHandoffPoll is how often the first waiter in a lock's queue reads
// the lock document while it waits.
const DefaultHandoffPoll = 10 * time.Millisecond

// Options configure a MongoDB store. The zero value (or nil) is ready to
// use.
type Options struct {
	// Prefix is the store's namespace: empty, or a name followed by its
	// only ':' such as "billing:" (driver.ValidatePrefix).
	Prefix string
	// MaxValueBytes is the largest cache value, idempotency result or
	// checkpoint payload accepted. 0: DefaultMaxValueBytes (16 MiB less
	// 64 KiB), which is also the largest accepted.
	MaxValueBytes int
	// DisableAutoMigrate skips creating collections and indexes when the
	// store opens; call Migrate (warden.Store's Migrate) yourself. The zero
	// value migrates automatically.
	DisableAutoMigrate bool
	// DisableAutoIndex makes Migrate (automatic or not) create only the
	// event collection, leaving every index to the operator. The zero
	// value creates the indexes.
	DisableAutoIndex bool
	// DisableEvents stops this store from writing lock and circuit events.
	// Watchers (its own and other processes') then see nothing of its
	// changes, and lock waiters fall back to polling. The zero value writes
	// an event after every lock and circuit change.
	DisableEvents bool
	// EventsSize is the capped event collection's size in bytes when this
	// store creates it. 0: DefaultEventsSize (8 MiB).
	EventsSize int64
	// EventsRetention is how long events are kept: the store's event
	// writer deletes older ones now and then (servers that do not cap the
	// collection themselves, such as FerretDB, need it). A watcher whose
	// cursor is down longer than this may be told events were lost.
	// 0: DefaultEventsRetention (one minute).
	EventsRetention time.Duration
	// Collections names the collections. Empty fields take the defaults.
	Collections Collections
	// Logger receives the store's warnings (a server without TTL indexes,
	// event writes that failed). Nil: slog.Default().
	Logger *slog.Logger
	// DisableHandoff stops the store from queueing its lock waiters in the
	// lock document (lock.Locker's waiters then back off, woken by the
	// events, and a releaser that asks again at once can take the key
	// back before them). The zero value queues them: a release hands the
	// key to the waiter that queued first, across processes. Releases
	// hand off to the waiters other stores queued either way.
	DisableHandoff bool
	// HandoffPoll is how often the first waiter in a lock's queue reads
	// the lock document (one find by _id) to take a hand-off sooner than
	// the events tell it; the other waiters read it when an event of the
	// key arrives. 0: DefaultHandoffPoll (10 ms): at most 100 reads a
	// second per lock while someone waits for it.
	HandoffPoll time.Duration

	// tailing replaces the event watcher's timing the capability probe
	// chooses (tests).
	tailing *tailTiming
	// ownWatchCache gives the store a cache of the watchers of its own,
	// as if it were the only store of its process (tests).
	ownWatchCache bool
}

// Collections names the store's collections. An empty field means the
// default name.
type Collections struct {
	Locks       string // "": go_goscope_locks
	Circuits    string // "": go_goscope_circuit
	Cache       string // "": go_goscope_cache
	Idempotency string // "": go_goscope_idempotency
	Checkpoints string // "": go_goscope_checkpoints
	Fences      string // "": go_goscope_checkpoint_tasks
	Events      string // "": go_goscope_events
}

func init() {
	warden.Register("mongodb", openURL)
	warden.Register("mongodb+srv", openURL)
}

// New returns a store on db. The store leaves db's client connected when
// it closes. Unless opts.DisableAutoMigrate, collections and indexes are
// created first. db's read preference, read concern and write concern
// apply to the cache and the events; coordination state always uses the
// primary and majority concerns (see the package documentation).
func New(db *mongo.Database, opts *Options) (*warden.Store, error) {
	if db == nil {
		return nil, errors.New("mongo: nil database")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := newStore(ctx, db, false, opts)
	if err != nil {
		return nil, err
	}
	return warden.New(s, &warden.Options{Logger: opts.logger()}), nil
}

// Open connects to the server named by a mongodb:// or mongodb+srv:// URL
// and returns a store that disconnects when it closes. The URL's
// parameters override opts.
func Open(ctx context.Context, rawURL string, opts *Options) (*warden.Store, error) {
	s, err := OpenDriver(ctx, rawURL, opts)
	if err != nil {
		return nil, err
	}
	return warden.New(s, &warden.Options{Logger: opts.logger()}), nil
}

// OpenDriver is Open without the warden.Store wrapper.
func OpenDriver(ctx context.Context, rawURL string, opts *Options) (driver.Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: the mongodb URL does not parse", driver.ErrBadURL)
	}
	cfg, err := parseURL(u, opts)
	if err != nil {
		return nil, err
	}
	return openConfig(ctx, cfg)
}

func openURL(ctx context.Context, u *url.URL, logger *slog.Logger) (driver.Store, error) {
	cfg, err := parseURL(u, &Options{Logger: logger})
	if err != nil {
		return nil, err
	}
	return openConfig(ctx, cfg)
}

func (o *Options) logger() *slog.Logger {
	if o == nil || o.Logger == nil {
		return slog.Default()
	}
	return o.Logger
}

// urlConfig is a parsed store URL.
type urlConfig struct {
	uri      string // the connection string handed to the MongoDB driver
	database string
	timeout  time.Duration
	opts     Options
	secrets  []string // to redact from the driver's errors
}

// parseURL splits a store URL into the driver's connection string and the
// store's options.
func parseURL(u *url.URL, base *Options) (*urlConfig, error) {
	if (u.Scheme != "mongodb" && u.Scheme != "mongodb+srv") || u.Opaque != "" || u.Host == "" {
		return nil, fmt.Errorf("%w: want mongodb://user:password@host:port/database", driver.ErrBadURL)
	}
	c := &urlConfig{}
	if base != nil {
		c.opts = *base
	}
	if u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			c.secrets = append(c.secrets, p, url.QueryEscape(p), url.PathEscape(p))
		}
	}
	q := driver.NewParams(u)
	o := &c.opts
	o.Prefix = q.String("prefix", o.Prefix)
	o.MaxValueBytes = q.Int("max_value_bytes", o.MaxValueBytes)
	o.DisableAutoMigrate = !q.Bool("auto_migrate", !o.DisableAutoMigrate)
	o.DisableAutoIndex = !q.Bool("auto_index", !o.DisableAutoIndex)
	o.DisableEvents = !q.Bool("events", !o.DisableEvents)
	o.EventsSize = int64(q.Int("events_size", int(o.EventsSize)))
	o.EventsRetention = q.Duration("events_retention", o.EventsRetention)
	o.DisableHandoff = !q.Bool("handoff", !o.DisableHandoff)
	o.HandoffPoll = q.Duration("handoff_poll", o.HandoffPoll)
	for _, n := range []struct {
		name string
		p    *string
	}{
		{"locks_collection", &o.Collections.Locks}, {"circuits_collection", &o.Collections.Circuits},
		{"cache_collection", &o.Collections.Cache}, {"idempotency_collection", &o.Collections.Idempotency},
		{"checkpoints_collection", &o.Collections.Checkpoints}, {"fences_collection", &o.Collections.Fences},
		{"events_collection", &o.Collections.Events},
	} {
		*n.p = q.String(n.name, *n.p)
	}
	c.timeout = q.Duration("timeout", 10*time.Second)
	dbParam := q.String("database", "")
	path := strings.TrimPrefix(u.Path, "/")
	switch {
	case dbParam != "" && path != "" && dbParam != path:
		return nil, fmt.Errorf("%w: the database is named twice (path %q, ?database=%q)", driver.ErrBadURL, path, dbParam)
	case dbParam != "":
		c.database = dbParam
	default:
		c.database = path
	}
	if c.database == "" {
		return nil, fmt.Errorf("%w: a mongodb URL needs a database: mongodb://host/dbname or ?database=dbname", driver.ErrBadURL)
	}
	if strings.ContainsAny(c.database, "/\\. \"$\x00") || len(c.database) > 63 {
		return nil, fmt.Errorf("%w: %q is not a valid MongoDB database name", driver.ErrBadURL, c.database)
	}
	rest := q.Rest()
	if err := q.Err(); err != nil {
		return nil, err
	}
	for k, vs := range rest {
		for _, v := range vs {
			if driver.SecretParam(k) && v != "" {
				c.secrets = append(c.secrets, v, url.QueryEscape(v))
			}
		}
	}
	// The connection string keeps the database as authSource default (the
	// path), as MongoDB defines it.
	cu := *u
	cu.RawQuery = rest.Encode()
	if dbParam != "" && path == "" {
		cu.Path = "/"
	}
	c.uri = cu.String()
	// Check the driver's parameters without resolving an SRV name.
	check := cu
	if check.Scheme == "mongodb+srv" {
		check.Scheme = "mongodb"
	}
	cs, err := connstring.Parse(check.String())
	if err != nil {
		return nil, fmt.Errorf("%w: %s", driver.ErrBadURL, c.redact(err.Error()))
	}
	if len(cs.UnknownOptions) > 0 {
		var names []string
		for k := range cs.UnknownOptions {
			names = append(names, k)
		}
		return nil, fmt.Errorf("%w: unknown parameter(s) %s", driver.ErrBadURL, strings.Join(names, ", "))
	}
	return c, nil
}

// redact removes the URL's secrets from a message.
func (c *urlConfig) redact(msg string) string {
	for _, s := range c.secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	return msg
}

// redactedError is an error whose message had secrets removed; errors.Is
// still sees the sentinel errors it wraps.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// openConfig connects and opens the store.
func openConfig(ctx context.Context, c *urlConfig) (driver.Store, error) {
	co := options.Client().ApplyURI(c.uri)
	if co.ConnectTimeout == nil {
		co.SetConnectTimeout(c.timeout)
	}
	if co.ServerSelectionTimeout == nil {
		co.SetServerSelectionTimeout(c.timeout)
	}
	client, err := mongo.Connect(co)
	if err != nil {
		return nil, fmt.Errorf("mongo: connect: %s", c.redact(err.Error()))
	}
	s, err := newStoreOn(ctx, client.Database(c.database), true, c.uri, &c.opts)
	if err != nil {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = client.Disconnect(dctx)
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		return nil, &redactedError{msg: c.redact(err.Error()), err: err}
	}
	return s, nil
}

var collRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]{0,119}$`)

// store is the MongoDB driver store.
type store struct {
	db          *mongo.Database
	ownDB       bool
	prefix      string
	maxValue    int
	names       Collections
	log         *slog.Logger
	autoIdx     bool
	evSize      int64
	evRetention time.Duration

	locks, circs, cache, idem, cps, fences, events *mongo.Collection

	lockPfx, circPfx, cachePfx string

	ev *evWriter // nil when events are disabled
	// watchers holds the registrations of the stores that watch (the
	// events collection's name + "_watchers"); wc is what this process's
	// writers know of them (watchers.go).
	watchers *mongo.Collection
	wc       *watchCache
	dropped  func(ev evDoc, decided time.Time) // tests: called for each event dropped because nobody watched when decided
	server   string                            // the connection string of a store opened by URL
	tailing  tailTiming                        // how the event watcher waits on this server (the capability probe's only choice)
	hub      *hub

	// handoff: WaitLock queues waiters (Options.DisableHandoff); handPoll:
	// Options.HandoffPoll; book: this store's owners in the lock
	// documents' queues; qhints: the queues its writes last saw
	// (handoff.go).
	handoff  bool
	handPoll time.Duration
	book     handoff.Book
	qhints   queueHints

	tries int               // attempts of each retry loop before it gives up: retryLimit (tests lower it)
	race  func(site string) // tests: called where a retry loop can lose a race (see raced)
}

func newStore(ctx context.Context, db *mongo.Database, own bool, opts *Options) (*store, error) {
	return newStoreOn(ctx, db, own, "", opts)
}

func newStoreOn(ctx context.Context, db *mongo.Database, own bool, server string, opts *Options) (*store, error) {
	if opts == nil {
		opts = &Options{}
	}
	if err := driver.ValidatePrefix(opts.Prefix); err != nil {
		return nil, fmt.Errorf("mongo: %w", err)
	}
	if opts.MaxValueBytes < 0 || opts.MaxValueBytes > maxDocValueBytes {
		return nil, fmt.Errorf("mongo: MaxValueBytes must be between 0 and %d (MongoDB's document limit less room for the other fields)", maxDocValueBytes)
	}
	if opts.EventsSize < 0 {
		return nil, errors.New("mongo: negative EventsSize")
	}
	if opts.HandoffPoll < 0 {
		return nil, errors.New("mongo: negative HandoffPoll")
	}
	n := opts.Collections
	seen := map[string]bool{}
	for _, c := range []struct {
		p   *string
		def string
	}{
		{&n.Locks, DefaultLocksCollection}, {&n.Circuits, DefaultCircuitsCollection}, {&n.Cache, DefaultCacheCollection},
		{&n.Idempotency, DefaultIdempotencyCollection}, {&n.Checkpoints, DefaultCheckpointsCollection},
		{&n.Fences, DefaultFencesCollection}, {&n.Events, DefaultEventsCollection},
	} {
		if *c.p == "" {
			*c.p = c.def
		}
		if !collRe.MatchString(*c.p) || strings.HasPrefix(*c.p, "system.") {
			return nil, fmt.Errorf("mongo: collection name %q is not a plain name", *c.p)
		}
		if seen[*c.p] {
			return nil, fmt.Errorf("mongo: collection name %q used twice", *c.p)
		}
		seen[*c.p] = true
	}
	if w := n.Events + "_watchers"; seen[w] {
		return nil, fmt.Errorf("mongo: collection name %q is the watchers collection of event collection %q", w, n.Events)
	}
	s := &store{db: db, ownDB: own, server: server, prefix: opts.Prefix, names: n, log: opts.logger(),
		autoIdx: !opts.DisableAutoIndex, evSize: opts.EventsSize, handoff: !opts.DisableHandoff, handPoll: opts.HandoffPoll,
		lockPfx: opts.Prefix + driver.TagLock, circPfx: opts.Prefix + driver.TagCircuit, cachePfx: opts.Prefix + driver.TagCache}
	if s.evSize == 0 {
		s.evSize = DefaultEventsSize
	}
	if s.handPoll == 0 {
		s.handPoll = DefaultHandoffPoll
	}
	s.evRetention = opts.EventsRetention
	if s.evRetention <= 0 {
		s.evRetention = DefaultEventsRetention
	}
	s.maxValue = opts.MaxValueBytes
	if s.maxValue == 0 {
		s.maxValue = DefaultMaxValueBytes
	}
	s.tries = retryLimit
	// Coordination state is read from the primary with majority read
	// concern and written with majority write concern, whatever the URL
	// or the database handed to New asks for: a read after a collision
	// (E11000) or after an ambiguous write must see the write that won,
	// and a holding, claim or fence must survive a failover once granted.
	// The cache and the event collection follow the URL.
	coord := options.Collection().SetReadPreference(readpref.Primary()).
		SetReadConcern(readconcern.Majority()).SetWriteConcern(writeconcern.Majority())
	s.locks = db.Collection(n.Locks, coord)
	s.circs = db.Collection(n.Circuits, coord)
	s.cache = db.Collection(n.Cache)
	s.idem = db.Collection(n.Idempotency, coord)
	s.cps = db.Collection(n.Checkpoints, coord)
	s.fences = db.Collection(n.Fences, coord)
	s.events = db.Collection(n.Events)
	s.watchers = db.Collection(n.Events+"_watchers", coord)
	if !opts.DisableAutoMigrate && !s.migratedBefore() {
		if err := s.Migrate(ctx); err != nil {
			return nil, err
		}
		migrated.Store(s.migrationKey(), true)
	} else if err := s.Ping(ctx); err != nil {
		return nil, fmt.Errorf("mongo: %w", err)
	}
	// Capability probe: FerretDB identifies itself in buildInfo. What it
	// finds chooses how long the event watcher's cursor waits and how
	// often it polls (see tailTiming), never a code path: every server
	// runs the same operations.
	s.tailing = awaitTiming
	var info bson.M
	if err := db.RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&info); err == nil && info["ferretdbVersion"] != nil {
		s.tailing = pollTiming
	}
	if opts.tailing != nil {
		s.tailing = *opts.tailing
	}
	s.wc = s.newWatchCache(opts.ownWatchCache)
	s.hub = newHub(s)
	if !opts.DisableEvents {
		s.ev = newEvWriter(s)
	}
	return s, nil
}

// migrated remembers the databases and collection names this process has
// migrated, so that opening many stores on one database (one per namespace,
// say) migrates once. Store.Migrate always runs.
var migrated sync.Map

func (s *store) migrationKey() string {
	return fmt.Sprintf("%s\x00%s\x00%+v\x00%v", s.serverKey(), s.db.Name(), s.names, s.autoIdx)
}

// serverKey identifies the server: its connection string, or the client
// handed to New.
func (s *store) serverKey() string {
	if s.server != "" {
		return s.server
	}
	return fmt.Sprintf("%p", s.db.Client())
}

func (s *store) migratedBefore() bool {
	_, ok := migrated.Load(s.migrationKey())
	return ok
}

// Name implements driver.Store.
func (s *store) Name() string { return "mongodb" }

// Limits implements driver.Store.
func (s *store) Limits() driver.Limits { return driver.Limits{MaxValueBytes: s.maxValue} }

// Locks implements driver.Store.
func (s *store) Locks() driver.Locks { return locks{s} }

// Circuits implements driver.Store.
func (s *store) Circuits() driver.Circuits { return adoptingCircuits{circuits{s}} }

// Cache implements driver.Store.
func (s *store) Cache() driver.Cache { return cache{s} }

// Idempotency implements driver.Store.
func (s *store) Idempotency() driver.Idempotency { return idempotency{s} }

// Checkpoints implements driver.Store.
func (s *store) Checkpoints() driver.Checkpoints { return checkpoints{s} }

// Ping implements driver.Store.
func (s *store) Ping(ctx context.Context) error {
	return ctxErr(ctx, s.db.RunCommand(ctx, bson.D{{Key: "ping", Value: 1}}).Err())
}

// Close implements driver.Store: it takes its lock waiters out of the
// queues (releasing holdings handed to them that no Acquire took), stops
// the event watcher, writes the
// events still queued, and disconnects a client the store connected
// itself. A *mongo.Database handed to New stays connected.
func (s *store) Close() error {
	s.leaveAll()
	first := !s.hub.closed.Swap(true)
	s.hub.Close()
	s.hub.closeRegs()
	if s.ev != nil {
		s.ev.close()
	}
	if first {
		releaseWatchCache(s.wc)
	}
	if s.ownDB {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return s.db.Client().Disconnect(ctx)
	}
	return nil
}

// ---------------------------------------------------------------------------
// helpers

// ctxErr returns ctx's error in place of err when ctx ended.
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

// now is the store's clock: the client's, in UTC milliseconds (what a BSON
// date holds).
func now() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }

// after returns t + d rounded up to whole milliseconds.
func after(t time.Time, d time.Duration) time.Time {
	return t.Add(time.Duration(driver.Millis(d)) * time.Millisecond)
}

// expiry returns t + d, or nil (no expiry) for d == 0.
func expiry(t time.Time, d time.Duration) any {
	if d <= 0 {
		return nil
	}
	return after(t, d)
}

// utc normalises a decoded date.
func utc(t *time.Time) time.Time {
	if t == nil || t.IsZero() {
		return time.Time{}
	}
	return t.UTC().Truncate(time.Millisecond)
}

// isDup reports a duplicate-key error (E11000): an upsert whose filter did
// not match found the key taken.
//
// FerretDB 1.24 (the test server) answers an update that would break a
// unique index other than _id with an InternalError naming SQLite's
// "UNIQUE constraint failed" instead; it is the same collision.
func isDup(err error) bool {
	return mongo.IsDuplicateKeyError(err) || (err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed"))
}

// dupOnID reports a duplicate-key error that names the _id index. MongoDB
// names the index in the message; FerretDB does not, and such an error is
// then not known to be on _id.
func dupOnID(err error) bool { return isDup(err) && strings.Contains(err.Error(), "index: _id_ ") }

// nsKey is the filter of one record by its stored key. The stored key is
// the document's _id (MongoDB's primary key, the only one FerretDB looks up
// without scanning); see docID.
func (s *store) nsKey(key string) bson.D {
	return bson.D{{Key: "_id", Value: s.docID(key)}}
}

// docID is the _id of the record with stored key sk: sk itself when the
// store has a prefix or sk starts with a kind tag ("lock:", "circuit:",
// "cache:"), since ValidatePrefix makes those unambiguous; ":" + sk for the
// untagged records (idempotency keys, checkpoint tasks) of a store without
// prefix, since a prefixed id never starts with ':'.
func (s *store) docID(sk string) string {
	if s.prefix == "" && !strings.HasPrefix(sk, driver.TagLock) && !strings.HasPrefix(sk, driver.TagCircuit) && !strings.HasPrefix(sk, driver.TagCache) {
		return ":" + sk
	}
	return sk
}

// live is the condition of a record that has not expired at t (no expiry
// or a later one).
func live(t time.Time) bson.E {
	return bson.E{Key: "$or", Value: bson.A{
		bson.D{{Key: "expiresAt", Value: nil}},
		bson.D{{Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: t}}}},
	}}
}

// liveAt reports whether an expiry (nil: none) is after t.
func liveAt(exp *time.Time, t time.Time) bool { return exp == nil || exp.After(t) }

// keyRange restricts field to strings starting with prefix, in the
// namespace: an index range, no regular expression, so no key character
// can widen it.
func (s *store) keyRange(field, prefix string) bson.D {
	f := bson.D{{Key: "namespace", Value: s.prefix}}
	r := bson.D{{Key: "$gte", Value: prefix}}
	if hi, ok := successor(prefix); ok {
		r = append(r, bson.E{Key: "$lt", Value: hi})
	}
	return append(f, bson.E{Key: field, Value: r})
}

// successor returns the least valid UTF-8 string greater than every string
// starting with p (false if there is none: p is empty or all U+10FFFF).
// UTF-8 byte order is code point order, which is MongoDB's string order.
func successor(p string) (string, bool) {
	rs := []rune(p)
	for i := len(rs) - 1; i >= 0; i-- {
		r := rs[i] + 1
		if r >= 0xD800 && r <= 0xDFFF {
			r = 0xE000
		}
		if r <= 0x10FFFF {
			rs[i] = r
			return string(rs[:i+1]), true
		}
	}
	return "", false
}

// withIdent adds the record's key and namespace fields to an upsert's
// $setOnInsert (the filter names only _id).
func (s *store) withIdent(update bson.D, sk string) bson.D {
	ident := bson.D{{Key: "key", Value: sk}, {Key: "namespace", Value: s.prefix}}
	out := make(bson.D, 0, len(update)+1)
	done := false
	for _, e := range update {
		if e.Key == "$setOnInsert" {
			e.Value = append(append(bson.D{}, e.Value.(bson.D)...), ident...)
			done = true
		}
		out = append(out, e)
	}
	if !done {
		out = append(out, bson.E{Key: "$setOnInsert", Value: ident})
	}
	return out
}

func nonNil(v []byte) []byte {
	if v == nil {
		return []byte{}
	}
	return v
}

// retryLimit bounds the retries of an operation whose conditional steps
// keep losing races; it is never reached in practice.
const retryLimit = 100

// errBusy is what an operation that gave up wraps: every one of its
// attempts lost a race with another change of the record.
var errBusy = errors.New("mongo: the record kept changing; giving up after many attempts")

// busyError is the error of an operation that gave up (errors.Is
// errBusy). It names the operation, the key and the number of attempts;
// the operation decided nothing (no lock was taken or refused, no claim
// made), and the portable packages treat the error as transient, as any
// store error, and try again.
type busyError struct {
	op, key string
	tries   int
}

func (e *busyError) Error() string {
	return fmt.Sprintf("mongo: %s %q: gave up after %d attempts, each lost a race with another change of the record; nothing was decided, try again",
		e.op, e.key, e.tries)
}

func (e *busyError) Unwrap() error { return errBusy }

// busy returns the error of op on key giving up after the store's tries.
func (s *store) busy(op, key string) error { return &busyError{op: op, key: key, tries: s.tries} }

// raced calls the test hook, if any, at a site where a retry loop can
// lose a race: "write" as an attempt starts, "renew" before renewing the
// caller's own holding or claim it just read, "step" before each
// conditional step of a circuit change. Tests make the race happen there.
func (s *store) raced(site string) {
	if s.race != nil {
		s.race(site)
	}
}
