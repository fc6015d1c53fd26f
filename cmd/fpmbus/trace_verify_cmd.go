package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/trace"
	"github.com/fpmbus/fpmbus/tracefile"
)

// verifyPhases names what each phase of a verify counts, for its progress display.
var verifyPhases = map[string]struct{ what, unit string }{
	"read":   {"verify: reading segments", "bytes"},
	"stream": {"verify: matching stream FPM", "messages"},
	"repair": {"verify: repairing", "segments"},
}

// runTraceVerify is `fpmbus trace verify [--stream | --repair] … OUTPUT`: check every segment of a
// trace output (gzip, lines, envelope, order), with --stream match its lines to stream FPM, with
// --repair rewrite damaged segments from the stream. The report is printed in full; the exit status
// is 1 while damage remains (after --repair: what it could not repair), 0 when none does.
func runTraceVerify(ctx context.Context, args []string) error {
	fs := newFlagSet("trace verify", "trace verify [--json] [--include-active] [--progress MODE] [--stream | --repair [--server URL] [--filter SUBJECT] [--producer-id ID]] OUTPUT\n\n"+
		"OUTPUT is the trace writer's output path (--trace-output, DYN_FPM_OUTPUT_PATH).")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	includeActive := fs.Bool("include-active", false, "also check (and repair) each producer's newest segment; only while no trace writer writes the output")
	stream := fs.Bool("stream", false, "match the lines to stream FPM: stream order, duplicates, missing lines, and what the stream can restore (a dry run of --repair)")
	repair := fs.Bool("repair", false, "rewrite damaged segments from stream FPM (implies --stream)")
	filter := fs.String("filter", trace.DefaultFilterSubject, "the trace writer's --filter")
	producerID := fs.String("producer-id", "", "the trace writer's --producer-id")
	progress := progressFlag(fs)
	conn := readConnFlags(fs, "trace-verify")
	// Flags may follow OUTPUT too.
	paths, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(paths) != 1 {
		return fmt.Errorf("%w: name one trace output (the writer's --trace-output), got %d", errUsage, len(paths))
	}
	show, err := progressMode(*progress, os.Stderr)
	if err != nil {
		return err
	}
	cfg := tracefile.VerifyConfig{OutputPath: paths[0], IncludeActive: *includeActive, FilterSubject: *filter, ProducerID: *producerID, Repair: *repair}
	// One meter per phase: the segment files (bytes), the stream (messages), the repairs (segments).
	meters := map[string]*progressMeter{}
	phase := ""
	cfg.Progress = func(p tracefile.VerifyProgress) {
		if p.Phase != phase {
			if m := meters[phase]; m != nil {
				m.Finish()
			}
			phase = p.Phase
			vp := verifyPhases[p.Phase]
			meters[phase] = newProgressMeter(show, progressOut, vp.what, vp.unit)
		}
		meters[phase].Update(p.Done, p.Total, "")
	}
	defer func() {
		if m := meters[phase]; m != nil {
			m.Finish()
		}
	}()
	var js jetstream.JetStream
	if *stream || *repair {
		nc, j, err := connectAndApply(ctx, conn, nil) // reads only: applies nothing
		if err != nil {
			return err
		}
		defer nc.Close()
		js = j
	}
	rep, err := tracefile.Verify(ctx, cfg, js)
	if err != nil {
		if errors.Is(err, tracefile.ErrInvalidConfig) {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		return err
	}
	if *asJSON {
		err = rep.WriteJSON(os.Stdout)
	} else {
		err = rep.WriteText(os.Stdout)
	}
	if err == nil && rep.Remaining > 0 {
		return fmt.Errorf("%d finding(s) remain in %s (see the report)", rep.Remaining, cfg.OutputPath)
	}
	return err
}
