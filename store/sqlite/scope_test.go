package sqlite_test

import (
	"context"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/internal/scopetest"
	"github.com/warden-go/warden/store/sqlite"
)

// TestScope runs the store checks of package scope (internal/scopetest) —
// lost leases, idempotent tasks, checkpoint resumption, retries stopped by
// an open breaker, Run waiting for its tasks — on one database file, in
// goroutines and in child processes (TestScopeHelperProcess).
func TestScope(t *testing.T) {
	path := filepath.Join(t.TempDir(), "scope.db")
	scopetest.Run(t, scopetest.Harness{
		Name: "sqlite",
		Open: func(t testing.TB, prefix string) *warden.Store {
			st, err := sqlite.Open(context.Background(), path, &sqlite.Options{Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
		URL: func(t testing.TB, prefix string) string {
			return "sqlite://" + path + "?prefix=" + url.QueryEscape(prefix)
		},
	})
}

// TestScopeHelperProcess is the child of TestScope's process checks.
func TestScopeHelperProcess(t *testing.T) { scopetest.HelperProcess(t) }
