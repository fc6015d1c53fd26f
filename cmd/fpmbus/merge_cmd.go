package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/merge"
	"github.com/fpmbus/fpmbus/internal/observe"
	"github.com/fpmbus/fpmbus/streams"
)

func init() {
	register(command{
		name:    "merge",
		summary: "durable benchmark merger: fold rank artefacts from FPM_BENCH into merged artefacts + worker-probe sidecars",
		run:     runMerge,
	})
}

// mergeOptions holds the flags of `fpmbus merge`; `fpmbus up` registers the same flags with mergeFlags
// (with the prefix "merge-", see flagprefix.go) and starts the consumer with config().
type mergeOptions struct {
	prefix        string
	fs            *flag.FlagSet
	output        string
	rankTimeout   time.Duration
	partition     string // deprecated I/N
	partitions    int
	pinnedTTL     time.Duration
	memberID      string
	durable       string
	spoolDir      string
	ackWait       time.Duration
	maxDeliveries int
	inlineMax     int
	maxArtefact   int64
}

// mergeFlags registers the merger's flags on fs.
func mergeFlags(fs *flag.FlagSet, prefix string) *mergeOptions {
	o := &mergeOptions{prefix: prefix, fs: fs}
	cf := newComponentFlags(fs, prefix)
	fs.StringVar(&o.output, cf.name("bench-output"), envOr("FPMBUS_BENCH_OUTPUT", merge.DefaultOutputTemplate),
		"merged artefact path per run ("+merge.RunIDPlaceholder+" = the run id); the sidecar is <stem>_worker_probe<ext> (env FPMBUS_BENCH_OUTPUT)")
	fs.DurationVar(&o.rankTimeout, cf.name("rank-timeout"), merge.DefaultRankTimeout, "report a run incomplete when its ranks have not all arrived this long after the first")
	fs.IntVar(&o.partitions, cf.name("merge-partitions"), merge.DefaultPartitions, "partitions of the runs (keyed by run_id) shared by the instances of "+flagName(prefix, "merge-durable")+
		" (fixed for the group's life; 1: one active merger, the other instances hot standbys)")
	fs.DurationVar(&o.pinnedTTL, cf.name("merge-pinned-ttl"), merge.DefaultPinnedTTL, fmt.Sprintf("how long a crashed instance keeps its partitions before another instance takes them over (%v to %v)", durable.MinPinnedTTL, durable.MaxPinnedTTL))
	fs.StringVar(&o.memberID, cf.name("merge-member-id"), "", "this instance's name in its group (default <host>-<pid>-<random>)")
	fs.StringVar(&o.partition, cf.name("merge-partition"), "", "deprecated: I/N sets "+flagName(prefix, "merge-partitions")+" N (I is ignored: the group assigns the runs)")
	fs.StringVar(&o.durable, cf.name("merge-durable"), merge.DefaultDurable, "the merger's group: durable consumer name on FPM_BENCH (<name>-<p> on FPM_BENCH_PART_<name> with N > 1 partitions)")
	fs.StringVar(&o.spoolDir, cf.name("spool-dir"), "", "where rank bodies from the object store are staged while a run merges (default <tmp>/fpmbus-merge)")
	fs.DurationVar(&o.ackWait, cf.name("merge-ack-wait"), merge.DefaultAckWait, "ack wait of the partition consumers (held ranks are kept alive with in-progress acks)")
	fs.IntVar(&o.maxDeliveries, cf.name("merge-max-deliveries"), 0, "a message delivered this often, or whose partition was taken over this often after crashes without progress, is dead-lettered (0: 10)")
	fs.IntVar(&o.inlineMax, cf.name("inline-max"), streams.DefaultBenchInlineMax, "largest merged artefact or sidecar published inline; larger ones go to the object store")
	fs.Int64Var(&o.maxArtefact, cf.name("merge-max-artefact-size"), streams.DefaultBenchMaxArtefact,
		"largest rank artefact or probe replies body read, in bytes; a rank whose "+streams.HeaderBenchSize+" is larger rejects its run (rule artefact_size) unread")
	cf.done()
	return o
}

// config builds the consumer's Config (Streams set by the caller when needed).
func (o *mergeOptions) config() (merge.Config, error) {
	name := func(n string) string { return flagName(o.prefix, n) }
	partitions := o.partitions
	if o.partition != "" {
		i, n, ok := strings.Cut(o.partition, "/")
		pi, err1 := strconv.Atoi(i)
		pn, err2 := strconv.Atoi(n)
		if !ok || err1 != nil || err2 != nil || pn < 1 || pi < 0 || pi >= pn {
			return merge.Config{}, fmt.Errorf("%w: %s %q: want I/N with 0 <= I < N", errUsage, name("merge-partition"), o.partition)
		}
		if o.fs != nil && flagGiven(o.fs, prefixedName(o.prefix, "merge-partitions")) {
			slog.Warn(name("merge-partition") + " is deprecated and ignored: " + name("merge-partitions") + " is given")
		} else {
			slog.Warn(name("merge-partition")+" is deprecated: the instances of a group share the runs; using "+name("merge-partitions")+" N",
				"partitions", pn, "ignored_index", pi)
			partitions = pn
		}
	}
	if partitions < 1 || partitions > durable.MaxPartitions {
		return merge.Config{}, fmt.Errorf("%w: %s %d: want 1 to %d", errUsage, name("merge-partitions"), partitions, durable.MaxPartitions)
	}
	if o.pinnedTTL < durable.MinPinnedTTL || o.pinnedTTL > durable.MaxPinnedTTL {
		return merge.Config{}, fmt.Errorf("%w: %s %v: want %v to %v", errUsage, name("merge-pinned-ttl"), o.pinnedTTL, durable.MinPinnedTTL, durable.MaxPinnedTTL)
	}
	if o.rankTimeout <= 0 {
		return merge.Config{}, fmt.Errorf("%w: %s %v must be positive", errUsage, name("rank-timeout"), o.rankTimeout)
	}
	if !strings.Contains(o.output, merge.RunIDPlaceholder) {
		return merge.Config{}, fmt.Errorf("%w: %s %q must contain %s: the merger writes one artefact per run", errUsage, name("bench-output"), o.output, merge.RunIDPlaceholder)
	}
	if o.maxDeliveries < 0 {
		return merge.Config{}, fmt.Errorf("%w: %s %d: want 0 (the default) or more", errUsage, name("merge-max-deliveries"), o.maxDeliveries)
	}
	if o.inlineMax < 1 {
		return merge.Config{}, fmt.Errorf("%w: %s %d must be positive", errUsage, name("inline-max"), o.inlineMax)
	}
	if o.maxArtefact < 1 {
		return merge.Config{}, fmt.Errorf("%w: %s %d must be positive", errUsage, name("merge-max-artefact-size"), o.maxArtefact)
	}
	if err := merge.CheckOutputTemplate(o.output); err != nil {
		return merge.Config{}, fmt.Errorf("%w: %s: %v", errUsage, name("bench-output"), err)
	}
	return merge.Config{
		HoldingConfig: durable.HoldingConfig{Durable: o.durable, Partitions: partitions, PinnedTTL: o.pinnedTTL,
			AckWait: o.ackWait, MaxDeliveries: o.maxDeliveries},
		RankTimeout: o.rankTimeout, Output: o.output, SpoolDir: o.spoolDir, InlineMax: o.inlineMax, MaxArtefactSize: o.maxArtefact,
	}, nil
}

// options are the merger's options for the flags.
func (o *mergeOptions) options() []durable.Option {
	return memberOptions(o.memberID)
}

func runMerge(ctx context.Context, args []string) error {
	fs := newFlagSet("merge", "merge [--server URL] [--bench-output PATH] [--rank-timeout D] [--merge-partitions N] [--merge-member-id ID]")
	conn := connFlags(fs, "merge")
	scfg := streamFlags(fs)
	o := mergeFlags(fs, "")
	metricsAddr := metricsAddrFlag(fs, "127.0.0.1:9467")
	cfg, err := parseStage(fs, args, scfg, o.config)
	if err != nil {
		return err
	}
	cfg.Streams = scfg
	reg := newProcessRegistry()
	cfg.Registerer = reg
	nc, js, err := connectAndApply(ctx, conn, scfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	c, err := merge.New(cfg, js, o.options()...)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	done := make(chan struct{})
	defer close(done)
	stop, err := serveStatus(*metricsAddr, standaloneStatus("merge", "benchmark merger", reg, nc, c.Ready(), done,
		&observe.ConsumerRef{Label: merge.ConsumerName, Group: cfg.Durable, Durables: durablesOf(c.Group())}, true))
	if err != nil {
		return err
	}
	defer stop()
	rctx, finish := watchConn(ctx, nc)
	return finish(c.Run(rctx))
}
