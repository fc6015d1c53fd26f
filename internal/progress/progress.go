// Package progress is how a long operation (a backfill, a verify, a merge, a publication of many cells)
// shows how far it is, the same way for every command: --progress auto draws a bar on a terminal and
// prints a line every few seconds otherwise (a log, a CI job), bar and lines force one, none prints
// nothing. Progress goes to stderr: stdout keeps the command's report.
package progress

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/fpmbus/fpmbus/internal/invalid"
)

// RegisterFlag registers --progress.
func RegisterFlag(fs *flag.FlagSet) *string {
	return fs.String("progress", "auto", "progress display: auto (a bar on a terminal, lines otherwise), bar, lines or none")
}

// Kind is what --progress shows.
type Kind int

const (
	None Kind = iota
	Bar
	Lines
)

// ParseMode reads --progress; auto looks at whether out is a terminal. A bad value is an
// invalid.FlagError.
func ParseMode(v string, out *os.File) (Kind, error) {
	switch v {
	case "auto":
		if term.IsTerminal(int(out.Fd())) {
			return Bar, nil
		}
		return Lines, nil
	case "bar":
		return Bar, nil
	case "lines":
		return Lines, nil
	case "none":
		return None, nil
	}
	return 0, invalid.Flagf("--progress %q: want auto, bar, lines or none", v)
}

// Meter shows one operation's progress: what it does (the bar's description, the lines'
// prefix) and the unit it counts ("msg", "cells"; "bytes" shows sizes). update is called from one
// goroutine at a time.
type Meter struct {
	kind       Kind
	out        io.Writer
	what, unit string
	bar        *progressbar.ProgressBar
	total      uint64
	last       time.Time
}

// lineEvery is how often plain progress lines are printed.
const lineEvery = 2 * time.Second

// NewMeter returns the meter of one operation, shown as kind says on out.
func NewMeter(kind Kind, out io.Writer, what, unit string) *Meter {
	return &Meter{kind: kind, out: out, what: what, unit: unit, last: time.Now()}
}

// Update shows done of total (total may grow); detail, if any, ends a printed line.
func (p *Meter) Update(done, total uint64, detail string) {
	total = max(total, done)
	switch p.kind {
	case Bar:
		if p.bar == nil || total != p.total {
			if p.bar == nil {
				opts := []progressbar.Option{
					progressbar.OptionSetWriter(p.out),
					progressbar.OptionSetDescription(p.what),
					progressbar.OptionShowCount(),
					progressbar.OptionShowIts(),
					progressbar.OptionSetPredictTime(true),
					progressbar.OptionThrottle(100 * time.Millisecond),
					progressbar.OptionFullWidth(),
				}
				if p.unit == "bytes" {
					opts = append(opts, progressbar.OptionShowBytes(true))
				} else {
					opts = append(opts, progressbar.OptionSetItsString(p.unit))
				}
				p.bar = progressbar.NewOptions64(int64(total), opts...)
			} else {
				p.bar.ChangeMax64(int64(total))
			}
			p.total = total
		}
		_ = p.bar.Set64(int64(done))
	case Lines:
		if time.Since(p.last) < lineEvery && done < total {
			return
		}
		p.last = time.Now()
		pct := 100.0
		if total > 0 {
			pct = 100 * float64(done) / float64(total)
		}
		line := fmt.Sprintf("%s: %d/%d %s (%.0f%%)", p.what, done, total, p.unit, pct)
		if p.unit == "bytes" {
			line = fmt.Sprintf("%s: %s of %s (%.0f%%)", p.what, byteSize(done), byteSize(total), pct)
		}
		if detail != "" {
			line += ", " + detail
		}
		fmt.Fprintln(p.out, line)
		p.total = total
	}
}

// Finish ends the bar's line.
func (p *Meter) Finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
		fmt.Fprintln(p.out)
		p.bar = nil
	}
}

// byteSize is n bytes for a person: 1.5 GB, 320 MB, 4.0 kB.
func byteSize(n uint64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %cB", float64(n)/float64(div), "kMGTPE"[exp])
}
