package dynamo_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/drivertest"
	"github.com/warden-go/warden/store/dynamo"
)

// TestMain lets the conformance suite re-execute this test binary as the
// child processes of its multi-process checks.
func TestMain(m *testing.M) {
	recordChild()
	drivertest.Main(m)
}

// endpoint returns the test server's endpoint, or skips (fails with
// WARDEN_TEST_REQUIRE) without one.
func endpoint(t testing.TB) string {
	return drivertest.ServerURL(t, "dynamodb", "WARDEN_TEST_DYNAMODB_ENDPOINT")
}

// newClient returns a client of the test endpoint with the given stack
// changes (see countAttempts, dropReply). Its idle connections are closed
// when t ends.
func newClient(t testing.TB, mws ...func(*middleware.Stack) error) *dynamodb.Client {
	ep := endpoint(t)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(ep),
		Credentials:  credentials.NewStaticCredentialsProvider("warden-test", "warden-test", ""),
		HTTPClient:   &http.Client{Transport: tr},
		APIOptions:   mws,
	})
}

// countAttempts counts every request the client sends: the middleware
// sits after the SDK's retry middleware, so each attempt counts.
func countAttempts(n *atomic.Int64) func(*middleware.Stack) error {
	return func(st *middleware.Stack) error {
		return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("warden-count",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				n.Add(1)
				return next.HandleFinalize(ctx, in)
			}), middleware.After)
	}
}

// testTable returns a fresh table name; the table (created by the first
// store that opens it) is deleted when t ends.
func testTable(t testing.TB) string {
	c := newClient(t)
	name := fmt.Sprintf("warden_test_%016x", rand.Uint64())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := dynamo.DeleteTable(ctx, c, name); err != nil {
			t.Errorf("deleting test table: %v", err)
		}
	})
	return name
}

// groupTables gives each conformance check (Locks/Exclusion,
// HostileKeys/Patterns, …) a table of its own, so that the listing
// checks, which Scan the whole table, do not read every other check's
// items (dynalite serves one request at a time: long Scans delay every
// other check's requests). The tables are created by the first store that
// opens them and deleted when the test ends.
type groupTables struct {
	base  string
	mu    sync.Mutex
	names map[string]bool
}

func newGroupTables(t *testing.T) *groupTables {
	g := &groupTables{base: fmt.Sprintf("warden_test_%012x", rand.Uint64()>>16), names: map[string]bool{}}
	c := newClient(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		g.mu.Lock()
		defer g.mu.Unlock()
		for name := range g.names {
			if err := dynamo.DeleteTable(ctx, c, name); err != nil {
				t.Errorf("deleting test table: %v", err)
			}
		}
	})
	return g
}

// table returns the table of t's check.
func (g *groupTables) table(t testing.TB) string {
	parts := strings.Split(t.Name(), "/")
	group := "x"
	if len(parts) > 1 {
		group = strings.Join(parts[1:min(3, len(parts))], "_")
	}
	name := g.base + "_" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, group)
	g.mu.Lock()
	g.names[name] = true
	g.mu.Unlock()
	return name
}

// url returns the dynamodb:// URL of t's check's table in a namespace.
func (g *groupTables) url(t testing.TB, prefix string) string {
	return storeURL(g.table(t))(t, prefix)
}

// storeURL returns a function giving the dynamodb:// URL of table in a
// namespace.
func storeURL(table string) func(t testing.TB, prefix string) string {
	return func(t testing.TB, prefix string) string {
		q := url.Values{}
		q.Set("endpoint", endpoint(t))
		q.Set("region", "us-east-1")
		if prefix != "" {
			q.Set("prefix", prefix)
		}
		return "dynamodb://" + table + "?" + q.Encode()
	}
}

// endpointAddr returns the host:port of the test endpoint for the fault
// checks' proxies, or "" for an https:// endpoint (whose certificate would
// not name the proxy).
func endpointAddr(t testing.TB) string {
	e, err := url.Parse(endpoint(t))
	if err != nil {
		t.Fatal(err)
	}
	if e.Scheme != "http" {
		return ""
	}
	if e.Port() == "" {
		return net.JoinHostPort(e.Hostname(), "80")
	}
	return e.Host
}

// proxiedURL returns the dynamodb:// URL of t's check's table in a
// namespace, with the endpoint reached through proxyAddr.
func (g *groupTables) proxiedURL(t testing.TB, prefix, proxyAddr string) string {
	u, err := url.Parse(g.url(t, prefix))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("endpoint", "http://"+proxyAddr)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestConformance runs the whole conformance suite — driver checks and the
// portable packages, in goroutines and in separate OS processes, and the
// fault checks through proxies — against the test server, each check in a
// table and a namespace of its own.
func TestConformance(t *testing.T) {
	endpoint(t)
	g := newGroupTables(t)
	h := drivertest.Harness{
		Name: "dynamodb",
		Open: func(t testing.TB, prefix string) *warden.Store {
			st, err := dynamo.Open(context.Background(), g.url(t, prefix), nil)
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
		URL: g.url,
	}
	if endpointAddr(t) != "" {
		h.Upstream, h.ProxiedURL = endpointAddr, g.proxiedURL
	}
	drivertest.Run(t, h)
}

// TestConformanceNew runs the suite on stores made by New on the caller's
// own client, in other tables.
func TestConformanceNew(t *testing.T) {
	endpoint(t)
	g := newGroupTables(t)
	drivertest.Run(t, drivertest.Harness{
		Name: "dynamodb-new",
		// The same statements as TestConformance on other names: the
		// groups where how the store was made shows.
		Groups: drivertest.ConstructionGroups,
		Open: func(t testing.TB, prefix string) *warden.Store {
			st, err := dynamo.New(newClient(t), g.table(t), &dynamo.Options{Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
		URL: g.url,
	})
}
