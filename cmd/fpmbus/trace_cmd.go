package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/trace"
	"github.com/fpmbus/fpmbus/internal/flagprefix"
	"github.com/fpmbus/fpmbus/internal/observe"
)

func init() {
	register(command{
		name:    "trace",
		summary: "write Dynamo FPM trace segments (gzip JSONL, sampled | full) from the FPM stream",
		run:     runTrace,
	})
}

// traceOptions holds the trace writer's flags, shared with `fpmbus up` (where they carry the prefix
// "trace-", see flagprefix.go). Defaults come from Dynamo's variables (DYN_FPM_MODE,
// DYN_FPM_OUTPUT_PATH, DYN_FPM_SAMPLE_INTERVAL_MS, DYN_FPM_JSONL_GZ_ROLL_BYTES, DYN_FPM_MAX_SEGMENTS),
// else Dynamo's defaults. Numbers are kept as text until config(), so that a bad flag value is
// reported by config() with its name (in `up` an invalid trace setting disables only the trace writer);
// a bad variable is reported by config() too, through env.
type traceOptions struct {
	maxDeliveries  int
	prefix         string
	env            *envDefaults
	mode           string
	output         string
	sampleInterval string
	rollBytes      string
	maxSegments    string
	producerID     string
	group          string
	filter         string
	stopTimeout    time.Duration
	flushInterval  time.Duration
	maxAckPending  int
	ackWait        time.Duration
}

// traceFlags registers the trace writer's flags on fs: traceOutputFlags plus the durable consumer's.
func traceFlags(fs *flag.FlagSet, prefix string) *traceOptions {
	o, cf := traceOutputFlags(fs, prefix)
	d := trace.DefaultConfig()
	fs.StringVar(&o.group, cf.Name("group"), d.Group, "consumer group: instances with the same name share the producers (consumer <group> on FPM with one partition); split work otherwise with disjoint "+flagprefix.Flag(prefix, "filter")+" and names")
	fs.DurationVar(&o.stopTimeout, cf.Name("stop-timeout"), d.StopTimeout, "on interrupt, how long to keep writing what was already received")
	fs.DurationVar(&o.flushInterval, cf.Name("trace-flush-interval"), d.FlushInterval, "longest a received FPM waits before its line is fsynced and the message acked")
	fs.IntVar(&o.maxAckPending, cf.Name("trace-max-ack-pending"), d.MaxAckPending, "messages the trace consumer may hold unacked (a flush starts at a quarter of it)")
	fs.DurationVar(&o.ackWait, cf.Name("trace-ack-wait"), 0, "ack wait of the trace consumer: an unacked message is redelivered after it (0: automatic, at least 60s)")
	fs.IntVar(&o.maxDeliveries, cf.Name("trace-max-deliveries"), 0, "a message delivered this often, or whose partition was taken over this often after crashes without progress, is dead-lettered (0: 5)")
	cf.Done()
	return o
}

// traceOutputFlags registers what shapes the trace files (mode, path, interval, rolling, retention,
// producer id, filter), shared by the writer and `trace backfill`; the other options keep their
// defaults. The caller registers its further flags with cf and calls cf.Done().
func traceOutputFlags(fs *flag.FlagSet, prefix string) (*traceOptions, *flagprefix.Component) {
	d := trace.DefaultConfig()
	o := &traceOptions{prefix: prefix, env: newEnvDefaults(fs), group: d.Group, stopTimeout: d.StopTimeout, flushInterval: d.FlushInterval, maxAckPending: d.MaxAckPending}
	cf := flagprefix.On(fs, prefix)
	env := func(flag, name, def string) string { return o.env.text(flagprefix.Name(prefix, flag), name, def) }
	fs.StringVar(&o.mode, cf.Name("trace-mode"), env("trace-mode", trace.EnvMode, d.Mode), "capture mode: sampled (newest FPM per key per interval) or full (every FPM) (env "+trace.EnvMode+")")
	fs.StringVar(&o.output, cf.Name("trace-output"), env("trace-output", trace.EnvOutputPath, d.OutputPath), "output path; files are <path without .jsonl[.gz]>.<producer>.<index:06>.jsonl.gz (env "+trace.EnvOutputPath+")")
	fs.StringVar(&o.sampleInterval, cf.Name("sample-interval"), env("sample-interval", trace.EnvSampleInterval, fmt.Sprint(d.SampleInterval.Milliseconds())), "sampled mode interval in milliseconds, a positive integer (env "+trace.EnvSampleInterval+")")
	fs.StringVar(&o.rollBytes, cf.Name("roll-bytes"), env("roll-bytes", trace.EnvRollBytes, fmt.Sprint(d.RollBytes)), "start a new segment before it exceeds this many uncompressed bytes (env "+trace.EnvRollBytes+")")
	fs.StringVar(&o.maxSegments, cf.Name("max-segments"), env("max-segments", trace.EnvMaxSegments, fmt.Sprint(d.MaxSegments)), "segments kept per producer, the active one included (env "+trace.EnvMaxSegments+")")
	fs.StringVar(&o.producerID, cf.Name("producer-id"), "", "file every FPM under this producer id (default: the message's Fpm-Producer header, else its worker_id)")
	fs.StringVar(&o.filter, cf.Name("filter"), d.FilterSubject, "FPM subjects to trace, e.g. fpm.dynamo.backend.>")
	return o, cf
}

// flag is the registered name of the trace flag standalone-named n, for messages.
func (o *traceOptions) flag(n string) string { return flagprefix.Flag(o.prefix, n) }

// config turns the flags into a validated trace.Config; a bad value is a usage error naming the flag,
// its variable and the value.
func (o *traceOptions) config() (trace.Config, error) {
	c := trace.DefaultConfig()
	if err := o.env.err(); err != nil {
		return c, err
	}
	mode, err := trace.ParseMode(o.mode)
	if err != nil {
		return c, fmt.Errorf("%w: %s %q (%s): want sampled or full", errUsage, o.flag("trace-mode"), o.mode, trace.EnvMode)
	}
	c.Mode = mode
	if strings.TrimSpace(o.output) == "" {
		return c, fmt.Errorf("%w: %s %q (%s): blank output path", errUsage, o.flag("trace-output"), o.output, trace.EnvOutputPath)
	}
	c.OutputPath = strings.TrimSpace(o.output)
	ms, err := trace.ParsePositive(o.sampleInterval)
	if err != nil || ms > int64(time.Duration(1<<62)/time.Millisecond) {
		return c, fmt.Errorf("%w: %s %q (%s): want a positive integer (milliseconds)", errUsage, o.flag("sample-interval"), o.sampleInterval, trace.EnvSampleInterval)
	}
	c.SampleInterval = time.Duration(ms) * time.Millisecond
	if c.RollBytes, err = trace.ParsePositive(o.rollBytes); err != nil {
		return c, fmt.Errorf("%w: %s %q (%s): want a positive integer (uncompressed bytes)", errUsage, o.flag("roll-bytes"), o.rollBytes, trace.EnvRollBytes)
	}
	n, err := trace.ParsePositive(o.maxSegments)
	if err != nil || n > 1<<31-1 {
		return c, fmt.Errorf("%w: %s %q (%s): want a positive integer", errUsage, o.flag("max-segments"), o.maxSegments, trace.EnvMaxSegments)
	}
	c.MaxSegments = int(n)
	c.ProducerID = o.producerID
	c.Group = o.group
	c.FilterSubject = o.filter
	c.StopTimeout = o.stopTimeout
	c.FlushInterval = o.flushInterval
	c.MaxAckPending = o.maxAckPending
	c.AckWait = o.ackWait
	if o.maxDeliveries < 0 {
		return c, fmt.Errorf("%w: %s %d: want 0 (the default) or more", errUsage, o.flag("trace-max-deliveries"), o.maxDeliveries)
	}
	c.MaxDeliveries = o.maxDeliveries
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("%w: %v", errUsage, err)
	}
	return c, nil
}

func runTrace(ctx context.Context, args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "backfill":
			return runTraceBackfill(ctx, args[1:])
		case "info":
			return runTraceInfo(ctx, args[1:])
		case "replay":
			return runTraceReplay(ctx, args[1:])
		case "verify":
			return runTraceVerify(ctx, args[1:])
		}
	}
	fs := newFlagSet("trace", "trace [--server URL] [--trace-mode sampled|full] [--trace-output PATH] [--group NAME [--partitions N]] [--filter SUBJECT] …\n       fpmbus trace backfill --since T --until T | --start-seq N --end-seq M [--resume-seq S] [--trace-mode …] [--trace-output …]\n       fpmbus trace info [--json] FILE|DIR…\n       fpmbus trace verify [--json] [--include-active] [--stream | --repair] … OUTPUT\n       fpmbus trace replay FILE|DIR|GLOB|PREFIX… | --from-stream … [--to zmq|stream] [--speed X] …")
	conn := connFlags(fs, "trace")
	scfg := streamFlags(fs)
	topts := traceFlags(fs, "")
	gopts := traceGroupFlags(fs)
	metricsAddr := metricsAddrFlag(fs, "127.0.0.1:9466")
	var member string
	cfg, err := parseStage(fs, args, scfg, func() (trace.Config, error) {
		cfg, err := topts.config()
		if err == nil {
			member, err = gopts.apply(&cfg)
		}
		return cfg, err
	})
	if err != nil {
		return err
	}
	// Fail before connecting if the output cannot be written (Dynamo's write preflight).
	if err := trace.ProbeOutput(cfg.OutputPath); err != nil {
		return err
	}
	reg := newProcessRegistry()
	cfg.Registerer = reg

	nc, js, err := connectAndApply(ctx, conn, scfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	w, err := trace.New(cfg, js, memberOptions(member)...)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	done := make(chan struct{})
	defer close(done)
	ref := &observe.ConsumerRef{Label: trace.ConsumerName, Group: cfg.Group}
	if gc, err := cfg.PartitionConfig(); err == nil {
		ref.Durables = durablesOf(gc)
	}
	stop, err := serveStatus(*metricsAddr, standaloneStatus("trace", "trace writer", reg, nc, w.Ready(), done, ref, true))
	if err != nil {
		return err
	}
	defer stop()
	rctx, finish := watchConn(ctx, nc)
	// Run waits until the server has applied its last acks, so closing afterwards loses none.
	err = finish(w.Run(rctx))
	if errors.Is(err, trace.ErrOutputOwned) {
		return fmt.Errorf("%w: %v", errUsage, err) // --group or --trace-output is what changes it
	}
	return err
}

// traceGroupOptions are the group flags of `fpmbus trace` (`fpmbus up` runs one partition and derives
// its member id from its data directory).
type traceGroupOptions struct {
	partitions int
	pinnedTTL  time.Duration
	member     string
}

func traceGroupFlags(fs *flag.FlagSet) *traceGroupOptions {
	o := &traceGroupOptions{}
	fs.IntVar(&o.partitions, "partitions", trace.DefaultPartitions, "partitions of the --group: 0 (default): one per FPM shard, 1 on the single stream FPM. "+
		"1: one active writer, other instances hot standbys (consumer <group> on FPM). N > 1: the instances share N partitions of the producers (keyed by worker_id) through the "+
		"copy stream FPM_PART_<group> (every message stored twice), except with N FPM shards, where partition p reads shard p directly; a producer's files have one writer at a time. "+
		"All instances need the same --trace-output directory (one host or a shared file system) and the same --partitions; not with --producer-id unless 1")
	fs.DurationVar(&o.pinnedTTL, "pinned-ttl", durable.DefaultPinnedTTL, "how long a crashed instance keeps its partitions before the others take them over (at least 3s)")
	fs.StringVar(&o.member, "member-id", "", "this instance's name in the group (default <host>-<pid>-<random>); a stable id makes a restarted instance take its partitions back at once; never two running instances with one id")
	return o
}

// apply puts the group flags into cfg and returns the member id ("" for the default; trace.New checks
// it); a bad value is a usage error.
func (o *traceGroupOptions) apply(cfg *trace.Config) (string, error) {
	cfg.Partitions, cfg.PinnedTTL = o.partitions, o.pinnedTTL
	if err := cfg.Validate(); err != nil {
		return "", fmt.Errorf("%w: %v", errUsage, err)
	}
	return o.member, nil
}
