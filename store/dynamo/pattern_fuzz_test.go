package dynamo

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/fuzzref"
)

// FuzzDynamoPattern checks the selection a listing makes on DynamoDB
// against the reference matcher: a pattern without wildcards reads the one
// item of its key, any other queries with begins_with on the pattern's
// literal prefix; either way every key the pattern matches is read (the
// listing then matches each key in Go). For the seed corpus, when
// WARDEN_TEST_DYNAMODB_ENDPOINT names a server, the listing runs there
// too: the key is written, and Keys(pattern) returns it exactly when the
// reference matcher matches it.
func FuzzDynamoPattern(f *testing.F) {
	f.Add("a*b?\\*", "a-b?*")
	var srv *warden.Store
	if ep := os.Getenv("WARDEN_TEST_DYNAMODB_ENDPOINT"); ep != "" && !fuzzref.Fuzzing() {
		ctx := context.Background()
		table := fmt.Sprintf("warden_fuzz_%d", os.Getpid())
		st, err := warden.Open(ctx, "dynamodb://"+table+"?endpoint="+url.QueryEscape(ep)+"&prefix=fz:")
		if err != nil {
			f.Fatal(err)
		}
		var c *dynamodb.Client
		switch d := st.Driver().(type) {
		case *store:
			c = d.c
		case notifyStore:
			c = d.c
		}
		defer func() {
			// The store's own client: the table goes first.
			if err := DeleteTable(ctx, c, table); err != nil {
				f.Error(err)
			}
			st.Close()
		}()
		srv = st
	}
	f.Fuzz(func(t *testing.T, pat, key string) {
		p, err := driver.ParsePattern(pat)
		if err != nil || warden.ValidateKey(key) != nil {
			return
		}
		pfx := "CACHE#fz:" + driver.TagCache
		var read bool
		if lit, ok := p.Literal(); ok {
			read = pfx+key == pfx+lit
		} else {
			read = strings.HasPrefix(pfx+key, pfx+p.Prefix())
		}
		if p.Match(key) && !read {
			t.Fatalf("pattern %q: the listing never reads key %q, which matches", pat, key)
		}
		if srv == nil {
			return
		}
		ctx := context.Background()
		if err := srv.Cache().Set(ctx, key, []byte("v"), time.Minute); err != nil {
			t.Fatal(err)
		}
		defer srv.Cache().Delete(ctx, key)
		keys, err := srv.Cache().Keys(ctx, pat)
		if err != nil {
			t.Fatalf("Keys(%q): %v", pat, err)
		}
		if got := slices.Contains(keys, key); got != p.Match(key) {
			t.Fatalf("pattern %q key %q: the server's listing returns %q, Match %v", pat, key, keys, p.Match(key))
		}
		for _, k := range keys {
			if !p.Match(k) {
				t.Fatalf("pattern %q: the listing returns %q, which it does not match", pat, k)
			}
		}
	})
}

// FuzzDynamoValue checks the stored form of cache values: whatever bytes
// are written, natively or as binary, read back exactly; and reading any
// attribute value (another program's, a damaged one) never panics.
func FuzzDynamoValue(f *testing.F) {
	f.Add([]byte(`{"a":[1,"x",true,null]}`), []byte("M\x02aS\x01bN\x021x"))
	f.Fuzz(func(t *testing.T, b, garbage []byte) {
		v := dataValue(b, 400*1024)
		back, err := dataJSON(v)
		if err != nil {
			t.Fatalf("value %q stored as %#v: reading it back: %v", b, v, err)
		}
		if !bytes.Equal(back, b) {
			t.Fatalf("value %q stored as %#v reads back as %q", b, v, back)
		}
		in := garbage
		_, _ = dataJSON(genAV(&in, 0))
	})
}

// genAV builds an attribute value of any type from the bytes in, taking
// what it uses.
func genAV(in *[]byte, depth int) types.AttributeValue {
	next := func() byte {
		if len(*in) == 0 {
			return 0
		}
		c := (*in)[0]
		*in = (*in)[1:]
		return c
	}
	str := func() string {
		n := int(next()) % 8
		n = min(n, len(*in))
		s := string((*in)[:n])
		*in = (*in)[n:]
		return s
	}
	kind := next()
	if depth > 40 {
		kind = 'S'
	}
	switch kind % 10 {
	case 0:
		return &types.AttributeValueMemberS{Value: str()}
	case 1:
		return &types.AttributeValueMemberN{Value: str()}
	case 2:
		return &types.AttributeValueMemberB{Value: []byte(str())}
	case 3:
		return &types.AttributeValueMemberBOOL{Value: next()%2 == 0}
	case 4:
		return &types.AttributeValueMemberNULL{Value: next()%2 == 0}
	case 5:
		var l []types.AttributeValue
		for n := int(next()) % 4; n > 0; n-- {
			l = append(l, genAV(in, depth+1))
		}
		return &types.AttributeValueMemberL{Value: l}
	case 6:
		m := map[string]types.AttributeValue{}
		for n := int(next()) % 4; n > 0; n-- {
			m[str()] = genAV(in, depth+1)
		}
		return &types.AttributeValueMemberM{Value: m}
	case 7:
		return &types.AttributeValueMemberSS{Value: []string{str(), str()}}
	case 8:
		return &types.AttributeValueMemberNS{Value: []string{str()}}
	default:
		if next()%2 == 0 {
			return nil
		}
		return &types.AttributeValueMemberBS{Value: [][]byte{[]byte(str())}}
	}
}

// FuzzDynamoURL parses fuzzed dynamodb URLs, with a password in each
// place a URL may carry one: parsing never panics and its error never
// shows the password.
func FuzzDynamoURL(f *testing.F) {
	f.Add(uint8(2), "s3cret-pw", "prefix=a:&region=x")
	f.Fuzz(func(t *testing.T, place uint8, pw, extra string) {
		fuzzref.CheckParseSecret(t, pw, func(pw string) string {
			return fuzzref.SecretURL("dynamodb", "table", "", int(place), pw, extra)
		}, func(u *url.URL) error {
			_, err := parseURL(u, nil)
			return err
		})
	})
}
