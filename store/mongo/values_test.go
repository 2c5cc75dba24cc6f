package mongo

import (
	"bytes"
	"testing"
)

// TestStoredValueSize: the native form of a JSON array of small numbers is
// up to 6.5 times its JSON; a value within the limit whose native form is
// not is stored as binary (a document over MongoDB's 16 MiB would be
// refused by the server).
func TestStoredValueSize(t *testing.T) {
	b := []byte("[" + string(bytes.Repeat([]byte("0,"), 499)) + "0]") // 1001 bytes, 500 elements
	_, size, ok := nativeValue(b)
	if !ok || size <= len(b) {
		t.Fatalf("native form: %v, %d bytes for %d of JSON", ok, size, len(b))
	}
	if _, bin := storedValue(b, size-1).([]byte); !bin {
		t.Errorf("stored natively with a limit below its native size (%d)", size)
	}
	if _, bin := storedValue(b, size).([]byte); bin {
		t.Errorf("stored as binary with a limit of its native size (%d)", size)
	}
}
