package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/internal/fuzzref"
)

// FuzzStoreURLSecrets gives the CLI store URLs with a password in every
// place a URL can carry one: checking, redacting and reporting them never
// panics, and no message — checkStoreURL's usage error, the redacted URL
// of --help and errors, the one line of an error that quotes the URL —
// shows the password (one under minMaskedSecret bytes is masked in user
// information only).
func FuzzStoreURLSecrets(f *testing.F) {
	f.Add(uint8(0), "s3cret-pw", "prefix=billing:")
	f.Fuzz(func(t *testing.T, place uint8, pw, extra string) {
		scheme := []string{"postgres", "mysql", "redis", "dynamodb", "mongodb", ""}[int(place/8)%6]
		host := []string{"db.example:5432", "127.0.0.1:99999", "h1:1,h2:2", ""}[int(place/48)%4]
		show := func(pw string) string {
			raw := fuzzref.SecretURL(scheme, host, "/x", int(place), pw, extra)
			c := &cli{g: globals{store: raw}}
			var b strings.Builder
			if err := checkStoreURL(raw); err != nil {
				b.WriteString(c.message(err) + "\n")
			}
			b.WriteString(redactURL(raw) + "\n")
			if int(place)%4 != fuzzref.InParam || len(pw) >= minMaskedSecret {
				// A store error quoting the URL: a short password outside
				// user information is left alone, by design, so that it
				// does not mangle the words of the message.
				b.WriteString(c.message(fmt.Errorf("dial %s: refused", raw)) + "\n")
			}
			b.WriteString(c.message(&openError{url: c.redactedStore(), err: errors.New("no")}))
			return b.String()
		}
		if form, ok := fuzzref.Leaked(pw, show); ok {
			t.Fatalf("a message shows the password as %q:\n%s", form, show(pw))
		}
	})
}

// FuzzShortMessages checks the CLI's one-line messages about a key: a key
// longer than 64 bytes appears cut, and no word of the line is longer than
// maxWord plus the length note, however long the key or the error.
func FuzzShortMessages(f *testing.F) {
	f.Add(strings.Repeat("k", 100), "warden: invalid key")
	f.Fuzz(func(t *testing.T, key, reason string) {
		c := &cli{args: []string{key}, path: "cache get", g: globals{store: "memory://x"}}
		for _, err := range []error{
			&warden.Error{Store: "memory", Op: "cache.get", Key: key, Err: fmt.Errorf("%w: %s", warden.ErrInvalidKey, reason)},
			fmt.Errorf("cache get %q: %s", key, reason),
		} {
			msg := c.message(err)
			if strings.ContainsAny(msg, "\n\r") {
				t.Fatalf("message %q is not one line", msg)
			}
			if len(key) > maxShown && strings.Contains(msg, key) {
				t.Fatalf("message shows the %d-byte key whole: %q", len(key), msg)
			}
			for _, w := range strings.Fields(msg) {
				if len(w) > maxWord+len("…(18446744073709551615 bytes)")+2 {
					t.Fatalf("message has a word of %d bytes: %q", len(w), msg)
				}
			}
		}
	})
}
