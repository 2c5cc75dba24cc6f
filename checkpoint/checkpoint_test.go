package checkpoint_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/checkpoint"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/testkit"
	"github.com/warden-go/warden/lock"
)

// TestMain fails the run if a goroutine started by checkpoint or by the
// Lockers it makes outlives the tests.
func TestMain(m *testing.M) {
	testkit.MainNoLeaks(m, "leaked goroutines", func(g string) bool {
		return strings.Contains(g, "warden/checkpoint.") || strings.Contains(g, "warden/lock.")
	})
}

// quiet drops the warnings the tests provoke on purpose (lost leases).
var quiet = &warden.Options{Logger: slog.New(slog.DiscardHandler)}

// stores opens n stores on one fresh memory database, like n processes
// connected to one server.
func stores(t *testing.T, n int) []*warden.Store {
	t.Helper()
	return testkit.Stores(t, n, quiet)
}

func sequences(t *testing.T, st *warden.Store, task string) []int64 {
	t.Helper()
	cps, err := checkpoint.List(context.Background(), st, task)
	if err != nil {
		t.Fatal(err)
	}
	seqs := []int64{}
	for _, cp := range cps {
		seqs = append(seqs, cp.Sequence)
	}
	return seqs
}

type progress struct {
	Done  int
	Notes []string
}

func TestResumeAfterFailure(t *testing.T) {
	ctx := context.Background()
	st := stores(t, 1)[0]
	failure := errors.New("the database went away")
	var calls []int

	work := func(failAt int) func(context.Context, *checkpoint.Cursor[progress]) error {
		return func(ctx context.Context, cp *checkpoint.Cursor[progress]) error {
			s, _ := cp.State()
			for s.Done < 6 {
				if s.Done == failAt {
					return failure
				}
				calls = append(calls, s.Done)
				s.Done++
				s.Notes = append(s.Notes, fmt.Sprint("item ", s.Done))
				if err := cp.Save(ctx, s, float64(s.Done)*100/6); err != nil {
					return err
				}
			}
			return nil
		}
	}

	err := checkpoint.Run(ctx, st, "job", nil, func(ctx context.Context, cp *checkpoint.Cursor[progress]) error {
		if _, ok := cp.State(); ok || cp.Resumed() || cp.Progress() != 0 {
			t.Error("a fresh task reports a saved state")
		}
		return work(3)(ctx, cp)
	})
	if !errors.Is(err, failure) {
		t.Fatalf("first run: err = %v, want the task's error", err)
	}
	if got := sequences(t, st, "job"); fmt.Sprint(got) != "[1 2 3]" {
		t.Fatalf("checkpoints after the failure = %v, want [1 2 3]", got)
	}

	err = checkpoint.Run(ctx, st, "job", nil, func(ctx context.Context, cp *checkpoint.Cursor[progress]) error {
		s, ok := cp.State()
		if !ok || !cp.Resumed() || s.Done != 3 || len(s.Notes) != 3 || cp.Progress() != 50 {
			return fmt.Errorf("resumed with %+v, %v, progress %v; want the third save", s, ok, cp.Progress())
		}
		if last, ok := cp.Last(); !ok || last.Sequence != 3 || last.ID != "job:3" {
			return fmt.Errorf("Last = %+v, %v", last, ok)
		}
		return work(-1)(ctx, cp)
	})
	if err != nil {
		t.Fatalf("second run: %v", err)
	}
	if fmt.Sprint(calls) != "[0 1 2 3 4 5]" {
		t.Fatalf("work items done: %v, want each once", calls)
	}
	if got := sequences(t, st, "job"); len(got) != 0 {
		t.Fatalf("checkpoints left after success: %v", got)
	}
	if _, _, err := checkpoint.Latest[progress](ctx, st, "job", nil); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("Latest after success: err = %v, want ErrNotFound", err)
	}
}

func TestSequencesKeepAndCleanup(t *testing.T) {
	ctx := context.Background()
	st := stores(t, 1)[0]
	stop := errors.New("stop")
	saveN := func(task string, n int, opts *checkpoint.Options, check func(i int)) {
		t.Helper()
		err := checkpoint.Run(ctx, st, task, opts, func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
			for i := 1; i <= n; i++ {
				if err := cp.SaveETA(ctx, i, float64(i), time.Duration(n-i)*time.Second); err != nil {
					return err
				}
				if last, _ := cp.Last(); last.Sequence != int64(i) {
					return fmt.Errorf("save %d got sequence %d", i, last.Sequence)
				}
				if check != nil {
					check(i)
				}
			}
			return stop
		})
		if !errors.Is(err, stop) {
			t.Fatalf("Run: %v", err)
		}
	}

	// Default Keep is 10, sequences in numeric order past 9.
	saveN("default", 12, nil, nil)
	if got := sequences(t, st, "default"); fmt.Sprint(got) != "[3 4 5 6 7 8 9 10 11 12]" {
		t.Fatalf("kept %v, want the newest 10 in numeric order", got)
	}
	v, cp, err := checkpoint.Latest[int](ctx, st, "default", nil)
	if err != nil || v != 12 || cp.Sequence != 12 || cp.Progress != 12 || cp.ETA != 0 || cp.TaskID != "default" {
		t.Fatalf("Latest = %d, %+v, %v", v, cp, err)
	}

	saveN("keep3", 7, &checkpoint.Options{Keep: 3}, nil)
	if got := sequences(t, st, "keep3"); fmt.Sprint(got) != "[5 6 7]" {
		t.Fatalf("kept %v, want [5 6 7]", got)
	}
	_, cp, _ = checkpoint.Latest[int](ctx, st, "keep3", nil)
	if cp.ETA != 0 {
		t.Fatalf("ETA of the last save = %v, want 0", cp.ETA)
	}
	cps, _ := checkpoint.List(ctx, st, "keep3")
	if cps[0].ETA != 2*time.Second {
		t.Fatalf("ETA of save 5 = %v, want 2s", cps[0].ETA)
	}

	// CleanupEvery 3 with Keep 2: the count grows to 4 between cleanups.
	var counts []int
	saveN("every", 7, &checkpoint.Options{Keep: 2, CleanupEvery: 3}, func(int) {
		counts = append(counts, len(sequences(t, st, "every")))
	})
	if fmt.Sprint(counts) != "[1 2 2 3 4 2 3]" {
		t.Fatalf("checkpoint counts after each save = %v", counts)
	}

	tasks, err := checkpoint.Tasks(ctx, st, "")
	if err != nil || fmt.Sprint(tasks) != "[default every keep3]" {
		t.Fatalf("Tasks = %v, %v", tasks, err)
	}
	tasks, err = checkpoint.Tasks(ctx, st, "*p?")
	if err != nil || fmt.Sprint(tasks) != "[keep3]" {
		t.Fatalf("Tasks(*p?) = %v, %v", tasks, err)
	}
	if n, err := checkpoint.Delete(ctx, st, "every"); err != nil || n != 3 {
		t.Fatalf("Delete = %d, %v; want 3", n, err)
	}
}

func TestKeepOnSuccess(t *testing.T) {
	ctx := context.Background()
	st := stores(t, 1)[0]
	err := checkpoint.Run(ctx, st, "kept", &checkpoint.Options{KeepOnSuccess: true}, func(ctx context.Context, cp *checkpoint.Cursor[string]) error {
		return cp.Save(ctx, "final", 100)
	})
	if err != nil {
		t.Fatal(err)
	}
	v, cp, err := checkpoint.Latest[string](ctx, st, "kept", nil)
	if err != nil || v != "final" || cp.Progress != 100 {
		t.Fatalf("Latest = %q, %+v, %v", v, cp, err)
	}
}

func TestArgumentErrors(t *testing.T) {
	ctx := context.Background()
	st := stores(t, 1)[0]
	called := false
	fn := func(context.Context, *checkpoint.Cursor[int]) error { called = true; return nil }
	if err := checkpoint.Run(ctx, st, "", nil, fn); !errors.Is(err, warden.ErrInvalidKey) {
		t.Fatalf("empty task id: err = %v, want ErrInvalidKey", err)
	}
	if err := checkpoint.Run(ctx, st, "t", &checkpoint.Options{Keep: -1}, fn); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Fatalf("negative Keep: err = %v, want ErrInvalidArgument", err)
	}
	if called {
		t.Fatal("fn ran despite invalid arguments")
	}
	err := checkpoint.Run(ctx, st, "t", nil, func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
		return cp.Save(ctx, 1, 101)
	})
	if !errors.Is(err, warden.ErrInvalidArgument) {
		t.Fatalf("progress 101: err = %v, want ErrInvalidArgument", err)
	}
	// A checkpoint that does not decode as T stops Run before fn.
	if _, _, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "bad", Data: []byte("{not json")}); err != nil {
		t.Fatal(err)
	}
	called = false
	if err := checkpoint.Run(ctx, st, "bad", nil, fn); err == nil || called {
		t.Fatalf("undecodable checkpoint: err = %v, fn called %v", err, called)
	}
}

func TestStoreRefusesZombieTokens(t *testing.T) {
	ctx := context.Background()
	cps := stores(t, 1)[0].Checkpoints()
	save := func(token int64) bool {
		t.Helper()
		_, ok, err := cps.Save(ctx, driver.CheckpointInput{TaskID: "z", Data: []byte("1"), Token: token})
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !save(5) || !save(7) {
		t.Fatal("saves with increasing tokens were refused")
	}
	if save(5) {
		t.Fatal("a save with an older token was accepted after a newer one")
	}
	if !save(7) {
		t.Fatal("a second save with the newest token was refused")
	}
}

func TestZombieSaveRefusedAfterTakeover(t *testing.T) {
	ctx := context.Background()
	sts := stores(t, 2)
	opts := &checkpoint.Options{Lock: true, KeepOnSuccess: true}

	aSaved, bDone := make(chan struct{}), make(chan struct{})
	var aLateErr error
	var aToken int64
	aRun := make(chan error, 1)
	go func() {
		aRun <- checkpoint.Run(ctx, sts[0], "task", opts, func(ctx context.Context, cp *checkpoint.Cursor[string]) error {
			aToken = cp.Token()
			if err := cp.Save(ctx, "a1", 10); err != nil {
				return err
			}
			close(aSaved)
			<-bDone
			aLateErr = cp.Save(ctx, "a-late", 20)
			return aLateErr
		})
	}()
	<-aSaved

	// An operator force-releases A's lock (or it expires); B takes over.
	if ok, err := sts[1].Locks().ForceRelease(ctx, checkpoint.LockKey("task")); err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v", ok, err)
	}
	err := checkpoint.Run(ctx, sts[1], "task", opts, func(ctx context.Context, cp *checkpoint.Cursor[string]) error {
		if cp.Token() <= aToken {
			return fmt.Errorf("B's token %d is not above A's %d", cp.Token(), aToken)
		}
		if s, _ := cp.State(); s != "a1" {
			return fmt.Errorf("B resumed from %q, want a1", s)
		}
		return cp.Save(ctx, "b1", 50)
	})
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	close(bDone)
	aErr := <-aRun
	if !errors.Is(aLateErr, checkpoint.ErrStale) || !errors.Is(aLateErr, lock.ErrLeaseLost) {
		t.Fatalf("A's late save: err = %v, want ErrStale", aLateErr)
	}
	if !errors.Is(aErr, checkpoint.ErrStale) || !errors.Is(aErr, lock.ErrLeaseLost) {
		t.Fatalf("A's Run: err = %v, want ErrStale and ErrLeaseLost", aErr)
	}
	v, _, err := checkpoint.Latest[string](ctx, sts[0], "task", nil)
	if err != nil || v != "b1" {
		t.Fatalf("newest checkpoint = %q, %v; want B's", v, err)
	}
}

// TestFenceClosesZombieWindows: a zombie's late save is refused by the
// store once its successor holds the lock, before the successor has
// saved anything, and still after the successor finished and deleted the
// task's checkpoints.
func TestFenceClosesZombieWindows(t *testing.T) {
	ctx := context.Background()
	sts := stores(t, 2)
	opts := &checkpoint.Options{Lock: true}
	const task = "fenced-task"

	aSaved, bDone := make(chan struct{}), make(chan struct{})
	var aToken int64
	aRun := make(chan error, 1)
	go func() {
		aRun <- checkpoint.Run(ctx, sts[0], task, opts, func(ctx context.Context, cp *checkpoint.Cursor[string]) error {
			aToken = cp.Token()
			if err := cp.Save(ctx, "a1", 10); err != nil {
				return err
			}
			close(aSaved)
			<-bDone
			return nil
		})
	}()
	<-aSaved
	// A's late save goes straight to the store, as a save already on its
	// way when A's lease ended would: the store alone must refuse it.
	lateSave := func() (bool, error) {
		_, ok, err := sts[0].Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: task, Data: []byte(`"a-late"`), Token: aToken})
		return ok, err
	}

	if ok, err := sts[1].Locks().ForceRelease(ctx, checkpoint.LockKey(task)); err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v", ok, err)
	}
	err := checkpoint.Run(ctx, sts[1], task, opts, func(ctx context.Context, cp *checkpoint.Cursor[string]) error {
		if cp.Token() <= aToken {
			return fmt.Errorf("B's token %d is not above A's %d", cp.Token(), aToken)
		}
		if s, _ := cp.State(); s != "a1" {
			return fmt.Errorf("B resumed from %q, want a1", s)
		}
		// Hole 1: B has not saved yet.
		if ok, err := lateSave(); err != nil || ok {
			return fmt.Errorf("A's late save before B's first save: ok=%v err=%v, want refused", ok, err)
		}
		if s, _, err := checkpoint.Latest[string](ctx, sts[1], task, nil); err != nil || s != "a1" {
			return fmt.Errorf("newest checkpoint after the refused save = %q, %v; want a1", s, err)
		}
		return cp.Save(ctx, "b1", 100)
	})
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	close(bDone)
	if err := <-aRun; !errors.Is(err, lock.ErrLeaseLost) {
		t.Fatalf("A's Run: err = %v, want ErrLeaseLost", err)
	}

	// Hole 2: B succeeded and deleted the task's checkpoints.
	if got := sequences(t, sts[0], task); len(got) != 0 {
		t.Fatalf("checkpoints after B's success = %v, want none", got)
	}
	if ok, err := lateSave(); err != nil || ok {
		t.Fatalf("A's late save after B deleted the checkpoints: ok=%v err=%v, want refused", ok, err)
	}
	if _, _, err := checkpoint.Latest[string](ctx, sts[0], task, nil); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("Latest after the refused save: err = %v, want ErrNotFound (the next Run starts afresh)", err)
	}
}

// TestRunRefusesStaleToken: a Run whose lease token is below the task's
// fence stops with ErrStale before reading the task's state.
func TestRunRefusesStaleToken(t *testing.T) {
	ctx := context.Background()
	st := stores(t, 1)[0]
	if ok, err := st.Checkpoints().Fence(ctx, "ahead", 1<<62); err != nil || !ok {
		t.Fatalf("Fence = %v, %v", ok, err)
	}
	called := false
	err := checkpoint.Run(ctx, st, "ahead", &checkpoint.Options{Lock: true}, func(context.Context, *checkpoint.Cursor[int]) error {
		called = true
		return nil
	})
	if !errors.Is(err, checkpoint.ErrStale) || !errors.Is(err, lock.ErrLeaseLost) || called {
		t.Fatalf("Run with a token below the fence: err = %v, fn called %v; want ErrStale before fn", err, called)
	}
	if rec, held, err := st.Locks().Get(ctx, checkpoint.LockKey("ahead")); err != nil || held {
		t.Fatalf("task lock after the refused Run: %+v held=%v err=%v, want released", rec, held, err)
	}
}

func TestLostLeaseCancelsTask(t *testing.T) {
	ctx := context.Background()
	sts := stores(t, 2)
	opts := &checkpoint.Options{LockOptions: &lock.Options{TTL: 150 * time.Millisecond}}

	started := make(chan struct{})
	var cause, saveErr error
	aRun := make(chan error, 1)
	go func() {
		aRun <- checkpoint.Run(ctx, sts[0], "task", opts, func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
			if err := cp.Save(ctx, 1, 10); err != nil {
				return err
			}
			close(started)
			<-ctx.Done() // never, if the lost lease did not cancel the task
			cause = context.Cause(ctx)
			saveErr = cp.Save(context.Background(), 2, 20)
			return nil // the task believes it finished
		})
	}()
	<-started
	if ok, err := sts[1].Locks().ForceRelease(ctx, checkpoint.LockKey("task")); err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v", ok, err)
	}
	err := <-aRun
	if !errors.Is(cause, lock.ErrLeaseLost) {
		t.Fatalf("cause of the task's cancellation = %v, want ErrLeaseLost", cause)
	}
	if !errors.Is(saveErr, checkpoint.ErrStale) {
		t.Fatalf("save after the loss: err = %v, want ErrStale", saveErr)
	}
	if !errors.Is(err, lock.ErrLeaseLost) {
		t.Fatalf("Run: err = %v, want ErrLeaseLost", err)
	}
	// The task lost its lease, so its checkpoints are not deleted.
	if got := sequences(t, sts[0], "task"); fmt.Sprint(got) != "[1]" {
		t.Fatalf("checkpoints = %v, want [1] kept", got)
	}
}

// TestLossCancelsTaskAtOnce: the task's context ends in the same instant
// as its lease. When a Refresh finds the lock force-released and returns
// ErrLeaseLost, the context already reports the loss — with no goroutine
// hop in between — whether Run waited for the lock or took it with
// NoWait.
func TestLossCancelsTaskAtOnce(t *testing.T) {
	for _, noWait := range []bool{false, true} {
		t.Run(fmt.Sprint("NoWait=", noWait), func(t *testing.T) {
			sts := stores(t, 2)
			const task = "instant"
			err := checkpoint.Run(context.Background(), sts[0], task, &checkpoint.Options{Lock: true, NoWait: noWait}, func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
				lease := cp.Lease()
				if lease == nil || lease.Token() != cp.Token() {
					return fmt.Errorf("Cursor.Lease = %v, want the task's lease", lease)
				}
				if got := lock.LeaseFromContext(ctx); !noWait && got != lease {
					return fmt.Errorf("LeaseFromContext = %v, want the task's lease", got)
				}
				if ok, err := sts[1].Locks().ForceRelease(ctx, checkpoint.LockKey(task)); err != nil || !ok {
					return fmt.Errorf("ForceRelease = %v, %v", ok, err)
				}
				if err := lease.Refresh(ctx); !errors.Is(err, lock.ErrLeaseLost) {
					return fmt.Errorf("Refresh after the force-release: %v, want ErrLeaseLost", err)
				}
				if ctx.Err() == nil {
					return errors.New("the task's context is still live right after Refresh reported the lease lost")
				}
				select {
				case <-ctx.Done():
				default:
					return errors.New("the task's context reports an error but Done is not closed")
				}
				if cause := context.Cause(ctx); !errors.Is(cause, lock.ErrLeaseLost) {
					return fmt.Errorf("cause of the task's cancellation = %v, want ErrLeaseLost", cause)
				}
				return nil
			})
			if !errors.Is(err, lock.ErrLeaseLost) || !strings.Contains(err.Error(), task) {
				t.Fatalf("Run: %v, want ErrLeaseLost naming the task and nothing else", err)
			}
		})
	}
}

func TestLockedRunsNeverOverlap(t *testing.T) {
	ctx := context.Background()
	const workers = 6
	sts := stores(t, workers)
	var active, maxActive, runs atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for i := range workers {
		st := sts[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- checkpoint.Run(ctx, st, "shared", &checkpoint.Options{Lock: true, KeepOnSuccess: true, LockOptions: &lock.Options{RetryMax: 10 * time.Millisecond}}, func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
				n := active.Add(1)
				defer active.Add(-1)
				for {
					m := maxActive.Load()
					if n <= m || maxActive.CompareAndSwap(m, n) {
						break
					}
				}
				runs.Add(1)
				s, _ := cp.State()
				for range 3 {
					s++
					if err := cp.Save(ctx, s, 50); err != nil {
						return err
					}
					runtime.Gosched()
				}
				time.Sleep(2 * time.Millisecond) // widen the window an overlap would need
				return nil
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if maxActive.Load() != 1 || runs.Load() != workers {
		t.Fatalf("%d runs, at most %d at once; want %d runs, never 2 at once", runs.Load(), maxActive.Load(), workers)
	}
	// Each run resumed from the previous one's state.
	v, _, err := checkpoint.Latest[int](ctx, sts[0], "shared", nil)
	if err != nil || v != 3*workers {
		t.Fatalf("final state = %d, %v; want %d", v, err, 3*workers)
	}
}

func TestNoWaitAndSharedLocker(t *testing.T) {
	ctx := context.Background()
	st := stores(t, 1)[0]
	locker, err := lock.New(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close()
	held, err := locker.Acquire(ctx, checkpoint.LockKey("busy"))
	if err != nil {
		t.Fatal(err)
	}
	called := false
	err = checkpoint.Run(ctx, st, "busy", &checkpoint.Options{Lock: true, NoWait: true}, func(context.Context, *checkpoint.Cursor[int]) error {
		called = true
		return nil
	})
	if !errors.Is(err, lock.ErrLocked) || called {
		t.Fatalf("NoWait on a locked task: err = %v, fn called %v; want ErrLocked", err, called)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	err = checkpoint.Run(ctx, st, "busy", &checkpoint.Options{Locker: locker, NoWait: true}, func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
		if cp.Token() <= held.Token() {
			return fmt.Errorf("token %d not above the earlier holding's %d", cp.Token(), held.Token())
		}
		return cp.Save(ctx, 1, 100)
	})
	if err != nil {
		t.Fatal(err)
	}
	if rec, found, _ := st.Locks().Get(ctx, checkpoint.LockKey("busy")); found {
		t.Fatalf("the task lock is still held after Run: %+v", rec)
	}
}

func TestLockKey(t *testing.T) {
	if got := checkpoint.LockKey("a:b"); got != "checkpoint:a:b" {
		t.Fatalf("LockKey = %q", got)
	}
	long := strings.Repeat("x", driver.MaxKeyBytes)
	k := checkpoint.LockKey(long)
	if len(k) > driver.MaxKeyBytes || !strings.HasPrefix(k, "checkpoint#") || k == checkpoint.LockKey(long[1:]) {
		t.Fatalf("LockKey of a long id = %q", k)
	}
	if err := warden.ValidateKey(k); err != nil {
		t.Fatal(err)
	}
}
