package postgres_test

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/drivertest"
	"github.com/warden-go/warden/recordlock/recordlocktest"
	"github.com/warden-go/warden/store/postgres"
)

// TestMain lets the conformance suites (drivertest's and recordlocktest's)
// re-execute this test binary as the child processes of their
// multi-process checks.
func TestMain(m *testing.M) {
	recordlocktest.Child(recordsChildHarness())
	drivertest.Main(m)
}

// serverURL returns the test server's postgres:// URL with ?prefix=.
func serverURL(t testing.TB, prefix string) string {
	u := drivertest.ServerURL(t, "postgres", "WARDEN_TEST_POSTGRES_URL")
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	q := p.Query()
	q.Set("prefix", prefix)
	p.RawQuery = q.Encode()
	return p.String()
}

// serverAddr returns the test server's host:port, for the fault checks'
// proxies.
func serverAddr(t testing.TB) string {
	p, err := url.Parse(serverURL(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	if p.Port() == "" {
		return net.JoinHostPort(p.Hostname(), "5432")
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

// runSuite runs the whole conformance suite — driver checks and the
// portable packages, in goroutines and in separate OS processes, and the
// fault checks through proxies — against the test server, each check in
// its own namespace, on stores open makes. Child processes open stores by
// URL.
// groups, if non-nil, limits the run to those groups (Harness.Groups).
func runSuite(t *testing.T, name string, groups []string, open func(t testing.TB, prefix string) (*warden.Store, error)) {
	serverURL(t, "")
	drivertest.Run(t, drivertest.Harness{
		Name: name,
		Open: func(t testing.TB, prefix string) *warden.Store {
			st, err := open(t, prefix)
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
		URL:        serverURL,
		Upstream:   serverAddr,
		ProxiedURL: proxiedURL,
		Groups:     groups,
	})
}

// TestConformance runs the suite on stores opened by URL.
func TestConformance(t *testing.T) {
	runSuite(t, "postgres", nil, func(t testing.TB, prefix string) (*warden.Store, error) {
		return postgres.Open(context.Background(), serverURL(t, prefix), nil)
	})
}

// stillOpen fails t at its end if ping fails: a handle given to New or
// NewDB must stay open when the store closes.
func stillOpen(t testing.TB, what string, ping func() error, close func()) {
	t.Cleanup(func() {
		if err := ping(); err != nil {
			t.Errorf("the %s given to the store was closed with it: %v", what, err)
		}
		close()
	})
}

// TestConformanceNew runs the suite on stores made by New on the caller's
// own pgxpool.Pool: the statements of TestConformance's stores (Open makes
// a pgxpool.Pool too), so the groups where how the store was made shows.
func TestConformanceNew(t *testing.T) {
	runSuite(t, "postgres-new", drivertest.ConstructionGroups, func(t testing.TB, prefix string) (*warden.Store, error) {
		pool, err := pgxpool.New(context.Background(), drivertest.ServerURL(t, "postgres", "WARDEN_TEST_POSTGRES_URL"))
		if err != nil {
			return nil, err
		}
		stillOpen(t, "pool", func() error { return pool.Ping(context.Background()) }, pool.Close)
		return postgres.New(pool, &postgres.Options{Prefix: prefix})
	})
}

// TestConformanceDB runs the suite on stores made by NewDB on the caller's
// own *sql.DB of the pgx stdlib driver.
func TestConformanceDB(t *testing.T) {
	runSuite(t, "postgres-db", nil, func(t testing.TB, prefix string) (*warden.Store, error) {
		cfg, err := pgxpool.ParseConfig(drivertest.ServerURL(t, "postgres", "WARDEN_TEST_POSTGRES_URL"))
		if err != nil {
			return nil, err
		}
		db := stdlib.OpenDB(*cfg.ConnConfig)
		stillOpen(t, "*sql.DB", db.Ping, func() { db.Close() })
		return postgres.NewDB(db, &postgres.Options{Prefix: prefix})
	})
}

// TestNewDBRefusesOtherDrivers: NewDB says what it needs instead of
// failing later.
func TestNewDBRefusesOtherDrivers(t *testing.T) {
	db := sql.OpenDB(fakeConnector{})
	defer db.Close()
	if _, err := postgres.NewDB(db, nil); err == nil || !strings.Contains(err.Error(), "pgx stdlib") {
		t.Fatalf("NewDB on another driver: %v, want an error naming the pgx stdlib driver", err)
	}
	if _, err := postgres.NewDB(nil, nil); err == nil {
		t.Fatal("NewDB(nil) did not fail")
	}
	if _, err := postgres.New(nil, nil); err == nil {
		t.Fatal("New(nil) did not fail")
	}
}

type fakeConnector struct{}

func (fakeConnector) Connect(context.Context) (sqldriver.Conn, error) { return nil, errors.New("no") }
func (fakeConnector) Driver() sqldriver.Driver                        { return fakeDriver{} }

type fakeDriver struct{}

func (fakeDriver) Open(string) (sqldriver.Conn, error) { return nil, errors.New("no") }
