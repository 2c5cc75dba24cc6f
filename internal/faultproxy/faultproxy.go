// Package faultproxy is a fault-injecting TCP proxy for warden's tests. A
// Proxy listens on the loopback interface and forwards every connection
// it accepts to one upstream address (a test server), while the test
// decides at run time what the network does:
//
//   - Pass: forward everything at once (the initial state).
//   - Delay(up, down): forward each chunk of bytes a fixed time after the
//     proxy read it, per direction (up: client to server, down: server to
//     client). Order is kept: a chunk never overtakes an earlier one of
//     its connection, even when the delay shrinks.
//   - Blackhole: accept connections and read what clients send, but never
//     forward a byte nor answer. A connection that lost a byte this way
//     stays silent for good, in both directions (its protocol stream is
//     broken); new connections accepted meanwhile never reach the server.
//     Pass lets later connections through again.
//   - Cut: close every connection and refuse new ones until another mode
//     is set. The listener keeps its port (so the proxy's address stays
//     valid): a new connection is accepted and reset at once.
//   - ResetReplies: forward requests, but reset each connection in the
//     middle of the next reply it gets: the client receives the first half
//     of the chunk, then a TCP RST. The server has done the work; the
//     client cannot know.
//   - Reset: an action, not a mode: reset (RST) every live connection now.
//
// The fate of a chunk is decided when the proxy reads it, by the mode in
// force at that instant; a chunk already queued keeps the delay it was
// given. Every goroutine the proxy starts is stopped by Close.
//
// The package uses the standard library only and is meant for tests.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Mode is the proxy's behaviour for data and connections.
type Mode int

// The modes; see the package documentation.
const (
	Pass Mode = iota
	Blackhole
	Cut
	ResetReplies
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Blackhole:
		return "blackhole"
	case Cut:
		return "cut"
	case ResetReplies:
		return "reset-replies"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Stats counts what a proxy did since it started.
type Stats struct {
	Accepted   int   // connections accepted and proxied (or blackholed)
	Refused    int   // connections reset at once during Cut
	Blackholed int   // connections that lost bytes to Blackhole
	Resets     int   // connections reset by Reset or ResetReplies
	Cuts       int   // connections closed by Cut
	BytesUp    int64 // bytes forwarded from clients to the server
	BytesDown  int64 // bytes forwarded from the server to clients
	Dropped    int64 // bytes swallowed by Blackhole
}

// Proxy is a TCP proxy from a loopback address to one upstream address.
// Its methods are safe for concurrent use.
type Proxy struct {
	ln       *net.TCPListener
	upstream string
	ctx      context.Context // ends when Close is called
	cancel   context.CancelFunc
	wg       sync.WaitGroup // every goroutine of the proxy

	mu       sync.Mutex
	mode     Mode
	up, down time.Duration // delays in Pass mode
	links    map[*link]struct{}
	closed   bool
	stats    Stats
}

// dir is a direction of a connection.
type dir int

const (
	upDir   dir = iota // client to server
	downDir            // server to client
)

// link is one proxied connection.
type link struct {
	p      *Proxy
	client *net.TCPConn
	// server is nil until dialed, and for a connection blackholed from its
	// start; guarded by p.mu.
	server *net.TCPConn
	// ctx ends when the link is torn down (or the proxy closes); done is
	// its Done channel.
	ctx    context.Context
	cancel context.CancelFunc
	done   <-chan struct{}
	once   sync.Once
	// silent: the link lost bytes to Blackhole and forwards nothing more;
	// guarded by p.mu.
	silent bool
	// reset: the link is being reset; guarded by p.mu.
	reset bool
}

// chunk is bytes read from one side, to be written to the other.
type chunk struct {
	data    []byte
	due     time.Time
	eof     bool // the source side closed: half-close the destination
	resetAt bool // reset the link after writing data
}

// New starts a proxy listening on 127.0.0.1 (a free port) that forwards
// to upstream, a host:port. It is in Pass mode.
func New(upstream string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(upstream); err != nil {
		return nil, fmt.Errorf("faultproxy: upstream %q: %w", upstream, err)
	}
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{ln: ln, upstream: upstream, ctx: ctx, cancel: cancel, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address clients connect to: 127.0.0.1:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Upstream returns the address the proxy forwards to.
func (p *Proxy) Upstream() string { return p.upstream }

// Pass forwards everything at once from now on (delays 0). Connections
// silenced by Blackhole stay silent.
func (p *Proxy) Pass() { p.set(Pass, 0, 0) }

// Delay forwards each chunk read from now on up (client to server) or down
// (server to client) after it was read. Delay(0, 0) is Pass.
func (p *Proxy) Delay(up, down time.Duration) { p.set(Pass, max(up, 0), max(down, 0)) }

// Blackhole stops forwarding anything, on every connection, from now on
// (bytes already queued by Delay included), and accepts new connections
// without ever dialing the server. Every connection alive now or accepted
// until another mode is set stays silent for good, in both directions:
// the proxy reads and drops what its client sends.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode, p.up, p.down = Blackhole, 0, 0
	for l := range p.links {
		if !l.silent {
			l.silent = true
			p.stats.Blackholed++
		}
	}
}

// ResetReplies resets each connection in the middle of the next reply it
// gets; see the package documentation.
func (p *Proxy) ResetReplies() { p.set(ResetReplies, 0, 0) }

// Cut closes every connection and resets new ones at once, until another
// mode is set.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.mode, p.up, p.down = Cut, 0, 0
	var cut []*link
	for l := range p.links {
		cut = append(cut, l)
		p.stats.Cuts++
	}
	p.mu.Unlock()
	for _, l := range cut {
		l.close(false)
	}
}

// Reset resets (TCP RST) every live connection now, whatever the mode, and
// returns how many it reset. The mode does not change.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	var rst []*link
	for l := range p.links {
		if !l.reset {
			l.reset = true
			rst = append(rst, l)
			p.stats.Resets++
		}
	}
	p.mu.Unlock()
	for _, l := range rst {
		l.close(true)
	}
	return len(rst)
}

// Mode returns the current mode and delays.
func (p *Proxy) Mode() (m Mode, up, down time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode, p.up, p.down
}

// Stats returns the counts so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Live returns the number of connections open now.
func (p *Proxy) Live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Close stops the proxy: it closes the listener and every connection, and
// returns when every goroutine of the proxy has ended. Calling it again
// does nothing.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	p.cancel()
	err := p.ln.Close()
	for _, l := range links {
		l.close(false)
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) set(m Mode, up, down time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode, p.up, p.down = m, up, down
}

// accept accepts connections until the listener closes.
func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.AcceptTCP()
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			// Resource exhaustion and the like: back off a little, as
			// net/http does, unless closing.
			select {
			case <-time.After(5 * time.Millisecond):
				continue
			case <-p.ctx.Done():
				return
			}
		}
		p.mu.Lock()
		switch {
		case p.closed:
			p.mu.Unlock()
			c.Close()
			return
		case p.mode == Cut:
			p.stats.Refused++
			p.mu.Unlock()
			_ = c.SetLinger(0)
			c.Close()
			continue
		}
		l := &link{p: p, client: c}
		l.ctx, l.cancel = context.WithCancel(p.ctx)
		l.done = l.ctx.Done()
		l.silent = p.mode == Blackhole
		if l.silent {
			p.stats.Blackholed++
		}
		p.links[l] = struct{}{}
		p.stats.Accepted++
		p.wg.Add(1)
		p.mu.Unlock()
		go l.run()
	}
}

// run dials the server (unless the link is blackholed from its start) and
// pumps both directions until the link ends.
func (l *link) run() {
	p := l.p
	defer p.wg.Done()
	defer func() {
		l.close(false)
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	p.mu.Lock()
	silent := l.silent
	p.mu.Unlock()
	if silent {
		// Never reaches the server: read and drop until the client goes.
		l.swallow()
		return
	}
	var d net.Dialer
	sc, err := d.DialContext(l.ctx, "tcp", p.upstream)
	if err != nil {
		// The server is unreachable: the client sees its connection reset.
		_ = l.client.SetLinger(0)
		return
	}
	p.mu.Lock()
	l.server = sc.(*net.TCPConn)
	silent = l.silent // blackholed while dialing
	p.mu.Unlock()
	if l.ctx.Err() != nil {
		sc.Close() // torn down while dialing
		return
	}
	if silent {
		l.swallow()
		return
	}
	upQ := make(chan chunk, 256)
	downQ := make(chan chunk, 256)
	var pumps, writers sync.WaitGroup
	pumps.Add(4)
	writers.Add(2)
	go func() { defer pumps.Done(); l.read(upDir, l.client, upQ) }()
	go func() { defer pumps.Done(); l.read(downDir, l.server, downQ) }()
	go func() { defer pumps.Done(); defer writers.Done(); l.write(upDir, l.server, upQ) }()
	go func() { defer pumps.Done(); defer writers.Done(); l.write(downDir, l.client, downQ) }()
	writers.Wait()
	// Both directions ended (or the link was torn down): close it, which
	// ends the readers.
	l.close(false)
	pumps.Wait()
}

// swallow reads from the client and drops everything until the client
// goes or the link ends.
func (l *link) swallow() {
	buf := make([]byte, 32<<10)
	for {
		n, err := l.client.Read(buf)
		if n > 0 {
			l.p.mu.Lock()
			l.p.stats.Dropped += int64(n)
			l.p.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// read reads chunks from src and queues them for the writer of direction
// d, deciding each chunk's fate by the mode in force when it is read.
func (l *link) read(d dir, src *net.TCPConn, q chan<- chunk) {
	p := l.p
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			now := time.Now()
			c := chunk{due: now}
			p.mu.Lock()
			switch {
			case l.silent:
				p.stats.Dropped += int64(n)
				p.mu.Unlock()
				continue
			case p.mode == ResetReplies && d == downDir && !l.reset:
				l.reset = true
				p.stats.Resets++
				c.data = append([]byte(nil), buf[:n/2]...)
				c.resetAt = true
			default:
				c.data = append([]byte(nil), buf[:n]...)
				if d == upDir {
					c.due = now.Add(p.up)
				} else {
					c.due = now.Add(p.down)
				}
			}
			p.mu.Unlock()
			select {
			case q <- c:
			case <-l.done:
				return
			}
		}
		if err != nil {
			p.mu.Lock()
			silent := l.silent
			p.mu.Unlock()
			switch {
			case silent && d == upDir:
				// The client left a silenced link: let the server's side go.
				l.close(false)
			case silent:
				// The server closed: the client must not learn it.
			default:
				select {
				case q <- chunk{eof: true}:
				case <-l.done:
				}
			}
			return
		}
	}
}

// write writes the queued chunks of direction d to dst, each at its due
// time, in order.
func (l *link) write(d dir, dst *net.TCPConn, q <-chan chunk) {
	p := l.p
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		var c chunk
		select {
		case c = <-q:
		case <-l.done:
			return
		}
		if c.eof {
			_ = dst.CloseWrite()
			return
		}
		if wait := time.Until(c.due); wait > 0 {
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			select {
			case <-timer.C:
			case <-l.done:
				return
			}
		}
		p.mu.Lock()
		silent := l.silent
		if silent {
			p.stats.Dropped += int64(len(c.data))
		}
		p.mu.Unlock()
		if silent {
			continue // blackholed while queued: the link forwards nothing more
		}
		if len(c.data) > 0 {
			if _, err := dst.Write(c.data); err != nil {
				l.close(false)
				return
			}
			p.mu.Lock()
			if d == upDir {
				p.stats.BytesUp += int64(len(c.data))
			} else {
				p.stats.BytesDown += int64(len(c.data))
			}
			p.mu.Unlock()
		}
		if c.resetAt {
			l.close(true)
			return
		}
	}
}

// close tears the link down once; rst: reset the client's connection
// (SO_LINGER 0) instead of closing it normally.
func (l *link) close(rst bool) {
	l.once.Do(func() {
		l.cancel()
		if rst {
			_ = l.client.SetLinger(0)
		}
		l.client.Close()
		l.p.mu.Lock()
		sc := l.server
		l.p.mu.Unlock()
		if sc != nil {
			sc.Close()
		}
	})
}
