package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"
)

// Output formats.
//
// -o table (the default) prints aligned columns for lists, "field: value"
// lines for one record, and a short sentence for actions. Times are UTC
// with milliseconds; keys that contain spaces, quotes or control
// characters are shown Go-quoted; "-" stands for no value.
//
// -o json prints one JSON document (an array for lists, an object
// otherwise; `lock watch` prints one object per line) with lower_snake_case
// field names that do not change between releases. Times are RFC 3339 UTC
// strings with milliseconds, or null; durations are integers in
// milliseconds (fields ending in _ms). Bytes (cache values, idempotency
// results, checkpoint data) are a pair of fields: the value as a string
// and its encoding, "text" when the bytes are valid UTF-8 (the value is
// the text itself) or "base64".

// isJSON reports whether -o json was asked for.
func (c *cli) isJSON() bool { return c.g.output == "json" }

// printJSON writes v as indented JSON.
func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printJSONLine writes v as one line of JSON (streams).
func (c *cli) printJSONLine(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// table starts an aligned table with the given column headers; write rows
// with row and finish with Flush.
func (c *cli) table(header ...string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	row(tw, header...)
	return tw
}

// row writes one table row.
func row(tw *tabwriter.Writer, cells ...string) {
	fmt.Fprintln(tw, strings.Join(cells, "\t"))
}

// field is one line of a record shown as "name: value".
type field struct{ name, value string }

// printFields shows one record as aligned "name: value" lines.
func (c *cli) printFields(fields []field) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 1, ' ', 0)
	for _, f := range fields {
		fmt.Fprintf(tw, "%s:\t%s\n", f.name, f.value)
	}
	return tw.Flush()
}

// printf writes a line of table-format output.
func (c *cli) printf(format string, args ...any) error {
	_, err := fmt.Fprintf(c.stdout, format+"\n", args...)
	return err
}

// timeLayout is how times are written: UTC with milliseconds.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// jsonTime is a time written as RFC 3339 UTC with milliseconds, or null
// when zero.
type jsonTime time.Time

// MarshalJSON implements json.Marshaler.
func (t jsonTime) MarshalJSON() ([]byte, error) {
	tt := time.Time(t)
	if tt.IsZero() {
		return []byte("null"), nil
	}
	return []byte(strconv.Quote(tt.UTC().Format(timeLayout))), nil
}

// UnmarshalJSON implements json.Unmarshaler, for programs (and tests)
// reading warden's output.
func (t *jsonTime) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*t = jsonTime{}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	tt, err := time.Parse(time.RFC3339Nano, s)
	*t = jsonTime(tt)
	return err
}

// tableTime formats a time for a table ("-" when zero).
func tableTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(timeLayout)
}

// cell formats a string for a table: "-" when empty, Go-quoted when it
// contains spaces, quotes or characters that are not printable, as is
// otherwise.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) || r == '"' || r == '\\' {
			return strconv.Quote(s)
		}
	}
	return s
}

// encodeBytes returns b as a JSON-friendly string and its encoding: the
// text itself when b is valid UTF-8, base64 otherwise.
func encodeBytes(b []byte) (value, encoding string) {
	if utf8.Valid(b) {
		return string(b), "text"
	}
	return base64.StdEncoding.EncodeToString(b), "base64"
}

// showBytes formats bytes for a "name: value" line: the text when it is
// printable UTF-8 on one line, Go-quoted when it is UTF-8 with control
// characters, "base64:…" otherwise.
func showBytes(b []byte) string {
	if !utf8.Valid(b) {
		return "base64:" + base64.StdEncoding.EncodeToString(b)
	}
	s := string(b)
	for _, r := range s {
		if !unicode.IsPrint(r) && r != ' ' {
			return strconv.Quote(s)
		}
	}
	if s == "" {
		return `""`
	}
	return s
}

// count formats a number of things: "1 entry", "3 entries".
func count(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.FormatInt(n, 10) + " " + many
}
