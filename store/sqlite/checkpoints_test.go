package sqlite

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
)

func TestCheckpoints(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, &Options{Prefix: "ns:"})
	other := openAt(t, path, &Options{Prefix: "other:"})
	cp := st.Checkpoints()
	task := "import:2024:batch" // colons in the task id
	for i := 1; i <= 12; i++ {
		c, ok, err := cp.Save(ctx, driver.CheckpointInput{TaskID: task, Progress: float64(i) * 8.25, Data: []byte(fmt.Sprint("state-", i)), ETA: 1500 * time.Millisecond})
		if err != nil || !ok {
			t.Fatalf("Save %d: %v %v", i, ok, err)
		}
		if c.Sequence != int64(i) || c.ID != driver.CheckpointID(task, int64(i)) || c.TaskID != task || c.ETA != 1500*time.Millisecond || c.Time.IsZero() {
			t.Fatalf("Save %d returned %+v", i, c)
		}
	}
	if _, _, err := other.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: task, Progress: 1}); err != nil {
		t.Fatal(err)
	}
	latest, found, err := cp.Latest(ctx, task)
	if err != nil || !found || latest.Sequence != 12 || string(latest.Data) != "state-12" || latest.Progress != 99 {
		t.Fatalf("Latest: %+v %v %v", latest, found, err)
	}
	list, err := cp.List(ctx, task)
	if err != nil || len(list) != 12 {
		t.Fatalf("List: %d %v", len(list), err)
	}
	for i, c := range list { // numeric order: 9 before 10
		if c.Sequence != int64(i+1) {
			t.Fatalf("List[%d] has sequence %d", i, c.Sequence)
		}
	}
	got, found, err := cp.Load(ctx, driver.CheckpointID(task, 10))
	if err != nil || !found || string(got.Data) != "state-10" || got.ID != driver.CheckpointID(task, 10) {
		t.Fatalf("Load: %+v %v %v", got, found, err)
	}
	for _, bad := range []string{"nope", task + ":0", task + ":99", task + ":x", "import:2024:batch:01"} {
		if _, found, err := cp.Load(ctx, bad); err != nil || found {
			t.Errorf("Load(%q): %v %v", bad, found, err)
		}
	}
	n, err := cp.Cleanup(ctx, task, 3)
	if err != nil || n != 9 {
		t.Fatalf("Cleanup(3) = %d %v", n, err)
	}
	list, _ = cp.List(ctx, task)
	if len(list) != 3 || list[0].Sequence != 10 {
		t.Fatalf("after Cleanup: %+v", list)
	}
	if n, err := cp.Cleanup(ctx, task, 5); err != nil || n != 0 {
		t.Fatalf("Cleanup keeping more than exist: %d %v", n, err)
	}
	// Sequences continue after cleanup.
	c, _, err := cp.Save(ctx, driver.CheckpointInput{TaskID: task, Progress: 100})
	if err != nil || c.Sequence != 13 || c.ETA != 0 {
		t.Fatalf("Save after Cleanup: %+v %v", c, err)
	}
	if _, _, err := cp.Save(ctx, driver.CheckpointInput{TaskID: "other-task", Progress: 5}); err != nil {
		t.Fatal(err)
	}
	tasks, err := cp.Tasks(ctx, "*")
	if err != nil || fmt.Sprint(tasks) != fmt.Sprint([]string{task, "other-task"}) {
		t.Fatalf("Tasks: %q %v", tasks, err)
	}
	tasks, err = cp.Tasks(ctx, "other*")
	if err != nil || fmt.Sprint(tasks) != "[other-task]" {
		t.Fatalf("Tasks(other*): %q %v", tasks, err)
	}
	n, err = cp.DeleteAll(ctx, task)
	if err != nil || n != 4 {
		t.Fatalf("DeleteAll = %d %v", n, err)
	}
	if _, found, _ := cp.Latest(ctx, task); found {
		t.Fatal("Latest after DeleteAll")
	}
	if l, _ := other.Checkpoints().List(ctx, task); len(l) != 1 {
		t.Fatalf("other namespace lost checkpoints: %d", len(l))
	}
	n, err = cp.Cleanup(ctx, "other-task", 0)
	if err != nil || n != 1 {
		t.Fatalf("Cleanup(0) = %d %v", n, err)
	}
}

func TestCheckpointFencing(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	cp := st.Checkpoints()
	if _, ok, err := cp.Save(ctx, driver.CheckpointInput{TaskID: "t", Token: 100}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, ok, err := cp.Save(ctx, driver.CheckpointInput{TaskID: "t", Token: 101}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	// A zombie with an older lease is refused.
	if _, ok, err := cp.Save(ctx, driver.CheckpointInput{TaskID: "t", Token: 100}); err != nil || ok {
		t.Fatalf("zombie save: %v %v", ok, err)
	}
	// Token 0 means unfenced.
	c, ok, err := cp.Save(ctx, driver.CheckpointInput{TaskID: "t"})
	if err != nil || !ok || c.Sequence != 3 || c.Token != 0 {
		t.Fatalf("unfenced save: %+v %v %v", c, ok, err)
	}
	c, _, _ = cp.Save(ctx, driver.CheckpointInput{TaskID: "t", Token: 101})
	if c.Token != 101 || c.Sequence != 4 {
		t.Fatalf("same token again: %+v", c)
	}
}

func TestCheckpointConcurrentSavers(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, nil)
	st2 := openAt(t, path, nil)
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[int64]bool{}
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := st
			if g%2 == 0 {
				s = st2
			}
			for i := 0; i < 10; i++ {
				c, ok, err := s.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "shared", Progress: 1})
				if err != nil || !ok {
					t.Error(ok, err)
					return
				}
				mu.Lock()
				if seen[c.Sequence] {
					t.Errorf("sequence %d handed out twice", c.Sequence)
				}
				seen[c.Sequence] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for i := int64(1); i <= 80; i++ {
		if !seen[i] {
			t.Fatalf("sequence %d missing", i)
		}
	}
}

// TestCheckpointFenceMigration opens a database made before the fence
// table existed: opening creates it, and tasks that already have
// checkpoints continue from their highest sequence and token. Checkpoints
// inserted by another program without a fence row do not collide.
func TestCheckpointFenceMigration(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, &Options{Prefix: "ns:"})
	cp := st.Checkpoints()
	for _, token := range []int64{5, 5, 0} {
		if _, ok, err := cp.Save(ctx, driver.CheckpointInput{TaskID: "t", Token: token}); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	db := st.Driver().(*store).db
	if _, err := db.Exec(`DROP TABLE go_goscope_checkpoint_tasks`); err != nil {
		t.Fatal(err)
	}
	st.Close()

	st = openAt(t, path, &Options{Prefix: "ns:"})
	cp = st.Checkpoints()
	db = st.Driver().(*store).db
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM go_goscope_checkpoint_tasks`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("fence table after migration: %d rows, %v", n, err)
	}
	if _, ok, err := cp.Save(ctx, driver.CheckpointInput{TaskID: "t", Token: 4}); err != nil || ok {
		t.Fatalf("save below the kept checkpoints' token after migration: ok=%v err=%v", ok, err)
	}
	if ok, err := cp.Fence(ctx, "t", 4); err != nil || ok {
		t.Fatalf("Fence below the kept checkpoints' token after migration: ok=%v err=%v", ok, err)
	}
	c, ok, err := cp.Save(ctx, driver.CheckpointInput{TaskID: "t", Token: 5})
	if err != nil || !ok || c.Sequence != 4 {
		t.Fatalf("save after migration: %+v ok=%v err=%v, want sequence 4", c, ok, err)
	}
	var fence, last int64
	if err := db.QueryRow(`SELECT fence_token, last_sequence FROM go_goscope_checkpoint_tasks WHERE namespace = 'ns:' AND task_id = 'ns:t'`).Scan(&fence, &last); err != nil || fence != 5 || last != 4 {
		t.Fatalf("fence row: token %d last sequence %d, %v; want 5 and 4", fence, last, err)
	}

	// Another program appends sequence 10 without touching the fence row.
	if _, err := db.Exec(`INSERT INTO go_goscope_checkpoints (namespace, id, task_id, sequence, timestamp, progress, data, token)
		VALUES ('ns:', 'ns:t:10', 'ns:t', 10, 0, 0, x'', 0)`); err != nil {
		t.Fatal(err)
	}
	if c, ok, err := cp.Save(ctx, driver.CheckpointInput{TaskID: "t", Token: 5}); err != nil || !ok || c.Sequence != 11 {
		t.Fatalf("save after a foreign checkpoint: %+v ok=%v err=%v, want sequence 11", c, ok, err)
	}
}

// TestCheckpointFencePurge: Purge deletes the fence rows of tasks without
// checkpoints once idle for the retention, and no other.
func TestCheckpointFencePurge(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, &Options{Prefix: "p:", Tables: Tables{CheckpointTasks: "my_fences"}})
	other := openAt(t, path, &Options{Prefix: "q:", Tables: Tables{CheckpointTasks: "my_fences"}})
	cp := st.Checkpoints()
	if ok, err := cp.Fence(ctx, "idle", 9); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ok, err := other.Checkpoints().Fence(ctx, "idle", 9); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, ok, err := cp.Save(ctx, driver.CheckpointInput{TaskID: "busy", Token: 9}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	db := st.Driver().(*store).db
	count := func(ns string) int {
		t.Helper()
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM my_fences WHERE namespace = ?`, ns).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n, p := count("p:"), count("q:"); n != 2 || p != 1 {
		t.Fatalf("fence rows %d and %d, want 2 and 1", n, p)
	}
	if n, err := st.Purge(ctx, time.Hour); err != nil || n != 0 || count("p:") != 2 {
		t.Fatalf("Purge(1h) = %d, %v; %d fence rows left, want none purged", n, err, count("p:"))
	}
	time.Sleep(5 * time.Millisecond) // let the fences become idle for 1 ms
	if n, err := st.Purge(ctx, time.Millisecond); err != nil || n != 1 {
		t.Fatalf("Purge(1ms) = %d, %v; want 1 (the idle fence)", n, err)
	}
	if n, p := count("p:"), count("q:"); n != 1 || p != 1 {
		t.Fatalf("after Purge: fence rows %d and %d, want 1 (the task with a checkpoint) and 1 (other namespace)", n, p)
	}
	if ok, err := cp.Fence(ctx, "busy", 8); err != nil || ok {
		t.Fatalf("fence of a task with checkpoints forgotten by Purge: ok=%v err=%v", ok, err)
	}
}
