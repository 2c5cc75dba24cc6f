package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// received is what a test collector was sent: span names and metric
// names, by signal.
type received struct {
	mu      sync.Mutex
	spans   []string
	metrics []string
}

func (r *received) addTraces(req *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, s.GetName())
			}
		}
	}
}

func (r *received) addMetrics(req *colmetricpb.ExportMetricsServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rm := range req.GetResourceMetrics() {
		for _, sm := range rm.GetScopeMetrics() {
			for _, m := range sm.GetMetrics() {
				r.metrics = append(r.metrics, m.GetName())
			}
		}
	}
}

// check asserts that the spans of `cache set` (the command's and the
// store operation's) and the store metrics arrived.
func (r *received) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, name := range []string{"warden cache set", "cache.set"} {
		if !slices.Contains(r.spans, name) {
			t.Errorf("the collector got spans %q, not %q", r.spans, name)
		}
	}
	if !slices.Contains(r.metrics, "warden.store.operation.duration") {
		t.Errorf("the collector got metrics %q, not warden.store.operation.duration", r.metrics)
	}
}

// otelEnv is the tests' environment with the OpenTelemetry variables
// given, which are also set in the process's for the OTLP exporters,
// which read them there.
func otelEnv(t *testing.T, kv ...string) []string {
	env := testEnv()
	for i := 0; i < len(kv); i += 2 {
		t.Setenv(kv[i], kv[i+1])
		env = append(env, kv[i]+"="+kv[i+1])
	}
	return env
}

// invokeEnv runs warden in-process with env.
func invokeEnv(t *testing.T, env []string, args ...string) result {
	t.Helper()
	var out, errb strings.Builder
	code := run(context.Background(), args, strings.NewReader(""), &out, &errb, env)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

func memoryURL() string {
	return fmt.Sprintf("memory://cli-otel-%d-%d", os.Getpid(), memoryDBs.Add(1))
}

// Without the OTLP environment nothing is set up, and a command exports
// nothing; OTEL_SDK_DISABLED and OTEL_*_EXPORTER=none turn it off.
func TestTelemetryOffByDefault(t *testing.T) {
	for _, env := range [][]string{
		nil,
		{"OTEL_SERVICE_NAME=x", "OTEL_EXPORTER_OTLP_HEADERS=a=b"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1", "OTEL_SDK_DISABLED=true"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1", "OTEL_TRACES_EXPORTER=none", "OTEL_METRICS_EXPORTER=none"},
	} {
		c := &cli{env: env}
		tel, err := startTelemetry(context.Background(), c.getenv)
		if tel != nil || err != nil {
			t.Errorf("env %q: telemetry %v, %v; want none", env, tel, err)
		}
	}
	var calls int
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		mu.Unlock()
	}))
	defer srv.Close()
	// The collector is there, but nothing names it.
	r := invokeEnv(t, testEnv(), "--store", memoryURL(), "cache", "set", "k", "v")
	want(t, r, exitOK)
	mu.Lock()
	defer mu.Unlock()
	if calls != 0 {
		t.Fatalf("the collector got %d requests without the OTLP environment", calls)
	}
}

// With OTEL_EXPORTER_OTLP_ENDPOINT naming an OTLP/HTTP collector, a
// command's spans and metrics reach it before warden exits.
func TestTelemetryExportsOverHTTP(t *testing.T) {
	got := &received{}
	srv := otlpHTTPCollector(t, got)
	env := otelEnv(t, "OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	r := invokeEnv(t, env, "--store", memoryURL(), "cache", "set", "k", "v")
	want(t, r, exitOK)
	got.check(t)
}

// otlpHTTPCollector is an OTLP/HTTP collector recording into got.
func otlpHTTPCollector(t *testing.T, got *received) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
			return
		}
		switch r.URL.Path {
		case "/v1/traces":
			var req coltracepb.ExportTraceServiceRequest
			if err := proto.Unmarshal(body, &req); err != nil {
				t.Errorf("traces: %v", err)
			}
			got.addTraces(&req)
		case "/v1/metrics":
			var req colmetricpb.ExportMetricsServiceRequest
			if err := proto.Unmarshal(body, &req); err != nil {
				t.Errorf("metrics: %v", err)
			}
			got.addMetrics(&req)
		default:
			t.Errorf("unexpected request to %s", r.URL.Path)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// `warden lock run` exports the command's span with its store operations
// (the acquire and the release) as children, and the lock metrics —
// acquisitions, wait and hold time — before it exits, also when the
// command it ran failed.
func TestTelemetryLockRunExports(t *testing.T) {
	for _, c := range []struct {
		cmd  string
		code int
	}{{"true", exitOK}, {"false", 1}} {
		got := &received{}
		srv := otlpHTTPCollector(t, got)
		env := otelEnv(t, "OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
		r := invokeEnv(t, env, "--store", memoryURL(), "lock", "run", "--ttl", "1s", "job", "--", c.cmd)
		if r.code != c.code {
			t.Fatalf("lock run -- %s: want exit %d, got %s", c.cmd, c.code, r)
		}
		got.mu.Lock()
		for _, name := range []string{"warden lock run", "lock.acquire", "lock.release"} {
			if !slices.Contains(got.spans, name) {
				t.Errorf("lock run -- %s: the collector got spans %q, not %q", c.cmd, got.spans, name)
			}
		}
		for _, name := range []string{"warden.lock.acquisitions", "warden.lock.wait.duration", "warden.lock.hold.duration", "warden.store.operation.duration"} {
			if !slices.Contains(got.metrics, name) {
				t.Errorf("lock run -- %s: the collector got metrics %q, not %q", c.cmd, got.metrics, name)
			}
		}
		got.mu.Unlock()
	}
}

// traceServer and metricServer are an OTLP/gRPC collector.
type traceServer struct {
	coltracepb.UnimplementedTraceServiceServer
	got *received
}

func (s traceServer) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.got.addTraces(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

type metricServer struct {
	colmetricpb.UnimplementedMetricsServiceServer
	got *received
}

func (s metricServer) Export(_ context.Context, req *colmetricpb.ExportMetricsServiceRequest) (*colmetricpb.ExportMetricsServiceResponse, error) {
	s.got.addMetrics(req)
	return &colmetricpb.ExportMetricsServiceResponse{}, nil
}

// With OTEL_EXPORTER_OTLP_PROTOCOL=grpc, the same reaches an OTLP/gRPC
// collector.
func TestTelemetryExportsOverGRPC(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	got := &received{}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, traceServer{got: got})
	colmetricpb.RegisterMetricsServiceServer(srv, metricServer{got: got})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	env := otelEnv(t, "OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+lis.Addr().String(), "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	r := invokeEnv(t, env, "--store", memoryURL(), "cache", "set", "k", "v")
	want(t, r, exitOK)
	got.check(t)
}

// An unknown protocol is said on stderr, and the command runs without
// telemetry.
func TestTelemetryBadProtocol(t *testing.T) {
	env := otelEnv(t, "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	r := invokeEnv(t, env, "--store", memoryURL(), "cache", "set", "k", "v")
	if r.code != exitOK || r.stderr != "warden: telemetry off: OTLP protocol \"http/json\": warden exports grpc or http/protobuf\n" {
		t.Fatalf("got %s", r)
	}
}
