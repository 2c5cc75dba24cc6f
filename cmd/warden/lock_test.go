package main

import (
	"context"
	"encoding/json"
	"github.com/warden-go/warden/internal/testkit"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestLockLsShowRelease(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		ctx := context.Background()
		st := openTestStore(t, url)
		a, ok, err := st.Locks().Acquire(ctx, "jobs/a", "host-1:42:x", time.Minute)
		if err != nil || !ok {
			t.Fatalf("acquire: %v %v", ok, err)
		}
		if _, ok, err := st.Locks().Acquire(ctx, "other b", "host-2:7:y", time.Minute); err != nil || !ok {
			t.Fatalf("acquire: %v %v", ok, err)
		}

		r := invoke(t, "", "--store", url, "lock", "ls")
		want(t, r, 0)
		wantLines(t, r,
			`KEY +OWNER +TOKEN +ACQUIRED +EXPIRES`,
			`jobs/a +host-1:42:x +`+strconv.FormatInt(a.Token, 10)+` +`+rfc3339ms+` +`+rfc3339ms,
			`"other b" +host-2:7:y +\d+ +`+rfc3339ms+` +`+rfc3339ms)

		r = invoke(t, "", "lock", "ls", "jobs/*", "-o", "json", "--store", url)
		want(t, r, 0)
		var locks []lockJSON
		decode(t, r, &locks)
		if len(locks) != 1 || locks[0].Key != "jobs/a" || locks[0].Owner != "host-1:42:x" || locks[0].Token != a.Token ||
			!time.Time(locks[0].ExpiresAt).Equal(a.ExpiresAt) || !time.Time(locks[0].AcquiredAt).Equal(a.AcquiredAt) {
			t.Fatalf("lock ls json: got %+v, want %+v", locks, a)
		}
		var raw []json.RawMessage
		decode(t, r, &raw)
		wantKeys(t, string(raw[0]), "key", "owner", "token", "acquired_at", "expires_at")

		r = invoke(t, "", "--store", url, "lock", "ls", "nothing*")
		want(t, r, 0)
		wantLines(t, r, `KEY +OWNER +TOKEN +ACQUIRED +EXPIRES`)
		r = invoke(t, "", "--store", url, "-o", "json", "lock", "ls", "nothing*")
		want(t, r, 0)
		if strings.TrimSpace(r.stdout) != "[]" {
			t.Fatalf("empty list: want [], got %s", r)
		}

		r = invoke(t, "", "--store", url, "lock", "show", "jobs/a")
		want(t, r, 0)
		wantLines(t, r,
			`key: +jobs/a`,
			`owner: +host-1:42:x`,
			`token: +`+strconv.FormatInt(a.Token, 10),
			`acquired_at: +`+rfc3339ms,
			`expires_at: +`+rfc3339ms)
		r = invoke(t, "", "--store", url, "-o", "json", "lock", "show", "jobs/a")
		want(t, r, 0)
		wantKeys(t, r.stdout, "key", "owner", "token", "acquired_at", "expires_at")

		r = invoke(t, "", "--store", url, "lock", "show", "nope")
		want(t, r, exitNotFound)
		if !strings.Contains(r.stderr, `lock "nope" is not held`) {
			t.Fatalf("show missing: %s", r)
		}

		// release needs --force
		r = invoke(t, "", "--store", url, "lock", "release", "jobs/a")
		want(t, r, exitUsage)
		if !strings.Contains(r.stderr, "--force") {
			t.Fatalf("release without --force: %s", r)
		}
		r = invoke(t, "", "--store", url, "lock", "release", "jobs/a", "--force")
		want(t, r, 0)
		wantLines(t, r, `released lock jobs/a`)
		if _, found, _ := st.Locks().Get(ctx, "jobs/a"); found {
			t.Fatal("lock still held after release --force")
		}
		r = invoke(t, "", "--store", url, "lock", "release", "--force", "jobs/a")
		want(t, r, exitNotFound)

		r = invoke(t, "", "--store", url, "-o", "json", "lock", "release", "other b", "--force")
		want(t, r, 0)
		var rel struct {
			Key      string `json:"key"`
			Released bool   `json:"released"`
		}
		decode(t, r, &rel)
		if rel.Key != "other b" || !rel.Released {
			t.Fatalf("release json: %+v", rel)
		}
	})
}

func TestLockWatch(t *testing.T) {
	for _, format := range []string{"table", "json"} {
		t.Run(format, func(t *testing.T) {
			eachStore(t, func(t *testing.T, url string) {
				ctx := context.Background()
				st := openTestStore(t, url)
				var out, errb testkit.LogBuffer
				done := make(chan int, 1)
				go func() {
					done <- run(ctx, []string{"--store", url, "-o", format, "lock", "watch", "w/*", "--count", "2"}, strings.NewReader(""), &out, &errb, testEnv())
				}()
				// The watch sees changes made after it subscribed: keep
				// making some until it has printed two.
				var code int
				testkit.Eventually(t, 20*time.Second, "two watch events", func() bool {
					select {
					case code = <-done:
						return true
					default:
					}
					rec, ok, err := st.Locks().Acquire(ctx, "w/1", "watcher-test", time.Minute)
					if err != nil || !ok {
						t.Fatalf("acquire: %v %v", ok, err)
					}
					if _, err := st.Locks().Release(ctx, "w/1", "watcher-test", rec.Token); err != nil {
						t.Fatal(err)
					}
					// An unwatched key must not show up.
					if _, _, err := st.Locks().Acquire(ctx, "other", "watcher-test", time.Millisecond); err != nil {
						t.Fatal(err)
					}
					time.Sleep(10 * time.Millisecond) // pace the changes
					return false
				})
				r := result{code: code, stdout: out.String(), stderr: errb.String()}
				want(t, r, 0)
				if format == "table" {
					wantLines(t, r,
						rfc3339ms+`  (acquired|released) +w/1  watcher-test  \d+`,
						rfc3339ms+`  (acquired|released) +w/1  watcher-test  \d+`)
					return
				}
				lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
				if len(lines) != 2 {
					t.Fatalf("want 2 JSON lines, got %s", r)
				}
				for _, l := range lines {
					wantKeys(t, l, "event", "key", "owner", "token", "at")
					var ev lockEventJSON
					if err := json.Unmarshal([]byte(l), &ev); err != nil {
						t.Fatal(err)
					}
					if ev.Key != "w/1" || ev.Owner != "watcher-test" || ev.Token == 0 || (ev.Event != "acquired" && ev.Event != "released") {
						t.Fatalf("event %+v", ev)
					}
				}
			})
		})
	}
}

func TestLockWatchInterrupted(t *testing.T) {
	url := testStores(t)[0].url
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan result, 1)
	go func() { done <- invokeCtx(t, ctx, "", "--store", url, "lock", "watch") }()
	cancel()
	want(t, <-done, exitInterrupted) // never, if the interruption were not heard
	r := invoke(t, "", "--store", url, "lock", "watch", "--count", "-1")
	want(t, r, exitUsage)
	r = invoke(t, "", "--store", url, "lock", "watch", `bad\`)
	want(t, r, exitUsage)
}

func TestLockRunInProcess(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		ctx := context.Background()
		st := openTestStore(t, url)
		for _, format := range []string{"table", "json"} {
			// warden adds nothing to the command's output in either format.
			r := invoke(t, "", "--store", url, "-o", format, "lock", "run", "nightly", "--", "sh", "-c", `printf '%s %s' "$WARDEN_LOCK_KEY" "$WARDEN_FENCING_TOKEN"`)
			want(t, r, 0)
			key, tok, _ := strings.Cut(r.stdout, " ")
			if n, err := strconv.ParseInt(tok, 10, 64); key != "nightly" || err != nil || n <= 0 {
				t.Fatalf("child env: %s", r)
			}
		}
		if _, found, _ := st.Locks().Get(ctx, "nightly"); found {
			t.Fatal("lock still held after lock run")
		}

		// Tokens increase from one run to the next.
		var last int64
		for i := 0; i < 3; i++ {
			r := invoke(t, "", "--store", url, "lock", "run", "tok", "--ttl", "5s", "--", "sh", "-c", `printf %s "$WARDEN_FENCING_TOKEN"`)
			want(t, r, 0)
			n, _ := strconv.ParseInt(r.stdout, 10, 64)
			if n <= last {
				t.Fatalf("fencing token %d after %d", n, last)
			}
			last = n
		}

		// The child's stdin and exit code pass through; without "--" the
		// command starts at the first word after KEY.
		r := invoke(t, "input\n", "--store", url, "lock", "run", "k", "sh", "-c", `read x; echo "got $x"; exit 7`)
		want(t, r, 7)
		wantLines(t, r, `got input`)

		r = invoke(t, "", "--store", url, "lock", "run", "k", "--", "warden-no-such-command-xyz")
		if r.code != exitNoCommand {
			t.Fatalf("missing command: %s", r)
		}
		oneErrorLine(t, r)
		if _, found, _ := st.Locks().Get(ctx, "k"); found {
			t.Fatal("lock held after a command that could not start")
		}

		// Held elsewhere: --no-wait and --wait give up with exit 3.
		held, ok, err := st.Locks().Acquire(ctx, "busy", "someone-else:1:z", time.Minute)
		if err != nil || !ok {
			t.Fatal(err)
		}
		r = invoke(t, "", "--store", url, "lock", "run", "busy", "--no-wait", "--", "true")
		want(t, r, exitHeld)
		oneErrorLine(t, r)
		if !strings.Contains(r.stderr, `lock "busy" is held by someone-else:1:z until `) || !strings.Contains(r.stderr, strconv.FormatInt(held.Token, 10)) {
			t.Fatalf("--no-wait message: %s", r)
		}
		start := time.Now()
		r = invoke(t, "", "--store", url, "lock", "run", "busy", "--wait", "200ms", "--", "true")
		if r.code != exitHeld || !strings.Contains(r.stderr, `not acquired within 200ms: held by someone-else:1:z`) {
			t.Fatalf("--wait: %s", r)
		}
		if time.Since(start) < 200*time.Millisecond {
			t.Fatal("--wait 200ms gave up early")
		}

		// Waiting, then interrupted: 130.
		ctx2, cancel := context.WithCancel(ctx)
		defer cancel()
		var out, errb testkit.LogBuffer
		done := make(chan int, 1)
		go func() {
			done <- run(ctx2, []string{"--store", url, "lock", "run", "busy", "--", "true"}, strings.NewReader(""), &out, &errb, testEnv())
		}()
		testkit.Eventually(t, 10*time.Second, "the waiting message", func() bool {
			return strings.Contains(errb.String(), `waiting for lock "busy", held by someone-else:1:z`)
		})
		cancel()
		if code := <-done; code != exitInterrupted {
			t.Fatalf("interrupted wait: exit %d, stderr %s", code, errb.String())
		}
	})
}

// TestLockRunLeaseLostInProcess runs the lease-lost path under the race
// detector: the lock is force-released while the command runs.
func TestLockRunLeaseLostInProcess(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		ctx := context.Background()
		st := openTestStore(t, url)
		var out, errb testkit.LogBuffer
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, []string{"--store", url, "lock", "run", "lost", "--ttl", "300ms", "--grace", "5s", "--", "sh", "-c", "echo started; exec sleep 30"},
				strings.NewReader(""), &out, &errb, testEnv())
		}()
		testkit.Eventually(t, 10*time.Second, "the command to start", func() bool { return strings.Contains(out.String(), "started") })
		if ok, err := st.Locks().ForceRelease(ctx, "lost"); err != nil || !ok {
			t.Fatalf("force release: %v %v", ok, err)
		}
		// The command sleeps 30 s unless lock run stops it.
		r := result{code: <-done, stdout: out.String(), stderr: errb.String()}
		want(t, r, exitLeaseLost)
		if !strings.Contains(r.stderr, `warden: lock "lost" lost`) {
			t.Fatalf("message: %s", r)
		}
	})
}

func TestLockRunUsage(t *testing.T) {
	url := testStores(t)[0].url
	for _, args := range [][]string{
		{"lock", "run"},
		{"lock", "run", "k"},
		{"lock", "run", "k", "--"},
		{"lock", "run", "k", "--wait", "1s", "--no-wait", "--", "true"},
		{"lock", "run", "k", "--ttl", "0s", "--", "true"},
		{"lock", "run", "k", "--wait", "-1s", "--", "true"},
		{"lock", "run", "k", "--grace", "-1s", "--", "true"},
		{"lock", "run", "k", "--bogus", "--", "true"},
		{"lock", "run", "", "--", "true"},
		{"lock", "run", strings.Repeat("x", 513), "--", "true"},
	} {
		r := invoke(t, "", append([]string{"--store", url}, args...)...)
		if r.code != exitUsage {
			t.Errorf("%q: want exit 2, got %s", args, r)
			continue
		}
		oneErrorLine(t, r)
	}
}
