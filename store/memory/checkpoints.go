package memory

import (
	"context"
	"sort"

	"github.com/warden-go/warden/driver"
)

// cpCopy returns a copy of cp that shares no memory with the store.
func cpCopy(cp driver.Checkpoint) driver.Checkpoint {
	cp.Data = clone(cp.Data)
	return cp
}

// checkpoints is the store's checkpoint driver. A task's checkpoints are
// kept in sequence order; the next sequence is one more than the highest
// kept (1 for a task without checkpoints).
type checkpoints store

func (c *checkpoints) s() *store { return (*store)(c) }

// Save stores a checkpoint with the task's next sequence, unless a kept
// checkpoint carries a greater fencing token than in.Token (> 0).
func (c *checkpoints) Save(ctx context.Context, in driver.CheckpointInput) (driver.Checkpoint, bool, error) {
	s := c.s()
	if err := s.checkValue(in.Data); err != nil {
		return driver.Checkpoint{}, false, err
	}
	sp, now, err := s.begin(ctx)
	if err != nil {
		return driver.Checkpoint{}, false, err
	}
	defer s.end()
	cps := sp.tasks[in.TaskID]
	var seq int64 = 1
	if n := len(cps); n > 0 {
		seq = cps[n-1].Sequence + 1
	}
	if in.Token > 0 {
		for _, cp := range cps {
			if cp.Token > in.Token {
				return driver.Checkpoint{}, false, nil
			}
		}
	}
	cp := driver.Checkpoint{
		ID:       driver.CheckpointID(in.TaskID, seq),
		TaskID:   in.TaskID,
		Sequence: seq,
		Time:     now,
		Progress: in.Progress,
		Data:     clone(in.Data),
		ETA:      in.ETA,
		Token:    in.Token,
	}
	sp.tasks[in.TaskID] = append(cps, cp)
	return cpCopy(cp), true, nil
}

// find returns the index of the task's checkpoint with seq, or -1.
func find(cps []driver.Checkpoint, seq int64) int {
	i := sort.Search(len(cps), func(i int) bool { return cps[i].Sequence >= seq })
	if i < len(cps) && cps[i].Sequence == seq {
		return i
	}
	return -1
}

// Load returns the checkpoint with this id.
func (c *checkpoints) Load(ctx context.Context, id string) (driver.Checkpoint, bool, error) {
	s := c.s()
	sp, _, err := s.begin(ctx)
	if err != nil {
		return driver.Checkpoint{}, false, err
	}
	defer s.end()
	task, seq, ok := driver.ParseCheckpointID(id)
	if !ok {
		return driver.Checkpoint{}, false, nil
	}
	cps := sp.tasks[task]
	i := find(cps, seq)
	if i < 0 {
		return driver.Checkpoint{}, false, nil
	}
	return cpCopy(cps[i]), true, nil
}

// Latest returns the task's checkpoint with the highest sequence.
func (c *checkpoints) Latest(ctx context.Context, taskID string) (driver.Checkpoint, bool, error) {
	s := c.s()
	sp, _, err := s.begin(ctx)
	if err != nil {
		return driver.Checkpoint{}, false, err
	}
	defer s.end()
	cps := sp.tasks[taskID]
	if len(cps) == 0 {
		return driver.Checkpoint{}, false, nil
	}
	return cpCopy(cps[len(cps)-1]), true, nil
}

// List returns the task's checkpoints in increasing sequence.
func (c *checkpoints) List(ctx context.Context, taskID string) ([]driver.Checkpoint, error) {
	s := c.s()
	sp, _, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer s.end()
	cps := sp.tasks[taskID]
	out := make([]driver.Checkpoint, len(cps))
	for i, cp := range cps {
		out[i] = cpCopy(cp)
	}
	return out, nil
}

// Cleanup deletes all but the keep newest checkpoints of the task.
func (c *checkpoints) Cleanup(ctx context.Context, taskID string, keep int) (int64, error) {
	s := c.s()
	sp, _, err := s.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer s.end()
	cps := sp.tasks[taskID]
	if keep < 0 {
		keep = 0
	}
	if len(cps) <= keep {
		return 0, nil
	}
	n := len(cps) - keep
	if keep == 0 {
		delete(sp.tasks, taskID)
	} else {
		sp.tasks[taskID] = append([]driver.Checkpoint(nil), cps[n:]...)
	}
	return int64(n), nil
}

// DeleteAll deletes every checkpoint of the task.
func (c *checkpoints) DeleteAll(ctx context.Context, taskID string) (int64, error) {
	s := c.s()
	sp, _, err := s.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer s.end()
	n := len(sp.tasks[taskID])
	delete(sp.tasks, taskID)
	return int64(n), nil
}

// Tasks returns the ids of tasks with checkpoints matching pattern, sorted.
func (c *checkpoints) Tasks(ctx context.Context, pattern driver.Pattern) ([]string, error) {
	s := c.s()
	sp, _, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer s.end()
	ids := []string{}
	for id, cps := range sp.tasks {
		if len(cps) > 0 && pattern.Match(id) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}
