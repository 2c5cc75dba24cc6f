package bench

import (
	"strings"
	"testing"
)

// BenchmarkAll runs every case as a sub-benchmark:
// go test -run '^$' -bench . -benchtime 2s
func BenchmarkAll(b *testing.B) {
	for _, c := range Cases() {
		b.Run(c.Group+"/"+c.Name, c.Run)
	}
}

// TestRoles: the report's ratios depend on each case's role; the names
// that begin as the roles say are classified so, and a library's name is
// a peer.
func TestRoles(t *testing.T) {
	for name, want := range map[string]string{
		"raw upsert + delete (modernc.org/sqlite)":     RoleRaw,
		"warden lock.Locker (waiters: pub/sub)":        RoleWarden,
		"lock.Locker TryAcquire + Release":             RoleWarden,
		"recordlock Claim":                             RoleWarden,
		"sqlite (notifications: data_version polling)": RoleWarden,
		"sanketplus/go-mysql-lock v0.0.7 (GET_LOCK)":   RolePeer,
		"sony/gobreaker/v2 Execute":                    RolePeer,
		"both alternating, paired (µs: warden's half)": RoleOther,
	} {
		if got := (Case{Name: name}).Role(); got != want {
			t.Errorf("Role of %q = %s, want %s", name, got, want)
		}
	}
	for _, c := range Cases() {
		if c.Role() == RolePeer && strings.Contains(strings.ToLower(c.Name), "warden") {
			t.Errorf("case %q / %q names warden but is classified as a peer", c.Group, c.Name)
		}
	}
}
