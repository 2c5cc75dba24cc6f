package warden_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/memory"
)

func TestValidateKey(t *testing.T) {
	good := []string{"k", strings.Repeat("x", 512), "日本", "%_*?[\\.$'\":# ", "a\nb"}
	for _, k := range good {
		if err := warden.ValidateKey(k); err != nil {
			t.Errorf("ValidateKey(%q) = %v", k, err)
		}
	}
	bad := []string{"", strings.Repeat("x", 513), string([]byte{0xff, 'a'}), "a\x00b", strings.Repeat("é", 257)}
	for _, k := range bad {
		if err := warden.ValidateKey(k); !errors.Is(err, warden.ErrInvalidKey) {
			t.Errorf("ValidateKey(%q) = %v, want ErrInvalidKey", k, err)
		}
	}
}

func TestOpenUnknownScheme(t *testing.T) {
	_, err := warden.Open(context.Background(), "nosuch://x")
	if !errors.Is(err, warden.ErrUnknownScheme) {
		t.Fatalf("err = %v, want ErrUnknownScheme", err)
	}
	if !strings.Contains(err.Error(), "memory") {
		t.Errorf("error %q does not list the registered schemes", err)
	}
}

func TestOpenErrorsHidePasswords(t *testing.T) {
	for _, u := range []string{
		"memory://user:s3cret@db?bogus=1",
		"memory://user:s3cret@[::1",
		"nosuch://user:s3cret@host/db",
		// A password inside a URL-valued or address parameter.
		"memory://?endpoint=http://u:s3cret@host&bogus=1",
		"memory://?addr=u:s3cret@host:1&bogus=1",
		"nosuch://host?endpoint=http%3A%2F%2Fu%3As3cret%40host",
	} {
		_, err := warden.Open(context.Background(), u)
		if err == nil {
			t.Fatalf("Open(%q) succeeded", u)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Open error shows the password: %v", err)
		}
	}
}

func TestOpenUnknownParameter(t *testing.T) {
	_, err := warden.Open(context.Background(), "memory://?prefix=a%3A&bogus=1")
	if !errors.Is(err, driver.ErrBadURL) || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("err = %v, want ErrBadURL naming the parameter", err)
	}
}

func TestCheckedErrors(t *testing.T) {
	ctx := context.Background()
	st := memory.New(nil)
	defer st.Close()

	_, _, err := st.Locks().Acquire(ctx, "", "me", time.Second)
	var we *warden.Error
	if !errors.Is(err, warden.ErrInvalidKey) || !errors.As(err, &we) || we.Op != "lock.acquire" || we.Store != "memory" {
		t.Fatalf("empty key: %v (%#v)", err, we)
	}
	if got := err.Error(); got != `warden: memory lock.acquire: invalid key: empty` {
		t.Errorf("message %q", got)
	}
	if _, _, err := st.Locks().Acquire(ctx, "k", "me", 500*time.Microsecond); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("sub-millisecond TTL: %v", err)
	}
	if _, _, err := st.Locks().Acquire(ctx, "k", "", time.Second); !errors.Is(err, warden.ErrInvalidKey) {
		t.Errorf("empty owner: %v", err)
	}
	if _, err := st.Locks().Release(ctx, "k", "me", 0); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("zero token: %v", err)
	}
	if _, err := st.Circuits().RecordFailure(ctx, "c", 0); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("zero threshold: %v", err)
	}
	if _, err := st.Circuits().Set(ctx, "c", "ajar"); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("bad state: %v", err)
	}
	if _, err := st.Cache().Keys(ctx, "a\\"); !errors.Is(err, warden.ErrInvalidPattern) {
		t.Errorf("bad pattern: %v", err)
	}
	if err := st.Cache().Set(ctx, "k", nil, -time.Second); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("negative ttl: %v", err)
	}
	if _, err := st.Checkpoints().Cleanup(ctx, "t", -1); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("negative keep: %v", err)
	}
	if _, _, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "t", Progress: 101}); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("progress 101: %v", err)
	}
}

func TestValueTooLargeWritesNothing(t *testing.T) {
	ctx := context.Background()
	st := memory.New(&memory.Options{MaxValueBytes: 8})
	defer st.Close()
	if err := st.Cache().Set(ctx, "k", []byte("12345678"), 0); err != nil {
		t.Fatal(err)
	}
	err := st.Cache().Set(ctx, "k", []byte("123456789"), 0)
	if !errors.Is(err, warden.ErrValueTooLarge) {
		t.Fatalf("err = %v, want ErrValueTooLarge", err)
	}
	e, _, err := st.Cache().Get(ctx, "k")
	if err != nil || !bytes.Equal(e.Value, []byte("12345678")) {
		t.Fatalf("value after refused write = %q, %v", e.Value, err)
	}
}

func TestContextErrorsPassThrough(t *testing.T) {
	st := memory.New(nil)
	defer st.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := st.Locks().Acquire(ctx, "k", "me", time.Second); err != context.Canceled {
		t.Fatalf("err = %v, want context.Canceled itself", err)
	}
	if _, _, err := st.Cache().Get(nil, "k"); !errors.Is(err, warden.ErrInvalidArgument) { //nolint:staticcheck // nil context on purpose
		t.Fatalf("nil context: %v", err)
	}
}

func TestClosed(t *testing.T) {
	st := memory.New(nil)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if !st.Closed() {
		t.Fatal("Closed() = false")
	}
	if _, _, err := st.Cache().Get(context.Background(), "k"); !errors.Is(err, warden.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if err := st.Ping(context.Background()); !errors.Is(err, warden.ErrClosed) {
		t.Fatalf("Ping after Close: %v", err)
	}
}

func TestHookSeesEveryOperation(t *testing.T) {
	var mu sync.Mutex
	var ops []warden.OpInfo
	st := warden.New(memory.NewDriver(nil), &warden.Options{Hook: warden.HookFunc(func(_ context.Context, op warden.OpInfo) {
		mu.Lock()
		ops = append(ops, op)
		mu.Unlock()
	})})
	defer st.Close()
	ctx := context.Background()
	_ = st.Cache().Set(ctx, "k", []byte("v"), 0)
	_, _, _ = st.Cache().Get(ctx, "")
	mu.Lock()
	defer mu.Unlock()
	if len(ops) != 2 || ops[0].Op != "cache.set" || ops[0].Key != "k" || ops[0].Err != nil ||
		ops[1].Op != "cache.get" || !errors.Is(ops[1].Err, warden.ErrInvalidKey) || ops[0].Store != "memory" {
		t.Fatalf("hook saw %+v", ops)
	}
}

func TestMillisecondRounding(t *testing.T) {
	ctx := context.Background()
	st := memory.New(nil)
	defer st.Close()
	// 1.5 ms rounds up to 2 ms, never down to 1 ms or to whole seconds.
	rec, ok, err := st.Locks().Acquire(ctx, "k", "me", 1500*time.Microsecond)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if d := rec.ExpiresAt.Sub(rec.AcquiredAt); d != 2*time.Millisecond {
		t.Fatalf("expiry - acquired = %v, want 2ms", d)
	}
}

func TestOpenChecksPrefix(t *testing.T) {
	for _, p := range []string{"a", "a:b:", "lock:"} {
		_, err := warden.Open(context.Background(), "memory://?prefix="+url.QueryEscape(p))
		if !errors.Is(err, driver.ErrBadPrefix) {
			t.Errorf("prefix %q: err = %v, want ErrBadPrefix", p, err)
		}
	}
	st, err := warden.Open(context.Background(), "memory://?prefix=billing%3A")
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
}

func TestOpenErrorsHideQuerySecrets(t *testing.T) {
	_, err := warden.Open(context.Background(), "memory://db?password=s3cret&prefix=bad")
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("Open error shows a query-parameter secret: %v", err)
	}
}

// TestOpenPassesTheLogger: a store opened by URL gets the Options.Logger
// for its own warnings, and slog.Default() without one.
func TestOpenPassesTheLogger(t *testing.T) {
	var got *slog.Logger
	warden.Register("logger-probe", func(ctx context.Context, u *url.URL, logger *slog.Logger) (driver.Store, error) {
		got = logger
		return nil, errors.New("probe only")
	})
	mine := slog.New(slog.DiscardHandler)
	if _, err := warden.OpenWith(context.Background(), "logger-probe://x", &warden.Options{Logger: mine}); err == nil {
		t.Fatal("the probe opener's error was lost")
	}
	if got != mine {
		t.Fatal("the opener did not get Options.Logger")
	}
	if _, err := warden.Open(context.Background(), "logger-probe://x"); err == nil {
		t.Fatal("the probe opener's error was lost")
	}
	if got != slog.Default() {
		t.Fatal("without Options.Logger the opener must get slog.Default()")
	}
}
