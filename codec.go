package warden

import "encoding/json"

// Codec turns values into bytes and back for the portable packages that
// store typed values: cache, idempotency and checkpoint. Implementations
// must be safe for concurrent use.
type Codec interface {
	// Marshal encodes v.
	Marshal(v any) ([]byte, error)
	// Unmarshal decodes data into v, a non-nil pointer.
	Unmarshal(data []byte, v any) error
}

// JSONCodec is the default Codec: encoding/json. Values it writes are plain
// JSON, readable by other programs that share the store (such as services
// using the go-go-scope adapters).
type JSONCodec struct{}

// Marshal encodes v as JSON.
func (JSONCodec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal decodes JSON data into v.
func (JSONCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
