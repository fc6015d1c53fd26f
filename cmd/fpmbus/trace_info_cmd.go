package main

import (
	"context"
	"fmt"
	"os"

	"github.com/fpmbus/fpmbus/replay"
)

// runTraceInfo is `fpmbus trace info [--json] FILE|DIR…`: per producer and key, what the segments hold
// (lines, observed span, capture mode, counter_id gaps, heartbeats, schema violations, segments). A
// damaged tail is reported with its file and offset and the rest is read on; the report is printed and
// the exit status is 1, so a script checking traces sees the damage. A file that is not a trace is an
// error naming it. It ends with the figures that matter for a replay, from replay.DescribeRecording:
// the recorded duration and, per producer and rank, the rate and the inter-arrival p50 and p99.
func runTraceInfo(_ context.Context, args []string) error {
	fs := newFlagSet("trace info", "trace info [--json] FILE|DIR…")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	// Flags may follow the files too.
	var paths, flags []string
	for _, a := range args {
		if len(a) > 1 && a[0] == '-' {
			flags = append(flags, a)
		} else {
			paths = append(paths, a)
		}
	}
	if err := parseFlags(fs, flags); err != nil {
		return err
	}
	if len(paths) == 0 {
		return fmt.Errorf("%w: name at least one segment file or directory", errUsage)
	}
	rep, err := replay.WriteTraceInfo(os.Stdout, paths, *asJSON)
	if err == nil && len(rep.Damaged) > 0 {
		return fmt.Errorf("%d damaged segment(s), read up to the damage (see the report): first %s at byte %d: %s",
			len(rep.Damaged), rep.Damaged[0].Segment, rep.Damaged[0].Offset, rep.Damaged[0].Reason)
	}
	return err
}
