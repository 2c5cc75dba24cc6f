package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// fence is the fenced resource: a loopback HTTP server that keeps, per key,
// the greatest token written and the lease that wrote it, accepts a write
// whose token is greater (or equal, from that same lease) and refuses the
// others. It records every write in arrival order for the checker.
type fence struct {
	srv *http.Server
	ln  net.Listener
	wg  sync.WaitGroup

	mu     sync.Mutex
	top    map[string]Write
	writes []Write
}

// newFence starts a fenced resource on a free loopback port.
func newFence() (*fence, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &fence{ln: ln, top: map[string]Write{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /write", f.write)
	f.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	f.wg.Go(func() {
		if err := f.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			panic(err)
		}
	})
	return f, nil
}

// URL is the resource's base URL.
func (f *fence) URL() string { return "http://" + f.ln.Addr().String() }

// write handles POST /write?key=K&token=T&lease=L: 200 accepted, 409
// refused (a stale token).
func (f *fence) write(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	token, err := strconv.ParseInt(q.Get("token"), 10, 64)
	if err != nil || q.Get("key") == "" {
		http.Error(w, "bad write", http.StatusBadRequest)
		return
	}
	wr := Write{Key: q.Get("key"), Token: token, Lease: q.Get("lease")}
	f.mu.Lock()
	wr.T = now()
	top, seen := f.top[wr.Key]
	wr.Accepted = !seen || wr.Token > top.Token || (wr.Token == top.Token && wr.Lease == top.Lease)
	if wr.Accepted {
		f.top[wr.Key] = wr
	}
	f.writes = append(f.writes, wr)
	f.mu.Unlock()
	if !wr.Accepted {
		http.Error(w, "stale token", http.StatusConflict)
	}
}

// Writes returns the record so far.
func (f *fence) Writes() []Write {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Write(nil), f.writes...)
}

// Close stops the server and waits for its goroutine.
func (f *fence) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := f.srv.Shutdown(ctx)
	f.wg.Wait()
	return err
}
