package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/term"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// defaultStore is the store used without --store and WARDEN_STORE: the
// embedded SQLite file warden.db in the working directory.
const defaultStore = "sqlite://warden.db"

// defaultTimeout bounds each command's store work without --timeout.
const defaultTimeout = 10 * time.Second

// globals are the flags every command accepts.
type globals struct {
	store   string        // --store, WARDEN_STORE
	output  string        // -o, --output: "table" or "json"
	timeout time.Duration // --timeout
}

// cli is one invocation of warden: its streams, environment and global
// flags.
type cli struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	env    []string
	// sigs receives the signals warden reacts to (SIGINT, SIGTERM,
	// SIGHUP): they interrupt a command, or are forwarded to the child of
	// `lock run`. One reader at a time.
	sigs <-chan os.Signal
	g    globals
	// args are the command's positional arguments (keys, patterns,
	// names), which messages show cut to a readable length.
	args []string
	// isTerminal reports whether stdin is a terminal to ask questions on
	// (nil: check c.stdin).
	isTerminal func() bool
	// readOnly: the command only reads the store (command.readOnly).
	readOnly bool
	// noCreate: the command only deletes or modifies existing records
	// (command.noCreate).
	noCreate bool
	// path: the running command's path ("cache set"), "" before one runs.
	path string
	// ran is set when a command's own function ran: an error is then the
	// command's, not cobra's about the command line.
	ran bool
	// tel exports traces and metrics when the OTEL_EXPORTER_OTLP_*
	// environment names a collector; nil otherwise.
	tel *telemetry
}

// run is warden's entry point: it runs the command in args and returns the
// process's exit code. main calls it with the process's streams; tests call
// it in-process. Cancelling ctx interrupts the command like SIGINT does.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, env []string) int {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwardedSignals...)
	defer signal.Stop(sigs)

	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr, env: env, sigs: sigs}
	c.g = globals{output: "table", timeout: defaultTimeout}
	tel, err := startTelemetry(ctx, c.getenv)
	if err != nil {
		fmt.Fprintf(stderr, "warden: telemetry off: %v\n", err)
	}
	c.tel = tel
	defer func() {
		if err := c.tel.stop(ctx); err != nil {
			fmt.Fprintf(stderr, "warden: telemetry: %v\n", err)
		}
	}()
	root := c.newRoot(ctx)
	root.SetArgs(args)
	err = root.ExecuteContext(ctx)
	if err != nil && !c.ran {
		// cobra's own errors are about the command line.
		var ue *usageError
		if !errors.As(err, &ue) {
			err = &usageError{msg: err.Error()}
		}
	}
	if err == nil {
		return exitOK
	}
	code := exitCode(err)
	if msg := c.message(err); msg != "" {
		fmt.Fprintln(c.stderr, msg)
	}
	return code
}

// terminal reports whether warden may ask the user a question on stdin.
func (c *cli) terminal() bool {
	if c.isTerminal != nil {
		return c.isTerminal()
	}
	f, ok := c.stdin.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// getenv looks name up in the environment run was given.
func (c *cli) getenv(name string) string {
	for i := len(c.env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(c.env[i], name+"="); ok {
			return v
		}
	}
	return ""
}

// checkStoreURL refuses, as usage errors, store URLs that no store could
// use: one without a scheme, and one whose port (of the main URL or of a
// URL-valued query parameter such as DynamoDB's endpoint) is not a number
// from 1 to 65535. A dial to such a port would otherwise be reported as
// an unreachable store. Other mistakes are the store's to report. It runs
// when a store is opened, so that version and completion need no store.
func checkStoreURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return nil // warden.Open says so, without quoting the URL
	}
	if u.Scheme == "" {
		return usagef(nil, "--store %s: a store URL needs a scheme, such as %s; registered schemes are %s",
			quoteShort(redactURL(raw)), defaultStore, strings.Join(warden.Schemes(), ", "))
	}
	check := func(what string, u *url.URL) error {
		for _, host := range strings.Split(u.Host, ",") { // mongodb:// lists hosts
			i := strings.LastIndexByte(host, ':')
			if i < 0 || strings.HasSuffix(host, "]") {
				continue // no port
			}
			port := host[i+1:]
			if port == "" {
				continue
			}
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
				return usagef(nil, "--store: invalid port %s in %s: want 1 to 65535", quoteShort(port), what)
			}
		}
		return nil
	}
	if err := check("the store URL", u); err != nil {
		return err
	}
	for name, vals := range u.Query() {
		for _, v := range vals {
			if nu, ok := nestedURL(v); ok {
				if err := check("its "+name+"= parameter", nu); err != nil {
					return err
				}
				continue
			}
			if name == "addr" {
				// Further addresses (Redis Cluster, Sentinel):
				// [user:password@]host:port, one a parameter or
				// comma-separated.
				for _, a := range strings.Split(v, ",") {
					if at := strings.LastIndex(a, "@"); at >= 0 {
						a = a[at+1:]
					}
					if err := check("its addr= parameter", &url.URL{Host: a}); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// nestedURL parses a query parameter's value that is itself a URL with a
// host (DynamoDB's endpoint=http://…).
func nestedURL(v string) (*url.URL, bool) {
	if !strings.Contains(v, "://") {
		return nil, false
	}
	u, err := url.Parse(v)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, false
	}
	return u, true
}

// openStore opens the store named by --store, bounded by ctx. The store's
// own warnings (a lease lost, …) are not logged: the commands report what
// matters in one line.
func (c *cli) openStore(ctx context.Context) (*warden.Store, error) {
	if err := checkStoreURL(c.g.store); err != nil {
		return nil, err
	}
	raw := c.g.store
	if strings.HasPrefix(c.path, "record ") {
		raw = recordStoreURL(raw, c.scheme())
	}
	if c.readOnly && c.scheme() == "sqlite" {
		raw = withParam(raw, "mode", "ro")
	}
	if c.noCreate && c.scheme() == "sqlite" {
		// A command that can only delete or modify existing records must
		// not create a database at a mistyped path. (A directory that
		// does not exist is left to the store, whose error names it.)
		if path := sqliteFile(raw); path != "" && dirExists(path) {
			if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
				return nil, &sqliteOpenError{err: quoteOpenURL(fmt.Errorf("warden: open %s: %w", driver.RedactURL(mustParse(raw)), err), raw, c.g.store), readOnly: true}
			}
		}
	}
	st, err := warden.OpenWith(ctx, raw, &warden.Options{Logger: slog.New(slog.DiscardHandler), Hook: c.tel.hook()})
	if err != nil {
		err = quoteOpenURL(err, raw, c.g.store)
		if c.scheme() == "sqlite" {
			err = &sqliteOpenError{err: err, readOnly: c.readOnly && raw != c.g.store}
		}
		return nil, c.ctxError(ctx, err)
	}
	return st, nil
}

// withParam returns the URL raw with the query parameter name=value
// added, unless raw already has name or cannot be parsed.
func withParam(raw, name, value string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Query().Has(name) {
		return raw
	}
	sep := "?"
	if strings.Contains(raw, "?") {
		sep = "&"
		if strings.HasSuffix(raw, "?") || strings.HasSuffix(raw, "&") {
			sep = ""
		}
	}
	return raw + sep + url.QueryEscape(name) + "=" + url.QueryEscape(value)
}

// withStore runs f on the store within --timeout, interruptible by SIGINT
// and SIGTERM, and closes the store afterwards.
func (c *cli) withStore(ctx context.Context, f func(ctx context.Context, st *warden.Store) error) error {
	ctx, cancel := c.storeContext(ctx)
	defer cancel()
	st, err := c.openStore(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	return c.ctxError(ctx, f(ctx, st))
}

// storeContext returns a context for store work: it ends after --timeout
// (cause: a *timeoutError) or when a signal arrives (cause:
// errInterrupted).
func (c *cli) storeContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, stop := c.interruptible(parent)
	tctx, cancel := context.WithTimeoutCause(ctx, c.g.timeout, &timeoutError{d: c.g.timeout, scheme: c.scheme()})
	return tctx, func() { cancel(); stop() }
}

// interruptible returns a context cancelled with errInterrupted when a
// signal arrives. The goroutine watching for it ends when the returned
// function is called.
func (c *cli) interruptible(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-c.sigs:
			cancel(errInterrupted)
		case <-ctx.Done():
		case <-stop:
		}
	}()
	return ctx, func() {
		close(stop)
		<-done
		cancel(context.Canceled)
	}
}

// ctxError replaces the error of an operation cut short by ctx with the
// reason ctx ended: a *timeoutError or errInterrupted.
func (c *cli) ctxError(ctx context.Context, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	cause := context.Cause(ctx)
	var te *timeoutError
	if errors.As(cause, &te) {
		return te
	}
	if errors.Is(cause, errInterrupted) {
		return errInterrupted
	}
	return err
}

// scheme returns the scheme of --store, for messages.
func (c *cli) scheme() string {
	if u, err := url.Parse(c.g.store); err == nil && u.Scheme != "" {
		return strings.ToLower(u.Scheme)
	}
	return "store"
}

// redactedStore returns --store with its password hidden.
func (c *cli) redactedStore() string {
	return redactURL(c.g.store)
}

// redactURL hides a URL's secrets (driver.RedactURL), and the passwords of
// URLs given as query parameters (endpoint=http://user:password@…); an
// unparseable URL is not shown.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable URL)"
	}
	return scrubSecrets(driver.RedactURL(u), raw)
}

// openError is warden.Open's error with the store URL quoted: a URL may
// end with a colon (?prefix=billing:, sqlite:), which "open URL: error"
// would double.
type openError struct {
	url string // redacted
	err error  // warden.Open's cause
}

func (e *openError) Error() string { return "open " + strconv.Quote(e.url) + ": " + e.err.Error() }
func (e *openError) Unwrap() error { return e.err }

// quoteOpenURL rewrites warden.Open's "warden: open URL: cause" error for
// the URL raw as an *openError that shows the URL shown (the one the user
// gave, which raw may extend); other errors are returned as they are.
func quoteOpenURL(err error, raw, shown string) error {
	u, perr := url.Parse(raw)
	if perr != nil {
		return err
	}
	redacted := driver.RedactURL(u)
	cause := errors.Unwrap(err)
	if cause == nil || !strings.HasPrefix(err.Error(), "warden: open "+redacted+": ") {
		return err
	}
	if su, err := url.Parse(shown); err == nil {
		redacted, raw = driver.RedactURL(su), shown
		if redacted == su.String() {
			// Nothing to hide: show the URL as given ("mysql://", which
			// url.URL would print as "mysql:").
			redacted = shown
		}
	}
	return &openError{url: scrubSecrets(redacted, raw), err: cause}
}

// message is the one line printed on stderr for err, without the store
// URL's password.
func (c *cli) message(err error) string {
	var e *exitError
	if errors.As(err, &e) && e.msg == "" && e.err == nil {
		return ""
	}
	msg := strings.TrimPrefix(err.Error(), "warden: ")
	switch exitCode(err) {
	case exitUnreachable:
		var te *timeoutError
		if !errors.As(err, &te) {
			msg = "store unreachable: " + msg
		}
	case exitUsage:
		var ue *usageError
		var we *warden.Error
		switch {
		case errors.As(err, &ue):
		case errors.As(err, &we) && c.path != "":
			// A bad argument reported by the store: named by the
			// command, not the store's operation.
			msg = c.path
			if we.Key != "" {
				msg += " " + strconv.Quote(we.Key)
			}
			msg += ": " + strings.TrimPrefix(we.Err.Error(), "warden: ") + " (see 'warden " + c.path + " --help')"
		default:
			// A bad store URL or argument reported by the store.
			msg += " (see 'warden --help')"
		}
	}
	return "warden: " + oneLine(shortenArgs(scrubSecrets(msg, c.g.store), c.args))
}

// Messages show keys, patterns and names of up to maxShown bytes whole;
// longer ones as their first maxShown bytes and their length.
const maxShown = 64

// short returns s, or its first maxShown bytes (whole UTF-8 characters)
// followed by "…(N bytes)".
func short(s string) string {
	if len(s) <= maxShown {
		return s
	}
	return cut(s) + fmt.Sprintf("…(%d bytes)", len(s))
}

// quoteShort is strconv.Quote(s) with a long s cut as short does:
// "abc…"…(N bytes).
func quoteShort(s string) string {
	if len(s) <= maxShown {
		return strconv.Quote(s)
	}
	return strconv.Quote(cut(s)) + fmt.Sprintf("…(%d bytes)", len(s))
}

// cut returns the first maxShown bytes of s, ending on a character boundary.
func cut(s string) string {
	n := maxShown
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// maxWord bounds any word of a message: a run of more bytes without a space
// is cut like a long key, whatever quoted it.
const maxWord = 256

// shortenArgs cuts, in msg, the long arguments in args (quoted or not) and
// any other run of more than maxWord bytes without a space.
func shortenArgs(msg string, args []string) string {
	for _, a := range args {
		if len(a) > maxShown {
			msg = strings.ReplaceAll(msg, strconv.Quote(a), quoteShort(a))
			msg = strings.ReplaceAll(msg, a, short(a))
		}
	}
	if len(msg) <= maxWord {
		return msg
	}
	var b strings.Builder
	for len(msg) > 0 {
		i := strings.IndexAny(msg, " \t\n")
		word := msg
		if i >= 0 {
			word = msg[:i+1]
		}
		msg = msg[len(word):]
		if len(word) > maxWord {
			word = short(word)
		}
		b.WriteString(word)
	}
	return b.String()
}

// oneLine joins a multi-line message into one line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' })
	for i := range fields {
		fields[i] = strings.TrimSpace(fields[i])
	}
	return strings.Join(fields, "; ")
}

// scrubSecrets removes the secrets of rawURL from s — its password and
// the values of secret query parameters — in every form they could take in
// a message. warden.Open's errors hide the user-info password; this also
// guards against a store's error that would quote a secret.
func scrubSecrets(s, rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		// Its secrets cannot be told apart: the URL goes whole.
		return strings.ReplaceAll(s, rawURL, "(unparseable URL)")
	}
	var secrets []string
	if u.User != nil {
		if pw, ok := u.User.Password(); ok {
			secrets = append(secrets, pw)
		}
	}
	for name, vals := range u.Query() {
		if driver.SecretParam(name) {
			secrets = append(secrets, vals...)
		}
		// A URL given as a parameter (endpoint=http://user:password@…),
		// or addresses with credentials (addr=user:password@host:port,…).
		for _, v := range vals {
			if nu, ok := nestedURL(v); ok && nu.User != nil {
				if pw, ok := nu.User.Password(); ok {
					secrets = append(secrets, pw)
				}
				continue
			}
			// Each address of a list, and the whole value read as one
			// address: its password may hold ',' ("user:0,@host").
			for _, a := range append(strings.Split(v, ","), v) {
				if at := strings.LastIndex(a, "@"); at >= 0 {
					if _, pw, ok := strings.Cut(a[:at], ":"); ok {
						secrets = append(secrets, pw)
						if upw, err := url.PathUnescape(pw); err == nil {
							secrets = append(secrets, upw)
						}
					}
				}
			}
		}
	}
	for _, secret := range secrets {
		if secret == "" {
			continue
		}
		forms := []string{url.UserPassword("", secret).String()[1:], url.QueryEscape(secret), url.PathEscape(secret), secret}
		// Escaped once more, as a nested URL's password is in a query.
		for _, f := range forms[:3] {
			forms = append(forms, url.QueryEscape(f))
		}
		for _, form := range forms {
			// In a URL's or an address's user information the password is
			// masked whatever its length.
			s = strings.ReplaceAll(s, ":"+form+"@", ":xxxxx@")
			s = strings.ReplaceAll(s, "%3A"+form+"%40", "%3Axxxxx%40")
			// Elsewhere only a password long enough to be told from the
			// words of a message, and only as a whole token: a short one
			// ("e", "test") must not mangle the message around it.
			if len(secret) >= minMaskedSecret {
				s = replaceToken(s, form, "xxxxx")
			}
		}
	}
	return s
}

// minMaskedSecret is the length from which a password is masked wherever it
// appears in a message as a whole token, not only in user information.
const minMaskedSecret = 5

// replaceToken replaces the occurrences of old in s that are not part of a
// longer word (no letter or digit right before or after).
func replaceToken(s, old, repl string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, old)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		end := i + len(old)
		if (i > 0 && isWordByte(s[i-1])) || (end < len(s) && isWordByte(s[end])) {
			b.WriteString(s[:i+1])
			s = s[i+1:]
			continue
		}
		b.WriteString(s[:i])
		b.WriteString(repl)
		s = s[end:]
	}
}

func isWordByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// sqliteFile returns the file path of a sqlite:// URL, or "" if it has none.
func sqliteFile(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	switch {
	case u.Opaque != "":
		p, err := url.PathUnescape(u.Opaque)
		if err != nil {
			return ""
		}
		return p
	case u.Host != "":
		return u.Host + u.Path
	}
	return u.Path
}

// dirExists reports whether the directory of the file path exists.
func dirExists(path string) bool {
	_, err := os.Stat(filepath.Dir(path))
	return !errors.Is(err, fs.ErrNotExist)
}

// mustParse parses a URL already checked by checkStoreURL.
func mustParse(raw string) *url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		return &url.URL{}
	}
	return u
}
