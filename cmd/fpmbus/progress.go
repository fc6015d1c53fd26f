package main

import (
	"flag"
	"io"
	"os"

	"github.com/fpmbus/fpmbus/internal/progress"
)

// progressOut receives the progress of every command (tests capture it); --progress auto decides
// between a bar and lines by whether stderr is a terminal.
var progressOut io.Writer = os.Stderr

// progressMeter shows one long operation's progress (internal/progress).
type progressMeter = progress.Meter

// progressFlag registers --progress.
func progressFlag(fs *flag.FlagSet) *string { return progress.RegisterFlag(fs) }

// progressMode reads --progress; a bad value is a usage error.
func progressMode(v string, out *os.File) (progress.Kind, error) {
	k, err := progress.ParseMode(v, out)
	return k, flagUsage(err)
}

func newProgressMeter(kind progress.Kind, out io.Writer, what, unit string) *progressMeter {
	return progress.NewMeter(kind, out, what, unit)
}
