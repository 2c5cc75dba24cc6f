//go:build unix

package redis_test

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/testkit/restart"
	"github.com/warden-go/warden/store/redis"
)

// TestRestart: a private redis-server, without persistence (--save ""
// --appendonly no), killed with SIGKILL while a lock is held, waited for
// and watched, then started again on the same port. Every key is lost
// with it; what warden guarantees then is that the clients reconnect by
// themselves, the waiter acquires with a token above every earlier one
// (a new record's tokens start from the server clock), and the watcher
// gets EventsLost (go-redis resubscribes) and live events after it. See
// restart.Run for the steps and checks.
func TestRestart(t *testing.T) {
	bin := restart.Binary(t, "redis", "redis-server")
	srv := &restart.Server{Name: "redis-server", Dir: t.TempDir(), Port: restart.SparePort(t)}
	addr := "127.0.0.1:" + strconv.Itoa(srv.Port)
	srv.Cmd = func() *exec.Cmd {
		return exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(srv.Port),
			"--save", "", "--appendonly", "no", "--dir", srv.Dir, "--daemonize", "no")
	}
	srv.Ready = func(ctx context.Context) error {
		c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
		defer c.Close()
		return c.Ping(ctx).Err()
	}
	restart.Run(t, restart.Scenario{
		Server: srv,
		Open: func(ctx context.Context) (driver.Store, error) {
			return redis.OpenDriver(ctx, fmt.Sprintf("redis://%s/0?prefix=restart:", addr), nil)
		},
		Durable: false,
	})
}
