package dynamo_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"testing"
	"time"

	"github.com/warden-go/warden"
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
