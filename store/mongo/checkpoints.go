package mongo

import (
	"context"
	"errors"
	"sort"
	"strings"
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
type checkpoints struct{ s *store }

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
	for range retryLimit {
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
	return fenceDoc{}, false, errBusy
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
	for range retryLimit {
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
	return driver.Checkpoint{}, false, errBusy
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

// Load implements driver.Checkpoints.
func (c checkpoints) Load(ctx context.Context, id string) (driver.Checkpoint, bool, error) {
	task, seq, ok := driver.ParseCheckpointID(id)
	if !ok {
		return driver.Checkpoint{}, false, nil
	}
	return c.one(ctx, c.cpKey(task, seq), options.FindOne())
}

// Latest implements driver.Checkpoints.
func (c checkpoints) Latest(ctx context.Context, taskID string) (driver.Checkpoint, bool, error) {
	return c.one(ctx, c.task(taskID), options.FindOne().SetSort(set("sequence", -1)))
}

// List implements driver.Checkpoints.
func (c checkpoints) List(ctx context.Context, taskID string) ([]driver.Checkpoint, error) {
	var out []driver.Checkpoint
	err := findAll(ctx, c.s.cps, c.task(taskID), nil, func(d *cpDoc) { out = append(out, c.cp(d)) })
	sort.Slice(out, func(i, j int) bool { return out[i].Sequence < out[j].Sequence })
	return out, err
}

// Cleanup implements driver.Checkpoints.
func (c checkpoints) Cleanup(ctx context.Context, taskID string, keep int) (int64, error) {
	s := c.s
	f := c.task(taskID)
	if keep > 0 {
		var d cpDoc
		err := s.cps.FindOne(ctx, f, options.FindOne().SetSort(set("sequence", -1)).SetSkip(int64(keep)).
			SetProjection(set("sequence", 1))).Decode(&d)
		if errors.Is(err, mongo.ErrNoDocuments) {
			return 0, nil
		}
		if err != nil {
			return 0, ctxErr(ctx, err)
		}
		f = append(f, bson.E{Key: "sequence", Value: set("$lte", d.Sequence)})
	}
	res, err := s.cps.DeleteMany(ctx, f)
	if err != nil {
		return 0, ctxErr(ctx, err)
	}
	return res.DeletedCount, nil
}

// DeleteAll implements driver.Checkpoints. The fence document stays.
func (c checkpoints) DeleteAll(ctx context.Context, taskID string) (int64, error) {
	res, err := c.s.cps.DeleteMany(ctx, c.task(taskID))
	if err != nil {
		return 0, ctxErr(ctx, err)
	}
	return res.DeletedCount, nil
}

// Tasks implements driver.Checkpoints.
func (c checkpoints) Tasks(ctx context.Context, pattern driver.Pattern) ([]string, error) {
	s := c.s
	seen := map[string]bool{}
	var out []string
	err := findAll(ctx, s.cps, s.keyRange("taskId", s.prefix+pattern.Prefix()), set("taskId", 1), func(d *cpDoc) {
		if id, ok := strings.CutPrefix(d.TaskID, s.prefix); ok && !seen[id] && pattern.Match(id) {
			seen[id] = true
			out = append(out, id)
		}
	})
	sort.Strings(out)
	return out, err
}
