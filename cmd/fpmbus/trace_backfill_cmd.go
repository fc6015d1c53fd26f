package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/fpmbus/fpmbus/consumers/trace"
	"github.com/fpmbus/fpmbus/streams"
)

// traceBackfillSynopsis is the usage of `fpmbus trace backfill`.
const traceBackfillSynopsis = "trace backfill [--server URL] (--since T [--until T] | --start-seq N [--end-seq M]) [--resume-seq S] [--trace-mode sampled|full] [--trace-output PATH] …\n\n" +
	"Times are RFC 3339 (2026-06-30T12:00:00Z) or Unix milliseconds, compared with the stream's\n" +
	"timestamps; bounds are inclusive, an open end is the stream's last message at the start.\n" +
	"Lines the output holds already are not written again; an interrupted backfill prints the\n" +
	"--resume-seq to run it again with."

// runTraceBackfill is `fpmbus trace backfill`: replay a range of stream FPM into trace segments with an
// ordered consumer (no durable consumer is created or touched; nothing is acked), through the trace
// writer's own code path.
func runTraceBackfill(ctx context.Context, args []string) error {
	fs := newFlagSet("trace backfill", traceBackfillSynopsis)
	conn := connFlags(fs, "trace-backfill")
	topts := traceOutputFlags(fs, "")
	topts.flags.Done()
	since := fs.String("since", "", "replay messages stored at or after this time")
	until := fs.String("until", "", "replay messages stored at or before this time")
	startSeq := fs.Uint64("start-seq", 0, "first stream sequence to replay")
	endSeq := fs.Uint64("end-seq", 0, "last stream sequence to replay")
	resumeSeq := fs.Uint64("resume-seq", 0, "continue an interrupted backfill of the same range at this stream sequence (the one it printed)")
	progress := progressFlag(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := topts.config()
	if err != nil {
		return err
	}
	rng := trace.BackfillRange{StartSeq: *startSeq, EndSeq: *endSeq, ResumeSeq: *resumeSeq}
	if rng.Since, err = streams.ParseTimeBound("--since", *since); err != nil {
		return flagUsage(err)
	}
	if rng.Until, err = streams.ParseTimeBound("--until", *until); err != nil {
		return flagUsage(err)
	}
	if (rng.StartSeq != 0 || rng.EndSeq != 0) && (*since != "" || *until != "") {
		return fmt.Errorf("%w: --since/--until and --start-seq/--end-seq select the range in two ways: use one", errUsage)
	}
	show, err := progressMode(*progress, os.Stderr)
	if err != nil {
		return err
	}
	if err := trace.ProbeOutput(cfg.OutputPath); err != nil {
		return err
	}

	nc, js, err := connectAndApply(ctx, conn, nil) // reads only: applies nothing
	if err != nil {
		return err
	}
	defer nc.Close()
	rep := newProgressMeter(show, progressOut, "backfill", "messages")
	res, err := trace.Backfill(ctx, cfg, js, rng, func(bp trace.BackfillProgress) {
		rep.Update(bp.Done, bp.Total, fmt.Sprintf("stream sequence %d", bp.Seq))
	})
	rep.Finish()
	if err != nil && res.Resume == nil {
		if errors.Is(err, trace.ErrBadRange) || errors.Is(err, trace.ErrInvalidConfig) {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		return err
	}
	switch {
	case res.Messages == 0 && err == nil:
		fmt.Println("backfill: the range holds no message on", cfg.FilterSubject)
	case res.Messages > 0:
		res.WriteText(os.Stdout, cfg)
	}
	if err != nil {
		return fmt.Errorf("backfill interrupted: %w; %s", err, res.Resume.Hint())
	}
	return nil
}
