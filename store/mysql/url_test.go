package mysql

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
)

func TestParseURL(t *testing.T) {
	u, _ := url.Parse("mysql://bob:s3cret@db.example:3307/app?prefix=billing:&max_value_bytes=1000&auto_migrate=false&timeout=3s")
	cfg, o, err := parseURL(u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.User != "bob" || cfg.Passwd != "s3cret" || cfg.Addr != "db.example:3307" || cfg.DBName != "app" || cfg.Net != "tcp" || cfg.Timeout != 3*time.Second {
		t.Errorf("config %+v", cfg)
	}
	if o.Prefix != "billing:" || o.MaxValueBytes != 1000 || !o.DisableAutoMigrate {
		t.Errorf("options %+v", o)
	}
	u, _ = url.Parse("mysql://h/db")
	cfg, o, err = parseURL(u, nil)
	if err != nil || cfg.Addr != "h:3306" || o.DisableAutoMigrate || o.Prefix != "" {
		t.Errorf("defaults: %+v %+v %v", cfg, o, err)
	}
}

func TestParseURLErrors(t *testing.T) {
	for _, s := range []string{
		"mysql://bob:s3cret@h/db?bogus=1",
		"mysql://bob:s3cret@h/db?max_value_bytes=x",
		"mysql://bob:s3cret@h/",
		"mysql://bob:s3cret@h/a/b",
		"mysql://bob:s3cret@h/db?tls=weird",
		"mysql:opaque",
	} {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = parseURL(u, nil)
		if !errors.Is(err, driver.ErrBadURL) {
			t.Errorf("%s: err %v, want ErrBadURL", s, err)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: error reveals the password: %v", s, err)
		}
	}
}

func TestOpenRefusesBadPrefixAndDSN(t *testing.T) {
	ctx := t.Context()
	if _, err := OpenDriver(ctx, "mysql://u:pw@127.0.0.1:1/db?prefix=nocolon", nil); !errors.Is(err, driver.ErrBadPrefix) {
		t.Errorf("bad prefix: %v", err)
	}
	_, err := OpenDriver(ctx, "u:s3cret@bogus(", nil)
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("bad DSN: %v", err)
	}
	if _, err := OpenDriver(ctx, "mysql://h/db", &Options{Tables: Tables{Locks: "x; DROP"}}); err == nil {
		t.Error("bad table name accepted")
	}
}
