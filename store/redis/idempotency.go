package redis

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
)

// An idempotency record is a hash: s status ("pending"/"completed"),
// o owner, f fingerprint, r result, c created at, e expires at (Unix ms;
// 0: kept until deleted). Liveness is decided by the server clock in each
// script; Redis expires a completed record at e and a lapsed claim
// LockRetention after e (so that a late claimer still learns it took the
// claim over).
//
// Scripts: KEYS[1] the record; replies {code, s, o, f, r, c, e}.

const idemRead = `
local fields = {'s', 'o', 'f', 'r', 'c', 'e'}
local r = redis.call('HMGET', KEYS[1], unpack(fields))
local function live() return r[1] and (tonumber(r[6]) == 0 or tonumber(r[6]) > now) end
local function reply(code) return {code, r[1] or '', r[2] or '', r[3] or '', r[4] or '', r[5] or '0', r[6] or '0'} end
`

// claim: ARGV[1] owner, ARGV[2] lease ms, ARGV[3] fingerprint, ARGV[4]
// retention ms. Codes: the driver.ClaimOutcome values.
var idemClaim = newScript(idemRead + `
local code = 1
if r[1] then
	if not live() then
		if r[1] == 'pending' then code = 2 end
	elseif r[1] == 'pending' and r[2] == ARGV[1] then
		local e = now + tonumber(ARGV[2])
		redis.call('HSET', KEYS[1], 'e', fmt(e))
		redis.call('PEXPIREAT', KEYS[1], fmt(e + tonumber(ARGV[4])))
		r[6] = fmt(e)
		return reply(1)
	elseif r[1] == 'pending' then
		return reply(3)
	else
		return reply(4)
	end
end
local e = now + tonumber(ARGV[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', 'pending', 'o', ARGV[1], 'f', ARGV[3], 'r', '', 'c', fmt(now), 'e', fmt(e))
redis.call('PEXPIREAT', KEYS[1], fmt(e + tonumber(ARGV[4])))
r = {'pending', ARGV[1], ARGV[3], '', fmt(now), fmt(e)}
return reply(code)
`)

// extend: ARGV[1] owner, ARGV[2] lease ms, ARGV[3] retention ms.
var idemExtend = newScript(idemRead + `
if r[1] ~= 'pending' or r[2] ~= ARGV[1] then return 0 end
local e = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'e', fmt(e))
redis.call('PEXPIREAT', KEYS[1], fmt(e + tonumber(ARGV[3])))
return 1
`)

// complete: ARGV[1] owner, ARGV[2] result, ARGV[3] retain ms (0: keep).
var idemComplete = newScript(idemRead + `
if r[1] ~= 'pending' or r[2] ~= ARGV[1] then return 0 end
local retain = tonumber(ARGV[3])
local e = 0
if retain > 0 then e = now + retain end
redis.call('HSET', KEYS[1], 's', 'completed', 'r', ARGV[2], 'e', fmt(e))
if e > 0 then redis.call('PEXPIREAT', KEYS[1], fmt(e)) else redis.call('PERSIST', KEYS[1]) end
return 1
`)

// abandon: ARGV[1] owner.
var idemAbandon = newScript(idemRead + `
if r[1] ~= 'pending' or r[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
`)

// get: the live record, code 1, or {0}.
var idemGet = newScript(idemRead + `
if not live() then return {0} end
return reply(1)
`)

// set: ARGV[1] result, ARGV[2] ttl ms (0: keep).
var idemSet = newScript(`
local ttl = tonumber(ARGV[2])
local e = 0
if ttl > 0 then e = now + ttl end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', 'completed', 'o', '', 'f', '', 'r', ARGV[1], 'c', fmt(now), 'e', fmt(e))
if e > 0 then redis.call('PEXPIREAT', KEYS[1], fmt(e)) end
return 1
`)

// delete: the live record.
var idemDelete = newScript(idemRead + `
if not live() then return 0 end
redis.call('DEL', KEYS[1])
return 1
`)

// idempotency is the store's idempotency driver.
type idempotency store

func (d *idempotency) s() *store { return (*store)(d) }

// idemReply decodes {code, s, o, f, r, c, e}.
func idemReply(op, key string, v any) (driver.IdemRecord, int64, error) {
	a, ok := v.([]any)
	if !ok || len(a) == 0 {
		return driver.IdemRecord{}, 0, errReply(op, v)
	}
	code := rInt(a[0])
	if len(a) < 7 {
		return driver.IdemRecord{}, code, nil
	}
	rec := driver.IdemRecord{
		Key: key, Status: driver.IdemStatus(rStr(a[1])), Owner: rStr(a[2]), Fingerprint: rStr(a[3]),
		CreatedAt: ms(rInt(a[5])), ExpiresAt: ms(rInt(a[6])),
	}
	if rec.Status == driver.IdemCompleted {
		rec.Result = []byte(rStr(a[4]))
	}
	return rec, code, nil
}

// Claim implements driver.Idempotency.
func (d *idempotency) Claim(ctx context.Context, key, owner string, lease time.Duration, fingerprint string) (driver.IdemRecord, driver.ClaimOutcome, error) {
	v, err := d.s().run(ctx, idemClaim, d.s().key(kindIdem, key), owner, driver.Millis(lease), fingerprint, d.retention)
	if err != nil {
		return driver.IdemRecord{}, 0, err
	}
	rec, code, err := idemReply("claim", key, v)
	return rec, driver.ClaimOutcome(code), err
}

// Extend implements driver.Idempotency.
func (d *idempotency) Extend(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	v, err := d.s().run(ctx, idemExtend, d.s().key(kindIdem, key), owner, driver.Millis(lease), d.retention)
	return rInt(v) == 1, err
}

// Complete implements driver.Idempotency.
func (d *idempotency) Complete(ctx context.Context, key, owner string, result []byte, retain time.Duration) (bool, error) {
	v, err := d.s().run(ctx, idemComplete, d.s().key(kindIdem, key), owner, result, driver.Millis(retain))
	return rInt(v) == 1, err
}

// Abandon implements driver.Idempotency.
func (d *idempotency) Abandon(ctx context.Context, key, owner string) (bool, error) {
	v, err := d.s().run(ctx, idemAbandon, d.s().key(kindIdem, key), owner)
	return rInt(v) == 1, err
}

// Get implements driver.Idempotency.
func (d *idempotency) Get(ctx context.Context, key string) (driver.IdemRecord, bool, error) {
	v, err := d.s().run(ctx, idemGet, d.s().key(kindIdem, key))
	if err != nil {
		return driver.IdemRecord{}, false, err
	}
	rec, code, err := idemReply("get", key, v)
	return rec, code == 1, err
}

// Set implements driver.Idempotency.
func (d *idempotency) Set(ctx context.Context, key string, result []byte, ttl time.Duration) error {
	_, err := d.s().run(ctx, idemSet, d.s().key(kindIdem, key), result, driver.Millis(ttl))
	return err
}

// Delete implements driver.Idempotency.
func (d *idempotency) Delete(ctx context.Context, key string) (bool, error) {
	v, err := d.s().run(ctx, idemDelete, d.s().key(kindIdem, key))
	return rInt(v) == 1, err
}

// List implements driver.Idempotency.
func (d *idempotency) List(ctx context.Context, p driver.Pattern) ([]driver.IdemRecord, error) {
	var out []driver.IdemRecord
	err := d.s().scanRead(ctx, kindIdem, p, idemGet, nil, func(key string, v any) error {
		rec, code, err := idemReply("list", key, v)
		if err == nil && code == 1 {
			out = append(out, rec)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b driver.IdemRecord) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}
