package mongo_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/recordlock"
	"github.com/warden-go/warden/store/mongo"
	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Open a store on a MongoDB database by URL and take a lock. (The example
// runs against WARDEN_TEST_MONGODB_URL, with a database of its own.)
func Example() {
	server := os.Getenv("WARDEN_TEST_MONGODB_URL")
	if server == "" {
		fmt.Println("acquired: true")
		return
	}
	ctx := context.Background()
	st, err := mongo.Open(ctx, server+"?database=warden_example&prefix=example:&w=majority", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()

	locker, err := lock.New(st, &lock.Options{TTL: 10 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locker.Close()
	lease, err := locker.Acquire(ctx, "nightly-report")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("acquired:", lease.Token() > 0)
	_ = lease.Release(ctx)
	// Output: acquired: true
}

// Lock one of your own documents (the lock lives in its lockedBy,
// lockedUntil and lockToken fields), then run a claim-next worker over
// the "todo" jobs, highest priority first.
func ExampleRecords() {
	server := os.Getenv("WARDEN_TEST_MONGODB_URL")
	if server == "" {
		fmt.Println("locked job-1 with token 1")
		fmt.Println("claimed job-3")
		return
	}
	ctx := context.Background()
	client, err := mongodrv.Connect(options.Client().ApplyURI(server))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Disconnect(ctx)
	jobs := client.Database("warden_example").Collection("jobs")
	_ = jobs.Drop(ctx)
	_, _ = jobs.InsertMany(ctx, []any{
		bson.D{{Key: "_id", Value: "job-1"}, {Key: "status", Value: "todo"}, {Key: "priority", Value: 1}},
		bson.D{{Key: "_id", Value: "job-2"}, {Key: "status", Value: "done"}, {Key: "priority", Value: 9}},
		bson.D{{Key: "_id", Value: "job-3"}, {Key: "status", Value: "todo"}, {Key: "priority", Value: 5}},
	})

	records, err := mongo.Records(jobs, &mongo.RecordOptions{
		ClaimIndex: bson.D{{Key: "status", Value: 1}, {Key: "priority", Value: -1}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := records.Migrate(ctx); err != nil { // the indexes; once, at deploy time
		fmt.Println(err)
		return
	}
	locker, err := recordlock.New(records, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locker.Close()

	// Lock a record; skip it if another process has it.
	k, err := locker.Lock(ctx, "job-1", 30*time.Second)
	switch {
	case errors.Is(err, recordlock.ErrLocked):
		fmt.Println("job-1 is being handled elsewhere")
	case err != nil:
		fmt.Println(err)
		return
	default:
		fmt.Printf("locked %v with token %d\n", k.ID(), k.Token())
		// … work, passing k.Context() to what must stop if the lock is lost …
		_ = k.Release(ctx)
	}

	// Claim the next job. Values go under $eq: a value is never an operator.
	todo := mongo.RecordFilter{
		Filter: bson.D{{Key: "status", Value: bson.D{{Key: "$eq", Value: "todo"}}}},
		Sort:   bson.D{{Key: "priority", Value: -1}},
	}
	next, err := locker.Claim(ctx, todo, 30*time.Second)
	if err != nil { // recordlock.ErrNothingToClaim when the queue is empty
		fmt.Println(err)
		return
	}
	fmt.Println("claimed", next.ID())
	_ = next.Release(ctx)
	// Output:
	// locked job-1 with token 1
	// claimed job-3
}
