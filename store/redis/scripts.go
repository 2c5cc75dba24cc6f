package redis

import (
	"context"
	"errors"

	goredis "github.com/redis/go-redis/v9"
)

// prelude starts every script that reads the clock: now is the server's
// time in Unix milliseconds, fixed for the script.
const prelude = `
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local function fmt(n) return string.format('%d', n) end
`

// script is one Lua script, run with EVALSHA and loaded with EVAL when the
// server does not have it yet (go-redis's Script.Run).
type script struct{ *goredis.Script }

func newScript(src string) script { return script{goredis.NewScript(prelude + src)} }

// run runs sc on the store's client with one key. A nil reply is nil.
func (s *store) run(ctx context.Context, sc script, key string, args ...any) (any, error) {
	v, err := sc.Run(ctx, s.client, []string{key}, args...).Result()
	if errors.Is(err, goredis.Nil) {
		return nil, nil
	}
	return v, s.fail(ctx, err)
}

// run2 runs sc with two keys (of one hash slot).
func (s *store) run2(ctx context.Context, sc script, k1, k2 string, args ...any) (any, error) {
	v, err := sc.Run(ctx, s.client, []string{k1, k2}, args...).Result()
	if errors.Is(err, goredis.Nil) {
		return nil, nil
	}
	return v, s.fail(ctx, err)
}
