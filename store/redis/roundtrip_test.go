package redis_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/redis"
)

// counter is a go-redis hook counting round trips: one per command sent
// alone, one per pipeline (per node it reaches).
type counter struct{ n atomic.Int64 }

func (c *counter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (c *counter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *counter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// singleClient returns a client of the single test server, closed when
// the test ends.
func singleClient(t testing.TB) *goredis.Client {
	o, err := goredis.ParseURL(serverURL(t, "")[:strings.Index(serverURL(t, ""), "?")])
	if err != nil {
		t.Fatal(err)
	}
	o.MaxRetries, o.ContextTimeoutEnabled = -1, true
	c := goredis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// clusterClient returns a client of the test cluster, closed when the
// test ends.
func clusterClient(t testing.TB) *goredis.ClusterClient {
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: clusterAddrs(t)})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestRoundTrips checks that each primitive is one round trip (once its
// script is loaded), on a single server and on the cluster.
func TestRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client func(testing.TB) goredis.UniversalClient
		url    func(testing.TB, string) string
	}{
		{"single", func(t testing.TB) goredis.UniversalClient { return singleClient(t) }, serverURL},
		{"cluster", func(t testing.TB) goredis.UniversalClient { return clusterClient(t) }, clusterURL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := tc.client(t)
			if err := client.Ping(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
			cnt := &counter{}
			client.AddHook(cnt)
			prefix := "roundtrips-" + tc.name + time.Now().Format("150405.000000") + ":"
			cleanNamespace(t, tc.url(t, ""), prefix)
			st, err := redis.New(client, &redis.Options{Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			ctx := t.Context()
			tag := time.Now().Format("150405.000000")
			key := "k" + tag
			var token, version, gen, epoch int64
			ops := []struct {
				name string
				f    func() error
			}{
				{"acquire", func() error {
					rec, _, err := st.Locks().Acquire(ctx, key, "a", time.Minute)
					token = rec.Token
					return err
				}},
				{"refresh", func() error { _, _, err := st.Locks().Refresh(ctx, key, "a", token, time.Minute); return err }},
				{"release", func() error { _, err := st.Locks().Release(ctx, key, "a", token); return err }},
				{"recordFailure", func() error { _, err := st.Circuits().RecordFailure(ctx, key, 5); return err }},
				// The gobreaker-style operations: one script each, whatever
				// it decides.
				{"recordOutcome (counted, threshold 0)", func() error {
					rec, err := st.Circuits().RecordOutcome(ctx, key, driver.Outcome{Kind: driver.OutcomeFailure, Successes: 1, Interval: time.Hour})
					version = rec.Version
					return err
				}},
				{"trip", func() error { _, _, err := st.Circuits().Trip(ctx, key, version); return err }},
				{"tryProbes (2 slots)", func() error {
					rec, _, err := st.Circuits().TryProbes(ctx, key, "p", 0, time.Minute, 2)
					gen, epoch = rec.Generation(), rec.ProbeEpoch
					return err
				}},
				{"recordOutcome (a probe slot no longer granted)", func() error {
					_, err := st.Circuits().RecordOutcome(ctx, key, driver.Outcome{Kind: driver.OutcomeSuccess, Gen: gen, ProbeEpoch: epoch + 1})
					return err
				}},
				{"recordOutcome (older generation)", func() error {
					_, err := st.Circuits().RecordOutcome(ctx, key, driver.Outcome{Kind: driver.OutcomeSuccess, Gen: gen - 1})
					return err
				}},
				{"recordOutcome (generation matches)", func() error {
					_, err := st.Circuits().RecordOutcome(ctx, key, driver.Outcome{Kind: driver.OutcomeSuccess, Gen: gen, ProbeEpoch: epoch, CloseAfter: 2})
					return err
				}},
				{"cache set", func() error { return st.Cache().Set(ctx, key, []byte("v"), time.Minute) }},
				{"cache get", func() error { _, _, err := st.Cache().Get(ctx, key); return err }},
				{"claim", func() error { _, _, err := st.Idempotency().Claim(ctx, key, "a", time.Minute, ""); return err }},
				{"checkpoint save", func() error {
					_, _, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: key, Progress: 50})
					return err
				}},
			}
			// First run: the scripts may need loading (EVALSHA, NOSCRIPT,
			// EVAL: two round trips). Later runs: one each.
			for round := 0; round < 3; round++ {
				for _, op := range ops {
					before := cnt.n.Load()
					if err := op.f(); err != nil {
						t.Fatalf("%s: %v", op.name, err)
					}
					got := cnt.n.Load() - before
					if round == 0 && got <= 2 {
						continue
					}
					if got != 1 {
						t.Errorf("round %d, %s: %d round trips, want 1", round, op.name, got)
					}
				}
			}
			handoffRoundTrips(t, tc.url(t, prefix), tc.client(t), st, cnt, key)
		})
	}
}

// handoffRoundTrips: with lock waiters queued (driver.LockWaiter), the
// lock primitives stay one round trip each: a release hands the key to
// the queue's head and wakes it in its own script, a woken waiter's
// acquire is one script, and its LeaveLock after acquiring sends nothing.
// key's scripts are loaded (the caller ran them).
func handoffRoundTrips(t *testing.T, u string, raw goredis.UniversalClient, st *warden.Store, cnt *counter, key string) {
	ctx := t.Context()
	other, err := redis.Open(ctx, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	trips := func(what string, want int64, f func() error) {
		t.Helper()
		before := cnt.n.Load()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := cnt.n.Load() - before; got != want {
			t.Errorf("%s: %d round trips, want %d", what, got, want)
		}
	}
	queued := func(owner string) {
		t.Helper()
		_, q, _ := redis.QueueKeys(st, key, "")
		for {
			owners, err := raw.ZRange(ctx, q, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			if slices.Contains(owners, owner) {
				return
			}
			time.Sleep(5 * time.Millisecond) // polling the server's state
		}
	}
	wait := func(st *warden.Store, owner string) <-chan error {
		ch := make(chan error, 1)
		go func() {
			again, err := st.Driver().(driver.LockWaiter).WaitLock(ctx, key, owner, time.Minute)
			if err == nil && !again {
				err = errors.New("WaitLock returned false")
			}
			ch <- err
		}()
		return ch
	}
	// This store's waiter, woken by another store's release.
	rec, ok, err := other.Locks().Acquire(ctx, key, "h", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire: ok=%v err=%v", ok, err)
	}
	woken := wait(st, "w")
	queued("w")
	if _, err := other.Locks().Release(ctx, key, "h", rec.Token); err != nil {
		t.Fatal(err)
	}
	if err := <-woken; err != nil {
		t.Fatal(err)
	}
	trips("acquire (a woken waiter)", 1, func() error {
		rec, ok, err = st.Locks().Acquire(ctx, key, "w", time.Minute)
		if err == nil && !ok {
			err = fmt.Errorf("not acquired: held by %q", rec.Owner)
		}
		return err
	})
	trips("LeaveLock after acquiring", 0, func() error {
		st.Driver().(driver.LockWaiter).LeaveLock(key, "w")
		return nil
	})
	// Another store's waiter, handed the key by this store's release.
	woken = wait(other, "x")
	queued("x")
	trips("release (a waiter queued)", 1, func() error {
		ok, err := st.Locks().Release(ctx, key, "w", rec.Token)
		if err == nil && !ok {
			err = errors.New("not released")
		}
		return err
	})
	if err := <-woken; err != nil {
		t.Fatal(err)
	}
	other.Driver().(driver.LockWaiter).LeaveLock(key, "x")
}

// TestScriptsReload: a server that lost its scripts (SCRIPT FLUSH, a
// restart, a failover to a replica that never ran them) gets them again
// from the next call, which succeeds.
func TestScriptsReload(t *testing.T) {
	client := singleClient(t)
	cnt := &counter{}
	client.AddHook(cnt)
	prefix := "reload-" + time.Now().Format("150405.000000") + ":"
	cleanNamespace(t, serverURL(t, ""), prefix)
	st, err := redis.New(client, &redis.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := t.Context()
	key := "k" + time.Now().Format("150405.000000")
	if _, _, err := st.Locks().Acquire(ctx, key, "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	before := cnt.n.Load()
	rec, ok, err := st.Locks().Acquire(ctx, key, "a", time.Minute)
	if err != nil || !ok || rec.Owner != "a" {
		t.Fatalf("Acquire after SCRIPT FLUSH: ok=%v err=%v", ok, err)
	}
	if got := cnt.n.Load() - before; got != 2 {
		t.Errorf("Acquire after SCRIPT FLUSH: %d round trips, want 2 (EVALSHA refused, EVAL)", got)
	}
	// Listing pipelines EVALSHA: it loads the script and runs again.
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	recs, err := st.Locks().List(ctx, key)
	if err != nil || len(recs) != 1 {
		t.Fatalf("List after SCRIPT FLUSH: %v, %v", recs, err)
	}
}
