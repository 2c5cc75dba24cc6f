package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/warden-go/warden"
)

// result is what one in-process run of warden produced.
type result struct {
	code   int
	stdout string
	stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// invoke runs warden in-process with the test's environment.
func invoke(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return invokeCtx(t, context.Background(), stdin, args...)
}

func invokeCtx(t *testing.T, ctx context.Context, stdin string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(ctx, args, strings.NewReader(stdin), &out, &errb, testEnv())
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// testEnv is the process environment without WARDEN_STORE, so that
// tests always name their store, and without OpenTelemetry's variables,
// so that no test exports telemetry unless it says so.
func testEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WARDEN_STORE=") && !strings.HasPrefix(kv, "OTEL_") {
			env = append(env, kv)
		}
	}
	return env
}

// storeCase is a store the output tests run on.
type storeCase struct {
	name string
	url  string
}

var memoryDBs atomic.Int64

// testStores returns a fresh store of every registered kind: a memory
// database private to the test and a SQLite file in its temp dir.
func testStores(t *testing.T) []storeCase {
	return []storeCase{
		{"memory", fmt.Sprintf("memory://cli-test-%d-%d", os.Getpid(), memoryDBs.Add(1))},
		{"sqlite", "sqlite://" + filepath.Join(t.TempDir(), "warden.db")},
	}
}

// eachStore runs f as a subtest on every store.
func eachStore(t *testing.T, f func(t *testing.T, url string)) {
	for _, sc := range testStores(t) {
		t.Run(sc.name, func(t *testing.T) { f(t, sc.url) })
	}
}

// openTestStore opens url for seeding and checking records.
func openTestStore(t *testing.T, url string) *warden.Store {
	t.Helper()
	st, err := warden.Open(context.Background(), url)
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// want checks the exit code and that stderr is empty (code 0) or one line
// (otherwise).
func want(t *testing.T, r result, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got %s", code, r)
	}
	if code == 0 && r.stderr != "" {
		t.Fatalf("want empty stderr, got %s", r)
	}
	switch code {
	case exitFailed, exitUsage, exitNotFound, exitUnreachable, exitLeaseLost, exitInterrupted:
		oneErrorLine(t, r)
	}
}

// oneErrorLine checks that stderr is exactly one line starting "warden: ".
func oneErrorLine(t *testing.T, r result) {
	t.Helper()
	if !strings.HasPrefix(r.stderr, "warden: ") || strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") {
		t.Fatalf("want one line 'warden: …' on stderr, got %s", r)
	}
}

// wantLines checks stdout line by line against regular expressions.
func wantLines(t *testing.T, r result, patterns ...string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if r.stdout == "" {
		lines = nil
	}
	if len(lines) != len(patterns) {
		t.Fatalf("want %d lines of output, got %d: %s", len(patterns), len(lines), r)
	}
	for i, p := range patterns {
		if !regexp.MustCompile("^" + p + "$").MatchString(lines[i]) {
			t.Fatalf("line %d: %q does not match %q\n%s", i+1, lines[i], p, r)
		}
	}
}

// decode parses stdout as JSON into v, refusing unknown fields.
func decode(t *testing.T, r result, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("stdout is not the expected JSON: %v\n%s", err, r)
	}
}

// jsonKeys returns the field names of a JSON object, in order, checking
// the stable names of the output.
func jsonKeys(t *testing.T, obj string) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(obj))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		t.Fatalf("not a JSON object: %q", obj)
	}
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

func wantKeys(t *testing.T, obj string, keys ...string) {
	t.Helper()
	if got := jsonKeys(t, obj); strings.Join(got, ",") != strings.Join(keys, ",") {
		t.Fatalf("JSON fields: want %v, got %v in %s", keys, got, obj)
	}
}

// rfc3339ms matches a time as warden prints it.
const rfc3339ms = `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z`
