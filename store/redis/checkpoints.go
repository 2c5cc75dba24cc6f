package redis

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/warden-go/warden/driver"
)

// A task's checkpoints are one sorted set scored by sequence; each member
// is "<seq>:<time ms>:<token>:<eta ms>:<progress>:" followed by the data.
// Its fence is a hash: t the greatest token, s the last sequence, u when
// the token last rose. Both share the task's hash tag, so every script
// works on one slot, and a save — fence check, sequence and write — is one
// atomic step.
//
// Scripts: KEYS[1] the sorted set, KEYS[2] the fence.

const cpFenceRead = `
local f = redis.call('HMGET', KEYS[2], 't', 's')
local ft = tonumber(f[1]) or 0
local fs = tonumber(f[2]) or 0
`

// save: ARGV[1] token, ARGV[2] eta ms, ARGV[3] progress, ARGV[4] data.
// Reply {1, seq, time} or {0}.
var cpSave = newScript(cpFenceRead + `
local tok = tonumber(ARGV[1])
if tok > 0 and tok < ft then return {0} end
local seq = fs + 1
local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if top[2] and tonumber(top[2]) >= seq then seq = tonumber(top[2]) + 1 end
redis.call('HSET', KEYS[2], 's', fmt(seq))
if tok > ft then redis.call('HSET', KEYS[2], 't', ARGV[1], 'u', fmt(now)) end
redis.call('ZADD', KEYS[1], seq, string.format('%d:%d:%s:%s:%s:', seq, now, ARGV[1], ARGV[2], ARGV[3]) .. ARGV[4])
return {1, seq, now}
`)

// fence: ARGV[1] token. Reply 1 accepted, 0 stale.
var cpFence = newScript(cpFenceRead + `
local tok = tonumber(ARGV[1])
if ft > tok then return 0 end
if tok > ft then redis.call('HSET', KEYS[2], 't', ARGV[1], 's', fmt(fs), 'u', fmt(now)) end
return 1
`)

// cleanup: ARGV[1] token, ARGV[2] keep (-1: delete all). Reply {ok, n}.
var cpCleanup = newScript(cpFenceRead + `
local tok = tonumber(ARGV[1])
if tok > 0 and ft > tok then return {0, 0} end
local keep = tonumber(ARGV[2])
if keep < 0 then
	local n = redis.call('ZCARD', KEYS[1])
	redis.call('DEL', KEYS[1])
	return {1, n}
end
return {1, redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(keep + 1))}
`)

// checkpoints is the store's checkpoint driver.
type checkpoints store

func (c *checkpoints) s() *store { return (*store)(c) }

func (c *checkpoints) keys(task string) (set, fence string) {
	return c.s().key(kindCP, task), c.s().key(kindFence, task)
}

// Save implements driver.Checkpoints.
func (c *checkpoints) Save(ctx context.Context, in driver.CheckpointInput) (driver.Checkpoint, bool, error) {
	set, fence := c.keys(in.TaskID)
	progress := strconv.FormatFloat(in.Progress, 'g', -1, 64)
	v, err := c.s().run2(ctx, cpSave, set, fence, in.Token, driver.Millis(in.ETA), progress, in.Data)
	if err != nil {
		return driver.Checkpoint{}, false, err
	}
	a, ok := v.([]any)
	if !ok || len(a) == 0 {
		return driver.Checkpoint{}, false, errReply("checkpoint save", v)
	}
	if rInt(a[0]) != 1 || len(a) < 3 {
		return driver.Checkpoint{}, false, nil
	}
	seq := rInt(a[1])
	return driver.Checkpoint{
		ID: driver.CheckpointID(in.TaskID, seq), TaskID: in.TaskID, Sequence: seq, Time: ms(rInt(a[2])),
		Progress: in.Progress, Data: append([]byte{}, in.Data...), ETA: time.Duration(driver.Millis(in.ETA)) * time.Millisecond,
		Token: in.Token,
	}, true, nil
}

// Fence implements driver.Checkpoints.
func (c *checkpoints) Fence(ctx context.Context, taskID string, token int64) (bool, error) {
	set, fence := c.keys(taskID)
	v, err := c.s().run2(ctx, cpFence, set, fence, token)
	return rInt(v) == 1, err
}

// decode parses a sorted-set member.
func decodeCheckpoint(task, m string) (driver.Checkpoint, error) {
	var f [5]string
	rest := m
	for i := range f {
		j := strings.IndexByte(rest, ':')
		if j < 0 {
			return driver.Checkpoint{}, fmt.Errorf("redis: checkpoint of task %q is malformed", task)
		}
		f[i], rest = rest[:j], rest[j+1:]
	}
	seq, e1 := strconv.ParseInt(f[0], 10, 64)
	at, e2 := strconv.ParseInt(f[1], 10, 64)
	tok, e3 := strconv.ParseInt(f[2], 10, 64)
	eta, e4 := strconv.ParseInt(f[3], 10, 64)
	prog, e5 := strconv.ParseFloat(f[4], 64)
	for _, err := range []error{e1, e2, e3, e4, e5} {
		if err != nil {
			return driver.Checkpoint{}, fmt.Errorf("redis: checkpoint of task %q is malformed: %v", task, err)
		}
	}
	return driver.Checkpoint{
		ID: driver.CheckpointID(task, seq), TaskID: task, Sequence: seq, Time: ms(at),
		Progress: prog, Data: []byte(rest), ETA: time.Duration(eta) * time.Millisecond, Token: tok,
	}, nil
}

func (c *checkpoints) decodeAll(ctx context.Context, task string, ms []string, err error) ([]driver.Checkpoint, error) {
	if err != nil {
		return nil, c.s().fail(ctx, err)
	}
	out := make([]driver.Checkpoint, 0, len(ms))
	for _, m := range ms {
		cp, err := decodeCheckpoint(task, m)
		if err != nil {
			return nil, err
		}
		out = append(out, cp)
	}
	return out, nil
}

// Load implements driver.Checkpoints.
func (c *checkpoints) Load(ctx context.Context, id string) (driver.Checkpoint, bool, error) {
	task, seq, ok := driver.ParseCheckpointID(id)
	if !ok {
		return driver.Checkpoint{}, false, nil
	}
	set, _ := c.keys(task)
	n := strconv.FormatInt(seq, 10)
	ms, err := c.client.ZRangeByScore(ctx, set, &goredis.ZRangeBy{Min: n, Max: n}).Result()
	cps, err := c.decodeAll(ctx, task, ms, err)
	if err != nil || len(cps) == 0 {
		return driver.Checkpoint{}, false, err
	}
	return cps[0], true, nil
}

// Latest implements driver.Checkpoints.
func (c *checkpoints) Latest(ctx context.Context, taskID string) (driver.Checkpoint, bool, error) {
	set, _ := c.keys(taskID)
	ms, err := c.client.ZRange(ctx, set, -1, -1).Result()
	cps, err := c.decodeAll(ctx, taskID, ms, err)
	if err != nil || len(cps) == 0 {
		return driver.Checkpoint{}, false, err
	}
	return cps[0], true, nil
}

// List implements driver.Checkpoints.
func (c *checkpoints) List(ctx context.Context, taskID string) ([]driver.Checkpoint, error) {
	set, _ := c.keys(taskID)
	ms, err := c.client.ZRange(ctx, set, 0, -1).Result()
	return c.decodeAll(ctx, taskID, ms, err)
}

func (c *checkpoints) cleanup(ctx context.Context, taskID string, keep int, token int64) (int64, bool, error) {
	set, fence := c.keys(taskID)
	v, err := c.s().run2(ctx, cpCleanup, set, fence, token, keep)
	if err != nil {
		return 0, false, err
	}
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return 0, false, errReply("checkpoint cleanup", v)
	}
	return rInt(a[1]), rInt(a[0]) == 1, nil
}

// Cleanup implements driver.Checkpoints.
func (c *checkpoints) Cleanup(ctx context.Context, taskID string, keep int, token int64) (int64, bool, error) {
	return c.cleanup(ctx, taskID, keep, token)
}

// DeleteAll implements driver.Checkpoints.
func (c *checkpoints) DeleteAll(ctx context.Context, taskID string, token int64) (int64, bool, error) {
	return c.cleanup(ctx, taskID, -1, token)
}

// Tasks implements driver.Checkpoints.
func (c *checkpoints) Tasks(ctx context.Context, p driver.Pattern) ([]string, error) {
	s := c.s()
	var out []string
	err := s.scan(ctx, s.match(kindCP, p), func(rks []string) error {
		for _, rk := range rks {
			if k, ok := s.parseKey(kindCP, rk); ok && p.Match(k) {
				out = append(out, k)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(out)
	return out, nil
}
