package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/consumers/trace"
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
	if rng.Since, err = parseTime("--since", *since); err != nil {
		return err
	}
	if rng.Until, err = parseTime("--until", *until); err != nil {
		return err
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
		printBackfill(res, cfg)
	}
	if err != nil {
		return fmt.Errorf("backfill interrupted: %w; %s", err, resumeHint(res.Resume))
	}
	return nil
}

// printBackfill prints what a backfill wrote, found written already, skipped and lost to pruning.
func printBackfill(res trace.BackfillResult, cfg trace.Config) {
	fmt.Printf("backfill: %d messages (stream sequences %d..%d) -> %d %s lines under %s", res.Messages, res.FirstSeq, res.LastSeq, res.Lines, cfg.Mode, cfg.OutputPath)
	if res.Found > 0 {
		fmt.Printf(", %d already in the output (not written again)", res.Found)
	}
	if res.Invalid > 0 {
		fmt.Printf(", %d invalid skipped", res.Invalid)
	}
	if res.Rejected > 0 {
		fmt.Printf(", %d rejected (file name refused)", res.Rejected)
	}
	fmt.Println()
	lines := 0
	for _, ps := range res.Pruned {
		lines += ps.Lines
	}
	if len(res.Pruned) > 0 {
		fmt.Printf("backfill: %d segment(s) holding %d line(s) pruned by --max-segments %d (raise it to keep them): no longer in the trace\n",
			len(res.Pruned), lines, cfg.MaxSegments)
	}
}

// resumeHint says how to go on after an unfinished backfill.
func resumeHint(r *trace.BackfillResume) string {
	switch {
	case r.Seq != 0:
		return fmt.Sprintf("the lines of %d message(s) read are written; resume with the same flags and --resume-seq %d", r.Written, r.Seq)
	case !r.Since.IsZero():
		return fmt.Sprintf("the lines of %d message(s) read are written; resume with the same flags and --since %s (what is written is recognised)",
			r.Written, r.Since.UTC().Format(time.RFC3339Nano))
	}
	return "nothing was read: run it again as it was"
}

// parseTime parses a bound: RFC 3339 (with or without fraction) or Unix milliseconds; "" is open.
func parseTime(flagName, v string) (time.Time, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return time.Time{}, nil
	}
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms >= 0 {
		return time.UnixMilli(ms), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %s %q: want RFC 3339 (2026-06-30T12:00:00Z) or Unix milliseconds", errUsage, flagName, v)
	}
	return t, nil
}
