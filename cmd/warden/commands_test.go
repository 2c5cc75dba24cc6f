package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
)

var circuitFields = []string{"name", "state", "failures", "last_failure", "last_success", "opened_at", "successes", "total_failures", "consecutive_successes", "interval_start", "probes", "probe_owner", "probe_until", "version", "updated_at", "recorded"}

func TestBreakerCommands(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		ctx := context.Background()
		st := openTestStore(t, url)
		for i := 0; i < 2; i++ {
			if _, err := st.Circuits().RecordFailure(ctx, "pay-api", 5); err != nil {
				t.Fatal(err)
			}
		}

		r := invoke(t, "", "--store", url, "breaker", "ls")
		want(t, r, 0)
		wantLines(t, r,
			`NAME +STATE +FAILURES +LAST FAILURE +OPENED +UPDATED`,
			`pay-api +closed +2 +`+rfc3339ms+` +- +`+rfc3339ms)

		r = invoke(t, "", "--store", url, "breaker", "show", "pay-api")
		want(t, r, 0)
		wantLines(t, r,
			`name: +pay-api`, `state: +closed`, `failures: +2`, `last_failure: +`+rfc3339ms, `last_success: +-`,
			`opened_at: +-`, `successes: +0`, `total_failures: +2`, `consecutive_successes: +0`,
			`interval_start: +(-|`+rfc3339ms+`)`, `probes: +0`, `probe_owner: +-`, `probe_until: +-`, `version: +\d+`, `updated_at: +`+rfc3339ms)

		// open: exit 0 and the new record; show then exits 3.
		r = invoke(t, "", "--store", url, "-o", "json", "breaker", "open", "pay-api")
		want(t, r, 0)
		wantKeys(t, r.stdout, circuitFields...)
		var c circuitJSON
		decode(t, r, &c)
		if c.Name != "pay-api" || c.State != "open" || time.Time(c.OpenedAt).IsZero() {
			t.Fatalf("breaker open: %+v", c)
		}
		r = invoke(t, "", "--store", url, "-o", "json", "breaker", "show", "pay-api")
		if r.code != exitHeld || !strings.Contains(r.stderr, `circuit breaker "pay-api" is open`) {
			t.Fatalf("show open: %s", r)
		}
		oneErrorLine(t, r)
		decode(t, r, &c)
		if c.State != "open" {
			t.Fatalf("show open: %+v", c)
		}
		r = invoke(t, "", "--store", url, "breaker", "show", "pay-api")
		if r.code != exitHeld || !regexp.MustCompile(`(?m)^state: +open$`).MatchString(r.stdout) {
			t.Fatalf("show open, table: %s", r)
		}

		r = invoke(t, "", "--store", url, "breaker", "close", "pay-api")
		want(t, r, 0)
		if !regexp.MustCompile(`(?m)^state: +closed$`).MatchString(r.stdout) || !regexp.MustCompile(`(?m)^failures: +0$`).MatchString(r.stdout) {
			t.Fatalf("breaker close: %s", r)
		}
		if rec, _, _ := st.Circuits().Get(ctx, "pay-api"); rec.State != driver.Closed {
			t.Fatalf("after close: %+v", rec)
		}

		r = invoke(t, "", "--store", url, "-o", "json", "breaker", "ls", "pay-*")
		want(t, r, 0)
		var list []circuitJSON
		decode(t, r, &list)
		if len(list) != 1 || list[0].State != "closed" {
			t.Fatalf("breaker ls json: %+v", list)
		}

		r = invoke(t, "", "--store", url, "breaker", "reset", "pay-api")
		want(t, r, 0)
		wantLines(t, r, `reset circuit breaker pay-api \(it reads as closed\)`)
		if _, found, _ := st.Circuits().Get(ctx, "pay-api"); found {
			t.Fatal("record still there after reset")
		}
		r = invoke(t, "", "--store", url, "breaker", "reset", "pay-api")
		want(t, r, exitNotFound)
		// Without a record it is closed: exit 0, so that `breaker show X
		// && call` calls.
		r = invoke(t, "", "--store", url, "breaker", "show", "pay-api")
		want(t, r, 0)
		if !strings.Contains(r.stdout, "closed (no record)") {
			t.Fatalf("breaker show without a record: %s", r)
		}

		if _, err := st.Circuits().Set(ctx, "x", driver.HalfOpen); err != nil {
			t.Fatal(err)
		}
		r = invoke(t, "", "--store", url, "-o", "json", "breaker", "reset", "x")
		want(t, r, 0)
		var reset struct {
			Name  string `json:"name"`
			Reset bool   `json:"reset"`
		}
		decode(t, r, &reset)
		if reset.Name != "x" || !reset.Reset {
			t.Fatalf("reset json: %+v", reset)
		}
		r = invoke(t, "", "--store", url, "-o", "json", "breaker", "ls")
		want(t, r, 0)
		if strings.TrimSpace(r.stdout) != "[]" {
			t.Fatalf("empty breaker ls: %s", r)
		}
	})
}

func TestCacheCommands(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		ctx := context.Background()
		st := openTestStore(t, url)

		r := invoke(t, "", "--store", url, "cache", "set", "user:1", `{"name":"Ada"}`, "--ttl", "10m")
		want(t, r, 0)
		wantLines(t, r, `set user:1 \(14 bytes, expires in 10m0s\)`)
		r = invoke(t, `"from stdin"`, "--store", url, "-o", "json", "cache", "set", "user:2", "-")
		want(t, r, 0)
		wantKeys(t, r.stdout, "key", "bytes", "ttl_ms")
		if !strings.Contains(r.stdout, `"ttl_ms": 0`) || !strings.Contains(r.stdout, `"bytes": 12`) {
			t.Fatalf("cache set json: %s", r)
		}
		r = invoke(t, "", "--store", url, "cache", "set", "neg", "--", "-5")
		want(t, r, 0)
		if err := st.Cache().Set(ctx, "bin", []byte{0xff, 0x00, 'a'}, 0); err != nil {
			t.Fatal(err)
		}

		r = invoke(t, "", "--store", url, "cache", "get", "user:1")
		want(t, r, 0)
		if r.stdout != `{"name":"Ada"}`+"\n" {
			t.Fatalf("cache get: %s", r)
		}
		r = invoke(t, "", "--store", url, "cache", "get", "neg")
		want(t, r, 0)
		wantLines(t, r, `-5`)
		r = invoke(t, "", "--store", url, "-o", "json", "cache", "get", "user:2")
		want(t, r, 0)
		wantKeys(t, r.stdout, "key", "value", "encoding", "expires_at")
		var got struct {
			Key       string   `json:"key"`
			Value     string   `json:"value"`
			Encoding  string   `json:"encoding"`
			ExpiresAt jsonTime `json:"expires_at"`
		}
		decode(t, r, &got)
		if got.Key != "user:2" || got.Value != `"from stdin"` || got.Encoding != "text" || !time.Time(got.ExpiresAt).IsZero() {
			t.Fatalf("cache get json: %+v", got)
		}
		r = invoke(t, "", "--store", url, "-o", "json", "cache", "get", "user:1")
		decode(t, r, &got)
		if time.Time(got.ExpiresAt).IsZero() {
			t.Fatalf("cache get json: no expiry: %s", r)
		}
		r = invoke(t, "", "--store", url, "-o", "json", "cache", "get", "bin")
		want(t, r, 0)
		decode(t, r, &got)
		if b, _ := base64.StdEncoding.DecodeString(got.Value); got.Encoding != "base64" || string(b) != "\xff\x00a" {
			t.Fatalf("binary value: %+v", got)
		}
		r = invoke(t, "", "--store", url, "cache", "get", "missing")
		want(t, r, exitNotFound)

		r = invoke(t, "", "--store", url, "cache", "keys")
		want(t, r, 0)
		wantLines(t, r, `KEY`, `bin`, `neg`, `user:1`, `user:2`)
		r = invoke(t, "", "--store", url, "-o", "json", "cache", "keys", "user:*")
		want(t, r, 0)
		var keys []struct {
			Key string `json:"key"`
		}
		decode(t, r, &keys)
		if len(keys) != 2 || keys[0].Key != "user:1" || keys[1].Key != "user:2" {
			t.Fatalf("cache keys json: %+v", keys)
		}

		r = invoke(t, "", "--store", url, "cache", "del", "user:1")
		want(t, r, 0)
		wantLines(t, r, `deleted user:1`)
		r = invoke(t, "", "--store", url, "cache", "del", "user:1")
		want(t, r, exitNotFound)
		r = invoke(t, "", "--store", url, "-o", "json", "cache", "del", "user:2")
		want(t, r, 0)
		if strings.Join(jsonKeys(t, r.stdout), ",") != "key,deleted" {
			t.Fatalf("cache del json: %s", r)
		}

		// clear empties the cache and nothing else.
		if _, ok, err := st.Locks().Acquire(ctx, "keep-me", "o", time.Minute); err != nil || !ok {
			t.Fatal(err)
		}
		r = invoke(t, "", "--store", url, "cache", "clear", "--yes")
		want(t, r, 0)
		wantLines(t, r, `deleted 2 cache entries`)
		r = invoke(t, "", "--store", url, "-o", "json", "cache", "clear", "-y")
		want(t, r, 0)
		var cleared struct {
			Deleted int64 `json:"deleted"`
		}
		decode(t, r, &cleared)
		if cleared.Deleted != 0 {
			t.Fatalf("second clear: %+v", cleared)
		}
		if _, found, _ := st.Locks().Get(ctx, "keep-me"); !found {
			t.Fatal("cache clear touched a lock")
		}
		r = invoke(t, "", "--store", url, "-o", "json", "cache", "keys")
		if strings.TrimSpace(r.stdout) != "[]" {
			t.Fatalf("keys after clear: %s", r)
		}

		r = invoke(t, "", "--store", url, "cache", "set", "k", "v", "--ttl", "-1s")
		want(t, r, exitUsage)
		r = invoke(t, "", "--store", url, "cache", "clear", "--yes", "extra")
		want(t, r, exitUsage)
	})
}

// TestCacheClearAsks: without --yes, cache clear asks on a terminal and
// deletes only on "y"; without a terminal it refuses (exit 2).
func TestCacheClearAsks(t *testing.T) {
	url := testStores(t)[1].url
	count := func() int {
		r := invoke(t, "", "--store", url, "-o", "json", "cache", "keys")
		want(t, r, 0)
		var keys []struct{ Key string }
		decode(t, r, &keys)
		return len(keys)
	}
	want(t, invoke(t, "", "--store", url, "cache", "set", "k", "v"), 0)
	for _, tc := range []struct {
		terminal bool
		answer   string
		code     int
		left     int
	}{
		{false, "y\n", exitUsage, 1}, // no terminal: refused, stdin not read
		{true, "\n", exitFailed, 1},  // the default is no
		{true, "n\n", exitFailed, 1},
		{true, "", exitFailed, 1}, // end of input
		{true, "yes\n", 0, 0},
	} {
		var out, errb strings.Builder
		c := &cli{stdin: strings.NewReader(tc.answer), stdout: &out, stderr: &errb, env: testEnv(), g: globals{store: url, output: "table", timeout: defaultTimeout}}
		c.isTerminal = func() bool { return tc.terminal }
		err := cacheClear(context.Background(), c, false)
		if code := exitCode(err); err != nil && code != tc.code || err == nil && tc.code != 0 {
			t.Fatalf("terminal %v, answer %q: got %v (exit %d), want exit %d", tc.terminal, tc.answer, err, code, tc.code)
		}
		if tc.terminal && !strings.Contains(errb.String(), "Delete every cache entry of "+url+"? [y/N] ") {
			t.Fatalf("no question asked: %q", errb.String())
		}
		if n := count(); n != tc.left {
			t.Fatalf("terminal %v, answer %q: %d entries left, want %d", tc.terminal, tc.answer, n, tc.left)
		}
	}
}

func TestCacheNamespaces(t *testing.T) {
	url := testStores(t)[1].url
	want(t, invoke(t, "", "--store", url+"?prefix=a:", "cache", "set", "k", "in-a"), 0)
	want(t, invoke(t, "", "--store", url+"?prefix=b:", "cache", "set", "k", "in-b"), 0)
	want(t, invoke(t, "", "--store", url+"?prefix=a:", "cache", "clear", "--yes"), 0)
	r := invoke(t, "", "--store", url+"?prefix=b:", "cache", "get", "k")
	want(t, r, 0)
	wantLines(t, r, `in-b`)
	r = invoke(t, "", "--store", url+"?prefix=a", "cache", "keys")
	want(t, r, exitUsage)
	if !strings.Contains(r.stderr, "prefix") {
		t.Fatalf("bad prefix: %s", r)
	}
}

func TestIdemCommands(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		ctx := context.Background()
		st := openTestStore(t, url)
		if _, out, err := st.Idempotency().Claim(ctx, "charge:1", "worker-1", time.Minute, "fp-1"); err != nil || out != driver.Claimed {
			t.Fatalf("claim: %v %v", out, err)
		}
		if ok, err := st.Idempotency().Complete(ctx, "charge:1", "worker-1", []byte(`{"receipt":42}`), time.Hour); err != nil || !ok {
			t.Fatalf("complete: %v %v", ok, err)
		}
		if _, out, err := st.Idempotency().Claim(ctx, "charge:2", "worker-2", time.Minute, ""); err != nil || out != driver.Claimed {
			t.Fatalf("claim: %v %v", out, err)
		}

		r := invoke(t, "", "--store", url, "idem", "ls")
		want(t, r, 0)
		wantLines(t, r,
			`KEY +STATUS +OWNER +CREATED +EXPIRES +RESULT`,
			`charge:1 +completed +worker-1 +`+rfc3339ms+` +`+rfc3339ms+` +14 bytes`,
			`charge:2 +pending +worker-2 +`+rfc3339ms+` +`+rfc3339ms+` +-`)
		r = invoke(t, "", "--store", url, "-o", "json", "idem", "ls", "charge:1")
		want(t, r, 0)
		var raw []json.RawMessage
		decode(t, r, &raw)
		if len(raw) != 1 {
			t.Fatalf("idem ls pattern: %s", r)
		}
		wantKeys(t, string(raw[0]), "key", "status", "owner", "fingerprint", "created_at", "expires_at", "result_bytes")

		r = invoke(t, "", "--store", url, "idem", "show", "charge:1")
		want(t, r, 0)
		wantLines(t, r, `key: +charge:1`, `status: +completed`, `owner: +worker-1`, `fingerprint: +fp-1`,
			`created_at: +`+rfc3339ms, `expires_at: +`+rfc3339ms, `result_bytes: +14`, `result: +\{"receipt":42\}`)
		r = invoke(t, "", "--store", url, "-o", "json", "idem", "show", "charge:1")
		want(t, r, 0)
		wantKeys(t, r.stdout, "key", "status", "owner", "fingerprint", "created_at", "expires_at", "result_bytes", "result", "encoding")
		var rec idemJSON
		decode(t, r, &rec)
		if rec.Result == nil || *rec.Result != `{"receipt":42}` || rec.Encoding != "text" || rec.Status != "completed" {
			t.Fatalf("idem show json: %+v", rec)
		}
		r = invoke(t, "", "--store", url, "idem", "show", "charge:9")
		want(t, r, exitNotFound)

		r = invoke(t, "", "--store", url, "idem", "rm", "charge:2")
		want(t, r, 0)
		wantLines(t, r, `removed idempotency key charge:2`)
		r = invoke(t, "", "--store", url, "idem", "rm", "charge:2")
		want(t, r, exitNotFound)
		r = invoke(t, "", "--store", url, "-o", "json", "idem", "rm", "charge:1")
		want(t, r, 0)
		wantKeys(t, r.stdout, "key", "removed")
		r = invoke(t, "", "--store", url, "-o", "json", "idem", "ls")
		if strings.TrimSpace(r.stdout) != "[]" {
			t.Fatalf("idem ls after rm: %s", r)
		}
	})
}

func TestCheckpointCommands(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		ctx := context.Background()
		st := openTestStore(t, url)
		for i := 1; i <= 11; i++ {
			in := driver.CheckpointInput{TaskID: "import", Progress: float64(i) * 8.5, Data: []byte(`{"row":` + strconv.Itoa(i) + `}`), ETA: time.Duration(i) * time.Second}
			if _, ok, err := st.Checkpoints().Save(ctx, in); err != nil || !ok {
				t.Fatalf("save: %v %v", ok, err)
			}
		}
		if _, _, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "other task", Data: []byte{0xfe}}); err != nil {
			t.Fatal(err)
		}

		r := invoke(t, "", "--store", url, "checkpoint", "ls")
		want(t, r, 0)
		wantLines(t, r, `TASK`, `import`, `"other task"`)
		r = invoke(t, "", "--store", url, "-o", "json", "checkpoint", "ls")
		want(t, r, 0)
		var tasks []struct {
			TaskID string `json:"task_id"`
		}
		decode(t, r, &tasks)
		if len(tasks) != 2 || tasks[0].TaskID != "import" || tasks[1].TaskID != "other task" {
			t.Fatalf("checkpoint ls json: %+v", tasks)
		}

		r = invoke(t, "", "--store", url, "checkpoint", "ls", "import")
		want(t, r, 0)
		lines := []string{`ID +SEQ +TIME +PROGRESS +ETA +TOKEN +DATA`}
		for i := 1; i <= 11; i++ { // numeric order: 9 before 10
			lines = append(lines, `import:`+strconv.Itoa(i)+` +`+strconv.Itoa(i)+` +`+rfc3339ms+` +`+strings.ReplaceAll(strconv.FormatFloat(float64(i)*8.5, 'f', -1, 64), ".", `\.`)+`% +`+strconv.Itoa(i)+`s +- +\d+ bytes`)
		}
		wantLines(t, r, lines...)
		r = invoke(t, "", "--store", url, "-o", "json", "checkpoint", "ls", "import")
		want(t, r, 0)
		var raw []json.RawMessage
		decode(t, r, &raw)
		if len(raw) != 11 {
			t.Fatalf("checkpoint ls task json: %s", r)
		}
		wantKeys(t, string(raw[10]), "id", "task_id", "sequence", "time", "progress", "eta_ms", "token", "data_bytes")

		r = invoke(t, "", "--store", url, "checkpoint", "show", "import:10")
		want(t, r, 0)
		wantLines(t, r, `id: +import:10`, `task_id: +import`, `sequence: +10`, `time: +`+rfc3339ms, `progress: +85%`,
			`eta: +10s`, `token: +-`, `data_bytes: +10`, `data: +\{"row":10\}`)
		r = invoke(t, "", "--store", url, "-o", "json", "checkpoint", "show", "import:10")
		want(t, r, 0)
		wantKeys(t, r.stdout, "id", "task_id", "sequence", "time", "progress", "eta_ms", "token", "data_bytes", "data", "encoding")
		var cp checkpointJSON
		decode(t, r, &cp)
		if cp.Sequence != 10 || cp.ETAMs != 10000 || cp.Progress != 85 || cp.Data == nil || *cp.Data != `{"row":10}` {
			t.Fatalf("checkpoint show json: %+v", cp)
		}
		r = invoke(t, "", "--store", url, "-o", "json", "checkpoint", "show", "other task:1")
		want(t, r, 0)
		decode(t, r, &cp)
		if cp.Encoding != "base64" || *cp.Data != "/g==" {
			t.Fatalf("binary checkpoint: %+v", cp)
		}
		r = invoke(t, "", "--store", url, "checkpoint", "show", "import:99")
		want(t, r, exitNotFound)

		r = invoke(t, "", "--store", url, "checkpoint", "prune", "import")
		want(t, r, exitUsage)
		r = invoke(t, "", "--store", url, "checkpoint", "prune", "import", "--keep", "-1")
		want(t, r, exitUsage)
		r = invoke(t, "", "--store", url, "checkpoint", "prune", "import", "--keep", "5")
		want(t, r, 0)
		wantLines(t, r, `deleted 6 checkpoints of task import, kept the newest 5`)
		r = invoke(t, "", "--store", url, "-o", "json", "checkpoint", "prune", "--keep", "3", "import")
		want(t, r, 0)
		wantKeys(t, r.stdout, "task_id", "keep", "deleted")
		if !strings.Contains(r.stdout, `"deleted": 2`) {
			t.Fatalf("prune json: %s", r)
		}
		if cps, _ := st.Checkpoints().List(ctx, "import"); len(cps) != 3 || cps[0].Sequence != 9 {
			t.Fatalf("after prune: %+v", cps)
		}

		r = invoke(t, "", "--store", url, "checkpoint", "rm", "import")
		want(t, r, 0)
		wantLines(t, r, `deleted 3 checkpoints of task import`)
		r = invoke(t, "", "--store", url, "checkpoint", "rm", "import")
		want(t, r, exitNotFound)
		r = invoke(t, "", "--store", url, "-o", "json", "checkpoint", "rm", "other task")
		want(t, r, 0)
		wantKeys(t, r.stdout, "task_id", "deleted")
		r = invoke(t, "", "--store", url, "-o", "json", "checkpoint", "ls", "import")
		if strings.TrimSpace(r.stdout) != "[]" {
			t.Fatalf("ls after rm: %s", r)
		}
	})
}

func TestMigratePingVersion(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		r := invoke(t, "", "--store", url, "migrate")
		want(t, r, 0)
		wantLines(t, r, `migrated the (memory|sqlite) store at "\S+": tables and indexes are in place`)
		r = invoke(t, "", "--store", url, "-o", "json", "migrate")
		want(t, r, 0)
		wantKeys(t, r.stdout, "store", "url", "migrated")

		r = invoke(t, "", "--store", url, "ping")
		want(t, r, 0)
		wantLines(t, r, `the (memory|sqlite) store at \S+ answered in \S+`)
		r = invoke(t, "", "--store", url, "-o", "json", "ping")
		want(t, r, 0)
		wantKeys(t, r.stdout, "store", "url", "latency_ms")
	})
	r := invoke(t, "", "version")
	want(t, r, 0)
	wantLines(t, r, `warden: +\S+`, `go: +go1\.\S+`, `platform: +\w+/\w+`, `stores: +dynamodb, memory, mongodb, mongodb\+srv, mysql, postgres, postgresql, redis, rediss, sqlite, unix$`)
	r = invoke(t, "", "-o", "json", "version")
	want(t, r, 0)
	wantKeys(t, r.stdout, "version", "go", "platform", "stores")
}
