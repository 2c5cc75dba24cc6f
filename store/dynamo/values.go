package dynamo

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Cache values are stored natively when they are JSON (warden's default
// codec) in the form that reads back as the same bytes: an object becomes
// a map (M), an array a list (L), a string S, a number N, true/false BOOL,
// null NULL — the layout of the go-go-scope DynamoDB adapter, whose `data`
// is a map. A DynamoDB map has no order, so an object reads back with its
// keys sorted (as encoding/json writes Go maps); JSON with keys in another
// order (Go structs), with spaces, escapes other than encoding/json's,
// numbers in exponent form, empty strings or duplicate keys is stored as
// binary (B) and read back byte for byte. Either way warden reads what
// the other side wrote: B as bytes, anything else as compact JSON.

// maxNativeDepth bounds the nesting of a native value (DynamoDB allows 32
// levels).
const maxNativeDepth = 30

// plainNumber is a JSON number DynamoDB keeps as written: no exponent, no
// trailing zero in the fraction, at most 38 digits (negative zero is
// refused apart).
var plainNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]{0,37})(\.[0-9]{0,36}[1-9])?$`)

var errNotNative = errors.New("no native form")

// dataValue returns the attribute a cache value is stored as. A native
// form larger than limit (the store's MaxValueBytes, by DynamoDB's item
// size rules) is stored as binary instead: a list of small numbers takes
// about 1.5 times its JSON.
func dataValue(b []byte, limit int) types.AttributeValue {
	if v, ok := nativeData(b); ok && avSize(v) <= limit {
		return v
	}
	return vB(b)
}

// avSize is the size DynamoDB counts for an attribute value (its
// documented rules, numbers rounded up).
func avSize(v types.AttributeValue) int {
	switch t := v.(type) {
	case *types.AttributeValueMemberS:
		return len(t.Value)
	case *types.AttributeValueMemberN:
		return (len(t.Value)+1)/2 + 1
	case *types.AttributeValueMemberB:
		return len(t.Value)
	case *types.AttributeValueMemberL:
		n := 3
		for _, e := range t.Value {
			n += 1 + avSize(e)
		}
		return n
	case *types.AttributeValueMemberM:
		n := 3
		for k, e := range t.Value {
			n += 1 + len(k) + avSize(e)
		}
		return n
	}
	return 1 // BOOL, NULL
}

// nativeData converts JSON b to its attribute form, if b is JSON that
// reads back as exactly b.
func nativeData(b []byte) (types.AttributeValue, bool) {
	if len(b) == 0 || !json.Valid(b) {
		return nil, false
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	v, err := jsonToAV(d, 0)
	if err != nil {
		return nil, false
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, false
	}
	back, err := dataJSON(v)
	if err != nil || !bytes.Equal(back, b) {
		return nil, false
	}
	return v, true
}

func jsonToAV(d *json.Decoder, depth int) (types.AttributeValue, error) {
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
			m := map[string]types.AttributeValue{}
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return nil, err
				}
				k := kt.(string)
				if _, dup := m[k]; dup || k == "" {
					return nil, errNotNative
				}
				v, err := jsonToAV(d, depth+1)
				if err != nil {
					return nil, err
				}
				m[k] = v
			}
			_, err := d.Token()
			return &types.AttributeValueMemberM{Value: m}, err
		case '[':
			l := []types.AttributeValue{}
			for d.More() {
				v, err := jsonToAV(d, depth+1)
				if err != nil {
					return nil, err
				}
				l = append(l, v)
			}
			_, err := d.Token()
			return &types.AttributeValueMemberL{Value: l}, err
		}
	case string:
		if t == "" {
			return nil, errNotNative
		}
		return &types.AttributeValueMemberS{Value: t}, nil
	case bool:
		return &types.AttributeValueMemberBOOL{Value: t}, nil
	case nil:
		return &types.AttributeValueMemberNULL{Value: true}, nil
	case json.Number:
		if !plainNumber.MatchString(string(t)) || strings.HasPrefix(string(t), "-0") && strings.Trim(string(t), "-0.") == "" {
			return nil, errNotNative
		}
		return &types.AttributeValueMemberN{Value: string(t)}, nil
	}
	return nil, errNotNative
}

// dataJSON returns the bytes of a stored cache value: the data of B, or
// the compact JSON of anything else (maps with sorted keys; string and
// number sets as arrays).
func dataJSON(v types.AttributeValue) ([]byte, error) {
	if b, ok := v.(*types.AttributeValueMemberB); ok {
		if b.Value == nil {
			return []byte{}, nil
		}
		return b.Value, nil
	}
	var buf bytes.Buffer
	if err := writeJSON(&buf, v, 0); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeJSON(w *bytes.Buffer, v types.AttributeValue, depth int) error {
	if depth > 64 {
		return errors.New("dynamo: cache value nested too deeply")
	}
	str := func(s string) {
		b, _ := json.Marshal(s)
		w.Write(b)
	}
	switch t := v.(type) {
	case *types.AttributeValueMemberNULL:
		w.WriteString("null")
	case *types.AttributeValueMemberBOOL:
		if t.Value {
			w.WriteString("true")
		} else {
			w.WriteString("false")
		}
	case *types.AttributeValueMemberS:
		str(t.Value)
	case *types.AttributeValueMemberN:
		if !json.Valid([]byte(t.Value)) {
			return fmt.Errorf("dynamo: a cache value holds the number %q, which is not JSON", t.Value)
		}
		w.WriteString(t.Value)
	case *types.AttributeValueMemberB:
		b, _ := json.Marshal(t.Value) // base64, as encoding/json writes []byte
		w.Write(b)
	case *types.AttributeValueMemberM:
		keys := make([]string, 0, len(t.Value))
		for k := range t.Value {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		w.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				w.WriteByte(',')
			}
			str(k)
			w.WriteByte(':')
			if err := writeJSON(w, t.Value[k], depth+1); err != nil {
				return err
			}
		}
		w.WriteByte('}')
	case *types.AttributeValueMemberL:
		w.WriteByte('[')
		for i, e := range t.Value {
			if i > 0 {
				w.WriteByte(',')
			}
			if err := writeJSON(w, e, depth+1); err != nil {
				return err
			}
		}
		w.WriteByte(']')
	case *types.AttributeValueMemberSS:
		w.WriteByte('[')
		for i, s := range t.Value {
			if i > 0 {
				w.WriteByte(',')
			}
			str(s)
		}
		w.WriteByte(']')
	case *types.AttributeValueMemberNS:
		w.WriteByte('[')
		for i, s := range t.Value {
			if i > 0 {
				w.WriteByte(',')
			}
			w.WriteString(s)
		}
		w.WriteByte(']')
	default:
		return fmt.Errorf("dynamo: a cache value holds a %T, which has no JSON form", v)
	}
	return nil
}
