package cache

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/store/memory"
)

// stored is the stored form of codec output raw: encode's choice between
// the bytes alone and an envelope, with soft expiry fresh (zero: none).
func stored(t *testing.T, raw []byte, fresh time.Time) []byte {
	t.Helper()
	if _, ok := parseEnvelope(raw); !ok && fresh.IsZero() {
		return raw
	}
	b, err := wrap(raw, fresh)
	if err != nil {
		t.Fatalf("wrap(%q): %v", raw, err)
	}
	return b
}

// FuzzEnvelope checks the stored form of cache values: whatever bytes a
// codec writes, with or without soft expiry, a read gives the codec back
// exactly those bytes; and reading bytes that some other program stored
// never panics, and a value the codec cannot decode is a decode error
// that names the key.
func FuzzEnvelope(f *testing.F) {
	f.Add([]byte(`{"name":"Ada"}`), int64(0), []byte(`{"_warden":"cache/v1","raw":true,"bytes":"!"}`))
	st := memory.New(&memory.Options{Name: "fuzz-envelope"})
	defer st.Close()
	c, err := New[map[string]int](st, &Options{Prefix: "fz:"})
	if err != nil {
		f.Fatal(err)
	}
	defer c.Close()
	f.Fuzz(func(t *testing.T, raw []byte, fresh int64, garbage []byte) {
		var at time.Time
		if fresh != 0 {
			at = time.UnixMilli(fresh)
		}
		b := stored(t, raw, at)
		got := b
		if env, ok := parseEnvelope(b); ok {
			if env.Absent {
				t.Fatalf("value %q stored as %q reads as a cached absence", raw, b)
			}
			got = env.payload()
		} else if !bytes.Equal(b, raw) {
			t.Fatalf("value %q stored as %q, which is not an envelope", raw, b)
		}
		if !bytes.Equal(got, raw) && !(len(raw) == 0 && len(got) == 0) {
			t.Fatalf("value %q stored as %q reads back as %q", raw, b, got)
		}

		// Bytes another program stored under a key of the cache.
		ctx := context.Background()
		if err := st.Cache().Set(ctx, "fz:k", garbage, time.Minute); err != nil {
			t.Fatal(err)
		}
		v, err := c.Get(ctx, "k")
		switch {
		case err == nil, errors.Is(err, ErrNotFound):
		case isDecodeErr(err):
			if msg := err.Error(); !bytes.Contains([]byte(msg), []byte(`decode "k"`)) {
				t.Fatalf("decode error %q does not name the key", msg)
			}
		default:
			t.Fatalf("Get of stored %q: %v (%T), want a value, ErrNotFound or a decode error", garbage, err, err)
		}
		_ = v
		var we *warden.Error
		if errors.As(err, &we) {
			t.Fatalf("Get of stored %q: store error %v", garbage, err)
		}
	})
}
