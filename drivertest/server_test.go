package drivertest

import "testing"

func TestRequired(t *testing.T) {
	for _, c := range []struct {
		env, store string
		want       bool
	}{{"", "mysql", false}, {"all", "mysql", true}, {"postgres, mysql", "mysql", true}, {"postgres", "mysql", false}} {
		t.Setenv(RequireEnv, c.env)
		if got := Required(c.store); got != c.want {
			t.Errorf("%s=%q Required(%q) = %v", RequireEnv, c.env, c.store, got)
		}
	}
}

func TestServerURL(t *testing.T) {
	t.Setenv("WARDEN_TEST_EXAMPLE_URL", "example://server")
	if got := ServerURL(t, "example", "WARDEN_TEST_EXAMPLE_URL"); got != "example://server" {
		t.Fatalf("ServerURL = %q", got)
	}
}
