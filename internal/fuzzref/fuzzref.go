// Package fuzzref holds what the fuzz targets of several warden modules
// share: reference evaluators of the pattern languages the stores hand
// their servers (SQL LIKE with an escape character, SQLite GLOB, Redis
// MATCH), against which each store's rendering of a driver.Pattern is
// compared, and the store URLs with a password in every place a URL can
// carry one, with a check that no message shows it.
//
// It is imported only from _test.go files.
package fuzzref

import (
	"flag"
	"net/url"
	"os"
	"strings"
	"testing"
	"unicode/utf8"
)

// Like reports whether s matches the SQL LIKE pattern pat with escape
// character esc, per character (code point), as PostgreSQL under COLLATE
// "C" and MySQL under utf8mb4_bin compare: '%' matches any run, '_' one
// character, esc makes the next character literal. A pattern ending in
// esc matches nothing.
func Like(pat, s string, esc rune) bool {
	pr, sr := []rune(pat), []rune(s)
	// Dynamic programming over (pattern position, string position), so
	// that fuzzed patterns with many '%' stay linear in their product.
	memo := map[[2]int]bool{}
	var rec func(i, j int) bool
	rec = func(i, j int) bool {
		k := [2]int{i, j}
		if v, ok := memo[k]; ok {
			return v
		}
		var r bool
		switch {
		case i == len(pr):
			r = j == len(sr)
		case pr[i] == esc:
			r = i+1 < len(pr) && j < len(sr) && sr[j] == pr[i+1] && rec(i+2, j+1)
		case pr[i] == '%':
			r = rec(i+1, j) || j < len(sr) && rec(i, j+1)
		case pr[i] == '_':
			r = j < len(sr) && rec(i+1, j+1)
		default:
			r = j < len(sr) && sr[j] == pr[i] && rec(i+1, j+1)
		}
		memo[k] = r
		return r
	}
	return rec(0, 0)
}

// SQLiteGlob reports whether s matches the pattern pat of SQLite's GLOB
// operator (case-sensitive, per UTF-8 character): '*' any run, '?' one
// character, '[...]' a class of characters with ranges and a leading '^'
// for negation, a ']' first in the class being literal; no escape
// character. It follows sqlite3's patternCompare.
func SQLiteGlob(pat, s string) bool {
	memo := map[[2]int]bool{}
	var rec func(i, j int) bool
	rec = func(i, j int) bool {
		k := [2]int{i, j}
		if v, ok := memo[k]; ok {
			return v
		}
		var r bool
		switch {
		case i == len(pat):
			r = j == len(s)
		case pat[i] == '*':
			if j < len(s) {
				_, n := utf8.DecodeRuneInString(s[j:])
				r = rec(i+1, j) || rec(i, j+n)
			} else {
				r = rec(i+1, j)
			}
		case j == len(s):
			r = false
		case pat[i] == '?':
			_, n := utf8.DecodeRuneInString(s[j:])
			r = rec(i+1, j+n)
		case pat[i] == '[':
			c, n := utf8.DecodeRuneInString(s[j:])
			end, ok := classMatch(pat[i+1:], c)
			r = end >= 0 && ok && rec(i+1+end, j+n)
		default:
			c, n := utf8.DecodeRuneInString(pat[i:])
			d, m := utf8.DecodeRuneInString(s[j:])
			r = c == d && n == m && rec(i+n, j+m)
		}
		memo[k] = r
		return r
	}
	return rec(0, 0)
}

// classMatch matches c against the class that starts after a '[' in cls;
// it returns the length of the class's rest including its ']' (-1 when
// the class is not closed: sqlite3 then matches nothing) and whether c is
// in it.
func classMatch(cls string, c rune) (int, bool) {
	i, in, neg := 0, false, false
	if strings.HasPrefix(cls, "^") {
		neg, i = true, 1
	}
	if strings.HasPrefix(cls[i:], "]") {
		in = c == ']'
		i++
	}
	var prev rune = -1
	for i < len(cls) {
		r, n := utf8.DecodeRuneInString(cls[i:])
		switch {
		case r == ']':
			return i + 1, in != neg
		case r == '-' && prev >= 0 && i+n < len(cls) && cls[i+n] != ']':
			hi, m := utf8.DecodeRuneInString(cls[i+n:])
			if prev <= c && c <= hi {
				in = true
			}
			prev = -1
			i += n + m
			continue
		case r == c:
			in = true
		}
		prev = r
		i += n
	}
	return -1, false
}

// RedisMatch reports whether s matches the Redis glob pat (SCAN MATCH,
// KEYS), per byte as Redis's stringmatchlen does: '*' any run, '?' one
// byte, '\' makes the next byte literal, '[...]' a class with ranges and a
// leading '^'.
func RedisMatch(pat, s string) bool {
	memo := map[[2]int]bool{}
	var rec func(i, j int) bool
	rec = func(i, j int) bool {
		k := [2]int{i, j}
		if v, ok := memo[k]; ok {
			return v
		}
		var r bool
		switch {
		case i == len(pat):
			r = j == len(s)
		case pat[i] == '*':
			r = rec(i+1, j) || j < len(s) && rec(i, j+1)
		case j == len(s):
			r = false
		case pat[i] == '?':
			r = rec(i+1, j+1)
		case pat[i] == '\\' && i+1 < len(pat):
			r = s[j] == pat[i+1] && rec(i+2, j+1)
		case pat[i] == '[':
			end, ok := redisClass(pat[i+1:], s[j])
			r = ok && rec(i+1+end, j+1)
		default:
			r = s[j] == pat[i] && rec(i+1, j+1)
		}
		memo[k] = r
		return r
	}
	return rec(0, 0)
}

// redisClass matches byte c against the class after a '[' in cls, as
// stringmatchlen does (an unclosed class runs to the pattern's end); it
// returns how many bytes of cls the class takes and whether c is in it.
func redisClass(cls string, c byte) (int, bool) {
	i, in, neg := 0, false, false
	if strings.HasPrefix(cls, "^") {
		neg, i = true, 1
	}
	for i < len(cls) && cls[i] != ']' {
		switch {
		case cls[i] == '\\' && i+1 < len(cls):
			in = in || cls[i+1] == c
			i += 2
		case i+2 < len(cls) && cls[i+1] == '-':
			lo, hi := cls[i], cls[i+2]
			if lo > hi {
				lo, hi = hi, lo
			}
			in = in || lo <= c && c <= hi
			i += 3
		default:
			in = in || cls[i] == c
			i++
		}
	}
	if i < len(cls) {
		i++ // the ']'
	}
	return i, in != neg
}

// Secret places: where SecretURL puts the password.
const (
	InUserInfo  = iota // scheme://user:PASSWORD@host/…
	InParam            // ?password=PASSWORD (and token=, access_key=)
	InNestedURL        // ?endpoint=http://user:PASSWORD@host
	InAddr             // ?addr=user:PASSWORD@host:port
	secretPlaces
)

// SecretURL returns a store URL of scheme on host and path that carries
// password pw in the place place selects (modulo the number of places),
// followed by the raw query extra (as given, possibly malformed).
func SecretURL(scheme, host, path string, place int, pw, extra string) string {
	u := url.URL{Scheme: scheme, Host: host, Path: path}
	q := ""
	switch place % secretPlaces {
	case InUserInfo:
		u.User = url.UserPassword("user", pw)
	case InParam:
		name := []string{"password", "token", "access_key", "secret"}[len(pw)%4]
		q = name + "=" + url.QueryEscape(pw)
	case InNestedURL:
		q = "endpoint=" + url.QueryEscape((&url.URL{Scheme: "http", User: url.UserPassword("user", pw), Host: "127.0.0.1:1"}).String())
	case InAddr:
		q = "addr=" + url.QueryEscape("user:"+pw+"@127.0.0.1:1")
	}
	if extra != "" {
		if q != "" {
			q += "&"
		}
		q += extra
	}
	u.RawQuery = q
	return u.String()
}

// Leaked reports whether show, given a URL built around password pw,
// shows pw in any of the forms a URL carries it in (as is, path- or
// query-escaped, escaped twice). It compares with what show gives for the
// same URL with a password of the same length made of other characters,
// so that a short password that is also a word of the message ("e",
// "store") or of the rest of the URL does not count as leaked.
func Leaked(pw string, show func(pw string) string) (form string, leaked bool) {
	if pw == "" {
		return "", false
	}
	other := strings.Repeat("Z", utf8.RuneCountInString(pw))
	if strings.Contains(pw, "Z") {
		other = strings.Repeat("Q", utf8.RuneCountInString(pw))
	}
	got, ref := show(pw), show(other)
	for _, f := range forms(pw) {
		for _, c := range contexts(f) {
			if strings.Count(got, c) > strings.Count(ref, c) {
				return f, true
			}
		}
	}
	return "", false
}

// contexts returns what to look for in a message to find the password
// form f: f itself, or, for a form of under 4 bytes, which could be a word
// that a message with another password would spell otherwise (two unknown
// parameters listed in either order), f in the places a URL holds it:
// between ':' and '@', or after '=' up to the end of the parameter.
func contexts(f string) []string {
	if len(f) >= 4 {
		return []string{f}
	}
	return []string{":" + f + "@", "=" + f + "&", "=" + f + " ", "=" + f + "\"", "=" + f + "\n"}
}

// forms returns pw in the spellings a URL may hold it in.
func forms(pw string) []string {
	fs := []string{pw, url.PathEscape(pw), url.QueryEscape(pw), url.UserPassword("", pw).String()[1:]}
	for _, f := range fs[1:] {
		fs = append(fs, url.QueryEscape(f))
	}
	return fs
}

// CheckParseSecret fails t if parse's error, for the URL build makes
// around password pw, shows the password (see Leaked). A URL that
// url.Parse refuses is skipped.
func CheckParseSecret(t testing.TB, pw string, build func(pw string) string, parse func(u *url.URL) error) {
	t.Helper()
	show := func(pw string) string {
		u, err := url.Parse(build(pw))
		if err != nil {
			return ""
		}
		if err := parse(u); err != nil {
			return err.Error()
		}
		return ""
	}
	if form, ok := Leaked(pw, show); ok {
		t.Fatalf("the error shows the password as %q: %s", form, show(pw))
	}
}

// Fuzzing reports whether the test binary runs with -fuzz. Without it the
// seed corpus runs as plain tests, which may then use a test server.
func Fuzzing() bool {
	f := flag.Lookup("test.fuzz")
	return f != nil && f.Value.String() != ""
}

// ServerURL returns the test server URL in the environment variable env
// with ?prefix=prefix, or "" when there is none or the binary is fuzzing
// (a fuzz target's server checks run on its seed corpus only).
func ServerURL(t testing.TB, env, prefix string) string {
	raw := os.Getenv(env)
	if raw == "" || Fuzzing() {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%s: %v", env, err)
	}
	q := u.Query()
	q.Set("prefix", prefix)
	u.RawQuery = q.Encode()
	return u.String()
}
