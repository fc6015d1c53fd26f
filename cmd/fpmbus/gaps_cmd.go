package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/internal/envflag"
	"github.com/fpmbus/fpmbus/internal/flagprefix"
	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/observe"
)

func init() {
	register(command{
		name:    "gaps",
		summary: "detect counter_id gaps per publisher, classify them and publish gap events (gaps report: per-publisher loss)",
		run:     runGaps,
	})
}

// gapsOptions are the gap detector's flags (consumers/gaps/flags.go), shared with `fpmbus up` (where
// they carry the prefix "gaps-"), with their defaults from the environment.
type gapsOptions struct {
	env   *envflag.Defaults
	flags *gaps.Flags
}

// gapsFlags registers the gap detector's flags on fs.
func gapsFlags(fs *flag.FlagSet, prefix string) *gapsOptions {
	o := &gapsOptions{env: environment.Defaults(fs)}
	c := gaps.DefaultConfig()
	c.Group = environment.Or(gaps.EnvGroup, c.Group)
	c.Partitions = o.env.Int(flagprefix.Name(prefix, "gaps-partitions"), gaps.EnvPartitions, c.Partitions)
	o.flags = c.RegisterFlags(fs, prefix)
	return o
}

// config turns the flags into a validated gaps.Config; a bad value is a usage error naming the flag.
func (o *gapsOptions) config() (gaps.Config, error) {
	if err := o.env.Err(); err != nil {
		return gaps.Config{}, err
	}
	c, err := o.flags.Config()
	return c, usageError(err, gaps.ErrInvalidConfig)
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
	reg := observe.NewProcessRegistry()
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
	so := observe.Standalone("gaps", "gap detector", reg, nc, d.Ready(), done,
		&observe.ConsumerRef{Label: gaps.ConsumerName, Group: cfg.Group, Durables: durablesOf(cfg.PartitionConfig())}, true)
	so.Publishers = gapsPublishers{watch}
	stop, err := serveStatus(*metricsAddr, so)
	if err != nil {
		return err
	}
	defer stop()
	// Run flushes the connection after its last acks, so closing afterwards loses none.
	rctx, finish := natsconn.Watch(ctx, nc)
	return finish(d.Run(rctx))
}

func runGapsReport(ctx context.Context, args []string) error {
	fs := newFlagSet("gaps report", "gaps report [--server URL] [--since T] [--json] [--gaps-group NAME]")
	conn := readConnFlags(fs, "gaps-report")
	d := gaps.DefaultConfig()
	group := fs.String("gaps-group", environment.Or(gaps.EnvGroup, d.Group), "gap detector group to report on (env "+gaps.EnvGroup+")")
	bucket := fs.String("state-bucket", d.StateBucket, "KV bucket holding the detector state")
	filter := fs.String("gaps-filter", d.FilterSubject, "FPM subjects counted with --since")
	since := fs.String("since", "", "count messages and gaps stored since this time (RFC 3339, or a duration before now such as 1h); default: everything the detector has seen")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	t, err := gaps.ParseSince(*since, time.Now())
	if err != nil {
		return flagUsage(err)
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
