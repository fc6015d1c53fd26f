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

// sealOptions holds the flags of `fpmbus seal`, shared with `fpmbus up` (where they carry the prefix
// "seal-", see flagprefix.go).
type sealOptions struct {
	prefix        string
	allowPartial  bool
	durable       string
	partitions    int
	pinnedTTL     time.Duration
	memberID      string
	profileWait   time.Duration
	ackWait       time.Duration
	maxDeliveries int
	maxArtefact   int64
}

func sealFlags(fs *flag.FlagSet, prefix string) *sealOptions {
	o := &sealOptions{prefix: prefix}
	cf := newComponentFlags(fs, prefix)
	fs.BoolVar(&o.allowPartial, cf.name("allow-partial"), false, "seal the valid cells of a run even when some of its cells are rejected (the campaign stays partial)")
	fs.StringVar(&o.durable, cf.name("seal-durable"), seal.DefaultDurable, "the sealer's group: durable consumer name on FPM_BENCH (<name>-<p> on FPM_BENCH_PART_<name> with N > 1 partitions)")
	fs.IntVar(&o.partitions, cf.name("seal-partitions"), seal.DefaultPartitions, "partitions of the runs shared by the instances of "+flagName(prefix, "seal-durable")+
		" (fixed for the group's life; 1: one active sealer, the other instances hot standbys)")
	fs.DurationVar(&o.pinnedTTL, cf.name("seal-pinned-ttl"), seal.DefaultPinnedTTL, fmt.Sprintf("how long a crashed instance keeps its partitions before another instance takes them over (%v to %v)", durable.MinPinnedTTL, durable.MaxPinnedTTL))
	fs.StringVar(&o.memberID, cf.name("seal-member-id"), "", "this instance's name in its group (default <host>-<pid>-<random>)")
	fs.DurationVar(&o.profileWait, cf.name("profile-wait"), seal.DefaultProfileWait, "how long a merged artefact waits for its run's collection profile (fpmbench.profile.<run>) before it is refused")
	fs.DurationVar(&o.ackWait, cf.name("seal-ack-wait"), seal.DefaultAckWait, "ack wait of the partition consumers (held artefacts are kept alive with in-progress acks)")
	fs.IntVar(&o.maxDeliveries, cf.name("seal-max-deliveries"), 0, "a message delivered this often, or whose partition was taken over this often after crashes without progress, is dead-lettered (0: 10)")
	fs.Int64Var(&o.maxArtefact, cf.name("seal-max-artefact-size"), streams.DefaultBenchMaxArtefact,
		"largest merged artefact read, in bytes; one whose "+streams.HeaderBenchSize+" is larger is dead-lettered unread")
	cf.done()
	return o
}

// consumerConfig is the sealer consumer's config for the flags and the streams.
func (o *sealOptions) consumerConfig(scfg streams.Config) (seal.Config, error) {
	name := func(n string) string { return flagName(o.prefix, n) }
	switch {
	case o.partitions < 1 || o.partitions > durable.MaxPartitions:
		return seal.Config{}, fmt.Errorf("%w: %s %d: want 1 to %d", errUsage, name("seal-partitions"), o.partitions, durable.MaxPartitions)
	case o.pinnedTTL < durable.MinPinnedTTL || o.pinnedTTL > durable.MaxPinnedTTL:
		return seal.Config{}, fmt.Errorf("%w: %s %v: want %v to %v", errUsage, name("seal-pinned-ttl"), o.pinnedTTL, durable.MinPinnedTTL, durable.MaxPinnedTTL)
	case o.maxDeliveries < 0:
		return seal.Config{}, fmt.Errorf("%w: %s %d: want 0 (the default) or more", errUsage, name("seal-max-deliveries"), o.maxDeliveries)
	case o.maxArtefact < 1:
		return seal.Config{}, fmt.Errorf("%w: %s %d must be positive", errUsage, name("seal-max-artefact-size"), o.maxArtefact)
	}
	return seal.Config{
		HoldingConfig: durable.HoldingConfig{Durable: o.durable, Partitions: o.partitions, PinnedTTL: o.pinnedTTL,
			AckWait: o.ackWait, MaxDeliveries: o.maxDeliveries},
		AllowPartial: o.allowPartial, ProfileWait: o.profileWait, Streams: scfg, MaxArtefactSize: o.maxArtefact,
	}, nil
}

// consumerOptions are the sealer consumer's options for the flags.
func (o *sealOptions) consumerOptions() []durable.Option {
	return memberOptions(o.memberID)
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
	reg := newProcessRegistry()
	cfg.Sealer, cfg.Registerer = s, reg
	c, err := seal.New(cfg, js, o.consumerOptions()...)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	done := make(chan struct{})
	defer close(done)
	stop, err := serveStatus(*metricsAddr, standaloneStatus("seal", "dataset sealer", reg, nc, c.Ready(), done,
		&observe.ConsumerRef{Label: seal.ConsumerName, Group: cfg.Durable, Durables: durablesOf(cfg.Group())}, true))
	if err != nil {
		return err
	}
	defer stop()
	rctx, finish := watchConn(ctx, nc)
	return finish(c.Run(rctx))
}
