package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/observe"
)

// metricsAddrFlag registers --metrics-addr, the process's own flag (not a component's): where
// /metrics, /healthz, /status.json and the status page / are served (internal/observe).
func metricsAddrFlag(fs *flag.FlagSet, example string) *string {
	return fs.String("metrics-addr", "", "serve Prometheus /metrics, /healthz, /status.json and the status page / on this address, e.g. "+example+" (empty: off)")
}

// newProcessRegistry returns a registry with the Go runtime and process collectors.
func newProcessRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// serveStatus serves o on addr (observe.Server: /metrics, /healthz, /status.json, /) until stop is
// called. It returns once the listener is open, so a bad address is reported at start, as a usage
// error naming --metrics-addr. The endpoints have no authentication: an address beyond loopback is
// served, with one warning naming it (a Prometheus on another host needs it, and a firewall decides).
// An empty addr (--metrics-addr unset) serves nothing, and stop does nothing.
func serveStatus(addr string, o observe.Options) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: --metrics-addr %q: %v", errUsage, addr, err)
	}
	if host, _, _ := net.SplitHostPort(addr); !natsserver.IsLoopbackHost(host) {
		slog.Warn("--metrics-addr is reachable beyond this host and has no authentication: anyone who reaches it reads the metrics, /healthz and the status page", "addr", addr)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	srv := observe.New(o)
	srv.Start(ln)
	return srv.Stop, nil
}

// standaloneStatus is the status of a standalone command's one component on connection nc: its
// health (starting until ready, degraded while nc reconnects or a check reports a fault), JetStream's
// view through nc (what the component's least-privileged user may read: the streams' infos and its own
// consumers'; none with readJS false, for a user that may read neither), and the consumer it runs
// (nil: none). done ends the wait for ready. The health is exported as fpmbus_component_* by the
// status server, as `up`'s run group is.
func standaloneStatus(process, component string, reg prometheus.Gatherer, nc *nats.Conn, ready, done <-chan struct{}, consumer *observe.ConsumerRef, readJS bool, checks ...func() error) observe.Options {
	p := observe.NewProcess(component)
	p.SetConn(nc)
	for _, check := range checks {
		p.Check(check)
	}
	p.Follow(ready, done)
	o := observe.Options{Process: process, Gatherer: reg, Components: p.Components}
	if js, err := jetstream.New(nc); err == nil && readJS {
		o.JetStream = func() jetstream.JetStream { return js }
	}
	if consumer != nil {
		consumer.Component = component
		o.Consumers = []observe.ConsumerRef{*consumer}
	}
	return o
}

// durablesOf names a consumer group's JetStream consumers, one per partition.
func durablesOf(g durable.GroupConfig) []observe.Durable {
	var out []observe.Durable
	for p := range max(g.Partitions, 1) {
		out = append(out, observe.Durable{Stream: g.ConsumerStreamOf(p), Name: g.ConsumerName(p)})
	}
	return out
}

// gapsPublishers shows a gap detector group's per-publisher state (gaps.PublisherWatch) on the status page.
type gapsPublishers struct{ w *gaps.PublisherWatch }

func (g gapsPublishers) Group() string { return g.w.Group() }

func (g gapsPublishers) Publishers(ctx context.Context) ([]observe.Publisher, error) {
	ps, err := g.w.Publishers(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]observe.Publisher, len(ps))
	for i, p := range ps {
		o := observe.Publisher{Namespace: p.Key.Namespace, Component: p.Key.Component, WorkerID: p.Key.WorkerID, DPRank: p.Key.DPRank,
			State: p.State, Flowing: p.Flowing, Rate: p.Rate, LastSeen: p.LastSeen, Messages: p.Messages, PendingGaps: p.PendingGaps,
			Restarts: p.Restarts, Gaps: map[string]uint64{}, Missing: map[string]uint64{}}
		for _, c := range gaps.Causes {
			o.Gaps[c], o.Missing[c] = p.Gaps.Get(c), p.Missing.Get(c)
		}
		o.GapsTotal, o.MissingTotal = p.Gaps.Total(), p.Missing.Total()
		out[i] = o
	}
	return out, nil
}
