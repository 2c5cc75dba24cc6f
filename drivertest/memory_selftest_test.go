package drivertest_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/drivertest"
	"github.com/warden-go/warden/internal/rpcstore"
	"github.com/warden-go/warden/store/memory"
)

// TestMain lets the suite re-execute this binary as the child processes of
// the multi-process checks.
func TestMain(m *testing.M) { drivertest.Main(m) }

// TestMemory runs the whole suite against the reference store. Stores
// are opened by URL (memory://NAME?prefix=…) on one named database; the
// children of the multi-process checks reach that database through the
// RPC bridge of internal/rpcstore.
func TestMemory(t *testing.T) {
	const db = "drivertest-selftest"
	srv := rpcstore.Serve(t, func(prefix string) driver.Store {
		return memory.NewDriver(&memory.Options{Name: db, Prefix: prefix})
	})
	drivertest.Run(t, drivertest.Harness{
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
