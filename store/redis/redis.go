// Package redis is warden's Redis store, built on go-redis v9.
//
// It works with any redis.UniversalClient: a single server, a Sentinel
// failover client or a Redis Cluster. Every driver operation is one Lua
// script (EVALSHA, falling back to EVAL when the server has not loaded it
// yet) or one plain command, so each is atomic on the server and costs one
// round trip. The server's clock (TIME inside the scripts, PX expiries)
// decides every expiry, in milliseconds.
//
// Keys are laid out for Redis Cluster: every key a script touches carries
// the same hash tag, so it lives in one slot:
//
//	<prefix>{<tag>}lock:<key>        lock record (hash), kept after release
//	<prefix>{<tag>}circuit:<name>    circuit record (hash)
//	<prefix>{<tag>}cache:<key>       cache value (string, PX expiry)
//	<prefix>{<tag>}idem:<key>        idempotency record (hash)
//	<prefix>{<tag>}cp:<task>         checkpoints (sorted set by sequence)
//	<prefix>{<tag>}cpfence:<task>    checkpoint fence (hash)
//	<prefix>{<tag>}lockq:<key>       lock waiters by arrival (sorted set)
//	<prefix>{<tag>}lockqd:<key>      lock waiters by deadline (sorted set)
//	<prefix>{<tag>}lockw:<n>:<owner><key>  a lock waiter's wake-ups (list)
//
// where <tag> is eight hex digits of the FNV-1a hash of the key, name or
// task id. Lock and circuit events travel over pub/sub on the channel
// <prefix>warden-events.
//
// Open a store with [Open], with [New] on an existing client, or with
// warden.Open and a URL:
//
//	redis://user:password@host:6379/0?prefix=billing:
//	rediss://host:6380/0                        (TLS)
//	unix:///run/redis.sock?db=0
//	redis://host1:7000?addr=host2:7001&addr=host3:7002&cluster=true
//	redis://sentinel1:26379?addr=sentinel2:26379&master_name=mymaster
//
// URL parameters: prefix, max_value_bytes, cluster, addr (repeated; more
// seed or Sentinel addresses), master_name (Sentinel), db (unix URLs),
// dial_timeout, read_timeout, write_timeout, pool_size,
// lock_retention, handoff (default true; false: lock waiters poll) and
// handoff_conns (see Options.HandoffConns).
package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/eventhub"
)

// DefaultMaxValueBytes is the default value limit (cache values,
// idempotency results, checkpoint data).
const DefaultMaxValueBytes = 16 << 20

// DefaultLockRetention is how long an idle lock record (released or
// expired) and a lapsed idempotency claim are kept before Redis expires
// them.
const DefaultLockRetention = 24 * time.Hour

// Options configure a Redis store. The zero value (or nil) is ready to use.
type Options struct {
	// Prefix is the store's namespace: empty, or a name followed by its
	// only ':' such as "billing:" (driver.ValidatePrefix). It must not
	// contain '{' or '}', which would change the keys' hash slots.
	Prefix string
	// MaxValueBytes is the largest cache value, idempotency result or
	// checkpoint payload accepted. 0: DefaultMaxValueBytes.
	MaxValueBytes int
	// LockRetention is how long a lock record is kept after its holding
	// ended (released or expired), and a lapsed idempotency claim after
	// its lease: Redis then expires it. A lock record recreated later
	// starts its tokens from the server clock (driver.TokenBase), above
	// every token the old record handed out. 0: DefaultLockRetention.
	LockRetention time.Duration
	// KeyLayout chooses the hash tag of the store's keys, and so how a
	// cluster spreads them. The zero value, TagPerKey, spreads the records
	// of a namespace over every master.
	KeyLayout KeyLayout
	// HandoffConns bounds the lock waits the store runs at once
	// (docs/backends.md, "Lock hand-off"): each blocks a connection of the
	// client's pool in BLPOP until its turn comes. Beyond the bound a
	// waiter polls, woken by the store's notifications, as without
	// hand-off. 0: 8, at most a quarter of the client's PoolSize;
	// negative: no waits (the store still hands released keys to the
	// waiters other stores queued, and leaves them to those waiters).
	HandoffConns int
}

// KeyLayout is the hash tag of a store's Redis keys: what Redis Cluster
// hashes to choose the slot, and so the master, that holds a record.
// Every record of one key (a checkpoint task's list and its fence) shares
// a slot in either layout, so every script touches one slot. On a single
// server or with Sentinel the layout changes only the key names.
type KeyLayout int

const (
	// TagPerKey tags each record with a hash of its key:
	// "<prefix>{<fnv32a(key)>}<kind><key>". A namespace's records and
	// load spread over every master; listing scans every master.
	TagPerKey KeyLayout = iota
	// TagPerNamespace tags every record with a hash of the prefix:
	// "<prefix>{<fnv32a(prefix)>}<kind><key>". The whole namespace lives
	// in one slot, on one master (and its replicas): its load is not
	// spread, but one master's SCAN sees all of it, and a user's own
	// MULTI or script may touch several of its keys. Stores of one
	// namespace must use one layout: records of the other are not seen.
	TagPerNamespace
)

// String returns the layout's URL spelling: "key" or "namespace".
func (l KeyLayout) String() string {
	if l == TagPerNamespace {
		return "namespace"
	}
	return "key"
}

func init() {
	warden.Register("redis", openURL)
	warden.Register("rediss", openURL)
	warden.Register("unix", openURL)
}

// New returns a store on client, which stays open when the store closes.
// client may be a *redis.Client, *redis.ClusterClient or a Sentinel
// failover client.
//
// A *redis.Client must be built with MaxRetries: -1 (New refuses one that
// retries, go-redis's default): a command whose reply is late is sent
// again by a retrying client, and warden's lock scripts are not safe to
// repeat — a repeated ForceRelease ends a holding taken in between, a
// repeated Release reports "not held" for a holding it released. Build it
// with ContextTimeoutEnabled: true as well, or calls wait for the client's
// ReadTimeout past their context's deadline. A ClusterClient's retries
// are off by default; its redirect loop (MaxRedirects) may still resend a
// command after a timeout, see docs/backends.md.
func New(client goredis.UniversalClient, opts *Options) (*warden.Store, error) {
	s, err := NewDriver(client, opts)
	if err != nil {
		return nil, err
	}
	return warden.New(s, nil), nil
}

// NewDriver is New without the warden.Store wrapper.
func NewDriver(client goredis.UniversalClient, opts *Options) (driver.Store, error) {
	if client == nil {
		return nil, errors.New("redis: New needs a client")
	}
	if err := checkRetries(client); err != nil {
		return nil, err
	}
	return newStore(client, false, opts)
}

// Open connects to the server a redis://, rediss:// or unix:// URL names
// and returns a store that closes its client when it closes. A URL's
// parameters override opts.
func Open(ctx context.Context, rawURL string, opts *Options) (*warden.Store, error) {
	s, err := OpenDriver(ctx, rawURL, opts)
	if err != nil {
		return nil, err
	}
	return warden.New(s, nil), nil
}

// ErrClientRetries is returned by New for a client that resends commands
// after a timeout (redis.Options.MaxRetries other than -1).
var ErrClientRetries = errors.New("redis: the client retries commands; build it with MaxRetries: -1")

// checkRetries refuses a single-node or Sentinel client whose commands
// are retried after timeouts.
func checkRetries(client goredis.UniversalClient) error {
	if c, ok := client.(*goredis.Client); ok {
		// The client's options are normalised when it is built: -1
		// (no retries) reads 0 there, and 0 (the default) reads 3.
		if n := c.Options().MaxRetries; n > 0 {
			return fmt.Errorf("%w (it retries up to %d times): a lock script resent after a late reply can end a holding taken in between", ErrClientRetries, n)
		}
	}
	return nil
}

// OpenDriver is Open without the warden.Store wrapper.
func OpenDriver(ctx context.Context, rawURL string, opts *Options) (driver.Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: redis URL does not parse", driver.ErrBadURL)
	}
	return openParsed(ctx, u, opts)
}

func openURL(ctx context.Context, u *url.URL, _ *slog.Logger) (driver.Store, error) {
	return openParsed(ctx, u, nil)
}

func openParsed(ctx context.Context, u *url.URL, base *Options) (driver.Store, error) {
	uo, o, err := parseURL(u, base)
	if err != nil {
		return nil, err
	}
	// Scripts are not safe to repeat (see New), and a call must end at its
	// context's deadline.
	uo.MaxRetries = -1
	uo.ContextTimeoutEnabled = true
	client := goredis.NewUniversalClient(uo)
	s, err := newStore(client, true, o)
	if err != nil {
		client.Close()
		return nil, err
	}
	if err := s.Ping(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("redis: %w", err)
	}
	return s, nil
}

// parseURL translates a store URL to go-redis's universal options.
func parseURL(u *url.URL, base *Options) (*goredis.UniversalOptions, *Options, error) {
	o := Options{}
	if base != nil {
		o = *base
	}
	uo := &goredis.UniversalOptions{}
	q := driver.NewParams(u)
	o.Prefix = q.String("prefix", o.Prefix)
	o.MaxValueBytes = q.Int("max_value_bytes", o.MaxValueBytes)
	o.LockRetention = q.Duration("lock_retention", o.LockRetention)
	off := o.HandoffConns < 0
	o.HandoffConns = q.Int("handoff_conns", max(o.HandoffConns, 0))
	if !q.Bool("handoff", !off) {
		o.HandoffConns = -1
	}
	switch layout := q.String("key_layout", o.KeyLayout.String()); layout {
	case "key":
		o.KeyLayout = TagPerKey
	case "namespace":
		o.KeyLayout = TagPerNamespace
	default:
		return nil, nil, fmt.Errorf("%w: key_layout=%q: want key or namespace", driver.ErrBadURL, layout)
	}
	cluster := q.Bool("cluster", false)
	uo.MasterName = q.String("master_name", "")
	q.Has("addr")
	extra := u.Query()["addr"]
	uo.DialTimeout = q.Duration("dial_timeout", 0)
	uo.ReadTimeout = q.Duration("read_timeout", 0)
	uo.WriteTimeout = q.Duration("write_timeout", 0)
	uo.PoolSize = q.Int("pool_size", 0)
	db := -1
	if q.Has("db") {
		db = q.Int("db", 0)
	}
	if u.User != nil {
		uo.Username = u.User.Username()
		uo.Password, _ = u.User.Password()
		if uo.MasterName != "" {
			uo.SentinelUsername, uo.SentinelPassword = uo.Username, uo.Password
		}
	}
	switch u.Scheme {
	case "redis", "rediss":
		if u.Opaque != "" || u.Host == "" {
			return nil, nil, fmt.Errorf("%w: want %s://[user:password@]host:port[/db]", driver.ErrBadURL, u.Scheme)
		}
		host := u.Host
		if u.Port() == "" {
			host += ":6379"
		}
		uo.Addrs = append([]string{host}, extra...)
		if p := strings.Trim(u.Path, "/"); p != "" {
			n, err := strconv.Atoi(p)
			if err != nil || n < 0 || db >= 0 {
				return nil, nil, fmt.Errorf("%w: the path of a redis URL is a database number", driver.ErrBadURL)
			}
			db = n
		}
		if u.Scheme == "rediss" {
			uo.TLSConfig = &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
		}
	case "unix":
		if u.Path == "" || u.Host != "" || len(extra) > 0 || cluster || uo.MasterName != "" {
			return nil, nil, fmt.Errorf("%w: want unix:///path/to/redis.sock[?db=N]", driver.ErrBadURL)
		}
		uo.Addrs = []string{u.Path}
	default:
		return nil, nil, fmt.Errorf("%w: scheme %q is not a redis scheme", driver.ErrBadURL, u.Scheme)
	}
	if db > 0 {
		if cluster {
			return nil, nil, fmt.Errorf("%w: a Redis Cluster has only database 0", driver.ErrBadURL)
		}
		uo.DB = db
	}
	uo.IsClusterMode = cluster
	if cluster && uo.MasterName != "" {
		return nil, nil, fmt.Errorf("%w: cluster and master_name exclude each other", driver.ErrBadURL)
	}
	if err := q.Err(); err != nil {
		return nil, nil, err
	}
	if u.Scheme == "unix" {
		// go-redis picks the network from the address.
		uo.Addrs = []string{u.Path}
	}
	return uo, &o, nil
}

// store is the driver.Store.
type store struct {
	client    goredis.UniversalClient
	owned     bool // Close closes client
	prefix    string
	nsTag     string // the hash tag of every key (TagPerNamespace), or ""
	channel   string // pub/sub channel of the namespace's events
	maxValue  int
	retention int64 // lock retention in ms
	hub       *eventhub.Hub
	ho        *handoff // lock waits (handoff.go)

	closeOnce sync.Once
	closed    chan struct{}
}

func newStore(client goredis.UniversalClient, owned bool, opts *Options) (*store, error) {
	o := Options{}
	if opts != nil {
		o = *opts
	}
	if err := driver.ValidatePrefix(o.Prefix); err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		return nil, fmt.Errorf("redis: %w: prefix %q contains '{' or '}', which would change the keys' hash slots", driver.ErrBadPrefix, o.Prefix)
	}
	if o.KeyLayout != TagPerKey && o.KeyLayout != TagPerNamespace {
		return nil, fmt.Errorf("redis: unknown KeyLayout %d", int(o.KeyLayout))
	}
	if o.MaxValueBytes < 0 || o.LockRetention < 0 {
		return nil, errors.New("redis: MaxValueBytes and LockRetention must not be negative")
	}
	if o.MaxValueBytes == 0 {
		o.MaxValueBytes = DefaultMaxValueBytes
	}
	if o.MaxValueBytes > 512<<20-64 {
		return nil, errors.New("redis: MaxValueBytes is above what a Redis string holds (512 MiB)")
	}
	if o.LockRetention == 0 {
		o.LockRetention = DefaultLockRetention
	}
	s := &store{
		client:    client,
		owned:     owned,
		prefix:    o.Prefix,
		channel:   o.Prefix + "warden-events",
		maxValue:  o.MaxValueBytes,
		retention: driver.Millis(o.LockRetention),
		closed:    make(chan struct{}),
	}
	if o.KeyLayout == TagPerNamespace {
		s.nsTag = tag(o.Prefix)
	}
	s.hub = eventhub.New(s.startWatcher, warden.ErrClosed)
	s.ho = newHandoff(client, o.HandoffConns)
	return s, nil
}

// Name implements driver.Store.
func (s *store) Name() string { return "redis" }

// Limits implements driver.Store.
func (s *store) Limits() driver.Limits { return driver.Limits{MaxValueBytes: s.maxValue} }

// Locks implements driver.Store.
func (s *store) Locks() driver.Locks { return (*locks)(s) }

// Circuits implements driver.Store.
func (s *store) Circuits() driver.Circuits { return (*circuits)(s) }

// Cache implements driver.Store.
func (s *store) Cache() driver.Cache { return (*cache)(s) }

// Idempotency implements driver.Store.
func (s *store) Idempotency() driver.Idempotency { return (*idempotency)(s) }

// Checkpoints implements driver.Store.
func (s *store) Checkpoints() driver.Checkpoints { return (*checkpoints)(s) }

// Ping implements driver.Store.
func (s *store) Ping(ctx context.Context) error {
	return s.fail(ctx, s.client.Ping(ctx).Err())
}

// Close implements driver.Store: it ends the watches and closes the client
// if the store opened it.
func (s *store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.closed)
		s.ho.close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s.leaveAll(ctx)
		cancel()
		s.hub.Close()
		if s.owned {
			err = s.client.Close()
		}
	})
	return err
}

// Kinds of records, as they appear in keys after the hash tag.
const (
	kindLock    = "lock:"
	kindCircuit = "circuit:"
	kindCache   = "cache:"
	kindIdem    = "idem:"
	kindCP      = "cp:"
	kindFence   = "cpfence:"
)

// tag is the hash tag of a key: eight hex digits of its FNV-1a hash.
func tag(key string) string {
	h := fnv.New32a()
	h.Write([]byte(key))
	return fmt.Sprintf("%08x", h.Sum32())
}

// tag is the hash tag of key's records in the store's layout.
func (s *store) tag(key string) string {
	if s.nsTag != "" {
		return s.nsTag
	}
	return tag(key)
}

// key is the Redis key of a record of kind.
func (s *store) key(kind, key string) string {
	return s.prefix + "{" + s.tag(key) + "}" + kind + key
}

// tagLen is the length of "{xxxxxxxx}".
const tagLen = 10

// parseKey returns the key of a Redis key of kind in the store's
// namespace; ok=false for any other key.
func (s *store) parseKey(kind, rk string) (string, bool) {
	rest, ok := strings.CutPrefix(rk, s.prefix)
	if !ok || len(rest) < tagLen || rest[0] != '{' || rest[tagLen-1] != '}' {
		return "", false
	}
	for i := 1; i < tagLen-1; i++ {
		if c := rest[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", false
		}
	}
	k, ok := strings.CutPrefix(rest[tagLen:], kind)
	if !ok || k == "" || rest[1:tagLen-1] != s.tag(k) {
		return "", false
	}
	return k, true
}

// match is the SCAN MATCH glob of the records of kind whose keys match p.
func (s *store) match(kind string, p driver.Pattern) string {
	return globEscape(s.prefix) + "{????????}" + p.RedisMatch(kind)
}

// scan calls f with every Redis key matching match, on every master of a
// cluster, one SCAN page at a time (never two calls of f at once), each
// key once (SCAN may return a key twice). SCAN skips expired keys.
func (s *store) scan(ctx context.Context, match string, f func(keys []string) error) error {
	var mu sync.Mutex
	seen := map[string]bool{}
	page := func(ctx context.Context, c goredis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, match, 1000).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			fresh := keys[:0]
			for _, k := range keys {
				if !seen[k] {
					seen[k] = true
					fresh = append(fresh, k)
				}
			}
			mu.Unlock()
			if len(fresh) > 0 {
				mu.Lock()
				err := f(fresh)
				mu.Unlock()
				if err != nil {
					return err
				}
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		return s.fail(ctx, cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			return page(ctx, c)
		}))
	}
	return s.fail(ctx, page(ctx, s.client))
}

// globEscape escapes s for a SCAN MATCH glob.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// fail converts an error of the client: nil stays nil; a done context's
// error passes through unchanged.
func (s *store) fail(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	// With ContextTimeoutEnabled the connection's deadline is the
	// context's: its timeout can fire a moment before the context's own
	// timer marks it done. Past the deadline, it is the deadline's error.
	var ne net.Error
	if dl, ok := ctx.Deadline(); ok && errors.As(err, &ne) && ne.Timeout() && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	select {
	case <-s.closed:
		return warden.ErrClosed
	default:
	}
	if errors.Is(err, goredis.ErrClosed) {
		return warden.ErrClosed
	}
	return err
}

// ms converts a time from the scripts (Unix milliseconds) to UTC; 0 is the
// zero time.
func ms(v int64) time.Time {
	if v <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(v).UTC()
}

// reply helpers for script replies.
func rInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func rStr(v any) string {
	if x, ok := v.(string); ok {
		return x
	}
	return ""
}

// errReply is the error for a script reply of an unexpected shape.
func errReply(op string, v any) error {
	return fmt.Errorf("redis: unexpected reply to %s: %T", op, v)
}
