package driver

import (
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Kind tags put between a store's prefix and a key, as the go-go-scope
// adapters do, so that records of different kinds never collide and a
// namespace-wide operation on one kind never touches another.
const (
	TagLock    = "lock:"
	TagCircuit = "circuit:"
	TagCache   = "cache:"
)

// TokenBase is the fencing token of the first holding of a new lock record
// created at t: t in Unix milliseconds × 4096. Later holdings of the same
// record add one each. Lock records are kept after release and purged only
// after a long idle retention, so a record recreated after a purge starts
// above every token the old record could have reached (that would take
// more than 4096 acquisitions per millisecond).
func TokenBase(t time.Time) int64 { return t.UnixMilli() * 4096 }

// TokenBaseMicro is the candidate token of a new lock record created at t:
// TokenBase(t) plus the microseconds within the millisecond × 4096 / 1000
// (about 4.1 per microsecond, at most 4091). It is never below TokenBase(t)
// and always below TokenBase of the next millisecond, so tokens handed out
// from TokenBase stay below it; and a record that another program deleted
// and that is recreated a microsecond later starts above every token the
// deleted one handed out.
func TokenBaseMicro(t time.Time) int64 {
	return TokenBase(t) + int64(t.Nanosecond()%1_000_000/1000)*4096/1000
}

// CheckpointID is the id of a task's checkpoint with sequence seq:
// "<task>:<seq>" in decimal. Sequences are numbers, so the id parses back
// from its last colon even when the task id contains colons.
func CheckpointID(taskID string, seq int64) string {
	return taskID + ":" + strconv.FormatInt(seq, 10)
}

// ParseCheckpointID splits an id made by CheckpointID; ok=false if it is not
// one.
func ParseCheckpointID(id string) (taskID string, seq int64, ok bool) {
	i := strings.LastIndexByte(id, ':')
	if i <= 0 {
		return "", 0, false
	}
	seq, err := strconv.ParseInt(id[i+1:], 10, 64)
	if err != nil || seq < 1 || strconv.FormatInt(seq, 10) != id[i+1:] {
		return "", 0, false
	}
	return id[:i], seq, true
}

// Millis converts a duration to whole milliseconds, rounding up so that a
// positive duration never becomes zero.
func Millis(d time.Duration) int64 {
	ms := d / time.Millisecond
	if d%time.Millisecond > 0 {
		ms++
	}
	return int64(ms)
}

// Params reads a store URL's query parameters and remembers which were
// read, so that an opener can refuse parameters it does not know:
//
//	q := driver.NewParams(u)
//	prefix := q.String("prefix", "")
//	busy := q.Duration("busy_timeout", 5*time.Second)
//	if err := q.Err(); err != nil { … }
type Params struct {
	vals url.Values
	used map[string]bool
	errs []string
}

// NewParams starts reading u's query parameters.
func NewParams(u *url.URL) *Params {
	return &Params{vals: u.Query(), used: map[string]bool{}}
}

// Has reports whether the parameter is present (and marks it read).
func (q *Params) Has(name string) bool {
	q.used[name] = true
	_, ok := q.vals[name]
	return ok
}

// String returns the parameter's value or def.
func (q *Params) String(name, def string) string {
	q.used[name] = true
	if v, ok := q.vals[name]; ok && len(v) > 0 {
		return v[len(v)-1]
	}
	return def
}

// Duration returns the parameter parsed with time.ParseDuration, or def.
func (q *Params) Duration(name string, def time.Duration) time.Duration {
	s := q.String(name, "")
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		q.errs = append(q.errs, fmt.Sprintf("parameter %s=%q is not a duration", name, s))
		return def
	}
	return d
}

// Int returns the parameter parsed as a non-negative integer, or def.
func (q *Params) Int(name string, def int) int {
	s := q.String(name, "")
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		q.errs = append(q.errs, fmt.Sprintf("parameter %s=%q is not a non-negative integer", name, s))
		return def
	}
	return n
}

// Bool returns the parameter parsed with strconv.ParseBool, or def.
func (q *Params) Bool(name string, def bool) bool {
	s := q.String(name, "")
	if s == "" {
		return def
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		q.errs = append(q.errs, fmt.Sprintf("parameter %s=%q is not a boolean", name, s))
		return def
	}
	return b
}

// Rest returns the parameters not read so far, for openers that hand them
// on to a database driver's own DSN. They count as read afterwards.
func (q *Params) Rest() url.Values {
	rest := url.Values{}
	for k, v := range q.vals {
		if !q.used[k] {
			rest[k] = v
			q.used[k] = true
		}
	}
	return rest
}

// Err reports malformed values and parameters that were never read.
func (q *Params) Err() error {
	var unknown []string
	for k := range q.vals {
		if !q.used[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	msgs := append([]string(nil), q.errs...)
	if len(unknown) > 0 {
		msgs = append(msgs, "unknown parameter(s) "+strings.Join(unknown, ", "))
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrBadURL, strings.Join(msgs, "; "))
}

// ErrBadURL is wrapped by errors about a store URL's form.
var ErrBadURL = errors.New("invalid store URL")

// MaxPrefixBytes is the longest namespace prefix, in bytes.
const MaxPrefixBytes = 64

// ValidatePrefix checks a namespace prefix. A prefix is empty (no
// namespace) or a name of at most 63 bytes of UTF-8, without NUL and
// without ':', followed by one ':' — "billing:", "svc-a:". The rule makes
// stored keys (prefix + kind tag + key) unambiguous: the first ':' of a
// stored key ends its namespace, so prefixes "a:" and "ab:" can never
// produce the same stored key, whereas "a" + "bX" and "ab" + "X" would.
// The kind tags "lock:", "circuit:" and "cache:" are refused as prefixes,
// since a store without prefix stores "lock:" + key. Every store that keeps
// the prefix inside its stored keys calls it; warden.Open calls it for the
// ?prefix= of every URL.
func ValidatePrefix(p string) error {
	if p == "" {
		return nil
	}
	name, ok := strings.CutSuffix(p, ":")
	switch {
	case len(p) > MaxPrefixBytes:
		return fmt.Errorf("%w: prefix is %d bytes, the limit is %d", ErrBadPrefix, len(p), MaxPrefixBytes)
	case !ok || name == "":
		return fmt.Errorf("%w: prefix %q must be a name followed by ':', like \"billing:\"", ErrBadPrefix, p)
	case strings.Contains(name, ":"):
		return fmt.Errorf("%w: prefix %q may contain ':' only at its end", ErrBadPrefix, p)
	case !utf8.ValidString(p) || strings.ContainsRune(p, 0):
		return fmt.Errorf("%w: prefix is not valid UTF-8 without NUL", ErrBadPrefix)
	case p == TagLock || p == TagCircuit || p == TagCache:
		return fmt.Errorf("%w: prefix %q is reserved for the kind tag of stores without prefix", ErrBadPrefix, p)
	}
	return nil
}

// ErrBadPrefix is wrapped by ValidatePrefix's errors.
var ErrBadPrefix = errors.New("invalid namespace prefix")

// RedactURL renders u for messages without secrets: the password of the
// user part (as url.URL.Redacted), the value of every query parameter
// whose name suggests a secret (password, passwd, pwd, secret, token,
// credential, or a name ending in "key" such as access_key), and the
// password of a URL or address given as a parameter's value
// (endpoint=http://user:password@host, addr=user:password@host:port, or
// a comma-separated list of them) become "xxxxx". The other parameters
// are shown as given.
func RedactURL(u *url.URL) string {
	r := *u
	if r.RawQuery != "" {
		r.RawQuery = redactQuery(r.RawQuery)
	}
	return r.Redacted()
}

// redactQuery masks the secrets of a raw query (see RedactURL), keeping
// every other parameter as it was written.
func redactQuery(raw string) string {
	pairs := strings.Split(raw, "&")
	for i, pair := range pairs {
		k, v, _ := strings.Cut(pair, "=")
		if key, err := url.QueryUnescape(k); SecretParam(k) || err == nil && SecretParam(key) {
			pairs[i] = k + "=xxxxx"
			continue
		}
		val, err := url.QueryUnescape(v)
		if err != nil {
			val = v
		}
		if nv, ok := redactUserInfo(val); ok {
			if val != v {
				nv = url.QueryEscape(nv)
			}
			pairs[i] = k + "=" + nv
		}
	}
	return strings.Join(pairs, "&")
}

// redactUserInfo returns v with the password of each comma-separated URL
// or address in it that has user information ("http://user:password@host",
// "user:password@host:port") replaced by "xxxxx", and whether it replaced
// any.
func redactUserInfo(v string) (string, bool) {
	if !strings.Contains(v, "@") {
		return v, false
	}
	if !startsWithScheme(v) {
		// Addresses ("user:password@host:port", or a list of them): their
		// passwords are not escaped, so one may hold ',', '@', ':' or
		// "://". Everything from the first ':' to the last '@' is masked:
		// more than the password where the list has several addresses,
		// never less.
		at := strings.LastIndex(v, "@")
		c := strings.Index(v[:at], ":")
		if c < 0 {
			return v, false
		}
		return v[:c] + ":xxxxx" + v[at:], true
	}
	parts := strings.Split(v, ",")
	// A password may hold ',' (a URL's user information allows it, and an
	// address's is not escaped at all), so a list cannot be split at its
	// commas alone: a part without '@' but with a ':' after its scheme
	// may be the start of user information whose password goes on in the
	// next part. Such a part is joined with the parts after it up to the
	// next '@'. Where the list was really "host:port,user:pw@host2" this
	// masks from host's ':' to host2's '@' — more than needed, but a
	// message never shows a password because it held a comma.
	for i := 0; i+1 < len(parts); {
		p := parts[i]
		if j := strings.Index(p, "://"); j >= 0 {
			p = p[j+3:]
		}
		if !strings.Contains(p, "@") && strings.Contains(p, ":") &&
			strings.Contains(strings.Join(parts[i+1:], ","), "@") {
			parts[i] += "," + parts[i+1]
			parts = append(parts[:i+1], parts[i+2:]...)
			continue
		}
		i++
	}
	// Likewise a password may hold "@,": a part with user information is
	// joined with a following part (not a URL of its own) that has an '@'
	// with no ':' before it — "user:@" + "@host" is user "user" with
	// password "@," — since user information ends at the last '@'.
	for i := 0; i+1 < len(parts); {
		p, next := parts[i], parts[i+1]
		if j := strings.Index(p, "://"); j >= 0 {
			p = p[j+3:]
		}
		at := strings.Index(next, "@")
		if strings.Contains(p, "@") && !strings.Contains(next, "://") && at >= 0 && !strings.Contains(next[:at], ":") {
			parts[i] += "," + next
			parts = append(parts[:i+1], parts[i+2:]...)
			continue
		}
		i++
	}
	changed := false
	for i, p := range parts {
		scheme, rest := "", p
		if j := strings.Index(p, "://"); j >= 0 {
			scheme, rest = p[:j+3], p[j+3:]
		}
		// User information ends at the last '@' of the authority: of the
		// whole address when there is no scheme, since the password of
		// "user:pass#word@host:port" is not escaped as a URL's would be.
		authority := rest
		if j := strings.IndexAny(rest, "/?#"); j >= 0 && scheme != "" {
			authority = rest[:j]
		}
		if at := strings.LastIndex(authority, "@"); at >= 0 {
			if user, pw, ok := strings.Cut(authority[:at], ":"); ok && pw != "" {
				parts[i] = scheme + user + ":xxxxx" + rest[at:]
				changed = true
				continue
			}
		}
		// No password (or an empty one) by the URL's reading, but an '@'
		// after the scheme: the part reads as well as an address whose
		// password starts with "//" ("x" + ":" + "//name#…" + "@host", or
		// "user" + ":" + "//:" + "@host"), which the URL's reading would
		// show whole, so it is masked from the scheme's ':' to its last
		// '@' — an '@' in a path or a fragment is masked with it.
		if k := strings.LastIndex(rest, "@"); k >= 0 && scheme != "" {
			parts[i] = scheme[:len(scheme)-3] + ":xxxxx" + rest[k:]
			changed = true
		}
	}
	out := strings.Join(parts, ",")
	// Every '@' left must end a mask; one that does not may end a password
	// the readings above split elsewhere ("user://,@host" is user "user"
	// with password "//,"): then the value is masked as an address, from
	// its first ':' to its last '@'.
	for i := strings.IndexByte(out, '@'); i >= 0; {
		if !strings.HasSuffix(out[:i], ":xxxxx") {
			at := strings.LastIndex(v, "@")
			if c := strings.Index(v[:at], ":"); c >= 0 {
				return v[:c] + ":xxxxx" + v[at:], true
			}
			return out, changed
		}
		j := strings.IndexByte(out[i+1:], '@')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return out, changed
}

// startsWithScheme reports whether v starts with a URL scheme and "://".
func startsWithScheme(v string) bool {
	i := strings.Index(v, "://")
	if i <= 0 {
		return false
	}
	for j, c := range v[:i] {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case j > 0 && (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return true
}

// SecretParam reports whether a URL query parameter's name says its value
// is a secret (password, sslpassword, secret_key, token, …).
func SecretParam(name string) bool {
	n := strings.ToLower(name)
	for _, s := range []string{"pass", "pwd", "secret", "token", "credential", "auth"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return strings.HasSuffix(n, "key")
}
