package redis

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/fuzzref"
)

// fuzzPrefix is the namespace of the pattern fuzz target: Redis glob's
// special characters, and the process id, so that runs sharing the test
// server keep apart.
var fuzzPrefix = fmt.Sprintf("fz*?[]\\%d:", os.Getpid())

// FuzzRedisPattern compares the SCAN MATCH glob a listing sends with the
// reference matcher, for a fuzzed pattern and key: every key the pattern
// matches is selected, and nothing else unless the pattern has a '?'
// (Redis's '?' is one byte, rendered as "?*", and listings re-check in
// Go). In Go with a Redis glob evaluator, and, for the seed corpus when
// WARDEN_TEST_REDIS_URL names a server, on that server.
func FuzzRedisPattern(f *testing.F) {
	f.Add("a*b?\\*", "a-b?*")
	var srv *store
	if raw := os.Getenv("WARDEN_TEST_REDIS_URL"); raw != "" && !fuzzref.Fuzzing() {
		st, err := Open(context.Background(), raw, &Options{Prefix: fuzzPrefix})
		if err != nil {
			f.Fatal(err)
		}
		defer st.Close()
		srv = st.Driver().(*store)
	}
	f.Fuzz(func(t *testing.T, pat, key string) {
		p, err := driver.ParsePattern(pat)
		if err != nil || warden.ValidateKey(key) != nil {
			return
		}
		s := &store{prefix: fuzzPrefix}
		match, rk := s.match(kindCache, p), s.key(kindCache, key)
		want, wide := p.Match(key), strings.Contains(pat, "?")
		if got := fuzzref.RedisMatch(match, rk); got != want && (!got || !wide) {
			t.Fatalf("pattern %q key %q: MATCH %q selects %q: %v, Match %v", pat, key, match, rk, got, want)
		}
		if srv == nil {
			return
		}
		ctx := context.Background()
		if err := srv.Cache().Set(ctx, key, []byte("v"), time.Minute); err != nil {
			t.Fatal(err)
		}
		defer srv.Cache().Delete(ctx, key)
		var got []string
		err = srv.scan(ctx, srv.match(kindCache, p), func(keys []string) error {
			got = append(got, keys...)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if sel := slices.Contains(got, srv.key(kindCache, key)); sel != want && (!sel || !wide) {
			t.Fatalf("pattern %q key %q: Redis selects %q, Match %v", pat, key, got, want)
		}
	})
}

// FuzzRedisURL parses fuzzed redis URLs, with a password in each place a
// URL may carry one: parsing never panics and its error never shows the
// password.
func FuzzRedisURL(f *testing.F) {
	f.Add(uint8(0), "s3cret-pw", "prefix=a:&cluster=maybe")
	f.Fuzz(func(t *testing.T, place uint8, pw, extra string) {
		scheme := []string{"redis", "rediss", "unix"}[int(place/8)%3]
		fuzzref.CheckParseSecret(t, pw, func(pw string) string {
			return fuzzref.SecretURL(scheme, "127.0.0.1:6379", "/0", int(place), pw, extra)
		}, func(u *url.URL) error {
			_, _, err := parseURL(u, nil)
			return err
		})
	})
}
