package cache

import (
	"bytes"
	"encoding/json"
	"time"
)

// The envelope.
//
// A value is stored as the codec's bytes alone whenever that says all there
// is to say: no soft expiry and not a cached absence. Otherwise it is
// stored in an envelope, a JSON object whose first member is
// "_warden":"cache/v1":
//
//	{"_warden":"cache/v1","fresh":1767225600000,"value":{"name":"Ada"}}
//	{"_warden":"cache/v1","fresh":1767225600000,"raw":true,"bytes":"AAEC"}
//	{"_warden":"cache/v1","absent":true}
//
//   - fresh: Unix milliseconds (writer's clock) after which the value is
//     stale; absent or 0 means no soft expiry. The entry's own TTL in the
//     store is the hard expiry: fresh + StaleWhileRevalidate.
//   - value: the codec's output when it is JSON that the envelope keeps byte
//     for byte (compact, with encoding/json's escapes, as warden's JSON codec
//     writes it), so JSON values stay readable by other programs; otherwise
//     raw is true and bytes holds the codec's output in base64, so that a
//     codec whose output has spaces or other escapes gets it back exactly.
//   - absent: a cached absence (negative caching); no value.
//
// A plain value that would itself read as an envelope (a JSON object with
// a top-level "_warden":"cache/v1" member) is always written inside an
// envelope, so what this package writes is never ambiguous.

// envelopeTag marks an envelope written by this package.
const envelopeTag = "cache/v1"

// envelope is the stored form of a value with metadata.
type envelope struct {
	Tag    string          `json:"_warden"`
	Fresh  int64           `json:"fresh,omitempty"`
	Absent bool            `json:"absent,omitempty"`
	Raw    bool            `json:"raw,omitempty"`
	Value  json.RawMessage `json:"value,omitempty"`
	Bytes  []byte          `json:"bytes,omitempty"`
}

var envelopeMember = []byte(`"_warden"`)

// parseEnvelope reports whether b is an envelope written by this package,
// and returns it.
func parseEnvelope(b []byte) (envelope, bool) {
	t := bytes.TrimLeft(b, " \t\r\n")
	if len(t) == 0 || t[0] != '{' || !bytes.Contains(t, envelopeMember) {
		return envelope{}, false
	}
	var env envelope
	if err := json.Unmarshal(t, &env); err != nil || env.Tag != envelopeTag {
		return envelope{}, false
	}
	return env, true
}

// payload returns the codec bytes an envelope carries.
func (e *envelope) payload() []byte {
	if e.Raw {
		if e.Bytes == nil {
			return []byte{}
		}
		return e.Bytes
	}
	if len(e.Value) == 0 {
		return []byte("null")
	}
	return e.Value
}

// wrap builds the envelope of codec output raw with soft expiry fresh
// (zero: none).
func wrap(raw []byte, fresh time.Time) ([]byte, error) {
	env := envelope{Tag: envelopeTag}
	if !fresh.IsZero() {
		env.Fresh = fresh.UnixMilli()
		if env.Fresh == 0 {
			env.Fresh = 1
		}
	}
	if keepsJSON(raw) {
		env.Value = raw
	} else {
		env.Raw, env.Bytes = true, raw
	}
	return json.Marshal(env)
}

// absentValue is the stored form of a cached absence.
var absentValue = []byte(`{"_warden":"cache/v1","absent":true}`)

// keepsJSON reports whether raw is JSON that an envelope's "value" member
// holds unchanged: encoding/json compacts and escapes a json.RawMessage it
// writes, which would change the bytes a codec gets back.
func keepsJSON(raw []byte) bool {
	if !json.Valid(raw) {
		return false
	}
	b, err := json.Marshal(json.RawMessage(raw))
	return err == nil && bytes.Equal(b, raw)
}
