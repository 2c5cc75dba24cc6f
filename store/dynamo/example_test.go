package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/recordlock"
	"github.com/warden-go/warden/store/dynamo" // registers dynamodb://
)

// Example opens a store on DynamoDB Local or dynalite (the endpoint in
// WARDEN_TEST_DYNAMODB_ENDPOINT, e.g. http://127.0.0.1:8000) with a URL,
// takes a lock and releases it. The table is created on first use. On AWS,
// leave out endpoint and give the region; credentials come from the SDK's
// default chain.
func Example() {
	ctx := context.Background()
	ep := os.Getenv("WARDEN_TEST_DYNAMODB_ENDPOINT")
	if ep == "" {
		ep = "http://127.0.0.1:8000"
	}
	st, err := warden.Open(ctx, "dynamodb://warden_example?endpoint="+ep+"&prefix=billing:")
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()

	rec, ok, err := st.Locks().Acquire(ctx, "nightly-report", "worker-1", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("acquired:", ok, "token > 0:", rec.Token > 0)
	released, err := st.Locks().Release(ctx, "nightly-report", "worker-1", rec.Token)
	fmt.Println("released:", released, err)
}

// TestExample runs Example against the test server and checks what it
// prints (Example has no Output comment, since it needs a server).
func TestExample(t *testing.T) {
	endpoint(t)
	t.Cleanup(func() {
		if err := dynamo.DeleteTable(context.Background(), newClient(t), "warden_example"); err != nil {
			t.Error(err)
		}
	})
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	Example()
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	want := "acquired: true token > 0: true\nreleased: true <nil>\n"
	if string(out) != want {
		t.Errorf("Example printed %q, want %q", out, want)
	}
}

// ExampleRecords locks items of the program's own table — jobs, with a
// string partition key id and a global secondary index status-rank that
// projects lockedBy and lockedUntil — first one by its id (skipping it if
// another worker has it), then in the claim-next loop of a work queue.
// The lock lives in three attributes of the item; nothing else is
// written.
func ExampleRecords() {
	ctx := context.Background()
	ep := os.Getenv("WARDEN_TEST_DYNAMODB_ENDPOINT")
	if ep == "" {
		ep = "http://127.0.0.1:8000"
	}
	client := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(ep),
		Credentials: credentials.NewStaticCredentialsProvider("local", "local", ""),
	})
	if err := createJobs(ctx, client, "warden_example_jobs"); err != nil { // the program's own table
		log.Fatal(err)
	}
	rt, err := dynamo.Records(client, "warden_example_jobs", nil)
	if err != nil {
		log.Fatal(err)
	}
	locker, err := recordlock.New(rt, &recordlock.Options{Owner: "worker-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	// Lock one job; if another worker has it, skip it.
	k, err := locker.Lock(ctx, "job-1", 30*time.Second)
	switch {
	case errors.Is(err, recordlock.ErrLocked):
		fmt.Println("job-1 is busy elsewhere")
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println("locked job-1, token", k.Token())
		// … work under k.Context() …
		if err := k.Release(ctx); err != nil {
			log.Fatal(err)
		}
	}

	// Claim-next: take the first todo job no one holds, in rank order.
	todo := dynamo.RecordQuery{
		IndexName:    "status-rank",
		KeyCondition: "#s = :s",
		Names:        map[string]string{"#s": "status"},
		Values:       map[string]types.AttributeValue{":s": &types.AttributeValueMemberS{Value: "todo"}},
	}
	for {
		k, err := locker.Claim(ctx, todo, 30*time.Second)
		if errors.Is(err, recordlock.ErrNothingToClaim) {
			fmt.Println("nothing left to do")
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("claimed", k.ID())
		// … work under k.Context(), then mark the job done (the program's
		// own write) and release it.
		_, err = client.UpdateItem(k.Context(), &dynamodb.UpdateItemInput{
			TableName:                 aws.String("warden_example_jobs"),
			Key:                       map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: k.ID().(string)}},
			UpdateExpression:          aws.String("SET #s = :done"),
			ExpressionAttributeNames:  map[string]string{"#s": "status"},
			ExpressionAttributeValues: map[string]types.AttributeValue{":done": &types.AttributeValueMemberS{Value: "done"}},
		})
		if err != nil {
			log.Fatal(err)
		}
		if err := k.Release(ctx); err != nil {
			log.Fatal(err)
		}
	}
}

// createJobs (re)creates ExampleRecords' table with two todo jobs.
func createJobs(ctx context.Context, c *dynamodb.Client, table string) error {
	if err := dynamo.DeleteTable(ctx, c, table); err != nil {
		return err
	}
	for {
		if _, err := c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &table}); err != nil {
			break // gone
		}
		time.Sleep(20 * time.Millisecond)
	}
	jobs := []map[string]types.AttributeValue{}
	for i, id := range []string{"job-1", "job-2"} {
		jobs = append(jobs, map[string]types.AttributeValue{
			"id":     &types.AttributeValueMemberS{Value: id},
			"status": &types.AttributeValueMemberS{Value: "todo"},
			"rank":   &types.AttributeValueMemberN{Value: fmt.Sprint(i)},
		})
	}
	return createRecordTable(ctx, c, table, jobs)
}

// TestExampleRecords runs ExampleRecords against the test server and
// checks what it prints.
func TestExampleRecords(t *testing.T) {
	endpoint(t)
	t.Cleanup(func() {
		if err := dynamo.DeleteTable(context.Background(), newClient(t), "warden_example_jobs"); err != nil {
			t.Error(err)
		}
	})
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	ExampleRecords()
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	want := "locked job-1, token 1\nclaimed job-1\nclaimed job-2\nnothing left to do\n"
	if string(out) != want {
		t.Errorf("ExampleRecords printed %q, want %q", out, want)
	}
}
