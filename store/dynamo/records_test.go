package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmw "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/recordlock"
	"github.com/warden-go/warden/recordlock/recordlocktest"
	"github.com/warden-go/warden/store/dynamo"
)

// recStatusIndex is the test tables' index on status (sort key rank) that
// ByStatus queries.
const recStatusIndex = "status-rank"

// recClientWith returns a client of the test endpoint (from the
// environment, so that it also works in the suite's child processes)
// with the given stack changes.
func recClientWith(mws ...func(*middleware.Stack) error) *dynamodb.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(os.Getenv("WARDEN_TEST_DYNAMODB_ENDPOINT")),
		Credentials:  credentials.NewStaticCredentialsProvider("warden-test", "warden-test", ""),
		HTTPClient:   &http.Client{Transport: tr},
		APIOptions:   mws,
	})
}

// recClient is the client the harness shares within a process.
var recClient = sync.OnceValue(func() *dynamodb.Client { return recClientWith() })

func recID(n int) any { return fmt.Sprintf("rec-%06d", n) }

// createRecordTable creates a record table — partition key id (S), the
// status-rank index projecting the lock attributes, and the extra
// indexes given — waits until it is active and inserts items.
func createRecordTable(ctx context.Context, c *dynamodb.Client, table string, items []map[string]types.AttributeValue, extra ...types.GlobalSecondaryIndex) error {
	defs := []types.AttributeDefinition{
		{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS},
		{AttributeName: aws.String("status"), AttributeType: types.ScalarAttributeTypeS},
		{AttributeName: aws.String("rank"), AttributeType: types.ScalarAttributeTypeN},
	}
	for _, g := range extra {
		if aws.ToString(g.KeySchema[0].AttributeName) == "lockedBy" {
			defs = append(defs, types.AttributeDefinition{AttributeName: aws.String("lockedBy"), AttributeType: types.ScalarAttributeTypeS})
		}
	}
	_, err := c.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            &table,
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		AttributeDefinitions: defs,
		BillingMode:          types.BillingModePayPerRequest,
		GlobalSecondaryIndexes: append([]types.GlobalSecondaryIndex{{
			IndexName: aws.String(recStatusIndex),
			KeySchema: []types.KeySchemaElement{
				{AttributeName: aws.String("status"), KeyType: types.KeyTypeHash},
				{AttributeName: aws.String("rank"), KeyType: types.KeyTypeRange},
			},
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeInclude, NonKeyAttributes: []string{"lockedBy", "lockedUntil"}},
		}}, extra...),
	})
	if err != nil {
		return err
	}
	if err := waitTable(ctx, c, table); err != nil {
		return err
	}
	return putItems(ctx, c, table, items)
}

// waitTable waits until table and its indexes are active.
func waitTable(ctx context.Context, c *dynamodb.Client, table string) error {
	for {
		out, err := c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &table})
		if err != nil {
			return err
		}
		ready := out.Table.TableStatus == types.TableStatusActive
		for _, g := range out.Table.GlobalSecondaryIndexes {
			ready = ready && (g.IndexStatus == "" || g.IndexStatus == types.IndexStatusActive)
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// putItems writes items, 25 per BatchWriteItem.
func putItems(ctx context.Context, c *dynamodb.Client, table string, items []map[string]types.AttributeValue) error {
	for len(items) > 0 {
		n := min(25, len(items))
		var reqs []types.WriteRequest
		for _, it := range items[:n] {
			reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: it}})
		}
		items = items[n:]
		pending := map[string][]types.WriteRequest{table: reqs}
		for len(pending) > 0 {
			out, err := c.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: pending})
			if err != nil {
				return err
			}
			pending = out.UnprocessedItems
		}
	}
	return nil
}

func rowItem(r recordlocktest.Row) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		"id":     &types.AttributeValueMemberS{Value: recID(r.N).(string)},
		"status": &types.AttributeValueMemberS{Value: r.Status},
		"rank":   &types.AttributeValueMemberN{Value: strconv.Itoa(r.Rank)},
		"note":   &types.AttributeValueMemberS{Value: r.Note},
	}
}

func byStatus(status string) dynamo.RecordQuery {
	return dynamo.RecordQuery{
		IndexName:    recStatusIndex,
		KeyCondition: "#s = :s",
		Names:        map[string]string{"#s": "status"},
		Values:       map[string]types.AttributeValue{":s": &types.AttributeValueMemberS{Value: status}},
	}
}

// countItems counts the items of table with strongly consistent Scans.
func countItems(ctx context.Context, c *dynamodb.Client, table string) (int, error) {
	n := 0
	var start map[string]types.AttributeValue
	for {
		out, err := c.Scan(ctx, &dynamodb.ScanInput{TableName: &table, Select: types.SelectCount, ConsistentRead: aws.Bool(true), ExclusiveStartKey: start})
		if err != nil {
			return 0, err
		}
		n += int(out.Count)
		if len(out.LastEvaluatedKey) == 0 {
			return n, nil
		}
		start = out.LastEvaluatedKey
	}
}

// recordHarness is the conformance harness of the DynamoDB record driver:
// tables with a string partition key id and the status-rank index.
var recordHarness = recordlocktest.Harness[dynamo.RecordQuery]{
	Name: "dynamodb",
	Create: func(ctx context.Context, table string, rows []recordlocktest.Row) error {
		var items []map[string]types.AttributeValue
		for _, r := range rows {
			items = append(items, rowItem(r))
		}
		if err := createRecordTable(ctx, recClient(), table, items); err != nil {
			return err
		}
		d, err := dynamo.Records(recClient(), table, nil)
		if err != nil {
			return err
		}
		return d.Migrate(ctx)
	},
	Drop: func(ctx context.Context, table string) error { return dynamo.DeleteTable(ctx, recClient(), table) },
	Open: func(ctx context.Context, table string) (driver.Records[dynamo.RecordQuery], func(), error) {
		d, err := dynamo.Records(recClient(), table, nil)
		return d, func() {}, err
	},
	ID: recID,
	Read: func(ctx context.Context, table string, id any) (recordlocktest.Row, bool, error) {
		out, err := recClient().GetItem(ctx, &dynamodb.GetItemInput{
			TableName: &table, ConsistentRead: aws.Bool(true),
			Key: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: id.(string)}},
		})
		if err != nil || len(out.Item) == 0 {
			return recordlocktest.Row{}, false, err
		}
		var r recordlocktest.Row
		if v, ok := out.Item["status"].(*types.AttributeValueMemberS); ok {
			r.Status = v.Value
		}
		if v, ok := out.Item["note"].(*types.AttributeValueMemberS); ok {
			r.Note = v.Value
		}
		if v, ok := out.Item["rank"].(*types.AttributeValueMemberN); ok {
			r.Rank, _ = strconv.Atoi(v.Value)
		}
		return r, true, nil
	},
	SetNote: func(ctx context.Context, table string, id any, note string) error {
		_, err := recClient().UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 &table,
			Key:                       map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: id.(string)}},
			UpdateExpression:          aws.String("SET note = :n"),
			ConditionExpression:       aws.String("attribute_exists(id)"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":n": &types.AttributeValueMemberS{Value: note}},
		})
		return err
	},
	Count:    func(ctx context.Context, table string) (int, error) { return countItems(ctx, recClient(), table) },
	ByStatus: byStatus,
	HostileIDs: []any{
		"x' OR '1'='1", "%", "*", "rec-%", "rec-00000*", "rec-000001 ", " rec-000001", "REC-000001",
		"rec-000001\x00", "#wdn_by", ":wdn_now", `{"$ne": ""}`, "attribute_exists(id)",
	},
}

// TestRecordsConformance runs recordlock's conformance suite against
// dynalite.
func TestRecordsConformance(t *testing.T) {
	endpoint(t)
	recordlocktest.Run(t, recordHarness)
}

// recTable makes a record table of n rows (status todo, rank i, note) for
// one test and returns its name and a driver with opts.
func recTable(t *testing.T, n int, opts *dynamo.RecordOptions, extra ...types.GlobalSecondaryIndex) (string, *dynamo.RecordTable) {
	t.Helper()
	endpoint(t)
	table := testTable(t)
	var items []map[string]types.AttributeValue
	for i := 1; i <= n; i++ {
		items = append(items, rowItem(recordlocktest.Row{N: i, Status: "todo", Rank: i, Note: fmt.Sprint("note ", i)}))
	}
	if err := createRecordTable(t.Context(), recClient(), table, items, extra...); err != nil {
		t.Fatal(err)
	}
	d, err := dynamo.Records(recClient(), table, opts)
	if err != nil {
		t.Fatal(err)
	}
	return table, d
}

func getItem(t *testing.T, table, id string) map[string]types.AttributeValue {
	t.Helper()
	out, err := recClient().GetItem(t.Context(), &dynamodb.GetItemInput{
		TableName: &table, ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: id}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item
}

// TestRecordsLockSemantics drives the driver directly through a holding's
// life: lock, refusal naming the holder, extend (only by the holder with
// its token, before expiry), release (only by the holder), force-release.
func TestRecordsLockSemantics(t *testing.T) {
	ctx := t.Context()
	table, d := recTable(t, 2, nil)
	id := "rec-000001"
	rec, found, ok, err := d.Lock(ctx, id, "a", time.Minute)
	if err != nil || !found || !ok || rec.Owner != "a" || rec.Token != 1 || rec.ID != id || rec.Until.Sub(rec.Now) != time.Minute {
		t.Fatalf("Lock: %+v found %v ok %v %v; want a's holding, token 1, a minute long", rec, found, ok, err)
	}
	it := getItem(t, table, id)
	if n, ok := it["lockedUntil"].(*types.AttributeValueMemberN); !ok || n.Value != strconv.FormatInt(rec.Until.UnixMilli(), 10) {
		t.Errorf("lockedUntil stored as %#v, want Unix ms %d", it["lockedUntil"], rec.Until.UnixMilli())
	}
	other, found, ok, err := d.Lock(ctx, id, "b", time.Minute)
	if err != nil || !found || ok || other.Owner != "a" || !other.Until.Equal(rec.Until) || other.Token != 1 || !other.Live() {
		t.Fatalf("second Lock: %+v found %v ok %v %v; want refused, naming a's holding", other, found, ok, err)
	}
	if _, found, ok, err := d.Extend(ctx, id, "a", 2, time.Hour); err != nil || !found || ok {
		t.Errorf("Extend with a wrong token: found %v ok %v %v; want refused", found, ok, err)
	}
	if _, found, ok, err := d.Extend(ctx, id, "b", 1, time.Hour); err != nil || !found || ok {
		t.Errorf("Extend by another owner: found %v ok %v %v; want refused", found, ok, err)
	}
	ext, found, ok, err := d.Extend(ctx, id, "a", 1, time.Hour)
	if err != nil || !found || !ok || ext.Until.Sub(ext.Now) != time.Hour || !ext.Until.After(rec.Until) {
		t.Fatalf("Extend: %+v found %v ok %v %v", ext, found, ok, err)
	}
	if got, _, err := d.Get(ctx, id); err != nil || !got.Until.Equal(ext.Until) || got.Owner != "a" || got.Token != 1 {
		t.Errorf("Get after Extend: %+v %v; want until %v", got, err, ext.Until)
	}
	if ok, err := d.Release(ctx, id, "b", 1); err != nil || ok {
		t.Errorf("Release by another owner: %v %v", ok, err)
	}
	if ok, err := d.Release(ctx, id, "a", 7); err != nil || ok {
		t.Errorf("Release with a wrong token: %v %v", ok, err)
	}
	if ok, err := d.Release(ctx, id, "a", 1); err != nil || !ok {
		t.Fatalf("Release: %v %v", ok, err)
	}
	it = getItem(t, table, id)
	if _, has := it["lockedBy"]; has {
		t.Errorf("after Release the item still has lockedBy: %v", it)
	}
	if _, has := it["lockedUntil"]; has {
		t.Errorf("after Release the item still has lockedUntil: %v", it)
	}
	if got, found, err := d.Get(ctx, id); err != nil || !found || got.Owner != "" || !got.Until.IsZero() || got.Token != 1 || got.Live() {
		t.Errorf("Get after Release: %+v %v %v; want unlocked with token 1", got, found, err)
	}
	if ok, err := d.Release(ctx, id, "a", 1); err != nil || ok {
		t.Errorf("second Release: %v %v; want false", ok, err)
	}
	if _, _, ok, err := d.Extend(ctx, id, "a", 1, time.Hour); err != nil || ok {
		t.Errorf("Extend after Release: %v %v; want refused", ok, err)
	}
	rec, _, ok, err = d.Lock(ctx, id, "b", time.Minute)
	if err != nil || !ok || rec.Token != 2 {
		t.Fatalf("Lock after Release: %+v %v %v; want token 2", rec, ok, err)
	}
	was, found, err := d.ForceRelease(ctx, id)
	if err != nil || !found || was.Owner != "b" || was.Token != 2 || !was.Until.Equal(rec.Until) {
		t.Errorf("ForceRelease: %+v %v %v; want b's holding with token 2", was, found, err)
	}
	if ok, err := d.Release(ctx, id, "b", 2); err != nil || ok {
		t.Errorf("Release after ForceRelease: %v %v; want false", ok, err)
	}
	// An expired holding: Extend refuses it, Release still clears it.
	rec, _, ok, err = d.Lock(ctx, id, "c", -time.Second)
	if err != nil || !ok || rec.Live() {
		t.Fatalf("Lock with a past expiry: %+v %v %v", rec, ok, err)
	}
	if _, _, ok, err := d.Extend(ctx, id, "c", rec.Token, time.Minute); err != nil || ok {
		t.Errorf("Extend of an expired holding: %v %v; want refused", ok, err)
	}
	if ok, err := d.Release(ctx, id, "c", rec.Token); err != nil || !ok {
		t.Errorf("Release of the holder's expired holding: %v %v; want true", ok, err)
	}
}

// TestRecordsMissing: an id no item has is never created — by Lock,
// Extend, Release or ForceRelease — and reports not found.
func TestRecordsMissing(t *testing.T) {
	ctx := t.Context()
	table, d := recTable(t, 3, nil)
	id := "rec-000999"
	if rec, found, ok, err := d.Lock(ctx, id, "a", time.Minute); err != nil || found || ok {
		t.Errorf("Lock of a missing record: %+v found %v ok %v %v", rec, found, ok, err)
	}
	if _, found, ok, err := d.Extend(ctx, id, "a", 1, time.Minute); err != nil || found || ok {
		t.Errorf("Extend of a missing record: found %v ok %v %v", found, ok, err)
	}
	if ok, err := d.Release(ctx, id, "a", 1); err != nil || ok {
		t.Errorf("Release of a missing record: %v %v", ok, err)
	}
	if _, found, err := d.ForceRelease(ctx, id); err != nil || found {
		t.Errorf("ForceRelease of a missing record: %v %v", found, err)
	}
	if _, found, err := d.Get(ctx, id); err != nil || found {
		t.Errorf("Get of a missing record: %v %v", found, err)
	}
	if it := getItem(t, table, id); len(it) != 0 {
		t.Errorf("the missing record was created: %v", it)
	}
	if n, err := countItems(ctx, recClient(), table); err != nil || n != 3 {
		t.Errorf("count: %d %v; want 3", n, err)
	}
}

// TestRecordsUserAttributes: lock, extend, claim and release write only
// the lock attributes; an attribute another program changes meanwhile
// keeps its change, and attributes of every type survive unchanged.
func TestRecordsUserAttributes(t *testing.T) {
	ctx := t.Context()
	table, d := recTable(t, 0, nil)
	user := map[string]types.AttributeValue{
		"id":     &types.AttributeValueMemberS{Value: "rec-000001"},
		"status": &types.AttributeValueMemberS{Value: "todo"},
		"rank":   &types.AttributeValueMemberN{Value: "1"},
		"note":   &types.AttributeValueMemberS{Value: "before"},
		"doc": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
			"lockedBy": &types.AttributeValueMemberS{Value: "nested, not a lock attribute"},
			"n":        &types.AttributeValueMemberN{Value: "1.5"},
		}},
		"tags": &types.AttributeValueMemberSS{Value: []string{"a", "b"}},
		"blob": &types.AttributeValueMemberB{Value: []byte{0, 1, 2}},
		"nil":  &types.AttributeValueMemberNULL{Value: true},
	}
	if err := putItems(ctx, recClient(), table, []map[string]types.AttributeValue{user}); err != nil {
		t.Fatal(err)
	}
	rec, _, ok, err := d.Lock(ctx, "rec-000001", "a", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := recordHarness.SetNote(ctx, table, "rec-000001", "edited while locked"); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := d.Extend(ctx, "rec-000001", "a", rec.Token, time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ok, err := d.Release(ctx, "rec-000001", "a", rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	c, ok, err := d.Claim(ctx, byStatus("todo"), "b", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, _, err := d.ForceRelease(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	got := getItem(t, table, "rec-000001")
	want := maps.Clone(user)
	want["note"] = &types.AttributeValueMemberS{Value: "edited while locked"}
	want["lockToken"] = &types.AttributeValueMemberN{Value: "2"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("item after lock, edit, extend, release, claim, force-release:\n got %#v\nwant %#v", got, want)
	}
}

// TestRecordsIDs: CheckID refuses what DynamoDB could not take as this
// table's key (or could take as another value: invalid UTF-8 would be
// rewritten on the wire); hostile strings are values, never expressions.
func TestRecordsIDs(t *testing.T) {
	ctx := t.Context()
	_, d := recTable(t, 3, nil)
	for _, id := range []any{nil, "", strings.Repeat("x", 2049), "\xff\xfe", 1.5, true, []string{"a"}, uint64(1 << 63),
		dynamo.RecordKey{PK: "rec-000001", SK: "x"}, map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "rec-000001"}}, []byte{}} {
		err := d.CheckID(id)
		if !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("CheckID(%.30v): %v; want ErrInvalidArgument", id, err)
		} else if len(err.Error()) > 300 {
			t.Errorf("CheckID: message of %d bytes", len(err.Error()))
		}
		if _, _, _, err := d.Lock(ctx, id, "a", time.Minute); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Lock(%.30v): %v; want ErrInvalidArgument before any I/O", id, err)
		}
	}
	for _, id := range []any{"rec-000001", strings.Repeat("x", 2048), int64(-5), uint8(1), []byte("k")} {
		if err := d.CheckID(id); err != nil {
			t.Errorf("CheckID(%.30v): %v", id, err)
		}
	}
	for _, id := range recordHarness.HostileIDs {
		if _, found, ok, err := d.Lock(ctx, id, "a", time.Minute); err != nil || found || ok {
			t.Errorf("Lock(%q): found %v ok %v %v; want not found", id, found, ok, err)
		}
	}
	if live, err := d.List(ctx, 10); err != nil || len(live) != 0 {
		t.Errorf("live locks after hostile ids: %+v %v", live, err)
	}
}

// TestRecordsQueryPlaceholders: a RecordQuery may not use the driver's
// placeholders (they would bind to the driver's values), and a query
// without a key condition is refused (Claim never scans).
func TestRecordsQueryPlaceholders(t *testing.T) {
	ctx := t.Context()
	_, d := recTable(t, 3, nil)
	s := &types.AttributeValueMemberS{Value: "todo"}
	for _, q := range []dynamo.RecordQuery{
		{IndexName: recStatusIndex},
		{IndexName: recStatusIndex, KeyCondition: "#s = :s", Names: map[string]string{"#s": "status", "#wdn_by": "status"}, Values: map[string]types.AttributeValue{":s": s}},
		{IndexName: recStatusIndex, KeyCondition: "#s = :s", Names: map[string]string{"#s": "status"}, Values: map[string]types.AttributeValue{":s": s, ":WDN_now": s}},
		{IndexName: recStatusIndex, KeyCondition: "#s = :s", Filter: "#wdn_until > :s", Names: map[string]string{"#s": "status"}, Values: map[string]types.AttributeValue{":s": s}},
		{IndexName: recStatusIndex, KeyCondition: "#s = :wdn_owner", Names: map[string]string{"#s": "status"}},
		{IndexName: recStatusIndex, KeyCondition: "#s = :s", Names: map[string]string{"s": "status"}, Values: map[string]types.AttributeValue{":s": s}},
		{IndexName: recStatusIndex, KeyCondition: "#s = :s", Names: map[string]string{"#s": "status"}, Values: map[string]types.AttributeValue{":s": nil}},
	} {
		if _, ok, err := d.Claim(ctx, q, "a", time.Minute); ok || !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Claim(%+v): %v %v; want ErrInvalidArgument", q, ok, err)
		}
	}
	// The user's own names and values beside the driver's: a Query of the
	// table (one record by its key) with a filter on the note.
	q := dynamo.RecordQuery{
		KeyCondition: "#i = :i", Filter: "#n = :n",
		Names: map[string]string{"#i": "id", "#n": "note"},
		Values: map[string]types.AttributeValue{
			":i": &types.AttributeValueMemberS{Value: "rec-000002"},
			":n": &types.AttributeValueMemberS{Value: "note 3"},
		},
	}
	if _, ok, err := d.Claim(ctx, q, "a", time.Minute); err != nil || ok {
		t.Fatalf("Claim with a filter matching nothing: %v %v", ok, err)
	}
	q.Values[":n"] = &types.AttributeValueMemberS{Value: "note 2"}
	rec, ok, err := d.Claim(ctx, q, "a", time.Minute)
	if err != nil || !ok || rec.ID != "rec-000002" {
		t.Fatalf("Claim with a filter: %+v %v %v; want rec-000002", rec, ok, err)
	}
	if _, ok, err := d.Claim(ctx, q, "a", time.Minute); err != nil || ok {
		t.Errorf("second Claim with a filter: %v %v; want nothing to claim", ok, err)
	}
}

// opCounter counts requests by operation and remembers Scan inputs.
type opCounter struct {
	mu    sync.Mutex
	ops   map[string]int
	scans []*dynamodb.ScanInput
}

func (c *opCounter) middleware(st *middleware.Stack) error {
	return st.Initialize.Add(middleware.InitializeMiddlewareFunc("warden-rec-count",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			c.mu.Lock()
			if c.ops == nil {
				c.ops = map[string]int{}
			}
			c.ops[awsmw.GetOperationName(ctx)]++
			if s, ok := in.Parameters.(*dynamodb.ScanInput); ok {
				c.scans = append(c.scans, s)
			}
			c.mu.Unlock()
			return next.HandleInitialize(ctx, in)
		}), middleware.After)
}

func (c *opCounter) get(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ops[op]
}

// TestRecordsClaimEachOnce: 8 goroutines, each with a driver of its own,
// claim 500 records until nothing is left; each record goes to exactly
// one, and no claim ever scans the table.
func TestRecordsClaimEachOnce(t *testing.T) {
	ctx := t.Context()
	const n, workers = 500, 8
	table, _ := recTable(t, n, nil)
	var ops opCounter
	c := recClientWith(ops.middleware)
	var mu sync.Mutex
	got := map[string]int{}
	tokens := map[int64]int{}
	var wg sync.WaitGroup
	for w := range workers {
		d, err := dynamo.Records(c, table, nil)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				rec, ok, err := d.Claim(ctx, byStatus("todo"), fmt.Sprint("w", w), time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					return
				}
				mu.Lock()
				got[rec.ID.(string)]++
				tokens[rec.Token]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	missing, twice := 0, 0
	for i := 1; i <= n; i++ {
		switch got[recID(i).(string)] {
		case 0:
			missing++
		case 1:
		default:
			twice++
		}
	}
	if missing != 0 || twice != 0 || len(got) != n {
		t.Errorf("%d records: %d never claimed, %d claimed twice, %d distinct", n, missing, twice, len(got))
	}
	if len(tokens) != 1 || tokens[1] != n {
		t.Errorf("tokens of first claims: %v; want all 1", tokens)
	}
	if s := ops.get("Scan"); s != 0 {
		t.Errorf("claims made %d Scan requests; Claim must only Query", s)
	}
	// Each Claim reads past the records held before the first free one;
	// the page-size hint makes that one Query most of the time.
	if q := ops.get("Query"); q > 2*n {
		t.Errorf("%d claims made %d Query requests; want at most %d", n, q, 2*n)
	}
	t.Logf("%d claims: %d Query, %d UpdateItem requests", n, ops.get("Query"), ops.get("UpdateItem"))
}

// queryLog records the Query inputs a client sends.
type queryLog struct {
	mu  sync.Mutex
	ins []*dynamodb.QueryInput
}

func (l *queryLog) middleware(st *middleware.Stack) error {
	h := &hook{op: "Query"}
	h.f = func(_ context.Context, params any) {
		l.mu.Lock()
		l.ins = append(l.ins, params.(*dynamodb.QueryInput))
		l.mu.Unlock()
	}
	h.armed.Store(true)
	return h.middleware(st)
}

func (l *queryLog) client() *dynamodb.Client { return recClientWith(l.middleware) }

func (l *queryLog) take() []*dynamodb.QueryInput {
	l.mu.Lock()
	defer l.mu.Unlock()
	ins := l.ins
	l.ins = nil
	return ins
}

// startID is the id in a Query's ExclusiveStartKey ("" for none).
func startID(in *dynamodb.QueryInput) string {
	if v, ok := in.ExclusiveStartKey["id"].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

// TestRecordsClaimPageHint: without resuming (ClaimResume < 0), each
// Claim reads from the start, asking its first page for a little more
// than the last Claim read past, so that a queue whose head is held costs
// one Query per Claim; once the head is free again, pages shrink back.
func TestRecordsClaimPageHint(t *testing.T) {
	ctx := t.Context()
	const n = 60
	table, _ := recTable(t, n, nil)
	var log queryLog
	d, err := dynamo.Records(log.client(), table, &dynamo.RecordOptions{ClaimResume: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		rec, ok, err := d.Claim(ctx, byStatus("todo"), "w", time.Minute)
		if err != nil || !ok || rec.ID != recID(i) {
			t.Fatalf("claim %d: %+v %v %v", i, rec, ok, err)
		}
	}
	if _, ok, err := d.Claim(ctx, byStatus("todo"), "w", time.Minute); err != nil || ok {
		t.Fatalf("claim with every record held: %v %v", ok, err)
	}
	ins := log.take()
	if len(ins) != n+1 {
		t.Errorf("%d claims made %d Query requests, want one each", n+1, len(ins))
	}
	for _, in := range ins {
		if in.ExclusiveStartKey != nil {
			t.Errorf("a Query with ClaimResume < 0 started at %v", startID(in))
		}
	}
	for i := 1; i <= n; i++ {
		if _, _, err := d.ForceRelease(ctx, recID(i)); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, ok, err := d.Claim(ctx, byStatus("todo"), "w", time.Minute); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	ins = log.take()
	if len(ins) != 2 || aws.ToInt32(ins[0].Limit) < n || aws.ToInt32(ins[1].Limit) != dynamo.DefaultClaimPageSize {
		var limits []int32
		for _, in := range ins {
			limits = append(limits, aws.ToInt32(in.Limit))
		}
		t.Errorf("page limits after the head was freed: %v; want one over %d (the hint), then %d", limits, n, dynamo.DefaultClaimPageSize)
	}
}

// TestRecordsClaimResume: Claims resume after the record the previous
// Claim took; a record freed ahead of that position is claimed once the
// Query runs out behind it, and nothing to claim is reported only after a
// read from the start.
func TestRecordsClaimResume(t *testing.T) {
	ctx := t.Context()
	const n = 30
	table, _ := recTable(t, n, nil)
	var log queryLog
	d, err := dynamo.Records(log.client(), table, &dynamo.RecordOptions{ClaimResume: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	claim := func() any {
		t.Helper()
		rec, ok, err := d.Claim(ctx, byStatus("todo"), "w", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return nil
		}
		return rec.ID
	}
	for i := 1; i <= 10; i++ {
		if id := claim(); id != recID(i) {
			t.Fatalf("claim %d: %v", i, id)
		}
	}
	ins := log.take()
	if len(ins) != 10 || startID(ins[0]) != "" {
		t.Fatalf("%d Query requests, the first from %q; want 10, the first from the start", len(ins), startID(ins[0]))
	}
	for i, in := range ins[1:] {
		if startID(in) != recID(i+1) || in.ExclusiveStartKey["status"] == nil || in.ExclusiveStartKey["rank"] == nil {
			t.Errorf("Query %d resumed from %v; want after %v, with the index keys", i+2, in.ExclusiveStartKey, recID(i+1))
		}
	}
	if _, _, err := d.ForceRelease(ctx, recID(1)); err != nil {
		t.Fatal(err)
	}
	for i := 11; i <= n; i++ {
		if id := claim(); id != recID(i) {
			t.Fatalf("claim %d after freeing %v: %v; want %v", i, recID(1), id, recID(i))
		}
	}
	if id := claim(); id != recID(1) {
		t.Errorf("claim after the tail ran out: %v; want %v (from the start)", id, recID(1))
	}
	log.take()
	if id := claim(); id != nil {
		t.Errorf("claim with every record held: %v", id)
	}
	fromStart := false
	for i, in := range log.take() {
		fromStart = fromStart || (i > 0 && startID(in) == "")
	}
	if !fromStart {
		t.Error("the Claim that found nothing never read from the start after resuming")
	}
}

// TestRecordsExpiredClaimable: a holding whose expiry has passed is taken
// at once by Claim and by Lock, with the next token.
func TestRecordsExpiredClaimable(t *testing.T) {
	ctx := t.Context()
	_, d := recTable(t, 1, nil)
	id := "rec-000001"
	// A past expiry: the holding is expired the moment it is written.
	old, _, ok, err := d.Lock(ctx, id, "a", -time.Millisecond)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	rec, ok, err := d.Claim(ctx, byStatus("todo"), "b", time.Minute)
	if err != nil || !ok || rec.ID != id || rec.Owner != "b" || rec.Token != old.Token+1 {
		t.Fatalf("Claim of an expired holding: %+v %v %v", rec, ok, err)
	}
	if _, found, ok, err := d.Lock(ctx, id, "c", time.Minute); err != nil || !found || ok {
		t.Fatalf("Lock of b's live holding: %v %v %v", found, ok, err)
	}
	if _, _, ok, err := d.Lock(ctx, id, "c", -time.Millisecond); err != nil || ok {
		t.Fatalf("Lock of b's live holding: %v %v", ok, err)
	}
	if ok, err := d.Release(ctx, id, "a", old.Token); err != nil || ok {
		t.Errorf("the expired holder released the new holding: %v %v", ok, err)
	}
	if _, _, err := d.ForceRelease(ctx, id); err != nil {
		t.Fatal(err)
	}
	exp, _, ok, err := d.Lock(ctx, id, "c", -time.Millisecond)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	rec, found, ok, err := d.Lock(ctx, id, "d", time.Minute)
	if err != nil || !found || !ok || rec.Token != exp.Token+1 {
		t.Errorf("Lock of an expired holding: %+v %v %v %v", rec, found, ok, err)
	}
}

// TestRecordsTokensIncrease: every lock of a record, by Lock or Claim,
// after a release, a force-release or an expiry, gets the next token.
func TestRecordsTokensIncrease(t *testing.T) {
	ctx := t.Context()
	_, d := recTable(t, 1, nil)
	id := "rec-000001"
	var prev int64
	for i := range 12 {
		var rec driver.RecordLock
		var ok bool
		var err error
		dur := time.Minute
		if i%4 == 3 {
			dur = -time.Millisecond // expires at once
		}
		if i%2 == 0 {
			rec, _, ok, err = d.Lock(ctx, id, fmt.Sprint("o", i), dur)
		} else {
			rec, ok, err = d.Claim(ctx, byStatus("todo"), fmt.Sprint("o", i), dur)
		}
		if err != nil || !ok {
			t.Fatalf("round %d: %v %v", i, ok, err)
		}
		if rec.Token != prev+1 {
			t.Errorf("round %d: token %d after %d", i, rec.Token, prev)
		}
		prev = rec.Token
		switch i % 4 {
		case 0:
			if ok, err := d.Release(ctx, id, rec.Owner, rec.Token); err != nil || !ok {
				t.Fatal(ok, err)
			}
		case 1, 2:
			if _, _, err := d.ForceRelease(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// hook runs f before each request of operation op that c sends (in the
// request's goroutine), while it is armed.
type hook struct {
	op    string
	armed atomic.Bool
	f     func(ctx context.Context, params any)
}

func (h *hook) middleware(st *middleware.Stack) error {
	return st.Initialize.Add(middleware.InitializeMiddlewareFunc("warden-rec-hook-"+h.op,
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			if awsmw.GetOperationName(ctx) == h.op && h.armed.Load() {
				h.f(ctx, in.Parameters)
			}
			return next.HandleInitialize(ctx, in)
		}), middleware.After)
}

// TestRecordsLockReleasedBetween: a Lock refused by a holding that is
// released before the read that follows tries again and takes the
// record (it does not report the record locked by nobody).
func TestRecordsLockReleasedBetween(t *testing.T) {
	ctx := t.Context()
	table, other := recTable(t, 1, nil)
	id := "rec-000001"
	h := &hook{op: "GetItem"}
	h.f = func(ctx context.Context, _ any) {
		if ok, err := other.Release(ctx, id, "a", 1); err != nil || !ok {
			t.Errorf("release in the hook: %v %v", ok, err)
		}
		h.armed.Store(false)
	}
	d, err := dynamo.Records(recClientWith(h.middleware), table, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := other.Lock(ctx, id, "a", time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	h.armed.Store(true)
	rec, found, ok, err := d.Lock(ctx, id, "b", time.Minute)
	if err != nil || !found || !ok || rec.Owner != "b" || rec.Token != 2 {
		t.Errorf("Lock after a release between its update and its read: %+v %v %v %v; want b's holding, token 2", rec, found, ok, err)
	}
	if h.armed.Load() {
		t.Error("the Lock never read the record after its refused update")
	}
}

// TestRecordsClaimGivesUp: a Claim whose every candidate is taken by
// another claimer just before its update gives up after ClaimTries
// candidates with an error saying so, having claimed nothing.
func TestRecordsClaimGivesUp(t *testing.T) {
	ctx := t.Context()
	table, thief := recTable(t, 10, nil)
	h := &hook{op: "UpdateItem"}
	var stolen atomic.Int64
	h.f = func(ctx context.Context, params any) {
		id := params.(*dynamodb.UpdateItemInput).Key["id"].(*types.AttributeValueMemberS).Value
		if _, _, ok, err := thief.Lock(ctx, id, "thief", time.Minute); err != nil || !ok {
			t.Errorf("thief: %v %v", ok, err)
		}
		stolen.Add(1)
	}
	h.armed.Store(true)
	d, err := dynamo.Records(recClientWith(h.middleware), table, &dynamo.RecordOptions{ClaimTries: 3, ClaimPageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	_, ok, err := d.Claim(ctx, byStatus("todo"), "w", time.Minute)
	if ok || !errors.Is(err, dynamo.ErrContended) || !strings.Contains(err.Error(), "gave up after losing 3 candidates") {
		t.Fatalf("Claim: %v %v; want a give-up error after 3 candidates", ok, err)
	}
	if stolen.Load() != 3 {
		t.Errorf("%d candidates tried, want 3", stolen.Load())
	}
	live, err := thief.List(ctx, 100)
	if err != nil || len(live) != 3 {
		t.Fatalf("List: %+v %v; want the thief's 3", live, err)
	}
	held := map[any]bool{}
	for _, r := range live {
		held[r.ID] = true
		if r.Owner != "thief" {
			t.Errorf("live lock %+v; want the thief's", r)
		}
	}
	// The first candidate in order, then (after a lost race) one of the
	// next few.
	if !held["rec-000001"] || !held["rec-000002"] {
		t.Errorf("the thief holds %v; want rec-000001 and rec-000002 among them", held)
	}
	// With the thief gone, a Claim takes the first record not held.
	h.armed.Store(false)
	want := "rec-000003"
	if held[want] {
		want = "rec-000004"
	}
	rec, ok, err := d.Claim(ctx, byStatus("todo"), "w", time.Minute)
	if err != nil || !ok || rec.ID != want {
		t.Errorf("Claim: %+v %v %v; want %s", rec, ok, err, want)
	}
}

// TestRecordsClaimRefreshesStalePage: a Claim that loses 8 candidates of
// one page reads a fresh page from where every item is held, instead of
// trying every stale candidate.
func TestRecordsClaimRefreshesStalePage(t *testing.T) {
	ctx := t.Context()
	table, thief := recTable(t, 30, nil)
	var log queryLog
	h := &hook{op: "UpdateItem"}
	h.f = func(ctx context.Context, params any) {
		id := params.(*dynamodb.UpdateItemInput).Key["id"].(*types.AttributeValueMemberS).Value
		if _, _, ok, err := thief.Lock(ctx, id, "thief", time.Minute); err != nil || !ok {
			t.Errorf("thief: %v %v", ok, err)
		}
	}
	h.armed.Store(true)
	d, err := dynamo.Records(recClientWith(h.middleware, log.middleware), table, &dynamo.RecordOptions{ClaimTries: 9, ClaimPageSize: 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := d.Claim(ctx, byStatus("todo"), "w", time.Minute); ok || !errors.Is(err, dynamo.ErrContended) {
		t.Fatalf("Claim: %v %v; want it to give up", ok, err)
	}
	ins := log.take()
	if len(ins) != 2 || ins[0].ExclusiveStartKey != nil || ins[1].ExclusiveStartKey == nil || aws.ToInt32(ins[1].Limit) != 20 {
		t.Fatalf("%d Query requests; want 2, the second from the first page's held prefix", len(ins))
	}
	if s := startID(ins[1]); s < "rec-000001" || s > "rec-000020" {
		t.Errorf("the fresh page starts after %q; want within the first page", s)
	}
}

// TestRecordsClaimRechecksMatch: a candidate that stops matching the
// query between the Query and the update (an index is eventually
// consistent, and other programs change records) is not claimed.
func TestRecordsClaimRechecksMatch(t *testing.T) {
	ctx := t.Context()
	table, _ := recTable(t, 3, nil)
	h := &hook{op: "UpdateItem"}
	h.f = func(ctx context.Context, params any) {
		h.armed.Store(false)
		_, err := recClient().UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 &table,
			Key:                       params.(*dynamodb.UpdateItemInput).Key,
			UpdateExpression:          aws.String("SET #s = :d"),
			ExpressionAttributeNames:  map[string]string{"#s": "status"},
			ExpressionAttributeValues: map[string]types.AttributeValue{":d": &types.AttributeValueMemberS{Value: "done"}},
		})
		if err != nil {
			t.Error(err)
		}
	}
	h.armed.Store(true)
	d, err := dynamo.Records(recClientWith(h.middleware), table, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec, ok, err := d.Claim(ctx, byStatus("todo"), "w", time.Minute)
	if err != nil || !ok || (rec.ID != "rec-000002" && rec.ID != "rec-000003") {
		t.Fatalf("Claim: %+v %v %v; want rec-000002 or rec-000003 (rec-000001 became done before the update)", rec, ok, err)
	}
	if it := getItem(t, table, "rec-000001"); it["lockedBy"] != nil {
		t.Errorf("the record that stopped matching was locked: %v", it)
	}
	if rec, ok, err := d.Claim(ctx, byStatus("done"), "w", time.Minute); err != nil || !ok || rec.ID != "rec-000001" {
		t.Errorf("Claim of done: %+v %v %v", rec, ok, err)
	}
}

// TestRecordsSortKey: a table with a number partition key and a string
// sort key takes RecordKey ids; Claim queries the table itself; List
// orders by partition then sort key.
func TestRecordsSortKey(t *testing.T) {
	ctx := t.Context()
	endpoint(t)
	c := recClient()
	table := testTable(t)
	_, err := c.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName: &table,
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String("tenant"), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String("job"), KeyType: types.KeyTypeRange},
		},
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String("tenant"), AttributeType: types.ScalarAttributeTypeN},
			{AttributeName: aws.String("job"), AttributeType: types.ScalarAttributeTypeS},
		},
		BillingMode: types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := waitTable(ctx, c, table); err != nil {
		t.Fatal(err)
	}
	var items []map[string]types.AttributeValue
	for _, tenant := range []string{"2", "10"} {
		for _, job := range []string{"b", "a", "c"} {
			items = append(items, map[string]types.AttributeValue{
				"tenant": &types.AttributeValueMemberN{Value: tenant},
				"job":    &types.AttributeValueMemberS{Value: job},
			})
		}
	}
	if err := putItems(ctx, c, table, items); err != nil {
		t.Fatal(err)
	}
	if _, err := dynamo.Records(c, table, &dynamo.RecordOptions{PartitionKey: "tenant", SortKey: "tenant"}); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("options naming one attribute twice: %v", err)
	}
	bad, _ := dynamo.Records(c, table, nil)
	if err := bad.Migrate(ctx); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Migrate with the wrong key schema: %v", err)
	}
	d, err := dynamo.Records(c, table, &dynamo.RecordOptions{PartitionKey: "tenant", SortKey: "job"})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.CheckID("x"); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("CheckID of a string on a table with a sort key: %v", err)
	}
	if err := d.CheckID(dynamo.RecordKey{PK: 2, SK: strings.Repeat("x", 1025)}); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("CheckID of an oversized sort key: %v", err)
	}
	rec, found, ok, err := d.Lock(ctx, dynamo.RecordKey{PK: int32(10), SK: "b"}, "a", time.Minute)
	if err != nil || !found || !ok || rec.ID != (dynamo.RecordKey{PK: int64(10), SK: "b"}) {
		t.Fatalf("Lock: %+v %v %v %v", rec, found, ok, err)
	}
	if _, found, _, err := d.Lock(ctx, dynamo.RecordKey{PK: 10, SK: "z"}, "a", time.Minute); err != nil || found {
		t.Errorf("Lock of a missing sort key: %v %v", found, err)
	}
	q := dynamo.RecordQuery{
		KeyCondition: "#t = :t", Names: map[string]string{"#t": "tenant"},
		Values: map[string]types.AttributeValue{":t": &types.AttributeValueMemberN{Value: "2"}}, Descending: true, ConsistentRead: true,
	}
	var claimed []any
	for {
		rec, ok, err := d.Claim(ctx, q, "a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		claimed = append(claimed, rec.ID)
	}
	want := []any{dynamo.RecordKey{PK: int64(2), SK: "c"}, dynamo.RecordKey{PK: int64(2), SK: "b"}, dynamo.RecordKey{PK: int64(2), SK: "a"}}
	if !reflect.DeepEqual(claimed, want) {
		t.Errorf("claimed %v, want %v (descending)", claimed, want)
	}
	live, err := d.List(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	var ids []any
	for _, r := range live {
		ids = append(ids, r.ID)
	}
	want = []any{dynamo.RecordKey{PK: int64(2), SK: "a"}, dynamo.RecordKey{PK: int64(2), SK: "b"}, dynamo.RecordKey{PK: int64(2), SK: "c"}}
	if !reflect.DeepEqual(ids, want) {
		t.Errorf("List(3) = %v, want %v (numbers by value, then sort key)", ids, want)
	}
	if live, err := d.List(ctx, 10); err != nil || len(live) != 4 || live[3].ID != (dynamo.RecordKey{PK: int64(10), SK: "b"}) {
		t.Errorf("List(10) = %+v %v", live, err)
	}
}

// TestRecordsListIndex: with a sparse index keyed by lockedBy, List scans
// the index, not the table, and still reports only live holdings in id
// order.
func TestRecordsListIndex(t *testing.T) {
	ctx := t.Context()
	idx := types.GlobalSecondaryIndex{
		IndexName:  aws.String("locked"),
		KeySchema:  []types.KeySchemaElement{{AttributeName: aws.String("lockedBy"), KeyType: types.KeyTypeHash}},
		Projection: &types.Projection{ProjectionType: types.ProjectionTypeInclude, NonKeyAttributes: []string{"lockedUntil", "lockToken"}},
	}
	table, _ := recTable(t, 5, nil, idx)
	var ops opCounter
	d, err := dynamo.Records(recClientWith(ops.middleware), table, &dynamo.RecordOptions{ListIndex: "locked"})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if bad, _ := dynamo.Records(recClient(), table, &dynamo.RecordOptions{ListIndex: "nope"}); !errors.Is(bad.Migrate(ctx), warden.ErrInvalidArgument) {
		t.Error("Migrate accepted a missing ListIndex")
	}
	for _, id := range []string{"rec-000004", "rec-000002", "rec-000005"} {
		if _, _, ok, err := d.Lock(ctx, id, "a", time.Minute); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	if _, _, ok, err := d.Lock(ctx, "rec-000001", "a", -time.Millisecond); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ok, err := d.Release(ctx, "rec-000005", "a", 1); err != nil || !ok {
		t.Fatal(ok, err)
	}
	// The index is eventually consistent on DynamoDB; dynalite updates it
	// with the write.
	live, err := d.List(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []any
	for _, r := range live {
		ids = append(ids, r.ID)
		if r.Token != 1 || !r.Live() {
			t.Errorf("List: %+v", r)
		}
	}
	if !reflect.DeepEqual(ids, []any{"rec-000002", "rec-000004"}) {
		t.Errorf("List = %v, want rec-000002, rec-000004", ids)
	}
	ops.mu.Lock()
	for _, s := range ops.scans {
		if aws.ToString(s.IndexName) != "locked" {
			t.Errorf("List scanned %q, want the index", aws.ToString(s.IndexName))
		}
	}
	ops.mu.Unlock()
	if !strings.Contains(d.Migration(), `"IndexName":"locked"`) {
		t.Errorf("Migration does not name the list index:\n%s", d.Migration())
	}
}

// TestRecordsIndexChecks: Claim refuses an index that does not exist and
// a global secondary index that does not project the lock attributes (its
// filter would see every record as free); an index projecting ALL works.
func TestRecordsIndexChecks(t *testing.T) {
	ctx := t.Context()
	gsi := func(name string, p types.Projection) types.GlobalSecondaryIndex {
		return types.GlobalSecondaryIndex{
			IndexName: aws.String(name),
			KeySchema: []types.KeySchemaElement{
				{AttributeName: aws.String("status"), KeyType: types.KeyTypeHash},
				{AttributeName: aws.String("rank"), KeyType: types.KeyTypeRange},
			},
			Projection: &p,
		}
	}
	_, d := recTable(t, 2, nil,
		gsi("keys", types.Projection{ProjectionType: types.ProjectionTypeKeysOnly}),
		gsi("half", types.Projection{ProjectionType: types.ProjectionTypeInclude, NonKeyAttributes: []string{"lockedBy", "note"}}),
		gsi("all", types.Projection{ProjectionType: types.ProjectionTypeAll}))
	for _, c := range []struct{ index, want string }{
		{"keys", "does not project lockedBy and lockedUntil"},
		{"half", "does not project lockedUntil"},
		{"nope", "has no index"},
	} {
		q := byStatus("todo")
		q.IndexName = c.index
		if _, ok, err := d.Claim(ctx, q, "w", time.Minute); ok || !errors.Is(err, warden.ErrInvalidArgument) || !strings.Contains(fmt.Sprint(err), c.want) {
			t.Errorf("Claim on index %s: %v %v; want ErrInvalidArgument, %q", c.index, ok, err, c.want)
		}
	}
	q := byStatus("todo")
	q.IndexName = "all"
	for i := 1; i <= 2; i++ {
		if rec, ok, err := d.Claim(ctx, q, "w", time.Minute); err != nil || !ok || rec.ID != recID(i) {
			t.Errorf("Claim on an index projecting ALL: %+v %v %v", rec, ok, err)
		}
	}
}

// TestRecordsStoreTables: a DynamoDB store reaches the record locks of
// another table through its client (driver.RecordTables, for warden
// record …).
func TestRecordsStoreTables(t *testing.T) {
	ctx := t.Context()
	table, d := recTable(t, 2, nil)
	st, err := dynamo.New(recClient(), testTable(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rts, ok := st.Driver().(driver.RecordTables)
	if !ok {
		t.Fatal("the store does not implement driver.RecordTables")
	}
	if _, _, ok, err := d.Lock(ctx, "rec-000002", "a", time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	rt, err := rts.RecordTable(table, driver.RecordFields{})
	if err != nil {
		t.Fatal(err)
	}
	if live, err := rt.List(ctx, 10); err != nil || len(live) != 1 || live[0].ID != "rec-000002" || live[0].Owner != "a" {
		t.Errorf("List: %+v %v", live, err)
	}
	if rec, found, err := rt.ForceRelease(ctx, "rec-000002"); err != nil || !found || rec.Owner != "a" {
		t.Errorf("ForceRelease: %+v %v %v", rec, found, err)
	}
	if _, err := rts.RecordTable("x", driver.RecordFields{}); err == nil {
		t.Error("RecordTable accepted a table name DynamoDB refuses")
	}
	other, err := rts.RecordTable(table, driver.RecordFields{ID: "id", Owner: "holder", Until: "until", Token: "fence"})
	if err != nil {
		t.Fatal(err)
	}
	if rec, found, err := other.Get(ctx, "rec-000001"); err != nil || !found || rec.Live() || rec.Token != 0 {
		t.Errorf("Get with other lock attributes: %+v %v %v", rec, found, err)
	}
}

// TestRecordsLockerFlow: the portable layer over the driver — ErrLocked
// naming the holder, ErrNotFound, Claim until ErrNothingToClaim.
func TestRecordsLockerFlow(t *testing.T) {
	ctx := t.Context()
	_, d := recTable(t, 2, nil)
	a, err := recordlock.New(d, &recordlock.Options{Owner: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := recordlock.New(d, &recordlock.Options{Owner: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	k, err := a.Lock(ctx, "rec-000001", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var le *recordlock.LockedError
	if _, err := b.Lock(ctx, "rec-000001", time.Minute); !errors.As(err, &le) || le.Owner != k.Owner() {
		t.Errorf("Lock of a locked record: %v", err)
	}
	if _, err := b.Lock(ctx, "rec-000009", time.Minute); !errors.Is(err, recordlock.ErrNotFound) {
		t.Errorf("Lock of a missing record: %v", err)
	}
	c, err := b.Claim(ctx, byStatus("todo"), time.Minute)
	if err != nil || c.ID() != "rec-000002" {
		t.Fatalf("Claim: %v", err)
	}
	if _, err := b.Claim(ctx, byStatus("todo"), time.Minute); !errors.Is(err, recordlock.ErrNothingToClaim) {
		t.Errorf("Claim with all locked: %v", err)
	}
	if err := k.Release(ctx); err != nil {
		t.Error(err)
	}
	if err := c.Release(ctx); err != nil {
		t.Error(err)
	}
}

// recordChild runs this test binary as a child process of the record
// suite's multi-process checks when the suite started it so (TestMain
// calls it first).
func recordChild() { recordlocktest.Child(recordHarness) }
