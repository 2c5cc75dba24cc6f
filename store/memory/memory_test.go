package memory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// uniqueName returns a database name no other test uses.
func uniqueName(t *testing.T) string {
	return fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
}

func open(t *testing.T, url string) *warden.Store {
	t.Helper()
	st, err := warden.Open(context.Background(), url)
	if err != nil {
		t.Fatalf("Open(%q): %v", url, err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestOpenURL(t *testing.T) {
	ctx := context.Background()
	name := uniqueName(t)

	st := open(t, "memory://"+name+"?prefix=p:&max_value_bytes=10")
	if got := st.Name(); got != "memory" {
		t.Errorf("Name() = %q, want memory", got)
	}
	if got := st.Limits().MaxValueBytes; got != 10 {
		t.Errorf("MaxValueBytes = %d, want 10", got)
	}
	if err := st.Cache().Set(ctx, "k", make([]byte, 11), 0); !errors.Is(err, warden.ErrValueTooLarge) {
		t.Errorf("Set of 11 bytes with a 10-byte limit: err = %v, want ErrValueTooLarge", err)
	}
	if err := st.Cache().Set(ctx, "k", []byte("0123456789"), 0); err != nil {
		t.Fatalf("Set: %v", err)
	}

	// The same name and prefix reach the same records.
	same := open(t, "memory://"+name+"?prefix=p:")
	if ok, err := same.Cache().Has(ctx, "k"); err != nil || !ok {
		t.Errorf("same database and prefix: Has = %v, %v; want true", ok, err)
	}
	if got := same.Limits().MaxValueBytes; got != DefaultMaxValueBytes {
		t.Errorf("default MaxValueBytes = %d, want %d", got, DefaultMaxValueBytes)
	}
	// Another prefix on the same database does not.
	other := open(t, "memory://"+name+"?prefix=q:")
	if ok, err := other.Cache().Has(ctx, "k"); err != nil || ok {
		t.Errorf("other prefix: Has = %v, %v; want false", ok, err)
	}
	// Neither does a private database.
	private := open(t, "memory://?prefix=p:")
	if ok, err := private.Cache().Has(ctx, "k"); err != nil || ok {
		t.Errorf("private database: Has = %v, %v; want false", ok, err)
	}

	bad := []string{
		"memory://x?prefix=a:&colour=blue",
		"memory://?max_value_bytes=lots",
		"memory://?max_value_bytes=-1",
		"memory:x",
		"memory://x/some/path",
		"memory://user:secret@x",
	}
	for _, u := range bad {
		st, err := warden.Open(ctx, u)
		if err == nil {
			st.Close()
			t.Errorf("Open(%q) succeeded, want an error", u)
			continue
		}
		if !errors.Is(err, driver.ErrBadURL) {
			t.Errorf("Open(%q): %v, want an error wrapping driver.ErrBadURL", u, err)
		}
		if bytes.Contains([]byte(err.Error()), []byte("secret")) {
			t.Errorf("Open(%q): error shows the password: %v", u, err)
		}
	}
	if _, err := warden.Open(ctx, "memory://x?colour=blue"); err == nil || !bytes.Contains([]byte(err.Error()), []byte("colour")) {
		t.Errorf("unknown parameter: err = %v, want it named", err)
	}
}

func TestPrivateDatabases(t *testing.T) {
	ctx := context.Background()
	a, b := New(nil), New(nil)
	defer a.Close()
	defer b.Close()
	if _, ok, err := a.Locks().Acquire(ctx, "k", "o", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire on a: %v, %v", ok, err)
	}
	if _, ok, err := b.Locks().Acquire(ctx, "k", "other", time.Minute); err != nil || !ok {
		t.Errorf("two private stores share a lock: Acquire on b = %v, %v", ok, err)
	}
}

func TestSharedDatabaseNamespaces(t *testing.T) {
	ctx := context.Background()
	name := uniqueName(t)
	// "a" followed by a kind tag is a prefix of its own: it must not see
	// the records of prefix "a" (nor the other way around).
	a := New(&Options{Name: name, Prefix: "a"})
	tagged := New(&Options{Name: name, Prefix: "a" + driver.TagCache})
	none := New(&Options{Name: name})
	defer a.Close()
	defer tagged.Close()
	defer none.Close()

	if err := a.Cache().Set(ctx, "x", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	if err := tagged.Cache().Set(ctx, "y", []byte("2"), 0); err != nil {
		t.Fatal(err)
	}
	if err := none.Cache().Set(ctx, "z", []byte("3"), 0); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		st   *warden.Store
		want string
	}{{a, "x"}, {tagged, "y"}, {none, "z"}} {
		keys, err := c.st.Cache().Keys(ctx, "*")
		if err != nil || len(keys) != 1 || keys[0] != c.want {
			t.Errorf("Keys = %q, %v; want [%q]", keys, err, c.want)
		}
	}
	if n, err := a.Cache().Clear(ctx); err != nil || n != 1 {
		t.Errorf("Clear = %d, %v; want 1", n, err)
	}
	if ok, _ := tagged.Cache().Has(ctx, "y"); !ok {
		t.Error("Clear on prefix a deleted an entry of another prefix")
	}
	if ok, _ := none.Cache().Has(ctx, "z"); !ok {
		t.Error("Clear on prefix a deleted an entry of the empty prefix")
	}
}

func TestLockTokens(t *testing.T) {
	ctx := context.Background()
	l := New(nil).Locks()
	before := driver.TokenBase(time.Now())

	r1, ok, err := l.Acquire(ctx, "k", "a", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire: %v, %v", ok, err)
	}
	if r1.Token < before || r1.Token > driver.TokenBase(time.Now()) {
		t.Errorf("first token %d is not TokenBase of the creation time", r1.Token)
	}
	// The holder acquiring again keeps its token and AcquiredAt.
	r2, ok, err := l.Acquire(ctx, "k", "a", time.Hour)
	if err != nil || !ok || r2.Token != r1.Token || !r2.AcquiredAt.Equal(r1.AcquiredAt) || !r2.ExpiresAt.After(r1.ExpiresAt) {
		t.Errorf("re-acquire by holder = %+v, %v, %v; want same token and AcquiredAt, later expiry", r2, ok, err)
	}
	if ok, err := l.Release(ctx, "k", "a", r1.Token); err != nil || !ok {
		t.Fatalf("Release: %v, %v", ok, err)
	}
	if ok, _ := l.Release(ctx, "k", "a", r1.Token); ok {
		t.Error("second Release reported ok")
	}
	r3, ok, err := l.Acquire(ctx, "k", "b", time.Minute)
	if err != nil || !ok || r3.Token != r1.Token+1 {
		t.Errorf("acquire after release = %+v, %v, %v; want token %d", r3, ok, err, r1.Token+1)
	}

	// An expired holding re-acquired by the same owner is a new holding.
	r4, ok, err := l.Acquire(ctx, "short", "a", 5*time.Millisecond)
	if err != nil || !ok {
		t.Fatalf("Acquire: %v, %v", ok, err)
	}
	waitFor(t, func() bool { _, found, _ := l.Get(ctx, "short"); return !found })
	if _, ok, _ := l.Refresh(ctx, "short", "a", r4.Token, time.Minute); ok {
		t.Error("Refresh of an expired holding reported ok")
	}
	r5, ok, err := l.Acquire(ctx, "short", "a", time.Minute)
	if err != nil || !ok || r5.Token != r4.Token+1 {
		t.Errorf("re-acquire after expiry = %+v, %v, %v; want token %d", r5, ok, err, r4.Token+1)
	}
	if ok, _ := l.Release(ctx, "short", "a", r4.Token); ok {
		t.Error("Release with the expired holding's token reported ok")
	}
}

func TestPurge(t *testing.T) {
	ctx := context.Background()
	st := New(nil)
	defer st.Close()
	l := st.Locks()
	rec, _, err := l.Acquire(ctx, "k", "a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Acquire(ctx, "held", "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := st.Cache().Set(ctx, "gone", []byte("x"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := st.Cache().Set(ctx, "kept", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if ok, err := l.Release(ctx, "k", "a", rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	waitFor(t, func() bool { ok, _ := st.Cache().Has(ctx, "gone"); return !ok })

	// With a long retention only the expired cache entry goes.
	if n, err := st.Purge(ctx, time.Hour); err != nil || n != 1 {
		t.Errorf("Purge(1h) = %d, %v; want 1", n, err)
	}
	// Once idle for the retention, the released lock record goes too.
	waitFor(t, func() bool {
		n, err := st.Purge(ctx, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	if _, found, _ := l.Get(ctx, "held"); !found {
		t.Error("Purge deleted a live lock")
	}
	if ok, _ := st.Cache().Has(ctx, "kept"); !ok {
		t.Error("Purge deleted a cache entry without expiry")
	}
}

// TestPurgeFences: Purge deletes the fence records of tasks without
// checkpoints once idle for the retention; the fence of a task with
// checkpoints stays.
func TestPurgeFences(t *testing.T) {
	ctx := context.Background()
	st := New(nil)
	defer st.Close()
	cps := st.Checkpoints()
	if ok, err := cps.Fence(ctx, "idle", 9); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, ok, err := cps.Save(ctx, driver.CheckpointInput{TaskID: "busy", Token: 9}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if n, err := st.Purge(ctx, time.Hour); err != nil || n != 0 {
		t.Errorf("Purge(1h) = %d, %v; want 0", n, err)
	}
	if _, ok, err := cps.Save(ctx, driver.CheckpointInput{TaskID: "idle", Token: 8}); err != nil || ok {
		t.Errorf("save below a fence not yet purged: ok=%v err=%v", ok, err)
	}
	waitFor(t, func() bool {
		n, err := st.Purge(ctx, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	// The idle fence is gone: the task starts afresh.
	if cp, ok, err := cps.Save(ctx, driver.CheckpointInput{TaskID: "idle", Token: 8}); err != nil || !ok || cp.Sequence != 1 {
		t.Errorf("save after the fence was purged: %+v ok=%v err=%v, want sequence 1", cp, ok, err)
	}
	if ok, err := cps.Fence(ctx, "busy", 8); err != nil || ok {
		t.Errorf("fence of a task with checkpoints purged: Fence(8) ok=%v err=%v", ok, err)
	}
}

func TestCopies(t *testing.T) {
	ctx := context.Background()
	st := New(nil)
	defer st.Close()

	in := []byte("value")
	if err := st.Cache().Set(ctx, "k", in, 0); err != nil {
		t.Fatal(err)
	}
	in[0] = 'X'
	e, _, err := st.Cache().Get(ctx, "k")
	if err != nil || string(e.Value) != "value" {
		t.Fatalf("Get after changing the input = %q, %v; want value", e.Value, err)
	}
	e.Value[0] = 'Y'
	if e, _, _ := st.Cache().Get(ctx, "k"); string(e.Value) != "value" {
		t.Errorf("Get after changing a read value = %q; want value", e.Value)
	}

	res := []byte("result")
	if err := st.Idempotency().Set(ctx, "i", res, 0); err != nil {
		t.Fatal(err)
	}
	res[0] = 'X'
	r, _, _ := st.Idempotency().Get(ctx, "i")
	r.Result[1] = 'X'
	if r, _, _ := st.Idempotency().Get(ctx, "i"); string(r.Result) != "result" {
		t.Errorf("idempotency result = %q; want result", r.Result)
	}

	data := []byte("data")
	cp, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "t", Data: data})
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	data[0] = 'X'
	cp.Data[1] = 'X'
	if got, _, _ := st.Checkpoints().Load(ctx, cp.ID); string(got.Data) != "data" {
		t.Errorf("checkpoint data = %q; want data", got.Data)
	}
	list, _ := st.Checkpoints().List(ctx, "t")
	list[0].Data[2] = 'X'
	if got, _, _ := st.Checkpoints().Latest(ctx, "t"); string(got.Data) != "data" {
		t.Errorf("checkpoint data = %q; want data", got.Data)
	}
}

func TestCheckpointOrderAndGuard(t *testing.T) {
	ctx := context.Background()
	cps := New(nil).Checkpoints()
	for i := 1; i <= 11; i++ {
		cp, ok, err := cps.Save(ctx, driver.CheckpointInput{TaskID: "a:b", Token: 5})
		if err != nil || !ok || cp.Sequence != int64(i) || cp.ID != fmt.Sprintf("a:b:%d", i) {
			t.Fatalf("Save %d = %+v, %v, %v", i, cp, ok, err)
		}
	}
	list, err := cps.List(ctx, "a:b")
	if err != nil || len(list) != 11 {
		t.Fatalf("List = %d, %v", len(list), err)
	}
	for i, cp := range list {
		if cp.Sequence != int64(i+1) {
			t.Errorf("List[%d].Sequence = %d", i, cp.Sequence)
		}
	}
	if _, ok, _ := cps.Save(ctx, driver.CheckpointInput{TaskID: "a:b", Token: 4}); ok {
		t.Error("a save with an older token was accepted")
	}
	if _, ok, _ := cps.Save(ctx, driver.CheckpointInput{TaskID: "a:b"}); !ok {
		t.Error("a save without token was refused")
	}
	if n, err := cps.Cleanup(ctx, "a:b", 3); err != nil || n != 9 {
		t.Errorf("Cleanup(3) = %d, %v; want 9", n, err)
	}
	if cp, _, _ := cps.Latest(ctx, "a:b"); cp.Sequence != 12 {
		t.Errorf("Latest.Sequence = %d, want 12", cp.Sequence)
	}
	if cp, ok, _ := cps.Save(ctx, driver.CheckpointInput{TaskID: "a:b"}); !ok || cp.Sequence != 13 {
		t.Errorf("Save after Cleanup: sequence %d, want 13", cp.Sequence)
	}
	if _, found, _ := cps.Load(ctx, "a:b:1"); found {
		t.Error("a cleaned-up checkpoint loads")
	}
	if _, found, _ := cps.Load(ctx, "not an id"); found {
		t.Error("a malformed id loads")
	}
	tasks, _ := cps.Tasks(ctx, "a:*")
	if len(tasks) != 1 || tasks[0] != "a:b" {
		t.Errorf("Tasks = %q", tasks)
	}
}

func TestConcurrentAcquire(t *testing.T) {
	ctx := context.Background()
	name := uniqueName(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	winners := 0
	for i := 0; i < 16; i++ {
		st := New(&Options{Name: name})
		defer st.Close()
		wg.Add(1)
		go func(owner string) {
			defer wg.Done()
			_, ok, err := st.Locks().Acquire(ctx, "k", owner, time.Minute)
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				winners++
				mu.Unlock()
			}
		}(fmt.Sprint("owner-", i))
	}
	wg.Wait()
	if winners != 1 {
		t.Errorf("%d concurrent acquirers won, want 1", winners)
	}
}

// The waits for events below set no time limit: an event that never
// comes is reported by go test's -timeout.
func TestWatchAcrossStores(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	name := uniqueName(t)
	watching := New(&Options{Name: name, Prefix: "p"})
	writer := New(&Options{Name: name, Prefix: "p"})
	stranger := New(&Options{Name: name, Prefix: "q"})
	defer watching.Close()
	defer writer.Close()
	defer stranger.Close()

	locks, err := watching.Locks().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	circuits, err := watching.Circuits().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Another namespace's changes come first and must not be delivered.
	if _, _, err := stranger.Locks().Acquire(ctx, "k", "s", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := stranger.Circuits().RecordFailure(ctx, "c", 1); err != nil {
		t.Fatal(err)
	}

	rec, _, err := writer.Locks().Acquire(ctx, "k", "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// A renewal by the holder is not a new holding: no event.
	if _, _, err := writer.Locks().Acquire(ctx, "k", "w", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Locks().Release(ctx, "k", "w", rec.Token); err != nil {
		t.Fatal(err)
	}
	want := []driver.LockEvent{
		{Kind: driver.LockAcquired, Key: "k", Owner: "w", Token: rec.Token},
		{Kind: driver.LockReleased, Key: "k", Owner: "w", Token: rec.Token},
	}
	for _, w := range want {
		ev, ok := <-locks
		if !ok {
			t.Fatalf("the lock watch closed before the event %v", w.Kind)
		}
		if ev.Kind != w.Kind || ev.Key != w.Key || ev.Owner != w.Owner || ev.Token != w.Token || ev.At.IsZero() {
			t.Errorf("lock event %+v, want %+v", ev, w)
		}
	}

	if _, err := writer.Circuits().RecordFailure(ctx, "c", 1); err != nil {
		t.Fatal(err)
	}
	if r, ok := <-circuits; !ok {
		t.Fatal("the circuit watch closed before the event")
	} else if r.Name != "c" || r.State != driver.Open || r.Version != 1 {
		t.Errorf("circuit event %+v, want c open version 1", r)
	}
	select {
	case ev := <-locks:
		t.Errorf("unexpected lock event %+v", ev)
	case r := <-circuits:
		t.Errorf("unexpected circuit event %+v", r)
	default:
	}
}

// The waits for events below set no time limit: an event that never
// comes is reported by go test's -timeout.
func TestWatchEventsLost(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := New(nil)
	defer st.Close()
	events, err := st.Locks().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	circuits, err := st.Circuits().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Nobody reads while far more events than any buffer happen.
	const n = 3 * watchBuffer
	for i := 0; i < n; i++ {
		key := fmt.Sprint("k", i)
		rec, _, err := st.Locks().Acquire(ctx, key, "o", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Locks().Release(ctx, key, "o", rec.Token); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Circuits().RecordFailure(ctx, "c", 1000); err != nil {
			t.Fatal(err)
		}
	}
	// The receiver gets some events in order, then EventsLost, without
	// any further event having to happen.
	got := 0
	for lost := false; !lost; {
		ev, ok := <-events
		if !ok {
			t.Fatalf("the lock watch closed after %d events without EventsLost", got)
		}
		if ev.Kind == driver.EventsLost {
			lost = true
			if ev.Key != "" {
				t.Errorf("EventsLost with key %q", ev.Key)
			}
			continue
		}
		got++
	}
	if got == 0 || got >= 2*n {
		t.Errorf("%d events before EventsLost, want some but not all %d", got, 2*n)
	}
	var last int64
	for lost := false; !lost; {
		r, ok := <-circuits
		if !ok {
			t.Fatal("the circuit watch closed without a lost marker")
		}
		if r.Name == "" {
			lost = true
			continue
		}
		if r.Version <= last {
			t.Errorf("circuit version %d after %d", r.Version, last)
		}
		last = r.Version
	}
	// Delivery resumes afterwards.
	if _, _, err := st.Locks().Acquire(ctx, "after", "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	if ev, ok := <-events; !ok {
		t.Fatal("the lock watch closed after EventsLost")
	} else if ev.Kind != driver.LockAcquired || ev.Key != "after" {
		t.Errorf("event after EventsLost = %+v, want the acquisition of after", ev)
	}
}

func TestWatchClosing(t *testing.T) {
	st := New(nil)
	ctx, cancel := context.WithCancel(context.Background())
	byCtx, err := st.Locks().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byClose, err := st.Circuits().Watch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	waitClosed(t, byCtx)

	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	// Close has stopped every watcher: the channel is already closed.
	select {
	case _, ok := <-byClose:
		if ok {
			t.Error("event after Close")
		}
	default:
		t.Error("watch channel still open after Close returned")
	}
	if err := st.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	// The raw driver refuses calls after Close without panicking.
	drv := st.Driver()
	bg := context.Background()
	if _, _, err := drv.Locks().Acquire(bg, "k", "o", time.Second); !errors.Is(err, warden.ErrClosed) {
		t.Errorf("Acquire after Close: %v, want ErrClosed", err)
	}
	if err := drv.Ping(bg); !errors.Is(err, warden.ErrClosed) {
		t.Errorf("Ping after Close: %v, want ErrClosed", err)
	}
	if _, err := drv.(driver.LockNotifier).WatchLocks(bg); !errors.Is(err, warden.ErrClosed) {
		t.Errorf("WatchLocks after Close: %v, want ErrClosed", err)
	}
	if _, err := drv.(driver.Purger).Purge(bg, time.Hour); !errors.Is(err, warden.ErrClosed) {
		t.Errorf("Purge after Close: %v, want ErrClosed", err)
	}
}

func TestCanceledContext(t *testing.T) {
	drv := NewDriver(nil)
	defer drv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := drv.Cache().Has(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Errorf("Has with a cancelled context: %v", err)
	}
	if _, err := drv.(driver.CircuitNotifier).WatchCircuits(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("WatchCircuits with a cancelled context: %v", err)
	}
}

func TestCircuitProbe(t *testing.T) {
	ctx := context.Background()
	c := New(nil).Circuits()
	if _, granted, _ := c.TryProbe(ctx, "c", "a", 0, time.Minute); granted {
		t.Error("probe granted on a closed circuit")
	}
	if _, found, _ := c.Get(ctx, "c"); found {
		t.Error("TryProbe created a record")
	}
	r, _ := c.RecordFailure(ctx, "c", 2)
	if r.State != driver.Closed || r.Failures != 1 {
		t.Errorf("after one failure: %+v", r)
	}
	r, _ = c.RecordFailure(ctx, "c", 2)
	if r.State != driver.Open || r.OpenedAt.IsZero() || r.Version != 2 {
		t.Errorf("after two failures: %+v", r)
	}
	if _, granted, _ := c.TryProbe(ctx, "c", "a", time.Hour, time.Minute); granted {
		t.Error("probe granted before the open duration")
	}
	r, granted, _ := c.TryProbe(ctx, "c", "a", 0, time.Minute)
	if !granted || r.State != driver.HalfOpen || r.ProbeOwner != "a" {
		t.Errorf("TryProbe = %+v, %v", r, granted)
	}
	if _, granted, _ := c.TryProbe(ctx, "c", "b", 0, time.Minute); granted {
		t.Error("a second prober was granted the slot")
	}
	if _, granted, _ := c.TryProbe(ctx, "c", "a", 0, time.Minute); !granted {
		t.Error("the prober itself was refused")
	}
	r, _ = c.RecordSuccess(ctx, "c")
	if r.State != driver.Closed || r.Failures != 0 || r.ProbeOwner != "" {
		t.Errorf("after success in half-open: %+v", r)
	}
}

func TestIdempotencyClaims(t *testing.T) {
	ctx := context.Background()
	i := New(nil).Idempotency()
	r, out, err := i.Claim(ctx, "k", "a", time.Minute, "fp")
	if err != nil || out != driver.Claimed || r.Status != driver.IdemPending || r.Fingerprint != "fp" {
		t.Fatalf("Claim = %+v, %v, %v", r, out, err)
	}
	if _, out, _ := i.Claim(ctx, "k", "b", time.Minute, "fp"); out != driver.InProgress {
		t.Errorf("second claimant: %v, want in-progress", out)
	}
	if ok, _ := i.Complete(ctx, "k", "b", []byte("no"), 0); ok {
		t.Error("a non-claimant completed")
	}
	if ok, _ := i.Complete(ctx, "k", "a", []byte("yes"), 0); !ok {
		t.Error("the claimant could not complete")
	}
	r, out, _ = i.Claim(ctx, "k", "b", time.Minute, "fp")
	if out != driver.Completed || string(r.Result) != "yes" || !r.ExpiresAt.IsZero() {
		t.Errorf("claim of a completed key = %+v, %v", r, out)
	}

	if _, _, err := i.Claim(ctx, "short", "a", time.Millisecond, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, found, _ := i.Get(ctx, "short"); return !found })
	if _, out, _ := i.Claim(ctx, "short", "b", time.Minute, ""); out != driver.TakenOver {
		t.Errorf("claim after lapse: %v, want taken-over", out)
	}
	if ok, _ := i.Abandon(ctx, "short", "a"); ok {
		t.Error("the lapsed claimant abandoned the new claim")
	}
	if ok, _ := i.Abandon(ctx, "short", "b"); !ok {
		t.Error("the claimant could not abandon")
	}
}

// waitFor polls cond until it holds, however long that takes: tests
// assert what happens, not how fast, and a condition that never holds is
// reported by go test's -timeout.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for !cond() {
		time.Sleep(time.Millisecond)
	}
}

// waitClosed waits for ch to be closed, discarding events, however long
// that takes.
func waitClosed[T any](t *testing.T, ch <-chan T) {
	t.Helper()
	for range ch {
	}
}

// TestTokensAfterPurge: a lock record purged right after its holding and
// recreated at once (within the same millisecond) starts above every
// token its key had.
func TestTokensAfterPurge(t *testing.T) {
	ctx := context.Background()
	st := New(nil)
	defer st.Close()
	d := st.Driver()
	var last int64
	for i := range 2000 {
		rec, ok, err := d.Locks().Acquire(ctx, "k", "a", time.Minute)
		if err != nil || !ok {
			t.Fatalf("round %d: ok=%v err=%v", i, ok, err)
		}
		if rec.Token <= last {
			t.Fatalf("round %d: token %d after %d", i, rec.Token, last)
		}
		last = rec.Token
		if ok, err := d.Locks().Release(ctx, "k", "a", rec.Token); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if _, err := d.(driver.Purger).Purge(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
}
