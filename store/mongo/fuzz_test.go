package mongo

import (
	"bytes"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/fuzzref"
)

// FuzzMongoPattern checks the key range a listing sends MongoDB against
// the reference matcher, in Go: the range [prefix, successor(prefix))
// holds exactly the keys that start with the pattern's literal prefix
// (MongoDB compares strings by UTF-8 bytes), so every key the pattern
// matches is read (the listing then matches each key in Go). It never
// touches a server.
func FuzzMongoPattern(f *testing.F) {
	f.Add("a*b?\\*", "a-b?*")
	f.Fuzz(func(t *testing.T, pat, key string) {
		p, err := driver.ParsePattern(pat)
		if err != nil || warden.ValidateKey(key) != nil {
			return
		}
		pfx := "fz:" + driver.TagCache
		lo, full := pfx+p.Prefix(), pfx+key
		hi, bounded := successor(lo)
		if bounded && !utf8.ValidString(hi) {
			t.Fatalf("successor(%q) = %q, not UTF-8", lo, hi)
		}
		in := full >= lo && (!bounded || full < hi)
		if in != strings.HasPrefix(full, lo) {
			t.Fatalf("range [%q, %q) holds %q: %v, want %v", lo, hi, full, in, !in)
		}
		if p.Match(key) && !in {
			t.Fatalf("pattern %q: the listing never reads key %q, which matches", pat, key)
		}
	})
}

// FuzzMongoValue checks the stored form of cache values: whatever bytes
// are written, natively or as binary, read back exactly; and reading any
// BSON value (another program's, a damaged one) never panics. It never
// touches a server.
func FuzzMongoValue(f *testing.F) {
	f.Add([]byte(`{"a":[1,"x",true,null]}`), byte(0x03), []byte("\x05\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte, typ byte, garbage []byte) {
		v := storedValue(b, 16<<20)
		// In a document a nil value is BSON null (MarshalValue alone has no
		// encoder for it).
		bt, raw, err := bson.TypeNull, []byte(nil), error(nil)
		if v != nil {
			bt, raw, err = bson.MarshalValue(v)
		}
		if err != nil {
			t.Fatalf("value %q stored as %#v: %v", b, v, err)
		}
		back, err := valueJSON(bson.RawValue{Type: bt, Value: raw})
		if err != nil {
			t.Fatalf("value %q stored as %#v: reading it back: %v", b, v, err)
		}
		if !bytes.Equal(back, b) {
			t.Fatalf("value %q stored as %#v reads back as %q", b, v, back)
		}
		_, _ = valueJSON(bson.RawValue{Type: bson.Type(typ), Value: garbage})
	})
}

// FuzzMongoURL parses fuzzed mongodb URLs, with a password in each place
// a URL may carry one: parsing never panics and its error never shows the
// password. It never touches a server.
func FuzzMongoURL(f *testing.F) {
	f.Add(uint8(0), "s3cret-pw", "prefix=a:&w=2")
	f.Fuzz(func(t *testing.T, place uint8, pw, extra string) {
		// mongodb+srv:// is left out: its parsing looks up DNS records.
		fuzzref.CheckParseSecret(t, pw, func(pw string) string {
			return fuzzref.SecretURL("mongodb", "127.0.0.1:27017", "/test", int(place), pw, extra)
		}, func(u *url.URL) error {
			_, err := parseURL(u, nil)
			return err
		})
	})
}
