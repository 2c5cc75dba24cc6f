package mongo

import (
	"context"
	"errors"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/warden-go/warden/driver"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// checkpoints is the checkpoint driver.
//
// A checkpoint document: id (prefix + task + ":" + sequence), taskId
// (prefix + task), namespace, sequence, timestamp (Unix ms), progress,
// data (binary), estimatedTimeRemaining (ms), token. Each task's fence
// document (in the fences collection): taskId, namespace, fenceToken,
// lastSequence, updatedAt.
//
// Save is two round trips: one findOneAndUpdate on the fence document
// ($inc lastSequence, $max fenceToken, filtered on fenceToken ≤ token),
// which assigns the sequence atomically and refuses a stale token, then the
// checkpoint's insert. A task without a fence document (a new task, or
// checkpoints written by the go-go-scope adapter) gets one first, starting
// from its checkpoints' highest sequence and token.
//
// Because a save is two writes, a save that passed the fence may insert
// its checkpoint after a later Fence, and even after the new holder's
// DeleteAll. Deletions therefore first raise the fence document's
// deletedThrough to the highest sequence they delete (conditional on
// fenceToken ≤ token, which is the deletion's fence check), then delete;
// reads (Load, Latest, List, Tasks) read deletedThrough after the
// checkpoints and skip those at or below it. A late insert is then never
// seen, and the next deletion removes it.
type checkpoints struct{ s *store }

// pauses holds test hooks (set by export_test.go): stored task id → a
// function that the task's next Save, Cleanup or DeleteAll calls once,
// between its write of the fence document and its next write.
var pauses sync.Map

func pauseBetween(task string) {
	if f, ok := pauses.LoadAndDelete(task); ok {
		f.(func())()
	}
}

type cpDoc struct {
	TaskID   string  `bson:"taskId"`
	Sequence int64   `bson:"sequence"`
	Time     int64   `bson:"timestamp"`
	Progress float64 `bson:"progress"`
	Data     []byte  `bson:"data"`
	ETA      int64   `bson:"estimatedTimeRemaining"`
	Token    int64   `bson:"token"`
}

type fenceDoc struct {
	FenceToken   int64 `bson:"fenceToken"`
	LastSequence int64 `bson:"lastSequence"`
	// DeletedThrough: every checkpoint with a sequence at or below it is
	// deleted (or, written late, to be ignored and deleted).
	DeletedThrough int64 `bson:"deletedThrough"`
}

func (c checkpoints) cp(d *cpDoc) driver.Checkpoint {
	task := strings.TrimPrefix(d.TaskID, c.s.prefix)
	return driver.Checkpoint{ID: driver.CheckpointID(task, d.Sequence), TaskID: task, Sequence: d.Sequence,
		Time: time.UnixMilli(d.Time).UTC(), Progress: d.Progress, Data: nonNil(d.Data),
		ETA: time.Duration(d.ETA) * time.Millisecond, Token: d.Token}
}

// fenceKey is the filter of the task's fence document.
func (c checkpoints) fenceKey(task string) bson.D {
	return bson.D{{Key: "_id", Value: c.s.docID(c.s.prefix + task)}}
}

// cpKey is the filter of one checkpoint.
func (c checkpoints) cpKey(task string, seq int64) bson.D {
	return bson.D{{Key: "_id", Value: driver.CheckpointID(c.s.docID(c.s.prefix+task), seq)}}
}

func (c checkpoints) task(task string) bson.D {
	return bson.D{{Key: "taskId", Value: c.s.prefix + task}, {Key: "namespace", Value: c.s.prefix}}
}

// fenceStep runs one conditional update of the task's fence document. It
// returns the new document; found=false when the filter matched nothing:
// then the fence is read, and created from the task's checkpoints if the
// task has none, and refused=true reports a fence above token.
func (c checkpoints) fence(ctx context.Context, taskID string, token int64, update func(t time.Time) bson.D) (fenceDoc, bool, error) {
	s := c.s
	for range c.s.tries {
		t := now()
		f := c.fenceKey(taskID)
		if token > 0 {
			f = append(f, bson.E{Key: "fenceToken", Value: set("$lte", token)})
		}
		var d fenceDoc
		err := s.fences.FindOneAndUpdate(ctx, f, update(t), options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&d)
		if err == nil {
			return d, true, nil
		}
		if !errors.Is(err, mongo.ErrNoDocuments) {
			return fenceDoc{}, false, ctxErr(ctx, err)
		}
		err = s.fences.FindOne(ctx, c.fenceKey(taskID)).Decode(&d)
		switch {
		case err == nil && token > 0 && d.FenceToken > token:
			return d, false, nil
		case err == nil:
			continue // changed meanwhile
		case !errors.Is(err, mongo.ErrNoDocuments):
			return fenceDoc{}, false, ctxErr(ctx, err)
		}
		if err := c.initFence(ctx, taskID, t); err != nil {
			return fenceDoc{}, false, err
		}
	}
	return fenceDoc{}, false, c.s.busy("fencing checkpoint task", taskID)
}

// initFence creates the task's fence document from its checkpoints.
func (c checkpoints) initFence(ctx context.Context, taskID string, t time.Time) error {
	s := c.s
	var top, tok cpDoc
	err := s.cps.FindOne(ctx, c.task(taskID), options.FindOne().SetSort(set("sequence", -1))).Decode(&top)
	if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
		return ctxErr(ctx, err)
	}
	err = s.cps.FindOne(ctx, c.task(taskID), options.FindOne().SetSort(set("token", -1))).Decode(&tok)
	if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
		return ctxErr(ctx, err)
	}
	_, err = s.fences.InsertOne(ctx, append(append(c.fenceKey(taskID), c.task(taskID)...), bson.E{Key: "fenceToken", Value: tok.Token},
		bson.E{Key: "lastSequence", Value: top.Sequence}, bson.E{Key: "updatedAt", Value: t}))
	if err != nil && !isDup(err) {
		return ctxErr(ctx, err)
	}
	return nil
}

// Save implements driver.Checkpoints.
func (c checkpoints) Save(ctx context.Context, in driver.CheckpointInput) (driver.Checkpoint, bool, error) {
	s := c.s
	for range c.s.tries {
		f, ok, err := c.fence(ctx, in.TaskID, in.Token, func(t time.Time) bson.D {
			u := bson.D{{Key: "$inc", Value: set("lastSequence", int64(1))}, {Key: "$set", Value: set("updatedAt", t)}}
			if in.Token > 0 {
				u = append(u, bson.E{Key: "$max", Value: set("fenceToken", in.Token)})
			}
			return u
		})
		if err != nil || !ok {
			return driver.Checkpoint{}, false, err
		}
		pauseBetween(s.prefix + in.TaskID)
		t := now()
		d := cpDoc{TaskID: s.prefix + in.TaskID, Sequence: f.LastSequence, Time: t.UnixMilli(), Progress: in.Progress,
			Data: nonNil(in.Data), ETA: driver.Millis(in.ETA), Token: in.Token}
		_, err = s.cps.InsertOne(ctx, bson.D{
			{Key: "_id", Value: c.cpKey(in.TaskID, d.Sequence)[0].Value},
			{Key: "id", Value: driver.CheckpointID(d.TaskID, d.Sequence)}, {Key: "taskId", Value: d.TaskID},
			{Key: "namespace", Value: s.prefix}, {Key: "sequence", Value: d.Sequence}, {Key: "timestamp", Value: d.Time},
			{Key: "progress", Value: d.Progress}, {Key: "data", Value: d.Data},
			{Key: "estimatedTimeRemaining", Value: d.ETA}, {Key: "token", Value: d.Token}})
		if isDup(err) {
			continue // a checkpoint written without the fence holds this sequence: take the next
		}
		if err != nil {
			return driver.Checkpoint{}, false, ctxErr(ctx, err)
		}
		return c.cp(&d), true, nil
	}
	return driver.Checkpoint{}, false, c.s.busy("saving checkpoint of task", in.TaskID)
}

// Fence implements driver.Checkpoints: one findOneAndUpdate filtered on
// fenceToken ≤ token.
func (c checkpoints) Fence(ctx context.Context, taskID string, token int64) (bool, error) {
	_, ok, err := c.fence(ctx, taskID, token, func(t time.Time) bson.D {
		return bson.D{{Key: "$max", Value: set("fenceToken", token)}, {Key: "$set", Value: set("updatedAt", t)}}
	})
	return ok, err
}

func (c checkpoints) one(ctx context.Context, filter bson.D, o *options.FindOneOptionsBuilder) (driver.Checkpoint, bool, error) {
	var d cpDoc
	err := c.s.cps.FindOne(ctx, filter, o).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return driver.Checkpoint{}, false, nil
	}
	if err != nil {
		return driver.Checkpoint{}, false, ctxErr(ctx, err)
	}
	return c.cp(&d), true, nil
}

// floor returns the task's deletedThrough (0 without a fence document).
// Readers call it after reading checkpoints: a checkpoint at or below it
// was deleted, or is a late write of a save that a deletion overtook.
func (c checkpoints) floor(ctx context.Context, taskID string) (int64, error) {
	var d fenceDoc
	err := c.s.fences.FindOne(ctx, c.fenceKey(taskID), options.FindOne().SetProjection(set("deletedThrough", 1))).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return 0, nil
	}
	if err != nil {
		return 0, ctxErr(ctx, err)
	}
	return d.DeletedThrough, nil
}

// Load implements driver.Checkpoints: the checkpoint, then the task's
// deletedThrough.
func (c checkpoints) Load(ctx context.Context, id string) (driver.Checkpoint, bool, error) {
	task, seq, ok := driver.ParseCheckpointID(id)
	if !ok {
		return driver.Checkpoint{}, false, nil
	}
	cp, found, err := c.one(ctx, c.cpKey(task, seq), options.FindOne())
	if err != nil || !found {
		return driver.Checkpoint{}, false, err
	}
	fl, err := c.floor(ctx, task)
	if err != nil || cp.Sequence <= fl {
		return driver.Checkpoint{}, false, err
	}
	return cp, true, nil
}

// Latest implements driver.Checkpoints: the checkpoint with the highest
// sequence, then the task's deletedThrough; if that covers it (a late
// write), the highest one above deletedThrough, and so on.
func (c checkpoints) Latest(ctx context.Context, taskID string) (driver.Checkpoint, bool, error) {
	var above int64
	for range c.s.tries {
		f := append(c.task(taskID), bson.E{Key: "sequence", Value: set("$gt", above)})
		cp, found, err := c.one(ctx, f, options.FindOne().SetSort(set("sequence", -1)))
		if err != nil || !found {
			return driver.Checkpoint{}, false, err
		}
		fl, err := c.floor(ctx, taskID)
		if err != nil {
			return driver.Checkpoint{}, false, err
		}
		if cp.Sequence > fl {
			return cp, true, nil
		}
		above = fl
	}
	return driver.Checkpoint{}, false, c.s.busy("reading the latest checkpoint of task", taskID)
}

// List implements driver.Checkpoints: the checkpoints, then the task's
// deletedThrough, which filters them.
func (c checkpoints) List(ctx context.Context, taskID string) ([]driver.Checkpoint, error) {
	var out []driver.Checkpoint
	err := findAll(ctx, c.s.cps, c.task(taskID), nil, func(d *cpDoc) { out = append(out, c.cp(d)) })
	if err != nil {
		return nil, err
	}
	fl, err := c.floor(ctx, taskID)
	if err != nil {
		return nil, err
	}
	out = slices.DeleteFunc(out, func(cp driver.Checkpoint) bool { return cp.Sequence <= fl })
	sort.Slice(out, func(i, j int) bool { return out[i].Sequence < out[j].Sequence })
	return out, nil
}

// Cleanup implements driver.Checkpoints: read the fence document (refused
// if fenceToken > token), find the newest sequence to drop, raise
// deletedThrough to it with one update filtered on fenceToken ≤ token
// (refused if that matches nothing: a newer holder fenced meanwhile),
// then delete the checkpoints at or below it: 3–4 round trips.
func (c checkpoints) Cleanup(ctx context.Context, taskID string, keep int, token int64) (int64, bool, error) {
	return c.deleteThrough(ctx, taskID, keep, token)
}

// DeleteAll implements driver.Checkpoints as Cleanup keeping none: the
// sequence to delete through is the fence document's lastSequence.
func (c checkpoints) DeleteAll(ctx context.Context, taskID string, token int64) (int64, bool, error) {
	return c.deleteThrough(ctx, taskID, 0, token)
}

func (c checkpoints) deleteThrough(ctx context.Context, taskID string, keep int, token int64) (int64, bool, error) {
	s := c.s
	for range c.s.tries {
		var fd fenceDoc
		err := s.fences.FindOne(ctx, c.fenceKey(taskID)).Decode(&fd)
		if errors.Is(err, mongo.ErrNoDocuments) {
			// No fence document: no checkpoint, or only checkpoints
			// written without one (go-go-scope), which get one first.
			err = s.cps.FindOne(ctx, c.task(taskID), options.FindOne().SetProjection(set("sequence", 1))).Err()
			if errors.Is(err, mongo.ErrNoDocuments) {
				return 0, true, nil
			}
			if err == nil {
				err = c.initFence(ctx, taskID, now())
			}
			if err != nil {
				return 0, false, ctxErr(ctx, err)
			}
			continue
		}
		if err != nil {
			return 0, false, ctxErr(ctx, err)
		}
		if token > 0 && fd.FenceToken > token {
			return 0, false, nil
		}
		through := fd.LastSequence
		if keep > 0 {
			var d cpDoc
			err := s.cps.FindOne(ctx, append(c.task(taskID), bson.E{Key: "sequence", Value: set("$gt", fd.DeletedThrough)}),
				options.FindOne().SetSort(set("sequence", -1)).SetSkip(int64(keep)).SetProjection(set("sequence", 1))).Decode(&d)
			switch {
			case errors.Is(err, mongo.ErrNoDocuments):
				through = fd.DeletedThrough // only late writes to remove
			case err != nil:
				return 0, false, ctxErr(ctx, err)
			default:
				through = d.Sequence
			}
		}
		if through > fd.DeletedThrough {
			f := c.fenceKey(taskID)
			if token > 0 {
				f = append(f, bson.E{Key: "fenceToken", Value: set("$lte", token)})
			}
			res, err := s.fences.UpdateOne(ctx, f, bson.D{{Key: "$max", Value: set("deletedThrough", through)}})
			if err != nil {
				return 0, false, ctxErr(ctx, err)
			}
			if res.MatchedCount == 0 {
				continue // fenced meanwhile (refused on the next look) or purged
			}
		}
		pauseBetween(s.prefix + taskID)
		res, err := s.cps.DeleteMany(ctx, append(c.task(taskID), bson.E{Key: "sequence", Value: set("$lte", through)}))
		if err != nil {
			return 0, false, ctxErr(ctx, err)
		}
		return res.DeletedCount, true, nil
	}
	return 0, false, c.s.busy("deleting checkpoints of task", taskID)
}

// Tasks implements driver.Checkpoints: the task ids and sequences of the
// namespace's checkpoints (an index range), then the deletedThrough of
// those tasks (one find by _id per 500 tasks); a task is listed if it has
// a checkpoint above its deletedThrough.
func (c checkpoints) Tasks(ctx context.Context, pattern driver.Pattern) ([]string, error) {
	s := c.s
	top := map[string]int64{} // task → its highest sequence
	err := findAll(ctx, s.cps, s.keyRange("taskId", s.prefix+pattern.Prefix()), set("taskId", 1, "sequence", 1), func(d *cpDoc) {
		if id, ok := strings.CutPrefix(d.TaskID, s.prefix); ok && pattern.Match(id) {
			top[id] = max(top[id], d.Sequence)
		}
	})
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(top))
	for id := range top {
		ids = append(ids, id)
	}
	floors := map[string]int64{}
	for chunk := range slices.Chunk(ids, 500) {
		byDoc := make(map[string]string, len(chunk))
		in := make(bson.A, 0, len(chunk))
		for _, id := range chunk {
			doc := s.docID(s.prefix + id)
			byDoc[doc] = id
			in = append(in, doc)
		}
		type floorDoc struct {
			ID             string `bson:"_id"`
			DeletedThrough int64  `bson:"deletedThrough"`
		}
		err := findAll(ctx, s.fences, bson.D{{Key: "_id", Value: set("$in", in)}}, set("deletedThrough", 1), func(d *floorDoc) {
			floors[byDoc[d.ID]] = d.DeletedThrough
		})
		if err != nil {
			return nil, err
		}
	}
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if top[id] > floors[id] {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out, nil
}
