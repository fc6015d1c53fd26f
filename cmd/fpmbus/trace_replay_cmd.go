package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/producer"
	"github.com/fpmbus/fpmbus/replay"
	"github.com/fpmbus/fpmbus/streams"
)

// runTraceReplay is `fpmbus trace replay`: drive any FPM consumer from a recording (trace segments, or
// a range of stream FPM) at the recorded pace, through ZMQ PUB sockets exactly like Dynamo's or straight
// onto stream FPM under another namespace, and report how faithful the replay was.
func runTraceReplay(ctx context.Context, args []string) error {
	fs := newFlagSet("trace replay", "trace replay FILE|DIR|GLOB|PREFIX… | --from-stream [--server URL] (--since T [--until T] | --start-seq N [--end-seq M])\n"+
		"                          [--to zmq|stream] [--speed X] [--max-rate N] [--loop N] [--start-at T] [--duration D] [--info | --dry-run] …\n\n"+
		"Records are replayed in observed_at_unix_ms order (ties by line order) at their recorded offsets\n"+
		"from the window's start, scaled by --speed. The report (a table, or --json) goes to stdout, progress\n"+
		"lines to stderr.")
	conn := connFlags(fs, "trace-replay")
	env := environment.Defaults(fs)
	rf := replay.RegisterFlags(fs, env.Int("fpm-port", envFPMPort, producer.DefaultBasePort), envSource(envFPMPort))
	src := replay.RegisterSourceFlags(fs)
	info := fs.Bool("info", false, "print the recording's shape (duration, per-rank rate, inter-arrival p50/p99) and exit")
	dryRun := fs.Bool("dry-run", false, "print the plan (duration, per-rank rate and inter-arrival p50/p99 at --speed, where each rank goes) and exit")
	asJSON := fs.Bool("json", false, "print the report (or --info / --dry-run) as JSON instead of a table")
	summaryJSON := fs.String("summary-json", "", "also write the report as JSON to this file")
	recordsCSV := fs.String("records-csv", "", "write one CSV row per record sent to this file: rank, scheduled and actual offset, lateness, outcome")
	progressEvery := fs.Int("progress-every", 10000, "print a progress line on stderr every N records (0: none)")
	paths, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if err := env.Err(); err != nil {
		return err
	}
	pcfg, err := rf.PlanConfig()
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	tcfg, err := rf.Config()
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	switch {
	case *info && *dryRun:
		return fmt.Errorf("%w: --info and --dry-run exclude each other", errUsage)
	case *progressEvery < 0:
		return fmt.Errorf("%w: --progress-every %d: want >= 0", errUsage, *progressEvery)
	}
	if err := src.Check(paths); err != nil {
		return flagUsage(err)
	}

	// The connection, when the source or the target is the stream.
	var js jetstream.JetStream
	if src.FromStream() || tcfg.Target == replay.TargetStream && !*info && !*dryRun {
		nc, njs, err := connectAndApply(ctx, conn, nil)
		if err != nil {
			return err
		}
		defer nc.Close()
		js, tcfg.Stream.Conn = njs, nc
		if tcfg.Target == replay.TargetStream {
			// Publish as the bridge does: to stream FPM, or with shards to each key's shard.
			n, err := streams.DiscoverFPMShards(ctx, js)
			if err != nil {
				return fmt.Errorf("--to stream: %w", err)
			}
			if n == 0 {
				return fmt.Errorf("--to stream: stream %s: %w (create it with `fpmbus streams apply` or run a bridge first)", streams.StreamFPM, jetstream.ErrStreamNotFound)
			}
			tcfg.Stream.FPMShards = n
		}
	}

	rec, err := src.Read(ctx, js, paths)
	if err != nil {
		return flagUsage(err)
	}
	for _, d := range rec.Damaged {
		slog.Warn("segment damaged: replaying what precedes the damage", "file", d.File, "offset", d.Offset, "reason", d.Reason)
	}
	if rec.Invalid > 0 {
		slog.Warn("records breaking the trace schema are skipped", "count", rec.Invalid, "first", rec.InvalidExamples[0])
	}

	if *info {
		return rec.WriteInfo(os.Stdout, *asJSON)
	}

	plan, err := replay.NewPlan(rec, pcfg)
	if err != nil {
		if errors.Is(err, replay.ErrUnknownWorker) || errors.Is(err, replay.ErrInvalidPlan) {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		return err
	}
	if len(plan.Steps) == 0 {
		return fmt.Errorf("%w: nothing to replay: %d records read, none in the window", errUsage, len(rec.Records))
	}
	var opts []replay.Option
	opts = append(opts, replay.WithLogger(slog.Default()))
	if *progressEvery > 0 {
		opts = append(opts, replay.WithProgress(os.Stderr, *progressEvery))
	}
	var csvFile *os.File
	if *recordsCSV != "" && !*dryRun {
		if csvFile, err = fsutil.CreateRegular(*recordsCSV, 0o644); err != nil {
			return fmt.Errorf("--records-csv: %w", err)
		}
		defer csvFile.Close()
		opts = append(opts, replay.WithRecordsCSV(csvFile))
	}
	r, err := replay.New(plan, tcfg, opts...)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *dryRun {
		return replay.WritePlan(os.Stdout, plan, r, *asJSON)
	}

	report, err := r.Run(ctx)
	if report == nil {
		return err
	}
	if csvFile != nil {
		if cerr := csvFile.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("--records-csv: %w", cerr)
		}
	}
	if *summaryJSON != "" {
		if werr := report.WriteJSONFile(*summaryJSON); werr != nil {
			err = errors.Join(err, fmt.Errorf("--summary-json: %w", werr))
		}
	}
	werr := report.WriteText
	if *asJSON {
		werr = report.WriteJSON
	}
	return errors.Join(err, werr(os.Stdout), notDelivered(report))
}

// exitNotDelivered is the exit status of a replay that ran but did not deliver every record it sent:
// some went out on a ZMQ socket without a subscriber (libzmq dropped them) or were refused.
const exitNotDelivered = 3

type notDeliveredError struct{ undelivered, failed, sockets int }

func (e *notDeliveredError) Error() string {
	return fmt.Sprintf("not every record was delivered: %d sent while their socket had no subscriber (%d sockets, named in the report), %d failed",
		e.undelivered, e.sockets, e.failed)
}
func (e *notDeliveredError) ExitCode() int { return exitNotDelivered }

// notDelivered is the error of a report with records sent but not delivered (nil when there are none).
func notDelivered(rep *replay.Report) error {
	o := &rep.Overall
	if o.Undelivered == 0 && o.Failed == 0 {
		return nil
	}
	return &notDeliveredError{undelivered: o.Undelivered, failed: o.Failed, sockets: len(rep.NoSubscriber())}
}

// envSource names variable v when it is set (so errors about its value blame it), else "".
func envSource(v string) string {
	if _, set, _ := environment.Value(v); set {
		return v
	}
	return ""
}
