//go:build unix

package mongo_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/testkit/restart"
	"github.com/warden-go/warden/store/mongo"
)

// TestRestart: a private FerretDB (the test server testenv/ferretdb/up.sh
// builds, with its SQLite state in a temporary directory; never the
// shared server) killed with SIGKILL while a lock is held, waited for
// and watched, then started again on the same port and state directory.
// The data survive: a lock record written before is read back. Without
// being reopened, the stores' clients reconnect, the waiter acquires
// with a greater token, and the event watcher's cursor, reopened, skips
// to the last event it passed: it misses nothing that was written (the
// waiter's holding arrives), and live events follow. See restart.Run.
func TestRestart(t *testing.T) {
	bin, err := filepath.Abs(filepath.Join("..", "..", "testenv", ".run", "ferretdb"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		restart.Missing(t, "mongodb", "the FerretDB test server built by testenv/ferretdb/up.sh ("+bin+")")
	}
	srv := &restart.Server{Name: "ferretdb", Dir: t.TempDir(), Port: restart.SparePort(t)}
	addr := "127.0.0.1:" + strconv.Itoa(srv.Port)
	srv.Cmd = func() *exec.Cmd {
		return exec.Command(bin, "-listen", addr, "-state", filepath.Join(srv.Dir, "state"))
	}
	srv.Ready = func(ctx context.Context) error {
		if out, err := exec.CommandContext(ctx, bin, "-ping", addr).CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	// A small event collection keeps FerretDB's tailing cheap, as in the
	// conformance tests (serverURL).
	storeURL := "mongodb://" + addr + "/warden_restart?prefix=restart:&events_size=524288&events_retention=10s"
	restart.Run(t, restart.Scenario{
		Server: srv,
		Open: func(ctx context.Context) (driver.Store, error) {
			return mongo.OpenDriver(ctx, storeURL, nil)
		},
		Durable: true,
		Replays: true,
	})
}
