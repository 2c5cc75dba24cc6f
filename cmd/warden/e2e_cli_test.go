//go:build unix

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// End-to-end checks of the messages and exit codes a newcomer meets first,
// through the built binary.

// TestE2ELongKeysCutInMessages: a 10 KB key is refused (exit 2) in one short
// line that names the key's length instead of echoing it.
func TestE2ELongKeysCutInMessages(t *testing.T) {
	_, url := e2eStore(t)
	key := strings.Repeat("k", 10240)
	for _, args := range [][]string{
		{"cache", "set", key, "v"},
		{"cache", "get", key},
		{"lock", "run", key, "--", "true"},
		{"breaker", "open", key},
	} {
		r := runWarden(t, nil, append([]string{"--store", url}, args...)...)
		want(t, r, exitUsage)
		oneErrorLine(t, r)
		if len(r.stderr) > 300 || !strings.Contains(r.stderr, "…(10240 bytes)") || !strings.Contains(r.stderr, strings.Repeat("k", maxShown)) {
			t.Fatalf("%s %s: want one short line naming the key's length, got %d bytes: %.400s", args[0], args[1], len(r.stderr), r.stderr)
		}
	}
}

// TestE2ELockRunCommandNotStarted: the README's table — 127 when the command
// is not found, 126 when it cannot be executed.
func TestE2ELockRunCommandNotStarted(t *testing.T) {
	dir, url := e2eStore(t)
	notExec := filepath.Join(dir, "not-executable")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cmd  string
		code int
	}{
		{"/nonexistent/cmd", 127},
		{"warden-no-such-command-in-path", 127},
		{notExec, 126},
	} {
		r := runWarden(t, nil, "--store", url, "lock", "run", "x", "--", c.cmd)
		if r.code != c.code {
			t.Fatalf("lock run -- %s: want exit %d, got %s", c.cmd, c.code, r)
		}
		oneErrorLine(t, r)
	}
	// The lock was released each time.
	want(t, runWarden(t, nil, "--store", url, "lock", "show", "x"), exitNotFound)
}

// TestE2ETTLTooShort: a --ttl under lock.MinTTL is refused before anything
// runs, naming the minimum.
func TestE2ETTLTooShort(t *testing.T) {
	_, url := e2eStore(t)
	r := runWarden(t, nil, "--store", url, "lock", "run", "--ttl", "1ms", "x", "--", "true")
	want(t, r, exitUsage)
	oneErrorLine(t, r)
	if !strings.Contains(r.stderr, "10ms") {
		t.Fatalf("want the minimum 10ms named: %s", r)
	}
}

// TestE2EInvalidPortIsUsage: a port no store can dial is a bad store URL
// (2), not an unreachable store (5); no server is needed to tell.
func TestE2EInvalidPortIsUsage(t *testing.T) {
	for _, url := range []string{
		"mysql://root@127.0.0.1:99999/x",
		"mysql://root@127.0.0.1:0/x",
		"mongodb://127.0.0.1:27017,127.0.0.1:70000/db",
		"dynamodb://table?endpoint=http://127.0.0.1:99999",
	} {
		r := runWarden(t, nil, "--store", url, "--timeout", "5s", "ping")
		want(t, r, exitUsage)
		oneErrorLine(t, r)
		if !strings.Contains(r.stderr, "invalid port") || strings.Contains(r.stderr, "unreachable") {
			t.Fatalf("%s: %s", url, r)
		}
	}
}

// TestE2ENestedPasswordNeverPrinted: the password of a URL given as a query
// parameter (DynamoDB's endpoint) is masked in errors and in --help.
func TestE2ENestedPasswordNeverPrinted(t *testing.T) {
	for _, url := range []string{
		"dynamodb://t?endpoint=http://u:s3cret@127.0.0.1:1",
		"dynamodb://table?endpoint=http%3A%2F%2Fu%3As3cret%40127.0.0.1%3A1&bogus=1",
	} {
		for _, args := range [][]string{{"ping"}, {"--help"}, {"lock", "ls", "--help"}} {
			r := runWarden(t, nil, append([]string{"--store", url}, args...)...)
			if strings.Contains(r.stdout+r.stderr, "s3cret") {
				t.Fatalf("%s %q printed the password: %s", url, args, r)
			}
		}
		r := runWarden(t, []string{"WARDEN_STORE=" + url}, "--help")
		if strings.Contains(r.stdout+r.stderr, "s3cret") || !strings.Contains(r.stdout, "xxxxx") {
			t.Fatalf("--help with WARDEN_STORE=%s: %s", url, r)
		}
	}
}

// TestE2EStoreURLMessages: a store URL without a scheme says so and lists the
// registered schemes; a URL ending in a colon is quoted, not followed by
// a second colon.
func TestE2EStoreURLMessages(t *testing.T) {
	r := runWarden(t, nil, "--store", "not a url", "ping")
	want(t, r, exitUsage)
	oneErrorLine(t, r)
	if !strings.Contains(r.stderr, "needs a scheme") || !strings.Contains(r.stderr, "registered schemes are dynamodb, memory, mongodb, mongodb+srv, mysql, sqlite") || strings.Contains(r.stderr, `scheme ""`) {
		t.Fatalf("no scheme: %s", r)
	}
	dir := t.TempDir()
	for _, url := range []string{
		"sqlite:",
		"sqlite://" + filepath.Join(dir, "missing", "w.db") + "?prefix=billing:",
	} {
		r := runWarden(t, nil, "--store", url, "--timeout", "5s", "lock", "ls")
		oneErrorLine(t, r)
		if strings.Contains(r.stderr, "::") || !strings.Contains(r.stderr, `open "`+url+`": `) {
			t.Fatalf("%s: %s", url, r)
		}
	}
}

// TestE2EBreakerCloseUnknown: closing a circuit without a record exits 4 and
// creates nothing; closing an existing one still forces it closed.
func TestE2EBreakerCloseUnknown(t *testing.T) {
	_, url := e2eStore(t)
	r := runWarden(t, nil, "--store", url, "breaker", "close", "TYPO")
	want(t, r, exitNotFound)
	oneErrorLine(t, r)
	want(t, runWarden(t, nil, "--store", url, "breaker", "show", "TYPO"), exitNotFound)
	r = runWarden(t, nil, "--store", url, "-o", "json", "breaker", "ls")
	want(t, r, 0)
	if strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("breaker close TYPO created a record: %s", r)
	}

	want(t, runWarden(t, nil, "--store", url, "breaker", "open", "payments"), 0)
	want(t, runWarden(t, nil, "--store", url, "breaker", "show", "payments"), exitHeld)
	r = runWarden(t, nil, "--store", url, "breaker", "close", "payments")
	want(t, r, 0)
	if !strings.Contains(r.stdout, "state:        closed") {
		t.Fatalf("breaker close payments: %s", r)
	}
	want(t, runWarden(t, nil, "--store", url, "breaker", "show", "payments"), 0)
}
