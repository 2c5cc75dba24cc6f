package dynamo

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden/driver"
)

// checkpoints is the checkpoint driver. A task's checkpoints are items
// under pk CHECKPOINT#<prefix>checkpoint:<task> with the sequence as sk,
// zero-padded to 19 digits so that one Query returns them in numeric
// order; they carry seq, time, progress, data, eta and token. The task's
// fence item (same pk, sk FENCE) holds the fence token, the last sequence
// assigned (seq) and updatedAt.
type checkpoints struct{ s *store }

const (
	seqFrom = "0000000000000000000"
	seqTo   = "9999999999999999999"
)

func seqSK(seq int64) string { return fmt.Sprintf("%019d", seq) }

func (c checkpoints) rec(task string, it item) driver.Checkpoint {
	seq := gN(it, aSeq)
	return driver.Checkpoint{
		ID: driver.CheckpointID(task, seq), TaskID: task, Sequence: seq, Time: msTime(gN(it, aTime)),
		Progress: gF(it, aProgress), Data: gB(it, aData), ETA: time.Duration(gN(it, aEta)) * time.Millisecond,
		Token: gN(it, aToken),
	}
}

// Save implements driver.Checkpoints in two round trips: one conditional
// UpdateItem of the fence item decides whether the save is refused, raises
// the fence and assigns the sequence (ADD, so concurrent savers never
// share one); then one PutItem writes the checkpoint. A save whose fence
// update passed before another holder's Fence may land its checkpoint
// after that Fence returns (DynamoDB transactions would close the window,
// but not every endpoint has them).
func (c checkpoints) Save(ctx context.Context, in driver.CheckpointInput) (driver.Checkpoint, bool, error) {
	s := c.s
	pk := s.cpPfx + in.TaskID
	now := nowMs()
	req := reqID()
	vals := item{":one": vN(1), ":now": vN(now), ":tok": vN(in.Token), ":zero": vN(0), ":req": vS(req)}
	upd, cond := "SET #fence = if_not_exists(#fence, :zero), #updatedAt = :now, #req = :req ADD #seq :one", notMine
	if in.Token > 0 {
		upd = "SET #fence = :tok, #updatedAt = :now, #req = :req ADD #seq :one"
		cond = "(attribute_not_exists(#fence) OR #fence <= :tok) AND " + notMine
	}
	attrs, failed, old, err := s.update(ctx, "saving checkpoint", pk, fenceSK, upd, cond, vals, types.ReturnValueAllNew)
	if err != nil {
		return driver.Checkpoint{}, false, err
	}
	if failed {
		// Refused, or the SDK resent an update that had applied.
		if old == nil {
			if old, err = s.get(ctx, "reading checkpoint fence", pk, fenceSK); err != nil {
				return driver.Checkpoint{}, false, err
			}
		}
		if old == nil || gS(old, aReq) != req {
			return driver.Checkpoint{}, false, nil
		}
		attrs = old
	}
	seq := gN(attrs, aSeq)
	it := itemKey(pk, seqSK(seq))
	it[aSeq], it[aTime], it[aProgress], it[aToken] = vN(seq), vN(now), vF(in.Progress), vN(in.Token)
	if len(in.Data) > 0 {
		it[aData] = vB(in.Data)
	}
	if in.ETA > 0 {
		it[aEta] = vN(driver.Millis(in.ETA))
	}
	if _, err := s.put(ctx, "saving checkpoint", it, "", nil); err != nil {
		return driver.Checkpoint{}, false, err
	}
	return c.rec(in.TaskID, it), true, nil
}

// Fence implements driver.Checkpoints: one conditional UpdateItem.
func (c checkpoints) Fence(ctx context.Context, taskID string, token int64) (bool, error) {
	_, failed, _, err := c.s.update(ctx, "fencing task", c.s.cpPfx+taskID, fenceSK,
		"SET #fence = :tok, #updatedAt = :now, #seq = if_not_exists(#seq, :zero)",
		"attribute_not_exists(#fence) OR #fence <= :tok",
		item{":tok": vN(token), ":now": vN(nowMs()), ":zero": vN(0)}, types.ReturnValueNone)
	return err == nil && !failed, err
}

// Load implements driver.Checkpoints: one consistent GetItem.
func (c checkpoints) Load(ctx context.Context, id string) (driver.Checkpoint, bool, error) {
	task, seq, ok := driver.ParseCheckpointID(id)
	if !ok {
		return driver.Checkpoint{}, false, nil
	}
	it, err := c.s.get(ctx, "loading checkpoint", c.s.cpPfx+task, seqSK(seq))
	if err != nil || it == nil {
		return driver.Checkpoint{}, false, err
	}
	return c.rec(task, it), true, nil
}

// Latest implements driver.Checkpoints: one Query, newest first, Limit 1.
func (c checkpoints) Latest(ctx context.Context, taskID string) (driver.Checkpoint, bool, error) {
	var cp driver.Checkpoint
	found := false
	err := c.s.query(ctx, "loading latest checkpoint", c.s.cpPfx+taskID, seqFrom, seqTo, false, 1, func(it item) (bool, error) {
		cp, found = c.rec(taskID, it), true
		return false, nil
	})
	return cp, found && err == nil, err
}

// List implements driver.Checkpoints: a Query of the task's partition in
// sequence order, every page.
func (c checkpoints) List(ctx context.Context, taskID string) ([]driver.Checkpoint, error) {
	var out []driver.Checkpoint
	err := c.s.query(ctx, "listing checkpoints", c.s.cpPfx+taskID, seqFrom, seqTo, true, 0, func(it item) (bool, error) {
		out = append(out, c.rec(taskID, it))
		return true, nil
	})
	return out, err
}

// Cleanup implements driver.Checkpoints: a Query newest first, then
// BatchWriteItem deletes of all but the keep newest.
func (c checkpoints) Cleanup(ctx context.Context, taskID string, keep int) (int64, error) {
	return c.deleteOlder(ctx, taskID, keep)
}

// DeleteAll implements driver.Checkpoints.
func (c checkpoints) DeleteAll(ctx context.Context, taskID string) (int64, error) {
	return c.deleteOlder(ctx, taskID, 0)
}

func (c checkpoints) deleteOlder(ctx context.Context, taskID string, keep int) (int64, error) {
	s := c.s
	pk := s.cpPfx + taskID
	var keys []item
	n := 0
	err := s.query(ctx, "listing checkpoints", pk, seqFrom, seqTo, false, 0, func(it item) (bool, error) {
		n++
		if n > keep {
			keys = append(keys, itemKey(pk, gS(it, aSk)))
		}
		return true, nil
	})
	if err != nil {
		return 0, err
	}
	if err := s.deleteKeys(ctx, "deleting checkpoints", keys); err != nil {
		return 0, err
	}
	return int64(len(keys)), nil
}

// Tasks implements driver.Checkpoints: a filtered Scan (see locks.List).
func (c checkpoints) Tasks(ctx context.Context, pattern driver.Pattern) ([]string, error) {
	s := c.s
	if lit, ok := pattern.Literal(); ok {
		found := false
		err := s.query(ctx, "listing tasks", s.cpPfx+lit, seqFrom, seqTo, true, 1, func(item) (bool, error) {
			found = true
			return false, nil
		})
		if err != nil || !found {
			return []string{}, err
		}
		return []string{lit}, nil
	}
	seen := map[string]bool{}
	err := s.scan(ctx, "listing tasks", func(it item) error {
		t, ok := cutPrefix(gS(it, aPk), s.cpPfx)
		if ok && gS(it, aSk) != fenceSK && pattern.Match(t) {
			seen[t] = true
		}
		return nil
	}, s.cpPfx+pattern.Prefix())
	out := make([]string, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	sort.Strings(out)
	return out, err
}
