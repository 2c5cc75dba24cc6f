package drivertest

import (
	"os"
	"strings"
	"testing"
)

// RequireEnv is the environment variable that turns a missing test server
// from a skip into a failure: "all", or a comma-separated list of store
// names ("mysql,postgres"). The README's test command and CI set it to all.
const RequireEnv = "WARDEN_TEST_REQUIRE"

// ServerURL returns the URL of a store's test server from the environment
// variable env (WARDEN_TEST_POSTGRES_URL, WARDEN_TEST_MYSQL_URL, …), which
// testenv/up.sh sets. Without it the test is skipped with a message naming
// the variable — or fails, if RequireEnv asks for this store.
func ServerURL(t testing.TB, store, env string) string {
	t.Helper()
	if u := os.Getenv(env); u != "" {
		return u
	}
	msg := "no " + store + " test server: set " + env + " (eval \"$(testenv/up.sh)\" starts one)"
	if Required(store) {
		t.Fatal(msg + "; " + RequireEnv + " requires it")
	}
	t.Skip(msg)
	return ""
}

// Required reports whether RequireEnv asks for the store's server.
func Required(store string) bool {
	for _, s := range strings.Split(os.Getenv(RequireEnv), ",") {
		if s = strings.TrimSpace(s); s == "all" || s == store {
			return true
		}
	}
	return false
}
