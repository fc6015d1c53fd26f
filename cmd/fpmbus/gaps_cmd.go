package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/consumers/partition"
	"github.com/fpmbus/fpmbus/streams"
)

func init() {
	register(command{
		name:    "gaps",
		summary: "detect counter_id gaps per publisher, classify them and publish gap events (gaps report: per-publisher loss)",
		run:     runGaps,
	})
}

// gapsOptions holds the gap detector's flags, shared with `fpmbus up`.
type gapsOptions struct {
	group       string
	filter      string
	staleAfter  time.Duration
	markerGrace time.Duration
	partitions  int
	stateBucket string
	stopTimeout time.Duration
	pinnedTTL   time.Duration
}

// gapsFlags registers the gap detector's flags on fs.
func gapsFlags(fs *flag.FlagSet) *gapsOptions {
	o := &gapsOptions{}
	d := gaps.DefaultConfig()
	fs.StringVar(&o.group, "gaps-group", envOr("FPMBUS_GAPS_GROUP", d.Group), "gap detector group: durable consumer names and state keys; instances of one group share state (env FPMBUS_GAPS_GROUP)")
	fs.StringVar(&o.filter, "gaps-filter", d.FilterSubject, "FPM subjects to watch, e.g. fpm.dynamo.>")
	fs.DurationVar(&o.staleAfter, "stale-after", d.StaleAfter, "a publisher silent this long (not even a heartbeat) is stale: 5 x the 1 s heartbeat by default")
	fs.DurationVar(&o.markerGrace, "marker-grace", d.MarkerGrace, "how long a gap waits for a bridge drop marker before it is classified zmq_drop (stream time)")
	fs.IntVar(&o.partitions, "gaps-partitions", envIntOr("FPMBUS_GAPS_PARTITIONS", d.Partitions), "partitions of the publishers shared by the instances of --gaps-group (fixed for the group's life; 1: one active detector, the other instances hot standbys) (env FPMBUS_GAPS_PARTITIONS)")
	fs.StringVar(&o.stateBucket, "state-bucket", d.StateBucket, "KV bucket holding each publisher's detector state")
	fs.DurationVar(&o.stopTimeout, "gaps-stop-timeout", d.StopTimeout, "on interrupt, how long to keep checkpointing what was already received")
	fs.DurationVar(&o.pinnedTTL, "gaps-pinned-ttl", d.PinnedTTL, fmt.Sprintf("how long a crashed instance keeps its partitions before another instance of --gaps-group takes them over (%v to %v)", partition.MinPinnedTTL, partition.MaxPinnedTTL))
	return o
}

// config turns the flags into a validated gaps.Config; a bad value is a usage error naming the flag.
func (o *gapsOptions) config() (gaps.Config, error) {
	c := gaps.DefaultConfig()
	c.Group = o.group
	c.FilterSubject = o.filter
	c.StaleAfter = o.staleAfter
	c.MarkerGrace = o.markerGrace
	c.StateBucket = o.stateBucket
	c.StopTimeout = o.stopTimeout
	c.Partitions = o.partitions
	c.PinnedTTL = o.pinnedTTL
	if c.PinnedTTL < partition.MinPinnedTTL || c.PinnedTTL > partition.MaxPinnedTTL {
		return c, fmt.Errorf("%w: --gaps-pinned-ttl %v: want %v to %v", errUsage, c.PinnedTTL, partition.MinPinnedTTL, partition.MaxPinnedTTL)
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("%w: %v", errUsage, err)
	}
	if err := c.PartitionConfig().Validate(); err != nil {
		return c, fmt.Errorf("%w: %v", errUsage, err)
	}
	return c, nil
}

func runGaps(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "report" {
		return runGapsReport(ctx, args[1:])
	}
	fs := newFlagSet("gaps", "gaps [--server URL] [--stale-after D] [--marker-grace D] [--gaps-partitions N] [--metrics-addr ADDR] … | gaps report [--since T] [--json]")
	conn := connFlags(fs, "gaps")
	scfg := streamFlags(fs)
	gopts := gapsFlags(fs)
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus /metrics on this address, e.g. 127.0.0.1:9465 (empty: off)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := gopts.config()
	if err != nil {
		return err
	}
	if err := scfg.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	cfg.StateReplicas, cfg.StateStorage = scfg.Replicas, scfg.Storage
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Registerer = reg

	nc, js, err := connectAndApply(ctx, conn, scfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	d, err := gaps.New(cfg, js, gaps.WithLogger(slog.Default()))
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *metricsAddr != "" {
		stop, err := serveMetrics(*metricsAddr, reg)
		if err != nil {
			return fmt.Errorf("%w: --metrics-addr %q: %v", errUsage, *metricsAddr, err)
		}
		defer stop()
	}
	// Run flushes the connection after its last acks, so closing afterwards loses none.
	return d.Run(ctx)
}

// envIntOr is the integer in environment variable name, or def when unset or not a number.
func envIntOr(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return def
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
	conn := connFlags(fs, "gaps-report")
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
	nc, err := streams.Connect(*conn)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	rep, err := gaps.BuildReport(rctx, js, gaps.ReportConfig{Group: *group, StateBucket: *bucket, Since: t, FilterSubject: *filter})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return rep.WriteText(os.Stdout)
}
