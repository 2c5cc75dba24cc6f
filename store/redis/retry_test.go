package redis_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/redis"
)

// lateProxy forwards connections to the Redis server at upstream. While
// late is set, the next reply it forwards to the client is held back until
// release is closed; it counts the script calls (EVAL/EVALSHA) clients
// send while counting is set.
type lateProxy struct {
	ln       net.Listener
	upstream string
	late     atomic.Bool
	release  chan struct{}
	counting atomic.Bool
	scripts  atomic.Int64
	wg       sync.WaitGroup
}

func newLateProxy(t *testing.T, upstream string) *lateProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lateProxy{ln: ln, upstream: upstream, release: make(chan struct{})}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		select {
		case <-p.release:
		default:
			close(p.release)
		}
		p.wg.Wait()
	})
	return p
}

func (p *lateProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.upstream)
		if err != nil {
			c.Close()
			continue
		}
		p.wg.Add(2)
		go func() { // client → server
			defer p.wg.Done()
			defer u.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if p.counting.Load() {
						low := bytes.ToLower(buf[:n])
						p.scripts.Add(int64(bytes.Count(low, []byte("$7\r\nevalsha\r\n")) + bytes.Count(low, []byte("$4\r\neval\r\n"))))
					}
					if _, err := u.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() { // server → client
			defer p.wg.Done()
			defer c.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := u.Read(buf)
				if n > 0 {
					if p.late.CompareAndSwap(true, false) {
						<-p.release
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// TestScriptsNeverResent: a lock script whose reply comes after the
// client's read timeout is reported as an error and is not sent again. A
// resent ForceRelease would end a holding taken in between, and a resent
// Release would report "not held" for the holding it released (go-redis
// resends commands after a timeout unless MaxRetries is -1).
func TestScriptsNeverResent(t *testing.T) {
	ctx := context.Background()
	base, err := url.Parse(serverURL(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	p := newLateProxy(t, base.Host)
	prefix := fmt.Sprintf("resent%d:", time.Now().UnixNano())
	st, err := warden.Open(ctx, "redis://"+p.ln.Addr().String()+"/0?read_timeout=200ms&prefix="+prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	locks := st.Driver().Locks()
	rec, ok, err := locks.Acquire(ctx, "k", "owner-a", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}

	// The release script is on the server (a late NOSCRIPT would mean it
	// never ran).
	if _, err := locks.Release(ctx, "k", "nobody", 1); err != nil {
		t.Fatal(err)
	}
	p.scripts.Store(0)
	p.counting.Store(true)
	p.late.Store(true)
	released, err := locks.Release(ctx, "k", "owner-a", rec.Token)
	p.counting.Store(false)
	close(p.release) // the held-back reply goes to a connection the client gave up
	if err == nil {
		t.Errorf("a release whose reply came late returned released=%v and no error; its outcome is unknown", released)
	}
	if n := p.scripts.Load(); n != 1 {
		t.Errorf("the release script was sent %d times, want once", n)
	}
	// The script ran once, on the server: the key is free.
	direct, err := warden.Open(ctx, serverURL(t, prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if _, ok, err := direct.Driver().Locks().Acquire(ctx, "k", "owner-b", time.Minute); err != nil || !ok {
		t.Errorf("after the late release the key is not free: %v %v", ok, err)
	}
}

// TestCallsEndAtTheirDeadline: a call to a server that stops answering ends
// at its context's deadline, not at the client's read timeout (an hour
// here): it returns context.DeadlineExceeded, and not before the
// deadline. (Without context timeouts it would
// wait for the hour: go test's -timeout reports that.)
func TestCallsEndAtTheirDeadline(t *testing.T) {
	ctx := context.Background()
	base, err := url.Parse(serverURL(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	p := newLateProxy(t, base.Host)
	prefix := fmt.Sprintf("deadline%d:", time.Now().UnixNano())
	st, err := warden.Open(ctx, "redis://"+p.ln.Addr().String()+"/0?read_timeout=1h&prefix="+prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p.late.Store(true)
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, _, err = st.Driver().Locks().Get(cctx, "k")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err %v, want context.DeadlineExceeded", err)
	}
	// The connection's read deadline is the context's: it may fire a
	// moment before the context's own timer marks it done, so the clock,
	// not cctx.Err(), says whether the call waited for its deadline.
	if dl, _ := cctx.Deadline(); time.Now().Before(dl) {
		t.Errorf("the call returned %v before its context's deadline: it did not wait for it", err)
	}
}

// TestClusterScriptsNeverResent: on a ClusterClient, whose redirect loop
// resends a command after a timeout whatever MaxRetries says, a lock
// script whose reply comes late is still sent once and reported as an
// error.
func TestClusterScriptsNeverResent(t *testing.T) {
	ctx := context.Background()
	p := newLateProxy(t, clusterUpstream(t))
	proxy := p.ln.Addr().String()
	c := goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs:       []string{proxy},
		ReadTimeout: 200 * time.Millisecond,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, proxy)
		},
	})
	defer c.Close()
	prefix := fmt.Sprintf("resentc%d:", time.Now().UnixNano())
	cleanNamespace(t, clusterURL(t, ""), prefix)
	st, err := redis.New(c, &redis.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	locks := st.Driver().Locks()
	// The setup's acquire may itself outlast the 200 ms read timeout on a
	// loaded machine; trying again as the same owner is safe (its own
	// holding is renewed).
	var (
		rec driver.LockRecord
		ok  bool
	)
	for attempt := 1; ; attempt++ {
		rec, ok, err = locks.Acquire(ctx, clusterFaultKey, "owner-a", time.Minute)
		var ne net.Error
		if attempt < 5 && errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		break
	}
	if err != nil || !ok {
		t.Fatal(ok, err)
	}

	// The release script is on the server (a late NOSCRIPT would mean it
	// never ran).
	if _, err := locks.Release(ctx, clusterFaultKey, "nobody", 1); err != nil {
		t.Fatal(err)
	}
	p.scripts.Store(0)
	p.counting.Store(true)
	p.late.Store(true)
	released, err := locks.Release(ctx, clusterFaultKey, "owner-a", rec.Token)
	p.counting.Store(false)
	close(p.release)
	if err == nil {
		t.Errorf("a release whose reply came late returned released=%v and no error; its outcome is unknown", released)
	}
	if n := p.scripts.Load(); n != 1 {
		t.Errorf("the release script was sent %d times, want once", n)
	}
	direct, err := warden.Open(ctx, clusterURL(t, prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if _, ok, err := direct.Driver().Locks().Acquire(ctx, clusterFaultKey, "owner-b", time.Minute); err != nil || !ok {
		t.Errorf("after the late release the key is not free: %v %v", ok, err)
	}
}
