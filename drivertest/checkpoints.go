package drivertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/checkpoint"
	"github.com/warden-go/warden/driver"
)

func (s *suite) checkpoints(t *testing.T) {
	group(t, []check{
		{"ConcurrentSave", s.cpConcurrentSave},
		{"Order", s.cpOrder},
		{"Paging", s.cpPaging},
		{"Cleanup", s.cpCleanup},
		{"DeleteAll", s.cpDeleteAll},
		{"Tasks", s.cpTasks},
		{"TokenGuard", s.cpTokenGuard},
		{"Fence", s.cpFence},
		{"FenceSurvivesDeleteAll", s.cpFenceSurvivesDeleteAll},
		{"SequencesContinue", s.cpSequencesContinue},
		{"FenceConcurrent", s.cpFenceConcurrent},
		{"Values", s.cpValues},
		{"LateSaveHidden", s.cpLateSaveHidden},
		{"FencedDelete", s.cpFencedDelete},
		{"LateDeleteSparesSuccessor", s.cpLateDelete},
		{"RunAfterZombieSave", s.cpRunAfterZombieSave},
	})
}

// CheckpointPauser is implemented, in test builds, by the checkpoint
// driver of a store whose Save, Cleanup or DeleteAll is more than one
// write (the task's fence record, then the checkpoints): PauseCheckpoint
// makes the next such call for taskID in the store's namespace call f
// once, after its write of the fence record and before its next write.
// The suite then runs a newer holder's calls in that window, as they
// would run while a zombie's request is on its way or the zombie is
// paused. A store whose calls are one atomic write need not implement it:
// there is no window, and the suite runs the stalled call to its end
// first.
type CheckpointPauser interface {
	PauseCheckpoint(taskID string, f func())
}

// stalled runs call, a Save, Cleanup or DeleteAll of task on st, as a
// request that has passed the task's fence and is stalled before its next
// write: on a store implementing CheckpointPauser it returns once call is
// paused there, and resume lets call go on and waits for it to return;
// on other stores call runs to its end first.
func stalled(t *testing.T, st *warden.Store, task string, call func()) (resume func()) {
	t.Helper()
	p, ok := st.Driver().Checkpoints().(CheckpointPauser)
	if !ok {
		call()
		return func() {}
	}
	reached, goOn, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	p.PauseCheckpoint(task, func() {
		close(reached)
		<-goOn
	})
	go func() {
		defer close(done)
		call()
	}()
	resume = sync.OnceFunc(func() {
		close(goOn)
		<-done
	})
	t.Cleanup(resume) // if the check stops before resuming
	select {
	case <-reached:
	case <-done:
		t.Fatalf("a call on task %q returned without reaching its pause (refused before writing the fence?)", task)
	}
	return resume
}

// cpLateSaveHidden: a zombie's save that passed the fence and stalls, and
// writes its checkpoint after the newer holder fenced the task, saved and
// deleted the task's checkpoints (its run succeeded) — or cleaned up
// older ones — is never returned by Load, Latest or List and does not
// make Tasks list the task: the next holder starts afresh, not from the
// zombie's stale state.
func (s *suite) cpLateSaveHidden(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Checkpoints()
	save := func(task string, token int64, data string) driver.Checkpoint {
		t.Helper()
		cp, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: task, Token: token, Data: []byte(data)})
		fatalIf(t, "Save", err)
		if !ok {
			t.Fatalf("Save %q with token %d refused", data, token)
		}
		return cp
	}
	fence := func(task string, token int64) {
		t.Helper()
		if ok, err := c.Fence(ctx, task, token); err != nil || !ok {
			t.Fatalf("Fence %d: ok=%v err=%v", token, ok, err)
		}
	}
	// lateSave is the zombie's stalled save; it returns what the zombie
	// was told once resumed.
	lateSave := func(task string) (resume func() (driver.Checkpoint, bool)) {
		var cp driver.Checkpoint
		var ok bool
		var err error
		r := stalled(t, st, task, func() {
			cp, ok, err = c.Save(ctx, driver.CheckpointInput{TaskID: task, Token: 5, Data: []byte("a-late")})
		})
		return func() (driver.Checkpoint, bool) {
			r()
			if err != nil {
				t.Errorf("the zombie's late save: %v", err)
			}
			return cp, ok
		}
	}
	hidden := func(task string, late driver.Checkpoint, ok bool) {
		t.Helper()
		cps, err := c.List(ctx, task)
		fatalIf(t, "List", err)
		for _, cp := range cps {
			if string(cp.Data) == "a-late" {
				t.Errorf("List returns the zombie's late checkpoint %s (token %d)", cp.ID, cp.Token)
			}
		}
		if cp, found, err := c.Latest(ctx, task); err != nil || (found && string(cp.Data) == "a-late") {
			t.Errorf("Latest = %s %q found=%v err=%v: the zombie's late checkpoint", cp.ID, cp.Data, found, err)
		}
		if ok {
			if cp, found, err := c.Load(ctx, late.ID); err != nil || found {
				t.Errorf("Load %s = %q found=%v err=%v, want the zombie's late checkpoint absent", late.ID, cp.Data, found, err)
			}
		}
	}

	// The newer holder's run succeeds and deletes the task's checkpoints.
	const task = "late-save"
	save(task, 5, "a1")
	resume := lateSave(task)
	fence(task, 10)
	save(task, 10, "b1")
	if _, ok, err := c.DeleteAllFenced(ctx, task, 10); err != nil || !ok {
		t.Fatalf("DeleteAllFenced by the holder: ok=%v err=%v", ok, err)
	}
	late, ok := resume()
	hidden(task, late, ok)
	if cps, err := c.List(ctx, task); err != nil || len(cps) != 0 {
		t.Errorf("List after the holder's DeleteAll and the zombie's late save: %v err=%v, want none", sequences(cps), err)
	}
	for _, p := range []string{task, "late-*", "*"} {
		tasks, err := c.Tasks(ctx, p)
		if !errorIf(t, "Tasks", err) {
			sameKeys(t, fmt.Sprintf("Tasks %q after the late save", p), tasks, []string{})
		}
	}
	// The next holder starts afresh, and its saves are seen.
	fence(task, 15)
	if cp, found, err := c.Latest(ctx, task); err != nil || found {
		t.Errorf("the next holder's Latest = %s %q found=%v err=%v, want none (a fresh start)", cp.ID, cp.Data, found, err)
	}
	next := save(task, 15, "c1")
	if cps, err := c.List(ctx, task); err != nil || len(cps) != 1 || !sameCheckpoint(cps[0], next) {
		t.Errorf("List after the next holder's save: %v err=%v, want its checkpoint only", sequences(cps), err)
	}
	if cp, found, err := c.Load(ctx, next.ID); err != nil || !found || !sameCheckpoint(cp, next) {
		t.Errorf("Load of the next holder's checkpoint: found=%v err=%v", found, err)
	}
	if n, ok, err := c.DeleteAllFenced(ctx, task, 15); err != nil || !ok || n < 1 {
		t.Errorf("DeleteAllFenced after the late save: n=%d ok=%v err=%v, want the checkpoint (and the late one) deleted", n, ok, err)
	}

	// The newer holder cleans up older checkpoints while the zombie's save
	// is on its way.
	const cleaned = "late-save-cleanup"
	save(cleaned, 5, "a1")
	resume = lateSave(cleaned)
	fence(cleaned, 10)
	save(cleaned, 10, "b1")
	b2 := save(cleaned, 10, "b2")
	if _, ok, err := c.CleanupFenced(ctx, cleaned, 1, 10); err != nil || !ok {
		t.Fatalf("CleanupFenced by the holder: ok=%v err=%v", ok, err)
	}
	late, ok = resume()
	hidden(cleaned, late, ok)
	if cps, err := c.List(ctx, cleaned); err != nil || len(cps) != 1 || !sameCheckpoint(cps[0], b2) {
		t.Errorf("List after Cleanup keeping 1 and the zombie's late save: %v err=%v, want [%d]", sequences(cps), err, b2.Sequence)
	}
}

// cpFencedDelete: Cleanup and DeleteAll with a token below the task's
// fence (a zombie's, after a newer holder fenced) delete nothing and
// report it; with the fence's token or a greater one, or unfenced (0),
// they delete.
func (s *suite) cpFencedDelete(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Checkpoints()
	const task = "fenced-delete"
	save := func(token int64) driver.Checkpoint {
		t.Helper()
		cp, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: task, Token: token})
		fatalIf(t, "Save", err)
		if !ok {
			t.Fatalf("Save with token %d refused", token)
		}
		return cp
	}
	list := func(what string, want ...int64) {
		t.Helper()
		cps, err := c.List(ctx, task)
		fatalIf(t, "List", err)
		wantSequences(t, what, cps, want...)
	}
	save(5)
	save(5)
	if ok, err := c.Fence(ctx, task, 10); err != nil || !ok {
		t.Fatalf("Fence 10: ok=%v err=%v", ok, err)
	}
	save(10)
	if n, ok, err := c.DeleteAllFenced(ctx, task, 5); err != nil || ok || n != 0 {
		t.Errorf("DeleteAllFenced with token 5 after Fence 10: n=%d ok=%v err=%v, want refused", n, ok, err)
	}
	for _, keep := range []int{0, 1} {
		if n, ok, err := c.CleanupFenced(ctx, task, keep, 9); err != nil || ok || n != 0 {
			t.Errorf("CleanupFenced keeping %d with token 9 after Fence 10: n=%d ok=%v err=%v, want refused", keep, n, ok, err)
		}
	}
	list("List after the refused deletions", 1, 2, 3)
	if n, ok, err := c.CleanupFenced(ctx, task, 1, 10); err != nil || !ok || n != 2 {
		t.Errorf("CleanupFenced keeping 1 with the fence's token: n=%d ok=%v err=%v, want 2 deleted", n, ok, err)
	}
	list("List after Cleanup keeping 1", 3)
	if n, ok, err := c.DeleteAllFenced(ctx, task, 11); err != nil || !ok || n != 1 {
		t.Errorf("DeleteAllFenced with a token above the fence: n=%d ok=%v err=%v, want 1 deleted", n, ok, err)
	}
	// A deletion does not raise the fence.
	save(10)
	if n, ok, err := c.CleanupFenced(ctx, task, 0, 0); err != nil || !ok || n != 1 {
		t.Errorf("unfenced CleanupFenced: n=%d ok=%v err=%v, want 1 deleted", n, ok, err)
	}
	save(10)
	if n, err := c.DeleteAll(ctx, task); err != nil || n != 1 {
		t.Errorf("unfenced DeleteAll: n=%d err=%v, want 1 deleted", n, err)
	}
	list("List after the deletions", []int64{}...)
	if n, ok, err := c.DeleteAllFenced(ctx, "no-such-task", 3); err != nil || !ok || n != 0 {
		t.Errorf("DeleteAllFenced of an unknown task: n=%d ok=%v err=%v", n, ok, err)
	}
	if n, ok, err := c.CleanupFenced(ctx, "no-such-task", 1, 3); err != nil || !ok || n != 0 {
		t.Errorf("CleanupFenced of an unknown task: n=%d ok=%v err=%v", n, ok, err)
	}
	if _, _, err := c.DeleteAllFenced(ctx, task, -1); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("DeleteAllFenced with token -1: err=%v, want ErrInvalidArgument", err)
	}
	if _, _, err := c.CleanupFenced(ctx, task, 1, -1); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("CleanupFenced with token -1: err=%v, want ErrInvalidArgument", err)
	}
}

// cpLateDelete: a zombie's DeleteAll or Cleanup that passed the fence and
// stalls before deleting deletes only what it covered when it passed:
// never the checkpoints a newer holder saves after fencing the task.
func (s *suite) cpLateDelete(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Checkpoints()
	save := func(task string, token int64) driver.Checkpoint {
		t.Helper()
		cp, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: task, Token: token, Data: []byte(fmt.Sprint(token))})
		fatalIf(t, "Save", err)
		if !ok {
			t.Fatalf("Save with token %d refused", token)
		}
		return cp
	}
	fence := func(task string, token int64) {
		t.Helper()
		if ok, err := c.Fence(ctx, task, token); err != nil || !ok {
			t.Fatalf("Fence %d: ok=%v err=%v", token, ok, err)
		}
	}

	const task = "late-delete"
	save(task, 5)
	save(task, 5)
	var ok bool
	var err error
	resume := stalled(t, st, task, func() { _, ok, err = c.DeleteAllFenced(ctx, task, 5) })
	fence(task, 10)
	b1 := save(task, 10)
	resume()
	if err != nil || !ok {
		t.Errorf("the zombie's DeleteAllFenced that passed the fence first: ok=%v err=%v, want done", ok, err)
	}
	cps, lerr := c.List(ctx, task)
	fatalIf(t, "List", lerr)
	if len(cps) != 1 || !sameCheckpoint(cps[0], b1) {
		t.Errorf("List after the zombie's late DeleteAll: %v, want the newer holder's checkpoint %d only", sequences(cps), b1.Sequence)
	}
	if cp, found, err := c.Latest(ctx, task); err != nil || !found || !sameCheckpoint(cp, b1) {
		t.Errorf("Latest after the zombie's late DeleteAll = %s found=%v err=%v, want %s", cp.ID, found, err, b1.ID)
	}

	const cleaned = "late-cleanup"
	save(cleaned, 5)
	save(cleaned, 5)
	a3 := save(cleaned, 5)
	resume = stalled(t, st, cleaned, func() { _, ok, err = c.CleanupFenced(ctx, cleaned, 1, 5) })
	fence(cleaned, 10)
	b4, b5 := save(cleaned, 10), save(cleaned, 10)
	resume()
	if err != nil || !ok {
		t.Errorf("the zombie's CleanupFenced that passed the fence first: ok=%v err=%v, want done", ok, err)
	}
	cps, lerr = c.List(ctx, cleaned)
	fatalIf(t, "List", lerr)
	wantSequences(t, "List after the zombie's late Cleanup keeping 1", cps, a3.Sequence, b4.Sequence, b5.Sequence)
}

// cpRunAfterZombieSave: through checkpoint.Run, on two stores like two
// processes. Worker A saves, and its next save passes the fence and
// stalls on its way to the store; A's lock is force-released; worker B
// takes over, saves and succeeds (deleting the task's checkpoints); then
// A's save lands. The next Run of the task starts afresh: it does not
// resume from A's stale state.
func (s *suite) cpRunAfterZombieSave(t *testing.T) {
	ctx := testCtx(t)
	stA, prefix := s.open(t)
	stB := s.openPrefix(t, prefix)
	const task = "run-zombie"
	opts := &checkpoint.Options{Lock: true}

	cursorA := make(chan *checkpoint.Cursor[string])
	bDone := make(chan struct{})
	aRun := make(chan error, 1)
	go func() {
		aRun <- checkpoint.Run(ctx, stA, task, opts, func(ctx context.Context, cp *checkpoint.Cursor[string]) error {
			if err := cp.Save(ctx, "a1", 10); err != nil {
				return err
			}
			cursorA <- cp
			<-bDone
			return errInjected
		})
	}()
	var cpA *checkpoint.Cursor[string]
	select {
	case cpA = <-cursorA:
	case err := <-aRun:
		t.Fatalf("worker A: %v", err)
	}
	defer func() {
		close(bDone)
		if err := <-aRun; err == nil {
			t.Errorf("worker A's Run returned nil after losing its lease")
		}
	}()
	var lateErr error
	// Without cancellation: the request is already on its way.
	resume := stalled(t, stA, task, func() { lateErr = cpA.Save(context.WithoutCancel(ctx), "a-late", 20) })

	if ok, err := stB.Locks().ForceRelease(ctx, checkpoint.LockKey(task)); err != nil || !ok {
		t.Fatalf("ForceRelease of A's lock: ok=%v err=%v", ok, err)
	}
	err := checkpoint.Run(ctx, stB, task, opts, func(ctx context.Context, cp *checkpoint.Cursor[string]) error {
		if !cp.Resumed() {
			return errors.New("worker B did not resume from A's checkpoint")
		}
		return cp.Save(ctx, "b1", 100)
	})
	fatalIf(t, "worker B's Run", err)
	resume()
	if lateErr != nil && !errors.Is(lateErr, checkpoint.ErrStale) {
		t.Errorf("A's late save: %v", lateErr)
	}

	if state, cp, err := checkpoint.Latest[string](ctx, stB, task, nil); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("after B's success and A's late save, Latest = %q (%s, token %d), err=%v; want ErrNotFound", state, cp.ID, cp.Token, err)
	}
	err = checkpoint.Run(ctx, stB, task, opts, func(ctx context.Context, cp *checkpoint.Cursor[string]) error {
		if state, ok := cp.State(); ok {
			return fmt.Errorf("the next run resumed from %q, a zombie's stale state", state)
		}
		return nil
	})
	errorIf(t, "the next Run", err)
}

// sameCheckpoint compares two checkpoints.
func sameCheckpoint(a, b driver.Checkpoint) bool {
	return a.ID == b.ID && a.TaskID == b.TaskID && a.Sequence == b.Sequence && a.Time.Equal(b.Time) &&
		a.Progress == b.Progress && string(a.Data) == string(b.Data) && a.ETA == b.ETA && a.Token == b.Token
}

// sequences returns the sequences of a list of checkpoints.
func sequences(cps []driver.Checkpoint) []int64 {
	out := make([]int64, len(cps))
	for i, cp := range cps {
		out[i] = cp.Sequence
	}
	return out
}

// wantSequences checks a task's list is exactly the given sequences.
func wantSequences(t *testing.T, what string, cps []driver.Checkpoint, want ...int64) {
	t.Helper()
	got := sequences(cps)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		if len(got) > 20 || len(want) > 20 {
			t.Errorf("%s: %d checkpoints with sequences from %v, want %d", what, len(got), got[:min(len(got), 12)], len(want))
			return
		}
		t.Errorf("%s: sequences %v, want %v", what, got, want)
	}
}

// seqRange returns from..to.
func seqRange(from, to int64) []int64 {
	var out []int64
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// cpConcurrentSave: concurrent savers get distinct consecutive sequences.
func (s *suite) cpConcurrentSave(t *testing.T) {
	ec := newErrorCap(t, "cpConcurrentSave")
	defer ec.done()
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Checkpoints()
	const savers, saves = 8, 10
	const task = "concurrent"
	saved := make([][]driver.Checkpoint, savers)
	var errs errList
	parallel(savers, func(g int) {
		for i := range saves {
			cp, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: task, Progress: float64(i), Data: []byte(fmt.Sprintf("%d/%d", g, i))})
			if err != nil || !ok {
				errs.add("Save: ok=%v err=%v", ok, err)
				continue
			}
			saved[g] = append(saved[g], cp)
		}
	})
	errs.report(t, "Save")
	bySeq := map[int64]driver.Checkpoint{}
	dups := 0
	for _, list := range saved {
		for i, cp := range list {
			if prev, dup := bySeq[cp.Sequence]; dup {
				if dups == 0 {
					ec.Errorf("sequence %d handed to two savers (data %q and %q)", cp.Sequence, prev.Data, cp.Data)
				}
				dups++
			}
			bySeq[cp.Sequence] = cp
			if cp.ID != driver.CheckpointID(task, cp.Sequence) || cp.TaskID != task {
				ec.Errorf("Save returned id %q task %q for sequence %d", cp.ID, cp.TaskID, cp.Sequence)
			}
			if i > 0 && cp.Sequence <= list[i-1].Sequence {
				ec.Errorf("one saver got sequence %d after %d", cp.Sequence, list[i-1].Sequence)
			}
		}
	}
	if dups > 0 {
		ec.Errorf("%d duplicate sequences among %d concurrent saves", dups, savers*saves)
	}
	for seq := int64(1); seq <= savers*saves; seq++ {
		if _, ok := bySeq[seq]; !ok {
			ec.Errorf("no save got sequence %d; want exactly 1..%d", seq, savers*saves)
			break
		}
	}
	list, err := c.List(ctx, task)
	fatalIf(t, "List", err)
	wantSequences(t, "List", list, seqRange(1, savers*saves)...)
	for _, cp := range list {
		if want, ok := bySeq[cp.Sequence]; ok && !sameCheckpoint(cp, want) {
			ec.Errorf("List has %+v for sequence %d, Save returned %+v", cp, cp.Sequence, want)
		}
	}
}

// cpOrder: List is in numeric sequence order past 9; fields round-trip;
// Latest and Load.
func (s *suite) cpOrder(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Checkpoints()
	const task = "ordered"
	var saved []driver.Checkpoint
	for i := int64(1); i <= 12; i++ {
		in := driver.CheckpointInput{
			TaskID:   task,
			Progress: float64(i)*8 + 0.25,
			Data:     []byte(fmt.Sprintf("data-%d", i)),
			ETA:      time.Duration(i)*time.Second + 7*time.Millisecond,
		}
		cp, ok, err := c.Save(ctx, in)
		fatalIf(t, "Save", err)
		if !ok {
			t.Fatal("Save without a token refused")
		}
		if cp.Sequence != i || cp.ID != driver.CheckpointID(task, i) || cp.TaskID != task {
			t.Errorf("save %d: sequence %d id %q task %q", i, cp.Sequence, cp.ID, cp.TaskID)
		}
		if cp.Progress != in.Progress || string(cp.Data) != string(in.Data) || cp.ETA != in.ETA || cp.Token != 0 {
			t.Errorf("save %d returned progress %v data %q ETA %v token %d; want %v %q %v 0", i, cp.Progress, cp.Data, cp.ETA, cp.Token, in.Progress, in.Data, in.ETA)
		}
		checkTime(t, "checkpoint Time", cp.Time)
		if n := len(saved); n > 0 && cp.Time.Before(saved[n-1].Time) {
			t.Errorf("checkpoint %d's time %v is before checkpoint %d's %v", i, cp.Time, i-1, saved[n-1].Time)
		}
		saved = append(saved, cp)
	}
	list, err := c.List(ctx, task)
	fatalIf(t, "List", err)
	wantSequences(t, "List", list, seqRange(1, 12)...)
	for i, cp := range list {
		if i < len(saved) && !sameCheckpoint(cp, saved[i]) {
			t.Errorf("List[%d] = %+v, Save returned %+v", i, cp, saved[i])
		}
	}
	latest, found, err := c.Latest(ctx, task)
	fatalIf(t, "Latest", err)
	if !found || !sameCheckpoint(latest, saved[11]) {
		t.Errorf("Latest = %+v found=%v, want sequence 12: %+v", latest, found, saved[11])
	}
	for _, seq := range []int64{1, 2, 9, 10, 12} {
		cp, found, err := c.Load(ctx, driver.CheckpointID(task, seq))
		if errorIf(t, "Load", err) {
			continue
		}
		if !found || !sameCheckpoint(cp, saved[seq-1]) {
			t.Errorf("Load %d = %+v found=%v, want %+v", seq, cp, found, saved[seq-1])
		}
	}
	for _, id := range []string{driver.CheckpointID(task, 13), driver.CheckpointID(task, 0), task + ":01", task, "no-such-task:1", "not an id"} {
		if _, found, err := c.Load(ctx, id); err != nil || found {
			t.Errorf("Load %q: found=%v err=%v, want absent", id, found, err)
		}
	}
	if _, found, err := c.Latest(ctx, "no-such-task"); err != nil || found {
		t.Errorf("Latest of an unknown task: found=%v err=%v", found, err)
	}
	if cps, err := c.List(ctx, "no-such-task"); err != nil || len(cps) != 0 {
		t.Errorf("List of an unknown task: %d err=%v", len(cps), err)
	}
	// A task id that looks like another task's checkpoint id.
	other := driver.CheckpointID(task, 1)
	if cp, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: other}); err != nil || !ok || cp.Sequence != 1 {
		t.Errorf("Save to task %q: sequence %d ok=%v err=%v, want its first", other, cp.Sequence, ok, err)
	}
	if cps, err := c.List(ctx, task); err != nil || len(cps) != 12 {
		t.Errorf("saving to task %q changed task %q: %d checkpoints, err=%v", other, task, len(cps), err)
	}
}

// cpPaging: List returns every checkpoint of a large task, in order.
func (s *suite) cpPaging(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Checkpoints()
	const n = 1050
	const task = "long"
	var errs errList
	parallel(10, func(int) {
		for range n / 10 {
			if _, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: task}); err != nil || !ok {
				errs.add("Save: ok=%v err=%v", ok, err)
			}
		}
	})
	errs.report(t, "Save")
	list, err := c.List(ctx, task)
	fatalIf(t, "List", err)
	wantSequences(t, "List", list, seqRange(1, n)...)
	latest, found, err := c.Latest(ctx, task)
	if err != nil || !found || latest.Sequence != n {
		t.Errorf("Latest: sequence %d found=%v err=%v, want %d", latest.Sequence, found, err, n)
	}
}

// cpCleanup: Cleanup keeps the newest N; sequences continue afterwards.
func (s *suite) cpCleanup(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Checkpoints()
	for i := 0; i < 12; i++ {
		if _, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: "job"}); err != nil || !ok {
			t.Fatalf("Save: ok=%v err=%v", ok, err)
		}
	}
	for i := 0; i < 3; i++ {
		if _, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: "bystander"}); err != nil || !ok {
			t.Fatalf("Save: ok=%v err=%v", ok, err)
		}
	}
	n, err := c.Cleanup(ctx, "job", 3)
	fatalIf(t, "Cleanup", err)
	if n != 9 {
		t.Errorf("Cleanup keeping 3 of 12 deleted %d, want 9", n)
	}
	list, err := c.List(ctx, "job")
	fatalIf(t, "List", err)
	wantSequences(t, "List after Cleanup", list, 10, 11, 12)
	if _, found, err := c.Load(ctx, driver.CheckpointID("job", 9)); err != nil || found {
		t.Errorf("Load of a cleaned-up checkpoint: found=%v err=%v", found, err)
	}
	for _, keep := range []int{3, 5} {
		if n, err := c.Cleanup(ctx, "job", keep); err != nil || n != 0 {
			t.Errorf("Cleanup keeping %d of 3: deleted %d err=%v, want 0", keep, n, err)
		}
	}
	cp, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: "job"})
	if err != nil || !ok || cp.Sequence != 13 {
		t.Errorf("Save after Cleanup: sequence %d ok=%v err=%v, want 13 (sequences are never reused)", cp.Sequence, ok, err)
	}
	n, err = c.Cleanup(ctx, "job", 0)
	fatalIf(t, "Cleanup", err)
	if n != 4 {
		t.Errorf("Cleanup keeping 0 of 4 deleted %d", n)
	}
	if _, found, err := c.Latest(ctx, "job"); err != nil || found {
		t.Errorf("Latest after Cleanup keeping 0: found=%v err=%v", found, err)
	}
	list, err = c.List(ctx, "bystander")
	fatalIf(t, "List", err)
	wantSequences(t, "another task after Cleanup", list, 1, 2, 3)
	if n, err := c.Cleanup(ctx, "no-such-task", 1); err != nil || n != 0 {
		t.Errorf("Cleanup of an unknown task: %d err=%v", n, err)
	}
}

// cpDeleteAll: DeleteAll removes one task's checkpoints only.
func (s *suite) cpDeleteAll(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Checkpoints()
	for _, task := range []string{"a", "a", "a", "a", "a", "b", "b", "b", "a:1", "a*"} {
		if _, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: task}); err != nil || !ok {
			t.Fatalf("Save: ok=%v err=%v", ok, err)
		}
	}
	n, err := c.DeleteAll(ctx, "a")
	fatalIf(t, "DeleteAll", err)
	if n != 5 {
		t.Errorf("DeleteAll deleted %d, want 5", n)
	}
	if cps, err := c.List(ctx, "a"); err != nil || len(cps) != 0 {
		t.Errorf("List after DeleteAll: %d err=%v", len(cps), err)
	}
	if _, found, err := c.Latest(ctx, "a"); err != nil || found {
		t.Errorf("Latest after DeleteAll: found=%v err=%v", found, err)
	}
	if _, found, err := c.Load(ctx, driver.CheckpointID("a", 1)); err != nil || found {
		t.Errorf("Load after DeleteAll: found=%v err=%v", found, err)
	}
	tasks, err := c.Tasks(ctx, "*")
	fatalIf(t, "Tasks", err)
	sameKeys(t, "Tasks after DeleteAll", tasks, []string{"a*", "a:1", "b"})
	for task, want := range map[string]int{"b": 3, "a:1": 1, "a*": 1} {
		if cps, err := c.List(ctx, task); err != nil || len(cps) != want {
			t.Errorf("DeleteAll of task a touched task %q: %d checkpoints left, err=%v, want %d", task, len(cps), err, want)
		}
	}
	if n, err := c.DeleteAll(ctx, "a"); err != nil || n != 0 {
		t.Errorf("second DeleteAll: %d err=%v", n, err)
	}
}

// cpTasks: Tasks lists task ids matching a glob, sorted.
func (s *suite) cpTasks(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Checkpoints()
	tasks := []string{"job:1", "job:2", "job:10", "job:?x", "other", "job:%", "job:_"}
	for _, task := range tasks {
		if _, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: task}); err != nil || !ok {
			t.Fatalf("Save: ok=%v err=%v", ok, err)
		}
	}
	if _, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: "job:cleaned"}); err != nil || !ok {
		t.Fatalf("Save: ok=%v err=%v", ok, err)
	}
	if _, err := c.Cleanup(ctx, "job:cleaned", 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"*", "", "job:*", "job:?", `job:\?x`, "job:%", "job:_", "*1*", "o*", "x*"} {
		got, err := c.Tasks(ctx, p)
		if errorIf(t, "Tasks "+p, err) {
			continue
		}
		sameKeys(t, fmt.Sprintf("Tasks %q", p), got, matching(tasks, p))
	}
}

// cpTokenGuard: a save with a smaller fencing token than a stored
// checkpoint's is refused (a zombie); equal and greater are accepted;
// token 0 is unguarded.
func (s *suite) cpTokenGuard(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Checkpoints()
	const task = "fenced"
	steps := []struct {
		token int64
		ok    bool
	}{
		{5, true}, {3, false}, {5, true}, {7, true}, {5, false}, {6, false}, {0, true}, {7, true}, {1, false}, {8, true},
	}
	var accepted []int64
	for _, step := range steps {
		cp, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: task, Token: step.token, Data: []byte(fmt.Sprint(step.token))})
		fatalIf(t, "Save", err)
		if ok != step.ok {
			t.Errorf("Save with token %d after tokens %v: ok=%v, want %v", step.token, accepted, ok, step.ok)
		}
		if ok {
			accepted = append(accepted, step.token)
			if cp.Token != step.token {
				t.Errorf("saved checkpoint carries token %d, want %d", cp.Token, step.token)
			}
		}
	}
	list, err := c.List(ctx, task)
	fatalIf(t, "List", err)
	var tokens []int64
	for i, cp := range list {
		tokens = append(tokens, cp.Token)
		if i > 0 && cp.Sequence <= list[i-1].Sequence {
			t.Errorf("sequences out of order: %v", sequences(list))
		}
	}
	if fmt.Sprint(tokens) != "[5 5 7 0 7 8]" {
		t.Errorf("stored tokens %v, want [5 5 7 0 7 8]: refused saves must write nothing", tokens)
	}
	if cp, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: "other", Token: 1}); err != nil || !ok || cp.Sequence != 1 {
		t.Errorf("Save with token 1 to another task: ok=%v err=%v: tokens are per task", ok, err)
	}
}

// cpFence: Fence raises the task's fence without a checkpoint carrying the
// token, so that older-token saves are refused before the new holder has
// saved; a smaller token is stale, an equal one accepted.
func (s *suite) cpFence(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Checkpoints()
	const task = "fence"
	save := func(token int64, want bool) {
		t.Helper()
		cp, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: task, Token: token, Data: []byte(fmt.Sprint(token))})
		fatalIf(t, "Save", err)
		if ok != want {
			t.Errorf("Save with token %d: ok=%v, want %v", token, ok, want)
		}
		if ok && cp.Token != token {
			t.Errorf("saved checkpoint carries token %d, want %d", cp.Token, token)
		}
	}
	fence := func(token int64, want bool) {
		t.Helper()
		ok, err := c.Fence(ctx, task, token)
		fatalIf(t, "Fence", err)
		if ok != want {
			t.Errorf("Fence with token %d: ok=%v, want %v", token, ok, want)
		}
	}
	save(5, true)
	fence(10, true) // a new holder, before its first save
	save(7, false)  // the zombie's late save: no checkpoint carries 10
	save(5, false)
	fence(9, false) // a stale holder
	fence(10, true) // the holder again
	save(10, true)
	save(0, true) // unfenced
	fence(12, true)
	save(11, false)
	save(12, true)
	list, err := c.List(ctx, task)
	fatalIf(t, "List", err)
	var tokens []int64
	for _, cp := range list {
		tokens = append(tokens, cp.Token)
	}
	if fmt.Sprint(tokens) != "[5 10 0 12]" {
		t.Errorf("stored tokens %v, want [5 10 0 12]: refused saves must write nothing", tokens)
	}
	wantSequences(t, "List", list, 1, 2, 3, 4)

	// A task fenced before any save: not listed, saves below refused,
	// sequences start at 1.
	const fresh = "fence-first"
	if ok, err := c.Fence(ctx, fresh, 3); err != nil || !ok {
		t.Errorf("Fence of a new task: ok=%v err=%v, want ok", ok, err)
	}
	tasks, err := c.Tasks(ctx, "fence-*")
	fatalIf(t, "Tasks", err)
	sameKeys(t, "Tasks after Fence alone", tasks, []string{})
	if _, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: fresh, Token: 2}); err != nil || ok {
		t.Errorf("Save with token 2 after Fence 3: ok=%v err=%v, want refused", ok, err)
	}
	if cp, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: fresh, Token: 3}); err != nil || !ok || cp.Sequence != 1 {
		t.Errorf("Save with token 3 after Fence 3: sequence %d ok=%v err=%v, want sequence 1", cp.Sequence, ok, err)
	}
	if cp, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: "fence-other", Token: 1}); err != nil || !ok || cp.Sequence != 1 {
		t.Errorf("Save with token 1 to another task: ok=%v err=%v: fences are per task", ok, err)
	}
	for _, token := range []int64{0, -1} {
		if _, err := c.Fence(ctx, task, token); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Fence with token %d: err=%v, want ErrInvalidArgument", token, err)
		}
	}
}

// cpFenceSurvivesDeleteAll: the fence outlives the task's checkpoints, so
// a zombie's late save after a successful run deleted them is refused.
func (s *suite) cpFenceSurvivesDeleteAll(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Checkpoints()
	const task = "finished"
	for range 2 {
		if _, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: task, Token: 5}); err != nil || !ok {
			t.Fatalf("Save with token 5: ok=%v err=%v", ok, err)
		}
	}
	if n, err := c.DeleteAll(ctx, task); err != nil || n != 2 {
		t.Fatalf("DeleteAll: %d err=%v, want 2", n, err)
	}
	if _, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: task, Token: 4}); err != nil || ok {
		t.Errorf("Save with token 4 after DeleteAll of token-5 checkpoints: ok=%v err=%v, want refused", ok, err)
	}
	if cps, err := c.List(ctx, task); err != nil || len(cps) != 0 {
		t.Errorf("List after a refused save: %d checkpoints err=%v, want none", len(cps), err)
	}
	if _, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: task, Token: 5}); err != nil || !ok {
		t.Errorf("Save with token 5 after DeleteAll: ok=%v err=%v, want accepted", ok, err)
	}
	// Cleanup keeping none forgets no more than DeleteAll.
	const cleaned = "cleaned"
	if ok, err := c.Fence(ctx, cleaned, 7); err != nil || !ok {
		t.Fatalf("Fence: ok=%v err=%v", ok, err)
	}
	if _, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: cleaned, Token: 7}); err != nil || !ok {
		t.Fatalf("Save with token 7: ok=%v err=%v", ok, err)
	}
	if _, err := c.Cleanup(ctx, cleaned, 0); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: cleaned, Token: 6}); err != nil || ok {
		t.Errorf("Save with token 6 after Cleanup of token-7 checkpoints: ok=%v err=%v, want refused", ok, err)
	}
	if ok, err := c.Fence(ctx, cleaned, 6); err != nil || ok {
		t.Errorf("Fence with token 6 after Cleanup: ok=%v err=%v, want stale", ok, err)
	}
}

// cpSequencesContinue: sequences continue after DeleteAll and Cleanup, so
// checkpoint ids are never reused; Fence takes no sequence.
func (s *suite) cpSequencesContinue(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Checkpoints()
	const task = "again"
	save := func(want int64) {
		t.Helper()
		cp, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: task, Data: []byte(fmt.Sprint(want))})
		fatalIf(t, "Save", err)
		if !ok || cp.Sequence != want || cp.ID != driver.CheckpointID(task, want) {
			t.Errorf("Save: sequence %d id %q ok=%v, want sequence %d", cp.Sequence, cp.ID, ok, want)
		}
	}
	save(1)
	save(2)
	save(3)
	if _, err := c.DeleteAll(ctx, task); err != nil {
		t.Fatal(err)
	}
	save(4)
	if _, found, err := c.Load(ctx, driver.CheckpointID(task, 1)); err != nil || found {
		t.Errorf("Load of a deleted id: found=%v err=%v", found, err)
	}
	if _, err := c.Cleanup(ctx, task, 0); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.Fence(ctx, task, 9); err != nil || !ok {
		t.Errorf("Fence: ok=%v err=%v", ok, err)
	}
	save(5)
	list, err := c.List(ctx, task)
	fatalIf(t, "List", err)
	wantSequences(t, "List", list, 5)
	if len(list) == 1 && string(list[0].Data) != "5" {
		t.Errorf("checkpoint %s holds %q, want the last save's", list[0].ID, list[0].Data)
	}
}

// cpFenceConcurrent: with the fence raised to 100 first, concurrent
// workers with older tokens are refused (Fence and every Save) while
// workers with a newer token are accepted, with distinct sequences.
func (s *suite) cpFenceConcurrent(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Checkpoints()
	const task = "contended"
	const workers, saves = 8, 10
	if ok, err := c.Fence(ctx, task, 100); err != nil || !ok {
		t.Fatalf("Fence 100: ok=%v err=%v", ok, err)
	}
	var errs errList
	var mu sync.Mutex
	seqs := map[int64]int64{} // sequence → token
	accepted := 0
	parallel(workers, func(g int) {
		token := int64(50 + g) // zombies: distinct tokens below the fence
		if g%2 == 1 {
			token = 150 // the new holder's processes
		}
		ok, err := c.Fence(ctx, task, token)
		if err != nil {
			errs.add("Fence %d: %v", token, err)
			return
		}
		if ok != (token > 100) {
			errs.add("Fence %d after Fence 100: ok=%v", token, ok)
		}
		for i := range saves {
			cp, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: task, Token: token, Data: []byte(fmt.Sprintf("%d/%d", g, i))})
			if err != nil {
				errs.add("Save %d: %v", token, err)
				continue
			}
			if ok != (token > 100) {
				errs.add("Save with token %d after Fence 100: ok=%v", token, ok)
			}
			if !ok {
				continue
			}
			mu.Lock()
			if prev, dup := seqs[cp.Sequence]; dup {
				errs.add("sequence %d handed to tokens %d and %d", cp.Sequence, prev, token)
			}
			seqs[cp.Sequence] = token
			accepted++
			mu.Unlock()
		}
	})
	errs.report(t, "concurrent Fence and Save")
	list, err := c.List(ctx, task)
	fatalIf(t, "List", err)
	wantSequences(t, "List", list, seqRange(1, int64(accepted))...)
	for _, cp := range list {
		if cp.Token != 150 {
			t.Errorf("checkpoint %s carries token %d below the fence", cp.ID, cp.Token)
		}
	}
	if _, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: task, Token: 120}); err != nil || ok {
		t.Errorf("Save with token 120 after saves with 150: ok=%v err=%v, want refused", ok, err)
	}
}

// cpValues: checkpoint data round-trips byte for byte.
func (s *suite) cpValues(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Checkpoints()
	for _, vc := range valueCases(st.Limits().MaxValueBytes) {
		cp, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: vc.name, Data: vc.v})
		if err != nil || !ok {
			t.Errorf("Save %s: ok=%v err=%v", vc.name, ok, err)
			continue
		}
		got, found, err := c.Load(ctx, cp.ID)
		if err != nil || !found {
			t.Errorf("Load %s: found=%v err=%v", vc.name, found, err)
			continue
		}
		wantValue(t, vc.name, got.Data, vc.v)
		latest, _, err := c.Latest(ctx, vc.name)
		if !errorIf(t, "Latest", err) {
			wantValue(t, vc.name+" (Latest)", latest.Data, vc.v)
		}
	}
}
