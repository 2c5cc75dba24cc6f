package mongo_test

// Mixed fleets: a go-go-scope Node service (the published
// @go-go-scope/persistence-mongodb adapter, pinned in testenv/node) and a
// warden service on one database with one prefix. The Node side runs as a
// child process (testenv/node/mongodb.mjs) that answers one JSON request a
// line.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/drivertest"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/store/mongo"
	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// mixedPrefix is the prefix both sides use (the adapter's keyPrefix).
const mixedPrefix = "mf:"

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
			if drivertest.Required("mongodb") {
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

// mixedDB returns a database of the test's own on the test server (dropped
// when the test ends) and the server's URL without warden's parameters.
func mixedDB(t *testing.T) (*mongodrv.Database, string) {
	u, err := url.Parse(serverURL(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	for _, k := range []string{"database", "prefix", "max_value_bytes", "events_size", "events_retention"} {
		q.Del(k)
	}
	u.RawQuery = q.Encode()
	u.Path = "/"
	raw := u.String()
	client, err := mongodrv.Connect(options.Client().ApplyURI(raw))
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	rand.Read(b)
	db := client.Database("warden_mixed_" + hex.EncodeToString(b))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = db.Drop(ctx)
		_ = client.Disconnect(ctx)
	})
	return db, raw
}

// startNode starts the adapter on db with mixedPrefix.
func startNode(t *testing.T, db *mongodrv.Database, raw string) *nodeSide {
	dir := nodeDir(t)
	cmd := exec.Command("node", filepath.Join(dir, "mongodb.mjs"), raw, db.Name(), mixedPrefix)
	cmd.Dir = dir
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
		Code   any             `json:"code"`
	}
	if err := json.Unmarshal(n.out.Bytes(), &resp); err != nil || resp.ID != n.id {
		n.t.Fatalf("node side answered %q (%v)", n.out.Text(), err)
	}
	if resp.Error != "" {
		return nil, fmt.Errorf("node %s: %s (code %v)", op, resp.Error, resp.Code)
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

func (n *nodeSide) acquire(key, owner string, ttl time.Duration) bool {
	n.t.Helper()
	var ok bool
	n.must("acquire", map[string]any{"key": key, "owner": owner, "ttl": ttl.Milliseconds()}, &ok)
	return ok
}

// wardenOn opens a warden store on db with mixedPrefix (auto-migrating).
func wardenOn(t *testing.T, db *mongodrv.Database) *warden.Store {
	t.Helper()
	st, err := mongo.New(db, &mongo.Options{Prefix: mixedPrefix, DisableEvents: true})
	if err != nil {
		t.Fatalf("warden on the database: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// mixed starts both sides on a fresh database: the Node side connects
// first (creating its indexes), then warden migrates it.
func mixed(t *testing.T) (*nodeSide, *warden.Store, *mongodrv.Database) {
	db, raw := mixedDB(t)
	n := startNode(t, db, raw)
	n.must("connect", nil, nil)
	return n, wardenOn(t, db), db
}

// TestMixedFleetMigrate: warden's Migrate adopts a database the adapter's
// connect() made, and the adapter's connect() still works on a database
// warden migrated (it fails on MongoDB when the keys it indexes are
// indexed under other names or options).
func TestMixedFleetMigrate(t *testing.T) {
	ctx := context.Background()
	t.Run("NodeFirst", func(t *testing.T) {
		n, st, db := mixed(t)
		if err := st.Migrate(ctx); err != nil {
			t.Fatalf("Migrate again: %v", err)
		}
		n.must("connect", nil, nil)
		checkIndexes(t, db)
	})
	t.Run("WardenFirst", func(t *testing.T) {
		db, raw := mixedDB(t)
		st := wardenOn(t, db)
		n := startNode(t, db, raw)
		n.must("connect", nil, nil)
		if err := st.Migrate(ctx); err != nil {
			t.Fatalf("Migrate after connect: %v", err)
		}
		checkIndexes(t, db)
		// The adapter's insert-only acquire is refused by the unique
		// index warden made, while warden holds the lock.
		rec, ok, err := st.Driver().Locks().Acquire(ctx, "w", "warden-1", time.Minute)
		if err != nil || !ok {
			t.Fatalf("warden acquire: %v %v", ok, err)
		}
		if n.acquire("w", "node-1", time.Minute) {
			t.Fatalf("the Node side acquired a lock warden holds (%+v)", rec)
		}
	})
	t.Run("OldWardenIndexes", func(t *testing.T) {
		// A database migrated by an earlier warden: its TTL indexes on
		// expiresAt under warden's name make the adapter's connect() fail
		// on MongoDB; Migrate replaces them with the adapter's.
		db, raw := mixedDB(t)
		wardenOn(t, db)
		for _, c := range []string{mongo.DefaultLocksCollection, mongo.DefaultCacheCollection} {
			_ = db.Collection(c).Indexes().DropOne(ctx, "expiresAt_1")
			_, err := db.Collection(c).Indexes().CreateOne(ctx, mongodrv.IndexModel{Keys: bson.D{{Key: "expiresAt", Value: 1}},
				Options: options.Index().SetName("warden_expiresAt_ttl")})
			if err != nil {
				t.Fatal(err)
			}
		}
		st, err := mongo.New(db, &mongo.Options{Prefix: "other:", DisableEvents: true})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		for _, c := range []string{mongo.DefaultLocksCollection, mongo.DefaultCacheCollection} {
			if names := indexNames(t, db.Collection(c)); names["warden_expiresAt_ttl"] {
				t.Errorf("%s: warden_expiresAt_ttl kept: %v", c, names)
			}
		}
		n := startNode(t, db, raw)
		n.must("connect", nil, nil)
	})
	t.Run("RefusesDuplicateKeys", func(t *testing.T) {
		// Two records with one key (the adapter's upsert races without
		// its unique index) cannot get a unique index: Migrate says which
		// collection, index and key before changing anything, and the
		// store does not open.
		db, _ := mixedDB(t)
		for range 2 {
			if _, err := db.Collection(mongo.DefaultCacheCollection).InsertOne(ctx, bson.D{{Key: "key", Value: mixedPrefix + "cache:dup"}, {Key: "value", Value: 1}}); err != nil {
				t.Fatal(err)
			}
		}
		_, err := mongo.New(db, &mongo.Options{Prefix: mixedPrefix, DisableEvents: true})
		if err == nil || !strings.Contains(err.Error(), mongo.DefaultCacheCollection) || !strings.Contains(err.Error(), "cache:dup") ||
			!strings.Contains(err.Error(), "nothing was changed") {
			t.Fatalf("Migrate on duplicate keys: %v, want an error naming %s and the key", err, mongo.DefaultCacheCollection)
		}
		// Refused before changing anything: no index was created, on the
		// cache nor on the collections migrated before it.
		for _, c := range []string{mongo.DefaultLocksCollection, mongo.DefaultCacheCollection} {
			if names := indexNames(t, db.Collection(c)); len(names) > 1 {
				t.Errorf("%s: indexes %v after a refused Migrate", c, names)
			}
		}
	})
}

func indexNames(t *testing.T, c *mongodrv.Collection) map[string]bool {
	t.Helper()
	specs, err := c.Indexes().ListSpecifications(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, s := range specs {
		names[s.Name] = true
	}
	return names
}

// checkIndexes checks the unique key indexes both sides rely on.
func checkIndexes(t *testing.T, db *mongodrv.Database) {
	t.Helper()
	for _, c := range []string{mongo.DefaultLocksCollection, mongo.DefaultCircuitsCollection, mongo.DefaultCacheCollection} {
		names := indexNames(t, db.Collection(c))
		if !names["key_1"] || !names["warden_key_namespace"] {
			t.Errorf("%s: indexes %v, want key_1 and warden_key_namespace", c, names)
		}
	}
}

// TestMixedFleetLocks: each side refuses a lock the other holds (warden
// answers "not acquired" with the Node holder, never an error or a give-up)
// and takes one the other released or let expire; warden's fencing tokens
// keep growing across Node holdings and the adapter's TTL index.
func TestMixedFleetLocks(t *testing.T) {
	ctx := context.Background()
	n, st, db := mixed(t)
	mongo.SetTries(st, 5) // a loop on a Node document gives up fast
	lk := st.Driver().Locks()
	locks := db.Collection(mongo.DefaultLocksCollection)

	// Node holds "a": warden is refused, with the holder.
	if !n.acquire("a", "node-1", time.Minute) {
		t.Fatal("Node could not acquire a free lock")
	}
	rec, ok, err := lk.Acquire(ctx, "a", "warden-1", time.Minute)
	if err != nil || ok {
		t.Fatalf("warden acquire of a Node-held lock: acquired=%v err=%v, want not acquired", ok, err)
	}
	if rec.Owner != "node-1" || rec.ExpiresAt.IsZero() {
		t.Errorf("holder %+v, want node-1 with its expiry", rec)
	}
	// Operators see the Node holding.
	if got, ok, err := lk.Get(ctx, "a"); err != nil || !ok || got.Owner != "node-1" || got.ExpiresAt.IsZero() {
		t.Errorf("Get of a Node-held lock: %+v %v %v", got, ok, err)
	}
	if list, err := lk.List(ctx, driver.MustPattern("*")); err != nil || len(list) != 1 || list[0].Owner != "node-1" {
		t.Errorf("List with a Node-held lock: %+v %v", list, err)
	}
	locker, err := lock.New(st, &lock.Options{Owner: "warden"})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close()
	if _, err := locker.TryAcquire(ctx, "a"); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("TryAcquire of a Node-held lock: %v, want lock.ErrLocked", err)
	}

	// Node releases: warden takes it; Node is refused while warden holds.
	n.must("release", map[string]any{"owner": "node-1"}, nil)
	rec1, ok, err := lk.Acquire(ctx, "a", "warden-1", time.Minute)
	if err != nil || !ok {
		t.Fatalf("warden acquire after the Node release: %v %v", ok, err)
	}
	if n.acquire("a", "node-2", time.Minute) {
		t.Fatal("Node acquired a lock warden holds")
	}

	// warden releases: Node takes it (the released document is out of its
	// way), and warden is refused again.
	if ok, err := lk.Release(ctx, "a", "warden-1", rec1.Token); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	if !n.acquire("a", "node-2", time.Minute) {
		t.Fatal("Node could not acquire a lock warden released")
	}
	if _, ok, err := lk.Acquire(ctx, "a", "warden-2", time.Minute); err != nil || ok {
		t.Fatalf("warden acquire of a Node-held lock: %v %v", ok, err)
	}
	var valid bool
	n.must("isValid", map[string]any{"owner": "node-2"}, &valid)
	if !valid {
		t.Error("the Node holding is no longer valid to the Node side after warden's refused acquire")
	}
	n.must("release", map[string]any{"owner": "node-2"}, nil)
	rec2, ok, err := lk.Acquire(ctx, "a", "warden-2", time.Minute)
	if err != nil || !ok {
		t.Fatalf("warden acquire after the second Node release: %v %v", ok, err)
	}
	if rec2.Token <= rec1.Token {
		t.Errorf("token %d after a Node holding, want > %d", rec2.Token, rec1.Token)
	}

	// A Node holding that expired is taken over by warden at once (the
	// adapter's own acquire waits for the TTL monitor); a negative TTL
	// writes an expiry in the past.
	if !n.acquire("b", "node-3", -time.Second) {
		t.Fatal("Node acquire of b")
	}
	recB, ok, err := lk.Acquire(ctx, "b", "warden-3", time.Minute)
	if err != nil || !ok {
		t.Fatalf("warden acquire of an expired Node lock: %v %v", ok, err)
	}
	if recB.Token <= 0 {
		t.Errorf("token %d", recB.Token)
	}

	// A warden holding that expired: the adapter's TTL index deletes it
	// (ttlMonitor does what MongoDB's would); then Node takes the key.
	recC, ok, err := lk.Acquire(ctx, "c", "warden-4", time.Millisecond)
	if err != nil || !ok {
		t.Fatalf("acquire c: %v %v", ok, err)
	}
	for !time.Now().After(recC.ExpiresAt.Add(time.Millisecond)) {
		time.Sleep(time.Millisecond) // the holding lapses by the clock
	}
	n.must("ttlMonitor", map[string]any{"collection": mongo.DefaultLocksCollection}, nil)
	if !n.acquire("c", "node-4", time.Minute) {
		var docs any
		n.must("find", map[string]any{"collection": mongo.DefaultLocksCollection}, &docs)
		t.Fatalf("Node could not acquire a lock whose warden holding expired and was collected: %v", docs)
	}
	n.must("release", map[string]any{"owner": "node-4"}, nil)

	// Fencing: a released warden document survives the adapter's TTL index
	// and Node holdings, so the next warden token is above it whatever
	// the clocks say. The stored token is raised far above TokenBase(now)
	// (as a burst of holdings or a clock ahead would leave it): a token
	// restarting from the clock would be smaller.
	if ok, err := lk.Release(ctx, "a", "warden-2", rec2.Token); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	high := driver.TokenBase(time.Now().Add(time.Hour))
	res, err := locks.UpdateOne(ctx, bson.D{{Key: "_id", Value: mixedPrefix + "lock:a"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "token", Value: high}}}})
	if err != nil || res.MatchedCount != 1 {
		t.Fatalf("raising the token: %v %+v", err, res)
	}
	var deleted int
	n.must("ttlMonitor", map[string]any{"collection": mongo.DefaultLocksCollection}, &deleted)
	if !n.acquire("a", "node-5", time.Minute) {
		t.Fatal("Node could not acquire a lock warden released")
	}
	n.must("release", map[string]any{"owner": "node-5"}, nil)
	n.must("ttlMonitor", map[string]any{"collection": mongo.DefaultLocksCollection}, nil)
	rec3, ok, err := lk.Acquire(ctx, "a", "warden-5", time.Minute)
	if err != nil || !ok {
		t.Fatalf("warden acquire: %v %v", ok, err)
	}
	if rec3.Token <= high {
		t.Errorf("token %d after the Node side and its TTL index, want > %d (the released document's)", rec3.Token, high)
	}

	// warden force-releases a Node holding (an operator's command): the
	// Node side sees its lock gone.
	if !n.acquire("g", "node-6", time.Minute) {
		t.Fatal("Node acquire of g")
	}
	if ok, err := lk.ForceRelease(ctx, "g"); err != nil || !ok {
		t.Fatalf("ForceRelease of a Node holding: %v %v", ok, err)
	}
	n.must("isValid", map[string]any{"owner": "node-6"}, &valid)
	if valid {
		t.Error("the Node holding is still valid after warden's ForceRelease")
	}

	// Node force-releases a warden holding: warden's Refresh reports it
	// lost, and the next holder gets a greater token.
	n.must("forceRelease", map[string]any{"key": "a"}, nil)
	if _, ok, err := lk.Refresh(ctx, "a", "warden-5", rec3.Token, time.Minute); err != nil || ok {
		t.Fatalf("refresh after a Node force release: %v %v, want not held", ok, err)
	}
}

// TestMixedFleetCache: JSON values written by either side read back equal
// on the other; warden stores them natively (BSON documents), reads the
// adapter's documents (its own _id, no namespace), and still reads values
// stored as BSON binary, by earlier versions or for non-JSON bytes.
func TestMixedFleetCache(t *testing.T) {
	ctx := context.Background()
	n, st, db := mixed(t)
	mongo.SetTries(st, 5)
	ca := st.Driver().Cache()
	coll := db.Collection(mongo.DefaultCacheCollection)
	jsonEqual := func(what string, got []byte, want any) {
		t.Helper()
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("%s: %q is not JSON: %v", what, got, err)
		}
		b, _ := json.Marshal(want)
		_ = json.Unmarshal(b, &w)
		if !reflect.DeepEqual(g, w) {
			t.Errorf("%s: %s, want %s", what, got, b)
		}
	}
	type nodeValue struct {
		Value  any  `json:"value"`
		Binary bool `json:"binary"`
	}

	// warden → Node.
	// As warden's JSON codec writes it (encoding/json: "<" as \u003c).
	wb, _ := json.Marshal(map[string]any{"name": "é<&>", "n": 42, "big": int64(9007199254740991), "f": 0.1, "neg": -3,
		"ok": true, "nil": nil, "list": []any{1, "two", map[string]any{"three": 3.5}}, "empty": map[string]any{}})
	wv := string(wb)
	if err := ca.Set(ctx, "w", []byte(wv), time.Minute); err != nil {
		t.Fatal(err)
	}
	var nv nodeValue
	n.must("cacheGet", map[string]any{"key": "w"}, &nv)
	if nv.Binary {
		t.Fatal("Node read a BSON Binary, want the native value")
	}
	var want any
	_ = json.Unmarshal([]byte(wv), &want)
	b, _ := json.Marshal(nv.Value)
	jsonEqual("Node read of warden's value", b, want)
	// Scalars and arrays too.
	for _, v := range []string{`"text"`, `12`, `-1.5`, `true`, `null`, `[1,2,3]`} {
		if err := ca.Set(ctx, "s", []byte(v), 0); err != nil {
			t.Fatal(err)
		}
		n.must("cacheGet", map[string]any{"key": "s"}, &nv)
		b, _ := json.Marshal(nv.Value)
		if string(b) != v || nv.Binary {
			t.Errorf("Node read %s (binary %v), want %s", b, nv.Binary, v)
		}
		e, ok, err := ca.Get(ctx, "s")
		if err != nil || !ok || string(e.Value) != v {
			t.Errorf("warden read back %q %v %v, want %s", e.Value, ok, err, v)
		}
	}
	// warden's own values read back byte for byte.
	e, ok, err := ca.Get(ctx, "w")
	if err != nil || !ok || string(e.Value) != wv {
		t.Fatalf("warden read back %q %v %v, want %s", e.Value, ok, err, wv)
	}

	// Node → warden, into a key warden wrote (the adapter upserts by key
	// into warden's document) and into a new key (the adapter's own
	// document).
	nodeVal := map[string]any{"x": map[string]any{"y": []any{true, nil, 3}}, "f": 2.5, "s": "ü"}
	for _, k := range []string{"w", "fromNode"} {
		n.must("cacheSet", map[string]any{"key": k, "value": nodeVal, "ttl": 60000}, nil)
		e, ok, err := ca.Get(ctx, k)
		if err != nil || !ok {
			t.Fatalf("warden Get of %q written by Node: %v %v", k, ok, err)
		}
		jsonEqual("warden read of Node's value "+k, e.Value, nodeVal)
		if has, err := ca.Has(ctx, k); err != nil || !has {
			t.Errorf("Has(%q) = %v %v", k, has, err)
		}
	}
	keys, err := ca.Keys(ctx, driver.MustPattern("*"))
	if err != nil || !reflect.DeepEqual(keys, []string{"fromNode", "s", "w"}) {
		t.Errorf("Keys: %v %v, want [fromNode s w]", keys, err)
	}
	// warden overwrites the adapter's document, Node reads it.
	if err := ca.Set(ctx, "fromNode", []byte(`{"by":"warden"}`), time.Minute); err != nil {
		t.Fatalf("warden Set over a Node entry: %v", err)
	}
	n.must("cacheGet", map[string]any{"key": "fromNode"}, &nv)
	b, _ = json.Marshal(nv.Value)
	jsonEqual("Node read of warden's overwrite", b, map[string]any{"by": "warden"})
	// SetIfAbsent: a live Node entry is kept, an expired one replaced.
	if ok, err := ca.SetIfAbsent(ctx, "fromNode", []byte(`1`), time.Minute); err != nil || ok {
		t.Errorf("SetIfAbsent over a live Node entry: %v %v, want not stored", ok, err)
	}
	n.must("cacheSet", map[string]any{"key": "gone", "value": "old", "ttl": -1000}, nil)
	if ok, err := ca.SetIfAbsent(ctx, "gone", []byte(`"new"`), time.Minute); err != nil || !ok {
		t.Errorf("SetIfAbsent over an expired Node entry: %v %v, want stored", ok, err)
	}
	n.must("cacheGet", map[string]any{"key": "gone"}, &nv)
	if nv.Value != "new" {
		t.Errorf("Node read %v after SetIfAbsent, want new", nv.Value)
	}
	// Delete of the adapter's document.
	n.must("cacheSet", map[string]any{"key": "nodeOnly", "value": 5, "ttl": 0}, nil)
	if ok, err := ca.Delete(ctx, "nodeOnly"); err != nil || !ok {
		t.Errorf("Delete of a Node entry: %v %v", ok, err)
	}
	n.must("cacheGet", map[string]any{"key": "nodeOnly"}, &nv)
	if nv.Value != nil {
		t.Errorf("Node still reads %v after warden's Delete", nv.Value)
	}

	// Bytes that are not JSON, or JSON whose native form would read back
	// differently, stay binary and read back byte for byte.
	for _, v := range []string{"\x00\xffraw", `{"a": 1}`, `1.0`, `{"$x":1}`, `{"a":1,"a":2}`, `"\u00e9"`, ""} {
		if err := ca.Set(ctx, "raw", []byte(v), 0); err != nil {
			t.Fatal(err)
		}
		e, ok, err := ca.Get(ctx, "raw")
		if err != nil || !ok || string(e.Value) != v {
			t.Errorf("Get of %q: %q %v %v", v, e.Value, ok, err)
		}
	}
	// A record of an earlier warden: the value as BSON binary.
	_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: mixedPrefix + "cache:old"}, {Key: "key", Value: mixedPrefix + "cache:old"},
		{Key: "namespace", Value: mixedPrefix}, {Key: "value", Value: []byte(`{"old":true}`)}, {Key: "expiresAt", Value: nil}})
	if err != nil {
		t.Fatal(err)
	}
	if e, ok, err := ca.Get(ctx, "old"); err != nil || !ok || string(e.Value) != `{"old":true}` {
		t.Errorf("Get of a binary record: %q %v %v", e.Value, ok, err)
	}
}

// TestMixedFleetCircuits: circuit state written by either side is read by
// the other, whichever created the circuit. A circuit the adapter opened
// has no openedAt: warden takes its last failure (else its last update) as
// the opening, so it grants no probe before the open duration has passed.
func TestMixedFleetCircuits(t *testing.T) {
	ctx := context.Background()
	n, st, _ := mixed(t)
	cb := st.Driver().Circuits()
	type nodeState struct {
		State        string `json:"state"`
		FailureCount int64  `json:"failureCount"`
	}

	// warden opens, Node reads.
	for range 2 {
		if _, err := cb.RecordFailure(ctx, "w", 2, driver.AnyGeneration); err != nil {
			t.Fatal(err)
		}
	}
	var ns nodeState
	n.must("getState", map[string]any{"key": "w"}, &ns)
	if ns.State != "open" || ns.FailureCount != 2 {
		t.Errorf("Node reads %+v, want open with 2 failures", ns)
	}

	// Node opens a circuit warden created, warden reads it and grants no
	// probe at once.
	if _, err := cb.RecordSuccess(ctx, "n", driver.AnyGeneration); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		n.must("recordFailure", map[string]any{"key": "n", "max": 2}, nil)
	}
	rec, ok, err := cb.Get(ctx, "n")
	if err != nil || !ok || rec.State != driver.Open || rec.Failures != 2 {
		t.Fatalf("warden reads %+v %v %v, want open with 2 failures", rec, ok, err)
	}
	if rec, granted, err := cb.TryProbe(ctx, "n", "prober", time.Minute, time.Minute); err != nil || granted {
		t.Fatalf("TryProbe on a circuit Node opened just now: granted=%v err=%v (%+v), want refused", granted, err, rec)
	}
	// Opened by Node two minutes ago (by its last failure): due.
	n.must("setState", map[string]any{"key": "n", "state": map[string]any{"state": "open", "failureCount": 2,
		"lastFailureTime": time.Now().Add(-2 * time.Minute).UnixMilli()}}, nil)
	if rec, granted, err := cb.TryProbe(ctx, "n", "prober", time.Minute, time.Minute); err != nil || !granted {
		t.Fatalf("TryProbe on a circuit Node opened 2 minutes ago: granted=%v err=%v (%+v), want granted", granted, err, rec)
	}
	// Node closes it, warden reads closed.
	n.must("recordSuccess", map[string]any{"key": "n"}, nil)
	if rec, _, err := cb.Get(ctx, "n"); err != nil || rec.State != driver.Closed || rec.Failures != 0 {
		t.Errorf("warden reads %+v %v after Node's success, want closed", rec, err)
	}

	// Circuits the adapter created (its own document): warden reads them,
	// and its writes neither fail nor give up.
	for range 2 {
		n.must("recordFailure", map[string]any{"key": "first", "max": 2}, nil)
	}
	rec, ok, err = cb.Get(ctx, "first")
	if err != nil || !ok || rec.State != driver.Open || rec.Failures != 2 {
		t.Fatalf("warden reads %+v %v %v of a circuit Node created, want open with 2 failures", rec, ok, err)
	}
	if rec, granted, err := cb.TryProbe(ctx, "first", "prober", time.Minute, time.Minute); err != nil || granted {
		t.Fatalf("TryProbe on a circuit Node created and opened just now: granted=%v err=%v (%+v)", granted, err, rec)
	}
	n.must("recordFailure", map[string]any{"key": "second", "max": 5}, nil)
	rec, err = cb.RecordFailure(ctx, "second", 5, driver.AnyGeneration)
	if err != nil || rec.State != driver.Closed || rec.Failures != 2 {
		t.Fatalf("warden RecordFailure on a circuit Node created: %+v %v, want closed with 2 failures", rec, err)
	}
	var after nodeState
	n.must("getState", map[string]any{"key": "second"}, &after)
	if after.FailureCount != 2 {
		t.Errorf("Node reads %+v after warden's failure, want 2 failures", after)
	}
	n.must("recordFailure", map[string]any{"key": "second", "max": 5}, nil)
	if rec, _, err := cb.Get(ctx, "second"); err != nil || rec.Failures != 3 {
		t.Errorf("warden reads %+v %v after Node's third failure, want 3", rec, err)
	}
}

// TestMixedFleetCircuitReopenedByNode: a half-open circuit the adapter
// re-opens (its probe failed) grants no probe before the open duration has
// passed since the re-opening. The adapter writes state "open" and leaves
// openedAt and the probe fields as they were; warden's own openings clear
// probeOwner, so an open circuit with a probe owner opened when it was
// last updated.
func TestMixedFleetCircuitReopenedByNode(t *testing.T) {
	ctx := context.Background()
	n, st, db := mixed(t)
	cb := st.Driver().Circuits()
	circs := db.Collection(mongo.DefaultCircuitsCollection)
	age := func(fields ...string) {
		t.Helper()
		past := time.Now().Add(-time.Hour)
		var set bson.D
		for _, f := range fields {
			set = append(set, bson.E{Key: f, Value: past})
		}
		if _, err := circs.UpdateOne(ctx, bson.D{{Key: "key", Value: mixedPrefix + "circuit:c"}}, bson.D{{Key: "$set", Value: set}}); err != nil {
			t.Fatal(err)
		}
	}
	if rec, err := cb.RecordFailure(ctx, "c", 1, driver.AnyGeneration); err != nil || rec.State != driver.Open {
		t.Fatalf("RecordFailure: %+v %v", rec, err)
	}
	age("openedAt", "lastFailureTime", "updatedAt") // warden opened it an hour ago
	if rec, granted, err := cb.TryProbe(ctx, "c", "go", 30*time.Minute, time.Minute); err != nil || !granted || rec.State != driver.HalfOpen {
		t.Fatalf("TryProbe on a circuit open for an hour: %+v granted=%v err=%v", rec, granted, err)
	}
	n.must("recordFailure", map[string]any{"key": "c", "max": 1}, nil)
	if rec, _, err := cb.Get(ctx, "c"); err != nil || rec.State != driver.Open {
		t.Fatalf("after the adapter's failure warden reads %+v (%v), want open", rec, err)
	}
	if rec, granted, err := cb.TryProbe(ctx, "c", "go2", 30*time.Minute, time.Minute); err != nil || granted {
		t.Fatalf("a probe was granted at once on a circuit the adapter just re-opened: %+v granted=%v err=%v", rec, granted, err)
	}
	age("lastFailureTime", "updatedAt") // the adapter re-opened it an hour ago
	if rec, granted, err := cb.TryProbe(ctx, "c", "go2", 30*time.Minute, time.Minute); err != nil || !granted {
		t.Fatalf("TryProbe an hour after the adapter re-opened: %+v granted=%v err=%v", rec, granted, err)
	}
}

// TestMixedFleetTokensAfterForeignDelete: another program deleting warden's
// live lock document between two acquisitions (the adapter's forceRelease
// is a deleteOne on the key), even within the same millisecond, never
// makes warden hand out a token that is not above every token it handed
// out before.
func TestMixedFleetTokensAfterForeignDelete(t *testing.T) {
	ctx := context.Background()
	n, st, db := mixed(t)
	lk := st.Driver().Locks()
	locks := db.Collection(mongo.DefaultLocksCollection)
	var last int64
	check := func(round int, how string) {
		t.Helper()
		rec, ok, err := lk.Acquire(ctx, "t", fmt.Sprint("go-", how, round), time.Minute)
		if err != nil || !ok {
			t.Fatalf("%s round %d: ok=%v err=%v", how, round, ok, err)
		}
		if rec.Token <= last {
			t.Fatalf("%s round %d: token %d after %d", how, round, rec.Token, last)
		}
		last = rec.Token
	}
	// A raw deleteOne right after each acquisition.
	for i := range 500 {
		check(i, "deleteOne")
		if _, err := locks.DeleteOne(ctx, bson.D{{Key: "key", Value: mixedPrefix + "lock:t"}}); err != nil {
			t.Fatal(err)
		}
	}
	// The adapter's own forceRelease.
	for i := range 200 {
		check(i, "forceRelease")
		n.must("forceRelease", map[string]any{"key": "t"}, nil)
	}
}

// TestMixedFleetIdempotency: results the go-go-scope idempotency adapter
// stored are completed records to warden (a Claim returns them, never a
// loop on the adapter's unique index; Get, List and Delete see them; Set
// replaces them; an expired one is claimed), and results warden stored
// read back equal on the adapter.
func TestMixedFleetIdempotency(t *testing.T) {
	ctx := context.Background()
	n, st, db := mixed(t)
	n.must("idemConnect", nil, nil)
	coll := db.Collection("go_goscope_idempotency")
	mongo.SetTries(st, 5)
	id := st.Driver().Idempotency()

	// Node → warden.
	n.must("idemSet", map[string]any{"key": "n", "value": map[string]any{"ok": 1, "s": "x"}, "ttl": 60000}, nil)
	rec, out, err := id.Claim(ctx, "n", "go", time.Minute, "")
	if err != nil || out != driver.Completed {
		t.Fatalf("Claim of a key the adapter completed: %v, %v; want Completed", out, err)
	}
	if string(rec.Result) != `{"ok":1,"s":"x"}` || rec.ExpiresAt.IsZero() {
		t.Errorf("Claim of a key the adapter completed: result %s, expires %v", rec.Result, rec.ExpiresAt)
	}
	if g, ok, err := id.Get(ctx, "n"); err != nil || !ok || g.Status != driver.IdemCompleted || string(g.Result) != `{"ok":1,"s":"x"}` {
		t.Errorf("Get of the adapter's record: %+v %v %v", g, ok, err)
	}
	if l, err := id.List(ctx, driver.MustPattern("*")); err != nil || len(l) != 1 || l[0].Key != "n" {
		t.Errorf("List: %+v %v; want the adapter's record", l, err)
	}
	// Expired (a record as the adapter writes it, its TTL past): the next
	// Claim runs the task.
	past := time.Now().Add(-time.Second)
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "key", Value: mixedPrefix + "old"}, {Key: "value", Value: 1},
		{Key: "expiresAt", Value: past}, {Key: "updatedAt", Value: past.Add(-time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	if _, out, err := id.Claim(ctx, "old", "go", time.Minute, ""); err != nil || out != driver.Claimed {
		t.Errorf("Claim of an expired adapter record: %v, %v; want Claimed", out, err)
	}
	// Set replaces the adapter's record; Delete deletes one.
	if err := id.Set(ctx, "n", []byte(`{"by":"go"}`), time.Minute); err != nil {
		t.Fatal(err)
	}
	var nv struct {
		Value any `json:"value"`
	}
	n.must("idemGet", map[string]any{"key": "n"}, &nv)
	if b, _ := json.Marshal(nv.Value); string(b) != `{"by":"go"}` {
		t.Errorf("the adapter reads %s after warden's Set, want {\"by\":\"go\"}", b)
	}
	n.must("idemSet", map[string]any{"key": "d", "value": 2, "ttl": 60000}, nil)
	if ok, err := id.Delete(ctx, "d"); err != nil || !ok {
		t.Errorf("Delete of the adapter's record: %v %v", ok, err)
	}
	if _, ok, _ := id.Get(ctx, "d"); ok {
		t.Error("the adapter's record is still there after Delete")
	}

	// The adapter's set lands on a warden claim in progress (an upsert by
	// key): its result is the key's, for warden too — never a claim in
	// progress forever (the adapter gives no expiry).
	if _, out, err := id.Claim(ctx, "p", "go", time.Minute, ""); err != nil || out != driver.Claimed {
		t.Fatalf("Claim: %v %v", out, err)
	}
	n.must("idemSet", map[string]any{"key": "p", "value": map[string]any{"node": true}}, nil)
	rec, out, err = id.Claim(ctx, "p", "go2", time.Minute, "")
	if err != nil || out != driver.Completed || string(rec.Result) != `{"node":true}` {
		t.Errorf("Claim of a key whose claim the adapter completed: %v %s %v; want Completed with its value", out, rec.Result, err)
	}
	// The claimant giving up leaves the adapter's result.
	if ok, err := id.Abandon(ctx, "p", "go"); err != nil || ok {
		t.Errorf("Abandon of a claim the adapter completed: %v %v; want false (the result stays)", ok, err)
	}
	if g, ok, err := id.Get(ctx, "p"); err != nil || !ok || string(g.Result) != `{"node":true}` {
		t.Errorf("after Abandon: %+v %v %v; want the adapter's result", g, ok, err)
	}

	// warden → Node: the completed result, natively.
	if _, out, err := id.Claim(ctx, "w", "go", time.Minute, ""); err != nil || out != driver.Claimed {
		t.Fatalf("Claim: %v %v", out, err)
	}
	if ok, err := id.Complete(ctx, "w", "go", []byte(`{"a":[1,"two"],"b":null}`), time.Minute); err != nil || !ok {
		t.Fatalf("Complete: %v %v", ok, err)
	}
	n.must("idemGet", map[string]any{"key": "w"}, &nv)
	if b, _ := json.Marshal(nv.Value); string(b) != `{"a":[1,"two"],"b":null}` {
		t.Errorf("the adapter reads %s for warden's result", b)
	}
	// A new claim after the result expired carries no value: the adapter
	// never reads the old result as the new run's.
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: "key", Value: mixedPrefix + "w"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "expiresAt", Value: past}}}}); err != nil {
		t.Fatal(err)
	}
	if _, out, err := id.Claim(ctx, "w", "go2", time.Minute, ""); err != nil || out != driver.Claimed {
		t.Fatalf("Claim after the result expired: %v %v", out, err)
	}
	nv.Value = nil
	n.must("idemGet", map[string]any{"key": "w"}, &nv)
	if nv.Value != nil {
		t.Errorf("the adapter reads %v for a key warden is running again, want no value", nv.Value)
	}
}
