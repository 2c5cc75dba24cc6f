package driver

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/warden-go/warden/internal/fuzzref"
)

var hostileKeys = []string{
	"plain", "a", "ab", "abc", "a*b", "axb", "a\\b", "a%b", "a_b", "a.b", "a[b]", "[a]", "a",
	"%", "_", "*", "?", "\\", ".*", "'; DROP TABLE x; --", "$where", `{"$gt":""}`,
	"user:1", "user:12", "user:é", "user:", "User:1", "ünï", "日本", "🔒key", "a\nb", "a b", "#:#",
}

func TestPatternMatch(t *testing.T) {
	cases := []struct {
		pat  string
		want []string
	}{
		{"", hostileKeys},
		{"*", hostileKeys},
		{"a", []string{"a", "a"}},
		{"a?b", []string{"a*b", "axb", "a\\b", "a%b", "a_b", "a.b", "a\nb", "a b"}},
		{"a\\*b", []string{"a*b"}},
		{"%", []string{"%"}},
		{"_", []string{"_"}},
		{".*", []string{".*"}},
		{"[a]", []string{"[a]"}},
		{"user:?", []string{"user:1", "user:é"}},
		{"user:*", []string{"user:1", "user:12", "user:é", "user:"}},
		{"?", []string{"a", "%", "_", "*", "?", "\\", "a", "日本"[:3]}},
		{"*b", []string{"ab", "a*b", "axb", "a\\b", "a%b", "a_b", "a.b", "a\nb", "a b"}},
		{"\\\\", []string{"\\"}},
		{"\\?", []string{"?"}},
	}
	keys := append(append([]string(nil), hostileKeys...), "日")
	for _, c := range cases {
		p, err := ParsePattern(c.pat)
		if err != nil {
			t.Fatalf("ParsePattern(%q): %v", c.pat, err)
		}
		want := map[string]bool{}
		for _, k := range c.want {
			want[k] = true
		}
		if c.pat == "?" || c.pat == "" || c.pat == "*" {
			want["日"] = true
		}
		for _, k := range keys {
			if got := p.Match(k); got != want[k] {
				t.Errorf("pattern %q, key %q: Match=%v, want %v", c.pat, k, got, want[k])
			}
		}
	}
}

func TestParsePatternErrors(t *testing.T) {
	for _, s := range []string{"a\\", "\\", string([]byte{0xff})} {
		if _, err := ParsePattern(s); !errors.Is(err, ErrBadPattern) {
			t.Errorf("ParsePattern(%q) = %v, want ErrBadPattern", s, err)
		}
	}
}

func TestPatternPrefixAndLiteral(t *testing.T) {
	for _, c := range []struct {
		pat, prefix string
		literal     bool
	}{
		{"", "", false}, {"abc", "abc", true}, {"ab*", "ab", false}, {"a\\*b", "a*b", true}, {"?x", "", false},
	} {
		p := MustPattern(c.pat)
		if got := p.Prefix(); got != c.prefix {
			t.Errorf("%q.Prefix() = %q, want %q", c.pat, got, c.prefix)
		}
		lit, ok := p.Literal()
		if ok != c.literal || (ok && lit != c.prefix) {
			t.Errorf("%q.Literal() = %q, %v", c.pat, lit, ok)
		}
	}
}

// TestPatternRenderings checks that every backend rendering, after a hostile
// namespace prefix, selects exactly the keys Match selects (Redis may select
// more: it matches bytes, and drivers re-check) and nothing outside the
// namespace.
func TestPatternRenderings(t *testing.T) {
	const ns = "ns%_*?[\\.:"
	pats := []string{"", "*", "a", "a?b", "a\\*b", "%", "_", ".*", "[a]", "user:?", "user:*", "?", "*b", "\\\\", "a*b*", "*:*"}
	others := []string{"other:a", "ns:a", "nsx%_*?[\\.:a", "NS%_*?[\\.:a"}
	for _, ps := range pats {
		p := MustPattern(ps)
		re := regexp.MustCompile(p.Regexp(ns))
		like, redis, glob := p.Like(ns, '\\'), p.RedisMatch(ns), p.SQLiteGlob(ns)
		like2 := p.Like(ns, '!')
		for _, k := range hostileKeys {
			want := p.Match(k)
			full := ns + k
			if got := re.MatchString(full); got != want {
				t.Errorf("pattern %q key %q: Regexp %q = %v, want %v", ps, k, p.Regexp(ns), got, want)
			}
			if got := fuzzref.Like(like, full, '\\'); got != want {
				t.Errorf("pattern %q key %q: LIKE %q = %v, want %v", ps, k, like, got, want)
			}
			if got := fuzzref.Like(like2, full, '!'); got != want {
				t.Errorf("pattern %q key %q: LIKE %q ESCAPE '!' = %v, want %v", ps, k, like2, got, want)
			}
			if got := fuzzref.SQLiteGlob(glob, full); got != want {
				t.Errorf("pattern %q key %q: GLOB %q = %v, want %v", ps, k, glob, got, want)
			}
			if want && !fuzzref.RedisMatch(redis, full) {
				t.Errorf("pattern %q key %q: Redis MATCH %q misses a matching key", ps, k, redis)
			}
		}
		for _, o := range others {
			if re.MatchString(o) || fuzzref.Like(like, o, '\\') || fuzzref.SQLiteGlob(glob, o) || fuzzref.RedisMatch(redis, o) {
				t.Errorf("pattern %q reaches %q outside namespace %q", ps, o, ns)
			}
		}
	}
}

func FuzzPatternRegexp(f *testing.F) {
	for _, k := range hostileKeys {
		f.Add("a*b?\\*", k)
	}
	f.Fuzz(func(t *testing.T, pat, key string) {
		p, err := ParsePattern(pat)
		if err != nil || !utf8.ValidString(key) {
			return
		}
		re := regexp.MustCompile(p.Regexp("ns:"))
		if got, want := re.MatchString("ns:"+key), p.Match(key); got != want {
			t.Fatalf("pattern %q key %q: regexp %v, Match %v", pat, key, got, want)
		}
		if got := fuzzref.Like(p.Like("ns:", '\\'), "ns:"+key, '\\'); got != p.Match(key) {
			t.Fatalf("pattern %q key %q: LIKE %v, Match %v", pat, key, got, p.Match(key))
		}
		if strings.Contains(key, "\x00") {
			return
		}
	})
}
