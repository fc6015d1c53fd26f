package trace

import (
	"fmt"
	"io"
	"time"
)

// WriteText writes what a backfill with configuration cfg wrote, found written already, skipped and
// lost to pruning.
func (res BackfillResult) WriteText(w io.Writer, cfg Config) {
	fmt.Fprintf(w, "backfill: %d messages (stream sequences %d..%d) -> %d %s lines under %s", res.Messages, res.FirstSeq, res.LastSeq, res.Lines, cfg.Mode, cfg.OutputPath)
	if res.Found > 0 {
		fmt.Fprintf(w, ", %d already in the output (not written again)", res.Found)
	}
	if res.Invalid > 0 {
		fmt.Fprintf(w, ", %d invalid skipped", res.Invalid)
	}
	if res.Rejected > 0 {
		fmt.Fprintf(w, ", %d rejected (file name refused)", res.Rejected)
	}
	fmt.Fprintln(w)
	lines := 0
	for _, ps := range res.Pruned {
		lines += ps.Lines
	}
	if len(res.Pruned) > 0 {
		fmt.Fprintf(w, "backfill: %d segment(s) holding %d line(s) pruned by --max-segments %d (raise it to keep them): no longer in the trace\n",
			len(res.Pruned), lines, cfg.MaxSegments)
	}
}

// Hint says how to go on after an unfinished backfill: the flags to run it again with.
func (r *BackfillResume) Hint() string {
	switch {
	case r.Seq != 0:
		return fmt.Sprintf("the lines of %d message(s) read are written; resume with the same flags and --resume-seq %d", r.Written, r.Seq)
	case !r.Since.IsZero():
		return fmt.Sprintf("the lines of %d message(s) read are written; resume with the same flags and --since %s (what is written is recognised)",
			r.Written, r.Since.UTC().Format(time.RFC3339Nano))
	}
	return "nothing was read: run it again as it was"
}
