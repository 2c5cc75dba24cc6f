package idempotency

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/warden-go/warden"
)

// bytesCodec is a codec of []byte values that writes them as they are,
// as a codec of some binary format would.
type bytesCodec struct{}

func (bytesCodec) Marshal(v any) ([]byte, error) { return bytes.Clone(v.([]byte)), nil }

func (bytesCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = bytes.Clone(data)
	return nil
}

// FuzzResultCodec checks the stored form of Do's results: whatever bytes
// the codec writes come back exactly, and decoding bytes stored by anyone
// (a bare value, a damaged envelope) with the JSON codec never panics and
// fails, if it fails, with an error that names the key and says what went
// wrong.
func FuzzResultCodec(f *testing.F) {
	f.Add([]byte(`{"id":"r1","cents":250}`), []byte(`{"$warden":1,"ok":false,"error":"boom"}`))
	f.Fuzz(func(t *testing.T, raw, garbage []byte) {
		b, err := encode(bytesCodec{}, raw)
		if err != nil {
			t.Fatalf("encode(%q): %v", raw, err)
		}
		got, err := decode[[]byte]("k", b, bytesCodec{})
		if err != nil {
			t.Fatalf("decode of %q (stored as %q): %v", raw, b, err)
		}
		if !bytes.Equal(got, raw) {
			t.Fatalf("result %q stored as %q reads back as %q", raw, b, got)
		}

		_, err = decode[map[string]int]("k", garbage, warden.JSONCodec{})
		var se *StoredError
		switch {
		case err == nil:
		case errors.As(err, &se):
			if se.Key != "k" {
				t.Fatalf("StoredError for key %q, want k", se.Key)
			}
		case !strings.Contains(err.Error(), `key "k": cannot decode the stored result`):
			t.Fatalf("decode of %q: unclear error %q", garbage, err)
		}
	})
}
