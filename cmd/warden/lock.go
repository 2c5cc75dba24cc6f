package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/lock"
)

func lockCommands() []*command {
	return []*command{
		{
			path:    "lock run",
			args:    "KEY [--ttl DURATION] [--wait DURATION | --no-wait] [--grace DURATION] -- CMD [ARGS…]",
			short:   "KEY [FLAGS] -- CMD [ARGS…]",
			summary: "run a command while holding a lock",
			need:    []string{"KEY", "CMD"},
			maxArgs: -1,
			tail:    true,
			help: `
Runs CMD while holding the lock KEY, so that across every process and host
sharing the store at most one CMD runs at a time — the everyday use is one
cron job across many hosts.

warden waits for the lock (by default as long as it takes; --wait bounds the
wait, after which it exits 3; --no-wait exits 3 at once, naming the holder and
its expiry), then starts CMD with the environment variables
WARDEN_LOCK_KEY (the key) and WARDEN_FENCING_TOKEN (the lease's fencing
token, greater than every earlier holding's: pass it to what CMD writes so
that a stale holder's writes can be refused). CMD inherits stdin, stdout
and stderr. The lease lasts --ttl (at least 100ms) in the store and is
renewed about every third of it while CMD runs; it is released when CMD exits, and warden exits with CMD's
exit code (128+N if signal N killed it; 127 if CMD was not found, 126 if it
could not be started).

SIGINT, SIGTERM and SIGHUP sent to warden are forwarded to CMD, which runs
in its own process group (so it does not read from the terminal). If the
lock is lost while CMD runs — force-released by an operator, or not renewed
before it expired (store unreachable) — warden sends SIGTERM to CMD's
process group, SIGKILL after --grace, and exits 6.

Interrupted while waiting for the lock: exit 130. --timeout bounds opening
the store, the first attempt to take the lock and its release, not the wait
nor CMD.`,
			example: `warden lock run nightly-report -- ./report.sh --since yesterday
warden lock run nightly-report --no-wait --ttl 1m -- sh -c 'echo "token $WARDEN_FENCING_TOKEN"; sleep 5'`,
			setup: func(fs *pflag.FlagSet) runFunc {
				o := runOptions{}
				fs.DurationVar(&o.ttl, "ttl", lock.DefaultTTL, "how long the lock lasts in the store unless renewed (at least "+lock.MinTTL.String()+"); renewed about every third of it")
				fs.DurationVar(&o.wait, "wait", 0, "wait at most this long for the lock, then exit 3 (0: until interrupted)")
				fs.BoolVar(&o.noWait, "no-wait", false, "exit 3 at once if the lock is held")
				fs.DurationVar(&o.grace, "grace", 10*time.Second, "once the lock is lost, time between SIGTERM and SIGKILL to the command")
				return func(ctx context.Context, c *cli, args []string) error {
					return lockRun(ctx, c, args[0], args[1:], o)
				}
			},
		},
		{
			path:     "lock ls",
			readOnly: true,
			args:     "[PATTERN]",
			summary:  "list the locks held, with owner, fencing token and expiry",
			maxArgs:  1,
			help: `
Lists the locks currently held whose keys match the glob PATTERN ('*' any
run, '?' one character, '\' escapes; default: all), sorted by key.
Released and expired locks are not shown.`,
			example: `warden lock ls 'jobs/*'`,
			setup:   noFlags(lockLs),
		},
		{
			path:     "lock show",
			readOnly: true,
			args:     "KEY",
			summary:  "show who holds a lock, with its fencing token and expiry",
			need:     []string{"KEY"},
			maxArgs:  1,
			help: `
Shows the current holding of the lock KEY: owner, fencing token, when it was
acquired and when it expires unless renewed. Exits 4 if nobody holds it.`,
			example: `warden lock show nightly-report`,
			setup:   noFlags(lockShow),
		},
		{
			path:     "lock release",
			noCreate: true,
			args:     "KEY --force",
			summary:  "end the holding of a lock, whoever holds it",
			need:     []string{"KEY"},
			maxArgs:  1,
			help: `
Ends the current holding of the lock KEY, whoever holds it. The holder is
not asked: it learns it lost the lock at its next renewal (a 'warden lock
run' then stops its command and exits 6), so --force is required. Exits 4 if
nobody holds the lock.`,
			example: `warden lock release nightly-report --force`,
			setup: func(fs *pflag.FlagSet) runFunc {
				force := fs.Bool("force", false, "required: release the lock even though someone holds it")
				return func(ctx context.Context, c *cli, args []string) error {
					return lockRelease(ctx, c, args[0], *force)
				}
			},
		},
		{
			path:     "lock watch",
			readOnly: true,
			args:     "[PATTERN] [--count N]",
			summary:  "print lock events (acquired, released, expired) as they happen",
			maxArgs:  1,
			help: `
Prints an event each time a lock whose key matches the glob PATTERN
(default: all) is acquired, released or expires, in any process, until
interrupted (exit 130) or --count events were printed (exit 0; events-lost
lines are not counted). Table format: TIME EVENT KEY OWNER TOKEN, one line
per event, and for events-lost its reason; JSON format: one object per
line ("reason" set for events-lost).

What each store can see:
  sqlite, memory, postgres (LISTEN/NOTIFY), redis (pub/sub), mongodb,
    dynamodb: notifications deliver acquired and released at once
    (dynamodb's within about 50ms, with events-lost when it finds that whole
    holdings were missed). A holding that lapses (its holder was killed) is
    reported expired about a second after its expiry, stamped with the
    expiry, whether or not someone takes the key. postgres and redis keep
    nothing for a listener that is not connected: when the store reconnects
    its LISTEN connection or subscription, an events-lost line says that
    events sent meanwhile are gone. mongodb writes events only while some
    process watches: a watch prints events-lost about a second after it
    starts, once every process's writes have seen it (events of that
    first second may be missing).
  mysql: no notifications; warden lists the locks every second
    and reports the differences. A holding that begins and ends between two
    listings is not seen: the stream starts with an events-lost line that
    says so. A holding replaced between two listings is reported ended no
    later than its successor's acquisition.
An events-lost line also means events were dropped because the output was
too slow, or that the store could not be read (with the error).`,
			example: `warden lock watch 'jobs/*'
warden lock watch nightly-report --count 1   # wait for the next change`,
			setup: func(fs *pflag.FlagSet) runFunc {
				n := fs.Int("count", 0, "exit after this many events (0: until interrupted)")
				return func(ctx context.Context, c *cli, args []string) error {
					return lockWatch(ctx, c, argOr(args, 0, ""), *n)
				}
			},
		},
	}
}

// argOr returns args[i], or def if there are not that many.
func argOr(args []string, i int, def string) string {
	if i < len(args) {
		return args[i]
	}
	return def
}

// lockJSON is a lock's JSON form.
type lockJSON struct {
	Key        string   `json:"key"`
	Owner      string   `json:"owner"`
	Token      int64    `json:"token"`
	AcquiredAt jsonTime `json:"acquired_at"`
	ExpiresAt  jsonTime `json:"expires_at"`
}

func toLockJSON(r driver.LockRecord) lockJSON {
	return lockJSON{Key: r.Key, Owner: r.Owner, Token: r.Token, AcquiredAt: jsonTime(r.AcquiredAt), ExpiresAt: jsonTime(r.ExpiresAt)}
}

func lockLs(ctx context.Context, c *cli, args []string) error {
	var recs []driver.LockRecord
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		recs, err = st.Locks().List(ctx, argOr(args, 0, ""))
		return err
	})
	if err != nil {
		return err
	}
	if c.isJSON() {
		out := make([]lockJSON, 0, len(recs))
		for _, r := range recs {
			out = append(out, toLockJSON(r))
		}
		return c.printJSON(out)
	}
	tw := c.table("KEY", "OWNER", "TOKEN", "ACQUIRED", "EXPIRES")
	for _, r := range recs {
		row(tw, cell(r.Key), cell(r.Owner), strconv.FormatInt(r.Token, 10), tableTime(r.AcquiredAt), tableTime(r.ExpiresAt))
	}
	return tw.Flush()
}

func lockShow(ctx context.Context, c *cli, args []string) error {
	var rec driver.LockRecord
	var found bool
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		rec, found, err = st.Locks().Get(ctx, args[0])
		return err
	})
	if err != nil {
		return err
	}
	if !found {
		return notFoundf("lock %q is not held", args[0])
	}
	if c.isJSON() {
		return c.printJSON(toLockJSON(rec))
	}
	return c.printFields([]field{
		{"key", cell(rec.Key)},
		{"owner", cell(rec.Owner)},
		{"token", strconv.FormatInt(rec.Token, 10)},
		{"acquired_at", tableTime(rec.AcquiredAt)},
		{"expires_at", tableTime(rec.ExpiresAt)},
	})
}

func lockRelease(ctx context.Context, c *cli, key string, force bool) error {
	if !force {
		return usagef(findCommand("lock release"), "--force is required: the holder of %q is not asked and learns of it only at its next renewal", key)
	}
	var ok bool
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		ok, err = st.Locks().ForceRelease(ctx, key)
		return err
	})
	if err != nil {
		return err
	}
	if !ok {
		return notFoundf("lock %q is not held", key)
	}
	if c.isJSON() {
		return c.printJSON(struct {
			Key      string `json:"key"`
			Released bool   `json:"released"`
		}{key, true})
	}
	return c.printf("released lock %s", cell(key))
}

// lockEventJSON is a lock event's JSON form.
type lockEventJSON struct {
	Event string   `json:"event"`
	Key   string   `json:"key"`
	Owner string   `json:"owner"`
	Token int64    `json:"token"`
	At    jsonTime `json:"at"`
	// Reason says why events may be missing (events-lost only).
	Reason string `json:"reason,omitempty"`
}

func lockWatch(ctx context.Context, c *cli, pattern string, n int) error {
	if n < 0 {
		return usagef(findCommand("lock watch"), "--count %d: want 0 or more", n)
	}
	if _, err := warden.ParsePattern(pattern); err != nil {
		return err
	}
	if len(pattern) > driver.MaxKeyBytes {
		// Matching such a pattern against every event would cost without
		// end; no useful pattern is longer than the longest key.
		return fmt.Errorf("%w: %d bytes, the limit is %d", warden.ErrInvalidPattern, len(pattern), driver.MaxKeyBytes)
	}
	octx, ocancel := c.storeContext(ctx)
	st, err := c.openStore(octx)
	ocancel()
	if err != nil {
		return err
	}
	defer st.Close()
	locker, err := lock.New(st, &lock.Options{Observe: c.tel.lockObserver()})
	if err != nil {
		return err
	}
	defer locker.Close()

	wctx, stop := c.interruptible(ctx)
	defer stop()
	ch, err := locker.Watch(wctx, pattern)
	if err != nil {
		return c.ctxError(wctx, err)
	}
	seen := 0
	for ev := range ch {
		if err := c.printEvent(ev); err != nil {
			return err
		}
		if ev.Kind == lock.EventsLost {
			continue // a notice, not a change
		}
		seen++
		if n > 0 && seen >= n {
			return nil
		}
	}
	if wctx.Err() != nil {
		return c.ctxError(wctx, wctx.Err())
	}
	return errors.New("the store ended the watch")
}

// printEvent prints one lock event: a JSON line, or TIME EVENT KEY OWNER
// TOKEN.
func (c *cli) printEvent(ev lock.Event) error {
	reason := ""
	switch {
	case ev.Kind != lock.EventsLost:
	case ev.Err != nil:
		reason = strings.TrimPrefix(oneLine(scrubSecrets(ev.Err.Error(), c.g.store)), "lock: ")
	default:
		reason = "the output fell behind and events were dropped"
	}
	if c.isJSON() {
		return c.printJSONLine(lockEventJSON{Event: ev.Kind.String(), Key: ev.Key, Owner: ev.Owner, Token: ev.Token, At: jsonTime(ev.At), Reason: reason})
	}
	token := "-"
	if ev.Token != 0 {
		token = strconv.FormatInt(ev.Token, 10)
	}
	at := ev.At
	if at.IsZero() {
		at = time.Now()
	}
	line := fmt.Sprintf("%s  %-11s  %s  %s  %s", tableTime(at), ev.Kind, cell(ev.Key), cell(ev.Owner), token)
	if reason != "" {
		line += "  (" + reason + ")"
	}
	_, err := fmt.Fprintln(c.stdout, line)
	return err
}
