package mongo_test

import (
	"context"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/drivertest"
	"github.com/warden-go/warden/recordlock/recordlocktest"
	"github.com/warden-go/warden/store/mongo"
	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// testDatabase is the database the tests use on the test server.
const testDatabase = "warden_test"

// TestMain lets the conformance suite re-execute this test binary as the
// child processes of its multi-process checks, and runs the hand-off
// test's waiter process.
func TestMain(m *testing.M) {
	recordlocktest.Child(recordHarness)
	if spec, ok := os.LookupEnv(handoffChildEnv); ok {
		os.Exit(runHandoffChild(spec))
	}
	if spec, ok := os.LookupEnv(fairChildEnv); ok {
		os.Exit(runFairChild(spec))
	}
	if os.Getenv("WARDEN_DRIVERTEST_CHILD") == "" {
		dropTestDatabase()
	}
	drivertest.Main(m)
}

// dropTestDatabase drops the test database left by an earlier run, so that
// every run starts from empty collections — only when the tests chose the
// database (the server URL names none).
func dropTestDatabase() {
	raw := os.Getenv("WARDEN_TEST_MONGODB_URL")
	u, err := url.Parse(raw)
	if raw == "" || err != nil || (u.Path != "" && u.Path != "/") || u.Query().Get("database") != "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := mongodrv.Connect(options.Client().ApplyURI(raw))
	if err != nil {
		return
	}
	defer client.Disconnect(ctx)
	_ = client.Database(testDatabase).Drop(ctx)
}

// serverURL returns the test server's URL with the test database (unless
// the URL names one) and ?prefix=.
func serverURL(t testing.TB, prefix string) string {
	u := drivertest.ServerURL(t, "mongodb", "WARDEN_TEST_MONGODB_URL")
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	q := p.Query()
	if (p.Path == "" || p.Path == "/") && q.Get("database") == "" {
		q.Set("database", testDatabase)
	}
	// Values of 1.5 MiB exercise the limit without shipping 16 MiB
	// documents through every check (TestDefaultValueLimit tries the
	// default); a small event collection keeps tailing cheap.
	if q.Get("max_value_bytes") == "" {
		q.Set("max_value_bytes", "1572864")
	}
	if q.Get("events_size") == "" {
		q.Set("events_size", "524288")
	}
	if q.Get("events_retention") == "" {
		q.Set("events_retention", "10s")
	}
	q.Set("prefix", prefix)
	p.RawQuery = q.Encode()
	return p.String()
}

// testDB returns a database handle on the test server from a client of
// the test's own (closed when the test ends), with extra client options.
func testDB(t testing.TB, co *options.ClientOptions) *mongodrv.Database {
	raw := serverURL(t, "")
	u, _ := url.Parse(raw)
	db := u.Query().Get("database")
	if db == "" {
		db = u.Path[1:]
	}
	q := u.Query()
	q.Del("database")
	q.Del("prefix")
	u.RawQuery = q.Encode()
	if co == nil {
		co = options.Client()
	}
	client, err := mongodrv.Connect(options.MergeClientOptions(options.Client().ApplyURI(u.String()), co))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	return client.Database(db)
}

var (
	cleanOnce sync.Once
	cleanDB   *mongodrv.Database
)

// cleanNamespace deletes the namespace's documents when the check ends, so
// that the collections hold only the data of the checks running: FerretDB
// reads a whole collection for every conditional update.
func cleanNamespace(t testing.TB, prefix string, names mongo.Collections) {
	cleanOnce.Do(func() {
		u, _ := url.Parse(serverURL(t, ""))
		q := u.Query()
		db := q.Get("database")
		q.Del("database")
		q.Del("prefix")
		q.Del("max_value_bytes")
		q.Del("events_size")
		q.Del("events_retention")
		u.RawQuery = q.Encode()
		if db == "" {
			db = u.Path[1:]
		}
		client, err := mongodrv.Connect(options.Client().ApplyURI(u.String()))
		if err != nil {
			t.Fatal(err)
		}
		cleanDB = client.Database(db)
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, c := range []struct{ name, def string }{
			{names.Locks, mongo.DefaultLocksCollection}, {names.Circuits, mongo.DefaultCircuitsCollection},
			{names.Cache, mongo.DefaultCacheCollection}, {names.Idempotency, mongo.DefaultIdempotencyCollection},
			{names.Checkpoints, mongo.DefaultCheckpointsCollection}, {names.Fences, mongo.DefaultFencesCollection},
		} {
			if c.name == "" {
				c.name = c.def
			}
			_, _ = cleanDB.Collection(c.name).DeleteMany(ctx, bson.D{{Key: "namespace", Value: prefix}})
		}
	})
}

// serverAddr returns the host:port of the test server for the fault
// checks' proxies, or "" if its URL names several hosts or an SRV record
// (a proxy stands in for one server).
func serverAddr(t testing.TB) string {
	p, err := url.Parse(serverURL(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	if p.Scheme != "mongodb" || strings.Contains(p.Host, ",") {
		return ""
	}
	if p.Port() == "" {
		return net.JoinHostPort(p.Hostname(), "27017")
	}
	return p.Host
}

// proxiedURL returns serverURL(t, prefix) with the server reached through
// proxyAddr, connecting directly: no topology discovery that would lead
// the driver to the server's own address.
func proxiedURL(t testing.TB, prefix, proxyAddr string) string {
	p, err := url.Parse(serverURL(t, prefix))
	if err != nil {
		t.Fatal(err)
	}
	p.Host = proxyAddr
	q := p.Query()
	q.Set("directConnection", "true")
	p.RawQuery = q.Encode()
	return p.String()
}

// bulkyChecks are the conformance checks that fill a collection with a
// thousand records or more. The FerretDB test server reads a whole
// collection for every filter but one on _id alone (a conditional update,
// a lookup with $or), so beside them every other check would slow down:
// they run on collections of their own, shared among them (each fills a
// different kind).
var bulkyChecks = []string{"/Locks/ListPaging", "/Cache/KeysPaging", "/Checkpoints/Paging"}

var bulkCollections = mongo.Collections{
	Locks: "bulk_locks", Circuits: "bulk_circuits", Cache: "bulk_cache", Idempotency: "bulk_idempotency",
	Checkpoints: "bulk_checkpoints", Fences: "bulk_fences", Events: "bulk_events",
}

const bulkCollectionParams = "locks_collection=bulk_locks&circuits_collection=bulk_circuits&cache_collection=bulk_cache" +
	"&idempotency_collection=bulk_idempotency&checkpoints_collection=bulk_checkpoints&fences_collection=bulk_fences&events_collection=bulk_events"

// conformanceURL is the URL of a conformance check's namespace: on the
// bulky checks' collections for those.
func conformanceURL(t testing.TB, prefix string) (string, mongo.Collections) {
	for _, b := range bulkyChecks {
		if strings.HasSuffix(t.Name(), b) {
			return serverURL(t, prefix) + "&" + bulkCollectionParams, bulkCollections
		}
	}
	return serverURL(t, prefix), mongo.Collections{}
}

// TestConformance runs the whole conformance suite — driver checks and the
// portable packages, in goroutines and in separate OS processes, and the
// fault checks through proxies — against the test server, each check in
// its own namespace, on stores opened by URL.
func TestConformance(t *testing.T) {
	serverURL(t, "")
	h := drivertest.Harness{
		Name: "mongodb",
		Open: func(t testing.TB, prefix string) *warden.Store {
			u, names := conformanceURL(t, prefix)
			st, err := mongo.Open(context.Background(), u, nil)
			if err != nil {
				t.Fatal(err)
			}
			cleanNamespace(t, prefix, names)
			return st
		},
		URL: func(t testing.TB, prefix string) string {
			u, _ := conformanceURL(t, prefix)
			return u
		},
	}
	if serverAddr(t) != "" {
		h.Upstream, h.ProxiedURL = serverAddr, proxiedURL
	}
	drivertest.Run(t, h)
}

// newCollections are the collections of TestConformanceNew: custom names
// (which the suite thereby covers), and half the documents per collection
// on the FerretDB test server, which reads a whole collection for every
// conditional update.
var newCollections = mongo.Collections{
	Locks: "wn_locks", Circuits: "wn_circuits", Cache: "wn_cache", Idempotency: "wn_idempotency",
	Checkpoints: "wn_checkpoints", Fences: "wn_fences", Events: "wn_events",
}

const newCollectionParams = "locks_collection=wn_locks&circuits_collection=wn_circuits&cache_collection=wn_cache" +
	"&idempotency_collection=wn_idempotency&checkpoints_collection=wn_checkpoints&fences_collection=wn_fences&events_collection=wn_events"

// TestConformanceNew runs the suite on stores made by New on one shared
// client of the caller's (which stays connected when the stores close),
// with collections of other names.
func TestConformanceNew(t *testing.T) {
	serverURL(t, "")
	var once sync.Once
	var db *mongodrv.Database
	drivertest.Run(t, drivertest.Harness{
		Name: "mongodb-new",
		// The same statements as TestConformance on other names: the
		// groups where how the store was made shows.
		Groups: drivertest.ConstructionGroups,
		Open: func(tb testing.TB, prefix string) *warden.Store {
			once.Do(func() { db = testDB(t, nil) })
			on := db
			if strings.Contains(tb.Name(), "/Leaks/") {
				// The leak check counts the process's connections: the
				// shared client's pool may grow by one connection during
				// it, which is the client's and stays. Its stores get a
				// client of their own, disconnected when the cycle ends.
				on = testDB(tb, nil)
			}
			st, err := mongo.New(on, &mongo.Options{Prefix: prefix, Collections: newCollections})
			if err != nil {
				tb.Fatal(err)
			}
			cleanNamespace(tb, prefix, newCollections)
			return st
		},
		// Child processes open the same database and collections by URL.
		URL: func(t testing.TB, prefix string) string {
			return serverURL(t, prefix) + "&" + newCollectionParams
		},
	})
}
