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

func TestRedactURL(t *testing.T) {
	u, err := url.Parse("postgres://user:s3cret@host/db?sslmode=disable&password=s3cret&AWS_SECRET_ACCESS_KEY=s3cret&sslpassword=s3cret&prefix=a:")
	if err != nil {
		t.Fatal(err)
	}
	got := RedactURL(u)
	if strings.Contains(got, "s3cret") {
		t.Fatalf("RedactURL = %q shows a secret", got)
	}
	for _, keep := range []string{"user", "host/db", "sslmode=disable", "prefix=a%3A"} {
		if !strings.Contains(got, keep) {
			t.Errorf("RedactURL = %q lost %q", got, keep)
		}
	}
}
