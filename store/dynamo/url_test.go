package dynamo

import (
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
)

func TestParseURL(t *testing.T) {
	u, _ := url.Parse("dynamodb://my-table.v2?region=eu-west-1&endpoint=http://127.0.0.1:8000&prefix=billing:" +
		"&max_value_bytes=1000&auto_create=false&events=false&event_poll=20ms&event_lookback=5s&lock_retention=1h" +
		"&handoff=false&handoff_poll=25ms")
	cfg, err := parseURL(u, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := cfg.opts
	if cfg.table != "my-table.v2" || cfg.region != "eu-west-1" || cfg.endpoint != "http://127.0.0.1:8000" {
		t.Errorf("config %+v", cfg)
	}
	if o.Prefix != "billing:" || o.MaxValueBytes != 1000 || !o.DisableAutoCreate || !o.DisableEvents ||
		o.EventPoll != 20*time.Millisecond || o.EventLookback != 5*time.Second || o.LockRetention != time.Hour ||
		!o.DisableHandoff || o.HandoffPoll != 25*time.Millisecond {
		t.Errorf("options %+v", o)
	}
	u, _ = url.Parse("dynamodb://tbl")
	cfg, err = parseURL(u, &Options{Prefix: "base:"})
	if err != nil || cfg.table != "tbl" || cfg.region != "" || cfg.endpoint != "" || cfg.opts.Prefix != "base:" ||
		cfg.opts.DisableAutoCreate || cfg.opts.DisableEvents || cfg.opts.DisableHandoff || cfg.opts.HandoffPoll != 0 {
		t.Errorf("defaults: %+v %v", cfg, err)
	}
}

func TestParseURLErrors(t *testing.T) {
	for _, s := range []string{
		"dynamodb://tbl?bogus=1",
		"dynamodb://tbl?max_value_bytes=x",
		"dynamodb://tbl?event_poll=soon",
		"dynamodb://tbl?auto_create=maybe",
		"dynamodb://tbl?handoff=maybe",
		"dynamodb://tbl?handoff_poll=soon",
		"dynamodb://tbl?endpoint=ftp://x",
		"dynamodb://tbl?endpoint=127.0.0.1:8000",
		"dynamodb://a",                          // table name too short
		"dynamodb://tbl/extra",                  // a path
		"dynamodb://key:s3cret@tbl",             // credentials do not go in the URL
		"dynamodb:opaque",                       // no table
		"postgres://tbl",                        // another scheme
		"dynamodb://" + string(make([]byte, 0)), // empty host
	} {
		u, err := url.Parse(s)
		if err != nil {
			continue
		}
		if _, err := parseURL(u, nil); !errors.Is(err, driver.ErrBadURL) {
			t.Errorf("%s: err %v, want ErrBadURL", s, err)
		}
	}
}

func TestOpenRefusesBadOptions(t *testing.T) {
	ctx := t.Context()
	if _, err := OpenDriver(ctx, "dynamodb://tbl?endpoint=http://127.0.0.1:1&prefix=nocolon", nil); !errors.Is(err, driver.ErrBadPrefix) {
		t.Errorf("bad prefix: %v", err)
	}
	if _, err := OpenDriver(ctx, "dynamodb://tbl?endpoint=http://127.0.0.1:1&max_value_bytes=500000", nil); err == nil {
		t.Error("MaxValueBytes above the item limit accepted")
	}
	if _, err := OpenDriver(ctx, "dynamodb://tbl?endpoint=http://127.0.0.1:1&handoff_poll=-1s", nil); err == nil {
		t.Error("a negative HandoffPoll accepted")
	}
	if _, err := OpenDriver(ctx, "::", nil); !errors.Is(err, driver.ErrBadURL) {
		t.Errorf("unparsable URL: %v", err)
	}
	if _, err := New(nil, "tbl", nil); err == nil {
		t.Error("nil client accepted")
	}
}

func TestLoopback(t *testing.T) {
	for ep, want := range map[string]bool{
		"http://127.0.0.1:8000":                    true,
		"http://localhost:8000":                    true,
		"http://[::1]:8000":                        true,
		"http://10.0.0.1:8000":                     false,
		"https://dynamodb.eu-west-1.amazonaws.com": false,
		"http://127.0.0.1.attacker.example:8000":   false,
	} {
		if got := loopback(ep); got != want {
			t.Errorf("loopback(%s) = %v, want %v", ep, got, want)
		}
	}
}

func TestGskOrder(t *testing.T) {
	a, b := gskOf(999, "ff"), gskOf(1000, "00")
	if !(a < b) || gskMs(a) != 999 || gskMs(b) != 1000 {
		t.Errorf("gsk %q, %q: not ordered by time", a, b)
	}
}

// TestGskWriteOrder: two event writes of one process in one millisecond
// sort in the order they were made, whatever their random request ids.
func TestGskWriteOrder(t *testing.T) {
	s := &store{events: true, lockEvt: "EVT#lock:"}
	for i := range 1000 {
		a, b := item{}, item{}
		s.evSet(s.lockEvt, 1000, reqID(), a)
		s.evSet(s.lockEvt, 1000, reqID(), b)
		ga, gb := gS(a, ":gsk"), gS(b, ":gsk")
		if !(ga < gb) {
			t.Fatalf("try %d: gsk %q written before %q sorts after it", i, ga, gb)
		}
		if gskMs(ga) != 1000 || gskMs(gb) != 1000 {
			t.Fatalf("gsk %q, %q: time lost", ga, gb)
		}
	}
}
