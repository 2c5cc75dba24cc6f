package redis_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/drivertest"
	"github.com/warden-go/warden/store/redis"
)

// TestMain lets the conformance suite re-execute this test binary as the
// child processes of its multi-process checks.
func TestMain(m *testing.M) {
	drivertest.Main(m)
}

// withPrefix returns u with ?prefix=prefix.
func withPrefix(t testing.TB, u, prefix string) string {
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	q := p.Query()
	q.Set("prefix", prefix)
	p.RawQuery = q.Encode()
	return p.String()
}

// serverURL returns the single test server's redis:// URL with ?prefix=.
func serverURL(t testing.TB, prefix string) string {
	return withPrefix(t, drivertest.ServerURL(t, "redis", "WARDEN_TEST_REDIS_URL"), prefix)
}

// clusterAddrs returns the test cluster's seed addresses.
func clusterAddrs(t testing.TB) []string {
	v := os.Getenv("WARDEN_TEST_REDIS_CLUSTER_ADDRS")
	if v == "" {
		drivertest.ServerURL(t, "redis-cluster", "WARDEN_TEST_REDIS_CLUSTER_ADDRS")
	}
	return strings.Split(v, ",")
}

// clusterURL returns a redis:// URL of the test cluster with ?prefix=.
func clusterURL(t testing.TB, prefix string) string {
	addrs := clusterAddrs(t)
	q := url.Values{}
	for _, a := range addrs[1:] {
		q.Add("addr", a)
	}
	q.Set("cluster", "true")
	q.Set("prefix", prefix)
	return "redis://" + addrs[0] + "?" + q.Encode()
}

// serverAddr returns the single test server's host:port, for the fault
// checks' proxies.
func serverAddr(t testing.TB) string {
	p, err := url.Parse(serverURL(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	if p.Port() == "" {
		return p.Hostname() + ":6379"
	}
	return p.Host
}

// proxiedURL returns serverURL(t, prefix) with the server reached through
// proxyAddr.
func proxiedURL(t testing.TB, prefix, proxyAddr string) string {
	p, err := url.Parse(serverURL(t, prefix))
	if err != nil {
		t.Fatal(err)
	}
	p.Host = proxyAddr
	return p.String()
}

// openURL returns a Harness.Open that opens stores by URL and deletes the
// namespace's keys when the check ends.
func openURL(u func(testing.TB, string) string) func(testing.TB, string) *warden.Store {
	return func(t testing.TB, prefix string) *warden.Store {
		st, err := redis.Open(context.Background(), u(t, prefix), nil)
		if err != nil {
			t.Fatal(err)
		}
		cleanNamespace(t, u(t, ""), prefix)
		return st
	}
}

// cleanNamespace deletes every key of namespace prefix on the server of
// rawURL when t ends, so that test runs do not fill the server.
func cleanNamespace(t testing.TB, rawURL, prefix string) {
	if prefix == "" || strings.ContainsAny(prefix, "*?[]\\") {
		return
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p, err := url.Parse(rawURL)
		if err != nil {
			t.Error(err)
			return
		}
		addrs := append([]string{p.Host}, p.Query()["addr"]...)
		var c goredis.UniversalClient
		if p.Query().Get("cluster") == "true" {
			c = goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs})
		} else {
			o, err := goredis.ParseURL((&url.URL{Scheme: p.Scheme, User: p.User, Host: p.Host, Path: p.Path}).String())
			if err != nil {
				t.Error(err)
				return
			}
			o.MaxRetries, o.ContextTimeoutEnabled = -1, true
			c = goredis.NewClient(o)
		}
		defer c.Close()
		del := func(ctx context.Context, c goredis.UniversalClient) error {
			iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				if err := c.Del(ctx, iter.Val()).Err(); err != nil {
					return err
				}
			}
			return iter.Err()
		}
		if cc, ok := c.(*goredis.ClusterClient); ok {
			err = cc.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error { return del(ctx, n) })
		} else {
			err = del(ctx, c)
		}
		if err != nil {
			t.Errorf("deleting namespace %q: %v", prefix, err)
		}
	})
}

// TestConformance runs the whole conformance suite — driver checks and the
// portable packages, in goroutines and in separate OS processes, and the
// fault checks through proxies — against the single test server.
func TestConformance(t *testing.T) {
	serverURL(t, "")
	drivertest.Run(t, drivertest.Harness{
		Name:       "redis",
		Open:       openURL(serverURL),
		URL:        serverURL,
		Upstream:   serverAddr,
		ProxiedURL: proxiedURL,
	})
}

// TestConformanceCluster runs the whole suite against the 3-master test
// cluster. The fault checks put their proxy in front of the master that
// serves the checks' lock key (see clusterFaultKey).
func TestConformanceCluster(t *testing.T) {
	clusterURL(t, "")
	drivertest.Run(t, drivertest.Harness{
		Name:       "redis-cluster",
		Open:       openURL(clusterURL),
		URL:        clusterURL,
		Upstream:   clusterUpstream,
		ProxiedURL: clusterProxiedURL,
	})
}

// TestConformanceClusterNamespaceLayout runs the suite against the
// cluster with every record of a namespace in one hash slot
// (key_layout=namespace). The layout changes only key names, so the fault
// checks, which need the master of a key known before the namespace is
// (their proxy fronts one master), run with the per-key layout only.
func TestConformanceClusterNamespaceLayout(t *testing.T) {
	u := func(t testing.TB, prefix string) string { return clusterURL(t, prefix) + "&key_layout=namespace" }
	u(t, "")
	drivertest.Run(t, drivertest.Harness{Name: "redis-cluster-namespace", Open: openURL(u), URL: u})
}

// TestNamespaceLayoutOneSlot: with key_layout=namespace every record of a
// store — locks, circuits, cache entries, claims, checkpoints and fences
// of many keys — is in one hash slot; with the default layout they spread.
func TestNamespaceLayoutOneSlot(t *testing.T) {
	ctx := t.Context()
	c := clusterClient(t)
	for _, tc := range []struct {
		layout string
		slots  func(n int) bool
	}{
		{"namespace", func(n int) bool { return n == 1 }},
		{"key", func(n int) bool { return n > 1 }},
	} {
		prefix := "layout-" + tc.layout + time.Now().Format("150405.000000") + ":"
		st, err := warden.Open(ctx, clusterURL(t, prefix)+"&key_layout="+tc.layout)
		if err != nil {
			t.Fatal(err)
		}
		cleanNamespace(t, clusterURL(t, ""), prefix)
		d := st
		for i := range 20 {
			k := fmt.Sprint("k", i)
			if _, _, err := d.Locks().Acquire(ctx, k, "o", time.Minute); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Circuits().RecordFailure(ctx, k, 5); err != nil {
				t.Fatal(err)
			}
			if err := d.Cache().Set(ctx, k, []byte("v"), time.Minute); err != nil {
				t.Fatal(err)
			}
			if _, _, err := d.Idempotency().Claim(ctx, k, "o", time.Minute, ""); err != nil {
				t.Fatal(err)
			}
			if _, _, err := d.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: k, Progress: 1}); err != nil {
				t.Fatal(err)
			}
		}
		var mu sync.Mutex // ForEachMaster calls run concurrently
		slots := map[int64]bool{}
		n := 0
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error {
			iter := m.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				slot, err := m.ClusterKeySlot(ctx, iter.Val()).Result()
				if err != nil {
					return err
				}
				mu.Lock()
				slots[slot] = true
				mu.Unlock()
			}
			return iter.Err()
		})
		if err != nil {
			t.Fatal(err)
		}
		for range slots {
			n++
		}
		if !tc.slots(n) {
			t.Errorf("key_layout=%s: the store's records are in %d hash slots", tc.layout, n)
		}
		if keys, err := d.Cache().Keys(ctx, "k*"); err != nil || len(keys) != 20 {
			t.Errorf("key_layout=%s: Keys: %d keys, %v; want 20", tc.layout, len(keys), err)
		}
		st.Close()
	}
}

// clusterFaultKey is the lock key of drivertest's fault checks. Their
// workers touch only that key's hash slot (and subscribe to events, which
// any node serves), so a cluster client whose every connection goes
// through one proxy to that slot's master works; a key elsewhere would be
// redirected back to the proxy until the redirects run out, failing the
// check loudly.
const clusterFaultKey = "faulty-lock"

// clusterUpstream returns the address of the master serving the slot of
// clusterFaultKey's lock record.
func clusterUpstream(t testing.TB) string {
	c := clusterClient(t)
	h := fnv.New32a()
	h.Write([]byte(clusterFaultKey))
	slot, err := c.ClusterKeySlot(t.Context(), fmt.Sprintf("{%08x}", h.Sum32())).Result()
	if err != nil {
		t.Fatal(err)
	}
	slots, err := c.ClusterSlots(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) && len(s.Nodes) > 0 {
			return s.Nodes[0].Addr
		}
	}
	t.Fatalf("no master serves slot %d", slot)
	return ""
}

// clusterProxiedURL returns a URL of the test-only scheme redis-proxied,
// which opens a cluster client dialing every node through proxyAddr.
func clusterProxiedURL(t testing.TB, prefix, proxyAddr string) string {
	return "redis-proxied://" + proxyAddr + "?prefix=" + url.QueryEscape(prefix)
}

func init() {
	warden.Register("redis-proxied", func(ctx context.Context, u *url.URL, _ *slog.Logger) (driver.Store, error) {
		proxy := u.Host
		c := goredis.NewClusterClient(&goredis.ClusterOptions{
			Addrs: []string{proxy},
			Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, proxy)
			},
		})
		d, err := redis.NewDriver(c, &redis.Options{Prefix: u.Query().Get("prefix")})
		if err != nil {
			c.Close()
			return nil, err
		}
		return closeWith{d, c}, nil
	})
}

// closeWith is a store that closes its client with it.
type closeWith struct {
	driver.Store
	c *goredis.ClusterClient
}

func (s closeWith) Close() error {
	err := s.Store.Close()
	s.c.Close()
	return err
}

// WatchLocks forwards to the store's notifications.
func (s closeWith) WatchLocks(ctx context.Context) (<-chan driver.LockEvent, error) {
	return s.Store.(driver.LockNotifier).WatchLocks(ctx)
}

// WatchCircuits forwards to the store's notifications.
func (s closeWith) WatchCircuits(ctx context.Context) (<-chan driver.CircuitRecord, error) {
	return s.Store.(driver.CircuitNotifier).WatchCircuits(ctx)
}

// WaitLock forwards to the store's lock queue.
func (s closeWith) WaitLock(ctx context.Context, key, owner string, max time.Duration) (bool, error) {
	return s.Store.(driver.LockWaiter).WaitLock(ctx, key, owner, max)
}

// LeaveLock forwards to the store's lock queue.
func (s closeWith) LeaveLock(key, owner string) {
	s.Store.(driver.LockWaiter).LeaveLock(key, owner)
}
