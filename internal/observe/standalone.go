package observe

import (
	"flag"
	"log/slog"
	"net"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/internal/natsserver"
)

// RegisterAddrFlag registers --metrics-addr, the process's own flag (not a component's): where
// /metrics, /healthz, /status.json and the status page / are served (this package).
func RegisterAddrFlag(fs *flag.FlagSet, example string) *string {
	return fs.String("metrics-addr", "", "serve Prometheus /metrics, /healthz, /status.json and the status page / on this address, e.g. "+example+" (empty: off)")
}

// NewProcessRegistry returns a registry with the Go runtime and process collectors.
func NewProcessRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Serve serves o on addr (Server: /metrics, /healthz, /status.json, /) until stop is called. It
// returns once the listener is open, so a bad address is reported at start, as an invalid.FlagError
// naming --metrics-addr. The endpoints have no authentication: an address beyond loopback is
// served, with one warning naming it (a Prometheus on another host needs it, and a firewall decides).
// An empty addr (--metrics-addr unset) serves nothing, and stop does nothing.
func Serve(addr string, o Options) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, invalid.Flagf("--metrics-addr %q: %v", addr, err)
	}
	if host, _, _ := net.SplitHostPort(addr); !natsserver.IsLoopbackHost(host) {
		slog.Warn("--metrics-addr is reachable beyond this host and has no authentication: anyone who reaches it reads the metrics, /healthz and the status page", "addr", addr)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	srv := New(o)
	srv.Start(ln)
	return srv.Stop, nil
}

// Standalone is the status of a standalone command's one component on connection nc: its
// health (starting until ready, degraded while nc reconnects or a check reports a fault), JetStream's
// view through nc (what the component's least-privileged user may read: the streams' infos and its own
// consumers'; none with readJS false, for a user that may read neither), and the consumer it runs
// (nil: none). done ends the wait for ready. The health is exported as fpmbus_component_* by the
// status server, as `up`'s run group is.
func Standalone(process, component string, reg prometheus.Gatherer, nc *nats.Conn, ready, done <-chan struct{}, consumer *ConsumerRef, readJS bool, checks ...func() error) Options {
	p := newProcess(component)
	p.SetConn(nc)
	for _, check := range checks {
		p.Check(check)
	}
	p.Follow(ready, done)
	o := Options{Process: process, Gatherer: reg, Components: p.Components}
	if js, err := jetstream.New(nc); err == nil && readJS {
		o.JetStream = func() jetstream.JetStream { return js }
	}
	if consumer != nil {
		consumer.Component = component
		o.Consumers = []ConsumerRef{*consumer}
	}
	return o
}
