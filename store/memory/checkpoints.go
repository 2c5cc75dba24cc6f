package memory

import (
	"context"
	"sort"
	"time"

	"github.com/warden-go/warden/driver"
)

// cpCopy returns a copy of cp that shares no memory with the store.
func cpCopy(cp driver.Checkpoint) driver.Checkpoint {
	cp.Data = clone(cp.Data)
	return cp
}

// checkpoints is the store's checkpoint driver. A task's checkpoints are
// kept in sequence order; its fence record (space.fences) holds the
// greatest token saved or fenced and the last sequence assigned, and
// outlives the checkpoints.
type checkpoints store

func (c *checkpoints) s() *store { return (*store)(c) }

// fence is a task's fence record.
type fence struct {
	token     int64     // the greatest token saved or fenced
	lastSeq   int64     // the last sequence assigned
	updatedAt time.Time // when token or lastSeq last changed
}

// fenceOf returns the task's fence record, creating an empty one; db.mu is
// held. A task with checkpoints always has a record: Purge deletes only
// the records of tasks without checkpoints.
func fenceOf(sp *space, taskID string) *fence {
	f := sp.fences[taskID]
	if f == nil {
		f = &fence{}
		sp.fences[taskID] = f
	}
	return f
}

// Save stores a checkpoint with the task's next sequence, unless in.Token
// (> 0) is below the task's fence.
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
	f := fenceOf(sp, in.TaskID)
	if in.Token > 0 && in.Token < f.token {
		return driver.Checkpoint{}, false, nil
	}
	f.token = max(f.token, in.Token)
	f.lastSeq++
	f.updatedAt = now
	seq := f.lastSeq
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
	sp.tasks[in.TaskID] = append(sp.tasks[in.TaskID], cp)
	return cpCopy(cp), true, nil
}

// Fence raises the task's fence to token if token is at least the fence.
func (c *checkpoints) Fence(ctx context.Context, taskID string, token int64) (bool, error) {
	s := c.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return false, err
	}
	defer s.end()
	f := fenceOf(sp, taskID)
	if token < f.token {
		return false, nil
	}
	if token > f.token || f.updatedAt.IsZero() {
		f.token = token
		f.updatedAt = now
	}
	return true, nil
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

// fenced reports whether a deletion with token may proceed: token 0, or
// not below the task's fence; db.mu is held.
func fenced(sp *space, taskID string, token int64) bool {
	f := sp.fences[taskID]
	return token == 0 || f == nil || token >= f.token
}

// Cleanup deletes all but the keep newest checkpoints of the task, unless
// token (> 0) is below the task's fence. Saves are atomic here, so no save
// can land after the deletion.
func (c *checkpoints) Cleanup(ctx context.Context, taskID string, keep int, token int64) (int64, bool, error) {
	s := c.s()
	sp, _, err := s.begin(ctx)
	if err != nil {
		return 0, false, err
	}
	defer s.end()
	if !fenced(sp, taskID, token) {
		return 0, false, nil
	}
	cps := sp.tasks[taskID]
	if keep < 0 {
		keep = 0
	}
	if len(cps) <= keep {
		return 0, true, nil
	}
	n := len(cps) - keep
	if keep == 0 {
		delete(sp.tasks, taskID)
	} else {
		sp.tasks[taskID] = append([]driver.Checkpoint(nil), cps[n:]...)
	}
	return int64(n), true, nil
}

// DeleteAll deletes every checkpoint of the task, unless token (> 0) is
// below the task's fence.
func (c *checkpoints) DeleteAll(ctx context.Context, taskID string, token int64) (int64, bool, error) {
	s := c.s()
	sp, _, err := s.begin(ctx)
	if err != nil {
		return 0, false, err
	}
	defer s.end()
	if !fenced(sp, taskID, token) {
		return 0, false, nil
	}
	n := len(sp.tasks[taskID])
	delete(sp.tasks, taskID)
	return int64(n), true, nil
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
