package sqlite_test

import (
	"context"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/drivertest"
	"github.com/warden-go/warden/store/sqlite"
)

// TestMain lets the conformance suite re-execute this test binary as the
// child processes of its multi-process checks.
func TestMain(m *testing.M) { recordsChild(); drivertest.Main(m) }

// TestConformance runs the whole conformance suite — driver checks and the
// portable packages, in goroutines and in separate OS processes — on one
// database file shared by every subtest (each in its own namespace).
func TestConformance(t *testing.T) {
	path := filepath.Join(t.TempDir(), "conformance.db")
	drivertest.Run(t, drivertest.Harness{
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
