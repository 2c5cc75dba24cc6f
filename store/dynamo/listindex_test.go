package dynamo_test

import (
	"errors"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/dynamo"
)

// TestLpkOf: the list index key of an item is its kind, its namespace's
// prefix and its kind tag, whatever its key holds.
func TestLpkOf(t *testing.T) {
	for pk, want := range map[string]string{
		"LOCK#lock:k":                 "LOCK#lock:",
		"LOCK#lock:a:lock:b":          "LOCK#lock:",
		"LOCK#bill:lock:k:x":          "LOCK#bill:lock:",
		"CB#circuit:c":                "CB#circuit:",
		"CB#p:circuit:c":              "CB#p:circuit:",
		"CACHE#p:cache:":              "CACHE#p:cache:",
		"IDEM#p:idem:k":               "IDEM#p:idem:",
		"CHECKPOINT#checkpoint:t":     "CHECKPOINT#checkpoint:",
		"CHECKPOINT#ü:checkpoint:t#1": "CHECKPOINT#ü:checkpoint:",
		"LOCK#p:cache:k":              "",
		"LOCK#nocolon":                "",
		"OTHER#p:lock:k":              "",
		"EVT#p:lock:":                 "",
		"WHATEVER":                    "",
		"LOCK#:lock:k":                "",
		"CACHE#a:b:cache:k":           "",
	} {
		got, ok := dynamo.LpkOf(pk)
		if got != want || ok != (want != "") {
			t.Errorf("lpkOf(%q) = %q, %v; want %q", pk, got, ok, want)
		}
	}
}

// writeOneOfEach writes one record of each kind: cache entry a, lock b,
// circuit c, idempotency record d and task e's checkpoint (and fence).
func writeOneOfEach(t *testing.T, st *warden.Store) {
	t.Helper()
	ctx := t.Context()
	if err := st.Cache().Set(ctx, "a", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := st.Locks().Acquire(ctx, "b", "o", time.Hour); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, err := st.Circuits().RecordFailure(ctx, "c", 5); err != nil {
		t.Fatal(err)
	}
	if err := st.Idempotency().Set(ctx, "d", []byte("r"), 0); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "e", Token: 1}); err != nil || !ok {
		t.Fatal(ok, err)
	}
}

// stripLpk removes the list index key from the records writeOneOfEach
// wrote in namespace prefix: they are then as an older warden wrote them.
func stripLpk(t *testing.T, c *dynamodb.Client, table, prefix string) {
	t.Helper()
	for _, k := range [][2]string{
		{"CACHE#" + prefix + "cache:a", "METADATA"}, {"LOCK#" + prefix + "lock:b", "METADATA"},
		{"CB#" + prefix + "circuit:c", "METADATA"}, {"IDEM#" + prefix + "idem:d", "METADATA"},
		{"CHECKPOINT#" + prefix + "checkpoint:e", "FENCE"}, {"CHECKPOINT#" + prefix + "checkpoint:e", "0000000000000000001"},
	} {
		_, err := c.UpdateItem(t.Context(), &dynamodb.UpdateItemInput{
			TableName:           &table,
			Key:                 map[string]types.AttributeValue{"pk": nS(k[0]), "sk": nS(k[1])},
			UpdateExpression:    aws.String("REMOVE lpk"),
			ConditionExpression: aws.String("attribute_exists(lpk)"),
		})
		if err != nil {
			t.Fatalf("removing lpk from %v: %v", k, err)
		}
	}
}

// listed returns what each listing of st shows, in one line per kind.
func listed(t *testing.T, st *warden.Store) []string {
	t.Helper()
	ctx := t.Context()
	var out []string
	keys, err := st.Cache().Keys(ctx, "*")
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, keys...)
	locks, err := st.Locks().List(ctx, "*")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range locks {
		out = append(out, l.Key)
	}
	circs, err := st.Circuits().List(ctx, "*")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range circs {
		out = append(out, c.Name)
	}
	idem, err := st.Idempotency().List(ctx, "*")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range idem {
		out = append(out, r.Key)
	}
	tasks, err := st.Checkpoints().Tasks(ctx, "*")
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, tasks...)
	sort.Strings(out)
	return out
}

var everything = []string{"a", "b", "c", "d", "e"}

// TestListIndexBackfill: records written before the list index existed
// (without lpk) are not listed by Query; Migrate's backfill tags them,
// in every namespace of the table, after which they are listed, each in
// its own namespace only.
func TestListIndexBackfill(t *testing.T) {
	ctx := t.Context()
	c := newClient(t)
	table := testTable(t)
	open := func(prefix string) *warden.Store {
		st, err := dynamo.New(c, table, &dynamo.Options{Prefix: prefix, DisableEvents: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if !dynamo.ListsByIndex(st) {
			t.Fatal("no list index on a table the store created")
		}
		return st
	}
	bf, none := open("bf:"), open("")
	writeOneOfEach(t, bf)
	writeOneOfEach(t, none)
	for _, st := range []*warden.Store{bf, none} {
		if got := listed(t, st); !reflect.DeepEqual(got, everything) {
			t.Fatalf("listed %v, want %v", got, everything)
		}
	}
	stripLpk(t, c, table, "bf:")
	stripLpk(t, c, table, "")
	for _, st := range []*warden.Store{bf, none} {
		if got := listed(t, st); len(got) != 0 {
			t.Errorf("records without lpk listed: %v", got)
		}
	}
	if err := bf.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	for _, st := range []*warden.Store{bf, none} {
		if got := listed(t, st); !reflect.DeepEqual(got, everything) {
			t.Errorf("after the backfill listed %v, want %v", got, everything)
		}
	}
	// Idempotent, and nothing deleted comes back.
	if _, err := bf.Cache().Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := none.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if got, want := listed(t, bf), everything[1:]; !reflect.DeepEqual(got, want) {
		t.Errorf("after a delete and a second Migrate listed %v, want %v", got, want)
	}
}

// TestListIndexOldTable: a table made by an older warden (the events
// index, no list index) is not changed when a store opens: the store
// lists by scanning the table, and finds every record. Migrate adds the
// index and backfills; on an endpoint that cannot add an index to a
// table (dynalite) it says so with ErrNoListIndex and the store keeps
// scanning.
func TestListIndexOldTable(t *testing.T) {
	ctx := t.Context()
	c := newClient(t)
	table := testTable(t)
	s := func(n string) types.AttributeDefinition {
		return types.AttributeDefinition{AttributeName: aws.String(n), AttributeType: types.ScalarAttributeTypeS}
	}
	k := func(n string, kt types.KeyType) types.KeySchemaElement {
		return types.KeySchemaElement{AttributeName: aws.String(n), KeyType: kt}
	}
	_, err := c.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            &table,
		KeySchema:            []types.KeySchemaElement{k("pk", types.KeyTypeHash), k("sk", types.KeyTypeRange)},
		AttributeDefinitions: []types.AttributeDefinition{s("pk"), s("sk"), s("gpk"), s("gsk")},
		BillingMode:          types.BillingModePayPerRequest,
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{{
			IndexName:  aws.String(dynamo.EventsIndex),
			KeySchema:  []types.KeySchemaElement{k("gpk", types.KeyTypeHash), k("gsk", types.KeyTypeRange)},
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeAll},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ops := &attemptsByOp{n: map[string]int{}}
	st, err := dynamo.New(newClient(t, ops.middleware), table, &dynamo.Options{Prefix: "old:"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if dynamo.ListsByIndex(st) {
		t.Fatal("a store on a table without the list index lists by it")
	}
	if !st.Locks().CanWatch() {
		t.Error("the events index of the old table is not used")
	}
	writeOneOfEach(t, st)
	stripLpk(t, c, table, "old:") // written by the older warden
	ops.take()
	if got := listed(t, st); !reflect.DeepEqual(got, everything) {
		t.Errorf("listed by Scan %v, want %v", got, everything)
	}
	if got := ops.take(); got["Scan"] == 0 || got["Query"] != 0 {
		t.Errorf("the listings of a table without the list index sent %v, want Scans", got)
	}

	err = st.Migrate(ctx)
	if errors.Is(err, dynamo.ErrNoListIndex) {
		// dynalite ignores UpdateTable's index creation: Migrate says so
		// and the store keeps listing by Scan, completely.
		t.Logf("Migrate: %v", err)
		if got := listed(t, st); !reflect.DeepEqual(got, everything) {
			t.Errorf("after Migrate failed to add the index, listed %v, want %v", got, everything)
		}
		return
	}
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	st2, err := dynamo.New(newClient(t, ops.middleware), table, &dynamo.Options{Prefix: "old:"})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	if !dynamo.ListsByIndex(st2) {
		t.Fatal("no list index after Migrate added it")
	}
	ops.take()
	if got := listed(t, st2); !reflect.DeepEqual(got, everything) {
		t.Errorf("listed by the index after Migrate %v, want %v (the backfill missed records)", got, everything)
	}
	if got := ops.take(); got["Scan"] != 0 {
		t.Errorf("listings after Migrate sent %v, want no Scan", got)
	}
}
