package dynamo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// DefaultMaxValueBytes is the default (and largest) value limit: DynamoDB's
// 400 KB item limit less 8 KiB for the item's keys and other attributes.
const DefaultMaxValueBytes = 400<<10 - 8<<10

// EventsIndex is the name of the sparse global secondary index (partition
// key gpk, sort key gsk) that lock and circuit writes feed and that the
// store's watcher polls for notifications.
const EventsIndex = "warden-events"

// ListIndex is the name of the sparse global secondary index (partition
// key lpk: the kind and namespace, sort key pk, keys only) that every item
// warden writes feeds, so that listings (Keys, List, Tasks, Clear, Purge)
// Query the namespace instead of scanning the table.
const ListIndex = "warden-list"

// Defaults of [Options].
const (
	// DefaultEventPoll is how often the watcher polls the events index.
	DefaultEventPoll = 50 * time.Millisecond
	// DefaultEventLookback is how far back each poll of the events index
	// reads.
	DefaultEventLookback = 2 * time.Second
	// DefaultLockRetention is how long idle lock records are kept before
	// DynamoDB's TTL may delete them: none. A lock item's TTL attribute
	// expiresAt is the end of its holding, as in the go-go-scope layout,
	// whose services read it as the lock's expiry.
	DefaultLockRetention time.Duration = 0
	// DefaultHandoffPoll is how often the first waiter in a lock's queue
	// reads the lock item while it waits.
	DefaultHandoffPoll = 10 * time.Millisecond
)

// Options configure a DynamoDB store. The zero value (or nil) is ready to
// use.
type Options struct {
	// Prefix is the store's namespace: empty, or a name followed by its
	// only ':' such as "billing:" (driver.ValidatePrefix).
	Prefix string
	// MaxValueBytes is the largest cache value, idempotency result or
	// checkpoint payload accepted. 0: DefaultMaxValueBytes, which is also
	// the largest allowed.
	MaxValueBytes int
	// DisableAutoCreate stops the store from creating its table when it is
	// missing; call Migrate (warden.Store's Migrate) or CreateTable
	// yourself. The zero value creates a missing table (with the events
	// index and TTL) when the store opens. An existing table is never
	// changed when a store opens; Migrate adds a missing events index
	// and list index. A store opened on a table without the list index
	// lists by scanning the table (and logs a warning saying so).
	DisableAutoCreate bool
	// DisableEvents stops lock and circuit writes from feeding the events
	// index and turns notifications off; the portable packages then poll.
	// Use it when one namespace carries more lock traffic than one index
	// partition takes (about 1000 writes per second on DynamoDB).
	DisableEvents bool
	// EventPoll is how often the watcher queries the events index while
	// someone watches. 0: DefaultEventPoll (50 ms).
	EventPoll time.Duration
	// EventLookback is how far back each poll reads, to cover the clock
	// skew between writers and the watcher and the index's propagation
	// delay. Changes that reach the index later than this are lost (and
	// not reported as lost). 0: DefaultEventLookback (2 s).
	EventLookback time.Duration
	// LockRetention is how long released or expired lock records are kept
	// before DynamoDB's TTL may delete them: it is added to their
	// expiresAt. 0 (DefaultLockRetention): nothing is added, and expiresAt
	// is the end of the holding in epoch seconds, which is what services
	// using the go-go-scope DynamoDB layout read as the lock's expiry. Set
	// it only when no such service shares the table: they would see a
	// released lock as held for the retention. See docs/backends.md for
	// why the fencing tokens stay monotonic when TTL deletes a record.
	LockRetention time.Duration
	// DisableHandoff stops the store from queueing its lock waiters in the
	// lock item (lock.Locker's waiters then poll, woken by the events
	// index, and a releaser that asks again at once can take the key back
	// before them). The zero value queues them: a release hands the key
	// to the waiter that queued first, across processes. Releases hand
	// off to the waiters other stores queued either way.
	DisableHandoff bool
	// HandoffPoll is how often the first waiter in a lock's queue reads
	// the lock item (one strongly consistent GetItem) to take a hand-off
	// sooner than the events index tells it; the other waiters wait for
	// the events. 0: DefaultHandoffPoll (10 ms): at most 100 reads a
	// second per lock while someone waits for it.
	HandoffPoll time.Duration
}

func init() {
	warden.Register("dynamodb", openURL)
}

// store is the DynamoDB driver store.
type store struct {
	c         *dynamodb.Client
	table     string
	prefix    string
	maxValue  int
	events    bool // writes feed the events index
	poll      time.Duration
	lookback  time.Duration
	retention time.Duration
	handoff   bool          // WaitLock queues waiters (Options.DisableHandoff)
	handPoll  time.Duration // Options.HandoffPoll
	pageLimit int32         // Limit of each Scan/Query page; 0: DynamoDB's 1 MB pages
	byIndex   bool          // listings Query the list index (else they Scan the table)
	conns     *conns        // the connections of the store's own HTTP client (Open); nil for New's

	lockPfx, circPfx, cachePfx, idemPfx, cpPfx string
	lockEvt, circEvt                           string // gpk of each kind's events

	// circGuess remembers each circuit's last seen state and failure
	// count (an item), to pick the
	// right conditional update first.
	circGuess sync.Map

	// noAllOld is set once the endpoint answered a failed condition
	// without the item (no ReturnValuesOnConditionCheckFailure, as on
	// dynalite). heldHint then maps the pk of locks this store found
	// held by another to the holding's expiry (ms), so that the next
	// attempt reads before it writes; hints counts insertions.
	noAllOld atomic.Bool
	heldHint sync.Map
	hints    atomic.Int64

	hub *hub

	// waits: this store's owners in the lock items' queues (handoff.go).
	waits waits

	tries int               // tests: attempts of each retry loop before it gives up (0: the loop's default)
	race  func(site string) // tests: called where a retry loop can lose a race (see raced)
}

// notifyStore is a store whose table has the events index: it implements
// driver.LockNotifier and driver.CircuitNotifier.
type notifyStore struct{ *store }

var tableRe = regexp.MustCompile(`^[A-Za-z0-9_.-]{3,255}$`)

// New returns a store on the table of client. The client stays the
// caller's: Close leaves it alone. Unless opts.DisableAutoCreate, a
// missing table is created first.
func New(client *dynamodb.Client, table string, opts *Options) (*warden.Store, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := newStore(ctx, client, table, opts)
	if err != nil {
		return nil, err
	}
	return warden.New(s, nil), nil
}

// Open returns a store for a dynamodb://TABLE URL (see the package
// documentation). The URL's parameters override opts.
func Open(ctx context.Context, rawURL string, opts *Options) (*warden.Store, error) {
	s, err := OpenDriver(ctx, rawURL, opts)
	if err != nil {
		return nil, err
	}
	return warden.New(s, nil), nil
}

// OpenDriver is Open without the warden.Store wrapper.
func OpenDriver(ctx context.Context, rawURL string, opts *Options) (driver.Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: dynamodb URL does not parse", driver.ErrBadURL)
	}
	return open(ctx, u, opts)
}

func openURL(ctx context.Context, u *url.URL, _ *slog.Logger) (driver.Store, error) {
	return open(ctx, u, nil)
}

// urlConfig is what a dynamodb:// URL says.
type urlConfig struct {
	table, region, endpoint string
	opts                    Options
}

// parseURL reads a dynamodb:// URL.
func parseURL(u *url.URL, base *Options) (*urlConfig, error) {
	if u.Scheme != "dynamodb" || u.Opaque != "" || u.Host == "" {
		return nil, fmt.Errorf("%w: want dynamodb://TABLE?region=…&endpoint=…", driver.ErrBadURL)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%w: a dynamodb URL takes no user or password; credentials come from the AWS SDK's default chain", driver.ErrBadURL)
	}
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("%w: a dynamodb URL names the table as its host and has no path", driver.ErrBadURL)
	}
	cfg := &urlConfig{table: u.Host}
	if base != nil {
		cfg.opts = *base
	}
	if !tableRe.MatchString(cfg.table) {
		return nil, fmt.Errorf("%w: %q is not a DynamoDB table name (3–255 letters, digits, '_', '-', '.')", driver.ErrBadURL, cfg.table)
	}
	q := driver.NewParams(u)
	o := &cfg.opts
	cfg.region = q.String("region", "")
	cfg.endpoint = q.String("endpoint", "")
	o.Prefix = q.String("prefix", o.Prefix)
	o.MaxValueBytes = q.Int("max_value_bytes", o.MaxValueBytes)
	o.DisableAutoCreate = !q.Bool("auto_create", !o.DisableAutoCreate)
	o.DisableEvents = !q.Bool("events", !o.DisableEvents)
	o.EventPoll = q.Duration("event_poll", o.EventPoll)
	o.EventLookback = q.Duration("event_lookback", o.EventLookback)
	o.LockRetention = q.Duration("lock_retention", o.LockRetention)
	o.DisableHandoff = !q.Bool("handoff", !o.DisableHandoff)
	o.HandoffPoll = q.Duration("handoff_poll", o.HandoffPoll)
	if err := q.Err(); err != nil {
		return nil, err
	}
	if cfg.endpoint != "" {
		e, err := url.Parse(cfg.endpoint)
		if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
			return nil, fmt.Errorf("%w: endpoint must be an http:// or https:// URL", driver.ErrBadURL)
		}
	}
	return cfg, nil
}

// loopback reports whether endpoint's host is a loopback address.
func loopback(endpoint string) bool {
	e, err := url.Parse(endpoint)
	if err != nil {
		return false
	}
	h := e.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func open(ctx context.Context, u *url.URL, opts *Options) (driver.Store, error) {
	cfg, err := parseURL(u, opts)
	if err != nil {
		return nil, err
	}
	// The SDK's buildable client (it honours AWS_CA_BUNDLE), whose
	// connections the store tracks so that Close can close them (see
	// conns).
	cs := newConns()
	hc := awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
		tr.MaxIdleConnsPerHost = 64
		tr.DialContext = cs.dialer(tr.DialContext)
	})
	var loads []func(*config.LoadOptions) error
	loads = append(loads, config.WithHTTPClient(hc))
	if cfg.region != "" {
		loads = append(loads, config.WithRegion(cfg.region))
	}
	if cfg.endpoint != "" && loopback(cfg.endpoint) && os.Getenv("AWS_ACCESS_KEY_ID") == "" && os.Getenv("AWS_PROFILE") == "" {
		// DynamoDB Local and dynalite accept any signature.
		loads = append(loads, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("warden-local", "warden-local", "")))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, loads...)
	if err != nil {
		return nil, fmt.Errorf("dynamo: loading the AWS configuration: %w", err)
	}
	if awsCfg.Region == "" {
		if cfg.endpoint == "" {
			return nil, fmt.Errorf("%w: no AWS region: set ?region= or AWS_REGION", driver.ErrBadURL)
		}
		awsCfg.Region = "us-east-1" // a local endpoint ignores it
	}
	client := dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) {
		if cfg.endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.endpoint)
		}
		// The client's own copy of the HTTP client, made after the SDK
		// applied its timeouts, which replace the dial function: track
		// its connections too.
		if b, ok := o.HTTPClient.(*awshttp.BuildableClient); ok {
			o.HTTPClient = b.WithTransportOptions(func(tr *http.Transport) { tr.DialContext = cs.dialer(tr.DialContext) })
		}
	})
	s, err := newStore(ctx, client, cfg.table, &cfg.opts)
	if err != nil {
		cs.close()
		return nil, err
	}
	s.base().conns = cs
	return s, nil
}

// driverStore is what newStore returns: a store with or without
// notifications.
type driverStore interface {
	driver.Store
	base() *store
}

func (s *store) base() *store { return s }

func newStore(ctx context.Context, client *dynamodb.Client, table string, opts *Options) (driverStore, error) {
	if client == nil {
		return nil, errors.New("dynamo: nil client")
	}
	if opts == nil {
		opts = &Options{}
	}
	if !tableRe.MatchString(table) {
		return nil, fmt.Errorf("dynamo: %q is not a DynamoDB table name", table)
	}
	if err := driver.ValidatePrefix(opts.Prefix); err != nil {
		return nil, fmt.Errorf("dynamo: %w", err)
	}
	if opts.MaxValueBytes < 0 || opts.MaxValueBytes > DefaultMaxValueBytes {
		return nil, fmt.Errorf("dynamo: MaxValueBytes must be between 0 and %d", DefaultMaxValueBytes)
	}
	if opts.EventPoll < 0 || opts.EventLookback < 0 || opts.LockRetention < 0 || opts.HandoffPoll < 0 {
		return nil, errors.New("dynamo: negative duration in Options")
	}
	p := opts.Prefix
	s := &store{
		c: client, table: table, prefix: p,
		maxValue:  or(opts.MaxValueBytes, DefaultMaxValueBytes),
		poll:      or(opts.EventPoll, DefaultEventPoll),
		lookback:  or(opts.EventLookback, DefaultEventLookback),
		retention: opts.LockRetention,
		handoff:   !opts.DisableHandoff,
		handPoll:  or(opts.HandoffPoll, DefaultHandoffPoll),
		lockPfx:   "LOCK#" + p + driver.TagLock,
		circPfx:   "CB#" + p + driver.TagCircuit,
		cachePfx:  "CACHE#" + p + driver.TagCache,
		idemPfx:   "IDEM#" + p + "idem:",
		cpPfx:     "CHECKPOINT#" + p + "checkpoint:",
		lockEvt:   "EVT#" + p + driver.TagLock,
		circEvt:   "EVT#" + p + driver.TagCircuit,
	}
	s.hub = newHub(s)
	info, err := s.describe(ctx)
	if err != nil {
		return nil, err
	}
	if !info.exists {
		if opts.DisableAutoCreate {
			return nil, fmt.Errorf("dynamo: table %q does not exist (create it with Migrate or CreateTable, or let the store create it)", table)
		}
		if err := s.createTable(ctx); err != nil {
			return nil, err
		}
		info = tableInfo{exists: true, index: true, list: true}
	} else if info.status != types.TableStatusActive || !info.index {
		// Being created (or its index built) by someone else: wait, then
		// look again.
		if err := s.waitActive(ctx); err != nil {
			return nil, err
		}
		if info, err = s.describe(ctx); err != nil {
			return nil, err
		}
	}
	// A list index still being built (Migrate on a large table can take
	// long) is not waited for: the store lists by Scan until reopened.
	s.byIndex = info.list
	if !info.list {
		slog.Default().Warn("dynamo: the table has no list index: listings (Keys, List, Tasks, Clear, Purge) scan the whole table; run Migrate (warden migrate) to add it",
			"table", table, "index", ListIndex)
	}
	if info.index && !opts.DisableEvents {
		s.events = true
		return notifyStore{s}, nil
	}
	return s, nil
}

func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Name implements driver.Store.
func (s *store) Name() string { return "dynamodb" }

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

// Ping implements driver.Store: one DescribeTable.
func (s *store) Ping(ctx context.Context) error {
	_, err := s.c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &s.table})
	return s.err(ctx, "ping", err)
}

// Close implements driver.Store: it stops the watcher and, for a store
// made by Open, closes every connection of its HTTP client (a request
// still in flight fails), so that no connection and no goroutine of the
// store outlives it. A client handed to New stays usable, its connections
// untouched.
func (s *store) Close() error {
	s.leaveAll()
	s.hub.Close()
	if s.conns != nil {
		s.conns.close()
	}
	return nil
}

// ---------------------------------------------------------------------------
// helpers

// retryLimit is how many attempts a lock acquire or an idempotency claim
// makes when each finds the item changed between its conditional write
// and the read that follows; it is not reached in practice.
const retryLimit = 10

// errContended is what the error of an operation that gave up wraps.
var errContended = errors.New("dynamo: the item changed under every attempt")

// contendedError is the error of an operation that gave up (errors.Is
// errContended): every attempt lost a race with another change of the
// item. It names the operation, the key and the number of attempts; the
// operation decided nothing (no lock was taken or refused, no claim
// made), and the portable packages treat the error as transient, as any
// store error, and try again.
type contendedError struct {
	op, key string
	tries   int
}

func (e *contendedError) Error() string {
	return fmt.Sprintf("dynamo: %s %q: gave up after %d attempts, each lost a race with another change of the item; nothing was decided, try again",
		e.op, e.key, e.tries)
}

func (e *contendedError) Unwrap() error { return errContended }

// attempts is the bound of a retry loop whose default is def.
func (s *store) attempts(def int) int {
	if s.tries > 0 {
		return s.tries
	}
	return def
}

// raced calls the test hook, if any, at a site where a retry loop can
// lose a race: "write" as an attempt of an acquire or a claim starts,
// "renew" before renewing the caller's own holding or claim it just read,
// "step" before each conditional update of a circuit change. Tests make
// the race happen there.
func (s *store) raced(site string) {
	if s.race != nil {
		s.race(site)
	}
}

// err wraps a DynamoDB error for op, or returns ctx's error when ctx ended.
func (s *store) err(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if e := ctx.Err(); e != nil {
		return e
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("dynamo: %s: %w", op, err)
}

// nowMs is the client clock, which decides expiry (see the package doc).
func nowMs() int64 { return time.Now().UnixMilli() }

// msTime converts Unix milliseconds to a UTC time; 0 is the zero time.
func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// ttlSeconds is the TTL attribute for a millisecond expiry: the second
// after it (DynamoDB deletes the item some time after that).
func ttlSeconds(ms int64) int64 { return ms/1000 + 1 }

// cutPrefix strips a pk prefix.
func cutPrefix(pk, pfx string) (string, bool) { return strings.CutPrefix(pk, pfx) }
