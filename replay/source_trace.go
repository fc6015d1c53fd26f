package replay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/tracefile"
)

// The trace source: Dynamo's dynamo.fpm.trace.v1 gzip JSONL segments, as Dynamo's writer and `fpmbus
// trace` name them (<output base>.<producer>.<index:06>.jsonl.gz), full or sampled, one producer or
// many.

// Sentinel errors of ReadTrace (wrapped with the path, file or line they concern).
var (
	errNoSegments = errors.New("replay: no trace segments found")
	errNotGzip    = errors.New("replay: not a gzip file")
	errNotTrace   = errors.New("replay: not a " + schemas.TraceSchema + " trace")
)

// segmentSuffix ends every segment file name.
const segmentSuffix = tracefile.SegmentSuffix

// resolveSegments turns what a user names into the segment files to read, in read order (by producer
// prefix, then segment index). Each path is
//
//   - a directory: its *.jsonl.gz files;
//   - a file: that file;
//   - a glob (it holds * ? or [): the files it matches;
//   - an output prefix, as given to Dynamo's DYN_FPM_OUTPUT_PATH or --trace-output (with or without
//     .jsonl.gz): the segments of every producer under it, <base>.<producer>.<index:06>.jsonl.gz; or a
//     producer prefix, <base>.<producer>: that producer's segments.
//
// A path that names nothing is an error naming it (errNoSegments).
func resolveSegments(paths []string) ([]string, error) {
	var files []string
	for _, p := range paths {
		fi, err := os.Stat(p)
		switch {
		case err == nil && fi.IsDir():
			found, err := tracefile.SegmentFilesIn(p)
			if err != nil {
				return nil, fmt.Errorf("replay: %w", err)
			}
			if len(found) == 0 {
				return nil, fmt.Errorf("%w in directory %s (no *%s file)", errNoSegments, p, segmentSuffix)
			}
			files = append(files, found...)
		case err == nil:
			files = append(files, p)
		case strings.ContainsAny(p, "*?["):
			matches, gerr := filepath.Glob(p)
			if gerr != nil {
				return nil, fmt.Errorf("replay: glob %q: %w", p, gerr)
			}
			n := 0
			for _, m := range matches {
				if fi, err := os.Stat(m); err == nil && fi.Mode().IsRegular() {
					files = append(files, m)
					n++
				}
			}
			if n == 0 {
				return nil, fmt.Errorf("%w: glob %q matches no file", errNoSegments, p)
			}
		case errors.Is(err, os.ErrNotExist):
			matches, perr := prefixSegments(p)
			if perr != nil {
				return nil, perr
			}
			if len(matches) == 0 {
				return nil, fmt.Errorf("%w: %s is no file, directory or glob, and no segment is named %s.[<producer>.]<index:06>%s", errNoSegments, p, tracefile.OutputBase(p), segmentSuffix)
			}
			files = append(files, matches...)
		default:
			return nil, fmt.Errorf("replay: %w", err)
		}
	}
	return tracefile.ReadOrder(files), nil
}

// prefixSegments lists the regular-file segments under p taken as an output prefix (those of every
// producer, <base>.<producer>.<index:06>.jsonl.gz) and as a producer prefix (<base>.<index:06>.jsonl.gz),
// by the trace format's naming rule (tracefile.segmentIndex), so other files in the directory are
// never claimed.
func prefixSegments(p string) ([]string, error) {
	base := tracefile.OutputBase(p)
	producers, err := tracefile.Producers(p)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	prefixes := []string{base}
	for _, producer := range producers {
		prefixes = append(prefixes, base+"."+producer)
	}
	var out []string
	for _, prefix := range prefixes {
		segs, err := tracefile.ListSegments(prefix)
		if err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		for _, s := range segs {
			if s.Regular {
				out = append(out, s.Path)
			}
		}
	}
	return out, nil
}

// readTrace reads the segments named by paths (see resolveSegments) into a Recording, records sorted
// by observed_at_unix_ms (ties by line order: files in read order, lines in file order).
//
// Damage is reported, not fatal: a segment with a torn or corrupt tail is read up to the damage
// (Recording.Damaged gives its file and byte offset) and the other files are read on. A line that is
// a dynamo.fpm.trace.v1 record but breaks one of its rules is counted (Recording.Invalid) and not
// replayed. What is not a trace at all is an error naming the file (errNotGzip) or the file and line
// (errNotTrace).
func readTrace(paths []string) (*Recording, error) {
	files, err := resolveSegments(paths)
	if err != nil {
		return nil, err
	}
	rec := &Recording{Files: files}
	lr := newLineReader(rec)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		if !fsutil.LooksGzip(data) {
			return nil, fmt.Errorf("%s: %w", f, errNotGzip)
		}
		lr.file, lr.line = f, 0
		d, err := scanSegment(f, data, lr.take)
		if err != nil {
			return nil, err
		}
		if d != nil {
			rec.Damaged = append(rec.Damaged, *d)
		}
	}
	sortRecords(rec.Records)
	return rec, nil
}

// lineReader turns trace lines into records.
type lineReader struct {
	rec   *Recording
	file  string
	line  int
	order int64
	in    interner
	dec   schemas.Decoder
}

func newLineReader(rec *Recording) *lineReader {
	return &lineReader{rec: rec, in: interner{}}
}

// take is scanSegment's callback for one line.
func (lr *lineReader) take(line []byte) error {
	lr.line++
	lr.order++
	r, err := lr.record(line)
	if err == nil {
		lr.rec.Records = append(lr.rec.Records, r)
		return nil
	}
	if !errors.Is(err, schemas.ErrInvalidTraceLine) {
		return &lineError{File: lr.file, Line: lr.line, Err: err}
	}
	lr.rec.Invalid++
	if len(lr.rec.InvalidExamples) < maxExamples {
		lr.rec.InvalidExamples = append(lr.rec.InvalidExamples, lr.file+":"+strconv.Itoa(lr.line)+": "+
			strings.TrimPrefix(err.Error(), "schemas: invalid trace line: "))
	}
	return nil
}

// record decodes one line. A line that is not a dynamo.fpm.trace.v1 record at all is an errNotTrace
// error; one that is but breaks a rule matches schemas.ErrInvalidTraceLine.
func (lr *lineReader) record(line []byte) (record, error) {
	tl, err := schemas.ParseTraceLine(line)
	if err != nil {
		if !isTraceRecord(line) {
			return record{}, fmt.Errorf("%w: %v", errNotTrace, err)
		}
		return record{}, err
	}
	var f schemas.FPM
	if err := lr.dec.ParseFPMJSON(tl.Event.FPM, &f); err != nil { // checked by ParseTraceLine already
		return record{}, err
	}
	e := &tl.Event
	return record{
		Namespace:   lr.in.str(e.Source.Namespace),
		Component:   lr.in.str(e.Source.Component),
		Producer:    lr.in.str(e.Source.ProducerID),
		CaptureMode: lr.in.str(e.CaptureMode),
		ObservedMs:  e.ObservedAtUnixMs,
		Order:       lr.order,
		WorkerID:    lr.in.str(f.WorkerID),
		DPRank:      f.DPRank,
		CounterID:   f.CounterID,
		Heartbeat:   f.IsHeartbeat(),
		FPM:         e.FPM,
	}, nil
}

// isTraceRecord reports whether line is a JSON object whose event.schema is dynamo.fpm.trace.v1 (a
// record that may break other rules), as opposed to anything else (a log line, another schema).
func isTraceRecord(line []byte) bool {
	var probe struct {
		Event struct {
			Schema json.RawMessage `json:"schema"`
		} `json:"event"`
	}
	if err := json.NewDecoder(bytes.NewReader(line)).Decode(&probe); err != nil {
		var te *json.UnmarshalTypeError
		if !errors.As(err, &te) {
			return false
		}
	}
	var schema string
	return json.Unmarshal(probe.Event.Schema, &schema) == nil && schema == schemas.TraceSchema
}

// lineError locates a line that is not a trace record: its file and 1-based line number.
type lineError struct {
	File string
	Line int
	Err  error
}

func (e *lineError) Error() string { return e.File + ":" + strconv.Itoa(e.Line) + ": " + e.Err.Error() }

// Unwrap returns the cause (matching errNotTrace).
func (e *lineError) Unwrap() error { return e.Err }
