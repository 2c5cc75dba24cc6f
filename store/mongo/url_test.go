package mongo

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
)

func TestParseURL(t *testing.T) {
	u, _ := url.Parse("mongodb://bob:s3cret@db.example:27018/app?prefix=billing:&max_value_bytes=1000&auto_migrate=false&auto_index=false&events=false&events_size=4096&events_collection=ev&locks_collection=lk&timeout=3s&w=majority&replicaSet=rs0")
	c, err := parseURL(u, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := c.opts
	if c.database != "app" || c.timeout != 3*time.Second || o.Prefix != "billing:" || o.MaxValueBytes != 1000 ||
		!o.DisableAutoMigrate || !o.DisableAutoIndex || !o.DisableEvents || o.EventsSize != 4096 ||
		o.Collections.Events != "ev" || o.Collections.Locks != "lk" {
		t.Errorf("config %+v", c)
	}
	// The store's parameters are not handed to the MongoDB driver; its own are.
	for _, p := range []string{"prefix", "max_value_bytes", "auto_migrate", "events", "timeout", "locks_collection"} {
		if strings.Contains(c.uri, p+"=") {
			t.Errorf("connection string %q carries the store's parameter %s", c.uri, p)
		}
	}
	if !strings.Contains(c.uri, "w=majority") || !strings.Contains(c.uri, "replicaSet=rs0") {
		t.Errorf("connection string %q lost the driver's parameters", c.uri)
	}

	u, _ = url.Parse("mongodb+srv://cluster.example.net/?database=app2")
	c, err = parseURL(u, nil)
	if err != nil || c.database != "app2" || c.opts.DisableAutoMigrate || c.opts.Prefix != "" || c.timeout != 10*time.Second {
		t.Errorf("defaults: %+v %v", c, err)
	}
}

func TestParseURLErrors(t *testing.T) {
	for _, s := range []string{
		"mongodb://bob:s3cret@h/db?bogus=1",
		"mongodb://bob:s3cret@h/db?max_value_bytes=x",
		"mongodb://bob:s3cret@h/",
		"mongodb://bob:s3cret@h/a?database=b",
		"mongodb://bob:s3cret@h/a.b",
		"mongodb://bob:s3cret@h/db?auto_migrate=maybe",
		"mongodb://bob:s3cret@h/db?timeout=soon",
		"mongodb://bob:s3cret@h/db?w=majority&notAnOption=1",
		"mongodb:opaque",
		"mysql://bob:s3cret@h/db",
	} {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		_, err = parseURL(u, nil)
		if !errors.Is(err, driver.ErrBadURL) {
			t.Errorf("%s: err %v, want ErrBadURL", s, err)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: error reveals the password: %v", s, err)
		}
	}
}

func TestOpenRedactsAndRefuses(t *testing.T) {
	ctx := t.Context()
	if _, err := OpenDriver(ctx, "mongodb://u:pw@127.0.0.1:1/db?prefix=nocolon", nil); !errors.Is(err, driver.ErrBadPrefix) {
		t.Errorf("bad prefix: %v", err)
	}
	if _, err := OpenDriver(ctx, "mongodb://h/db", &Options{Collections: Collections{Locks: "x; DROP"}}); err == nil {
		t.Error("bad collection name accepted")
	}
	if _, err := OpenDriver(ctx, "mongodb://h/db", &Options{Collections: Collections{Locks: "a", Cache: "a"}}); err == nil {
		t.Error("a collection name used twice was accepted")
	}
	if _, err := OpenDriver(ctx, "mongodb://h/db", &Options{MaxValueBytes: 17 << 20}); err == nil {
		t.Error("a value limit above the document limit was accepted")
	}
	// A server that does not answer: the error names neither password
	// nor secret parameter.
	_, err := OpenDriver(ctx, "mongodb://bob:s3cret@127.0.0.1:1/db?timeout=200ms&authMechanismProperties=AWS_SESSION_TOKEN:t0psecret", nil)
	if err == nil {
		t.Fatal("opened a store on a closed port")
	}
	if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "t0psecret") {
		t.Errorf("error reveals a secret: %v", err)
	}
}

func TestSuccessor(t *testing.T) {
	for _, c := range []struct {
		in, want string
		ok       bool
	}{
		{"a", "b", true}, {"ab", "ac", true}, {"a\U0010FFFF", "b", true}, {"\U0010FFFF", "", false},
		{"", "", false}, {"\uD7FF", "\uE000", true}, {"x:lock:", "x:lock;", true},
	} {
		got, ok := successor(c.in)
		if got != c.want || ok != c.ok {
			t.Errorf("successor(%q) = %q, %v; want %q, %v", c.in, got, ok, c.want, c.ok)
		}
		if ok && !(c.in+"\U0010FFFF\U0010FFFF" < got) {
			t.Errorf("successor(%q) = %q is not above every extension", c.in, got)
		}
	}
}
