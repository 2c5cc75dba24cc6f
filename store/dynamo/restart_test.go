//go:build unix

package dynamo_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/testkit/restart"
	"github.com/warden-go/warden/store/dynamo"
)

// TestRestart: a private dynalite (testenv/dynalite/server.js, in memory)
// killed with SIGKILL while a lock is held, waited for and watched, then
// started again on the same port. dynalite keeps nothing: the table is
// gone with every item. While it is missing, every call fails with
// DynamoDB's ResourceNotFoundException; the test then recreates it with
// the store's Migrate, as an operator would (a real DynamoDB never loses
// a table to a restart). Without being reopened, the stores' clients
// reconnect, the waiter acquires with a token above every earlier one
// (a new lock item's token starts from the clock, driver.TokenBase), and
// the watcher goes on: its events index is read EventLookback back, so
// it reports EventsLost when a read failed, and otherwise (one read
// retried by the SDK across the outage) misses nothing — the waiter's
// holding arrives either way, and live events after it. See restart.Run.
func TestRestart(t *testing.T) {
	node := restart.Binary(t, "dynamodb", "node")
	here, err := filepath.Abs(filepath.Join("..", "..", "testenv", "dynalite"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(here, "node_modules", "dynalite", "package.json")); err != nil {
		restart.Missing(t, "dynamodb", "dynalite in testenv/dynalite/node_modules")
	}
	srv := &restart.Server{Name: "dynalite", Dir: t.TempDir(), Port: restart.SparePort(t)}
	endpoint := "http://127.0.0.1:" + strconv.Itoa(srv.Port)
	srv.Cmd = func() *exec.Cmd {
		cmd := exec.Command(node, filepath.Join(here, "server.js"), "--host", "127.0.0.1", "--port", strconv.Itoa(srv.Port))
		cmd.Dir = here
		return cmd
	}
	srv.Ready = func(ctx context.Context) error { return dynaliteAnswers(ctx, endpoint) }
	q := url.Values{}
	q.Set("endpoint", endpoint)
	q.Set("region", "us-east-1")
	q.Set("prefix", "restart:")
	storeURL := "dynamodb://warden_restart?" + q.Encode()
	restart.Run(t, restart.Scenario{
		Server: srv,
		Open: func(ctx context.Context) (driver.Store, error) {
			return dynamo.OpenDriver(ctx, storeURL, nil)
		},
		Durable: false,
		Replays: true,
		AfterRestart: func(ctx context.Context, st *warden.Store) error {
			// The table is gone, and says so.
			_, _, err := st.Locks().Get(ctx, "restart/held")
			if err == nil || !strings.Contains(err.Error(), "ResourceNotFoundException") {
				return fmt.Errorf("a lock read on the restarted dynalite, whose table is gone: %v; want ResourceNotFoundException", err)
			}
			t.Logf("before the table is created again: %v", err)
			return st.Migrate(ctx)
		},
	})
}

// dynaliteAnswers reports nil once the endpoint answers a ListTables with
// a DynamoDB reply (unsigned: dynalite answers with an error document).
func dynaliteAnswers(ctx context.Context, endpoint string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader("{}"))
	if err != nil {
		return err
	}
	req.Header.Set("X-Amz-Target", "DynamoDB_20120810.ListTables")
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	n, _ := resp.Body.Read(buf)
	b.Write(buf[:n])
	if s := b.String(); !strings.Contains(s, "__type") && !strings.Contains(s, "TableNames") {
		return fmt.Errorf("not a DynamoDB reply: %q", s)
	}
	return nil
}
