package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/otelwarden"
)

// telemetryFlushTimeout bounds the export of what is left when warden
// exits: a collector that does not answer must not hold the command up.
const telemetryFlushTimeout = 5 * time.Second

// telemetry exports warden's traces and metrics over OTLP (package
// otelwarden, the OpenTelemetry SDK and its OTLP exporters). It is on only
// when the standard environment names a collector: OTEL_EXPORTER_OTLP_ENDPOINT,
// or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / _METRICS_ENDPOINT for one signal.
// OTEL_EXPORTER_OTLP_PROTOCOL (or the signal's _PROTOCOL) chooses grpc or
// http/protobuf (the default); OTEL_TRACES_EXPORTER=none or
// OTEL_METRICS_EXPORTER=none turns one signal off and OTEL_SDK_DISABLED=true
// both. The exporters read the rest of the OTEL_EXPORTER_OTLP_* variables
// themselves (headers, certificates, compression, timeouts), and
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES name the resource
// (service.name "warden" by default).
type telemetry struct {
	tel      *otelwarden.Telemetry
	tracer   trace.Tracer
	shutdown []func(context.Context) error
}

// startTelemetry sets telemetry up from the environment (getenv); nil,
// nil when it names no collector.
func startTelemetry(ctx context.Context, getenv func(string) string) (*telemetry, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, nil
	}
	enabled := func(signal string) bool {
		if strings.EqualFold(strings.TrimSpace(getenv("OTEL_"+signal+"_EXPORTER")), "none") {
			return false
		}
		return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != ""
	}
	traces, metrics := enabled("TRACES"), enabled("METRICS")
	if !traces && !metrics {
		return nil, nil
	}
	protocol := func(signal string) (string, error) {
		p := getenv("OTEL_EXPORTER_OTLP_" + signal + "_PROTOCOL")
		if p == "" {
			p = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
		}
		switch p {
		case "", "http/protobuf":
			return "http/protobuf", nil
		case "grpc":
			return "grpc", nil
		}
		return "", fmt.Errorf("OTLP protocol %q: warden exports grpc or http/protobuf", p)
	}
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName("warden")), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	t := &telemetry{}
	var tp trace.TracerProvider = tracenoop.NewTracerProvider()
	var mp metric.MeterProvider = metricnoop.NewMeterProvider()
	if traces {
		p, err := protocol("TRACES")
		if err != nil {
			return nil, err
		}
		var exp sdktrace.SpanExporter
		if p == "grpc" {
			exp, err = otlptracegrpc.New(ctx)
		} else {
			exp, err = otlptracehttp.New(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("OTLP trace exporter: %w", err)
		}
		sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		t.shutdown = append(t.shutdown, sdk.Shutdown)
		tp = sdk
	}
	if metrics {
		p, err := protocol("METRICS")
		if err != nil {
			_ = t.stop(ctx)
			return nil, err
		}
		var exp sdkmetric.Exporter
		if p == "grpc" {
			exp, err = otlpmetricgrpc.New(ctx)
		} else {
			exp, err = otlpmetrichttp.New(ctx)
		}
		if err != nil {
			_ = t.stop(ctx)
			return nil, fmt.Errorf("OTLP metric exporter: %w", err)
		}
		// The periodic reader also exports once more at shutdown, so a
		// command shorter than its interval still reports.
		sdk := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)), sdkmetric.WithResource(res))
		t.shutdown = append(t.shutdown, sdk.Shutdown)
		mp = sdk
	}
	t.tel = otelwarden.New(&otelwarden.Options{TracerProvider: tp, MeterProvider: mp})
	t.tracer = tp.Tracer("github.com/warden-go/warden/cmd/warden")
	return t, nil
}

// stop flushes what is left to the collector and ends the exporters,
// within telemetryFlushTimeout.
func (t *telemetry) stop(ctx context.Context) error {
	if t == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), telemetryFlushTimeout)
	defer cancel()
	var errs []error
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}

// hook is the store hook: nil without telemetry.
func (t *telemetry) hook() warden.Hook {
	if t == nil {
		return nil
	}
	return t.tel
}

// lockObserver is lock.Options.Observe: nil without telemetry.
func (t *telemetry) lockObserver() func(context.Context, lock.Observation) {
	if t == nil {
		return nil
	}
	return t.tel.Lock
}

// command runs a command in a span of its own ("warden lock run"), the
// parent of its store operations' spans.
func (t *telemetry) command(ctx context.Context, path string, f func(ctx context.Context) error) error {
	if t == nil {
		return f(ctx)
	}
	ctx, span := t.tracer.Start(ctx, "warden "+path, trace.WithAttributes(attribute.String("warden.command", path)))
	defer span.End()
	err := f(ctx)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}
