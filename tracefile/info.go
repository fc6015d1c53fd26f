package tracefile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/schemas"
)

// Info reads trace segments (`fpmbus trace info`): per producer its segments, and per key (namespace,
// component, producer_id, worker_id, dp_rank) its lines, observed time span, capture mode, counter_id
// gaps, heartbeats and schema violations.
//
// Damage is reported, not fatal: a segment with a torn or corrupt tail is read up to the damage (its
// file and byte offset are reported) and the other files are read on. What is not a trace at all is an
// error naming the file (and line): a file that is not gzip (ErrNotGzip), a line that is not JSON or
// not a dynamo.fpm.trace.v1 record (ErrNotTrace). A line that is such a record but breaks one of its
// rules (an invalid fpm, an unknown capture mode, an extra field) is a schema violation, counted.

// Sentinel errors of Info (wrapped with the file, and the line, they concern).
var (
	ErrNotGzip    = errors.New("trace: not a gzip file")
	ErrNotTrace   = errors.New("trace: not a " + schemas.TraceSchema + " trace")
	ErrNoSegments = errors.New("trace: no trace segments (*.jsonl.gz) found")
)

// lineError locates a bad line: the segment file and the 1-based line number in it.
type lineError struct {
	Segment string
	Line    int
	Err     error
}

func (e *lineError) Error() string {
	return e.Segment + ":" + strconv.Itoa(e.Line) + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *lineError) Unwrap() error { return e.Err }

// maxListed bounds the missing-id ranges and violations listed per key (they are all counted).
const maxListed = 1000

// InfoReport is what Info found, producers in file-name order.
type InfoReport struct {
	Producers []*producerInfo `json:"producers"`
	// Damaged lists the segments read only up to a damaged tail.
	Damaged []damage `json:"damaged,omitempty"`
}

// producerInfo is one producer's segments (one prefix) and keys.
type producerInfo struct {
	// Producer is the producer part of the file names (the sanitized producer id).
	Producer   string         `json:"producer"`
	Segments   []*segmentInfo `json:"segments"`
	Lines      int            `json:"lines"`
	Bytes      int64          `json:"bytes"`
	Keys       []*keyInfo     `json:"keys"`
	Violations int            `json:"schema_violations"`
	keys       map[keyID]*keyInfo
}

// segmentInfo is one segment file.
type segmentInfo struct {
	Path  string `json:"path"`
	Index int64  `json:"index"` // -1 when the name is not a segment name
	Bytes int64  `json:"bytes"`
	Lines int    `json:"lines"`
	// Damage, if any: the segment was read up to Damage.Offset.
	Damage *damage `json:"damage,omitempty"`
}

// damage is a segment's torn or corrupt tail.
type damage struct {
	Segment string `json:"segment"`
	Offset  int64  `json:"offset"`
	Reason  string `json:"reason"`
}

// keyInfo describes the lines of one key.
type keyInfo struct {
	Namespace  string `json:"namespace"`
	Component  string `json:"component"`
	ProducerID string `json:"producer_id"`
	WorkerID   string `json:"worker_id"`
	DPRank     int64  `json:"dp_rank"`
	// CaptureModes are the capture_mode values seen, sorted (normally one).
	CaptureModes []string `json:"capture_modes"`
	Lines        int      `json:"lines"`
	Heartbeats   int      `json:"heartbeats"`
	// Observed time span (observed_at_unix_ms) and its length.
	FirstObservedMs int64 `json:"first_observed_unix_ms"`
	LastObservedMs  int64 `json:"last_observed_unix_ms"`
	DurationMs      int64 `json:"duration_ms"`
	// counter_id: range, ids missing inside it (count and ranges), ids seen more than once, and how
	// often it went down in file order (a publisher restart).
	CounterMin      int64     `json:"counter_min"`
	CounterMax      int64     `json:"counter_max"`
	Missing         int64     `json:"missing"`
	MissingRanges   []idRange `json:"missing_ranges"`
	MissingListed   bool      `json:"missing_ranges_complete"`
	Duplicates      int       `json:"duplicates"`
	Regressions     int       `json:"regressions"`
	Violations      int       `json:"schema_violations"`
	ViolationsFirst []string  `json:"schema_violation_examples,omitempty"`
	counters        []int64
	modes           map[string]bool
	lastCounter     int64
}

// idRange is an inclusive range of counter ids.
type idRange struct {
	From int64 `json:"from"`
	To   int64 `json:"to"`
}

func (r idRange) String() string {
	if r.From == r.To {
		return strconv.FormatInt(r.From, 10)
	}
	return strconv.FormatInt(r.From, 10) + "-" + strconv.FormatInt(r.To, 10)
}

type keyID struct {
	namespace, component, producer, worker string
	rank                                   int64
}

// Info reads every segment named by paths (files, or directories: their *.jsonl.gz files) and
// describes them (see above).
func Info(paths []string) (*InfoReport, error) {
	files, err := infoFiles(paths)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%w in %s", ErrNoSegments, strings.Join(paths, ", "))
	}
	rep := &InfoReport{}
	byPrefix := map[string]*producerInfo{}
	for _, f := range files {
		p := byPrefix[f.prefix]
		if p == nil {
			p = &producerInfo{Producer: f.producer, keys: map[keyID]*keyInfo{}}
			byPrefix[f.prefix] = p
			rep.Producers = append(rep.Producers, p)
		}
		seg, err := p.read(f)
		if err != nil {
			return nil, err
		}
		if seg.Damage != nil {
			rep.Damaged = append(rep.Damaged, *seg.Damage)
		}
	}
	for _, p := range rep.Producers {
		for _, k := range p.Keys {
			k.finish()
		}
	}
	return rep, nil
}

// infoFile is one file to read, with its segment name parsed.
type infoFile struct {
	path, prefix, producer string
	index                  int64
}

func infoFiles(paths []string) ([]infoFile, error) {
	var found []string
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("trace info: %w", err)
		}
		if !fi.IsDir() {
			found = append(found, p)
			continue
		}
		segs, err := SegmentFilesIn(p)
		if err != nil {
			return nil, fmt.Errorf("trace info: %w", err)
		}
		found = append(found, segs...)
	}
	var out []infoFile
	for _, path := range ReadOrder(found) {
		f := infoFile{path: path, prefix: path, producer: filepath.Base(path), index: -1}
		if prefix, idx, ok := parseSegmentPath(path); ok {
			f.prefix, f.index = prefix, int64(idx)
			f.producer = filepath.Base(f.prefix)
			if d := strings.LastIndexByte(f.producer, '.'); d >= 0 {
				f.producer = f.producer[d+1:]
			}
		}
		out = append(out, f)
	}
	return out, nil
}

// read reads one segment into p.
func (p *producerInfo) read(f infoFile) (*segmentInfo, error) {
	data, err := os.ReadFile(f.path)
	if err != nil {
		return nil, fmt.Errorf("trace info: %w", err)
	}
	if !fsutil.LooksGzip(data) {
		return nil, fmt.Errorf("%s: %w", f.path, ErrNotGzip)
	}
	seg := &segmentInfo{Path: f.path, Index: f.index, Bytes: int64(len(data))}
	p.Segments = append(p.Segments, seg)
	p.Bytes += seg.Bytes
	line := 0
	_, err = scanMembers(f.path, data, func(l []byte) error {
		line++
		seg.Lines++
		p.Lines++
		return p.line(f.path, line, l)
	})
	var ce *CorruptError
	switch {
	case errors.As(err, &ce):
		seg.Damage = &damage{Segment: f.path, Offset: ce.Offset, Reason: ce.Err.Error()}
	case err != nil:
		return nil, err
	}
	return seg, nil
}

// line takes one line of segment path.
func (p *producerInfo) line(path string, n int, l []byte) error {
	tl, err := schemas.ParseTraceLine(l)
	if err == nil {
		f, ferr := schemas.ParseFPMJSON(tl.Event.FPM)
		if ferr != nil { // ParseTraceLine checked the fpm already; cannot happen
			return &lineError{Segment: path, Line: n, Err: ferr}
		}
		e := &tl.Event
		k := p.key(keyID{e.Source.Namespace, e.Source.Component, e.Source.ProducerID, f.WorkerID, f.DPRank})
		k.add(e.CaptureMode, e.ObservedAtUnixMs, f)
		return nil
	}
	// A record of the right schema breaking a rule is a violation; anything else is not a trace.
	var probe struct {
		Event struct {
			Schema string `json:"schema"`
			Source struct {
				Namespace  string `json:"namespace"`
				Component  string `json:"component"`
				ProducerID string `json:"producer_id"`
			} `json:"source"`
			FPM struct {
				WorkerID string `json:"worker_id"`
				DPRank   int64  `json:"dp_rank"`
			} `json:"fpm"`
		} `json:"event"`
	}
	dec := json.NewDecoder(bytes.NewReader(l))
	if jerr := dec.Decode(&probe); jerr != nil && !isTypeError(jerr) || probe.Event.Schema != schemas.TraceSchema {
		if jerr == nil || isTypeError(jerr) {
			jerr = fmt.Errorf("event.schema %q", probe.Event.Schema)
		}
		return &lineError{Segment: path, Line: n, Err: fmt.Errorf("%w: %v", ErrNotTrace, jerr)}
	}
	p.Violations++
	e := &probe.Event
	k := p.key(keyID{e.Source.Namespace, e.Source.Component, e.Source.ProducerID, e.FPM.WorkerID, e.FPM.DPRank})
	k.Violations++
	if len(k.ViolationsFirst) < 10 {
		k.ViolationsFirst = append(k.ViolationsFirst, filepath.Base(path)+":"+strconv.Itoa(n)+": "+strings.TrimPrefix(err.Error(), "schemas: invalid trace line: "))
	}
	return nil
}

func isTypeError(err error) bool {
	var te *json.UnmarshalTypeError
	return errors.As(err, &te)
}

func (p *producerInfo) key(id keyID) *keyInfo {
	k := p.keys[id]
	if k == nil {
		k = &keyInfo{Namespace: id.namespace, Component: id.component, ProducerID: id.producer, WorkerID: id.worker,
			DPRank: id.rank, modes: map[string]bool{}, lastCounter: -1}
		p.keys[id] = k
		p.Keys = append(p.Keys, k)
	}
	return k
}

func (k *keyInfo) add(mode string, observed int64, f *schemas.FPM) {
	if k.Lines == 0 || observed < k.FirstObservedMs {
		k.FirstObservedMs = observed
	}
	if k.Lines == 0 || observed > k.LastObservedMs {
		k.LastObservedMs = observed
	}
	k.Lines++
	k.modes[mode] = true
	if f.IsHeartbeat() {
		k.Heartbeats++
	}
	if k.lastCounter >= 0 && f.CounterID < k.lastCounter {
		k.Regressions++
	}
	k.lastCounter = f.CounterID
	k.counters = append(k.counters, f.CounterID)
}

// finish computes the counter statistics.
func (k *keyInfo) finish() {
	k.DurationMs = k.LastObservedMs - k.FirstObservedMs
	for m := range k.modes {
		k.CaptureModes = append(k.CaptureModes, m)
	}
	slices.Sort(k.CaptureModes)
	k.MissingRanges = []idRange{}
	k.MissingListed = true
	if len(k.counters) == 0 {
		return
	}
	slices.Sort(k.counters)
	k.CounterMin, k.CounterMax = k.counters[0], k.counters[len(k.counters)-1]
	for i := 1; i < len(k.counters); i++ {
		prev, c := k.counters[i-1], k.counters[i]
		switch {
		case c == prev:
			k.Duplicates++
		case c > prev+1:
			k.Missing += c - prev - 1
			if len(k.MissingRanges) < maxListed {
				k.MissingRanges = append(k.MissingRanges, idRange{prev + 1, c - 1})
			} else {
				k.MissingListed = false
			}
		}
	}
	k.counters = nil
}

// WriteJSON writes the report as indented JSON.
func (r *InfoReport) WriteJSON(w io.Writer) error { return writeIndentedJSON(w, r) }

// writeIndentedJSON writes report v as indented JSON: the --json form of trace info and trace verify.
func writeIndentedJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// WriteText writes the report for people.
func (r *InfoReport) WriteText(w io.Writer) error {
	var b strings.Builder
	ms := func(v int64) string { return time.UnixMilli(v).UTC().Format("2006-01-02T15:04:05.000Z") }
	for i, p := range r.Producers {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "producer %s: %d segments, %d lines, %d bytes", p.Producer, len(p.Segments), p.Lines, p.Bytes)
		if p.Violations > 0 {
			fmt.Fprintf(&b, ", %d schema violations", p.Violations)
		}
		b.WriteByte('\n')
		for _, s := range p.Segments {
			fmt.Fprintf(&b, "  segment %s: %d lines, %d bytes", filepath.Base(s.Path), s.Lines, s.Bytes)
			if s.Damage != nil {
				fmt.Fprintf(&b, ", TRUNCATED at byte %d (%s)", s.Damage.Offset, s.Damage.Reason)
			}
			b.WriteByte('\n')
		}
		for _, k := range p.Keys {
			fmt.Fprintf(&b, "  key %s/%s producer_id=%q worker_id=%q dp_rank=%d: %s\n", k.Namespace, k.Component, k.ProducerID, k.WorkerID, k.DPRank, strings.Join(k.CaptureModes, "+"))
			if k.Lines > 0 {
				fmt.Fprintf(&b, "    lines %d (heartbeats %d), observed %s .. %s (%s)\n", k.Lines, k.Heartbeats,
					ms(k.FirstObservedMs), ms(k.LastObservedMs), time.Duration(k.DurationMs)*time.Millisecond)
				fmt.Fprintf(&b, "    counter_id %d..%d: %d missing", k.CounterMin, k.CounterMax, k.Missing)
				if k.Missing > 0 {
					shown := k.MissingRanges[:min(len(k.MissingRanges), 10)]
					parts := make([]string, len(shown))
					for j, rg := range shown {
						parts[j] = rg.String()
					}
					fmt.Fprintf(&b, " (%s", strings.Join(parts, ", "))
					if more := len(k.MissingRanges) - len(shown); more > 0 || !k.MissingListed {
						fmt.Fprintf(&b, ", … %d more ranges", more)
					}
					b.WriteByte(')')
				}
				fmt.Fprintf(&b, ", %d duplicates, %d regressions\n", k.Duplicates, k.Regressions)
			}
			if k.Violations > 0 {
				fmt.Fprintf(&b, "    schema violations %d: %s\n", k.Violations, strings.Join(k.ViolationsFirst, "; "))
			}
		}
	}
	for _, d := range r.Damaged {
		fmt.Fprintf(&b, "\ndamaged: %s: read up to byte %d: %s", d.Segment, d.Offset, d.Reason)
	}
	if len(r.Damaged) > 0 {
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}
