package driver

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestValidatePrefix(t *testing.T) {
	for _, p := range []string{"", "a:", "billing:", "p%_*[.]$:", "日本:", strings.Repeat("x", 63) + ":"} {
		if err := ValidatePrefix(p); err != nil {
			t.Errorf("ValidatePrefix(%q) = %v", p, err)
		}
	}
	for _, p := range []string{"a", ":", "a:b:", "a::", "lock:", "cache:", "circuit:", "a\x00:", string([]byte{0xff, ':'}), strings.Repeat("x", 64) + ":"} {
		if err := ValidatePrefix(p); !errors.Is(err, ErrBadPrefix) {
			t.Errorf("ValidatePrefix(%q) = %v, want ErrBadPrefix", p, err)
		}
	}
}

func TestCheckpointID(t *testing.T) {
	for _, c := range []struct {
		task string
		seq  int64
	}{{"t", 1}, {"a:b:c", 12}, {"x:9", 10}} {
		id := CheckpointID(c.task, c.seq)
		task, seq, ok := ParseCheckpointID(id)
		if !ok || task != c.task || seq != c.seq {
			t.Errorf("ParseCheckpointID(%q) = %q, %d, %v", id, task, seq, ok)
		}
	}
	for _, id := range []string{"", "t", ":1", "t:0", "t:01", "t:-1", "t:x", "t:"} {
		if _, _, ok := ParseCheckpointID(id); ok {
			t.Errorf("ParseCheckpointID(%q) ok", id)
		}
	}
}

// TestRedactURLNested: the password of a URL or address given as a query
// parameter's value is masked too, whatever the parameter's name.
func TestRedactURLNested(t *testing.T) {
	for _, raw := range []string{
		"memory://?endpoint=http://u:s3cretpw@host&bogus=1",
		"dynamodb://t?endpoint=https%3A%2F%2Fu%3As3cretpw%40host%3A8000%2Fpath",
		"redis://h:1?addr=u:s3cretpw@h2:2&cluster=true",
		"redis://h:1?addr=h2:2,u:s3cretpw@h3:3,:s3cretpw@h4:4",
		"x://h?upstream=amqp://user:s3cretpw@broker:5672/vhost?heartbeat=10",
		"x://h?a=http://u:s3cretpw@h1,http://v:s3cretpw@h2",
		// Passwords holding commas, with or without ':' after them.
		"memory://db?endpoint=http%3A%2F%2Fuser%3A%2C%2Cs3cretpw%40127.0.0.1%3A1",
		"x://h?addr=u:s3cretpw,,@h1:1",
		"x://h?addr=u:s3cretpw,x:y@h1:1",
		"x://h?addr=u:s3,cretpw@h1:1,v:s3cretpw@h2:2",
		// Passwords holding "@,": user information ends at the last '@'.
		"x://h?addr=u:pw@,s3cretpw@h1:1",
		"x://h?addr=u:@,s3cretpw@h1:1,v:s3cretpw@h2:2",
		"memory://db?addr=user%3Apw%40%2Cs3cretpw%40127.0.0.1%3A1",
		// Address passwords that make the address read as a URL.
		"x://h?addr=user://s3cretpw@h1:1",
		"x://h?addr=user://%23s3cretpw@h1:1",
		"x://h?addr=user://s3cretpw%23@h1:1",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		got := RedactURL(u)
		dec, _ := url.QueryUnescape(got)
		if strings.Contains(got, "s3cretpw") || strings.Contains(dec, "s3cretpw") {
			t.Errorf("RedactURL(%q) = %q shows the password", raw, got)
		}
		if !strings.Contains(dec, ":xxxxx@") {
			t.Errorf("RedactURL(%q) = %q does not show where the password was", raw, got)
		}
	}
	// Values without user information are left as they are: a value
	// that is no address. (A URL with an '@' in its path is masked from
	// its scheme's ':' to that '@': it reads as well as an address whose
	// password starts with "//", as "user://#@host" does.)
	for _, raw := range []string{
		"x://h?mail=ops@example.com&addr=h2:2",
		"x://h?endpoint=http://host:8000/path&region=x",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := RedactURL(u); got != u.String() {
			t.Errorf("RedactURL(%q) = %q, want it unchanged", raw, got)
		}
	}
}

func TestRedactURL(t *testing.T) {
	u, err := url.Parse("postgres://user:s3cret@host/db?sslmode=disable&password=s3cret&AWS_SECRET_ACCESS_KEY=s3cret&sslpassword=s3cret&prefix=a:")
	if err != nil {
		t.Fatal(err)
	}
	got := RedactURL(u)
	if strings.Contains(got, "s3cret") {
		t.Fatalf("RedactURL = %q shows a secret", got)
	}
	for _, keep := range []string{"user", "host/db", "sslmode=disable", "prefix=a:"} {
		if !strings.Contains(got, keep) {
			t.Errorf("RedactURL = %q lost %q", got, keep)
		}
	}
}
