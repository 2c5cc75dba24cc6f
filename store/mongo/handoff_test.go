package mongo_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/store/mongo"
)

// handoffChildEnv tells the test binary it runs as the hand-off test's
// waiter process; it holds a handoffSpec as JSON.
const handoffChildEnv = "WARDEN_MONGO_HANDOFF_CHILD"

type handoffSpec struct {
	URL string
	Key string
}

// runHandoffChild is the waiter: it finds the key held, prints "waiting"
// once its blocking Acquire has made its first (failed) attempt, and
// prints "acquired <unix ns>" the moment it gets the lock. Its back-off is
// 10–30 s, so only the release event can wake it sooner.
func runHandoffChild(js string) int {
	var spec handoffSpec
	if err := json.Unmarshal([]byte(js), &spec); err != nil {
		fmt.Println("error", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var attempts atomic.Int64
	st, err := warden.OpenWith(ctx, spec.URL, &warden.Options{Hook: warden.HookFunc(func(_ context.Context, op warden.OpInfo) {
		if op.Op == "lock.acquire" && attempts.Add(1) == 2 {
			fmt.Println("waiting")
		}
	})})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer st.Close()
	// A back-off far longer than the waiter's context: only the release
	// event can hand the lock over.
	locker, err := lock.New(st, &lock.Options{TTL: time.Minute, Owner: "waiter", RetryMin: time.Hour, RetryMax: time.Hour})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	defer locker.Close()
	if _, err := locker.TryAcquire(ctx, spec.Key); !errors.Is(err, lock.ErrLocked) {
		fmt.Println("error: the key is not held:", err)
		return 1
	}
	lease, err := locker.Acquire(ctx, spec.Key)
	at := time.Now()
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("acquired", at.UnixNano())
	_ = lease.Release(ctx)
	return 0
}

// TestCrossProcessHandoff: a waiter in another OS process acquires a lock
// once it is released, woken by the release event read from the capped
// collection: its back-off (an hour) and the holder's TTL (an hour) are
// far longer than the waiter's context (two minutes), so nothing else can
// hand the lock over. The latency is logged; bench/ measures it.
func TestCrossProcessHandoff(t *testing.T) {
	prefix := fmt.Sprintf("handoff-%d:", time.Now().UnixNano())
	ctx := t.Context()
	st, err := mongo.Open(ctx, serverURL(t, prefix), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec, ok, err := st.Driver().Locks().Acquire(ctx, "job", "holder", time.Hour)
	if err != nil || !ok {
		t.Fatalf("Acquire: ok=%v err=%v", ok, err)
	}
	spec, _ := json.Marshal(handoffSpec{URL: serverURL(t, prefix), Key: "job"})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), handoffChildEnv+"="+string(spec))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(out)
	next := func() string {
		if !lines.Scan() {
			t.Fatalf("the waiter process ended early: %v", lines.Err())
		}
		l := lines.Text()
		if strings.HasPrefix(l, "error") {
			t.Fatalf("waiter: %s", l)
		}
		return l
	}
	if l := next(); l != "waiting" {
		t.Fatalf("waiter said %q, want waiting", l)
	}
	released := time.Now()
	if ok, err := st.Driver().Locks().Release(ctx, "job", "holder", rec.Token); err != nil || !ok {
		t.Fatalf("Release: ok=%v err=%v", ok, err)
	}
	l := next()
	ns, err := strconv.ParseInt(strings.TrimPrefix(l, "acquired "), 10, 64)
	if err != nil {
		t.Fatalf("waiter said %q", l)
	}
	d := time.Unix(0, ns).Sub(released)
	t.Logf("cross-process hand-off: the waiter acquired %v after the release was sent", d)
}
