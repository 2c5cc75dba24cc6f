package dynamo_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmw "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/dynamo"
)

// countOp counts the requests of one operation ("Scan", "Query").
func countOp(op string, n *atomic.Int64) func(*middleware.Stack) error {
	return func(st *middleware.Stack) error {
		return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("warden-count-"+op,
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				if awsmw.GetOperationName(ctx) == op {
					n.Add(1)
				}
				return next.HandleFinalize(ctx, in)
			}), middleware.After)
	}
}

// TestPaging reads lists of many pages (3 items per Scan or Query page)
// and checks that every item is seen, in order.
func TestPaging(t *testing.T) {
	ctx := t.Context()
	var scans, queries atomic.Int64
	st, err := dynamo.New(newClient(t, countOp("Scan", &scans), countOp("Query", &queries)), testTable(t), &dynamo.Options{Prefix: "pg:"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dynamo.SetPageLimit(st, 3)
	const n = 20
	var want []string
	for i := range n {
		k := fmt.Sprintf("k%02d", i)
		want = append(want, k)
		if err := st.Cache().Set(ctx, k, []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := st.Locks().Acquire(ctx, k, "o", time.Minute); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if err := st.Idempotency().Set(ctx, k, nil, 0); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "task", Progress: float64(i)}); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if i < 7 {
			if _, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: k}); err != nil || !ok {
				t.Fatal(ok, err)
			}
		}
	}
	scans.Store(0)
	queries.Store(0)
	keys, err := st.Cache().Keys(ctx, "k*")
	if err != nil || strings.Join(keys, ",") != strings.Join(want, ",") {
		t.Errorf("Cache.Keys = %v, %v; want %v", keys, err, want)
	}
	if queries.Load() < 2 || scans.Load() != 0 {
		t.Errorf("Keys made %d Query and %d Scan requests: the test did not cross pages of the list index", queries.Load(), scans.Load())
	}
	locks, err := st.Locks().List(ctx, "*")
	if err != nil || len(locks) != n {
		t.Errorf("Locks.List: %d records, %v; want %d", len(locks), err, n)
	}
	idem, err := st.Idempotency().List(ctx, "")
	if err != nil || len(idem) != n {
		t.Errorf("Idempotency.List: %d records, %v; want %d", len(idem), err, n)
	}
	tasks, err := st.Checkpoints().Tasks(ctx, "k*")
	if err != nil || len(tasks) != 7 {
		t.Errorf("Checkpoints.Tasks = %v, %v; want 7 tasks", tasks, err)
	}
	queries.Store(0)
	cps, err := st.Checkpoints().List(ctx, "task")
	if err != nil || len(cps) != n {
		t.Fatalf("Checkpoints.List: %d, %v", len(cps), err)
	}
	for i, cp := range cps {
		if cp.Sequence != int64(i+1) || cp.Progress != float64(i) {
			t.Errorf("checkpoint %d: sequence %d progress %v", i, cp.Sequence, cp.Progress)
		}
	}
	if queries.Load() < 2 {
		t.Errorf("List made %d Query requests: the test did not cross pages", queries.Load())
	}
	if del, err := st.Checkpoints().Cleanup(ctx, "task", 2); err != nil || del != n-2 {
		t.Errorf("Cleanup: %d, %v; want %d", del, err, n-2)
	}
	if cp, ok, err := st.Checkpoints().Latest(ctx, "task"); err != nil || !ok || cp.Sequence != n {
		t.Errorf("Latest after Cleanup: %+v %v %v", cp, ok, err)
	}
	if cleared, err := st.Cache().Clear(ctx); err != nil || cleared != n {
		t.Errorf("Clear: %d, %v; want %d", cleared, err, n)
	}
	if keys, err := st.Cache().Keys(ctx, ""); err != nil || len(keys) != 0 {
		t.Errorf("Keys after Clear: %v, %v", keys, err)
	}
}

// TestWithoutEventsIndex opens a store on a table made without the events
// index: everything works but notifications, and Migrate adds the index.
func TestWithoutEventsIndex(t *testing.T) {
	ctx := t.Context()
	c := newClient(t)
	table := testTable(t)
	_, err := c.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName: &table,
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String("pk"), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String("sk"), KeyType: types.KeyTypeRange},
		},
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String("pk"), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String("sk"), AttributeType: types.ScalarAttributeTypeS},
		},
		BillingMode: types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := dynamo.New(c, table, &dynamo.Options{DisableAutoCreate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Locks().CanWatch() || st.Circuits().CanWatch() || dynamo.EventsOn(st) {
		t.Error("a store without the events index offers notifications")
	}
	rec, ok, err := st.Locks().Acquire(ctx, "k", "o", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ok, err := st.Locks().Release(ctx, "k", "o", rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	err = st.Migrate(ctx)
	if errors.Is(err, dynamo.ErrNoEventsIndex) {
		// dynalite ignores UpdateTable's index creation: the store must
		// say so and keep working.
		t.Logf("Migrate: %v", err)
		if _, ok, err := st.Locks().Acquire(ctx, "k", "o", time.Minute); err != nil || !ok {
			t.Errorf("Acquire after Migrate: %v %v", ok, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	st2, err := dynamo.New(c, table, &dynamo.Options{DisableAutoCreate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	if !st2.Locks().CanWatch() || !st2.Circuits().CanWatch() {
		t.Error("no notifications after Migrate added the events index")
	}
	// The event is awaited as long as it takes: one that never comes is
	// reported by go test's -timeout.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := st2.Locks().Watch(wctx)
	if err != nil {
		t.Fatal(err)
	}
	rec, ok, err = st2.Locks().Acquire(ctx, "k", "o2", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	seen := false
	for ev := range ch {
		if ev.Kind == driver.LockAcquired && ev.Key == "k" {
			if ev.Token != rec.Token || ev.Owner != "o2" {
				t.Errorf("event %+v, want token %d owner o2", ev, rec.Token)
			}
			seen = true
			break
		}
	}
	if !seen {
		t.Error("the watch channel closed without the acquired event")
	}
}

// TestDisableAutoCreate: a missing table is an error, not created.
func TestDisableAutoCreate(t *testing.T) {
	c := newClient(t)
	table := testTable(t)
	if _, err := dynamo.New(c, table, &dynamo.Options{DisableAutoCreate: true}); err == nil {
		t.Fatal("opened a missing table")
	}
	if _, err := c.DescribeTable(t.Context(), &dynamodb.DescribeTableInput{TableName: &table}); err == nil {
		t.Error("the table was created")
	}
}

// TestValueLimits: values up to Limits().MaxValueBytes fit an item along
// with the largest keys, owners and fingerprints; larger ones are refused
// before any request.
func TestValueLimits(t *testing.T) {
	ctx := t.Context()
	var n atomic.Int64
	st, err := dynamo.New(newClient(t, countAttempts(&n)), testTable(t), &dynamo.Options{Prefix: strings.Repeat("p", 63) + ":"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	max := st.Limits().MaxValueBytes
	if max != dynamo.DefaultMaxValueBytes {
		t.Errorf("MaxValueBytes %d, want %d", max, dynamo.DefaultMaxValueBytes)
	}
	big := bytes.Repeat([]byte{0xAB}, max)
	long := strings.Repeat("ü", driver.MaxKeyBytes/2) // 512 bytes
	if err := st.Cache().Set(ctx, long, big, time.Hour); err != nil {
		t.Fatalf("cache Set of %d bytes: %v", max, err)
	}
	if e, ok, err := st.Cache().Get(ctx, long); err != nil || !ok || !bytes.Equal(e.Value, big) {
		t.Errorf("cache Get: ok=%v err=%v len=%d", ok, err, len(e.Value))
	}
	if _, out, err := st.Idempotency().Claim(ctx, long, long, time.Minute, long); err != nil || out != driver.Claimed {
		t.Fatal(out, err)
	}
	if ok, err := st.Idempotency().Complete(ctx, long, long, big, time.Hour); err != nil || !ok {
		t.Errorf("Complete of %d bytes: ok=%v err=%v", max, ok, err)
	}
	if _, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: long, Data: big, Progress: 99.5, ETA: time.Hour, Token: 1 << 60}); err != nil || !ok {
		t.Errorf("checkpoint Save of %d bytes: ok=%v err=%v", max, ok, err)
	}
	n.Store(0)
	tooBig := append(big, 0)
	if err := st.Cache().Set(ctx, "k", tooBig, 0); !errors.Is(err, warden.ErrValueTooLarge) {
		t.Errorf("cache Set of %d bytes: %v, want ErrValueTooLarge", len(tooBig), err)
	}
	if _, _, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "t", Data: tooBig}); !errors.Is(err, warden.ErrValueTooLarge) {
		t.Errorf("checkpoint Save of %d bytes: %v, want ErrValueTooLarge", len(tooBig), err)
	}
	if n.Load() != 0 {
		t.Errorf("refusing too large values made %d requests", n.Load())
	}
}

// TestPurge deletes idle and expired records of its namespace only.
func TestPurge(t *testing.T) {
	ctx := t.Context()
	table := testTable(t)
	open := func(prefix string) *warden.Store {
		st, err := dynamo.New(newClient(t), table, &dynamo.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	st, other := open("purge:"), open("other:")
	for _, s := range []*warden.Store{st, other} {
		rec, ok, err := s.Locks().Acquire(ctx, "released", "o", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if _, err := s.Locks().Release(ctx, "released", "o", rec.Token); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := s.Locks().Acquire(ctx, "held", "o", time.Minute); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if err := s.Cache().Set(ctx, "expired", []byte("v"), time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if err := s.Cache().Set(ctx, "live", []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
		if err := s.Idempotency().Set(ctx, "expired", []byte("r"), time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Checkpoints().Fence(ctx, "fenced-only", 5); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if _, ok, err := s.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "with-checkpoint", Token: 5}); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	// Every record above was written before written, by the client clock,
	// which decides expiry and idleness here, in milliseconds: the entries
	// expire at most 1 ms (their TTL) after it, and the released lock and
	// the lone fence have been idle for the 1 ms retention 1 ms after it.
	// Wait until that clock has passed it, however long the wait.
	written := time.Now().UnixMilli()
	for time.Now().UnixMilli() < written+1 {
		time.Sleep(time.Millisecond)
	}
	// With a day of retention only the expired cache and idempotency
	// records go.
	if n, err := st.Purge(ctx, 24*time.Hour); err != nil || n != 2 {
		t.Errorf("Purge(24h) = %d, %v; want 2", n, err)
	}
	// With 1 ms of retention (passed) the released lock and the lone
	// fence go too.
	if n, err := st.Purge(ctx, time.Millisecond); err != nil || n != 2 {
		t.Errorf("Purge(1ms) = %d, %v; want 2", n, err)
	}
	if _, ok, _ := st.Locks().Get(ctx, "held"); !ok {
		t.Error("Purge deleted a held lock")
	}
	if ok, _ := st.Cache().Has(ctx, "live"); !ok {
		t.Error("Purge deleted a live cache entry")
	}
	if cps, _ := st.Checkpoints().List(ctx, "with-checkpoint"); len(cps) != 1 {
		t.Error("Purge deleted a checkpoint")
	}
	// A purged lock record starts again above every token it handed out.
	rec, ok, err := st.Locks().Acquire(ctx, "released", "o2", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if rec.Token <= driver.TokenBase(time.Now().Add(-time.Minute)) {
		t.Errorf("token %d after purge is not from the current TokenBase", rec.Token)
	}
	// The other namespace is untouched: its expired records are still
	// there for its own Purge.
	if n, err := other.Purge(ctx, time.Millisecond); err != nil || n != 4 {
		t.Errorf("other namespace's Purge(1ms) = %d, %v; want 4", n, err)
	}
}

// TestIntervalOverDuringRetries: a failure whose attempts outlast the
// circuit's counting period starts a new period rather than retrying the
// old period's write until it gives up. The race hook lets the period end
// between the store's choice of write and its send; the client returns the
// item with a failed condition, as DynamoDB does (withAllOld).
func TestIntervalOverDuringRetries(t *testing.T) {
	ctx := t.Context()
	table := testTable(t)
	st, err := dynamo.New(newClient(t, withAllOld(t, table)), table, &dynamo.Options{Prefix: "interval:", DisableEvents: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const interval = 20 * time.Millisecond
	fail := driver.Outcome{Kind: driver.OutcomeFailure, Gen: driver.AnyGeneration, Interval: interval}
	first, err := st.Driver().Circuits().RecordOutcome(ctx, "c", fail)
	if err != nil {
		t.Fatal(err)
	}
	end := first.IntervalStart.Add(interval)
	// Every attempt is sent once the period it was chosen in has ended
	// (the clock is the store's: the client's).
	dynamo.SetRace(st, func(site string) {
		if site != "step" {
			return
		}
		for !time.Now().After(end) {
			runtime.Gosched()
		}
		end = time.Now().Add(interval)
	})
	rec, err := st.Driver().Circuits().RecordOutcome(ctx, "c", fail)
	if err != nil {
		t.Fatalf("a failure whose period ended during its attempts: %v", err)
	}
	if rec.TotalFailures != 1 || !rec.IntervalStart.After(first.IntervalStart) {
		t.Errorf("after the period ended: total failures %d from %v, want 1 in a new period after %v", rec.TotalFailures, rec.IntervalStart, first.IntervalStart)
	}
}

// withAllOld makes a client return the item with a failed conditional
// UpdateItem (ReturnValuesOnConditionCheckFailure ALL_OLD), which DynamoDB
// does and dynalite does not: the item is read right after the failure,
// so that tests reach the branches the store takes on DynamoDB.
func withAllOld(t testing.TB, table string) func(*middleware.Stack) error {
	reader := newClient(t)
	return func(st *middleware.Stack) error {
		return st.Initialize.Add(middleware.InitializeMiddlewareFunc("warden-all-old",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleInitialize(ctx, in)
				u, ok := in.Parameters.(*dynamodb.UpdateItemInput)
				var ccf *types.ConditionalCheckFailedException
				if !ok || !errors.As(err, &ccf) || ccf.Item != nil || u.ReturnValuesOnConditionCheckFailure != types.ReturnValuesOnConditionCheckFailureAllOld {
					return out, md, err
				}
				got, gerr := reader.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: u.Key, ConsistentRead: aws.Bool(true)})
				if gerr == nil {
					ccf.Item = got.Item
				}
				return out, md, err
			}), middleware.Before)
	}
}
