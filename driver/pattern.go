package driver

import (
	"errors"
	"regexp"
	"strings"
	"unicode/utf8"
)

// ErrBadPattern is returned by ParsePattern for a pattern that is not valid
// UTF-8 or ends in a lone backslash. warden.ErrInvalidPattern wraps it.
var ErrBadPattern = errors.New("invalid pattern")

// Pattern is a parsed glob over keys: '*' matches any run of characters
// (including none), '?' matches exactly one character (a Unicode code
// point), and '\' makes the next character literal. Every other character,
// including '[', '%', '_', '.', '$' and quotes, is literal. The empty
// pattern matches every key.
//
// A Pattern renders itself safely for each backend ([Pattern.Like],
// [Pattern.Regexp], [Pattern.RedisMatch], [Pattern.SQLiteGlob]): literal
// characters are always escaped, so a pattern can neither widen past the
// store's namespace nor inject SQL, regex or glob syntax. Server-side
// filters may be wider than the glob (Redis matches bytes, not code points);
// drivers re-check every listed key with [Pattern.Match].
type Pattern struct {
	src   string
	parts []patPart
}

type patKind uint8

const (
	patLit patKind = iota
	patStar
	patOne
)

type patPart struct {
	kind patKind
	lit  string
}

// AllKeys is the pattern that matches every key.
var AllKeys = Pattern{}

// ParsePattern parses a glob. See [Pattern].
func ParsePattern(s string) (Pattern, error) {
	if !utf8.ValidString(s) {
		return Pattern{}, ErrBadPattern
	}
	p := Pattern{src: s}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			p.parts = append(p.parts, patPart{kind: patLit, lit: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch r {
		case '\\':
			if i+n >= len(s) {
				return Pattern{}, ErrBadPattern
			}
			r2, n2 := utf8.DecodeRuneInString(s[i+n:])
			lit.WriteRune(r2)
			i += n + n2
			continue
		case '*':
			flush()
			if k := len(p.parts); k == 0 || p.parts[k-1].kind != patStar {
				p.parts = append(p.parts, patPart{kind: patStar})
			}
		case '?':
			flush()
			p.parts = append(p.parts, patPart{kind: patOne})
		default:
			lit.WriteRune(r)
		}
		i += n
	}
	flush()
	if s == "" {
		p.parts = []patPart{{kind: patStar}}
	}
	return p, nil
}

// MustPattern is ParsePattern that panics on error, for constant patterns.
func MustPattern(s string) Pattern {
	p, err := ParsePattern(s)
	if err != nil {
		panic(err)
	}
	return p
}

// String returns the glob as written.
func (p Pattern) String() string {
	if p.parts == nil {
		return "*"
	}
	return p.src
}

func (p Pattern) all() []patPart {
	if p.parts == nil {
		return []patPart{{kind: patStar}}
	}
	return p.parts
}

// Prefix returns the literal text every matching key starts with.
func (p Pattern) Prefix() string {
	parts := p.all()
	if parts[0].kind == patLit {
		return parts[0].lit
	}
	return ""
}

// Literal reports whether the pattern has no wildcard, and its text.
func (p Pattern) Literal() (string, bool) {
	parts := p.all()
	if len(parts) == 1 && parts[0].kind == patLit {
		return parts[0].lit, true
	}
	return "", false
}

// Match reports whether key matches the whole pattern.
func (p Pattern) Match(key string) bool {
	return matchParts(p.all(), key)
}

func matchParts(parts []patPart, s string) bool {
	for len(parts) > 0 {
		switch parts[0].kind {
		case patLit:
			if !strings.HasPrefix(s, parts[0].lit) {
				return false
			}
			s = s[len(parts[0].lit):]
		case patOne:
			if s == "" {
				return false
			}
			_, n := utf8.DecodeRuneInString(s)
			s = s[n:]
		case patStar:
			rest := parts[1:]
			if len(rest) == 0 {
				return true
			}
			for i := 0; i <= len(s); {
				if matchParts(rest, s[i:]) {
					return true
				}
				if i == len(s) {
					break
				}
				_, n := utf8.DecodeRuneInString(s[i:])
				i += n
			}
			return false
		}
		parts = parts[1:]
	}
	return s == ""
}

// Like renders the pattern as the operand of SQL `LIKE … ESCAPE 'esc'`,
// after the literal prefix (the store's namespace and kind tag). '%', '_'
// and esc in literal text are escaped; esc must be an ASCII punctuation
// character such as '\\' or '!'.
func (p Pattern) Like(prefix string, esc byte) string {
	var b strings.Builder
	lit := func(s string) {
		for i := 0; i < len(s); i++ {
			c := s[i]
			if c == '%' || c == '_' || c == esc {
				b.WriteByte(esc)
			}
			b.WriteByte(c)
		}
	}
	lit(prefix)
	for _, part := range p.all() {
		switch part.kind {
		case patLit:
			lit(part.lit)
		case patStar:
			b.WriteByte('%')
		case patOne:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Regexp renders the pattern, after the literal prefix, as an anchored
// regular expression (RE2, PCRE and MongoDB syntax alike).
func (p Pattern) Regexp(prefix string) string {
	var b strings.Builder
	b.WriteString("^")
	b.WriteString(regexp.QuoteMeta(prefix))
	for _, part := range p.all() {
		switch part.kind {
		case patLit:
			b.WriteString(regexp.QuoteMeta(part.lit))
		case patStar:
			b.WriteString("[\\s\\S]*")
		case patOne:
			b.WriteString("[\\s\\S]")
		}
	}
	b.WriteString("$")
	return b.String()
}

// RedisMatch renders the pattern, after the literal prefix, as a Redis
// SCAN MATCH glob, escaping '*', '?', '[', ']' and '\' in literal text.
// Redis's '?' matches one byte, not one character, so '?' is rendered as
// "?*" (one byte or more): a superset that drivers narrow with Match.
func (p Pattern) RedisMatch(prefix string) string {
	var b strings.Builder
	lit := func(s string) {
		for i := 0; i < len(s); i++ {
			switch c := s[i]; c {
			case '*', '?', '[', ']', '\\':
				b.WriteByte('\\')
				b.WriteByte(c)
			default:
				b.WriteByte(c)
			}
		}
	}
	lit(prefix)
	for _, part := range p.all() {
		switch part.kind {
		case patLit:
			lit(part.lit)
		case patStar:
			b.WriteByte('*')
		case patOne:
			b.WriteString("?*")
		}
	}
	return b.String()
}

// SQLiteGlob renders the pattern, after the literal prefix, as an operand
// of SQLite's case-sensitive GLOB operator, which has no escape character:
// '*', '?' and '[' in literal text become one-character classes.
func (p Pattern) SQLiteGlob(prefix string) string {
	var b strings.Builder
	lit := func(s string) {
		for i := 0; i < len(s); i++ {
			switch c := s[i]; c {
			case '*':
				b.WriteString("[*]")
			case '?':
				b.WriteString("[?]")
			case '[':
				b.WriteString("[[]")
			default:
				b.WriteByte(c)
			}
		}
	}
	lit(prefix)
	for _, part := range p.all() {
		switch part.kind {
		case patLit:
			lit(part.lit)
		case patStar:
			b.WriteByte('*')
		case patOne:
			b.WriteByte('?')
		}
	}
	return b.String()
}
