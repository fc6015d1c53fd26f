package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/internal/observe"
)

func init() {
	register(command{
		name:    "gaps",
		summary: "detect counter_id gaps per publisher, classify them and publish gap events (gaps report: per-publisher loss)",
		run:     runGaps,
	})
}

// gapsOptions holds the gap detector's flags, shared with `fpmbus up` (where they carry the prefix
// "gaps-", see flagprefix.go).
type gapsOptions struct {
	maxDeliveries int
	prefix        string
	env           *envDefaults
	group         string
	filter        string
	staleAfter    time.Duration
	markerGrace   time.Duration
	partitions    int
	stateBucket   string
	stopTimeout   time.Duration
	pinnedTTL     time.Duration
}

// gapsFlags registers the gap detector's flags on fs.
func gapsFlags(fs *flag.FlagSet, prefix string) *gapsOptions {
	o := &gapsOptions{prefix: prefix, env: newEnvDefaults(fs)}
	d := gaps.DefaultConfig()
	cf := newComponentFlags(fs, prefix)
	fs.StringVar(&o.group, cf.name("gaps-group"), envOr("FPMBUS_GAPS_GROUP", d.Group), "gap detector group: durable consumer names and state keys; instances of one group share state (env FPMBUS_GAPS_GROUP)")
	fs.StringVar(&o.filter, cf.name("gaps-filter"), d.FilterSubject, "FPM subjects to watch, e.g. fpm.dynamo.>")
	fs.DurationVar(&o.staleAfter, cf.name("stale-after"), d.StaleAfter, "a publisher silent this long (not even a heartbeat) is stale: 5 x the 1 s heartbeat by default")
	fs.DurationVar(&o.markerGrace, cf.name("marker-grace"), d.MarkerGrace, "how long a gap waits for a bridge drop marker before it is classified zmq_drop (stream time)")
	partitions := cf.name("gaps-partitions")
	fs.IntVar(&o.partitions, partitions, o.env.int(partitions, "FPMBUS_GAPS_PARTITIONS", d.Partitions), "partitions of the publishers shared by the instances of "+flagName(prefix, "gaps-group")+" (fixed for the group's life; 1: one active detector, the other instances hot standbys; with FPM shards: one per shard) (env FPMBUS_GAPS_PARTITIONS)")
	fs.StringVar(&o.stateBucket, cf.name("state-bucket"), d.StateBucket, "KV bucket holding each publisher's detector state")
	fs.DurationVar(&o.stopTimeout, cf.name("gaps-stop-timeout"), d.StopTimeout, "on interrupt, how long to keep checkpointing what was already received")
	fs.IntVar(&o.maxDeliveries, cf.name("gaps-max-deliveries"), 0, "a message delivered this often, or whose partition was taken over this often after crashes without progress, is dead-lettered (0: 5)")
	fs.DurationVar(&o.pinnedTTL, cf.name("gaps-pinned-ttl"), d.PinnedTTL, fmt.Sprintf("how long a crashed instance keeps its partitions before another instance of %s takes them over (%v to %v)", flagName(prefix, "gaps-group"), durable.MinPinnedTTL, durable.MaxPinnedTTL))
	cf.done()
	return o
}

// config turns the flags into a validated gaps.Config; a bad value is a usage error naming the flag.
func (o *gapsOptions) config() (gaps.Config, error) {
	c := gaps.DefaultConfig()
	if err := o.env.err(); err != nil {
		return c, err
	}
	c.Group = o.group
	c.FilterSubject = o.filter
	c.StaleAfter = o.staleAfter
	c.MarkerGrace = o.markerGrace
	c.StateBucket = o.stateBucket
	c.StopTimeout = o.stopTimeout
	c.Partitions = o.partitions
	c.PinnedTTL = o.pinnedTTL
	if c.PinnedTTL < durable.MinPinnedTTL || c.PinnedTTL > durable.MaxPinnedTTL {
		return c, fmt.Errorf("%w: %s %v: want %v to %v", errUsage, flagName(o.prefix, "gaps-pinned-ttl"), c.PinnedTTL, durable.MinPinnedTTL, durable.MaxPinnedTTL)
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("%w: %v", errUsage, err)
	}
	if err := c.PartitionConfig().Validate(); err != nil {
		return c, fmt.Errorf("%w: %v", errUsage, err)
	}
	if o.maxDeliveries < 0 {
		return c, fmt.Errorf("%w: %s %d: want 0 (the default) or more", errUsage, flagName(o.prefix, "gaps-max-deliveries"), o.maxDeliveries)
	}
	c.MaxDeliveries = o.maxDeliveries
	return c, nil
}

func runGaps(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "report" {
		return runGapsReport(ctx, args[1:])
	}
	fs := newFlagSet("gaps", "gaps [--server URL] [--stale-after D] [--marker-grace D] [--gaps-partitions N] [--metrics-addr ADDR] … | gaps report [--since T] [--json]")
	conn := connFlags(fs, "gaps")
	scfg := streamFlags(fs)
	gopts := gapsFlags(fs, "")
	metricsAddr := metricsAddrFlag(fs, "127.0.0.1:9465")
	cfg, err := parseStage(fs, args, scfg, gopts.config)
	if err != nil {
		return err
	}
	cfg.StateReplicas, cfg.StateStorage = scfg.Replicas, scfg.Storage
	reg := newProcessRegistry()
	cfg.Registerer = reg

	nc, js, err := connectAndApply(ctx, conn, scfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	d, err := gaps.New(cfg, js)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	done := make(chan struct{})
	defer close(done)
	watch := gaps.NewPublisherWatch(func() jetstream.JetStream { return js }, cfg)
	defer watch.Close()
	so := standaloneStatus("gaps", "gap detector", reg, nc, d.Ready(), done,
		&observe.ConsumerRef{Label: gaps.ConsumerName, Group: cfg.Group, Durables: durablesOf(cfg.PartitionConfig())}, true)
	so.Publishers = gapsPublishers{watch}
	stop, err := serveStatus(*metricsAddr, so)
	if err != nil {
		return err
	}
	defer stop()
	// Run flushes the connection after its last acks, so closing afterwards loses none.
	rctx, finish := watchConn(ctx, nc)
	return finish(d.Run(rctx))
}

// parseSince accepts an RFC 3339 time or a duration before now ("1h", "30m").
func parseSince(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: --since %q: want an RFC 3339 time (2026-05-01T12:00:00Z) or a duration before now (1h)", errUsage, s)
	}
	return t, nil
}

func runGapsReport(ctx context.Context, args []string) error {
	fs := newFlagSet("gaps report", "gaps report [--server URL] [--since T] [--json] [--gaps-group NAME]")
	conn := readConnFlags(fs, "gaps-report")
	d := gaps.DefaultConfig()
	group := fs.String("gaps-group", envOr("FPMBUS_GAPS_GROUP", d.Group), "gap detector group to report on (env FPMBUS_GAPS_GROUP)")
	bucket := fs.String("state-bucket", d.StateBucket, "KV bucket holding the detector state")
	filter := fs.String("gaps-filter", d.FilterSubject, "FPM subjects counted with --since")
	since := fs.String("since", "", "count messages and gaps stored since this time (RFC 3339, or a duration before now such as 1h); default: everything the detector has seen")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	t, err := parseSince(*since, time.Now())
	if err != nil {
		return err
	}
	nc, js, err := connectAndApply(ctx, conn, nil) // reads only: applies nothing
	if err != nil {
		return err
	}
	defer nc.Close()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	rep, err := gaps.BuildReport(rctx, js, gaps.ReportConfig{Group: *group, StateBucket: *bucket, Since: t, FilterSubject: *filter})
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(os.Stdout, rep)
	}
	return rep.WriteText(os.Stdout)
}
