package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/seal"
	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/observe"
	"github.com/fpmbus/fpmbus/streams"
)

func init() {
	register(command{
		name:    "seal",
		summary: "durable dataset sealer: merged artefacts + collection profiles into KV FPM_DATASETS (first writer wins)",
		run:     runSeal,
	})
}

// sealOptions are the sealer's flags (consumers/seal/flags.go), shared with `fpmbus up` (where they
// carry the prefix "seal-").
type sealOptions struct {
	flags *seal.Flags
}

func sealFlags(fs *flag.FlagSet, prefix string) *sealOptions {
	return &sealOptions{flags: (&seal.Config{}).RegisterFlags(fs, prefix)}
}

// consumerConfig is the sealer consumer's config for the flags and the streams; a bad value is a usage
// error naming the flag.
func (o *sealOptions) consumerConfig(scfg streams.Config) (seal.Config, error) {
	c, err := o.flags.Config(scfg)
	return c, usageError(err, seal.ErrInvalidConfig)
}

// consumerOptions are the sealer consumer's options for the flags.
func (o *sealOptions) consumerOptions() []durable.Option { return o.flags.Options() }

// openSealer connects, creates FPM_DATASETS idempotently and returns a sealer on it, and the connection,
// which the caller closes.
func openSealer(ctx context.Context, conn *connOptions, scfg *streams.Config, source string) (*seal.Sealer, jetstream.JetStream, *nats.Conn, error) {
	if err := scfg.Validate(); err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	// The bucket is all a sealer needs; the consumer applies the streams it reads itself.
	nc, js, err := connectAndApply(ctx, conn, nil)
	if err != nil {
		return nil, nil, nil, err
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	kv, err := seal.OpenBucket(octx, js, *scfg)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	s, err := seal.NewSealer(kv, seal.WithSource(source))
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	return s, js, nc, nil
}

func runSeal(ctx context.Context, args []string) error {
	fs := newFlagSet("seal", "seal [--server URL] [--allow-partial] [--seal-durable NAME] [--seal-partitions N] [--seal-member-id ID] [--profile-wait D]")
	conn := connFlags(fs, "seal")
	scfg := streamFlags(fs)
	o := sealFlags(fs, "")
	metricsAddr := metricsAddrFlag(fs, "127.0.0.1:9468")
	cfg, err := parseStage(fs, args, scfg, func() (seal.Config, error) { return o.consumerConfig(*scfg) })
	if err != nil {
		return err
	}
	s, js, nc, err := openSealer(ctx, conn, scfg, "fpmbus seal")
	if err != nil {
		return err
	}
	defer nc.Close()
	reg := observe.NewProcessRegistry()
	cfg.Sealer, cfg.Registerer = s, reg
	c, err := seal.New(cfg, js, o.consumerOptions()...)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	done := make(chan struct{})
	defer close(done)
	stop, err := serveStatus(*metricsAddr, observe.Standalone("seal", "dataset sealer", reg, nc, c.Ready(), done,
		&observe.ConsumerRef{Label: seal.ConsumerName, Group: cfg.Durable, Durables: durablesOf(cfg.Group())}, true))
	if err != nil {
		return err
	}
	defer stop()
	rctx, finish := natsconn.Watch(ctx, nc)
	return finish(c.Run(rctx))
}
