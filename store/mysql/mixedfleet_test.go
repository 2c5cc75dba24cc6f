package mysql_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/drivertest"
	"github.com/warden-go/warden/store/mysql"
)

// Mixed fleets: the published @go-go-scope/persistence-mysql adapter
// (testenv/node, pinned by its package-lock.json) and warden on one
// database, both with the prefix mixedPrefix. Each test has a database of
// its own.

const mixedPrefix = "svc:"

// mixedDB creates a database of the test's own on the test server (dropped
// when the test ends) and returns its name and a handle on it.
func mixedDB(t *testing.T) (string, *sql.DB) {
	t.Helper()
	admin := rawDB(t)
	b := make([]byte, 4)
	rand.Read(b)
	name := "warden_mixed_" + hex.EncodeToString(b)
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec("DROP DATABASE IF EXISTS " + name) })
	db := rawDBOn(t, name)
	return name, db
}

// mixedURL is the test server's URL for database name with prefix.
func mixedURL(t *testing.T, name, prefix string) string {
	u, err := url.Parse(serverURL(t, prefix))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// openMixed opens warden on database name with mixedPrefix (migrating).
func openMixed(t *testing.T, name string) *warden.Store {
	t.Helper()
	st, err := mysql.Open(context.Background(), mixedURL(t, name, mixedPrefix), nil)
	if err != nil {
		t.Fatalf("warden on the mixed database: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// nodeSide is a running go-go-scope adapter.
type nodeSide struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Scanner
	id  int
}

// nodeDir returns testenv/node with its packages installed (npm ci from
// the lock file when node_modules is missing or older). Without node and
// npm the test skips, or fails under WARDEN_TEST_REQUIRE=all.
func nodeDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "testenv", "node"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			msg := "mixed-fleet tests need " + tool + " on PATH (apt-get install nodejs npm)"
			if drivertest.Required("mysql") {
				t.Fatal(msg + "; " + drivertest.RequireEnv + " requires them")
			}
			t.Skip(msg)
		}
	}
	out, err := exec.Command("bash", filepath.Join(dir, "ensure.sh")).CombinedOutput()
	if err != nil {
		t.Fatalf("testenv/node/ensure.sh: %v\n%s", err, out)
	}
	return dir
}

// startNode starts the adapter on database name with mixedPrefix, in the
// time zone tz (TZ=UTC is what docs/backends.md requires).
func startNode(t *testing.T, name, tz string) *nodeSide {
	t.Helper()
	dir := nodeDir(t)
	u, err := url.Parse(serverURL(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	port := u.Port()
	if port == "" {
		port = "3306"
	}
	var user, pass string
	if u.User != nil {
		user = u.User.Username()
		pass, _ = u.User.Password()
	}
	cmd := exec.Command("node", filepath.Join(dir, "mysql.mjs"), u.Hostname(), port, user, pass, name, mixedPrefix)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "TZ="+tz)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("node side: %v", err)
		}
	})
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	return &nodeSide{t: t, in: in, out: sc}
}

// call sends one request and returns its result, or the adapter's error.
func (n *nodeSide) call(op string, args map[string]any) (json.RawMessage, error) {
	n.t.Helper()
	n.id++
	req := map[string]any{"id": n.id, "op": op}
	for k, v := range args {
		req[k] = v
	}
	b, err := json.Marshal(req)
	if err != nil {
		n.t.Fatal(err)
	}
	if _, err := n.in.Write(append(b, '\n')); err != nil {
		n.t.Fatalf("node side: %v", err)
	}
	if !n.out.Scan() {
		n.t.Fatalf("node side ended: %v", n.out.Err())
	}
	var resp struct {
		ID     int             `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  string          `json:"error"`
		Code   string          `json:"code"`
	}
	if err := json.Unmarshal(n.out.Bytes(), &resp); err != nil || resp.ID != n.id {
		n.t.Fatalf("node side answered %q (%v)", n.out.Text(), err)
	}
	if resp.Error != "" {
		return nil, fmt.Errorf("node %s: %s (code %s)", op, resp.Error, resp.Code)
	}
	return resp.Result, nil
}

// must is call, failing the test on an error, decoding the result into
// out (if not nil).
func (n *nodeSide) must(op string, args map[string]any, out any) {
	n.t.Helper()
	res, err := n.call(op, args)
	if err != nil {
		n.t.Fatal(err)
	}
	if out != nil {
		if err := json.Unmarshal(res, out); err != nil {
			n.t.Fatalf("node %s: result %s: %v", op, res, err)
		}
	}
}

// acquire is the adapter's acquire: whether it got the lock.
func (n *nodeSide) acquire(key, owner string, ttl time.Duration) bool {
	n.t.Helper()
	var ok bool
	n.must("acquire", map[string]any{"key": key, "owner": owner, "ttl": ttl.Milliseconds()}, &ok)
	return ok
}

// nodeValue is a value as the adapter returned it, with its JavaScript
// type ("buffer" for a Buffer, "null").
type nodeValue struct {
	Type  string          `json:"type"`
	Value json.RawMessage `json:"value"`
}

// json returns the JSON value the adapter read: a parsed JSON column
// (MySQL) as is, a JSON column read as text (MariaDB's JSON is LONGTEXT)
// parsed. A Buffer fails the test: the Node side could not use it.
func (v nodeValue) json(t *testing.T) any {
	t.Helper()
	raw := []byte(v.Value)
	switch v.Type {
	case "buffer":
		t.Fatalf("the adapter read a Buffer: %s", v.Value)
	case "string":
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatal(err)
		}
		raw = []byte(s)
	}
	return decodeJSON(t, raw)
}

func decodeJSON(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%q is not JSON: %v", b, err)
	}
	return v
}

// waitExpired waits until warden no longer sees key held: the lease lapsed
// on the database clock.
func waitExpired(t *testing.T, st *warden.Store, key string) {
	t.Helper()
	ctx := context.Background()
	for {
		_, held, err := st.Locks().Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if !held {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMixedFleetLocks: on tables warden created, the adapter's inserts
// work, each side refuses a lock the other holds and takes one the other
// released or let expire, the adapter recognises its own lock, and
// warden's tokens keep increasing whatever the adapter does to the rows.
func TestMixedFleetLocks(t *testing.T) {
	ctx := context.Background()
	name, db := mixedDB(t)
	st := openMixed(t, name)
	node := startNode(t, name, "UTC")
	node.must("connect", nil, nil)
	if stmts, err := mysql.PlannedChanges(ctx, st); err != nil || len(stmts) != 0 {
		t.Fatalf("on tables warden created, Migrate plans %q (%v)", stmts, err)
	}
	l := st.Locks()

	// Node holds: warden refuses, and sees Node's owner.
	if !node.acquire("a", "node-1", time.Minute) {
		t.Fatal("the adapter could not take a free lock on warden's table")
	}
	rec, ok, err := l.Acquire(ctx, "a", "go-1", time.Minute)
	if err != nil || ok || rec.Owner != "node-1" {
		t.Fatalf("warden on Node's lock: %+v ok=%v err=%v", rec, ok, err)
	}
	var valid bool
	node.must("isValid", map[string]any{"key": "a", "owner": "node-1"}, &valid)
	if !valid {
		t.Fatal("the adapter does not recognise its own lock (owner read as a Buffer?)")
	}

	// Warden holds: Node refuses; warden releases: Node takes it, and
	// warden then refuses Node's holding of the row it had released.
	held, ok, err := l.Acquire(ctx, "b", "go-1", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	tokens := []int64{held.Token}
	if node.acquire("b", "node-2", time.Minute) {
		t.Fatal("the adapter took a lock warden holds")
	}
	if ok, err := l.Release(ctx, "b", "go-1", held.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if !node.acquire("b", "node-2", time.Minute) {
		t.Fatal("the adapter could not take a lock warden released")
	}
	if rec, ok, err := l.Acquire(ctx, "b", "go-2", time.Minute); err != nil || ok || rec.Owner != "node-2" {
		t.Fatalf("warden took the adapter's holding of a row warden had released: %+v ok=%v err=%v", rec, ok, err)
	}
	node.must("release", map[string]any{"key": "b", "owner": "node-2"}, nil)
	rec, ok, err = l.Acquire(ctx, "b", "go-2", time.Minute)
	if err != nil || !ok {
		t.Fatalf("warden after the adapter released: ok=%v err=%v", ok, err)
	}
	tokens = append(tokens, rec.Token)

	// Each takes what the other let expire.
	if !node.acquire("c", "node-3", 100*time.Millisecond) {
		t.Fatal("node acquire c")
	}
	waitExpired(t, st, "c")
	rec, ok, err = l.Acquire(ctx, "c", "go-3", 150*time.Millisecond)
	if err != nil || !ok {
		t.Fatalf("warden on the adapter's expired lock: ok=%v err=%v", ok, err)
	}
	waitExpired(t, st, "c")
	if !node.acquire("c", "node-3", time.Minute) {
		t.Fatal("the adapter could not take a lock warden let expire")
	}

	// Fencing: the adapter deletes the row warden kept after release
	// (its cleanup), inserts its own with token 0 and lets it expire;
	// warden's next token is still greater than its last one.
	for i := range 3 {
		rec, ok, err := l.Acquire(ctx, "b", "go-2", time.Minute)
		if err != nil || !ok {
			t.Fatalf("round %d: ok=%v err=%v", i, ok, err)
		}
		if rec.Token != tokens[len(tokens)-1] {
			tokens = append(tokens, rec.Token)
		}
		if ok, err := l.Release(ctx, "b", "go-2", rec.Token); err != nil || !ok {
			t.Fatal(ok, err)
		}
		// The released row has expired by the adapter's clock (whole
		// milliseconds) once the millisecond after its release has come.
		var released time.Time
		if err := db.QueryRow("SELECT expires_at FROM go_goscope_locks WHERE `key` = 'svc:lock:b'").Scan(&released); err != nil {
			t.Fatal(err)
		}
		for time.Now().Before(released.Add(time.Millisecond)) {
			time.Sleep(time.Millisecond)
		}
		node.must("cleanup", nil, nil)
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM go_goscope_locks WHERE `key` = 'svc:lock:b'").Scan(&n); err != nil || n != 0 {
			t.Fatalf("the adapter's cleanup left %d rows (%v)", n, err)
		}
		if !node.acquire("b", "node-4", 50*time.Millisecond) {
			t.Fatal("node acquire b")
		}
		var tok int64
		if err := db.QueryRow("SELECT token FROM go_goscope_locks WHERE `key` = 'svc:lock:b'").Scan(&tok); err != nil || tok != 0 {
			t.Fatalf("the adapter's row has token %d (%v), the test expects 0", tok, err)
		}
		waitExpired(t, st, "b")
		rec, ok, err = l.Acquire(ctx, "b", "go-2", time.Minute)
		if err != nil || !ok {
			t.Fatalf("round %d after the adapter: ok=%v err=%v", i, ok, err)
		}
		tokens = append(tokens, rec.Token)
		if ok, err := l.Release(ctx, "b", "go-2", rec.Token); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("warden's tokens went from %d to %d: %v", tokens[i-1], tokens[i], tokens)
		}
	}

	// The adapter's row lock on one key (SELECT … FOR UPDATE in its
	// acquire) locks that row only: another key can be locked at once.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var owner string
	if err := tx.QueryRow("SELECT owner FROM go_goscope_locks WHERE `key` = 'svc:lock:a' FOR UPDATE").Scan(&owner); err != nil {
		t.Fatal(err)
	}
	other := rawDBOn(t, name)
	tx2, err := other.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback()
	if err := tx2.QueryRow("SELECT owner FROM go_goscope_locks WHERE `key` = 'svc:lock:c' FOR UPDATE NOWAIT").Scan(&owner); err != nil {
		t.Fatalf("the adapter's FOR UPDATE on one key locked another: %v", err)
	}
	tx2.Rollback()
	if _, ok, err := l.Acquire(ctx, "d", "go-4", time.Minute); err != nil || !ok {
		t.Fatalf("warden acquire of an unrelated key during the adapter's transaction: ok=%v err=%v", ok, err)
	}
}

// TestMixedFleetKeysAreStrings: key and owner come back to mysql2 as
// strings, and keys stay byte-exact: case and trailing spaces count.
func TestMixedFleetKeysAreStrings(t *testing.T) {
	ctx := context.Background()
	name, _ := mixedDB(t)
	st := openMixed(t, name)
	node := startNode(t, name, "UTC")
	for _, k := range []string{"k", "K", "k "} {
		if _, ok, err := st.Locks().Acquire(ctx, k, "go "+k, time.Minute); err != nil || !ok {
			t.Fatalf("acquire %q: ok=%v err=%v", k, ok, err)
		}
	}
	var rows []map[string]nodeValue
	node.must("rows", map[string]any{"table": "go_goscope_locks"}, &rows)
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3 distinct keys", len(rows))
	}
	for _, r := range rows {
		for _, col := range []string{"key", "owner", "namespace"} {
			if r[col].Type != "string" {
				t.Errorf("mysql2 reads %s as %s (%s)", col, r[col].Type, r[col].Value)
			}
		}
	}
}

// TestMixedFleetCache: values written by either side read back equal on
// the other; JSON is stored as JSON, other bytes stay exact for warden.
func TestMixedFleetCache(t *testing.T) {
	ctx := context.Background()
	name, _ := mixedDB(t)
	st := openMixed(t, name)
	node := startNode(t, name, "UTC")
	c := st.Cache()

	nodeVal := map[string]any{"a": 1.0, "b": []any{true, "x"}}
	node.must("cacheSet", map[string]any{"key": "n", "value": nodeVal}, nil)
	e, ok, err := c.Get(ctx, "n")
	if err != nil || !ok {
		t.Fatalf("warden Get of the adapter's value: ok=%v err=%v", ok, err)
	}
	if got := decodeJSON(t, e.Value); !reflect.DeepEqual(got, nodeVal) {
		t.Fatalf("warden read %v, the adapter wrote %v", got, nodeVal)
	}

	goVal := []byte(`{"z":[1,2],"s":"é"}`)
	if err := c.Set(ctx, "w", goVal, time.Minute); err != nil {
		t.Fatal(err)
	}
	var nv nodeValue
	node.must("cacheGet", map[string]any{"key": "w"}, &nv)
	if got, want := nv.json(t), decodeJSON(t, goVal); !reflect.DeepEqual(got, want) {
		t.Fatalf("the adapter read %v, warden wrote %v", got, want)
	}
	if e, _, err := c.Get(ctx, "w"); err != nil || string(e.Value) != string(goVal) {
		t.Fatalf("warden's own JSON value reads back %q (%v)", e.Value, err)
	}

	// Bytes that are not JSON stay exact for warden; the adapter sees no
	// value. The adapter's overwrite wins.
	bin := []byte{0xff, 0, 'x'}
	if err := c.Set(ctx, "bin", bin, time.Minute); err != nil {
		t.Fatal(err)
	}
	if e, _, err := c.Get(ctx, "bin"); err != nil || string(e.Value) != string(bin) {
		t.Fatalf("binary value reads back %q (%v)", e.Value, err)
	}
	node.must("cacheSet", map[string]any{"key": "bin", "value": "text"}, nil)
	if e, _, err := c.Get(ctx, "bin"); err != nil || string(e.Value) != `"text"` {
		t.Fatalf("after the adapter's overwrite warden reads %q (%v)", e.Value, err)
	}
	if ok, err := c.SetIfAbsent(ctx, "n", []byte(`1`), time.Minute); err != nil || ok {
		t.Fatalf("SetIfAbsent replaced the adapter's live value: %v %v", ok, err)
	}

	var keys []nodeValue
	node.must("cacheKeys", map[string]any{}, &keys)
	var ks []string
	for _, k := range keys {
		if k.Type != "string" {
			t.Fatalf("the adapter's keys() returned a %s", k.Type)
		}
		var s string
		json.Unmarshal(k.Value, &s)
		ks = append(ks, s)
	}
	if want := []string{"bin", "n", "w"}; !reflect.DeepEqual(slices.Sorted(slices.Values(ks)), want) {
		t.Fatalf("the adapter's keys() = %v, want %v", ks, want)
	}
	if got, err := c.Keys(ctx, ""); err != nil || !reflect.DeepEqual(got, []string{"bin", "n", "w"}) {
		t.Fatalf("warden Keys = %v (%v)", got, err)
	}
}

// TestMixedFleetCircuits: circuit state written by either side is
// understood by the other; a circuit the adapter opened (no opened_at)
// does not grant a probe before openFor has passed since it opened.
func TestMixedFleetCircuits(t *testing.T) {
	ctx := context.Background()
	name, _ := mixedDB(t)
	st := openMixed(t, name)
	node := startNode(t, name, "UTC")
	cb := st.Circuits()

	var n int
	node.must("recordFailure", map[string]any{"key": "c1", "max": 1}, &n)
	rec, found, err := cb.Get(ctx, "c1")
	if err != nil || !found || rec.State != driver.Open || rec.Failures != 1 {
		t.Fatalf("warden reads the adapter's open circuit as %+v found=%v err=%v", rec, found, err)
	}
	if rec, granted, err := cb.TryProbe(ctx, "c1", "go", time.Hour, time.Minute); err != nil || granted {
		t.Fatalf("a probe was granted at once on a circuit the adapter just opened: %+v %v", rec, err)
	}

	if _, err := cb.RecordFailure(ctx, "c2", 1); err != nil {
		t.Fatal(err)
	}
	var state struct {
		State        string `json:"state"`
		FailureCount int    `json:"failureCount"`
	}
	node.must("getState", map[string]any{"key": "c2"}, &state)
	if state.State != "open" || state.FailureCount != 1 {
		t.Fatalf("the adapter reads warden's open circuit as %+v", state)
	}
	node.must("recordSuccess", map[string]any{"key": "c2"}, nil)
	if rec, _, err := cb.Get(ctx, "c2"); err != nil || rec.State != driver.Closed || rec.Failures != 0 {
		t.Fatalf("warden reads the adapter's closing as %+v (%v)", rec, err)
	}
}

// TestMixedFleetMigrateAdoptsNodeDatabase: warden opens (auto-migrating)
// a database where the adapter's connect() ran and wrote, and both sides
// go on working on it; checkpoints keep the adapter's BIGINT timestamps
// and JSON data.
func TestMixedFleetMigrateAdoptsNodeDatabase(t *testing.T) {
	ctx := context.Background()
	name, _ := mixedDB(t)
	node := startNode(t, name, "UTC")
	node.must("connect", nil, nil)
	if !node.acquire("held", "node-1", time.Minute) {
		t.Fatal("node acquire")
	}
	node.must("cacheSet", map[string]any{"key": "k", "value": map[string]any{"a": 1}}, nil)
	node.must("recordFailure", map[string]any{"key": "c", "max": 5}, nil)
	const ts = 1700000000123
	node.must("saveCheckpoint", map[string]any{"checkpoint": map[string]any{
		"id": "t1:1", "taskId": "t1", "sequence": 1, "timestamp": ts, "progress": 50, "data": map[string]any{"step": 1.0},
	}}, nil)

	st := openMixed(t, name)
	if err := st.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if stmts, err := mysql.PlannedChanges(ctx, st); err != nil || len(stmts) != 0 {
		t.Fatalf("after Migrate, Migrate still plans %q (%v)", stmts, err)
	}
	if rec, held, err := st.Locks().Get(ctx, "held"); err != nil || !held || rec.Owner != "node-1" {
		t.Fatalf("the adapter's lock after Migrate: %+v %v %v", rec, held, err)
	}
	if e, _, err := st.Cache().Get(ctx, "k"); err != nil || !reflect.DeepEqual(decodeJSON(t, e.Value), map[string]any{"a": 1.0}) {
		t.Fatalf("the adapter's cache value after Migrate: %q %v", e.Value, err)
	}
	if rec, _, err := st.Circuits().Get(ctx, "c"); err != nil || rec.Failures != 1 {
		t.Fatalf("the adapter's circuit after Migrate: %+v %v", rec, err)
	}

	// The adapter still works on the migrated tables.
	var valid bool
	node.must("isValid", map[string]any{"key": "held", "owner": "node-1"}, &valid)
	if !valid {
		t.Fatal("the adapter no longer recognises its lock after Migrate")
	}
	if !node.acquire("new", "node-2", time.Minute) {
		t.Fatal("the adapter's acquire after Migrate")
	}
	var nv nodeValue
	node.must("cacheGet", map[string]any{"key": "k"}, &nv)
	if got := nv.json(t); !reflect.DeepEqual(got, map[string]any{"a": 1.0}) {
		t.Fatalf("the adapter reads its value after Migrate as %v", got)
	}
	var keys []nodeValue
	node.must("cacheKeys", map[string]any{}, &keys)
	if len(keys) != 1 || keys[0].Type != "string" {
		t.Fatalf("the adapter's keys() after Migrate: %+v", keys)
	}

	// Checkpoints: the adapter's ignore the prefix, so an unprefixed
	// warden store reads them, and the adapter reads warden's.
	plain, err := mysql.Open(ctx, mixedURL(t, name, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	cp, found, err := plain.Checkpoints().Latest(ctx, "t1")
	if err != nil || !found || cp.Sequence != 1 || !cp.Time.Equal(time.UnixMilli(ts)) ||
		!reflect.DeepEqual(decodeJSON(t, cp.Data), map[string]any{"step": 1.0}) {
		t.Fatalf("warden reads the adapter's checkpoint as %+v %v %v", cp, found, err)
	}
	before := time.Now().Add(-time.Second).UnixMilli()
	if _, ok, err := plain.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "t2", Progress: 25, Data: []byte(`{"step":2}`)}); err != nil || !ok {
		t.Fatalf("warden's checkpoint on the adapter's table: %v %v", ok, err)
	}
	var got struct {
		TaskID    string    `json:"taskId"`
		Sequence  int64     `json:"sequence"`
		Timestamp int64     `json:"timestamp"`
		Data      nodeValue `json:"data"`
	}
	node.must("loadLatest", map[string]any{"taskId": "t2"}, &got)
	if got.Sequence != 1 || got.Timestamp < before || !reflect.DeepEqual(got.Data.json(t), map[string]any{"step": 2.0}) {
		t.Fatalf("the adapter reads warden's checkpoint as %+v", got)
	}
}

// TestMixedFleetMigrateRefusesBeforeAltering: a database Migrate cannot
// adopt is refused with the table and column named, and no table has been
// altered.
func TestMixedFleetMigrateRefusesBeforeAltering(t *testing.T) {
	name, db := mixedDB(t)
	node := startNode(t, name, "UTC")
	node.must("connect", nil, nil)
	if _, err := db.Exec("ALTER TABLE go_goscope_cache MODIFY expires_at BIGINT NULL"); err != nil {
		t.Fatal(err)
	}
	_, err := mysql.Open(context.Background(), mixedURL(t, name, mixedPrefix), nil)
	if err == nil || !strings.Contains(err.Error(), "go_goscope_cache") || !strings.Contains(err.Error(), "expires_at") {
		t.Fatalf("want an error naming go_goscope_cache and expires_at, got %v", err)
	}
	if cols := columnTypes(t, db, "go_goscope_locks"); cols["key"] != "varchar(255)" || cols["token"] != "" {
		t.Fatalf("go_goscope_locks was altered before the refusal: %v", cols)
	}
}

// TestMixedFleetNodeOutsideUTC: a Node process whose time zone is not UTC
// writes and reads DATETIMEs in local time (docs/backends.md requires
// TZ=UTC). What warden still guarantees: its holder learns that the lease
// is lost (Refresh reports it, no error), and its tokens keep increasing.
func TestMixedFleetNodeOutsideUTC(t *testing.T) {
	ctx := context.Background()
	name, _ := mixedDB(t)
	st := openMixed(t, name)
	node := startNode(t, name, "Asia/Kolkata") // UTC+05:30
	l := st.Locks()
	rec, ok, err := l.Acquire(ctx, "y", "go", time.Hour)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	// Local time ahead of UTC: the adapter's cleanup deletes warden's live
	// lock.
	node.must("cleanup", nil, nil)
	if _, ok, err := l.Refresh(ctx, "y", "go", rec.Token, time.Hour); err != nil || ok {
		t.Fatalf("Refresh after the adapter deleted the lock: ok=%v err=%v", ok, err)
	}
	// A millisecond on, the clock's token base has passed the lost token.
	for driver.TokenBase(time.Now()) <= rec.Token {
		time.Sleep(time.Millisecond)
	}
	again, ok, err := l.Acquire(ctx, "y", "go", time.Hour)
	if err != nil || !ok || again.Token <= rec.Token {
		t.Fatalf("re-acquire: %+v ok=%v err=%v, previous token %d", again, ok, err, rec.Token)
	}
}

// TestMixedFleetNodeBehindUTC: a Node process behind UTC writes expiries
// that are already past in UTC, so warden takes its live locks, and reads
// warden's released locks as still held (the hazards docs/backends.md
// names); warden's tokens stay above the clock's token base.
func TestMixedFleetNodeBehindUTC(t *testing.T) {
	ctx := context.Background()
	name, _ := mixedDB(t)
	st := openMixed(t, name)
	node := startNode(t, name, "America/New_York") // UTC-05:00 or -04:00
	l := st.Locks()
	first, ok, err := l.Acquire(ctx, "x", "go", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ok, err := l.Release(ctx, "x", "go", first.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if node.acquire("x", "node", time.Hour) {
		t.Fatal("the adapter behind UTC took warden's released lock: the test's premise (local-time reads) no longer holds")
	}
	before := driver.TokenBase(time.Now())
	if !node.acquire("y", "node", time.Hour) {
		t.Fatal("node acquire")
	}
	rec, ok, err := l.Acquire(ctx, "y", "go", time.Minute)
	if err != nil || !ok || rec.Token < before {
		t.Fatalf("warden on a lock written in New York time: %+v ok=%v err=%v, token base before %d", rec, ok, err, before)
	}
}

// TestMixedFleetCheckpointSaveAfterNode: warden's saves of a task go on
// after the adapter saved a checkpoint of the same task with the next
// sequence: warden numbers past the table's highest sequence, not only
// past its own last one.
func TestMixedFleetCheckpointSaveAfterNode(t *testing.T) {
	ctx := context.Background()
	name, _ := mixedDB(t)
	node := startNode(t, name, "UTC")
	node.must("connect", nil, nil)
	// The adapter ignores the prefix: an unprefixed warden store shares
	// its checkpoints.
	st, err := mysql.Open(ctx, mixedURL(t, name, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cp := st.Checkpoints()
	if c, ok, err := cp.Save(ctx, driver.CheckpointInput{TaskID: "T", Data: []byte(`{"w":1}`)}); err != nil || !ok || c.Sequence != 1 {
		t.Fatalf("first save: %+v %v %v", c, ok, err)
	}
	node.must("saveCheckpoint", map[string]any{"checkpoint": map[string]any{
		"id": "T:2", "taskId": "T", "sequence": 2, "timestamp": time.Now().UnixMilli(), "progress": 50, "data": map[string]any{"n": 2.0},
	}}, nil)
	for want := int64(3); want <= 4; want++ {
		c, ok, err := cp.Save(ctx, driver.CheckpointInput{TaskID: "T", Data: []byte(fmt.Sprintf(`{"w":%d}`, want))})
		if err != nil || !ok || c.Sequence != want {
			t.Fatalf("save after the adapter's: %+v ok=%v err=%v, want sequence %d", c, ok, err, want)
		}
	}
	list, err := cp.List(ctx, "T")
	if err != nil || len(list) != 4 {
		t.Fatalf("List: %d checkpoints (%v), want 4", len(list), err)
	}
	if got := decodeJSON(t, list[1].Data); !reflect.DeepEqual(got, map[string]any{"n": 2.0}) {
		t.Fatalf("the adapter's checkpoint reads %v", got)
	}
}

// TestMixedFleetCircuitReopenedByNode: a half-open circuit the adapter
// re-opens (its probe failed) grants no probe before the open duration has
// passed since the re-opening. The adapter writes state 'open' and leaves
// opened_at and the probe columns as they were; warden's own openings
// clear probe_owner, so an open row with a probe owner opened when it was
// last written.
func TestMixedFleetCircuitReopenedByNode(t *testing.T) {
	ctx := context.Background()
	name, db := mixedDB(t)
	st := openMixed(t, name)
	node := startNode(t, name, "UTC")
	cb := st.Circuits()
	const key = mixedPrefix + "circuit:c"
	age := func(cols string) {
		t.Helper()
		set := []string{}
		for _, c := range strings.Split(cols, ",") {
			set = append(set, c+" = "+c+" - INTERVAL 1 HOUR")
		}
		if _, err := db.Exec("UPDATE go_goscope_circuit SET "+strings.Join(set, ", ")+" WHERE `key` = ?", key); err != nil {
			t.Fatal(err)
		}
	}
	if rec, err := cb.RecordFailure(ctx, "c", 1); err != nil || rec.State != driver.Open {
		t.Fatalf("RecordFailure: %+v %v", rec, err)
	}
	age("opened_at,updated_at") // warden opened it an hour ago
	if rec, granted, err := cb.TryProbe(ctx, "c", "go", 30*time.Minute, time.Minute); err != nil || !granted || rec.State != driver.HalfOpen {
		t.Fatalf("TryProbe on a circuit open for an hour: %+v granted=%v err=%v", rec, granted, err)
	}
	node.must("recordFailure", map[string]any{"key": "c", "max": 1}, nil)
	if rec, _, err := cb.Get(ctx, "c"); err != nil || rec.State != driver.Open {
		t.Fatalf("after the adapter's failure warden reads %+v (%v), want open", rec, err)
	}
	if rec, granted, err := cb.TryProbe(ctx, "c", "go2", 30*time.Minute, time.Minute); err != nil || granted {
		t.Fatalf("a probe was granted at once on a circuit the adapter just re-opened: %+v granted=%v err=%v", rec, granted, err)
	}
	age("updated_at") // the adapter re-opened it an hour ago
	if rec, granted, err := cb.TryProbe(ctx, "c", "go2", 30*time.Minute, time.Minute); err != nil || !granted {
		t.Fatalf("TryProbe an hour after the adapter re-opened: %+v granted=%v err=%v", rec, granted, err)
	}
}

// TestMixedFleetCheckpointsOnWardenTables: on tables warden created (warden
// opened before the adapter's connect()), the adapter saves checkpoints —
// the timestamp column holds its Unix milliseconds — and each side reads
// the other's with its time.
func TestMixedFleetCheckpointsOnWardenTables(t *testing.T) {
	ctx := context.Background()
	name, _ := mixedDB(t)
	// The adapter ignores the prefix: an unprefixed warden store shares
	// its checkpoints.
	st, err := mysql.Open(ctx, mixedURL(t, name, ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	node := startNode(t, name, "UTC")
	node.must("connect", nil, nil)
	const ts = 1700000000123
	if _, err := node.call("saveCheckpoint", map[string]any{"checkpoint": map[string]any{
		"id": "n:1", "taskId": "n", "sequence": 1, "timestamp": ts, "progress": 50, "data": map[string]any{"step": 1.0},
	}}); err != nil {
		t.Fatalf("the adapter's save on warden's table: %v", err)
	}
	cp, found, err := st.Checkpoints().Latest(ctx, "n")
	if err != nil || !found || cp.Sequence != 1 || !cp.Time.Equal(time.UnixMilli(ts)) ||
		!reflect.DeepEqual(decodeJSON(t, cp.Data), map[string]any{"step": 1.0}) {
		t.Fatalf("warden reads the adapter's checkpoint as %+v %v %v", cp, found, err)
	}
	saved, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "w", Data: []byte(`{"step":2}`)})
	if err != nil || !ok {
		t.Fatalf("warden's save: %v %v", ok, err)
	}
	var got struct {
		Sequence  int64     `json:"sequence"`
		Timestamp int64     `json:"timestamp"`
		Data      nodeValue `json:"data"`
	}
	node.must("loadLatest", map[string]any{"taskId": "w"}, &got)
	if got.Sequence != 1 || got.Timestamp != saved.Time.UnixMilli() || !reflect.DeepEqual(got.Data.json(t), map[string]any{"step": 2.0}) {
		t.Fatalf("the adapter reads warden's checkpoint (time %d) as %+v", saved.Time.UnixMilli(), got)
	}
}

// TestMixedFleetTokensAfterForeignDelete: another program deleting a live
// lock row between two acquisitions (the adapter's forceRelease is a
// DELETE), even within the same millisecond, never makes warden hand out a
// token that is not above every token it handed out before.
func TestMixedFleetTokensAfterForeignDelete(t *testing.T) {
	ctx := context.Background()
	name, db := mixedDB(t)
	st := openMixed(t, name)
	l := st.Locks()
	var last int64
	check := func(round int, how string) {
		t.Helper()
		rec, ok, err := l.Acquire(ctx, "t", fmt.Sprint("go-", how, round), time.Minute)
		if err != nil || !ok {
			t.Fatalf("%s round %d: ok=%v err=%v", how, round, ok, err)
		}
		if rec.Token <= last {
			t.Fatalf("%s round %d: token %d after %d", how, round, rec.Token, last)
		}
		last = rec.Token
	}
	// A raw DELETE right after each acquisition.
	for i := range 3000 {
		check(i, "delete")
		if _, err := db.Exec("DELETE FROM go_goscope_locks WHERE `key` = ?", mixedPrefix+"lock:t"); err != nil {
			t.Fatal(err)
		}
	}
	// The adapter's own forceRelease.
	node := startNode(t, name, "UTC")
	node.must("connect", nil, nil)
	for i := range 1000 {
		check(i, "forceRelease")
		node.must("forceRelease", map[string]any{"key": "t"}, nil)
	}
}
