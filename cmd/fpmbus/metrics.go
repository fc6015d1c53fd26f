package main

import (
	"context"
	"flag"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/internal/observe"
)

// metricsAddrFlag registers --metrics-addr (observe.RegisterAddrFlag).
func metricsAddrFlag(fs *flag.FlagSet, example string) *string {
	return observe.RegisterAddrFlag(fs, example)
}

// serveStatus serves o on addr until stop is called (observe.Serve); a bad address is a usage error.
func serveStatus(addr string, o observe.Options) (stop func(), err error) {
	stop, err = observe.Serve(addr, o)
	return stop, flagUsage(err)
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
