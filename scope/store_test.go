package scope_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/rpcstore"
	"github.com/warden-go/warden/internal/scopetest"
	"github.com/warden-go/warden/store/memory"
)

// TestMemory runs the store checks of internal/scopetest on the memory
// store: stores opened by URL on one named database, which the child
// processes of the process checks reach through the RPC bridge.
func TestMemory(t *testing.T) {
	const db = "scope-memory"
	srv := rpcstore.Serve(t, func(prefix string) driver.Store {
		return memory.NewDriver(&memory.Options{Name: db, Prefix: prefix})
	})
	scopetest.Run(t, scopetest.Harness{
		Name: "memory",
		Open: func(t testing.TB, prefix string) *warden.Store {
			st, err := warden.Open(context.Background(), "memory://"+db+"?prefix="+url.QueryEscape(prefix))
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
		URL: func(t testing.TB, prefix string) string { return srv.URL(prefix) },
	})
}

// TestScopeHelperProcess is the child of the process checks.
func TestScopeHelperProcess(t *testing.T) { scopetest.HelperProcess(t) }
