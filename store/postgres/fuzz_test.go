package postgres

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/fuzzref"
)

// fuzzPrefix is the namespace of the pattern fuzz target: LIKE's and
// GLOB's special characters and the escape '!', and the process id, so
// that runs sharing the test server keep apart.
var fuzzPrefix = fmt.Sprintf("fz%%_!\\*?[%d:", os.Getpid())

// FuzzPostgresPattern compares what a cache listing selects in SQL — the key
// range on the pattern's literal prefix and the LIKE … ESCAPE '!'
// rendering after the namespace — with the reference matcher, for a fuzzed
// pattern and key: in Go with a LIKE evaluator, and, for the seed corpus
// when WARDEN_TEST_POSTGRES_URL names a server, on that server (the
// listing's own query, without the Go re-check that follows it).
func FuzzPostgresPattern(f *testing.F) {
	f.Add("a*b?\\*", "a-b?*")
	var s *store
	if raw := fuzzref.ServerURL(f, "WARDEN_TEST_POSTGRES_URL", fuzzPrefix); raw != "" {
		st, err := Open(context.Background(), raw, nil)
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
		lo, hi := keyRange(pfx + p.Prefix())
		like := p.Like(pfx, '!')
		full := pfx + key
		inRange := full >= lo && (hi == "" || full < hi)
		if want && !inRange {
			t.Fatalf("pattern %q key %q: outside the range [%q, %q)", pat, key, lo, hi)
		}
		if got := inRange && fuzzref.Like(like, full, '!'); got != want {
			t.Fatalf("pattern %q key %q: range and LIKE %q select %v, Match %v", pat, key, like, got, want)
		}
		if s == nil {
			return
		}
		ctx := context.Background()
		if err := s.Cache().Set(ctx, key, []byte("v"), time.Minute); err != nil {
			t.Fatal(err)
		}
		defer s.Cache().Delete(ctx, key)
		var got []string
		err = s.list(ctx, s.q.cacheKeys, pfx, p, func(rows rowsIter) (string, error) {
			var sk string
			if err := rows.Scan(&sk); err != nil {
				return "", err
			}
			got = append(got, sk)
			return sk, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(got, full) != want {
			t.Fatalf("pattern %q key %q: PostgreSQL selects %q, Match %v", pat, key, got, want)
		}
	})
}

// FuzzPostgresURL parses fuzzed postgres URLs, with a password in each place a
// URL may carry one: parsing never panics and its error never shows the
// password.
func FuzzPostgresURL(f *testing.F) {
	f.Add(uint8(0), "s3cret-pw", "prefix=a:&tls=maybe")
	f.Fuzz(func(t *testing.T, place uint8, pw, extra string) {
		host := []string{"127.0.0.1:5432", "", "db"}[int(place/8)%3]
		fuzzref.CheckParseSecret(t, pw, func(pw string) string {
			return fuzzref.SecretURL("postgres", host, "/test", int(place), pw, extra)
		}, func(u *url.URL) error {
			_, _, err := parseURL(u, nil)
			return err
		})
	})
}
