package mongo

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Cache values are stored natively when they are JSON (warden's default
// codec): a JSON object becomes a BSON document, an array a BSON array, a
// string, number, boolean or null the BSON value of that kind. The
// go-go-scope adapter stores its JSON values that way and reads them back as
// JavaScript values. Anything else — bytes of another codec, or JSON whose
// native form would not give back the same bytes (insignificant spaces,
// escapes, 1.0, duplicate or '$' keys) — is stored as BSON binary, as
// before, and read back byte for byte. A native value reads back as
// compact JSON (encoding/json's spelling of numbers and strings), which is
// what warden's JSON codec wrote.

// maxNativeDepth bounds the nesting of a value stored natively, below
// MongoDB's limit of 100 levels for a whole document.
const maxNativeDepth = 90

// storedValue returns the BSON value a cache value is stored as. The
// native form of a JSON value can be larger than its JSON (an array of
// small numbers, up to 6.5 times); one larger than limit (the store's
// MaxValueBytes, which leaves room in the 16 MiB document) is stored as
// binary instead.
func storedValue(b []byte, limit int) any {
	if v, size, ok := nativeValue(b); ok && size <= limit {
		return v
	}
	return nonNil(b)
}

// nativeValue converts JSON b to its BSON form, if b is JSON that reads
// back as exactly b, and returns the size of that form.
func nativeValue(b []byte) (any, int, bool) {
	if len(b) == 0 || !json.Valid(b) {
		return nil, 0, false
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	v, err := jsonToBSON(d, 0)
	if err != nil {
		return nil, 0, false
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, 0, false
	}
	if v == nil {
		return nil, 1, string(b) == "null" // BSON null
	}
	t, raw, err := bson.MarshalValue(v)
	if err != nil {
		return nil, 0, false
	}
	back, err := valueJSON(bson.RawValue{Type: t, Value: raw})
	if err != nil || !bytes.Equal(back, b) {
		return nil, 0, false
	}
	return v, len(raw), true
}

var errNotNative = errors.New("no native form")

// jsonToBSON reads one JSON value from d.
func jsonToBSON(d *json.Decoder, depth int) (any, error) {
	if depth > maxNativeDepth {
		return nil, errNotNative
	}
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			doc := bson.D{}
			seen := map[string]bool{}
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return nil, err
				}
				k := kt.(string)
				// MongoDB refuses field names starting with '$' in
				// updates, '.' makes them paths, BSON names cannot hold NUL.
				if k == "" || strings.HasPrefix(k, "$") || strings.ContainsAny(k, ".\x00") || seen[k] {
					return nil, errNotNative
				}
				seen[k] = true
				v, err := jsonToBSON(d, depth+1)
				if err != nil {
					return nil, err
				}
				doc = append(doc, bson.E{Key: k, Value: v})
			}
			_, err := d.Token() // '}'
			return doc, err
		case '[':
			arr := bson.A{}
			for d.More() {
				v, err := jsonToBSON(d, depth+1)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			_, err := d.Token() // ']'
			return arr, err
		}
		return nil, errNotNative
	case string:
		return t, nil
	case bool:
		return t, nil
	case nil:
		return nil, nil
	case json.Number:
		s := string(t)
		if !strings.ContainsAny(s, ".eE") {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return nil, errNotNative // beyond int64: kept as bytes
			}
			if n >= math.MinInt32 && n <= math.MaxInt32 {
				return int32(n), nil
			}
			return n, nil
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, errNotNative
		}
		return f, nil
	}
	return nil, errNotNative
}

// valueJSON returns the bytes of a stored cache value: the data of a BSON
// binary (a value stored as bytes), or the compact JSON of a native value
// (written by warden, or by the go-go-scope adapter).
func valueJSON(v bson.RawValue) (_ []byte, err error) {
	// The driver's accessors panic on malformed bytes, which Validate does
	// not all catch (an embedded document's length, say): a value written
	// by another program is checked first, and a panic left is an error.
	if err := v.Validate(); err != nil {
		return nil, fmt.Errorf("mongo: reading a cache value: %w", err)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("mongo: reading a cache value: malformed BSON %v: %v", v.Type, r)
		}
	}()
	if sub, data, ok := v.BinaryOK(); ok && (sub == bson.TypeBinaryGeneric || sub == 2) {
		return nonNil(data), nil
	}
	var buf bytes.Buffer
	if err := writeJSON(&buf, v, 0); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeJSON writes v as JSON, the way JSON.stringify shows what the
// go-go-scope adapter reads: dates as ISO strings, ObjectIds as hex
// strings, NaN and infinities as null.
func writeJSON(w *bytes.Buffer, v bson.RawValue, depth int) error {
	if depth > 200 {
		return errors.New("mongo: cache value nested too deeply")
	}
	switch v.Type {
	case bson.TypeNull, bson.TypeUndefined:
		w.WriteString("null")
	case bson.TypeBoolean:
		w.WriteString(strconv.FormatBool(v.Boolean()))
	case bson.TypeInt32:
		w.WriteString(strconv.FormatInt(int64(v.Int32()), 10))
	case bson.TypeInt64:
		w.WriteString(strconv.FormatInt(v.Int64(), 10))
	case bson.TypeDouble:
		f := v.Double()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			w.WriteString("null")
			break
		}
		b, _ := json.Marshal(f)
		w.Write(b)
	case bson.TypeDecimal128:
		s := v.Decimal128().String()
		if json.Valid([]byte(s)) {
			w.WriteString(s)
		} else {
			writeString(w, s)
		}
	case bson.TypeString:
		writeString(w, v.StringValue())
	case bson.TypeSymbol:
		writeString(w, v.Symbol())
	case bson.TypeDateTime:
		writeString(w, time.UnixMilli(v.DateTime()).UTC().Format("2006-01-02T15:04:05.000Z"))
	case bson.TypeObjectID:
		writeString(w, v.ObjectID().Hex())
	case bson.TypeBinary:
		_, data := v.Binary()
		writeString(w, base64.StdEncoding.EncodeToString(data))
	case bson.TypeEmbeddedDocument:
		elems, err := v.Document().Elements()
		if err != nil {
			return fmt.Errorf("mongo: reading a cache value: %w", err)
		}
		w.WriteByte('{')
		n := 0
		for _, e := range elems {
			ev := e.Value()
			if ev.Type == bson.TypeUndefined {
				continue // JSON.stringify leaves undefined members out
			}
			if n > 0 {
				w.WriteByte(',')
			}
			n++
			writeString(w, e.Key())
			w.WriteByte(':')
			if err := writeJSON(w, ev, depth+1); err != nil {
				return err
			}
		}
		w.WriteByte('}')
	case bson.TypeArray:
		vals, err := v.Array().Values()
		if err != nil {
			return fmt.Errorf("mongo: reading a cache value: %w", err)
		}
		w.WriteByte('[')
		for i, ev := range vals {
			if i > 0 {
				w.WriteByte(',')
			}
			if err := writeJSON(w, ev, depth+1); err != nil {
				return err
			}
		}
		w.WriteByte(']')
	default:
		return fmt.Errorf("mongo: a cache value holds BSON %v, which has no JSON form", v.Type)
	}
	return nil
}

func writeString(w *bytes.Buffer, s string) {
	b, _ := json.Marshal(s)
	w.Write(b)
}
