package drivertest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

func (s *suite) hostile(t *testing.T) {
	group(t, []check{
		{"Locks", s.hostileLocks},
		{"Circuits", s.hostileCircuits},
		{"Cache", s.hostileCache},
		{"Idempotency", s.hostileIdempotency},
		{"Checkpoints", s.hostileCheckpoints},
		{"Patterns", s.hostilePatterns},
		{"CaseSensitive", s.caseSensitive},
		{"InvalidKeys", s.invalidKeys},
		{"InvalidPatterns", s.invalidPatterns},
	})
}

// hostileKeys are valid keys that break naive stores: SQL LIKE, regex and
// glob metacharacters, injection attempts, quotes, separators, control
// characters, non-ASCII, keys equal under case folding, Unicode
// normalisation or PAD SPACE collations, and keys of the maximum length.
func hostileKeys() []string {
	keys := []string{
		"%", "_", "*", "?", "[", "]", `\`, ".*", ".", "..", "a.b", "a%b", "a_b", "a*b", `a\*b`, "a?b", "[a]", "[a-z]", "[!a]", "^a$", "a|b", "(a)", "{a}", "a+",
		"'; DROP TABLE x; --", `"; DROP TABLE x; --`, "' OR '1'='1", "$where", `{"$gt":""}`, "$", "$$", "${jndi:x}",
		`"`, "'", "`", `''`, `\'`, `\\`, `\%`, `\_`,
		":", "a:b", "::", "lock:", "cache:", "circuit:", "lock:x", "LOCK#x", "CB#x", "CACHE#x", "CHECKPOINT#x", "#", "#METADATA", "x:1", "x:10", "x:9",
		" ", "key with spaces", " leading", "trailing ", "k", "k ", "k  ",
		"line\nbreak", "tab\tx", "cr\rx", "\x01\x02", "\x7f", "bell\a",
		"emoji 😀", "日本語", "Ünïcödé", "é", "e\u0301", "ß", "ss", "ﬁ", "fi", "İ", "i", "ı", "\ufffd", "\u200b", "\u202e", "🏳️‍🌈",
		"Key", "key", "KEY",
		"-- ", "/*", "*/", "null", "NULL", "undefined", "true", "0", "-1", "1e3",
		strings.Repeat("k", 512),
		strings.Repeat("é", 256),
		strings.Repeat("%", 511) + "_",
		"😀" + strings.Repeat("x", 508),
	}
	return keys
}

// checkHostileSet checks the hostile keys are distinct and valid.
func checkHostileSet(t *testing.T, keys []string) {
	t.Helper()
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k] {
			t.Fatalf("drivertest bug: duplicate hostile key %q", k)
		}
		seen[k] = true
		if err := warden.ValidateKey(k); err != nil {
			t.Fatalf("drivertest bug: hostile key %q: %v", k, err)
		}
	}
}

// hostileLocks: every hostile key is its own lock and round-trips exactly.
func (s *suite) hostileLocks(t *testing.T) {
	ec := newErrorCap(t, "hostileLocks")
	defer ec.done()
	ctx := testCtx(t)
	st, _ := s.open(t)
	l := st.Locks()
	keys := hostileKeys()
	checkHostileSet(t, keys)
	recs := map[string]driver.LockRecord{}
	for i, key := range keys {
		owner := keys[(i+1)%len(keys)]
		rec, ok, err := l.Acquire(ctx, key, owner, time.Minute)
		if errorIf(t, "Acquire "+short(key), err) {
			continue
		}
		if !ok {
			ec.Errorf("Acquire %s by owner %s: not acquired, held by %s under key %s: keys collide", short(key), short(owner), short(rec.Owner), short(rec.Key))
			continue
		}
		checkLockRecord(t, "Acquire "+short(key), rec, key, owner)
		recs[key] = rec
	}
	for key, want := range recs {
		got, found, err := l.Get(ctx, key)
		if errorIf(t, "Get "+short(key), err) {
			continue
		}
		if !found || !sameLock(got, want) {
			ec.Errorf("Get %s = key %s owner %s found=%v, want owner %s", short(key), short(got.Key), short(got.Owner), found, short(want.Owner))
		}
	}
	list, err := l.List(ctx, "*")
	fatalIf(t, "List", err)
	var got []string
	for _, r := range list {
		got = append(got, r.Key)
		if want, ok := recs[r.Key]; ok && r.Owner != want.Owner {
			ec.Errorf("List: %s owned by %s, want %s", short(r.Key), short(r.Owner), short(want.Owner))
		}
	}
	sameKeys(t, "List *", got, matching(keys, "*"))
	for key, rec := range recs {
		if ok, err := l.Release(ctx, key, rec.Owner, rec.Token); err != nil || !ok {
			ec.Errorf("Release %s: ok=%v err=%v", short(key), ok, err)
		}
	}
}

// hostileCircuits: every hostile name is its own circuit.
func (s *suite) hostileCircuits(t *testing.T) {
	ec := newErrorCap(t, "hostileCircuits")
	defer ec.done()
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Circuits()
	keys := hostileKeys()
	for _, key := range keys {
		rec, err := c.RecordFailure(ctx, key, 1000)
		if errorIf(t, "RecordFailure "+short(key), err) {
			continue
		}
		wantCircuit(t, "RecordFailure "+short(key), rec, key, driver.Closed, 1)
	}
	for _, key := range keys {
		rec, found, err := c.Get(ctx, key)
		if errorIf(t, "Get "+short(key), err) {
			continue
		}
		if !found {
			ec.Errorf("Get %s: not found", short(key))
			continue
		}
		wantCircuit(t, "Get "+short(key), rec, key, driver.Closed, 1)
	}
	list, err := c.List(ctx, "*")
	fatalIf(t, "List", err)
	var got []string
	for _, r := range list {
		got = append(got, r.Name)
	}
	sameKeys(t, "List *", got, matching(keys, "*"))
	for _, key := range keys {
		if ok, err := c.Delete(ctx, key); err != nil || !ok {
			ec.Errorf("Delete %s: ok=%v err=%v", short(key), ok, err)
		}
	}
	list, err = c.List(ctx, "*")
	fatalIf(t, "List", err)
	if len(list) != 0 {
		ec.Errorf("List after deleting every circuit: %d left", len(list))
	}
}

// hostileCache: every hostile key is its own entry and round-trips.
func (s *suite) hostileCache(t *testing.T) {
	ec := newErrorCap(t, "hostileCache")
	defer ec.done()
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Cache()
	keys := hostileKeys()
	for _, key := range keys {
		errorIf(t, "Set "+short(key), c.Set(ctx, key, []byte("value of "+key), 0))
	}
	for _, key := range keys {
		e, found, err := c.Get(ctx, key)
		if errorIf(t, "Get "+short(key), err) {
			continue
		}
		if !found || e.Key != key {
			ec.Errorf("Get %s: found=%v key %s", short(key), found, short(e.Key))
			continue
		}
		wantValue(t, "Get "+short(key), e.Value, []byte("value of "+key))
		if ok, err := c.Has(ctx, key); err != nil || !ok {
			ec.Errorf("Has %s: %v err=%v", short(key), ok, err)
		}
	}
	got, err := c.Keys(ctx, "*")
	fatalIf(t, "Keys", err)
	sameKeys(t, "Keys *", got, matching(keys, "*"))
	for _, key := range keys {
		if ok, err := c.Delete(ctx, key); err != nil || !ok {
			ec.Errorf("Delete %s: ok=%v err=%v", short(key), ok, err)
		}
	}
	got, err = c.Keys(ctx, "*")
	fatalIf(t, "Keys", err)
	sameKeys(t, "Keys after deleting every key", got, nil)
}

// hostileIdempotency: every hostile key (and owner and fingerprint) is its
// own record and round-trips.
func (s *suite) hostileIdempotency(t *testing.T) {
	ec := newErrorCap(t, "hostileIdempotency")
	defer ec.done()
	ctx := testCtx(t)
	st, _ := s.open(t)
	id := st.Idempotency()
	keys := hostileKeys()
	for i, key := range keys {
		owner := keys[(i+1)%len(keys)]
		rec, out, err := id.Claim(ctx, key, owner, time.Minute, key)
		if errorIf(t, "Claim "+short(key), err) {
			continue
		}
		if out != driver.Claimed {
			ec.Errorf("Claim %s: %v (owner %s, key %s): keys collide", short(key), out, short(rec.Owner), short(rec.Key))
			continue
		}
		if rec.Key != key || rec.Owner != owner || rec.Fingerprint != key {
			ec.Errorf("Claim %s returned key %s owner %s fingerprint %s", short(key), short(rec.Key), short(rec.Owner), short(rec.Fingerprint))
		}
		if ok, err := id.Complete(ctx, key, owner, []byte("result of "+key), 0); err != nil || !ok {
			ec.Errorf("Complete %s: ok=%v err=%v", short(key), ok, err)
		}
	}
	for i, key := range keys {
		rec, found, err := id.Get(ctx, key)
		if errorIf(t, "Get "+short(key), err) {
			continue
		}
		if !found || rec.Key != key || rec.Status != driver.IdemCompleted || rec.Owner != keys[(i+1)%len(keys)] || rec.Fingerprint != key {
			ec.Errorf("Get %s: found=%v key %s status %s owner %s fingerprint %s", short(key), found, short(rec.Key), rec.Status, short(rec.Owner), short(rec.Fingerprint))
			continue
		}
		wantValue(t, "result of "+short(key), rec.Result, []byte("result of "+key))
	}
	list, err := id.List(ctx, "*")
	fatalIf(t, "List", err)
	var got []string
	for _, r := range list {
		got = append(got, r.Key)
	}
	sameKeys(t, "List *", got, matching(keys, "*"))
}

// hostileCheckpoints: every hostile task id is its own task and
// round-trips, and checkpoint ids parse back.
func (s *suite) hostileCheckpoints(t *testing.T) {
	ec := newErrorCap(t, "hostileCheckpoints")
	defer ec.done()
	ctx := testCtx(t)
	st, _ := s.open(t)
	c := st.Checkpoints()
	keys := hostileKeys()
	for _, key := range keys {
		cp, ok, err := c.Save(ctx, driver.CheckpointInput{TaskID: key, Progress: 50, Data: []byte(key)})
		if errorIf(t, "Save "+short(key), err) {
			continue
		}
		if !ok {
			ec.Errorf("Save %s: refused", short(key))
			continue
		}
		if cp.TaskID != key || cp.Sequence != 1 || cp.ID != driver.CheckpointID(key, 1) {
			ec.Errorf("Save %s: task %s sequence %d id %s; want the task's first checkpoint", short(key), short(cp.TaskID), cp.Sequence, short(cp.ID))
		}
	}
	for _, key := range keys {
		cp, found, err := c.Latest(ctx, key)
		if errorIf(t, "Latest "+short(key), err) {
			continue
		}
		if !found || cp.TaskID != key || cp.Sequence != 1 {
			ec.Errorf("Latest %s: found=%v task %s sequence %d", short(key), found, short(cp.TaskID), cp.Sequence)
			continue
		}
		wantValue(t, "data of "+short(key), cp.Data, []byte(key))
		got, found, err := c.Load(ctx, cp.ID)
		if err != nil || !found || got.TaskID != key {
			ec.Errorf("Load %s: found=%v err=%v task %s", short(cp.ID), found, err, short(got.TaskID))
		}
		cps, err := c.List(ctx, key)
		if err != nil || len(cps) != 1 {
			ec.Errorf("List %s: %d checkpoints, err=%v", short(key), len(cps), err)
		}
	}
	got, err := c.Tasks(ctx, "*")
	fatalIf(t, "Tasks", err)
	sameKeys(t, "Tasks *", got, matching(keys, "*"))
	for _, key := range keys {
		if n, err := c.DeleteAll(ctx, key); err != nil || n != 1 {
			ec.Errorf("DeleteAll %s: %d err=%v", short(key), n, err)
		}
	}
}

// patternKeys are keys for the pattern checks: the hostile keys and keys
// that only a correct glob tells apart.
func patternKeys() []string {
	keys := hostileKeys()
	for _, k := range []string{"user:1", "user:12", "user:a", "user:", "user:é", "user:😀", "user::", "axb", "a", "ab", "b", "x.y", "xzy", "a]", "a[", "abc", "abcd", `a\b`, `a\\b`} {
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	return keys
}

// globCases lists globs that naive translations to LIKE, regular
// expressions or Redis/SQLite globs get wrong.
var globCases = []string{
	"*", "", "%", "_", "%%", `\%`, `\_`, ".*", ".", "[a]", "[a-z]", "[!a]", "[*", "*]", "a[", `a\*b`, `a\\*b`, `a\\\*b`, `\\`, `\*`, `\?`, `*\\`,
	"user:?", "user:*", "user:??", "user:\\?", "*:*", "?", "??", "?*?", "a?b", "a*b", "a*", "*b", "a%b", "a_b", "a%", "a_", "k?y", "K*", "k*", "k *",
	"é*", "*é", "e*", "?́", "😀*", "?x*", "x:?", "x:1*", "lock:*", "CHECKPOINT#*", "#*", "$*", "'*", `"*`, "* ", " *", "^a$", "a|b", "(a)", "{a}", "a+",
}

// hostilePatterns: every listing matches globs exactly as the glob says:
// compared with driver.Pattern.Match over the full set of keys.
func (s *suite) hostilePatterns(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	keys := patternKeys()
	checkHostileSet(t, keys)
	for i, key := range keys {
		if _, ok, err := st.Locks().Acquire(ctx, key, fmt.Sprintf("owner-%d", i), time.Hour); err != nil || !ok {
			t.Fatalf("Acquire %s: ok=%v err=%v", short(key), ok, err)
		}
		if _, err := st.Circuits().RecordFailure(ctx, key, 1000); err != nil {
			t.Fatalf("RecordFailure %s: %v", short(key), err)
		}
		fatalIf(t, "cache Set "+short(key), st.Cache().Set(ctx, key, []byte("v"), 0))
		fatalIf(t, "idempotency Set "+short(key), st.Idempotency().Set(ctx, key, []byte("v"), 0))
		if _, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: key}); err != nil || !ok {
			t.Fatalf("checkpoint Save %s: ok=%v err=%v", short(key), ok, err)
		}
	}
	lists := []struct {
		name string
		list func(pattern string) ([]string, error)
	}{
		{"Locks.List", func(p string) ([]string, error) {
			recs, err := st.Locks().List(ctx, p)
			var out []string
			for _, r := range recs {
				out = append(out, r.Key)
			}
			return out, err
		}},
		{"Circuits.List", func(p string) ([]string, error) {
			recs, err := st.Circuits().List(ctx, p)
			var out []string
			for _, r := range recs {
				out = append(out, r.Name)
			}
			return out, err
		}},
		{"Cache.Keys", func(p string) ([]string, error) { return st.Cache().Keys(ctx, p) }},
		{"Idempotency.List", func(p string) ([]string, error) {
			recs, err := st.Idempotency().List(ctx, p)
			var out []string
			for _, r := range recs {
				out = append(out, r.Key)
			}
			return out, err
		}},
		{"Checkpoints.Tasks", func(p string) ([]string, error) { return st.Checkpoints().Tasks(ctx, p) }},
	}
	patterns := append([]string(nil), globCases...)
	for _, k := range keys {
		patterns = append(patterns, globEscape(k)) // every key, matched literally
	}
	for _, l := range lists {
		bad := 0
		for _, p := range patterns {
			got, err := l.list(p)
			if errorIf(t, fmt.Sprintf("%s %q", l.name, p), err) || !sameKeys(t, fmt.Sprintf("%s %q", l.name, p), got, matching(keys, p)) {
				if bad++; bad == 10 {
					t.Errorf("%s: 10 patterns wrong, the other patterns not tried", l.name)
					break
				}
			}
		}
	}
}

// caseSensitive: keys differing in case, Unicode normalisation, trailing
// spaces or under collation rules are different keys in every capability.
func (s *suite) caseSensitive(t *testing.T) {
	ec := newErrorCap(t, "caseSensitive")
	defer ec.done()
	ctx := testCtx(t)
	st, _ := s.open(t)
	keys := []string{"Key", "key", "KEY", "kEy", "é", "e\u0301", "É", "k", "k ", "ß", "ss", "SS", "ﬁ", "fi", "İ", "i", "I", "ı", "a", "A", "ä", "a\u0308"}
	for i, key := range keys {
		v := []byte(fmt.Sprintf("value-%d", i))
		fatalIf(t, "cache Set", st.Cache().Set(ctx, key, v, 0))
		if _, ok, err := st.Locks().Acquire(ctx, key, fmt.Sprintf("owner-%d", i), time.Hour); err != nil || !ok {
			ec.Errorf("lock Acquire %q by its own owner: ok=%v err=%v: keys differing only in case or form collide", key, ok, err)
		}
		if rec, err := st.Circuits().RecordFailure(ctx, key, 100); err != nil || rec.Failures != 1 {
			ec.Errorf("circuit RecordFailure %q: %d failures err=%v, want 1: names collide", key, rec.Failures, err)
		}
		if _, out, err := st.Idempotency().Claim(ctx, key, fmt.Sprintf("owner-%d", i), time.Minute, ""); err != nil || out != driver.Claimed {
			ec.Errorf("idempotency Claim %q: %v err=%v, want claimed: keys collide", key, out, err)
		}
		if cp, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: key, Data: v}); err != nil || !ok || cp.Sequence != 1 {
			ec.Errorf("checkpoint Save %q: sequence %d ok=%v err=%v, want 1: task ids collide", key, cp.Sequence, ok, err)
		}
	}
	for i, key := range keys {
		e, found, err := st.Cache().Get(ctx, key)
		if err != nil || !found {
			ec.Errorf("cache Get %q: found=%v err=%v", key, found, err)
			continue
		}
		wantValue(t, fmt.Sprintf("cache Get %q", key), e.Value, []byte(fmt.Sprintf("value-%d", i)))
	}
	got, err := st.Cache().Keys(ctx, "*")
	fatalIf(t, "Keys", err)
	sameKeys(t, "Keys *", got, matching(keys, "*"))
	got, err = st.Cache().Keys(ctx, "k*")
	fatalIf(t, "Keys", err)
	sameKeys(t, "Keys k*", got, matching(keys, "k*"))
	got, err = st.Checkpoints().Tasks(ctx, "?")
	fatalIf(t, "Tasks", err)
	sameKeys(t, "Tasks ?", got, matching(keys, "?"))
}

// invalidKeys lists keys every call must refuse with ErrInvalidKey.
var invalidKeys = []struct {
	name string
	key  string
}{
	{"empty", ""},
	{"513 bytes", strings.Repeat("k", 513)},
	{"513 bytes of 2-byte runes plus one", strings.Repeat("é", 256) + "k"},
	{"invalid UTF-8", "\xff"},
	{"truncated UTF-8", "abc\xc3"},
	{"NUL", "a\x00b"},
	{"only NUL", "\x00"},
}

// invalidKeys: invalid keys, names, owners and task ids are refused with
// ErrInvalidKey by every call, and nothing is written.
func (s *suite) invalidKeys(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	l, c, ca, id, cp := st.Locks(), st.Circuits(), st.Cache(), st.Idempotency(), st.Checkpoints()
	for _, ik := range invalidKeys {
		bad := ik.key
		calls := []struct {
			what string
			err  error
		}{}
		add := func(what string, err error) {
			calls = append(calls, struct {
				what string
				err  error
			}{what, err})
		}
		_, _, err := l.Acquire(ctx, bad, "owner", time.Minute)
		add("Locks.Acquire key", err)
		_, _, err = l.Acquire(ctx, "k", bad, time.Minute)
		add("Locks.Acquire owner", err)
		_, _, err = l.Refresh(ctx, bad, "owner", 1, time.Minute)
		add("Locks.Refresh", err)
		_, err = l.Release(ctx, bad, "owner", 1)
		add("Locks.Release", err)
		_, err = l.ForceRelease(ctx, bad)
		add("Locks.ForceRelease", err)
		_, _, err = l.Get(ctx, bad)
		add("Locks.Get", err)
		_, err = c.RecordFailure(ctx, bad, 1)
		add("Circuits.RecordFailure", err)
		_, err = c.RecordSuccess(ctx, bad)
		add("Circuits.RecordSuccess", err)
		_, _, err = c.TryProbe(ctx, bad, "owner", 0, time.Minute)
		add("Circuits.TryProbe name", err)
		_, _, err = c.TryProbe(ctx, "c", bad, 0, time.Minute)
		add("Circuits.TryProbe owner", err)
		_, _, err = c.Get(ctx, bad)
		add("Circuits.Get", err)
		_, err = c.Set(ctx, bad, driver.Open)
		add("Circuits.Set", err)
		_, err = c.Delete(ctx, bad)
		add("Circuits.Delete", err)
		add("Cache.Set", ca.Set(ctx, bad, []byte("v"), 0))
		_, err = ca.SetIfAbsent(ctx, bad, []byte("v"), 0)
		add("Cache.SetIfAbsent", err)
		_, _, err = ca.Get(ctx, bad)
		add("Cache.Get", err)
		_, err = ca.Has(ctx, bad)
		add("Cache.Has", err)
		_, err = ca.Delete(ctx, bad)
		add("Cache.Delete", err)
		_, _, err = id.Claim(ctx, bad, "owner", time.Minute, "")
		add("Idempotency.Claim key", err)
		_, _, err = id.Claim(ctx, "i", bad, time.Minute, "")
		add("Idempotency.Claim owner", err)
		_, err = id.Extend(ctx, bad, "owner", time.Minute)
		add("Idempotency.Extend", err)
		_, err = id.Complete(ctx, bad, "owner", nil, 0)
		add("Idempotency.Complete", err)
		_, err = id.Abandon(ctx, bad, "owner")
		add("Idempotency.Abandon", err)
		_, _, err = id.Get(ctx, bad)
		add("Idempotency.Get", err)
		add("Idempotency.Set", id.Set(ctx, bad, nil, 0))
		_, err = id.Delete(ctx, bad)
		add("Idempotency.Delete", err)
		_, _, err = cp.Save(ctx, driver.CheckpointInput{TaskID: bad})
		add("Checkpoints.Save", err)
		_, _, err = cp.Load(ctx, bad)
		add("Checkpoints.Load", err)
		_, _, err = cp.Latest(ctx, bad)
		add("Checkpoints.Latest", err)
		_, err = cp.List(ctx, bad)
		add("Checkpoints.List", err)
		_, err = cp.Cleanup(ctx, bad, 1)
		add("Checkpoints.Cleanup", err)
		_, err = cp.DeleteAll(ctx, bad)
		add("Checkpoints.DeleteAll", err)
		for _, call := range calls {
			wantErr(t, fmt.Sprintf("%s with an invalid key (%s)", call.what, ik.name), call.err, warden.ErrInvalidKey)
		}
	}
	// Nothing may have been written.
	if recs, err := l.List(ctx, "*"); err != nil || len(recs) != 0 {
		t.Errorf("locks after invalid calls: %d, err=%v", len(recs), err)
	}
	if recs, err := c.List(ctx, "*"); err != nil || len(recs) != 0 {
		t.Errorf("circuits after invalid calls: %d, err=%v", len(recs), err)
	}
	if keys, err := ca.Keys(ctx, "*"); err != nil || len(keys) != 0 {
		t.Errorf("cache keys after invalid calls: %d, err=%v", len(keys), err)
	}
	if recs, err := id.List(ctx, "*"); err != nil || len(recs) != 0 {
		t.Errorf("idempotency records after invalid calls: %d, err=%v", len(recs), err)
	}
	if tasks, err := cp.Tasks(ctx, "*"); err != nil || len(tasks) != 0 {
		t.Errorf("checkpoint tasks after invalid calls: %d, err=%v", len(tasks), err)
	}
}

// invalidPatterns: malformed globs are refused with ErrInvalidPattern.
func (s *suite) invalidPatterns(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	for _, p := range []string{`abc\`, `\`, `*\`, "\xff*", "a\xc3"} {
		_, err := st.Locks().List(ctx, p)
		wantErr(t, fmt.Sprintf("Locks.List %q", p), err, warden.ErrInvalidPattern)
		_, err = st.Circuits().List(ctx, p)
		wantErr(t, fmt.Sprintf("Circuits.List %q", p), err, warden.ErrInvalidPattern)
		_, err = st.Cache().Keys(ctx, p)
		wantErr(t, fmt.Sprintf("Cache.Keys %q", p), err, warden.ErrInvalidPattern)
		_, err = st.Idempotency().List(ctx, p)
		wantErr(t, fmt.Sprintf("Idempotency.List %q", p), err, warden.ErrInvalidPattern)
		_, err = st.Checkpoints().Tasks(ctx, p)
		wantErr(t, fmt.Sprintf("Checkpoints.Tasks %q", p), err, warden.ErrInvalidPattern)
	}
}
