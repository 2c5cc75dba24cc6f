package warden_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/fuzzref"
	"github.com/warden-go/warden/store/memory"
)

// maxKeyMessage bounds the message of an error about one key: a key is
// quoted (at most 4 bytes a byte) up to driver.MaxKeyBytes, a longer one
// cut, plus the store, the operation and the reason.
const maxKeyMessage = 4*driver.MaxKeyBytes + 200

// FuzzValidateKey checks ValidateKey against the documented rule
// (non-empty UTF-8, at most 512 bytes, no NUL), and that the Store reports
// a refused key, as a key and as an owner, with ErrInvalidKey before any
// I/O in a message of bounded length, however long the key.
func FuzzValidateKey(f *testing.F) {
	f.Add("k")
	f.Add(strings.Repeat("x", driver.MaxKeyBytes+1))
	st := memory.New(&memory.Options{Name: "fuzz-validate-key"})
	defer st.Close()
	f.Fuzz(func(t *testing.T, key string) {
		want := key != "" && len(key) <= driver.MaxKeyBytes && utf8.ValidString(key) && !strings.ContainsRune(key, 0)
		err := warden.ValidateKey(key)
		if (err == nil) != want {
			t.Fatalf("ValidateKey(%q) = %v, want valid=%v", key, err, want)
		}
		if err != nil && (!errors.Is(err, warden.ErrInvalidKey) || len(err.Error()) > 100) {
			t.Fatalf("ValidateKey(%q) = %q: want ErrInvalidKey in a short message", key, err)
		}
		ctx := context.Background()
		_, _, gerr := st.Locks().Get(ctx, key)
		_, _, aerr := st.Locks().Acquire(ctx, "k", key, time.Minute)
		if aerr == nil {
			_, _ = st.Locks().Release(ctx, "k", key, 1)
		}
		for _, e := range []error{gerr, aerr} {
			if (e == nil) != want {
				t.Fatalf("key %q: store error %v, want valid=%v", key, e, want)
			}
			if e == nil {
				continue
			}
			var we *warden.Error
			if !errors.Is(e, warden.ErrInvalidKey) || !errors.As(e, &we) {
				t.Fatalf("key %q: store error %v (%T), want a *warden.Error wrapping ErrInvalidKey", key, e, e)
			}
			if n := len(e.Error()); n > maxKeyMessage {
				t.Fatalf("key of %d bytes: message of %d bytes, want at most %d", len(key), n, maxKeyMessage)
			}
		}
	})
}

// FuzzParsePattern checks that ParsePattern never panics, refuses exactly
// the patterns that are not UTF-8 or end in a lone '\', and says so in a
// message of bounded length, and that a parsed pattern's literal prefix
// starts every key it matches.
func FuzzParsePattern(f *testing.F) {
	f.Add("a*b?\\*", "a-b?*")
	f.Fuzz(func(t *testing.T, pat, key string) {
		p, err := warden.ParsePattern(pat)
		if err != nil {
			if !errors.Is(err, warden.ErrInvalidPattern) || !errors.Is(err, driver.ErrBadPattern) && utf8.ValidString(pat) && !strings.HasSuffix(pat, "\\") {
				t.Fatalf("ParsePattern(%q) = %v", pat, err)
			}
			if n := len(err.Error()); n > maxKeyMessage {
				t.Fatalf("pattern of %d bytes: message of %d bytes, want at most %d", len(pat), n, maxKeyMessage)
			}
			return
		}
		if !utf8.ValidString(pat) {
			t.Fatalf("ParsePattern accepted %q, not UTF-8", pat)
		}
		if p.Match(key) && !strings.HasPrefix(key, p.Prefix()) {
			t.Fatalf("pattern %q matches %q, which lacks its prefix %q", pat, key, p.Prefix())
		}
		if lit, ok := p.Literal(); ok && p.Match(key) != (key == lit) {
			t.Fatalf("literal pattern %q (%q): Match(%q) = %v", pat, lit, key, p.Match(key))
		}
	})
}

// FuzzOpenURL opens fuzzed store URLs with a password in each place a URL
// may carry one: Open never panics and its error never shows the password.
func FuzzOpenURL(f *testing.F) {
	f.Add(uint8(0), "s3cret-pw", "prefix=a:")
	f.Fuzz(func(t *testing.T, place uint8, pw, extra string) {
		scheme := []string{"memory", "nosuch", "MEMORY", ""}[place/16%4]
		show := func(pw string) string {
			raw := fuzzref.SecretURL(scheme, "db", "", int(place), pw, extra)
			st, err := warden.Open(context.Background(), raw)
			if err != nil {
				return err.Error()
			}
			st.Close()
			return ""
		}
		if form, ok := fuzzref.Leaked(pw, show); ok {
			t.Fatalf("the error of Open shows the password as %q: %s", form, show(pw))
		}
	})
}
