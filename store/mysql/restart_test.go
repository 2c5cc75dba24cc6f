//go:build unix

package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	_ "github.com/go-sql-driver/mysql"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/testkit/restart"
	"github.com/warden-go/warden/store/mysql"
)

// TestRestart: a private MariaDB (mariadb-install-db in a temporary
// directory, --skip-grant-tables, loopback only) killed with SIGKILL while
// a lock is held, waited for (in the server's GET_LOCK queue) and watched
// (MySQL has no notifications: Watch polls), then started again on the
// same port and data directory. InnoDB recovers: a lock record written
// before is read back. The pool reconnects, the waiter acquires with a
// greater token, and the polling watcher reports the failed listings as
// EventsLost and then changes again. See restart.Run.
func TestRestart(t *testing.T) {
	installDB := restart.Binary(t, "mysql", "mariadb-install-db")
	mariadbd := restart.Binary(t, "mysql", "mariadbd", "/usr/sbin", "/usr/libexec")
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	var asRoot []string
	if os.Geteuid() == 0 {
		asRoot = []string{"--user=root"} // mariadbd refuses root unless told
	}
	restart.RunOnce(t, nil, exec.Command(installDB, append([]string{"--no-defaults", "--datadir=" + data,
		"--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve"}, asRoot...)...))

	srv := &restart.Server{Name: "mariadbd", Dir: dir, Port: restart.SparePort(t)}
	srv.Cmd = func() *exec.Cmd {
		// innodb_flush_log_at_trx_commit=2: every commit is written to
		// the log at once (a killed server loses none), flushed to disk
		// once a second (only a crash of the machine would lose them).
		return exec.Command(mariadbd, append([]string{"--no-defaults", "--datadir=" + data,
			"--port=" + strconv.Itoa(srv.Port), "--bind-address=127.0.0.1",
			"--socket=" + filepath.Join(dir, "mariadbd.sock"), "--pid-file=" + filepath.Join(dir, "mariadbd.pid"),
			"--skip-grant-tables", "--skip-name-resolve", "--skip-log-bin",
			"--innodb-buffer-pool-size=16M", "--innodb-flush-log-at-trx-commit=2"}, asRoot...)...)
	}
	srv.Ready = func(ctx context.Context) error {
		db, err := sql.Open("mysql", fmt.Sprintf("root@tcp(127.0.0.1:%d)/", srv.Port))
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS restart")
		return err
	}
	restart.Run(t, restart.Scenario{
		Server: srv,
		Open: func(ctx context.Context) (driver.Store, error) {
			return mysql.OpenDriver(ctx, fmt.Sprintf("mysql://root@127.0.0.1:%d/restart?prefix=restart:", srv.Port), nil)
		},
		Durable: true,
	})
}
