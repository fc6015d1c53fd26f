package main

import (
	"context"
	"fmt"
	"os"

	"github.com/fpmbus/fpmbus/consumers/trace"
)

// runTraceInfo is `fpmbus trace info [--json] FILE|DIR…`: per producer and key, what the segments hold
// (lines, observed span, capture mode, counter_id gaps, heartbeats, schema violations, segments). A
// damaged tail is reported with its file and offset and the rest is read on; a file that is not a
// trace is an error naming it.
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
	rep, err := trace.Info(paths)
	if err != nil {
		return err
	}
	if *asJSON {
		return rep.WriteJSON(os.Stdout)
	}
	return rep.WriteText(os.Stdout)
}
