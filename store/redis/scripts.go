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
// server does not have it yet.
type script struct {
	*goredis.Script
	src string
}

func newScript(src string) script {
	return script{goredis.NewScript(prelude + src), prelude + src}
}

// sentOnce is a command go-redis never sends a second time. A
// ClusterClient resends a command whose reply did not come (a timeout, a
// connection reset) in its redirect loop, whatever MaxRetries says; a
// script run twice is not safe (a resent ForceRelease ends a holding taken
// in between, a resent Release reports "not held" for the holding it
// released, a resent checkpoint save stores the checkpoint twice).
// Redirects (MOVED, ASK), which tell the script did not run, are still
// followed.
type sentOnce struct{ *goredis.Cmd }

// NoRetry implements goredis.Cmder.
func (sentOnce) NoRetry() bool { return true }

// eval runs sc with keys once: EVALSHA, then EVAL if the server does not
// have the script (NOSCRIPT: it did not run).
func (s *store) eval(ctx context.Context, sc script, keys []string, args []any) *goredis.Cmd {
	cmd := s.send(ctx, "evalsha", sc.Hash(), keys, args)
	if goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd = s.send(ctx, "eval", sc.src, keys, args)
	}
	return cmd
}

// send sends one EVAL or EVALSHA command, never resent.
func (s *store) send(ctx context.Context, name, body string, keys []string, args []any) *goredis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, name, body, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	cmd := goredis.NewCmd(ctx, a...)
	_ = s.client.Process(ctx, sentOnce{cmd})
	return cmd
}

// run runs sc on the store's client with one key. A nil reply is nil.
func (s *store) run(ctx context.Context, sc script, key string, args ...any) (any, error) {
	v, err := s.eval(ctx, sc, []string{key}, args).Result()
	if errors.Is(err, goredis.Nil) {
		return nil, nil
	}
	return v, s.fail(ctx, err)
}

// runKeys runs sc with keys (of one hash slot).
func (s *store) runKeys(ctx context.Context, sc script, keys []string, args ...any) (any, error) {
	v, err := s.eval(ctx, sc, keys, args).Result()
	if errors.Is(err, goredis.Nil) {
		return nil, nil
	}
	return v, s.fail(ctx, err)
}

// run2 runs sc with two keys (of one hash slot).
func (s *store) run2(ctx context.Context, sc script, k1, k2 string, args ...any) (any, error) {
	v, err := s.eval(ctx, sc, []string{k1, k2}, args).Result()
	if errors.Is(err, goredis.Nil) {
		return nil, nil
	}
	return v, s.fail(ctx, err)
}
