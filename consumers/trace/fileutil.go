package trace

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/tracefile"
)

// file is what a SegmentWriter needs from a segment file. *os.File implements it; tests inject short
// writes, failing syncs and failing truncates by embedding it.
type file interface {
	io.Writer
	Sync() error
	Truncate(size int64) error
	Close() error
}

// createFile creates path exclusively for writing (it must not exist: a segment is never reopened;
// nor is a symbolic link under its name ever followed).
func createFile(path string) (file, error) {
	return fsutil.CreateExclusive(path, os.O_WRONLY|os.O_APPEND, 0o644)
}

// openAppend opens the existing segment at path for appending (a writer continuing the segment this
// process wrote last: SegmentWriter.continueFrom) and returns its size. continueFrom looked at the
// segment earlier; what is at its name now may be something else, so the file is opened without
// following a symbolic link and checked on the opened file: a link or named pipe swapped in since is
// refused (*fsutil.NotRegularError), never appended to, and the writer starts a new segment instead.
func openAppend(path string) (file, int64, error) {
	f, err := fsutil.AppendRegular(path, 0, 0)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

// ProbeOutput creates, fsyncs and removes a file in the directory of outputPath, creating the
// directory first. It turns an unwritable output path into one clear error at start.
func ProbeOutput(outputPath string) error {
	dir := filepath.Dir(tracefile.OutputBase(outputPath))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("trace: create output directory %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(tracefile.OutputBase(outputPath))+".write-probe-*")
	if err != nil {
		return fmt.Errorf("trace: output directory %s is not writable: %w", dir, err)
	}
	name := f.Name()
	_, werr := f.Write([]byte("fpmbus-trace-write-probe"))
	serr := f.Sync()
	cerr := f.Close()
	rerr := os.Remove(name)
	if err := errors.Join(werr, serr, cerr, rerr); err != nil {
		return fmt.Errorf("trace: write probe %s: %w", name, err)
	}
	return nil
}
