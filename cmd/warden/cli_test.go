package main

import (
	"context"
	"database/sql"
	"github.com/warden-go/warden/internal/testkit"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		r := invoke(t, "", args...)
		want(t, r, 0)
		for _, s := range []string{"Usage:", "Available Commands:", "Flags:", "--store URL", "-o, --output FORMAT", "--timeout DURATION", "Exit codes:", "Examples:", "WARDEN_STORE", "Stores (registered schemes:", "same ?prefix=", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
			if !strings.Contains(r.stdout, s) {
				t.Fatalf("%q: help lacks %q:\n%s", args, s, r.stdout)
			}
		}
		for _, e := range exitCodes {
			if !strings.Contains(r.stdout, "\n  "+itoa(e.code)+" ") {
				t.Fatalf("help lacks exit code %d", e.code)
			}
		}
		// lock run's own codes, which the README's table lists too.
		for _, s := range []string{`\n  126 +lock run: the command was found but is not executable\n`, `\n  127 +lock run: the command was not found\n`} {
			if !regexp.MustCompile(s).MatchString(r.stdout) {
				t.Fatalf("help lacks %s:\n%s", s, r.stdout)
			}
		}
		for _, name := range []string{"lock", "breaker", "cache", "idem", "checkpoint", "migrate", "ping", "version", "completion", "help"} {
			if !strings.Contains(r.stdout, "\n  "+name+" ") {
				t.Fatalf("help lacks command %q:\n%s", name, r.stdout)
			}
		}
	}
	// Every command has a help with its usage, flags, the global flags and
	// an example, in three spellings.
	for _, cmd := range commands {
		words := strings.Fields(cmd.path)
		for _, args := range [][]string{append(append([]string{}, words...), "--help"), append([]string{"help"}, words...), append(append([]string{}, words...), "-h")} {
			r := invoke(t, "", args...)
			want(t, r, 0)
			for _, s := range []string{"\nUsage:\n  warden " + cmd.path, "\nExamples:\n  warden ", "\nGlobal Flags:\n", "--store URL"} {
				if !strings.Contains(r.stdout, s) {
					t.Fatalf("%q: help lacks %q:\n%s", args, s, r.stdout)
				}
			}
		}
	}
	// A command's help lists its flags.
	r := invoke(t, "", "lock", "run", "--help")
	for _, s := range []string{"--ttl duration", "--wait duration", "--no-wait", "--grace duration"} {
		if !strings.Contains(r.stdout, s) {
			t.Fatalf("lock run --help lacks %q:\n%s", s, r.stdout)
		}
	}
	// After KEY, --help is still a request for help, not the command's.
	r = invoke(t, "", "lock", "run", "k", "--help")
	want(t, r, 0)
	if !strings.Contains(r.stdout, "Usage:\n  warden lock run") {
		t.Fatalf("lock run k --help:\n%s", r)
	}
	for _, g := range groups {
		for _, args := range [][]string{{g.name, "--help"}, {"help", g.name}} {
			r := invoke(t, "", args...)
			want(t, r, 0)
			if !strings.Contains(r.stdout, "Available Commands:") {
				t.Fatalf("%q:\n%s", args, r.stdout)
			}
			for _, sub := range subcommands(g.name) {
				if !strings.Contains(r.stdout, "\n  "+sub+" ") {
					t.Fatalf("%q lacks %q:\n%s", args, sub, r.stdout)
				}
			}
		}
	}
	for _, args := range [][]string{{"help", "completion"}, {"completion", "--help"}, {"completion", "powershell", "--help"}} {
		r := invoke(t, "", args...)
		want(t, r, 0)
		if !strings.Contains(r.stdout, "Usage:") {
			t.Fatalf("%q:\n%s", args, r.stdout)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestUsageErrors(t *testing.T) {
	url := testStores(t)[0].url
	for _, args := range [][]string{
		{},
		{"bogus"},
		{"lock"},
		{"lock", "bogus"},
		{"--bogus", "ping"},
		{"ping", "--bogus"},
		{"ping", "extra"},
		{"-o", "yaml", "ping"},
		{"ping", "--timeout", "0s"},
		{"ping", "--timeout", "soon"},
		{"lock", "show"},
		{"lock", "show", "a", "b"},
		{"cache", "set", "k"},
		{"cache", "get", ""},
		{"lock", "ls", `oops\`},
		{"checkpoint", "prune", "t", "--keep", "x"},
		{"completion"},
		{"completion", "tcsh"},
		{"help", "bogus"},
	} {
		r := invoke(t, "", append([]string{"--store", url}, args...)...)
		if r.code != exitUsage {
			t.Errorf("%q: want exit 2, got %s", args, r)
			continue
		}
		if len(args) == 0 {
			// warden alone prints its help on stderr.
			if !strings.Contains(r.stderr, "Usage:") {
				t.Errorf("warden alone: %s", r)
			}
			continue
		}
		oneErrorLine(t, r)
	}
}

func TestGlobalFlagsAnywhere(t *testing.T) {
	url := testStores(t)[0].url
	for _, args := range [][]string{
		{"--store", url, "-o", "json", "cache", "keys"},
		{"cache", "keys", "--store", url, "--output=json"},
		{"-o=json", "cache", "keys", "--store=" + url},
	} {
		r := invoke(t, "", args...)
		want(t, r, 0)
		if strings.TrimSpace(r.stdout) != "[]" {
			t.Fatalf("%q: %s", args, r)
		}
	}
	// WARDEN_STORE names the store; --store wins over it.
	var out, errb testkit.LogBuffer
	env := append(testEnv(), "WARDEN_STORE="+url)
	if code := run(context.Background(), []string{"cache", "set", "from-env", "1"}, strings.NewReader(""), &out, &errb, env); code != 0 {
		t.Fatalf("WARDEN_STORE: exit %d %s", code, errb.String())
	}
	r := invoke(t, "", "--store", url, "cache", "get", "from-env")
	want(t, r, 0)
	other := testStores(t)[0].url
	if code := run(context.Background(), []string{"--store", other, "cache", "get", "from-env"}, strings.NewReader(""), &out, &errb, env); code != exitNotFound {
		t.Fatalf("--store over WARDEN_STORE: exit %d", code)
	}
}

func TestDefaultStore(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	r := invoke(t, "", "cache", "set", "k", "v")
	want(t, r, 0)
	if _, err := os.Stat(filepath.Join(dir, "warden.db")); err != nil {
		t.Fatalf("default store: %v", err)
	}
}

func TestPasswordsNeverPrinted(t *testing.T) {
	// Each URL with the exit code its ping must give: 2 for a bad or
	// unknown store URL, 5 for a registered store nobody answers for.
	for url, code := range map[string]int{
		"mysql://user:s3cret@127.0.0.1:1/app?timeout=2s":           exitUnreachable,
		"postgres://user:s3cret@127.0.0.1:1/db?sslmode=disable":    exitUnreachable,
		"redis://user:s3cret@127.0.0.1:1/0":                        exitUnreachable,
		"redis://:s3cret@127.0.0.1:1/0?addr=127.0.0.1:2":           exitUnreachable,
		"sqlite://user:s3cret@host/file.db":                        exitUsage,
		"memory://user:s3cret@name":                                exitUsage,
		"sqlite:///x.db?password=s3cret&prefix=a:":                 exitUsage,
		"mysql://user:s3cret@%zz/":                                 exitUsage,
		"mongodb://user:s3cret@127.0.0.1:1/db?bogus=1":             exitUsage,
		"dynamodb://t?endpoint=http://127.0.0.1:1&password=s3cret": exitUsage,
		"dynamodb://t?endpoint=http://u:s3cret@127.0.0.1:1":        exitUsage,
		"dynamodb://t?endpoint=http%3A%2F%2Fu%3As3cret%40h%3A1":    exitUsage,
	} {
		for _, args := range [][]string{{"ping"}, {"--help"}, {"lock", "ls", "--help"}, {"-o", "json", "migrate"}} {
			r := invoke(t, "", append([]string{"--store", url}, args...)...)
			if strings.Contains(r.stdout+r.stderr, "s3cret") {
				t.Fatalf("%s %q printed the password: %s", url, args, r)
			}
			if args[0] == "ping" {
				oneErrorLine(t, r)
				if r.code != code {
					t.Fatalf("%s: want exit %d, got %s", url, code, r)
				}
			}
		}
		var out, errb testkit.LogBuffer
		run(context.Background(), []string{"--help"}, strings.NewReader(""), &out, &errb, append(testEnv(), "WARDEN_STORE="+url))
		if strings.Contains(out.String()+errb.String(), "s3cret") {
			t.Fatalf("help printed WARDEN_STORE's password")
		}
	}
	r := invoke(t, "", "--store", "etcd://user:s3cret@db/0", "ping")
	if !strings.Contains(r.stderr, "registered schemes are dynamodb, memory, mongodb, mongodb+srv, mysql, postgres, postgresql, redis, rediss, sqlite, unix") {
		t.Fatalf("unknown scheme: %s", r)
	}
}

func TestScrubSecrets(t *testing.T) {
	got := scrubSecrets("dial user:p%40ss%20w0rd@host failed for p@ss w0rd, p%40ss+w0rd, p@ss%20w0rd; token t0ken", "x://user:p%40ss%20w0rd@host/?auth_token=t0ken")
	if strings.Contains(got, "w0rd") || strings.Contains(got, "t0ken") {
		t.Fatalf("scrubSecrets left the password: %q", got)
	}
}

func TestUnreachable(t *testing.T) {
	dir := t.TempDir()
	notADB := filepath.Join(dir, "not-a-db")
	if err := os.WriteFile(notADB, []byte(strings.Repeat("this is not a database ", 40)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, url := range []string{
		"sqlite://" + filepath.Join(dir, "no-such-dir", "w.db"),
		"sqlite://" + dir, // a directory
		"sqlite://" + notADB,
	} {
		for _, format := range []string{"table", "json"} {
			r := invoke(t, "", "--store", url, "-o", format, "--timeout", "5s", "lock", "ls")
			want(t, r, exitUnreachable)
			if !strings.HasPrefix(r.stderr, "warden: store unreachable: ") || r.stdout != "" {
				t.Fatalf("%s: %s", url, r)
			}
		}
	}
}

// holdWriteLock takes SQLite's write lock on the database at path (through
// the database/sql driver the sqlite store registers) until the test ends.
func holdWriteLock(t *testing.T, path string) {
	t.Helper()
	ctx := context.Background()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN EXCLUSIVE"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.ExecContext(ctx, "ROLLBACK")
		conn.Close()
		db.Close()
	})
}

func TestTimeout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.db")
	url := "sqlite://" + path
	want(t, invoke(t, "", "--store", url, "migrate"), 0)
	holdWriteLock(t, path)
	r := invoke(t, "", "--store", url, "--timeout", "300ms", "cache", "set", "k", "v")
	want(t, r, exitUnreachable)
	// The --timeout path answered, not SQLite's own 5 s busy timeout.
	if !strings.Contains(r.stderr, "no answer from the sqlite store within 300ms (--timeout)") {
		t.Fatalf("timeout message: %s", r)
	}
}

// TestCompletion: the four shells' scripts (cobra's), and the answers
// they get from warden's hidden __complete command.
func TestCompletion(t *testing.T) {
	for shell, register := range map[string]string{
		"bash":       "complete -o default -F __start_warden warden",
		"zsh":        "#compdef warden",
		"fish":       "complete -c warden ",
		"powershell": "Register-ArgumentCompleter",
	} {
		r := invoke(t, "", "completion", shell)
		want(t, r, 0)
		if !strings.Contains(r.stdout, register) {
			t.Fatalf("%s completion does not register (%q):\n%s", shell, register, r.stdout)
		}
	}
	for _, tc := range []struct {
		words []string // the last is completed
		want  string   // one of the answers
	}{
		{[]string{"lo"}, "lock"},
		{[]string{"lock", "re"}, "release"},
		{[]string{"-o", "json", "checkpoint", "p"}, "prune"},
		{[]string{"checkpoint", "prune", "task", "--k"}, "--keep"},
		{[]string{"lock", "run", "--no"}, "--no-wait"},
		{[]string{"lock", "run", "k", "--no"}, "--no-wait"},
		{[]string{"lock", "run", "k", "--st"}, "--store"},
		{[]string{"-o", ""}, "json"},
		{[]string{"--store", "x", "--out"}, "--output"},
		{[]string{"completion", "p"}, "powershell"},
		{[]string{"help", "lock", "w"}, "watch"},
	} {
		r := invoke(t, "", append([]string{"__completeNoDesc"}, tc.words...)...)
		if r.code != 0 {
			t.Fatalf("completing %q: %s", tc.words, r)
		}
		found := false
		for _, line := range strings.Split(r.stdout, "\n") {
			found = found || line == tc.want
		}
		if !found {
			t.Errorf("completing %q: want %q among:\n%s", tc.words, tc.want, r.stdout)
		}
	}
}

func TestShortCutsOnCharacters(t *testing.T) {
	s := strings.Repeat("é", 100) // 2 bytes each: byte 64 starts a character, 63 does not
	for _, in := range []string{s, "x" + s} {
		got := short(in)
		if !utf8.ValidString(got) || !strings.HasSuffix(got, "…("+itoa(len(in))+" bytes)") || len(got) > maxShown+20 {
			t.Fatalf("short(%d bytes) = %q", len(in), got)
		}
	}
	if short("abc") != "abc" || quoteShort("abc") != `"abc"` {
		t.Fatal("short strings must be shown whole")
	}
}
