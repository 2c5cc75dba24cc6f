//go:build unix

package postgres_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/testkit/restart"
	"github.com/warden-go/warden/store/postgres"
)

// TestRestart: a private PostgreSQL (initdb in a temporary directory,
// trust authentication, the Unix socket in that directory; run as the
// postgres user when the test runs as root, since PostgreSQL refuses
// root) is stopped abruptly — SIGQUIT, its immediate shutdown: every
// connection is cut and the next start recovers from the WAL, as after a
// crash — while a lock is held, waited for and watched, then started
// again on the same port and data directory. The data survive: a lock
// record written before is read back. The pool reconnects, the waiter
// acquires with a greater token, and the LISTEN connection reconnects
// and reports EventsLost before live events. See restart.Run.
func TestRestart(t *testing.T) {
	bins := "/usr/lib/postgresql/*/bin"
	initdb := restart.Binary(t, "postgres", "initdb", bins)
	postgresBin := restart.Binary(t, "postgres", "postgres", bins)
	cred := restart.Unprivileged(t, "postgres", "postgres")
	dir := restart.PrivateDir(t, cred)
	data := filepath.Join(dir, "data")
	init := exec.Command(initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
	init.Env = []string{"LC_ALL=C", "PATH=/usr/bin:/bin"}
	restart.RunOnce(t, cred, init)

	srv := &restart.Server{Name: "postgres", Dir: dir, Port: restart.SparePort(t), Cred: cred, Stop: syscall.SIGQUIT}
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", srv.Port)
	srv.Cmd = func() *exec.Cmd {
		// fsync off: a killed server's writes are still in the page
		// cache; only a crash of the machine would lose them.
		return exec.Command(postgresBin, "-D", data, "-p", strconv.Itoa(srv.Port), "-k", dir,
			"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "shared_buffers=16MB", "-c", "max_connections=40")
	}
	srv.Ready = func(ctx context.Context) error {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		return c.Ping(ctx)
	}
	restart.Run(t, restart.Scenario{
		Server: srv,
		Open: func(ctx context.Context) (driver.Store, error) {
			return postgres.OpenDriver(ctx, url+"&prefix=restart:", nil)
		},
		Durable: true,
	})
}
