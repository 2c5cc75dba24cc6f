package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/recordlock"
	wdynamo "github.com/warden-go/warden/store/dynamo"
	wmongo "github.com/warden-go/warden/store/mongo"
	wmysql "github.com/warden-go/warden/store/mysql"
	wpostgres "github.com/warden-go/warden/store/postgres"
	wsqlite "github.com/warden-go/warden/store/sqlite"
)

// Claim throughput: workers drain a table of records, each claim taking
// one unclaimed record; the figure is wall time per claim (µs), so lower
// is better and 1e6 / figure is claims per second of the whole pool.
const (
	claimRecords = 10_000
	claimWorkers = 8
	// mongoClaimRecords is the MongoDB cases' table size: the test server
	// (FerretDB 1.24 behind the write-serialising proxy) reads the whole
	// collection for each claim and runs claims one at a time, so 10 000
	// records would take hours there.
	mongoClaimRecords = 500
	// dynamoClaimRecords is the DynamoDB cases' table size: dynalite
	// evaluates a Query's filter item by item, so every claim pays for the
	// claimed records ahead of it.
	dynamoClaimRecords = 2_000
	// ClaimMetric is the metric the claim cases report.
	ClaimMetric = "µs/claim"
)

var claimTables atomic.Int64

func claimTable(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), claimTables.Add(1))
}

// drain runs b.N rounds: reset refills the table (untimed), then
// claimWorkers goroutines call claim until it reports nothing left. It
// checks that exactly claimRecords claims were made per round.
func drain(b *testing.B, n int, reset func(round int), claim func(ctx context.Context, round int) (bool, error)) {
	ctx := context.Background()
	var total time.Duration
	for round := 0; round < b.N; round++ {
		b.StopTimer()
		reset(round)
		b.StartTimer()
		var claimed atomic.Int64
		var failed atomic.Pointer[error]
		var wg sync.WaitGroup
		start := time.Now()
		for range claimWorkers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for failed.Load() == nil {
					ok, err := claim(ctx, round)
					if err != nil {
						failed.Store(&err)
						return
					}
					if !ok {
						return
					}
					claimed.Add(1)
				}
			}()
		}
		wg.Wait()
		total += time.Since(start)
		if e := failed.Load(); e != nil {
			b.Fatal(*e)
		}
		if got := claimed.Load(); got != int64(n) {
			b.Fatalf("round %d: %d claims over %d records", round, got, n)
		}
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N*n), ClaimMetric)
}

// wardenClaim claims through recordlock (no auto-extension: the claims
// stay held for the round and lapse later).
func wardenClaim[F any](b *testing.B, d driver.Records[F], filter func(round int) F) func(context.Context, int) (bool, error) {
	l, err := recordlock.New(d, &recordlock.Options{NoAutoExtend: true})
	if err != nil {
		b.Fatal(err)
	}
	return func(ctx context.Context, round int) (bool, error) {
		_, err := l.Claim(ctx, filter(round), time.Hour)
		if errors.Is(err, recordlock.ErrNothingToClaim) {
			return false, nil
		}
		return err == nil, err
	}
}

func claimCases() []Case {
	const g = "record claim, 8 workers over 10 000 records (µs per claim, wall)"
	const gm = "record claim, 8 workers over 500 records (µs per claim, wall)"
	const gd = "record claim, 8 workers over 2 000 records (µs per claim, wall)"
	cases := []Case{
		{Group: g + " — sqlite", Name: "raw UPDATE … WHERE id = (SELECT … LIMIT 1) RETURNING", Baseline: true, Metric: ClaimMetric, Run: func(b *testing.B) { sqliteClaim(b, false) }},
		{Group: g + " — sqlite", Name: "recordlock Claim", Metric: ClaimMetric, Run: func(b *testing.B) { sqliteClaim(b, true) }},
	}
	if u := os.Getenv(postgresEnv); u != "" {
		cases = append(cases,
			Case{Group: g + " — postgres", Name: "raw UPDATE … (SELECT … FOR UPDATE SKIP LOCKED) RETURNING", Baseline: true, Metric: ClaimMetric, Run: func(b *testing.B) { postgresClaim(b, u, false) }},
			Case{Group: g + " — postgres", Name: "recordlock Claim", Metric: ClaimMetric, Run: func(b *testing.B) { postgresClaim(b, u, true) }})
	}
	if u := os.Getenv(mysqlEnv); u != "" {
		cases = append(cases,
			Case{Group: g + " — mysql", Name: "raw SELECT … FOR UPDATE SKIP LOCKED + UPDATE", Baseline: true, Metric: ClaimMetric, Run: func(b *testing.B) { mysqlClaim(b, u, false) }},
			Case{Group: g + " — mysql", Name: "recordlock Claim", Metric: ClaimMetric, Run: func(b *testing.B) { mysqlClaim(b, u, true) }})
	}
	if u := os.Getenv(mongoEnv); u != "" {
		cases = append(cases,
			Case{Group: gm + " — mongodb", Name: "raw findOneAndUpdate with sort", Baseline: true, Metric: ClaimMetric, Run: func(b *testing.B) { mongoClaim(b, u, false) }},
			Case{Group: gm + " — mongodb", Name: "recordlock Claim", Metric: ClaimMetric, Run: func(b *testing.B) { mongoClaim(b, u, true) }})
	}
	if ep := os.Getenv(dynamoEnv); ep != "" {
		cases = append(cases,
			Case{Group: gd + " — dynamodb", Name: "raw Query (index, held filtered out) + conditional UpdateItem", Baseline: true, Metric: ClaimMetric, Run: func(b *testing.B) { dynamoClaim(b, ep, false) }},
			Case{Group: gd + " — dynamodb", Name: "recordlock Claim", Metric: ClaimMetric, Run: func(b *testing.B) { dynamoClaim(b, ep, true) }})
	}
	return cases
}

// sqlClaim sets up a jobs table (id, status + the lock columns, migrated
// by the store's own helper) on db and runs the drain.
func sqlClaim(b *testing.B, exec func(string) error, table, create, insert string, migrate func() error, raw func(ctx context.Context) (bool, error), rt driver.Records[recordlock.SQL], ph string) {
	b.Helper()
	if err := exec(create); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { exec("DROP TABLE " + table) })
	if err := migrate(); err != nil {
		b.Fatal(err)
	}
	reset := func(int) {
		if err := exec("DELETE FROM " + table); err != nil {
			b.Fatal(err)
		}
		for i := 0; i < claimRecords; i += 500 {
			q := insert
			for j := i; j < i+500; j++ {
				if j > i {
					q += ","
				}
				q += "(" + strconv.Itoa(j+1) + ", 'todo')"
			}
			if err := exec(q); err != nil {
				b.Fatal(err)
			}
		}
	}
	if rt != nil {
		drain(b, claimRecords, reset, wardenClaim(b, rt, func(int) recordlock.SQL { return recordlock.SQL{Where: "status = " + ph, Args: []any{"todo"}} }))
		return
	}
	drain(b, claimRecords, reset, func(ctx context.Context, _ int) (bool, error) { return raw(ctx) })
}

func sqliteClaim(b *testing.B, viaWarden bool) {
	path := filepath.Join(b.TempDir(), "claim.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(FULL)")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	if !viaWarden {
		// What a careful user of SQLite does: one writing connection, so
		// that claims queue in the pool rather than in SQLite's busy
		// handler (whose sleeps, and SQLITE_BUSY under contention, would
		// make the baseline slow and flaky).
		db.SetMaxOpenConns(1)
	}
	table := claimTable("claim")
	rt, err := wsqlite.Records(db, table, nil)
	if err != nil {
		b.Fatal(err)
	}
	owner := "raw-bench"
	raw := func(ctx context.Context) (bool, error) {
		var id int64
		now := time.Now().UnixMilli()
		err := db.QueryRowContext(ctx, `UPDATE `+table+` SET locked_by = ?, locked_until = ?, lock_token = COALESCE(lock_token, 0) + 1
			WHERE id = (SELECT id FROM `+table+` WHERE status = 'todo' AND (locked_by IS NULL OR locked_until <= ?) ORDER BY id LIMIT 1)
			AND (locked_by IS NULL OR locked_until <= ?) RETURNING id`, owner, now+3_600_000, now, now).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) {
			// Either nothing is left, or another worker took the
			// candidate between the two reads of one statement (it
			// cannot in SQLite, which runs one writer at a time).
			return false, nil
		}
		return err == nil, err
	}
	var w driver.Records[recordlock.SQL]
	if viaWarden {
		w = rt
	}
	sqlClaim(b, sqlExec(db), table, `CREATE TABLE `+table+` (id INTEGER PRIMARY KEY, status TEXT NOT NULL)`, `INSERT INTO `+table+` (id, status) VALUES `,
		func() error { return rt.Migrate(context.Background()) }, raw, w, "?")
}

func postgresClaim(b *testing.B, base string, viaWarden bool) {
	pool, err := pgxpool.New(context.Background(), base)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	table := claimTable("claim")
	rt, err := wpostgres.Records(pool, table, nil)
	if err != nil {
		b.Fatal(err)
	}
	raw := func(ctx context.Context) (bool, error) {
		var id int64
		err := pool.QueryRow(ctx, `UPDATE `+table+` t SET locked_by = $1, locked_until = now() + interval '1 hour', lock_token = COALESCE(t.lock_token, 0) + 1
			FROM (SELECT id FROM `+table+` WHERE status = 'todo' AND locked_by IS NULL ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) c
			WHERE t.id = c.id RETURNING t.id`, "raw-bench").Scan(&id)
		if err != nil && err.Error() == "no rows in result set" {
			return false, nil
		}
		return err == nil, err
	}
	var w driver.Records[recordlock.SQL]
	if viaWarden {
		w = rt
	}
	sqlClaim(b, func(q string) error { _, err := pool.Exec(context.Background(), q); return err }, table, `CREATE TABLE `+table+` (id bigint PRIMARY KEY, status text NOT NULL)`, `INSERT INTO `+table+` (id, status) VALUES `,
		func() error { return rt.Migrate(context.Background()) }, raw, w, "$1")
}

func mysqlClaim(b *testing.B, base string, viaWarden bool) {
	db := rawMySQLDB(b, base)
	db.SetMaxOpenConns(claimWorkers + 2)
	db.SetMaxIdleConns(claimWorkers + 2)
	table := claimTable("claim")
	rt, err := wmysql.Records(db, table, nil)
	if err != nil {
		b.Fatal(err)
	}
	raw := func(ctx context.Context) (bool, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return false, err
		}
		defer tx.Rollback()
		var id int64
		err = tx.QueryRowContext(ctx, `SELECT id FROM `+table+` WHERE status = 'todo' AND locked_by IS NULL ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE `+table+` SET locked_by = ?, locked_until = UTC_TIMESTAMP(3) + INTERVAL 1 HOUR, lock_token = COALESCE(lock_token, 0) + 1 WHERE id = ?`, "raw-bench", id); err != nil {
			return false, err
		}
		return true, tx.Commit()
	}
	var w driver.Records[recordlock.SQL]
	if viaWarden {
		w = rt
	}
	sqlClaim(b, sqlExec(db), table, `CREATE TABLE `+table+` (id BIGINT PRIMARY KEY, status VARCHAR(32) NOT NULL) ENGINE=InnoDB`, `INSERT INTO `+table+` (id, status) VALUES `,
		func() error { return rt.Migrate(context.Background()) }, raw, w, "?")
}

func mongoClaim(b *testing.B, base string, viaWarden bool) {
	coll := rawMongoColl(b, base, claimTable("claim"))
	ctx := context.Background()
	b.Cleanup(func() { coll.Drop(context.Background()) })
	rt, err := wmongo.Records(coll, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := rt.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	reset := func(int) {
		if _, err := coll.DeleteMany(ctx, bson.D{}); err != nil {
			b.Fatal(err)
		}
		docs := make([]any, mongoClaimRecords)
		for i := range docs {
			docs[i] = bson.D{{Key: "_id", Value: int64(i + 1)}, {Key: "status", Value: "todo"}}
		}
		if _, err := coll.InsertMany(ctx, docs); err != nil {
			b.Fatal(err)
		}
	}
	if viaWarden {
		drain(b, mongoClaimRecords, reset, wardenClaim(b, rt, func(int) wmongo.RecordFilter {
			return wmongo.RecordFilter{Filter: bson.D{{Key: "status", Value: "todo"}}}
		}))
		return
	}
	drain(b, mongoClaimRecords, reset, func(ctx context.Context, _ int) (bool, error) {
		now := time.Now()
		err := coll.FindOneAndUpdate(ctx,
			bson.D{{Key: "status", Value: "todo"}, {Key: "$or", Value: bson.A{bson.D{{Key: "lockedBy", Value: nil}}, bson.D{{Key: "lockedUntil", Value: bson.D{{Key: "$lte", Value: now}}}}}}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "lockedBy", Value: "raw-bench"}, {Key: "lockedUntil", Value: now.Add(time.Hour)}}}, {Key: "$inc", Value: bson.D{{Key: "lockToken", Value: 1}}}},
			options.FindOneAndUpdate().SetSort(bson.D{{Key: "_id", Value: 1}})).Err() // no projection: FerretDB refuses findAndModify's fields
		if errors.Is(err, mongo.ErrNoDocuments) {
			return false, nil
		}
		return err == nil, err
	})
}

func dynamoClaim(b *testing.B, ep string, viaWarden bool) {
	c := rawDynamo(b, ep)
	ctx := context.Background()
	table := claimTable("claim")
	_, err := c.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}, {AttributeName: aws.String("status"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{{
			IndexName: aws.String("by_status"),
			KeySchema: []types.KeySchemaElement{{AttributeName: aws.String("status"), KeyType: types.KeyTypeHash}, {AttributeName: aws.String("id"), KeyType: types.KeyTypeRange}},
			// Claim's Query filters out held records: the index carries the lock attributes.
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeInclude, NonKeyAttributes: []string{"lockedBy", "lockedUntil"}},
		}},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)}) })
	waiter := dynamodb.NewTableExistsWaiter(c)
	if err := waiter.Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)}, time.Minute); err != nil {
		b.Fatal(err)
	}
	rt, err := wdynamo.Records(c, table, nil)
	if err != nil {
		b.Fatal(err)
	}
	status := func(round int) string { return "todo-" + strconv.Itoa(round) }
	reset := func(round int) {
		// A fresh status per round: the records of earlier rounds stay
		// claimed under their own status.
		for i := 0; i < dynamoClaimRecords; i += 25 {
			var reqs []types.WriteRequest
			for j := i; j < i+25; j++ {
				reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: map[string]types.AttributeValue{
					"id":     &types.AttributeValueMemberS{Value: fmt.Sprintf("r%d-%06d", round, j)},
					"status": &types.AttributeValueMemberS{Value: status(round)},
				}}})
			}
			in := map[string][]types.WriteRequest{table: reqs}
			for len(in) > 0 {
				out, err := c.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: in})
				if err != nil {
					b.Fatal(err)
				}
				in = out.UnprocessedItems
			}
		}
	}
	query := func(round int) wdynamo.RecordQuery {
		return wdynamo.RecordQuery{
			IndexName:    "by_status",
			KeyCondition: "#s = :s",
			Names:        map[string]string{"#s": "status"},
			Values:       map[string]types.AttributeValue{":s": &types.AttributeValueMemberS{Value: status(round)}},
		}
	}
	if viaWarden {
		drain(b, dynamoClaimRecords, reset, wardenClaim(b, rt, query))
		return
	}
	drain(b, dynamoClaimRecords, reset, func(ctx context.Context, round int) (bool, error) {
		// The least a DynamoDB claim can do: read candidates from the
		// index (held ones filtered out), take the first whose
		// conditional update succeeds.
		var start map[string]types.AttributeValue
		for {
			now := time.Now().UnixMilli()
			out, err := c.Query(ctx, &dynamodb.QueryInput{
				TableName: aws.String(table), IndexName: aws.String("by_status"),
				KeyConditionExpression:    aws.String("#s = :s"),
				FilterExpression:          aws.String("attribute_not_exists(lockedBy) OR lockedUntil <= :now"),
				ExpressionAttributeNames:  map[string]string{"#s": "status"},
				ExpressionAttributeValues: map[string]types.AttributeValue{":s": &types.AttributeValueMemberS{Value: status(round)}, ":now": &types.AttributeValueMemberN{Value: strconv.FormatInt(now, 10)}},
				Limit:                     aws.Int32(64), ExclusiveStartKey: start,
			})
			if err != nil {
				return false, err
			}
			for _, it := range out.Items {
				_, err := c.UpdateItem(ctx, &dynamodb.UpdateItemInput{
					TableName: aws.String(table), Key: map[string]types.AttributeValue{"id": it["id"]},
					ConditionExpression:       aws.String("attribute_exists(id) AND (attribute_not_exists(lockedBy) OR lockedUntil <= :now)"),
					UpdateExpression:          aws.String("SET lockedBy = :o, lockedUntil = :u ADD lockToken :one"),
					ExpressionAttributeValues: map[string]types.AttributeValue{":now": &types.AttributeValueMemberN{Value: strconv.FormatInt(now, 10)}, ":o": &types.AttributeValueMemberS{Value: "raw-bench"}, ":u": &types.AttributeValueMemberN{Value: strconv.FormatInt(now+3_600_000, 10)}, ":one": &types.AttributeValueMemberN{Value: "1"}},
				})
				var ccf *types.ConditionalCheckFailedException
				if errors.As(err, &ccf) {
					continue
				}
				return err == nil, err
			}
			if out.LastEvaluatedKey == nil {
				return false, nil
			}
			start = out.LastEvaluatedKey
		}
	})
}

func sqlExec(db *sql.DB) func(string) error {
	return func(q string) error { _, err := db.Exec(q); return err }
}
