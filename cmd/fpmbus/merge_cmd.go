package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/consumers/merge"
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
	prefix      string
	output      string
	rankTimeout time.Duration
	partition   string
	durable     string
	spoolDir    string
	ackWait     time.Duration
	inlineMax   int
}

// mergeFlags registers the merger's flags on fs.
func mergeFlags(fs *flag.FlagSet, prefix string) *mergeOptions {
	o := &mergeOptions{prefix: prefix}
	cf := newComponentFlags(fs, prefix)
	fs.StringVar(&o.output, cf.name("bench-output"), envOr("FPMBUS_BENCH_OUTPUT", merge.DefaultOutputTemplate),
		"merged artefact path per run ("+merge.RunIDPlaceholder+" = the run id); the sidecar is <stem>_worker_probe<ext> (env FPMBUS_BENCH_OUTPUT)")
	fs.DurationVar(&o.rankTimeout, cf.name("rank-timeout"), merge.DefaultRankTimeout, "report a run incomplete when its ranks have not all arrived this long after the first")
	fs.StringVar(&o.partition, cf.name("merge-partition"), "0/1", "I/N: own the runs whose fnv-1a(run_id) mod N == I (run one instance per partition)")
	fs.StringVar(&o.durable, cf.name("merge-durable"), merge.DefaultDurable, "durable consumer name (\"-pIofN\" is appended when N > 1)")
	fs.StringVar(&o.spoolDir, cf.name("spool-dir"), "", "where rank bodies from the object store are staged while a run merges (default <tmp>/fpmbus-merge)")
	fs.DurationVar(&o.ackWait, cf.name("merge-ack-wait"), merge.DefaultAckWait, "ack wait of the durable (held ranks are kept alive with in-progress acks)")
	fs.IntVar(&o.inlineMax, cf.name("inline-max"), streams.DefaultBenchInlineMax, "largest merged artefact or sidecar published inline; larger ones go to the object store")
	cf.done()
	return o
}

// config builds the consumer's Config (Streams, Logger set by the caller when needed).
func (o *mergeOptions) config() (merge.Config, error) {
	name := func(n string) string { return flagName(o.prefix, n) }
	i, n, ok := strings.Cut(o.partition, "/")
	pi, err1 := strconv.Atoi(i)
	pn, err2 := strconv.Atoi(n)
	if !ok || err1 != nil || err2 != nil || pn < 1 || pi < 0 || pi >= pn {
		return merge.Config{}, fmt.Errorf("%w: %s %q: want I/N with 0 <= I < N", errUsage, name("merge-partition"), o.partition)
	}
	if o.rankTimeout <= 0 {
		return merge.Config{}, fmt.Errorf("%w: %s %v must be positive", errUsage, name("rank-timeout"), o.rankTimeout)
	}
	if !strings.Contains(o.output, merge.RunIDPlaceholder) {
		return merge.Config{}, fmt.Errorf("%w: %s %q must contain %s: the merger writes one artefact per run", errUsage, name("bench-output"), o.output, merge.RunIDPlaceholder)
	}
	if o.inlineMax < 1 {
		return merge.Config{}, fmt.Errorf("%w: %s %d must be positive", errUsage, name("inline-max"), o.inlineMax)
	}
	return merge.Config{
		Durable: o.durable, Partition: pi, Partitions: pn, RankTimeout: o.rankTimeout, Output: o.output,
		SpoolDir: o.spoolDir, AckWait: o.ackWait, InlineMax: o.inlineMax,
	}, nil
}

func runMerge(ctx context.Context, args []string) error {
	fs := newFlagSet("merge", "merge [--server URL] [--bench-output PATH] [--rank-timeout D] [--merge-partition I/N]")
	conn := connFlags(fs, "merge")
	scfg := streamFlags(fs)
	o := mergeFlags(fs, "")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := o.config()
	if err != nil {
		return err
	}
	if err := scfg.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	cfg.Streams = scfg
	nc, js, err := connectAndApply(ctx, conn, scfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	c, err := merge.New(js, cfg)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	rctx, finish := watchConn(ctx, nc)
	errc := make(chan error, 1)
	go func() { errc <- c.Run(rctx) }()
	select {
	case err := <-errc:
		return finish(err)
	case <-rctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Close(sctx); err != nil {
		slog.Warn("merger did not stop in time", "error", err)
	}
	return finish(<-errc)
}
