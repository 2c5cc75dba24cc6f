package sqlite

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/fuzzref"
)

// fuzzPrefix is the namespace of the pattern fuzz target: every character
// GLOB gives a meaning to, so that a rendering that failed to escape the
// namespace would show.
const fuzzPrefix = "fz*?[]%_\\:"

// FuzzSQLitePattern compares what a cache listing selects in SQL — the
// key range on the pattern's literal prefix and the GLOB rendering of the
// pattern after the namespace — with the reference matcher, for a fuzzed
// pattern and key: in Go with a GLOB evaluator, and, for the seed corpus,
// on a real SQLite database (the listing's own query, without the Go
// re-check that follows it).
func FuzzSQLitePattern(f *testing.F) {
	f.Add("a*b?\\*", "a-b?*")
	var s *store
	if !fuzzref.Fuzzing() {
		st, err := Open(context.Background(), filepath.Join(f.TempDir(), "fuzz.db"), &Options{Prefix: fuzzPrefix})
		if err != nil {
			f.Fatal(err)
		}
		defer st.Close()
		s = st.Driver().(*store)
	}
	f.Fuzz(func(t *testing.T, pat, key string) {
		p, err := driver.ParsePattern(pat)
		if err != nil || warden.ValidateKey(key) != nil {
			return
		}
		pfx := fuzzPrefix + driver.TagCache
		want := p.Match(key)
		cond, args := keyRange("key", pfx+p.Prefix())
		glob := p.SQLiteGlob(pfx)
		full := pfx + key
		inRange := cond == "1" || full >= args[0].(string) && (len(args) == 1 || full < args[1].(string))
		if want && !inRange {
			t.Fatalf("pattern %q key %q: outside the range %s %q", pat, key, cond, args)
		}
		if got := inRange && fuzzref.SQLiteGlob(glob, full); got != want {
			t.Fatalf("pattern %q key %q: range and GLOB %q select %v, Match %v", pat, key, glob, got, want)
		}
		if s == nil {
			return
		}
		ctx := context.Background()
		if err := s.Cache().Set(ctx, key, []byte("v"), time.Minute); err != nil {
			t.Fatal(err)
		}
		defer s.Cache().Delete(ctx, key)
		cond, args = s.nsRange("key", pfx+p.Prefix())
		args = append(args, glob, nowMs())
		rows, err := s.readQuery(ctx, fmt.Sprintf(s.q.cacheKeys, cond), args...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var got []string
		for rows.Next() {
			var sk string
			if err := rows.Scan(&sk); err != nil {
				t.Fatal(err)
			}
			got = append(got, sk)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(got, full) != want {
			t.Fatalf("pattern %q key %q: SQLite selects %q, Match %v", pat, key, got, want)
		}
	})
}

// FuzzSQLiteURL parses fuzzed sqlite URLs, with a password in each place
// a URL may carry one: parsing never panics and its error never shows the
// password.
func FuzzSQLiteURL(f *testing.F) {
	f.Add(uint8(0), "s3cret-pw", "prefix=a:&mode=ro")
	f.Fuzz(func(t *testing.T, place uint8, pw, extra string) {
		fuzzref.CheckParseSecret(t, pw, func(pw string) string {
			return fuzzref.SecretURL("sqlite", "", "/tmp/x.db", int(place), pw, extra)
		}, func(u *url.URL) error {
			_, _, err := parseURL(u)
			return err
		})
	})
}
