package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

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

// sealOptions holds the flags of `fpmbus seal`.
type sealOptions struct {
	allowPartial bool
	durable      string
	profileWait  time.Duration
	ackWait      time.Duration
}

func sealFlags(fs *flag.FlagSet) *sealOptions {
	o := &sealOptions{}
	fs.BoolVar(&o.allowPartial, "allow-partial", false, "seal the valid cells of a run even when some of its cells are rejected (the campaign stays partial)")
	fs.StringVar(&o.durable, "seal-durable", seal.DefaultDurable, "durable consumer name on FPM_BENCH")
	fs.DurationVar(&o.profileWait, "profile-wait", 10*time.Minute, "how long a merged artefact waits for its run's collection profile (fpmbench.profile.<run>) before it is refused")
	fs.DurationVar(&o.ackWait, "seal-ack-wait", 2*time.Minute, "ack wait of the durable")
	return o
}

// openSealer connects, creates FPM_DATASETS idempotently and returns a sealer on it.
func openSealer(ctx context.Context, conn *streams.ConnConfig, scfg *streams.Config, source string) (*seal.Sealer, jetstream.JetStream, func(), error) {
	if err := scfg.Validate(); err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	nc, err := streams.Connect(*conn)
	if err != nil {
		return nil, nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
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
	return s, js, nc.Close, nil
}

func runSeal(ctx context.Context, args []string) error {
	fs := newFlagSet("seal", "seal [--server URL] [--allow-partial] [--seal-durable NAME] [--profile-wait D]")
	conn := connFlags(fs, "seal")
	scfg := streamFlags(fs)
	o := sealFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	s, js, closeConn, err := openSealer(ctx, conn, scfg, "fpmbus seal")
	if err != nil {
		return err
	}
	defer closeConn()
	c, err := seal.NewConsumer(js, s, seal.ConsumerConfig{Durable: o.durable, AllowPartial: o.allowPartial,
		ProfileWait: o.profileWait, AckWait: o.ackWait, Streams: *scfg})
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Close(sctx); err != nil {
		slog.Warn("sealer did not stop in time", "error", err)
	}
	return <-errc
}
