package mysql_test

import (
	"context"
	"net"
	"net/url"
	"os"
	"testing"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/drivertest"
	"github.com/warden-go/warden/store/mysql"
)

// TestMain lets the conformance suite re-execute this test binary as the
// child processes of its multi-process checks.
// It also runs the stress test's child processes.
func TestMain(m *testing.M) {
	if js, ok := os.LookupEnv(stressChildEnv); ok {
		os.Exit(runStressChild(js))
	}
	recordsChild()
	drivertest.Main(m)
}

// serverURL returns the test server's mysql:// URL with ?prefix=.
func serverURL(t testing.TB, prefix string) string {
	u := drivertest.ServerURL(t, "mysql", "WARDEN_TEST_MYSQL_URL")
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
		return net.JoinHostPort(p.Hostname(), "3306")
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

// TestConformance runs the whole conformance suite — driver checks and the
// portable packages, in goroutines and in separate OS processes, and the
// fault checks through proxies — against the test server, each check in
// its own namespace.
func TestConformance(t *testing.T) {
	serverURL(t, "")
	drivertest.Run(t, drivertest.Harness{
		Name: "mysql",
		Open: func(t testing.TB, prefix string) *warden.Store {
			st, err := mysql.Open(context.Background(), serverURL(t, prefix), nil)
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
		URL:        serverURL,
		Upstream:   serverAddr,
		ProxiedURL: proxiedURL,
	})
}

// TestConformanceNew runs the suite on stores made by
// New on the caller's own *sql.DB, with a plain go-sql-driver DSN (server-
// side prepared statements, no clientFoundRows, no session time zone).
func TestConformanceNew(t *testing.T) {
	serverURL(t, "")
	drivertest.Run(t, drivertest.Harness{
		Name: "mysql-new",
		Open: func(t testing.TB, prefix string) *warden.Store {
			st, _ := newCountingStore(t, prefix, false)
			return st
		},
		// Child processes open the same database by URL; the parent's side
		// of every multi-process check uses New.
		URL: serverURL,
	})
}
