// Package rpcstore serves a process's driver stores over HTTP and
// registers the URL scheme "drivertest-rpc", whose stores forward every
// driver call there. A memory database is private to its process; through
// this bridge the child processes of multi-process tests (drivertest's,
// scope's) share the parent's database the way services share a server.
// Every driver method is still one atomic operation on the serving side.
//
// It is imported only from _test.go files.
package rpcstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// Scheme is the URL scheme of the bridge's stores.
const Scheme = "drivertest-rpc"

func init() {
	warden.Register(Scheme, openRPC)
}

// rpcRequest is one driver call.
type rpcRequest struct {
	Prefix string
	Method string // "Locks.Acquire", "Store.Limits", …
	Args   []json.RawMessage
}

// rpcResponse is its outcome.
type rpcResponse struct {
	Results []json.RawMessage
	Err     string
}

// Server serves driver stores, one per prefix, made by open.
type Server struct {
	srv  *httptest.Server
	open func(prefix string) driver.Store

	mu     sync.Mutex
	stores map[string]driver.Store
}

// Serve starts a server for t whose stores open makes, one per prefix; it
// stops, closing them, when t ends.
func Serve(t testing.TB, open func(prefix string) driver.Store) *Server {
	s := &Server{open: open, stores: map[string]driver.Store{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.handle))
	t.Cleanup(func() {
		s.srv.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, st := range s.stores {
			st.Close()
		}
	})
	return s
}

// URL returns the URL that opens the served database in namespace prefix.
func (s *Server) URL(prefix string) string {
	u, _ := url.Parse(s.srv.URL)
	return Scheme + "://" + u.Host + "/?prefix=" + url.QueryEscape(prefix)
}

func (s *Server) store(prefix string) driver.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stores[prefix]
	if st == nil {
		st = s.open(prefix)
		s.stores[prefix] = st
	}
	return st
}

var (
	ctxType     = reflect.TypeFor[context.Context]()
	errType     = reflect.TypeFor[error]()
	patternType = reflect.TypeFor[driver.Pattern]()
)

func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	var req rpcRequest
	var resp rpcResponse
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		resp.Err = err.Error()
	} else if err := s.call(r.Context(), req, &resp); err != nil {
		resp.Err = err.Error()
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&resp)
}

// call dispatches one request by reflection: "Cap.Method" calls Method on
// the store's Cap() capability ("Store.Method" on the store itself).
func (s *Server) call(ctx context.Context, req rpcRequest, resp *rpcResponse) error {
	capName, method, ok := cutDot(req.Method)
	if !ok {
		return fmt.Errorf("bad method %q", req.Method)
	}
	target := reflect.ValueOf(s.store(req.Prefix))
	if capName != "Store" {
		m := target.MethodByName(capName)
		if !m.IsValid() {
			return fmt.Errorf("no capability %q", capName)
		}
		target = m.Call(nil)[0]
	}
	m := target.MethodByName(method)
	if !m.IsValid() {
		return fmt.Errorf("no method %q", req.Method)
	}
	mt := m.Type()
	var in []reflect.Value
	args := req.Args
	for i := range mt.NumIn() {
		at := mt.In(i)
		if at == ctxType {
			in = append(in, reflect.ValueOf(ctx))
			continue
		}
		if len(args) == 0 {
			return fmt.Errorf("%s: too few arguments", req.Method)
		}
		raw := args[0]
		args = args[1:]
		if at == patternType {
			var src string
			if err := json.Unmarshal(raw, &src); err != nil {
				return err
			}
			p, err := driver.ParsePattern(src)
			if err != nil {
				return err
			}
			in = append(in, reflect.ValueOf(p))
			continue
		}
		v := reflect.New(at)
		if err := json.Unmarshal(raw, v.Interface()); err != nil {
			return fmt.Errorf("%s argument %d: %v", req.Method, i, err)
		}
		in = append(in, v.Elem())
	}
	out := m.Call(in)
	for _, v := range out {
		if v.Type() == errType {
			if !v.IsNil() {
				return v.Interface().(error)
			}
			continue
		}
		b, err := json.Marshal(v.Interface())
		if err != nil {
			return err
		}
		resp.Results = append(resp.Results, b)
	}
	return nil
}

func cutDot(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == '.' {
			return s[:i], s[i+1:], true
		}
	}
	return "", "", false
}

// ---------------------------------------------------------------------------
// the client side: a driver.Store that forwards every call

type rpcStore struct {
	endpoint string
	prefix   string
	client   *http.Client
	limits   driver.Limits
}

func openRPC(ctx context.Context, u *url.URL, _ *slog.Logger) (driver.Store, error) {
	q := driver.NewParams(u)
	prefix := q.String("prefix", "")
	if err := q.Err(); err != nil {
		return nil, err
	}
	s := &rpcStore{
		endpoint: "http://" + u.Host + "/",
		prefix:   prefix,
		client:   &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}, Timeout: time.Minute},
	}
	if err := s.call(ctx, "Store.Limits", nil, &s.limits); err != nil {
		return nil, err
	}
	return s, nil
}

// call forwards one driver call and decodes its results into outs.
func (s *rpcStore) call(ctx context.Context, method string, args []any, outs ...any) error {
	req := rpcRequest{Prefix: s.prefix, Method: method}
	for _, a := range args {
		if p, ok := a.(driver.Pattern); ok {
			a = p.String()
		}
		b, err := json.Marshal(a)
		if err != nil {
			return err
		}
		req.Args = append(req.Args, b)
	}
	body, err := json.Marshal(&req)
	if err != nil {
		return err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, s.endpoint, bytes.NewReader(body))
	if err != nil {
		return err
	}
	hresp, err := s.client.Do(hreq)
	if err != nil {
		return err
	}
	defer hresp.Body.Close()
	var resp rpcResponse
	if err := json.NewDecoder(hresp.Body).Decode(&resp); err != nil {
		return err
	}
	if resp.Err != "" {
		return errors.New(resp.Err)
	}
	if len(resp.Results) != len(outs) {
		return fmt.Errorf("%s: %d results, want %d", method, len(resp.Results), len(outs))
	}
	for i, out := range outs {
		if err := json.Unmarshal(resp.Results[i], out); err != nil {
			return err
		}
	}
	return nil
}

func (s *rpcStore) Name() string                    { return "memory-rpc" }
func (s *rpcStore) Limits() driver.Limits           { return s.limits }
func (s *rpcStore) Locks() driver.Locks             { return rpcLocks{s} }
func (s *rpcStore) Circuits() driver.Circuits       { return rpcCircuits{s} }
func (s *rpcStore) Cache() driver.Cache             { return rpcCache{s} }
func (s *rpcStore) Idempotency() driver.Idempotency { return rpcIdem{s} }
func (s *rpcStore) Checkpoints() driver.Checkpoints { return rpcCheckpoints{s} }
func (s *rpcStore) Ping(ctx context.Context) error  { return s.call(ctx, "Store.Ping", nil) }
func (s *rpcStore) Close() error                    { s.client.CloseIdleConnections(); return nil }
func (s *rpcStore) do(ctx context.Context, m string, a ...any) func(outs ...any) error {
	return func(outs ...any) error { return s.call(ctx, m, a, outs...) }
}

type rpcLocks struct{ s *rpcStore }

func (l rpcLocks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (r driver.LockRecord, ok bool, err error) {
	err = l.s.do(ctx, "Locks.Acquire", key, owner, ttl)(&r, &ok)
	return
}
func (l rpcLocks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (r driver.LockRecord, ok bool, err error) {
	err = l.s.do(ctx, "Locks.Refresh", key, owner, token, ttl)(&r, &ok)
	return
}
func (l rpcLocks) Release(ctx context.Context, key, owner string, token int64) (ok bool, err error) {
	err = l.s.do(ctx, "Locks.Release", key, owner, token)(&ok)
	return
}
func (l rpcLocks) ForceRelease(ctx context.Context, key string) (ok bool, err error) {
	err = l.s.do(ctx, "Locks.ForceRelease", key)(&ok)
	return
}
func (l rpcLocks) Get(ctx context.Context, key string) (r driver.LockRecord, ok bool, err error) {
	err = l.s.do(ctx, "Locks.Get", key)(&r, &ok)
	return
}
func (l rpcLocks) List(ctx context.Context, p driver.Pattern) (r []driver.LockRecord, err error) {
	err = l.s.do(ctx, "Locks.List", p)(&r)
	return
}

type rpcCircuits struct{ s *rpcStore }

func (c rpcCircuits) RecordFailure(ctx context.Context, name string, threshold int, gen int64) (r driver.CircuitRecord, err error) {
	err = c.s.do(ctx, "Circuits.RecordFailure", name, threshold, gen)(&r)
	return
}
func (c rpcCircuits) RecordSuccess(ctx context.Context, name string, gen int64) (r driver.CircuitRecord, err error) {
	err = c.s.do(ctx, "Circuits.RecordSuccess", name, gen)(&r)
	return r, err
}
func (c rpcCircuits) TryProbe(ctx context.Context, name, owner string, openFor, lease time.Duration) (r driver.CircuitRecord, ok bool, err error) {
	err = c.s.do(ctx, "Circuits.TryProbe", name, owner, openFor, lease)(&r, &ok)
	return
}
func (c rpcCircuits) RecordOutcome(ctx context.Context, name string, o driver.Outcome) (r driver.CircuitRecord, err error) {
	err = c.s.do(ctx, "Circuits.RecordOutcome", name, o)(&r)
	return r, err
}
func (c rpcCircuits) Trip(ctx context.Context, name string, version int64) (r driver.CircuitRecord, ok bool, err error) {
	err = c.s.do(ctx, "Circuits.Trip", name, version)(&r, &ok)
	return
}
func (c rpcCircuits) TryProbes(ctx context.Context, name, owner string, openFor, lease time.Duration, maxProbes int) (r driver.CircuitRecord, ok bool, err error) {
	err = c.s.do(ctx, "Circuits.TryProbes", name, owner, openFor, lease, maxProbes)(&r, &ok)
	return
}
func (c rpcCircuits) Get(ctx context.Context, name string) (r driver.CircuitRecord, ok bool, err error) {
	err = c.s.do(ctx, "Circuits.Get", name)(&r, &ok)
	return
}
func (c rpcCircuits) Set(ctx context.Context, name string, state driver.CircuitState) (r driver.CircuitRecord, err error) {
	err = c.s.do(ctx, "Circuits.Set", name, state)(&r)
	return
}
func (c rpcCircuits) Delete(ctx context.Context, name string) (ok bool, err error) {
	err = c.s.do(ctx, "Circuits.Delete", name)(&ok)
	return
}
func (c rpcCircuits) List(ctx context.Context, p driver.Pattern) (r []driver.CircuitRecord, err error) {
	err = c.s.do(ctx, "Circuits.List", p)(&r)
	return
}

type rpcCache struct{ s *rpcStore }

func (c rpcCache) Get(ctx context.Context, key string) (e driver.CacheEntry, ok bool, err error) {
	err = c.s.do(ctx, "Cache.Get", key)(&e, &ok)
	return
}
func (c rpcCache) Set(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	return c.s.do(ctx, "Cache.Set", key, value, ttl)()
}
func (c rpcCache) SetIfAbsent(ctx context.Context, key string, value []byte, ttl time.Duration) (ok bool, err error) {
	err = c.s.do(ctx, "Cache.SetIfAbsent", key, value, ttl)(&ok)
	return
}
func (c rpcCache) Delete(ctx context.Context, key string) (ok bool, err error) {
	err = c.s.do(ctx, "Cache.Delete", key)(&ok)
	return
}
func (c rpcCache) Has(ctx context.Context, key string) (ok bool, err error) {
	err = c.s.do(ctx, "Cache.Has", key)(&ok)
	return
}
func (c rpcCache) Clear(ctx context.Context) (n int64, err error) {
	err = c.s.do(ctx, "Cache.Clear")(&n)
	return
}
func (c rpcCache) Keys(ctx context.Context, p driver.Pattern) (keys []string, err error) {
	err = c.s.do(ctx, "Cache.Keys", p)(&keys)
	return
}

type rpcIdem struct{ s *rpcStore }

func (i rpcIdem) Claim(ctx context.Context, key, owner string, lease time.Duration, fp string) (r driver.IdemRecord, out driver.ClaimOutcome, err error) {
	err = i.s.do(ctx, "Idempotency.Claim", key, owner, lease, fp)(&r, &out)
	return
}
func (i rpcIdem) Extend(ctx context.Context, key, owner string, lease time.Duration) (ok bool, err error) {
	err = i.s.do(ctx, "Idempotency.Extend", key, owner, lease)(&ok)
	return
}
func (i rpcIdem) Complete(ctx context.Context, key, owner string, result []byte, retain time.Duration) (ok bool, err error) {
	err = i.s.do(ctx, "Idempotency.Complete", key, owner, result, retain)(&ok)
	return
}
func (i rpcIdem) Abandon(ctx context.Context, key, owner string) (ok bool, err error) {
	err = i.s.do(ctx, "Idempotency.Abandon", key, owner)(&ok)
	return
}
func (i rpcIdem) Get(ctx context.Context, key string) (r driver.IdemRecord, ok bool, err error) {
	err = i.s.do(ctx, "Idempotency.Get", key)(&r, &ok)
	return
}
func (i rpcIdem) Set(ctx context.Context, key string, result []byte, ttl time.Duration) error {
	return i.s.do(ctx, "Idempotency.Set", key, result, ttl)()
}
func (i rpcIdem) Delete(ctx context.Context, key string) (ok bool, err error) {
	err = i.s.do(ctx, "Idempotency.Delete", key)(&ok)
	return
}
func (i rpcIdem) List(ctx context.Context, p driver.Pattern) (r []driver.IdemRecord, err error) {
	err = i.s.do(ctx, "Idempotency.List", p)(&r)
	return
}

type rpcCheckpoints struct{ s *rpcStore }

func (c rpcCheckpoints) Save(ctx context.Context, in driver.CheckpointInput) (cp driver.Checkpoint, ok bool, err error) {
	err = c.s.do(ctx, "Checkpoints.Save", in)(&cp, &ok)
	return
}
func (c rpcCheckpoints) Fence(ctx context.Context, task string, token int64) (ok bool, err error) {
	err = c.s.do(ctx, "Checkpoints.Fence", task, token)(&ok)
	return
}
func (c rpcCheckpoints) Load(ctx context.Context, id string) (cp driver.Checkpoint, ok bool, err error) {
	err = c.s.do(ctx, "Checkpoints.Load", id)(&cp, &ok)
	return
}
func (c rpcCheckpoints) Latest(ctx context.Context, task string) (cp driver.Checkpoint, ok bool, err error) {
	err = c.s.do(ctx, "Checkpoints.Latest", task)(&cp, &ok)
	return
}
func (c rpcCheckpoints) List(ctx context.Context, task string) (cps []driver.Checkpoint, err error) {
	err = c.s.do(ctx, "Checkpoints.List", task)(&cps)
	return
}
func (c rpcCheckpoints) Cleanup(ctx context.Context, task string, keep int, token int64) (n int64, ok bool, err error) {
	err = c.s.do(ctx, "Checkpoints.Cleanup", task, keep, token)(&n, &ok)
	return
}
func (c rpcCheckpoints) DeleteAll(ctx context.Context, task string, token int64) (n int64, ok bool, err error) {
	err = c.s.do(ctx, "Checkpoints.DeleteAll", task, token)(&n, &ok)
	return
}
func (c rpcCheckpoints) Tasks(ctx context.Context, p driver.Pattern) (ids []string, err error) {
	err = c.s.do(ctx, "Checkpoints.Tasks", p)(&ids)
	return
}
