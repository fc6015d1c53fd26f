package tracefile

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"
)

// WriteJSON writes the report as indented JSON.
func (r *VerifyReport) WriteJSON(w io.Writer) error { return writeIndentedJSON(w, r) }

// WriteText writes the report for people: per producer and segment what was found, what the stream
// can do about it and what was repaired, then the totals.
func (r *VerifyReport) WriteText(w io.Writer) error {
	var b strings.Builder
	active := 0
	for _, p := range r.Producers {
		fmt.Fprintf(&b, "producer %s: %d segments, %d lines", p.Producer, len(p.Segments), p.Lines)
		if r.Stream {
			fmt.Fprintf(&b, " (%d found in the stream, %d not)", p.InStream, p.NotInStream)
		}
		b.WriteByte('\n')
		for _, s := range p.Segments {
			fmt.Fprintf(&b, "  %s: %d lines, %d bytes: ", filepath.Base(s.Path), s.Lines, s.Bytes)
			switch {
			case !s.Checked:
				active++
				b.WriteString("the newest, not checked (a writer may be writing it; --include-active checks it)")
				if len(s.Findings) > 0 { // copies of earlier lines: no writer writes those
					fmt.Fprintf(&b, "; %d copy(ies) of earlier lines found in it", len(s.Findings))
				}
				b.WriteByte('\n')
				for _, f := range s.Findings {
					writeFinding(&b, f)
				}
				continue
			case len(s.Findings) == 0:
				b.WriteString("ok\n")
				continue
			}
			fmt.Fprintf(&b, "%d finding(s)", len(s.Findings))
			switch {
			case s.Repaired:
				b.WriteString(", repaired")
			case s.RepairError != "":
				fmt.Fprintf(&b, ", NOT repaired: %s", s.RepairError)
			}
			b.WriteByte('\n')
			for _, f := range s.Findings {
				writeFinding(&b, f)
			}
		}
	}
	fmt.Fprintf(&b, "verify %s: %d producers, %d segments", r.Output, len(r.Producers), r.Segments)
	if active > 0 {
		fmt.Fprintf(&b, " (%d active, not checked)", active)
	}
	fmt.Fprintf(&b, ", %d lines; %d finding(s)", r.Lines, r.Damaged)
	if r.Repair {
		fmt.Fprintf(&b, ", %d repaired", r.Repaired)
	}
	fmt.Fprintf(&b, ", %d remain\n", r.Remaining)
	_, err := io.WriteString(w, b.String())
	return err
}

func writeFinding(b *strings.Builder, f Finding) {
	switch {
	case f.Kind == FindingNotRegular:
		fmt.Fprintf(b, "    %s: %s\n", f.Kind, f.Reason)
	case f.Line > 0:
		fmt.Fprintf(b, "    %s at line %d (gzip member at byte %d): %s\n", f.Kind, f.Line, f.Offset, f.Reason)
	default:
		fmt.Fprintf(b, "    %s at bytes %d..%d: %s\n", f.Kind, f.Offset, f.End, f.Reason)
	}
	h := f.Heal
	if h == nil {
		return
	}
	fmt.Fprintf(b, "      %s", h.Status)
	if h.Reason != "" {
		fmt.Fprintf(b, ": %s", h.Reason)
	}
	switch h.Status {
	case HealRestored, HealRestorable:
		if f.Kind == FindingDuplicate || f.Kind == FindingOrder {
			break // a copy removed: nothing comes from the stream
		}
		fmt.Fprintf(b, ": %d line(s) from the stream", h.Lines)
		if h.StreamAfter != 0 || h.StreamBefore != 0 {
			fmt.Fprintf(b, " (between stream sequences %d and %d)", h.StreamAfter, h.StreamBefore)
		}
		if h.Lines > 0 {
			fmt.Fprintf(b, "; timestamps %d exact, %d estimated", h.TimestampsExact, h.TimestampsEstimated)
		}
		if h.Verified {
			b.WriteString("; verified against the damaged member's CRC-32 and size")
		}
	case HealIncomplete:
		if h.Lines > 0 {
			fmt.Fprintf(b, "; the stream still holds %d line(s) of it (not restored)", h.Lines)
		}
	}
	b.WriteByte('\n')
	for _, m := range h.Missing {
		fmt.Fprintf(b, "      missing: %s/%s producer_id=%q worker_id=%q dp_rank=%d counter_id %s", m.Namespace, m.Component,
			m.ProducerID, m.WorkerID, m.DPRank, counterRange(m.CounterFrom, m.CounterTo))
		if m.ObservedAfterMs != 0 || m.ObservedBeforeMs != 0 {
			fmt.Fprintf(b, " (observed after %s, before %s)", msTime(m.ObservedAfterMs), msTime(m.ObservedBeforeMs))
		}
		b.WriteByte('\n')
	}
	for _, u := range h.Unconfirmed {
		fmt.Fprintf(b, "      unconfirmed: line %d %s/%s producer_id=%q worker_id=%q dp_rank=%d counter_id %d observed %s (read from the damaged bytes; not in the stream)\n",
			u.Line, u.Namespace, u.Component, u.ProducerID, u.WorkerID, u.DPRank, u.CounterID, msTime(u.ObservedAtMs))
	}
}

func counterRange(from, to int64) string {
	switch {
	case from < 0 && to < 0:
		return "unknown"
	case from < 0:
		return fmt.Sprintf("up to %d", to)
	case to < 0:
		return fmt.Sprintf("from %d", from)
	case from == to:
		return fmt.Sprint(from)
	}
	return fmt.Sprintf("%d-%d", from, to)
}

func msTime(ms int64) string {
	if ms == 0 {
		return "-"
	}
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z")
}
