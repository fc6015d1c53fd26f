package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/merge"
	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/observe"
)

func init() {
	register(command{
		name:    "merge",
		summary: "durable benchmark merger: fold rank artefacts from FPM_BENCH into merged artefacts + worker-probe sidecars",
		run:     runMerge,
	})
}

// mergeOptions are the merger's flags (consumers/merge/flags.go), shared with `fpmbus up` (where they
// carry the prefix "merge-"), with the default of --bench-output from the environment.
type mergeOptions struct {
	flags *merge.Flags
}

// mergeFlags registers the merger's flags on fs.
func mergeFlags(fs *flag.FlagSet, prefix string) *mergeOptions {
	c := &merge.Config{Output: environment.Or(merge.EnvOutput, merge.DefaultOutputTemplate)}
	return &mergeOptions{flags: c.RegisterFlags(fs, prefix)}
}

// config builds the consumer's Config (Streams set by the caller when needed); a bad value is a usage
// error naming the flag.
func (o *mergeOptions) config() (merge.Config, error) {
	c, err := o.flags.Config()
	return c, usageError(err, merge.ErrInvalidConfig)
}

// options are the merger's options for the flags.
func (o *mergeOptions) options() []durable.Option { return o.flags.Options() }

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
	reg := observe.NewProcessRegistry()
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
	stop, err := serveStatus(*metricsAddr, observe.Standalone("merge", "benchmark merger", reg, nc, c.Ready(), done,
		&observe.ConsumerRef{Label: merge.ConsumerName, Group: cfg.Durable, Durables: durablesOf(c.Group())}, true))
	if err != nil {
		return err
	}
	defer stop()
	rctx, finish := natsconn.Watch(ctx, nc)
	return finish(c.Run(rctx))
}
