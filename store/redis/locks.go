package redis

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/warden-go/warden/driver"
)

// A lock record is a hash: o owner (empty once released), t token,
// a acquired at, e expires at (Unix ms, server clock). The record outlives
// its holdings, so the next holding's token continues from t; a record
// lost to its retention, to eviction or to a DEL restarts from the clock in
// microseconds (driver.TokenBase plus the microseconds within the
// millisecond × 4096 / 1000), above every token it handed out. Redis expires an
// idle record LockRetention after its holding ended.
//
// Lock scripts: KEYS[1] the record; ARGV[1] the events channel, ARGV[2]
// the key (for events), ARGV[3] the retention in ms, then their own.

// lockEvent renders a lock event for the channel.
const lockEvent = `
local function publish(kind, owner, tok)
	redis.call('PUBLISH', ARGV[1], string.format('L%d:%s:%d:%d:', kind, fmt(tok), now, #owner) .. owner .. ARGV[2])
end
`

// acquire: ARGV[4] owner, ARGV[5] ttl ms; KEYS[2], KEYS[3] the key's
// queue (handoff.go). Reply {acquired, token, acquired at, expires at[,
// holder]}: numbers (exact below 2^53), and the holder's name only when it
// is not the caller. A free key whose turn is another owner's is refused,
// naming the turn's owner as holder until the turn's end. h is the token
// of a holding that hands off; q marks a queue that may not be empty.
var lockAcquire = newScript(lockEvent + `
local r = redis.call('HMGET', KEYS[1], 'o', 't', 'a', 'e', 'n', 'u', 'q')
local ttl = tonumber(ARGV[5])
local ret = tonumber(ARGV[3])
local e = tonumber(r[4])
if r[1] and r[1] ~= '' and e > now then
	if r[1] ~= ARGV[4] then
		return {0, tonumber(r[2]), tonumber(r[3]), e, r[1]}
	end
	e = now + ttl
	redis.call('HSET', KEYS[1], 'e', fmt(e))
	redis.call('PEXPIREAT', KEYS[1], fmt(e + ret))
	return {1, tonumber(r[2]), tonumber(r[3]), e}
end
if r[5] then
	if r[5] ~= '' and r[5] ~= ARGV[4] and tonumber(r[6]) > now then
		return {0, tonumber(r[2]) or 0, tonumber(r[3]) or 0, tonumber(r[6]), r[5]}
	end
	redis.call('HDEL', KEYS[1], 'n', 'u')
end
if r[7] then
	redis.call('ZREM', KEYS[2], ARGV[4])
	redis.call('ZREM', KEYS[3], ARGV[4])
	if redis.call('ZCARD', KEYS[2]) == 0 then redis.call('HDEL', KEYS[1], 'q') end
end
local tok = now * 4096 + math.floor(tonumber(tm[2]) % 1000 * 4096 / 1000)
local old = tonumber(r[2])
if old and old >= tok then tok = old + 1 end
e = now + ttl
redis.call('HSET', KEYS[1], 'o', ARGV[4], 't', fmt(tok), 'a', fmt(now), 'e', fmt(e), 'h', fmt(tok))
redis.call('PEXPIREAT', KEYS[1], fmt(e + ret))
publish(1, ARGV[4], tok)
return {1, tok, now, e}
`)

// refresh: ARGV[4] owner, ARGV[5] token, ARGV[6] ttl ms.
var lockRefresh = newScript(`
local r = redis.call('HMGET', KEYS[1], 'o', 't', 'a', 'e')
if r[1] ~= ARGV[4] or r[2] ~= ARGV[5] or tonumber(r[4]) <= now then
	return {0}
end
local e = now + tonumber(ARGV[6])
redis.call('HSET', KEYS[1], 'e', fmt(e))
redis.call('PEXPIREAT', KEYS[1], fmt(e + tonumber(ARGV[3])))
return {1, tonumber(r[2]), tonumber(r[3]), e}
`)

// release: ARGV[4] owner, ARGV[5] token; expired or not. force: ARGV[4]
// is empty and only a live holding is ended. KEYS[2], KEYS[3] the key's
// queue, ARGV[6] the turn's grace in ms, ARGV[7] the wake-up lists'
// prefix: the queue's head, if any, gets the turn (handoff.go).
var lockRelease = newScript(lockEvent + handoffLua + `
local r = redis.call('HMGET', KEYS[1], 'o', 't', 'e', 'q')
if not r[1] or r[1] == '' then return 0 end
local e = tonumber(r[3])
if ARGV[4] == '' then
	if e <= now then return 0 end
elseif r[1] ~= ARGV[4] or r[2] ~= ARGV[5] then
	return 0
end
if e > now then e = now end
redis.call('HSET', KEYS[1], 'o', '', 'e', fmt(e))
redis.call('PEXPIREAT', KEYS[1], fmt(now + tonumber(ARGV[3])))
publish(2, r[1], tonumber(r[2]))
if r[4] then
	prune()
	grant(tonumber(ARGV[6]), ARGV[7], ARGV[2], '')
end
return 1
`)

// get: the live holding {1, token, acquired at, expires at, holder} or
// {0}.
var lockGet = newScript(`
local r = redis.call('HMGET', KEYS[1], 'o', 't', 'a', 'e')
if not r[1] or r[1] == '' or tonumber(r[4]) <= now then return {0} end
return {1, tonumber(r[2]), tonumber(r[3]), tonumber(r[4]), r[1]}
`)

// locks is the store's lock driver.
type locks store

func (l *locks) s() *store { return (*store)(l) }

func (l *locks) args(key string, more ...any) []any {
	a := make([]any, 3, 3+len(more))
	a[0], a[1], a[2] = l.channel, key, l.retention
	return append(a, more...)
}

// lockReply decodes {ok, token, acquired at, expires at[, holder]}; the
// holder is owner when the reply does not name one.
func lockReply(op, key, owner string, v any) (driver.LockRecord, bool, error) {
	a, ok := v.([]any)
	if !ok || len(a) == 0 {
		return driver.LockRecord{}, false, errReply(op, v)
	}
	if len(a) < 4 {
		return driver.LockRecord{}, false, nil
	}
	if len(a) > 4 {
		owner = rStr(a[4])
	}
	return driver.LockRecord{
		Key: key, Owner: owner, Token: rInt(a[1]),
		AcquiredAt: ms(rInt(a[2])), ExpiresAt: ms(rInt(a[3])),
	}, rInt(a[0]) == 1, nil
}

// lockKeys returns the keys of key's lock scripts: the record and its
// queue (handoff.go).
func (l *locks) lockKeys(key string) []string {
	s := l.s()
	q, qd, _, _ := s.queueKeys(key, "")
	return []string{s.key(kindLock, key), q, qd}
}

// Acquire implements driver.Locks.
func (l *locks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	s := l.s()
	v, err := s.runKeys(ctx, lockAcquire, l.lockKeys(key), l.args(key, owner, driver.Millis(ttl))...)
	if err != nil {
		return driver.LockRecord{}, false, err
	}
	rec, ok, err := lockReply("acquire", key, owner, v)
	if ok {
		// The script took owner's queue entry and turn out with the key.
		s.ho.unmark(key, owner)
	}
	return rec, ok, err
}

// Refresh implements driver.Locks.
func (l *locks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	v, err := l.s().run(ctx, lockRefresh, l.s().key(kindLock, key), l.args(key, owner, token, driver.Millis(ttl))...)
	if err != nil {
		return driver.LockRecord{}, false, err
	}
	return lockReply("refresh", key, owner, v)
}

// Release implements driver.Locks.
func (l *locks) Release(ctx context.Context, key, owner string, token int64) (bool, error) {
	v, err := l.s().runKeys(ctx, lockRelease, l.lockKeys(key), l.releaseArgs(key, owner, token)...)
	return rInt(v) == 1, err
}

// ForceRelease implements driver.Locks.
func (l *locks) ForceRelease(ctx context.Context, key string) (bool, error) {
	v, err := l.s().runKeys(ctx, lockRelease, l.lockKeys(key), l.releaseArgs(key, "", 0)...)
	return rInt(v) == 1, err
}

// releaseArgs are the release script's arguments.
func (l *locks) releaseArgs(key, owner string, token int64) []any {
	_, _, _, wpre := l.s().queueKeys(key, "")
	return l.args(key, owner, token, driver.Millis(turnGrace), wpre)
}

// Get implements driver.Locks.
func (l *locks) Get(ctx context.Context, key string) (driver.LockRecord, bool, error) {
	v, err := l.s().run(ctx, lockGet, l.s().key(kindLock, key))
	if err != nil {
		return driver.LockRecord{}, false, err
	}
	rec, _, err := lockReply("get", key, "", v)
	return rec, rec.Owner != "", err
}

// List implements driver.Locks: SCAN on every master, then the live
// holdings read one pipeline per page.
func (l *locks) List(ctx context.Context, p driver.Pattern) ([]driver.LockRecord, error) {
	s := l.s()
	var out []driver.LockRecord
	err := s.scanRead(ctx, kindLock, p, lockGet, nil, func(key string, v any) error {
		rec, _, err := lockReply("list", key, "", v)
		if err == nil && rec.Owner != "" {
			out = append(out, rec)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b driver.LockRecord) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// scanRead lists the records of kind matching p and runs sc on each, one
// pipeline per SCAN page, calling f with each key and reply.
func (s *store) scanRead(ctx context.Context, kind string, p driver.Pattern, sc script, args []any, f func(key string, v any) error) error {
	return s.scan(ctx, s.match(kind, p), func(rks []string) error {
		var keys []string
		var rkeys []string
		for _, rk := range rks {
			if k, ok := s.parseKey(kind, rk); ok && p.Match(k) {
				keys = append(keys, k)
				rkeys = append(rkeys, rk)
			}
		}
		if len(keys) == 0 {
			return nil
		}
		cmds, err := s.evalPipeline(ctx, sc, rkeys, args)
		if err != nil {
			return err
		}
		for i, c := range cmds {
			v, err := c.Result()
			if isNil(err) {
				v, err = nil, nil
			}
			if err != nil {
				return err
			}
			if err := f(keys[i], v); err != nil {
				return err
			}
		}
		return nil
	})
}

// evalPipeline runs sc on each key in one pipeline (one round trip per
// node), loading the script and running again if a server lacked it.
func (s *store) evalPipeline(ctx context.Context, sc script, rkeys []string, args []any) ([]*goredis.Cmd, error) {
	for attempt := 0; ; attempt++ {
		pipe := s.client.Pipeline()
		cmds := make([]*goredis.Cmd, len(rkeys))
		for i, rk := range rkeys {
			cmds[i] = sc.EvalSha(ctx, pipe, []string{rk}, args...)
		}
		_, err := pipe.Exec(ctx)
		if err == nil || isNil(err) {
			return cmds, nil
		}
		if attempt == 0 && goredis.HasErrorPrefix(err, "NOSCRIPT") {
			if err := s.loadEverywhere(ctx, sc); err != nil {
				return nil, err
			}
			continue
		}
		return nil, s.fail(ctx, err)
	}
}

// loadEverywhere loads sc on the server, or on every master of a cluster.
func (s *store) loadEverywhere(ctx context.Context, sc script) error {
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		return s.fail(ctx, cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			return sc.Load(ctx, c).Err()
		}))
	}
	return s.fail(ctx, sc.Load(ctx, s.client).Err())
}

func isNil(err error) bool { return errors.Is(err, goredis.Nil) }
