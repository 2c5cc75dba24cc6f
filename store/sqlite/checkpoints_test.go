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
