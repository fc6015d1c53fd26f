package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/fpmbus/fpmbus/consumers/trace"
	"github.com/fpmbus/fpmbus/internal/envflag"
	"github.com/fpmbus/fpmbus/internal/flagprefix"
	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/observe"
)

func init() {
	register(command{
		name:    "trace",
		summary: "write Dynamo FPM trace segments (gzip JSONL, sampled | full) from the FPM stream",
		run:     runTrace,
	})
}

// traceOptions are the trace writer's flags (consumers/trace/flags.go), shared with `fpmbus up` (where
// they carry the prefix "trace-"), with their defaults from Dynamo's variables (DYN_FPM_MODE,
// DYN_FPM_OUTPUT_PATH, DYN_FPM_SAMPLE_INTERVAL_MS, DYN_FPM_JSONL_GZ_ROLL_BYTES, DYN_FPM_MAX_SEGMENTS),
// else Dynamo's defaults. A bad variable is reported by config(), unless its flag was given.
type traceOptions struct {
	env   *envflag.Defaults
	flags *trace.Flags
}

// traceFlags registers the trace writer's flags on fs.
func traceFlags(fs *flag.FlagSet, prefix string) *traceOptions {
	env := environment.Defaults(fs)
	return &traceOptions{env: env, flags: traceEnvConfig(env, prefix).RegisterFlags(fs, prefix)}
}

// traceOutputFlags registers what shapes the trace files, for `trace backfill`; the caller registers its
// further flags and calls Done.
func traceOutputFlags(fs *flag.FlagSet, prefix string) *traceOptions {
	env := environment.Defaults(fs)
	return &traceOptions{env: env, flags: traceEnvConfig(env, prefix).RegisterOutputFlags(fs, prefix)}
}

// traceEnvConfig is trace.DefaultConfig with what Dynamo's variables say, read as the defaults of the
// flags named with prefix.
func traceEnvConfig(env *envflag.Defaults, prefix string) *trace.Config {
	c := trace.DefaultConfig()
	text := func(flag, name string) string { return env.Text(flagprefix.Name(prefix, flag), name, "") }
	// The variables' checks admit only what ParseMode and ParsePositive parse.
	if m, err := trace.ParseMode(text("trace-mode", trace.EnvMode)); err == nil {
		c.Mode = m
	}
	if v := text("trace-output", trace.EnvOutputPath); v != "" {
		c.OutputPath = v
	}
	if ms, err := trace.ParsePositive(text("sample-interval", trace.EnvSampleInterval)); err == nil {
		c.SampleInterval = time.Duration(ms) * time.Millisecond
	}
	if n, err := trace.ParsePositive(text("roll-bytes", trace.EnvRollBytes)); err == nil {
		c.RollBytes = n
	}
	if n, err := trace.ParsePositive(text("max-segments", trace.EnvMaxSegments)); err == nil {
		c.MaxSegments = int(n)
	}
	return &c
}

// config turns the flags into a validated trace.Config; a bad value is a usage error naming the flag,
// its variable and the value.
func (o *traceOptions) config() (trace.Config, error) {
	if err := o.env.Err(); err != nil {
		return trace.Config{}, err
	}
	c, err := o.flags.Config()
	return c, usageError(err, trace.ErrInvalidConfig)
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
	topts.flags.RegisterGroupFlags(fs)
	metricsAddr := metricsAddrFlag(fs, "127.0.0.1:9466")
	cfg, err := parseStage(fs, args, scfg, topts.config)
	if err != nil {
		return err
	}
	// Fail before connecting if the output cannot be written (Dynamo's write preflight); a full disk
	// passes, the writer waits for space when it starts.
	if err := trace.ProbeOutput(cfg.OutputPath); err != nil && !fsutil.DiskFull(err) {
		return err
	}
	reg := observe.NewProcessRegistry()
	cfg.Registerer = reg

	nc, js, err := connectAndApply(ctx, conn, scfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	w, err := trace.New(cfg, js, topts.flags.Options()...)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	done := make(chan struct{})
	defer close(done)
	ref := &observe.ConsumerRef{Label: trace.ConsumerName, Group: cfg.Group}
	if gc, err := cfg.PartitionConfig(); err == nil {
		ref.Durables = durablesOf(gc)
	}
	stop, err := serveStatus(*metricsAddr, observe.Standalone("trace", "trace writer", reg, nc, w.Ready(), done, ref, true))
	if err != nil {
		return err
	}
	defer stop()
	rctx, finish := natsconn.Watch(ctx, nc)
	// Run waits until the server has applied its last acks, so closing afterwards loses none.
	err = finish(w.Run(rctx))
	if errors.Is(err, trace.ErrOutputOwned) {
		return fmt.Errorf("%w: %v", errUsage, err) // --group or --trace-output is what changes it
	}
	return err
}
