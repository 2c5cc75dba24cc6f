package dynamo_test

// Mixed fleets: items of the go-go-scope DynamoDB layout (DESIGN §5: pk,
// sk = METADATA, data, owner, version, expiresAt in epoch seconds), written
// here exactly as that layout describes them (no Node adapter for
// DynamoDB is published), next to a warden store with the same prefix.

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/dynamo"
)

const mixedPrefix = "mf:"

// nodeSide writes and reads items as a service using the go-go-scope
// layout does.
type nodeSide struct {
	t     *testing.T
	c     *dynamodb.Client
	table string
}

func mixedFleet(t *testing.T) (*nodeSide, *warden.Store) {
	c := newClient(t)
	table := testTable(t)
	st, err := dynamo.New(c, table, &dynamo.Options{Prefix: mixedPrefix, DisableEvents: true})
	if err != nil {
		t.Fatal(err)
	}
	dynamo.SetTries(st, 5) // a loop on a layout item gives up fast
	t.Cleanup(func() { st.Close() })
	return &nodeSide{t: t, c: c, table: table}, st
}

func nS(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }
func nN(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

func sec(t time.Time) int64 { return t.UnixMilli() / 1000 }

func (n *nodeSide) key(pk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": nS(pk), "sk": nS("METADATA")}
}

// put writes an item whole.
func (n *nodeSide) put(it map[string]types.AttributeValue) {
	n.t.Helper()
	if _, err := n.c.PutItem(n.t.Context(), &dynamodb.PutItemInput{TableName: &n.table, Item: it}); err != nil {
		n.t.Fatal(err)
	}
}

func (n *nodeSide) get(pk string) map[string]types.AttributeValue {
	n.t.Helper()
	out, err := n.c.GetItem(n.t.Context(), &dynamodb.GetItemInput{TableName: &n.table, Key: n.key(pk), ConsistentRead: aws.Bool(true)})
	if err != nil {
		n.t.Fatal(err)
	}
	return out.Item
}

// acquire is the layout's lock acquire: a conditional put, free when the
// item is absent or its expiresAt second has come.
func (n *nodeSide) acquire(key, owner string, ttl time.Duration) bool {
	n.t.Helper()
	now := time.Now()
	it := n.key("LOCK#" + mixedPrefix + "lock:" + key)
	it["owner"] = nS(owner)
	it["version"] = nN(1)
	it["expiresAt"] = nN(sec(now.Add(ttl)))
	_, err := n.c.PutItem(n.t.Context(), &dynamodb.PutItemInput{TableName: &n.table, Item: it,
		ConditionExpression:       aws.String("attribute_not_exists(pk) OR expiresAt <= :now"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":now": nN(sec(now))}})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return false
	}
	if err != nil {
		n.t.Fatal(err)
	}
	return true
}

// release is the layout's lock release: delete the item if the owner
// still holds it.
func (n *nodeSide) release(key, owner string) {
	n.t.Helper()
	_, err := n.c.DeleteItem(n.t.Context(), &dynamodb.DeleteItemInput{TableName: &n.table, Key: n.key("LOCK#" + mixedPrefix + "lock:" + key),
		ConditionExpression:       aws.String("#o = :o"),
		ExpressionAttributeNames:  map[string]string{"#o": "owner"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":o": nS(owner)}})
	if err != nil {
		n.t.Fatal(err)
	}
}

// TestMixedFleetLocks: warden refuses a live lock of the layout with its
// holder and its expiry (never a zero expiry), takes one whose
// epoch-seconds expiry has passed (with a token above TokenBase, whatever
// version the item had), and writes an expiresAt the layout's services
// read as the end of the holding, not a day later.
func TestMixedFleetLocks(t *testing.T) {
	ctx := t.Context()
	n, st := mixedFleet(t)
	lk := st.Driver().Locks()

	// Held by the other side: not acquired, holder with its expiry.
	if !n.acquire("a", "node-1", time.Minute) {
		t.Fatal("layout acquire of a free lock")
	}
	want := n.get("LOCK#" + mixedPrefix + "lock:a")["expiresAt"].(*types.AttributeValueMemberN).Value
	rec, ok, err := lk.Acquire(ctx, "a", "warden-1", time.Minute)
	if err != nil || ok {
		t.Fatalf("warden acquire of a held layout lock: acquired=%v err=%v", ok, err)
	}
	if rec.Owner != "node-1" || rec.ExpiresAt.IsZero() || strconv.FormatInt(rec.ExpiresAt.UnixMilli()/1000, 10) != want {
		t.Errorf("holder %+v, want node-1 expiring at second %s", rec, want)
	}
	if got, ok, err := lk.Get(ctx, "a"); err != nil || !ok || got.Owner != "node-1" {
		t.Errorf("Get: %+v %v %v", got, ok, err)
	}
	// Listings Query the list index, which the layout's items (written
	// whole, without lpk) are not in; Migrate's backfill puts them there
	// until the layout next replaces them.
	if list, err := lk.List(ctx, driver.MustPattern("*")); err != nil || len(list) != 0 {
		t.Errorf("List before the backfill: %+v %v, want no lock", list, err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if list, err := lk.List(ctx, driver.MustPattern("*")); err != nil || len(list) != 1 || list[0].Owner != "node-1" || list[0].ExpiresAt.IsZero() {
		t.Errorf("List after the backfill: %+v %v", list, err)
	}

	// Expired by its seconds: warden takes it at once, with a token from
	// TokenBase (the item's version 1 would give 2).
	n.put(map[string]types.AttributeValue{"pk": nS("LOCK#" + mixedPrefix + "lock:b"), "sk": nS("METADATA"),
		"owner": nS("node-2"), "version": nN(1), "expiresAt": nN(sec(time.Now()) - 1)})
	before := driver.TokenBase(time.Now())
	recB, ok, err := lk.Acquire(ctx, "b", "warden-2", time.Minute)
	if err != nil || !ok {
		t.Fatalf("warden acquire of an expired layout lock: %v %v", ok, err)
	}
	if recB.Token < before {
		t.Errorf("token %d, want at least TokenBase(now) = %d", recB.Token, before)
	}
	// A version above TokenBase (a clock ahead, or an earlier warden
	// holding the other side rewrote) is continued, not restarted.
	high := driver.TokenBase(time.Now().Add(time.Hour))
	n.put(map[string]types.AttributeValue{"pk": nS("LOCK#" + mixedPrefix + "lock:c"), "sk": nS("METADATA"),
		"owner": nS("node-3"), "version": nN(high), "expiresAt": nN(sec(time.Now()) - 1)})
	recC, ok, err := lk.Acquire(ctx, "c", "warden-3", time.Minute)
	if err != nil || !ok || recC.Token != high+1 {
		t.Fatalf("warden acquire over version %d: %+v %v %v, want token %d", high, recC, ok, err, high+1)
	}

	// warden's expiresAt is the end of its holding (the second after), so
	// the other side sees the lock held exactly as long, and free once
	// released.
	recD, ok, err := lk.Acquire(ctx, "d", "warden-4", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	ttl, _ := strconv.ParseInt(n.get("LOCK#" + mixedPrefix + "lock:d")["expiresAt"].(*types.AttributeValueMemberN).Value, 10, 64)
	if end := recD.ExpiresAt.UnixMilli(); ttl*1000 < end || ttl*1000 > end+1000 {
		t.Errorf("expiresAt %d s for a holding ending at %d ms: want the second after its end", ttl, end)
	}
	if n.acquire("d", "node-4", time.Minute) {
		t.Fatal("the layout's acquire took a lock warden holds")
	}
	if ok, err := lk.Release(ctx, "d", "warden-4", recD.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if !n.acquire("d", "node-4", time.Minute) {
		t.Fatalf("the layout's acquire is refused a lock warden released (item %v)", n.get("LOCK#"+mixedPrefix+"lock:d"))
	}
	if rec, ok, err := lk.Acquire(ctx, "d", "warden-5", time.Minute); err != nil || ok || rec.ExpiresAt.IsZero() {
		t.Fatalf("warden acquire of the layout's holding: %+v %v %v", rec, ok, err)
	}
	n.release("d", "node-4")
	recE, ok, err := lk.Acquire(ctx, "d", "warden-5", time.Minute)
	if err != nil || !ok || recE.Token <= recD.Token {
		t.Fatalf("warden acquire after the layout's release: %+v %v %v, want a token above %d", recE, ok, err, recD.Token)
	}

	// ForceRelease works on a layout holding.
	if !n.acquire("f", "node-5", time.Minute) {
		t.Fatal("layout acquire")
	}
	if ok, err := lk.ForceRelease(ctx, "f"); err != nil || !ok {
		t.Fatalf("ForceRelease of a layout holding: %v %v", ok, err)
	}
	before = driver.TokenBase(time.Now())
	if rec, ok, err := lk.Acquire(ctx, "f", "warden-6", time.Minute); err != nil || !ok || rec.Token < before {
		t.Fatalf("acquire after ForceRelease: %+v %v %v, want a token of at least %d", rec, ok, err, before)
	}
}

// TestMixedFleetCache: a `data` map written by the other side reads back
// as its JSON; warden writes JSON values as maps, lists, strings, numbers,
// booleans and nulls, and everything else as binary, byte for byte; the
// layout's epoch-seconds expiresAt is the entry's expiry.
func TestMixedFleetCache(t *testing.T) {
	ctx := t.Context()
	n, st := mixedFleet(t)
	ca := st.Driver().Cache()
	pk := func(k string) string { return "CACHE#" + mixedPrefix + "cache:" + k }

	n.put(map[string]types.AttributeValue{"pk": nS(pk("m")), "sk": nS("METADATA"), "expiresAt": nN(sec(time.Now()) + 60),
		"data": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
			"name": nS("ü"), "n": &types.AttributeValueMemberN{Value: "2.5"}, "ok": &types.AttributeValueMemberBOOL{Value: true},
			"nil":  &types.AttributeValueMemberNULL{Value: true},
			"list": &types.AttributeValueMemberL{Value: []types.AttributeValue{nN(1), nS("two")}},
		}}})
	e, ok, err := ca.Get(ctx, "m")
	if err != nil || !ok {
		t.Fatalf("Get of a layout entry: %v %v", ok, err)
	}
	var got, want any
	_ = json.Unmarshal(e.Value, &got)
	_ = json.Unmarshal([]byte(`{"name":"ü","n":2.5,"ok":true,"nil":null,"list":[1,"two"]}`), &want)
	if !reflect.DeepEqual(got, want) || e.ExpiresAt.IsZero() {
		t.Errorf("Get: %s (expires %v), want the map as JSON with its expiry", e.Value, e.ExpiresAt)
	}
	if keys, err := ca.Keys(ctx, driver.MustPattern("*")); err != nil || len(keys) != 0 {
		t.Errorf("Keys before the backfill: %v %v, want none (the layout's items are not in the list index)", keys, err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if keys, err := ca.Keys(ctx, driver.MustPattern("*")); err != nil || !reflect.DeepEqual(keys, []string{"m"}) {
		t.Errorf("Keys after the backfill: %v %v", keys, err)
	}
	// Expired by its seconds: absent, and SetIfAbsent takes its place.
	n.put(map[string]types.AttributeValue{"pk": nS(pk("old")), "sk": nS("METADATA"), "expiresAt": nN(sec(time.Now()) - 1),
		"data": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"v": nN(1)}}})
	if _, ok, err := ca.Get(ctx, "old"); err != nil || ok {
		t.Errorf("Get of an expired layout entry: %v %v", ok, err)
	}
	if ok, err := ca.SetIfAbsent(ctx, "old", []byte(`{"v":2}`), time.Minute); err != nil || !ok {
		t.Errorf("SetIfAbsent over an expired layout entry: %v %v", ok, err)
	}

	// warden writes JSON natively.
	wb, _ := json.Marshal(map[string]any{"a": []any{1, "x", nil, true}, "b": map[string]any{"c": 0.1}, "d": -3})
	if err := ca.Set(ctx, "w", wb, time.Minute); err != nil {
		t.Fatal(err)
	}
	data, isMap := n.get(pk("w"))["data"].(*types.AttributeValueMemberM)
	if !isMap {
		t.Fatalf("data of %s is %T, want a map", wb, n.get(pk("w"))["data"])
	}
	if c := data.Value["b"].(*types.AttributeValueMemberM).Value["c"].(*types.AttributeValueMemberN).Value; c != "0.1" {
		t.Errorf("b.c stored as %q", c)
	}
	if e, ok, err := ca.Get(ctx, "w"); err != nil || !ok || string(e.Value) != string(wb) {
		t.Errorf("Get: %q %v %v, want %s", e.Value, ok, err, wb)
	}
	for v, typ := range map[string]string{`"s"`: "S", `12`: "N", `true`: "BOOL", `null`: "NULL", `[1,2]`: "L"} {
		if err := ca.Set(ctx, "s", []byte(v), 0); err != nil {
			t.Fatal(err)
		}
		if got := reflect.TypeOf(n.get(pk("s"))["data"]).Elem().Name(); got != "AttributeValueMember"+typ {
			t.Errorf("%s stored as %s, want %s", v, got, typ)
		}
		if e, ok, err := ca.Get(ctx, "s"); err != nil || !ok || string(e.Value) != v {
			t.Errorf("Get of %s: %q %v %v", v, e.Value, ok, err)
		}
	}
	// A JSON list within the value limit whose native form is over
	// DynamoDB's item size (about 1.5 times its JSON) is stored as binary.
	big := []byte("[" + strings.Repeat("0,", 150_000) + "0]")
	if err := ca.Set(ctx, "big", big, 0); err != nil {
		t.Fatalf("Set of a %d-byte JSON list: %v", len(big), err)
	}
	if e, ok, err := ca.Get(ctx, "big"); err != nil || !ok || string(e.Value) != string(big) {
		t.Errorf("Get of the big list: %d bytes %v %v", len(e.Value), ok, err)
	}
	// JSON a map could not give back byte for byte stays binary.
	for _, v := range []string{`{"b":1,"a":2}`, `{"a": 1}`, `1.0`, `0.10`, `1e3`, `-0`, `""`, `{"":1}`, `{"a":1,"a":2}`, `"\u00e9"`} {
		if err := ca.Set(ctx, "raw", []byte(v), 0); err != nil {
			t.Fatal(err)
		}
		if _, isB := n.get(pk("raw"))["data"].(*types.AttributeValueMemberB); !isB {
			t.Errorf("%s not stored as binary", v)
		}
		if e, ok, err := ca.Get(ctx, "raw"); err != nil || !ok || string(e.Value) != v {
			t.Errorf("Get of %s: %q %v %v", v, e.Value, ok, err)
		}
	}
}

// TestMixedFleetTokensAfterForeignDelete: a service of the layout deleting
// the lock item right after each of warden's acquisitions (its release is
// a DeleteItem) never makes warden's next token equal to or below the
// previous one. The base counts microseconds, so this holds however fast
// the endpoint answers (dynalite's round trip alone is about a
// millisecond).
func TestMixedFleetTokensAfterForeignDelete(t *testing.T) {
	n, st := mixedFleet(t)
	var last int64
	for i := range 300 {
		owner := fmt.Sprint("go-", i)
		rec, ok, err := st.Locks().Acquire(t.Context(), "t", owner, time.Minute)
		if err != nil || !ok {
			t.Fatalf("round %d: ok=%v err=%v", i, ok, err)
		}
		if rec.Token <= last {
			t.Fatalf("round %d: token %d after %d", i, rec.Token, last)
		}
		last = rec.Token
		n.release("t", rec.Owner)
	}
}

// TestMixedFleetVersionRewritten: another program lowering the version of
// a released warden lock item (an UpdateItem, or a PutItem of the layout
// that replaces it) never makes warden's next token smaller.
func TestMixedFleetVersionRewritten(t *testing.T) {
	n, st := mixedFleet(t)
	l := st.Locks()
	var last int64
	for i, rewrite := range []string{"SET #v = :zero", "SET #v = :one", "REMOVE #v"} {
		rec, ok, err := l.Acquire(t.Context(), "v", "go", time.Minute)
		if err != nil || !ok {
			t.Fatalf("round %d: ok=%v err=%v", i, ok, err)
		}
		if rec.Token <= last {
			t.Fatalf("round %d (after %q): token %d after %d", i, rewrite, rec.Token, last)
		}
		last = rec.Token
		if ok, err := l.Release(t.Context(), "v", "go", rec.Token); err != nil || !ok {
			t.Fatal(ok, err)
		}
		in := &dynamodb.UpdateItemInput{TableName: &n.table, Key: n.key("LOCK#" + mixedPrefix + "lock:v"),
			UpdateExpression: aws.String(rewrite), ExpressionAttributeNames: map[string]string{"#v": "version"}}
		switch rewrite {
		case "SET #v = :zero":
			in.ExpressionAttributeValues = map[string]types.AttributeValue{":zero": nN(0)}
		case "SET #v = :one":
			in.ExpressionAttributeValues = map[string]types.AttributeValue{":one": nN(1)}
		}
		if _, err := n.c.UpdateItem(t.Context(), in); err != nil {
			t.Fatal(err)
		}
	}
	rec, ok, err := l.Acquire(t.Context(), "v", "go", time.Minute)
	if err != nil || !ok || rec.Token <= last {
		t.Fatalf("after the last rewrite: token %d (ok=%v err=%v), previous %d", rec.Token, ok, err, last)
	}
}
