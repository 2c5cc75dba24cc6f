package redis

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// Lock hand-off through a queue kept beside the lock record.
//
// A release woke the waiters of other processes through pub/sub, and a
// releaser that asked again at once (or a waiter of its own process)
// reached the server first and took the key back: across processes the
// hand-off was unfair. The store implements driver.LockWaiter with a
// per-key queue in Redis, in the lock record's hash slot; the lock record
// alone still decides who holds the key (exclusion, expiry, tokens), the
// queue only orders and wakes:
//
//   - A waiter (WaitLock, called by the lock package after an attempt
//     found the key held) registers in the key's queue: a sorted set by
//     arrival (lockq:) and one by deadline (lockqd:). An entry lives
//     waitEntryTTL unless renewed; the waiter renews it every waitSlice
//     while it blocks in BLPOP on a list of its own (lockw:), so a waiter
//     that dies (SIGKILL) drops out of the queue within waitEntryTTL.
//   - A release (or force release) that ends a holding gives the turn to
//     the queue's head: the record's fields n (owner) and u (until, now +
//     turnGrace) name it, and the head's list gets a wake-up (LPUSH). For
//     turnGrace at most, an acquire by any other owner of the released key
//     is refused (it reports the turn's owner as the holder, until u): a
//     releaser that asks again at once queues behind the waiters, which
//     get the key in the order they queued, across processes. The
//     acquire that takes the key clears the turn and its owner's entry.
//   - A registration that finds the key free and nobody's turn live (the
//     holding expired, a turn lapsed because its waiter died or hung, the
//     holder released without handing off) gives the turn to the head
//     itself, so a dead waiter's turn delays the others by turnGrace plus
//     one waitSlice at most.
//   - A waiter that gives up (LeaveLock: its context ended, its Locker
//     closed) leaves the queue and passes a turn it had on at once.
//   - A holding taken by a process that does not hand off (an earlier
//     warden, another program writing the record) is told apart by the
//     record's field h, the token of the holding that hands off, which
//     such an acquire does not write: its waiters poll and wake on
//     pub/sub, as before (WaitLock returns false).
//
// BLPOP occupies a connection: at most HandoffConns waits run at once per
// store; beyond that WaitLock returns false and the waiter polls, woken by
// pub/sub as before. Nothing here decides exclusion: a lost wake-up, a
// lapsed turn or a dropped entry only costs time or order, never a second
// holder.

// turnGrace bounds how long a released key stays reserved for the waiter
// its release handed the turn to: ample for a woken waiter to send its
// acquire, and the longest a waiter that died or hung after being woken
// delays the others (plus a waitSlice, for the next one to notice).
const turnGrace = time.Second

// waitSlice is the longest a waiter blocks in BLPOP before it renews its
// queue entry (and gives the turn on if the key is free and nobody's turn
// is live).
const waitSlice = 500 * time.Millisecond

// waitEntryTTL is how long a queue entry lives without being renewed: a
// waiter that died leaves the queue within it.
const waitEntryTTL = 2 * time.Second

// defaultHandoffConns is the default bound of the waits (BLPOP
// connections) a store runs at once.
const defaultHandoffConns = 8

// Queue kinds, after the hash tag: the queue by arrival, the queue by
// deadline, and the wake-up lists ("lockw:<len(owner)>:<owner><key>").
const (
	kindLockQ    = "lockq:"
	kindLockQD   = "lockqd:"
	kindLockWake = "lockw:"
)

// handoffLua: the queue's helpers. KEYS[1] the lock record, KEYS[2] the
// queue by arrival, KEYS[3] the queue by deadline; wpre is the wake-up
// lists' key prefix, wkey the lock key.
const handoffLua = `
local function wakekey(wpre, o, wkey) return wpre .. #o .. ':' .. o .. wkey end
local function prune()
	local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', fmt(now))
	if #dead > 0 then
		redis.call('ZREM', KEYS[2], unpack(dead))
		redis.call('ZREM', KEYS[3], unpack(dead))
	end
end
local function dequeue(o)
	redis.call('ZREM', KEYS[2], o)
	redis.call('ZREM', KEYS[3], o)
	if redis.call('ZCARD', KEYS[2]) == 0 then redis.call('HDEL', KEYS[1], 'q') end
end
local function grant(grace, wpre, wkey, self)
	local h = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
	if not h then
		redis.call('HDEL', KEYS[1], 'q')
		return nil
	end
	dequeue(h)
	redis.call('HSET', KEYS[1], 'n', h, 'u', fmt(now + grace))
	if h ~= self then
		local w = wakekey(wpre, h, wkey)
		redis.call('LPUSH', w, '1')
		redis.call('PEXPIRE', w, fmt(4 * grace))
	end
	return h
end
`

// waitRegister: KEYS[4] the caller's wake-up list; ARGV[1] owner, ARGV[2]
// entry ttl ms, ARGV[3] grace ms, ARGV[4] wake-up prefix, ARGV[5] key.
// Reply 1: acquire now (owner's turn, or the key free); 0: queued, wait;
// 2: held outside the queue, poll.
var waitRegister = newScript(handoffLua + `
local owner = ARGV[1]
prune()
redis.call('DEL', KEYS[4])
local r = redis.call('HMGET', KEYS[1], 'o', 't', 'e', 'n', 'u', 'h')
if not r[1] and not r[2] then return 1 end
local held = r[1] ~= '' and tonumber(r[3]) > now
local turn = false
if held then
	if r[1] == owner then return 1 end
	if r[6] ~= r[2] then return 2 end
else
	turn = r[4] and r[4] ~= '' and tonumber(r[5]) > now
	if turn and r[4] == owner then return 1 end
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], 'NX', fmt(tonumber(tm[1]) * 1000000 + tonumber(tm[2])), owner)
redis.call('ZADD', KEYS[3], fmt(now + ttl), owner)
redis.call('PEXPIRE', KEYS[2], fmt(2 * ttl))
redis.call('PEXPIRE', KEYS[3], fmt(2 * ttl))
redis.call('HSET', KEYS[1], 'q', '1')
if not held and not turn and grant(tonumber(ARGV[3]), ARGV[4], ARGV[5], owner) == owner then
	return 1
end
return 0
`)

// waitLeave: ARGV[1] owner, ARGV[2] grace ms, ARGV[3] wake-up prefix,
// ARGV[4] key. Owner leaves the queue and gives a turn it has up; a key
// then free and nobody's turn goes to the next waiter.
var waitLeave = newScript(handoffLua + `
local owner = ARGV[1]
prune()
dequeue(owner)
local r = redis.call('HMGET', KEYS[1], 'o', 'e', 'n', 'u')
if r[3] == owner then
	redis.call('HDEL', KEYS[1], 'n', 'u')
	r[3] = nil
end
local held = r[1] and r[1] ~= '' and tonumber(r[2]) > now
local turn = r[3] and r[3] ~= '' and tonumber(r[4]) > now
if not held and not turn and redis.call('EXISTS', KEYS[1]) == 1 then
	grant(tonumber(ARGV[2]), ARGV[3], ARGV[4], '')
end
return 1
`)

// handoff is a store's waiting state.
type handoff struct {
	limit int           // waits at once; 0: hand-off off
	slice time.Duration // BLPOP bound, within the client's read timeout

	ctx    context.Context // cancelled by close: wakes the waits in flight
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	out    int               // waits in flight
	queued map[qKey]struct{} // owners that may have an entry or a turn
	wg     sync.WaitGroup    // wake-ups of ended waits in flight
}

type qKey struct{ key, owner string }

func newHandoff(client goredis.UniversalClient, limit int) *handoff {
	h := &handoff{queued: map[qKey]struct{}{}}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	rt := 3 * time.Second // go-redis's default read timeout
	pool := 0
	switch c := client.(type) {
	case *goredis.Client:
		rt, pool = c.Options().ReadTimeout, c.Options().PoolSize
	case *goredis.ClusterClient:
		rt, pool = c.Options().ReadTimeout, c.Options().PoolSize
	}
	h.slice = waitSlice
	if rt > 0 {
		// BLPOP's own timeout must end the wait before the client's read
		// deadline does: a reply cut off by the client would lose the
		// wake-up it carried.
		h.slice = min(h.slice, rt-250*time.Millisecond)
	}
	switch {
	case limit < 0 || h.slice < 20*time.Millisecond:
		limit = 0
	case limit == 0:
		limit = defaultHandoffConns
		if pool > 0 {
			// Leave most of the pool to the other commands.
			limit = min(limit, max(pool/4, 1))
		}
	}
	h.limit = limit
	return h
}

// queueKeys returns the Redis keys of key's queue and owner's wake-up
// list, and the wake-up lists' prefix.
func (s *store) queueKeys(key, owner string) (q, qd, wake, wpre string) {
	base := s.prefix + "{" + s.tag(key) + "}"
	wpre = base + kindLockWake
	return base + kindLockQ + key, base + kindLockQD + key,
		wpre + strconv.Itoa(len(owner)) + ":" + owner + key, wpre
}

// mark notes that owner may have an entry or a turn for key; unmark that
// it has neither.
func (h *handoff) mark(key, owner string) {
	h.mu.Lock()
	h.queued[qKey{key, owner}] = struct{}{}
	h.mu.Unlock()
}

func (h *handoff) unmark(key, owner string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.queued) == 0 {
		return false
	}
	k := qKey{key, owner}
	_, ok := h.queued[k]
	delete(h.queued, k)
	return ok
}

// WaitLock implements driver.LockWaiter: owner registers in key's queue
// and blocks in BLPOP on its wake-up list, renewing its entry every
// waitSlice, until its turn comes, max passes (true: look again), or the
// key turns out to be held outside the queue or no wait can be run now
// (false: poll).
func (s *store) WaitLock(ctx context.Context, key, owner string, max time.Duration) (bool, error) {
	h := s.ho
	h.mu.Lock()
	switch {
	case h.closed:
		h.mu.Unlock()
		return false, warden.ErrClosed
	case h.out >= h.limit:
		h.mu.Unlock()
		return false, ctx.Err()
	}
	h.out++
	h.wg.Add(1) // the wait's wake-up, below
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.out--
		h.mu.Unlock()
	}()
	if dl, ok := ctx.Deadline(); ok {
		max = min(max, time.Until(dl))
	}
	if max <= 0 {
		h.wg.Done()
		return ctx.Err() == nil, ctx.Err()
	}
	until := time.Now().Add(max)
	rk := s.key(kindLock, key)
	q, qd, wk, wpre := s.queueKeys(key, owner)

	// A wait whose context ends, or whose store closes, is woken by a
	// wake-up of its own: BLPOP is not interrupted by go-redis.
	wctx, cancel := context.WithCancel(ctx)
	stopClose := context.AfterFunc(h.ctx, cancel)
	stopWake := context.AfterFunc(wctx, func() {
		defer h.wg.Done()
		s.selfWake(wk)
	})
	defer func() {
		stopClose()
		if stopWake() {
			h.wg.Done()
		}
		cancel()
	}()

	for {
		h.mark(key, owner)
		v, err := s.eval(ctx, waitRegister, []string{rk, q, qd, wk},
			[]any{owner, driver.Millis(waitEntryTTL), driver.Millis(turnGrace), wpre, key}).Result()
		if err != nil {
			// Poll as without hand-off; LeaveLock takes the entry out.
			return false, s.waitErr(ctx, err)
		}
		switch rInt(v) {
		case 1:
			return true, nil
		case 2:
			return false, nil
		}
		d := time.Until(until)
		if d <= 0 {
			return true, nil
		}
		woken, err := s.blpop(wctx, wk, min(d, h.slice))
		if cerr := ctx.Err(); cerr != nil {
			return false, cerr
		}
		if h.ctx.Err() != nil {
			return false, warden.ErrClosed
		}
		if err != nil {
			return false, s.waitErr(ctx, err)
		}
		if woken {
			return true, nil
		}
	}
}

// waitErr is WaitLock's error: the context's or ErrClosed; other errors
// are not the caller's (it polls, and its next attempt meets them).
func (s *store) waitErr(ctx context.Context, err error) error {
	if err := s.fail(ctx, err); errors.Is(err, warden.ErrClosed) || ctx.Err() != nil {
		return err
	}
	return nil
}

// noRetrySS is a StringSliceCmd go-redis never sends a second time.
type noRetrySS struct{ *goredis.StringSliceCmd }

// NoRetry implements goredis.Cmder.
func (noRetrySS) NoRetry() bool { return true }

// blpop blocks on wk for at most d (the server's timeout, within the
// client's read deadline); true when it took a wake-up. The context only
// carries values: a wait whose context ends is woken by selfWake.
func (s *store) blpop(ctx context.Context, wk string, d time.Duration) (bool, error) {
	select {
	case <-ctx.Done():
		return false, nil
	default:
	}
	cmd := goredis.NewStringSliceCmd(ctx, "blpop", wk, strconv.FormatFloat(d.Seconds(), 'f', 3, 64))
	_ = s.client.Process(context.WithoutCancel(ctx), noRetrySS{cmd})
	err := cmd.Err()
	if isNil(err) {
		return false, nil
	}
	return err == nil && ctx.Err() == nil, err
}

// selfWake pushes a wake-up to a wait's own list, ending its BLPOP.
func (s *store) selfWake(wk string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = s.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		p.LPush(ctx, wk, "0")
		p.PExpire(ctx, wk, 4*turnGrace)
		return nil
	})
}

// LeaveLock implements driver.LockWaiter: owner leaves key's queue and
// passes a turn it has on, unless its acquire took the key (which cleared
// both: nothing is sent then).
func (s *store) LeaveLock(key, owner string) {
	h := s.ho
	if !h.unmark(key, owner) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.leave(ctx, key, owner)
}

// leave runs the script that takes owner out of key's queue and passes a
// turn it has on.
func (s *store) leave(ctx context.Context, key, owner string) {
	q, qd, _, wpre := s.queueKeys(key, owner)
	_ = s.eval(ctx, waitLeave, []string{s.key(kindLock, key), q, qd},
		[]any{owner, driver.Millis(turnGrace), wpre, key}).Err()
}

// leaveAll takes the store's owners out of every queue they may be in
// and passes their turns on, as the store closes: the lock package's
// LeaveLock for a wait that Close ended comes after the client is gone,
// and without this the entries would keep their places (and be handed
// turns) until they lapse. Bounded by ctx.
func (s *store) leaveAll(ctx context.Context) {
	h := s.ho
	h.mu.Lock()
	ks := make([]qKey, 0, len(h.queued))
	for k := range h.queued {
		ks = append(ks, k)
	}
	clear(h.queued)
	h.mu.Unlock()
	for _, k := range ks {
		if ctx.Err() != nil {
			return
		}
		s.leave(ctx, k.key, k.owner)
	}
}

// close wakes the waits in flight and waits for their wake-ups to be
// sent.
func (h *handoff) close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
}

var _ driver.LockWaiter = (*store)(nil)
