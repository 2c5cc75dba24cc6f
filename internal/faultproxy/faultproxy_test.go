package faultproxy_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warden-go/warden/internal/faultproxy"
)

// The tests assert bytes, order and errors, never speed. Where a fault must
// keep a reply away, the client gives itself a short read deadline of its
// own (silence) and the test checks that no byte came before it.

const silence = 200 * time.Millisecond

// server is an upstream test server. In echo mode it writes back what it
// reads; otherwise it answers every read with reply.
type server struct {
	ln       net.Listener
	reply    []byte
	received atomic.Int64 // bytes read from clients
	accepted atomic.Int64
	closed   chan struct{} // one value per connection that ended
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]bool
}

func newServer(t *testing.T, reply []byte) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{ln: ln, reply: reply, closed: make(chan struct{}, 1000), conns: map[net.Conn]bool{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			s.mu.Lock()
			s.conns[c] = true
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer func() {
					c.Close()
					s.mu.Lock()
					delete(s.conns, c)
					s.mu.Unlock()
					s.closed <- struct{}{}
				}()
				buf := make([]byte, 16<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						s.received.Add(int64(n))
						out := buf[:n]
						if s.reply != nil {
							out = s.reply
						}
						if _, err := c.Write(out); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *server) addr() string { return s.ln.Addr().String() }

// newProxy starts a proxy in front of s, closed when t ends.
func newProxy(t *testing.T, s *server) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(s.addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, p *faultproxy.Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads len(msg) bytes back.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write %q: %v", msg, err)
	}
	got := make([]byte, len(msg))
	c.SetReadDeadline(time.Time{}) // no deadline: the read waits for what it asserts
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("reading the echo of %q: %v", msg, err)
	}
	if string(got) != msg {
		t.Fatalf("echo of %q: got %q", msg, got)
	}
}

// wantSilence writes msg (if any) and checks that nothing comes back before
// the client's own read deadline.
func wantSilence(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if msg != "" {
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatalf("write %q: %v", msg, err)
		}
	}
	c.SetReadDeadline(time.Now().Add(silence))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after %q: got %q, %v; want nothing before the client's deadline", msg, buf[:n], err)
	}
}

// wantBroken checks that reading c fails without data (EOF or reset).
func wantBroken(t *testing.T, c net.Conn, what string) error {
	t.Helper()
	c.SetReadDeadline(time.Time{}) // no deadline: the read waits for what it asserts
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if n > 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: read got %q, %v; want the connection closed or reset", what, buf[:n], err)
	}
	return err
}

// awaitStats waits until the proxy's counters satisfy ok. Like every wait
// of these tests it sets no time limit: tests assert what happens, not how
// fast, and what never happens is reported by go test's -timeout.
func awaitStats(t *testing.T, p *faultproxy.Proxy, ok func(faultproxy.Stats) bool) {
	t.Helper()
	for !ok(p.Stats()) {
		time.Sleep(time.Millisecond)
	}
}

// awaitAccepted waits until the proxy has accepted n connections.
func awaitAccepted(t *testing.T, p *faultproxy.Proxy, n int) {
	t.Helper()
	awaitStats(t, p, func(st faultproxy.Stats) bool { return st.Accepted >= n })
}

func TestListensOnLoopback(t *testing.T) {
	p := newProxy(t, newServer(t, nil))
	host, _, err := net.SplitHostPort(p.Addr())
	if err != nil || !net.ParseIP(host).IsLoopback() {
		t.Fatalf("Addr() = %q, want a loopback address", p.Addr())
	}
	if _, err := faultproxy.New("no-port"); err == nil {
		t.Fatal("New accepted an upstream without a port")
	}
}

func TestPassForwardsEveryByte(t *testing.T) {
	s := newServer(t, nil)
	p := newProxy(t, s)
	const conns, size = 4, 1 << 20
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for range conns {
		c := dial(t, p)
		wg.Go(func() {
			data := make([]byte, size)
			rand.Read(data)
			go c.Write(data) //nolint:errcheck // a failure shows in the read
			got := make([]byte, size)
			c.SetReadDeadline(time.Time{}) // no deadline: the read waits for what it asserts
			if _, err := io.ReadFull(c, got); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(got, data) {
				errs <- errors.New("echoed bytes differ from those sent")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := p.Stats()
	if st.Accepted != conns || st.BytesUp != conns*size || st.BytesDown != conns*size {
		t.Errorf("stats %+v, want %d connections and %d bytes each way", st, conns, conns*size)
	}
}

func TestDelayKeepsOrder(t *testing.T) {
	s := newServer(t, nil)
	p := newProxy(t, s)
	c := dial(t, p)
	roundTrip(t, c, "warm")

	// Each chunk is forwarded no earlier than its delay after it was
	// sent (a lower bound: the proxy must not forward early).
	const d = 50 * time.Millisecond
	p.Delay(d, d)
	start := time.Now()
	roundTrip(t, c, "delayed")
	if el := time.Since(start); el < 2*d {
		t.Errorf("a round trip with %v each way took %v", d, el)
	}

	// Chunks sent while the delay shrinks never overtake earlier ones.
	var sent bytes.Buffer
	done := make(chan error, 1)
	var got bytes.Buffer
	go func() {
		c.SetReadDeadline(time.Time{}) // no deadline: the read waits for what it asserts
		_, err := io.CopyN(&got, c, int64(len("msg-000;")*300))
		done <- err
	}()
	for i := range 300 {
		switch i {
		case 0:
			p.Delay(100*time.Millisecond, 0)
		case 100:
			p.Delay(0, 100*time.Millisecond)
		case 200:
			p.Pass()
		}
		msg := fmt.Sprintf("msg-%03d;", i)
		sent.WriteString(msg)
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("reading the echoes: %v", err)
	}
	if got.String() != sent.String() {
		t.Fatalf("echoes out of order or damaged:\n got %.120q…\nwant %.120q…", got.String(), sent.String())
	}
}

func TestDelayHoldsRequestsAndReplies(t *testing.T) {
	s := newServer(t, nil)
	p := newProxy(t, s)
	up := dial(t, p)
	down := dial(t, p)
	roundTrip(t, up, "warm")
	roundTrip(t, down, "warm")
	before := s.received.Load()

	// Requests held: the server gets nothing, the client no answer.
	p.Delay(time.Hour, 0)
	wantSilence(t, up, "held-request")
	if n := s.received.Load(); n != before {
		t.Errorf("the server received %d bytes of a request delayed by an hour", n-before)
	}
	// Replies held: the server gets the request (sent, unanswered).
	p.Delay(0, time.Hour)
	before = s.received.Load()
	wantSilence(t, down, "held-reply")
	for s.received.Load() != before+int64(len("held-reply")) {
		time.Sleep(time.Millisecond)
	}
	// Close ends the proxy with chunks still queued for an hour.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	wantBroken(t, up, "after Close")
}

func TestBlackhole(t *testing.T) {
	s := newServer(t, nil)
	p := newProxy(t, s)
	live := dial(t, p)
	roundTrip(t, live, "before")
	received, accepted := s.received.Load(), s.accepted.Load()

	p.Blackhole()
	wantSilence(t, live, "into-the-hole")
	fresh := dial(t, p) // accepted, never dialed through
	awaitAccepted(t, p, 2)
	wantSilence(t, fresh, "hello?")
	if n := s.received.Load() - received; n != 0 {
		t.Errorf("the server received %d bytes during the blackhole", n)
	}
	if n := s.accepted.Load() - accepted; n != 0 {
		t.Errorf("the server accepted %d connections during the blackhole", n)
	}

	p.Pass()
	healed := dial(t, p)
	roundTrip(t, healed, "after")
	// The connections that lost bytes stay silent.
	wantSilence(t, live, "still-there?")
	wantSilence(t, fresh, "")
	st := p.Stats()
	if st.Blackholed != 2 || st.Dropped < int64(len("into-the-hole")+len("hello?")+len("still-there?")) {
		t.Errorf("stats %+v, want 2 connections blackholed and their bytes dropped", st)
	}
	// A client leaving a silent connection frees its server side.
	live.Close()
	<-s.closed // never, if the server's side stayed open
}

func TestBlackholeDropsQueuedBytes(t *testing.T) {
	s := newServer(t, nil)
	p := newProxy(t, s)
	c := dial(t, p)
	roundTrip(t, c, "warm")
	before := s.received.Load()
	p.Delay(time.Hour, 0)
	if _, err := c.Write([]byte("queued")); err != nil {
		t.Fatal(err)
	}
	// Whether the proxy has read the chunk yet (queued for an hour) or
	// reads it after this (dropped), it must never reach the server.
	p.Blackhole()
	p.Pass()
	wantSilence(t, c, "")
	if n := s.received.Load() - before; n != 0 {
		t.Errorf("the server received %d bytes queued before a blackhole", n)
	}
}

func TestCut(t *testing.T) {
	s := newServer(t, nil)
	p := newProxy(t, s)
	live := dial(t, p)
	roundTrip(t, live, "before")

	p.Cut()
	wantBroken(t, live, "a connection alive at the cut")
	// The listener keeps its port: a connection made during the cut is
	// accepted and reset — so fast, on loopback, that the reset may end
	// the dial itself.
	if refused, err := net.Dial("tcp", p.Addr()); err == nil {
		wantBroken(t, refused, "a connection made during the cut")
		refused.Close()
	} else if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("dial during the cut: %v, want a connection that is reset", err)
	}
	awaitStats(t, p, func(st faultproxy.Stats) bool { return st.Refused == 1 })
	if st := p.Stats(); st.Cuts != 1 || st.Refused != 1 {
		t.Errorf("stats %+v, want 1 connection cut and 1 refused", st)
	}

	p.Pass()
	roundTrip(t, dial(t, p), "after")
}

func TestReset(t *testing.T) {
	s := newServer(t, nil)
	p := newProxy(t, s)
	a, b := dial(t, p), dial(t, p)
	roundTrip(t, a, "a")
	roundTrip(t, b, "b")
	if n := p.Reset(); n != 2 {
		t.Fatalf("Reset() = %d, want 2 live connections reset", n)
	}
	for _, c := range []net.Conn{a, b} {
		if err := wantBroken(t, c, "a reset connection"); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("read of a reset connection: %v, want ECONNRESET", err)
		}
	}
	// Both server sides are closed.
	for range 2 {
		<-s.closed // never, if a server side stayed open
	}
	// The mode did not change.
	roundTrip(t, dial(t, p), "after")
}

func TestResetReplies(t *testing.T) {
	reply := bytes.Repeat([]byte("0123456789abcdef"), 1024) // 16 KiB
	s := newServer(t, reply)
	p := newProxy(t, s)
	c := dial(t, p)
	p.ResetReplies()
	if _, err := c.Write([]byte("?")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Time{}) // no deadline: the read waits for what it asserts
	got, err := io.ReadAll(c)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("reading the reply: %v, want ECONNRESET", err)
	}
	if len(got) >= len(reply) || !bytes.Equal(got, reply[:len(got)]) {
		t.Errorf("got %d bytes of a %d-byte reply (prefix intact: %v), want a strict prefix", len(got), len(reply), bytes.Equal(got, reply[:min(len(got), len(reply))]))
	}
	if n := s.received.Load(); n != 1 {
		t.Errorf("the server received %d bytes, want the 1-byte request (it did the work)", n)
	}
	p.Pass()
	// A new connection gets a whole reply.
	c2 := dial(t, p)
	if _, err := c2.Write([]byte("?")); err != nil {
		t.Fatal(err)
	}
	got = make([]byte, len(reply))
	c2.SetReadDeadline(time.Time{}) // no deadline: the read waits for what it asserts
	if _, err := io.ReadFull(c2, got); err != nil || !bytes.Equal(got, reply) {
		t.Fatalf("reply after Pass: %v (equal: %v)", err, bytes.Equal(got, reply))
	}
}

func TestUnreachableUpstream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p, err := faultproxy.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		// The reset may come before connect returns.
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("dial: %v, want success or ECONNRESET", err)
		}
		return
	}
	defer c.Close()
	wantBroken(t, c, "a connection to a server that is down")
}

// TestCloseStopsEveryGoroutine leaves connections in every state — live,
// with chunks queued for an hour, blackholed, mid-dial is not reachable
// from a test — and checks that after Close no goroutine of the package
// is left and the clients see their connections end.
func TestCloseStopsEveryGoroutine(t *testing.T) {
	s := newServer(t, nil)
	p, err := faultproxy.New(s.addr())
	if err != nil {
		t.Fatal(err)
	}
	live := dial(t, p)
	roundTrip(t, live, "live")
	queued := dial(t, p)
	roundTrip(t, queued, "queued")
	p.Delay(time.Hour, time.Hour)
	queued.Write([]byte("for later"))
	p.Blackhole()
	hole := dial(t, p)
	awaitAccepted(t, p, 3)
	hole.Write([]byte("lost"))
	p.Pass()

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// Close has waited for every goroutine to finish its work; one may
	// still be returning from its last deferred call.
	for left := proxyGoroutines(); left != ""; left = proxyGoroutines() {
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
	for _, c := range []net.Conn{live, queued, hole} {
		wantBroken(t, c, "a connection after Close")
	}
	if _, err := net.Dial("tcp", p.Addr()); err == nil {
		t.Error("the proxy still accepts connections after Close")
	}
	// Calls after Close do nothing harmful.
	p.Pass()
	p.Cut()
	if n := p.Reset(); n != 0 {
		t.Errorf("Reset after Close reset %d connections", n)
	}
}

// proxyGoroutines returns the stacks of goroutines running code of package
// faultproxy (not its tests).
func proxyGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "internal/faultproxy.(") || strings.Contains(g, "internal/faultproxy.New") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}
