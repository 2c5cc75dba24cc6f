package otelwarden_test

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/cache"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/otelwarden"
	"github.com/warden-go/warden/store/memory"
)

// Enabling telemetry in a service: one Telemetry, given to the store as
// its hook and to each portable package as its Observe function. A
// service passes nil options to report to the global providers its OTel
// SDK set up (otel.SetTracerProvider, otel.SetMeterProvider); this example
// reads the metrics back with a manual reader instead.
func Example() {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	tel := otelwarden.New(&otelwarden.Options{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})

	st := warden.New(memory.NewDriver(nil), &warden.Options{Hook: tel}) // or warden.OpenWith(ctx, url, …)
	defer st.Close()
	locker, _ := lock.New(st, &lock.Options{Observe: tel.Lock})
	defer locker.Close()
	prices, _ := cache.New[int](st, &cache.Options{TTL: time.Minute, Observe: tel.Cache})
	defer prices.Close()
	payments, _ := breaker.New(st, "payments", &breaker.Options{Observe: tel.Breaker})
	defer payments.Close()
	// idempotency.Options{Observe: tel.Idempotency} and
	// checkpoint.Options{Observe: tel.Checkpoint} likewise.

	_ = lock.Do(ctx, locker, "nightly-report", func(ctx context.Context) error { return nil })
	for range 2 {
		_, _ = prices.GetOrLoad(ctx, "sku-1", func(ctx context.Context) (int, error) { return 4200, nil })
	}
	_ = payments.Do(ctx, func(ctx context.Context) error { return nil })

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(ctx, &rm)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if counter, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, p := range counter.DataPoints {
					fmt.Println(m.Name, p.Attributes.Encoded(attribute.DefaultEncoder()), p.Value)
				}
			}
		}
	}
	// Unordered output:
	// warden.lock.acquisitions warden.lock.contended=false,warden.lock.outcome=acquired 1
	// warden.cache.lookups warden.cache.result=miss 1
	// warden.cache.lookups warden.cache.result=hit 1
	// warden.breaker.calls warden.breaker.circuit=payments,warden.breaker.outcome=success 1
}
