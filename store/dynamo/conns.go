package dynamo

import (
	"context"
	"net"
	"sync"
	"time"
)

// conns tracks the network connections of the HTTP client a store made
// itself (Open), so that Close can close them.
//
// Closing the idle connections of the transport the store built is not
// enough: the SDK's buildable client copies its transport on every option
// it applies (CA bundle, timeouts, the read timeout), and the transport
// that ends up holding the connections is a copy nobody can reach. Every
// copy keeps the transport's dial function, though: the store wraps it,
// and so sees every connection its client opens, whichever copy opened it.
type conns struct {
	mu     sync.Mutex
	open   map[*trackedConn]struct{}
	closed bool
}

func newConns() *conns { return &conns{open: map[*trackedConn]struct{}{}} }

// dialer is the dial function for a transport whose dial function was
// next (nil: a default dialer).
func (c *conns) dialer(next func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if next == nil {
		next = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if tc, ok := conn.(*trackedConn); ok && tc.owner == c {
			return conn, nil // dialled through this tracker already
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.closed {
			_ = conn.Close()
			return nil, errClosed
		}
		tc := &trackedConn{Conn: conn, owner: c}
		c.open[tc] = struct{}{}
		return tc, nil
	}
}

// close closes every connection (a request still in flight fails) and
// makes later dials fail: the store is closed.
func (c *conns) close() {
	c.mu.Lock()
	c.closed = true
	open := c.open
	c.open = map[*trackedConn]struct{}{}
	c.mu.Unlock()
	for tc := range open {
		_ = tc.Conn.Close()
	}
}

// trackedConn is a connection that leaves its tracker when it closes.
type trackedConn struct {
	net.Conn
	owner *conns
}

func (tc *trackedConn) Close() error {
	tc.owner.mu.Lock()
	delete(tc.owner.open, tc)
	tc.owner.mu.Unlock()
	return tc.Conn.Close()
}
