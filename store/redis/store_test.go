package redis_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/drivertest"
	"github.com/warden-go/warden/store/redis"
)

// TestEventsLostOnReconnect: when the server drops the store's pub/sub
// connection, events published before go-redis subscribes again are lost;
// watchers get EventsLost, and events flow again afterwards. On a single
// server and on the cluster (whose subscription lives on one of its nodes).
func TestEventsLostOnReconnect(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		o, err := goredis.ParseURL(strings.Split(serverURL(t, ""), "?")[0])
		if err != nil {
			t.Fatal(err)
		}
		name := "warden-events-test-" + time.Now().Format("150405.000000")
		o.ClientName = name
		o.MaxRetries, o.ContextTimeoutEnabled = -1, true
		eventsLostOnReconnect(t, goredis.NewClient(o), name, serverURL, []goredis.UniversalClient{singleClient(t)})
	})
	t.Run("cluster", func(t *testing.T) {
		name := "warden-events-test-" + time.Now().Format("150405.000000")
		c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: clusterAddrs(t), ClientName: name})
		var nodes []goredis.UniversalClient
		for _, a := range clusterAddrs(t) {
			n := goredis.NewClient(&goredis.Options{Addr: a})
			t.Cleanup(func() { n.Close() })
			nodes = append(nodes, n)
		}
		eventsLostOnReconnect(t, c, name, clusterURL, nodes)
	})
}

// eventsLostOnReconnect runs TestEventsLostOnReconnect with a watcher on
// watchClient (whose connections are named name), an actor opened by
// url, and the servers' nodes, on which the subscription is killed.
func eventsLostOnReconnect(t *testing.T, watchClient goredis.UniversalClient, name string, url func(testing.TB, string) string, nodes []goredis.UniversalClient) {
	ctx := t.Context()
	defer watchClient.Close()
	prefix := "reconnect-" + time.Now().Format("150405000000") + ":"
	watcher, err := redis.New(watchClient, &redis.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	actor, err := redis.Open(ctx, url(t, prefix), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer actor.Close()
	cleanNamespace(t, url(t, ""), prefix)

	ch, err := watcher.Locks().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// next returns the next event; it waits as long as that takes (an
	// event that never comes is reported by go test's -timeout).
	next := func(what string) driver.LockEvent {
		t.Helper()
		ev, ok := <-ch
		if !ok {
			t.Fatalf("%s: the watch channel closed", what)
		}
		return ev
	}
	acquire := func(key string) {
		t.Helper()
		if _, ok, err := actor.Locks().Acquire(ctx, key, "alice", time.Minute); err != nil || !ok {
			t.Fatalf("Acquire %s: ok=%v err=%v", key, ok, err)
		}
	}
	// Watch returns once the server confirmed the subscription.
	acquire("before")
	if ev := next("before the reconnection"); ev.Kind != driver.LockAcquired || ev.Key != "before" {
		t.Fatalf("first event %+v, want acquired 'before'", ev)
	}

	// Kill the watcher's subscription connection, only that one.
	killed := 0
	for _, admin := range nodes {
		list, err := admin.Do(ctx, "CLIENT", "LIST", "TYPE", "pubsub").Text()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(list, "\n") {
			if !strings.Contains(line, " name="+name+" ") {
				continue
			}
			id := strings.TrimPrefix(strings.Fields(line)[0], "id=")
			if err := admin.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil {
				t.Fatal(err)
			}
			killed++
		}
	}
	if killed != 1 {
		t.Fatalf("found %d subscription connections named %s, want 1", killed, name)
	}
	if ev := next("after the connection was killed"); ev.Kind != driver.EventsLost {
		t.Fatalf("event after the connection was killed: %+v, want EventsLost", ev)
	}
	// Events flow again once resubscribed: make events until one comes.
	for {
		acquire("after")
		ev := next("after the reconnection")
		if ev.Kind == driver.EventsLost {
			continue
		}
		if ev.Kind != driver.LockAcquired || ev.Key != "after" {
			t.Fatalf("event after the reconnection: %+v, want acquired 'after'", ev)
		}
		break
	}
}

// TestBadOptions: bad prefixes, URLs and clients are refused with an
// error that says why and never shows the password.
func TestBadOptions(t *testing.T) {
	ctx := context.Background()
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer c.Close()
	retrying := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	defer retrying.Close()
	if _, err := redis.New(retrying, nil); !errors.Is(err, redis.ErrClientRetries) {
		t.Errorf("a client retrying commands: err %v, want ErrClientRetries", err)
	}
	for _, p := range []string{"a{b}:", "{x}:", "nocolon"} {
		if _, err := redis.New(c, &redis.Options{Prefix: p}); !errors.Is(err, driver.ErrBadPrefix) {
			t.Errorf("prefix %q: err %v, want ErrBadPrefix", p, err)
		}
	}
	if _, err := redis.New(c, &redis.Options{KeyLayout: redis.TagPerNamespace + 1}); err == nil {
		t.Error("an unknown KeyLayout: no error")
	}
	if _, err := redis.New(nil, nil); err == nil {
		t.Error("New(nil): no error")
	}
	for _, u := range []string{
		"redis://u:s3cret@127.0.0.1:6379/0?bogus=1",
		"redis://u:s3cret@127.0.0.1:6379/x",
		"redis://u:s3cret@127.0.0.1:6379/1?cluster=true",
		"redis://u:s3cret@127.0.0.1:6379?cluster=true&master_name=m",
		"unix://host/path",
		"redis://u:s3cret@127.0.0.1:6379?max_value_bytes=-1",
		"redis://u:s3cret@127.0.0.1:6379?key_layout=slot",
	} {
		_, err := warden.Open(ctx, u)
		if !errors.Is(err, driver.ErrBadURL) {
			t.Errorf("%s: err %v, want ErrBadURL", u, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows the password: %v", u, err)
		}
	}
	// A server that does not answer: an error without the password.
	_, err := warden.Open(ctx, "redis://u:s3cret@127.0.0.1:1/0?dial_timeout=100ms")
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("unreachable server: err %v", err)
	}
}

// TestCloseLeavesClient: a client given to New stays usable after the
// store closes; watches end with the store.
func TestCloseLeavesClient(t *testing.T) {
	c := singleClient(t)
	st, err := redis.New(c, &redis.Options{Prefix: "close:"})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := st.Locks().Watch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	for range ch {
	}
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Errorf("the client given to New was closed with the store: %v", err)
	}
	if _, _, err := st.Locks().Acquire(t.Context(), "k", "o", time.Minute); !errors.Is(err, warden.ErrClosed) {
		t.Errorf("Acquire after Close: %v, want ErrClosed", err)
	}
}

// TestSentinel opens the store through a Sentinel (URL master_name=) and
// checks that locks, events and the cache work through the failover
// client it makes.
func TestSentinel(t *testing.T) {
	addrs := strings.Split(drivertest.ServerURL(t, "redis-sentinel", "WARDEN_TEST_REDIS_SENTINEL_ADDRS"), ",")
	prefix := "sentinel-" + time.Now().Format("150405000000") + ":"
	u := "redis://" + addrs[0] + "?master_name=warden&prefix=" + prefix
	for _, a := range addrs[1:] {
		u += "&addr=" + a
	}
	ctx := t.Context()
	st, err := warden.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cleanNamespace(t, serverURL(t, ""), prefix)
	ch, err := st.Locks().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rec, ok, err := st.Locks().Acquire(ctx, "k", "alice", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire: ok=%v err=%v", ok, err)
	}
	// The event is awaited as long as it takes: one that never comes is
	// reported by go test's -timeout.
	if ev, ok := <-ch; !ok {
		t.Fatal("the watch channel closed without an event")
	} else if ev.Kind != driver.LockAcquired || ev.Key != "k" || ev.Token != rec.Token {
		t.Errorf("event %+v, want acquired k token %d", ev, rec.Token)
	}
	if ok, err := st.Locks().Release(ctx, "k", "alice", rec.Token); err != nil || !ok {
		t.Fatalf("Release: ok=%v err=%v", ok, err)
	}
	if err := st.Cache().Set(ctx, "c", []byte("v"), time.Minute); err != nil {
		t.Fatal(err)
	}
	// The Sentinel's master is the single test server: a store opened
	// there sees the value.
	direct, err := redis.Open(ctx, serverURL(t, prefix), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if e, found, err := direct.Cache().Get(ctx, "c"); err != nil || !found || string(e.Value) != "v" {
		t.Errorf("the value set through the Sentinel: %q found=%v err=%v", e.Value, found, err)
	}
}

// TestTokensIncreaseAfterRecordDeleted: another program deleting a lock
// record (DEL, or eviction) between two holdings never makes the next
// holder's token equal to or below the previous one, even when both
// holdings begin within one millisecond of server time.
func TestTokensIncreaseAfterRecordDeleted(t *testing.T) {
	ctx := t.Context()
	prefix := "deleted-" + time.Now().Format("150405000000") + ":"
	st, err := redis.Open(ctx, serverURL(t, prefix), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cleanNamespace(t, serverURL(t, ""), prefix)
	admin := singleClient(t)
	var last int64
	for i := range 300 {
		owner := "o" + strings.Repeat("x", i%2)
		rec, ok, err := st.Locks().Acquire(ctx, "k", owner, time.Minute)
		if err != nil || !ok {
			t.Fatalf("Acquire %d: ok=%v err=%v", i, ok, err)
		}
		if rec.Token <= last {
			t.Fatalf("Acquire %d after the record was deleted: token %d, previous %d", i, rec.Token, last)
		}
		last = rec.Token
		keys, err := admin.Keys(ctx, prefix+"*").Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("the namespace's keys: %v, %v; want the one lock record", keys, err)
		}
		if err := admin.Del(ctx, keys[0]).Err(); err != nil {
			t.Fatal(err)
		}
	}
}
