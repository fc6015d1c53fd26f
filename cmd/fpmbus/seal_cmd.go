package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/seal"
	"github.com/fpmbus/fpmbus/streams"
)

func init() {
	register(command{
		name:    "seal",
		summary: "durable dataset sealer: merged artefacts + collection profiles into KV FPM_DATASETS (first writer wins)",
		run:     runSeal,
	})
}

// sealOptions holds the flags of `fpmbus seal`, shared with `fpmbus up` (where they carry the prefix
// "seal-", see flagprefix.go).
type sealOptions struct {
	allowPartial bool
	durable      string
	profileWait  time.Duration
	ackWait      time.Duration
}

func sealFlags(fs *flag.FlagSet, prefix string) *sealOptions {
	o := &sealOptions{}
	cf := newComponentFlags(fs, prefix)
	fs.BoolVar(&o.allowPartial, cf.name("allow-partial"), false, "seal the valid cells of a run even when some of its cells are rejected (the campaign stays partial)")
	fs.StringVar(&o.durable, cf.name("seal-durable"), seal.DefaultDurable, "durable consumer name on FPM_BENCH")
	fs.DurationVar(&o.profileWait, cf.name("profile-wait"), 10*time.Minute, "how long a merged artefact waits for its run's collection profile (fpmbench.profile.<run>) before it is refused")
	fs.DurationVar(&o.ackWait, cf.name("seal-ack-wait"), 2*time.Minute, "ack wait of the durable")
	cf.done()
	return o
}

// consumerConfig is the sealer consumer's config for the flags and the streams.
func (o *sealOptions) consumerConfig(scfg streams.Config) seal.ConsumerConfig {
	return seal.ConsumerConfig{Durable: o.durable, AllowPartial: o.allowPartial, ProfileWait: o.profileWait, AckWait: o.ackWait, Streams: scfg}
}

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
	s, err := seal.New(kv, seal.WithSource(source))
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	return s, js, nc, nil
}

func runSeal(ctx context.Context, args []string) error {
	fs := newFlagSet("seal", "seal [--server URL] [--allow-partial] [--seal-durable NAME] [--profile-wait D]")
	conn := connFlags(fs, "seal")
	scfg := streamFlags(fs)
	o := sealFlags(fs, "")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	s, js, nc, err := openSealer(ctx, conn, scfg, "fpmbus seal")
	if err != nil {
		return err
	}
	defer nc.Close()
	c, err := seal.NewConsumer(js, s, o.consumerConfig(*scfg))
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
		slog.Warn("sealer did not stop in time", "error", err)
	}
	return finish(<-errc)
}
