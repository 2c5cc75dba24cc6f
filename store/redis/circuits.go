package redis

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
)

// A circuit record is a hash: s state, n consecutive failures, lf last
// failure, ls last success, op opened at, po probe owner, pu probe until,
// v version, u updated at, sc successes, tf total failures, cs consecutive
// successes, is interval start, pr probes, pe probe epoch (times in Unix
// ms, 0 for none; absent fields read 0).
// One script does every operation (ARGV[1] names it), so that each is one
// atomic step decided by the server clock; it returns {code, record} with
// the record encoded as it is published on the events channel:
//
//	C<s>:<n>:<lf>:<ls>:<op>:<pu>:<v>:<u>:<sc>:<tf>:<cs>:<is>:<pr>:<pe>:<len(po)>:<po><name>
//
// ARGV[2] is the name, ARGV[3] the channel.
var circuitScript = newScript(`
local F = {'s', 'n', 'lf', 'ls', 'op', 'po', 'pu', 'v', 'u', 'sc', 'tf', 'cs', 'is', 'pr', 'pe'}
local h = redis.call('HMGET', KEYS[1], unpack(F))
local exists = h[1] and true or false
local R = {}
for i, k in ipairs(F) do
	if k == 's' then R.s = h[i] or 'closed' elseif k == 'po' then R.po = h[i] or '' else R[k] = tonumber(h[i]) or 0 end
end
local function enc()
	return string.format('C%s:%d:%d:%d:%d:%d:%d:%d:%d:%d:%d:%d:%d:%d:%d:', R.s, R.n, R.lf, R.ls, R.op, R.pu, R.v, R.u,
		R.sc, R.tf, R.cs, R.is, R.pr, R.pe, #R.po) .. R.po .. ARGV[2]
end
local function save()
	R.v = R.v + 1
	R.u = now
	local args = {}
	for _, k in ipairs(F) do
		args[#args + 1] = k
		if k == 's' or k == 'po' then args[#args + 1] = R[k] else args[#args + 1] = fmt(R[k]) end
	end
	redis.call('HSET', KEYS[1], unpack(args))
	local m = enc()
	redis.call('PUBLISH', ARGV[3], m)
	return {1, m}
end
local function resetCounts() R.sc = 0; R.tf = 0; R.cs = 0 end
local function clearProbes() R.po = ''; R.pu = 0; R.pr = 0 end
local function open() R.s = 'open'; R.op = now; clearProbes(); resetCounts() end
local function close() R.s = 'closed'; R.n = 0; R.op = 0; resetCounts(); R.is = now; clearProbes() end
local function live()
	if R.s == 'half-open' and R.pu > now and R.pr > 0 then return R.pr end
	return 0
end
local op = ARGV[1]
if op == 'get' then
	if exists then return {1, enc()} end
	return {0, enc()}
elseif op == 'outcome' then
	-- ARGV[4] kind, [5] gen, [6] successes, [7] threshold, [8] close after, [9] interval ms,
	-- [10] probe epoch (0: not a probe)
	local gen = tonumber(ARGV[5])
	if gen ~= -1 and gen ~= R.op then return {0, enc()} end
	local pe = tonumber(ARGV[10])
	if pe ~= 0 and pe ~= R.pe then return {0, enc()} end
	if R.s == 'closed' then
		local iv = tonumber(ARGV[9])
		if iv > 0 then
			if R.is == 0 then R.is = now
			elseif R.is + iv <= now then resetCounts(); R.n = 0; R.is = now end
		end
		local sc = tonumber(ARGV[6])
		if sc > 0 then R.sc = R.sc + sc end
	end
	local kind = tonumber(ARGV[4])
	if kind == 2 then
		R.n = R.n + 1
		R.lf = now
		if R.s == 'closed' then
			R.tf = R.tf + 1
			R.cs = 0
			local th = tonumber(ARGV[7])
			if th > 0 and R.n >= th then open() end
		elseif R.s == 'half-open' then
			open()
		end
	elseif kind == 1 then
		R.ls = now
		if R.s == 'closed' then
			R.n = 0
			R.sc = R.sc + 1
			R.cs = R.cs + 1
		elseif R.s == 'half-open' then
			R.sc = R.sc + 1
			R.cs = R.cs + 1
			local l = live()
			if l > 0 then R.pr = l - 1 else R.pr = 0 end
			local ca = tonumber(ARGV[8])
			if ca < 1 then ca = 1 end
			if R.cs >= ca then close() end
		end
	end
	return save()
elseif op == 'trip' then
	-- ARGV[4] version
	if not exists or R.s ~= 'closed' or R.v ~= tonumber(ARGV[4]) then return {0, enc()} end
	open()
	return save()
elseif op == 'probe' then
	-- ARGV[4] owner, [5] open for ms, [6] lease ms, [7] max probes
	local owner = ARGV[4]
	if R.s == 'open' then
		if R.op + tonumber(ARGV[5]) > now then return {0, enc()} end
		R.s = 'half-open'
		resetCounts()
		R.pr = 1
		R.pe = R.pe + 1
	elseif R.s == 'half-open' then
		local l = live()
		if R.pu <= now then
			-- every slot lapsed: a new set of slots
			R.pr = 1
			R.pe = R.pe + 1
		elseif R.po == owner then
			if l < 1 then l = 1 end
			R.pr = l
		elseif l < tonumber(ARGV[7]) then
			R.pr = l + 1
		else
			return {0, enc()}
		end
	else
		return {0, enc()}
	end
	R.po = owner
	R.pu = now + tonumber(ARGV[6])
	return save()
elseif op == 'set' then
	-- ARGV[4] state
	R.s = ARGV[4]
	clearProbes()
	R.pe = R.pe + 1
	resetCounts()
	if R.s == 'closed' then R.n = 0; R.op = 0; R.is = now elseif R.s == 'open' then R.op = now end
	return save()
elseif op == 'delete' then
	if not exists then return {0, ''} end
	redis.call('DEL', KEYS[1])
	for k, v in pairs(R) do if k == 'po' then R[k] = '' elseif k ~= 's' then R[k] = 0 end end
	R.s = 'closed'
	R.u = now
	redis.call('PUBLISH', ARGV[3], enc())
	return {1, ''}
end
return redis.error_reply('unknown circuit operation')
`)

// circuits is the store's circuit-breaker driver.
type circuits store

func (c *circuits) s() *store { return (*store)(c) }

// call runs the circuit script's operation op on name.
func (c *circuits) call(ctx context.Context, op, name string, args ...any) (driver.CircuitRecord, bool, error) {
	v, err := c.s().run(ctx, circuitScript, c.s().key(kindCircuit, name), append([]any{op, name, c.channel}, args...)...)
	if err != nil {
		return driver.CircuitRecord{}, false, err
	}
	return circuitReply("circuit "+op, name, v)
}

// circuitReply decodes {code, record}.
func circuitReply(op, name string, v any) (driver.CircuitRecord, bool, error) {
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return driver.CircuitRecord{}, false, errReply(op, v)
	}
	code := rInt(a[0]) == 1
	if rStr(a[1]) == "" {
		return driver.CircuitRecord{}, code, nil
	}
	rec, ok := decodeCircuitEvent(rStr(a[1]))
	if !ok {
		return driver.CircuitRecord{}, false, errReply(op, v)
	}
	rec.Name = name
	return rec, code, nil
}

// decodeCircuitEvent parses an encoded circuit record.
func decodeCircuitEvent(p string) (driver.CircuitRecord, bool) {
	rest, ok := strings.CutPrefix(p, "C")
	if !ok {
		return driver.CircuitRecord{}, false
	}
	f, rest, ok := cutN(rest, 15)
	if !ok {
		return driver.CircuitRecord{}, false
	}
	var n [14]int64
	for i := range n {
		if n[i], ok = atoi(f[i+1]); !ok {
			return driver.CircuitRecord{}, false
		}
	}
	pl := n[13]
	if pl < 0 || int(pl) > len(rest) {
		return driver.CircuitRecord{}, false
	}
	st := driver.CircuitState(f[0])
	if !st.Valid() {
		return driver.CircuitRecord{}, false
	}
	return driver.CircuitRecord{
		Name: rest[pl:], State: st, Failures: n[0], LastFailure: ms(n[1]), LastSuccess: ms(n[2]),
		OpenedAt: ms(n[3]), ProbeOwner: rest[:pl], ProbeUntil: ms(n[4]), Version: n[5], UpdatedAt: ms(n[6]),
		Successes: n[7], TotalFailures: n[8], ConsecutiveSuccesses: n[9], IntervalStart: ms(n[10]), Probes: n[11],
		ProbeEpoch: n[12],
	}, true
}

// RecordFailure implements driver.Circuits.
func (c *circuits) RecordFailure(ctx context.Context, name string, threshold int, gen int64) (driver.CircuitRecord, error) {
	return c.RecordOutcome(ctx, name, driver.Failure(gen, threshold))
}

// RecordSuccess implements driver.Circuits.
func (c *circuits) RecordSuccess(ctx context.Context, name string, gen int64) (driver.CircuitRecord, error) {
	return c.RecordOutcome(ctx, name, driver.Success(gen))
}

// RecordOutcome implements driver.Circuits.
func (c *circuits) RecordOutcome(ctx context.Context, name string, o driver.Outcome) (driver.CircuitRecord, error) {
	kind := 0
	switch o.Kind {
	case driver.OutcomeSuccess:
		kind = 1
	case driver.OutcomeFailure:
		kind = 2
	}
	rec, _, err := c.call(ctx, "outcome", name, kind, o.Gen, max(o.Successes, 0), max(o.Threshold, 0),
		max(o.CloseAfter, 0), driver.Millis(max(o.Interval, 0)), max(o.ProbeEpoch, 0))
	return rec, err
}

// Trip implements driver.Circuits.
func (c *circuits) Trip(ctx context.Context, name string, version int64) (driver.CircuitRecord, bool, error) {
	return c.call(ctx, "trip", name, version)
}

// TryProbe implements driver.Circuits.
func (c *circuits) TryProbe(ctx context.Context, name, owner string, openFor, lease time.Duration) (driver.CircuitRecord, bool, error) {
	return c.TryProbes(ctx, name, owner, openFor, lease, 1)
}

// TryProbes implements driver.Circuits.
func (c *circuits) TryProbes(ctx context.Context, name, owner string, openFor, lease time.Duration, maxProbes int) (driver.CircuitRecord, bool, error) {
	return c.call(ctx, "probe", name, owner, driver.Millis(openFor), driver.Millis(lease), max(maxProbes, 1))
}

// Get implements driver.Circuits.
func (c *circuits) Get(ctx context.Context, name string) (driver.CircuitRecord, bool, error) {
	return c.call(ctx, "get", name)
}

// Set implements driver.Circuits.
func (c *circuits) Set(ctx context.Context, name string, state driver.CircuitState) (driver.CircuitRecord, error) {
	rec, _, err := c.call(ctx, "set", name, string(state))
	return rec, err
}

// Delete implements driver.Circuits.
func (c *circuits) Delete(ctx context.Context, name string) (bool, error) {
	_, ok, err := c.call(ctx, "delete", name)
	return ok, err
}

// List implements driver.Circuits.
func (c *circuits) List(ctx context.Context, p driver.Pattern) ([]driver.CircuitRecord, error) {
	out := []driver.CircuitRecord{}
	err := c.s().scanRead(ctx, kindCircuit, p, circuitScript, []any{"get", "", c.channel}, func(name string, v any) error {
		rec, found, err := circuitReply("circuit list", name, v)
		if err == nil && found {
			out = append(out, rec)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b driver.CircuitRecord) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
