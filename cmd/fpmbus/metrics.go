package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fpmbus/fpmbus/streams"
)

// metricsAddrFlag registers --metrics-addr, the process's own flag (not a component's): where /metrics
// (and in `up` /healthz) are served.
func metricsAddrFlag(fs *flag.FlagSet, example string) *string {
	return fs.String("metrics-addr", "", "serve Prometheus /metrics on this address, e.g. "+example+" (empty: off)")
}

// newProcessRegistry returns a registry with the Go runtime and process collectors.
func newProcessRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// serveMetrics serves g on addr at /metrics, and health at /healthz when it is not nil, until stop is
// called. It returns once the listener is open, so a bad address is reported at start, as a usage error
// naming --metrics-addr. The endpoints have no authentication: an address beyond loopback is served,
// with one warning naming it (a Prometheus on another host needs it, and a firewall decides). An empty
// addr (--metrics-addr unset) serves nothing, and stop does nothing.
func serveMetrics(addr string, g prometheus.Gatherer, health http.Handler) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: --metrics-addr %q: %v", errUsage, addr, err)
	}
	if host, _, _ := net.SplitHostPort(addr); !streams.IsLoopbackHost(host) {
		slog.Warn("--metrics-addr is reachable beyond this host and has no authentication: anyone who reaches it reads the metrics (and /healthz)", "addr", addr)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	if health != nil {
		mux.Handle("/healthz", health)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("metrics server", "error", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
