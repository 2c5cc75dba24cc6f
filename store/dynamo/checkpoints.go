package dynamo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden/driver"
)

// checkpoints is the checkpoint driver. A task's checkpoints are items
// under pk CHECKPOINT#<prefix>checkpoint:<task> with the sequence as sk,
// zero-padded to 19 digits so that one Query returns them in numeric
// order; they carry seq, time, progress, data, eta and token. The task's
// fence item (same pk, sk FENCE) holds the fence token, the last sequence
// assigned (seq), updatedAt and deletedThrough.
//
// A save is two writes, so a save that passed the fence may put its
// checkpoint after a later Fence, and even after the new holder's
// DeleteAll. Deletions therefore first raise the fence item's
// deletedThrough to the highest sequence they delete (conditional on
// fence ≤ token, which is the deletion's fence check), then delete; reads
// (Load, Latest, List, Tasks) read deletedThrough after the checkpoints
// and skip those at or below it. A late put is then never seen, and the
// next deletion removes it.
type checkpoints struct{ s *store }

// aDone is the fence item's deletedThrough: every checkpoint with a
// sequence at or below it is deleted (or, written late, to be ignored and
// deleted).
const aDone = "deletedThrough"

// errCheckpointRace is returned when a deletion's conditional update
// failed on every attempt (extremely contended).
var errCheckpointRace = errors.New("dynamo: checkpoint fence changed on every attempt; try again")

// pauses holds test hooks (set by export_test.go): checkpoint pk → a
// function that the task's next Save, Cleanup or DeleteAll calls once,
// between its write of the fence item and its next write.
var pauses sync.Map

func pauseBetween(pk string) {
	if f, ok := pauses.LoadAndDelete(pk); ok {
		f.(func())()
	}
}

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
// but not every endpoint has them): it has an older sequence than the new
// holder's saves, and if a deletion has covered its sequence meanwhile,
// reads ignore it (see checkpoints).
func (c checkpoints) Save(ctx context.Context, in driver.CheckpointInput) (driver.Checkpoint, bool, error) {
	s := c.s
	pk := s.cpPfx + in.TaskID
	now := nowMs()
	req := reqID()
	vals := item{":one": vN(1), ":now": vN(now), ":tok": vN(in.Token), ":zero": vN(0), ":req": vS(req)}
	lpk := lpkSet(s.cpPfx, vals)
	upd, cond := "SET #fence = if_not_exists(#fence, :zero), #updatedAt = :now, #req = :req"+lpk+" ADD #seq :one", notMine
	if in.Token > 0 {
		upd = "SET #fence = :tok, #updatedAt = :now, #req = :req" + lpk + " ADD #seq :one"
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
	pauseBetween(pk)
	seq := gN(attrs, aSeq)
	it := itemKey(pk, seqSK(seq))
	it[aSeq], it[aTime], it[aProgress], it[aToken] = vN(seq), vN(now), vF(in.Progress), vN(in.Token)
	it[aLpk] = vS(s.cpPfx)
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
	vals := item{":tok": vN(token), ":now": vN(nowMs()), ":zero": vN(0)}
	_, failed, _, err := c.s.update(ctx, "fencing task", c.s.cpPfx+taskID, fenceSK,
		"SET #fence = :tok, #updatedAt = :now, #seq = if_not_exists(#seq, :zero)"+lpkSet(c.s.cpPfx, vals),
		"attribute_not_exists(#fence) OR #fence <= :tok", vals, types.ReturnValueNone)
	return err == nil && !failed, err
}

// floor returns the task's deletedThrough (0 without a fence item), read
// with one consistent GetItem. Readers call it after reading checkpoints:
// a checkpoint at or below it was deleted, or is a late write of a save
// that a deletion overtook.
func (c checkpoints) floor(ctx context.Context, pk string) (int64, error) {
	it, err := c.s.get(ctx, "reading checkpoint fence", pk, fenceSK)
	return gN(it, aDone), err
}

// Load implements driver.Checkpoints: one consistent GetItem, then the
// task's deletedThrough.
func (c checkpoints) Load(ctx context.Context, id string) (driver.Checkpoint, bool, error) {
	task, seq, ok := driver.ParseCheckpointID(id)
	if !ok {
		return driver.Checkpoint{}, false, nil
	}
	pk := c.s.cpPfx + task
	it, err := c.s.get(ctx, "loading checkpoint", pk, seqSK(seq))
	if err != nil || it == nil {
		return driver.Checkpoint{}, false, err
	}
	fl, err := c.floor(ctx, pk)
	if err != nil || seq <= fl {
		return driver.Checkpoint{}, false, err
	}
	return c.rec(task, it), true, nil
}

// Latest implements driver.Checkpoints: one Query, newest first, Limit 1,
// then the task's deletedThrough; if that covers it (a late write), the
// newest one above deletedThrough, and so on.
func (c checkpoints) Latest(ctx context.Context, taskID string) (driver.Checkpoint, bool, error) {
	pk := c.s.cpPfx + taskID
	var above int64
	for range 100 {
		var cp driver.Checkpoint
		found := false
		err := c.s.query(ctx, "loading latest checkpoint", pk, seqSK(above+1), seqTo, false, 1, func(it item) (bool, error) {
			cp, found = c.rec(taskID, it), true
			return false, nil
		})
		if err != nil || !found {
			return driver.Checkpoint{}, false, err
		}
		fl, err := c.floor(ctx, pk)
		if err != nil {
			return driver.Checkpoint{}, false, err
		}
		if cp.Sequence > fl {
			return cp, true, nil
		}
		above = fl
	}
	return driver.Checkpoint{}, false, errCheckpointRace
}

// List implements driver.Checkpoints: a Query of the task's partition in
// sequence order, every page, then the task's deletedThrough, which
// filters them.
func (c checkpoints) List(ctx context.Context, taskID string) ([]driver.Checkpoint, error) {
	pk := c.s.cpPfx + taskID
	var out []driver.Checkpoint
	err := c.s.query(ctx, "listing checkpoints", pk, seqFrom, seqTo, true, 0, func(it item) (bool, error) {
		out = append(out, c.rec(taskID, it))
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	fl, err := c.floor(ctx, pk)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(out, func(cp driver.Checkpoint) bool { return cp.Sequence <= fl }), nil
}

// Cleanup implements driver.Checkpoints: one consistent GetItem of the
// fence item (refused if fence > token); for keep > 0 a Query newest
// first finds the newest sequence to drop; one UpdateItem raises
// deletedThrough to it under fence ≤ token (a failed condition: look
// again — refused if a newer holder fenced meanwhile); then a Query of the
// keys at or below it and BatchWriteItem deletes.
func (c checkpoints) Cleanup(ctx context.Context, taskID string, keep int, token int64) (int64, bool, error) {
	return c.deleteThrough(ctx, taskID, keep, token)
}

// DeleteAll implements driver.Checkpoints as Cleanup keeping none: the
// sequence to delete through is the fence item's seq.
func (c checkpoints) DeleteAll(ctx context.Context, taskID string, token int64) (int64, bool, error) {
	return c.deleteThrough(ctx, taskID, 0, token)
}

func (c checkpoints) deleteThrough(ctx context.Context, taskID string, keep int, token int64) (int64, bool, error) {
	s := c.s
	pk := s.cpPfx + taskID
	for range 100 {
		f, err := s.get(ctx, "reading checkpoint fence", pk, fenceSK)
		if err != nil {
			return 0, false, err
		}
		if f == nil {
			return 0, true, nil // saves write the fence item first: no checkpoint
		}
		if token > 0 && gN(f, aFence) > token {
			return 0, false, nil
		}
		done, through := gN(f, aDone), gN(f, aSeq)
		if keep > 0 {
			through = done // only late writes to remove, unless keep are above it
			n := 0
			err := s.query(ctx, "listing checkpoints", pk, seqSK(done+1), seqTo, false, 0, func(it item) (bool, error) {
				if n++; n > keep {
					through = gN(it, aSeq)
					return false, nil
				}
				return true, nil
			})
			if err != nil {
				return 0, false, err
			}
		}
		if through > done {
			cond := "attribute_exists(#seq) AND (attribute_not_exists(#deletedThrough) OR #deletedThrough < :thru)"
			if token > 0 {
				cond += " AND #fence <= :tok"
			}
			_, failed, _, err := s.update(ctx, "deleting checkpoints", pk, fenceSK, "SET #deletedThrough = :thru", cond,
				item{":thru": vN(through), ":tok": vN(token)}, types.ReturnValueNone)
			if err != nil {
				return 0, false, err
			}
			if failed {
				continue // fenced or deleted further meanwhile: look again
			}
		}
		pauseBetween(pk)
		var keys []item
		err = s.query(ctx, "listing checkpoints", pk, seqFrom, seqSK(through), true, 0, func(it item) (bool, error) {
			keys = append(keys, itemKey(pk, gS(it, aSk)))
			return true, nil
		})
		if err != nil {
			return 0, false, err
		}
		if err := s.deleteKeys(ctx, "deleting checkpoints", keys); err != nil {
			return 0, false, err
		}
		return int64(len(keys)), true, nil
	}
	return 0, false, errCheckpointRace
}

// Tasks implements driver.Checkpoints: the keys of the namespace's
// checkpoints (see walk: a Query of the list index; the sequences are in
// their sort keys), then consistent reads of those tasks' fence items
// (BatchGetItem); a task is listed if it has a checkpoint
// above its fence item's deletedThrough. (A fence read after the listing
// started, after a deletion returned, has a deletedThrough that covers
// every late write of the deletion's sequences, in whatever order the
// items are read.) A literal pattern is one task's Latest.
func (c checkpoints) Tasks(ctx context.Context, pattern driver.Pattern) ([]string, error) {
	s := c.s
	if lit, ok := pattern.Literal(); ok {
		_, found, err := c.Latest(ctx, lit)
		if err != nil || !found {
			return []string{}, err
		}
		return []string{lit}, nil
	}
	top := map[string]int64{}   // task → its highest sequence
	floor := map[string]int64{} // task → its deletedThrough
	want := func(pk, sk string) need {
		if t, ok := cutPrefix(pk, s.cpPfx); ok && sk != fenceSK && pattern.Match(t) {
			return keyOnly
		}
		return skip
	}
	err := s.walk(ctx, "listing tasks", []span{{s.cpPfx, pattern.Prefix()}}, want, func(pk, sk string, _ item) error {
		if seq, err := strconv.ParseInt(sk, 10, 64); err == nil {
			t, _ := cutPrefix(pk, s.cpPfx)
			top[t] = max(top[t], seq)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	fences := make([]item, 0, len(top))
	for t := range top {
		fences = append(fences, itemKey(s.cpPfx+t, fenceSK))
	}
	err = s.batchGet(ctx, "listing tasks", fences, func(it item) error {
		t, _ := cutPrefix(gS(it, aPk), s.cpPfx)
		floor[t] = gN(it, aDone)
		return nil
	})
	out := make([]string, 0, len(top))
	for t, seq := range top {
		if seq > floor[t] {
			out = append(out, t)
		}
	}
	sort.Strings(out)
	return out, err
}
