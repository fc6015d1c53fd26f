package tracefile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/streams"
)

// Verify checks a trace output (`fpmbus trace verify`) and, asked to, heals it from the stream.
//
// What it checks, per producer and segment (verify_scan.go): the gzip structure (every member's header,
// deflate data, CRC-32 and size; bytes that belong to no member; a file ending inside a member or a
// line), every line against the dynamo.fpm.trace.v1 envelope (JSON, exactly the writer's fields, a valid
// fpm object), and the writer's order: a segment is written by one writer instance, so its lines'
// writer-relative "timestamp" never decreases. Damage is reported with its file, its byte range and,
// for a line, its line number; the check goes on past damage (the next intact gzip member is found), so
// every line that can be read is read.
//
// With a JetStream (verify_stream.go) each line is also matched to its message in stream FPM by the
// trace writer's line identity (identity.go: the producer's files, observed_at_unix_ms and a hash of
// namespace, component, producer_id and the fpm object, which is the message body verbatim). That
// checks the order the writer guarantees — per producer, lines in stream order — finds lines written
// twice for one message and, in full mode, messages whose line is missing although the lines around it
// are there (a segment cut at a member boundary reads cleanly). And it says what the stream can
// restore: the messages between the lines around a damaged region are exactly the region's lines.
//
// With Repair (verify_repair.go) a damaged segment is rewritten from the stream: intact members byte for
// byte, each damaged region replaced by one gzip member holding its lines rebuilt from their messages
// (the line bytes the writer would write: record.go), missing lines inserted where they belong, copies
// of a line written twice for one message removed. What the
// stream no longer holds is reported (which keys and counter_ids, between which lines and stream
// sequences), never guessed, and bytes that cannot be replaced are kept as they are.
//
// The one field of a line the stream does not hold is the writer-relative "timestamp": it is taken from
// the damaged bytes when the line can still be read there (and is byte-identical to the line rebuilt
// from its message otherwise), else it is the timestamp of the line before it in the segment, the
// largest value known not to be after the original (a segment's timestamps never decrease; with no line
// before it in the segment, the first one after it); such lines are counted as estimated, unless the
// lines around them have the same timestamp (then it is exact). So a restored segment is byte-identical
// to the original where its writer's clock did not move across the lost lines, and differs in those
// lines' timestamps only, never in their events, where it did.
// When the damaged member's gzip trailer survives, the rebuilt member is checked against its CRC-32 and
// size: a match means byte-identical to what was written.
//
// A running writer: Verify reads every segment but reports on only sealed ones — below each producer's
// newest segment — unless IncludeActive. With Repair it owns every producer first (owner.go), so it is
// refused while a writer holds any; see verify_repair.go for the rename rule. An entry with a
// segment's name that is not a regular file is reported (FindingNotRegular), never read or rewritten,
// and bounds the lines around it. A damaged region with no line before it (the oldest segment after
// pruning) begins at its first line read from the damaged bytes, when the stream holds that line's
// message.

// Kinds of Finding.
const (
	// FindingGzip: a gzip member that does not decode: a bad header, corrupt deflate data, a CRC-32 or
	// size mismatch, or bytes that are no member.
	FindingGzip = "gzip"
	// FindingTruncated: the file ends inside a gzip member, or is empty.
	FindingTruncated = "truncated"
	// findingTornLine: whole members, but the last line has no newline.
	findingTornLine = "torn_line"
	// FindingLine: a line that is not JSON or not a dynamo.fpm.trace.v1 envelope.
	FindingLine = "line"
	// FindingOrder: lines out of the writer's order: a timestamp going back within a segment, or (with
	// the stream, full-mode lines) a line whose message was stored before the message of the line
	// before it.
	FindingOrder = "order"
	// FindingDuplicate (with the stream): a line written twice for one stream message: the later copy
	// (the earlier lines of its identity account for its messages). Repair removes it; reported in an
	// active segment too, and left there unless IncludeActive.
	FindingDuplicate = "duplicate"
	// FindingMissing (with the stream, full mode): stream messages between two adjacent lines that have
	// no line.
	FindingMissing = "missing"
	// FindingNotRegular: an entry with a segment's name that is not a regular file (a symbolic link, a
	// directory, a named pipe): it is not read and never rewritten, and what it holds cannot be told,
	// so the lines around it are not taken to be adjacent.
	FindingNotRegular = "not_regular"
)

// Heal statuses: what the stream can do for a damaged region or missing lines.
const (
	// HealRestored: rewritten from the stream.
	HealRestored = "restored"
	// HealRestorable: the stream holds every line; not rewritten (no Repair, or the rewrite failed).
	HealRestorable = "restorable"
	// HealIncomplete: the stream no longer holds some of the lines (Heal.Missing); the damaged bytes are
	// kept.
	HealIncomplete = "incomplete"
	// HealUnknown: which lines belong there cannot be told (Heal.Reason says why).
	HealUnknown = "unknown"
)

// ErrInvalidConfig: Verify was given an incomplete or invalid VerifyConfig.
var ErrInvalidConfig = errors.New("trace: invalid configuration")

// errSegmentChanged is the reason a segment is not rewritten: it changed, or became a producer's
// newest, after Verify read it.
var errSegmentChanged = errors.New("trace: segment changed since it was verified")

// VerifyConfig says what Verify checks.
type VerifyConfig struct {
	// OutputPath is the writer's output path (--trace-output, DYN_FPM_OUTPUT_PATH): every producer's
	// segments under it are verified.
	OutputPath string
	// IncludeActive also reports on and repairs each producer's newest segment, which a running writer
	// may be appending to: only while no writer writes the output.
	IncludeActive bool
	// FilterSubject and ProducerID are the writer's (--filter, --producer-id): with a JetStream, the
	// stream's messages are filed under producers as the writer filed them. Default filter: fpm.>
	// (streams.FPMWildcard, the writer's default).
	FilterSubject string
	ProducerID    string
	// Repair rewrites damaged segments from the stream (a JetStream is required).
	Repair bool
	// Progress, when set, is called as Verify goes (from Verify's goroutine): reading the segment
	// files (bytes), then the stream (messages), then rewriting damaged segments (segments).
	Progress func(VerifyProgress)
	// CompressionLevel is the gzip level of the members a repair writes (0: DefaultCompressionLevel).
	CompressionLevel int
	// Logger [slog.Default()].
	Logger *slog.Logger
}

// VerifyProgress is how far one phase of a Verify is.
type VerifyProgress struct {
	// Phase is "read" (the segment files, in bytes), "stream" (stream FPM, in messages) or "repair"
	// (the damaged segments, in segments).
	Phase string
	// Done of Total so far; Total may be 0 when the phase has nothing to do.
	Done, Total uint64
}

// progress reports how far phase is.
func (v *verifier) progress(phase string, done, total uint64) {
	if v.cfg.Progress != nil {
		v.cfg.Progress(VerifyProgress{Phase: phase, Done: done, Total: total})
	}
}

// VerifyReport is what Verify found (and repaired), producers in file-name order.
type VerifyReport struct {
	Output string `json:"output"`
	// Stream: the lines were matched to stream FPM; Repair: damaged segments were rewritten.
	Stream bool `json:"stream"`
	Repair bool `json:"repair"`
	// StreamFirstSeq and StreamLastSeq are stream FPM's range when it was read.
	StreamFirstSeq uint64            `json:"stream_first_seq,omitempty"`
	StreamLastSeq  uint64            `json:"stream_last_seq,omitempty"`
	Producers      []*verifyProducer `json:"producers"`
	// Totals: segments, those checked (the others are active), lines read, findings, findings repaired,
	// and findings that remain (Damaged - Repaired).
	Segments  int `json:"segments"`
	Checked   int `json:"checked"`
	Lines     int `json:"lines"`
	Damaged   int `json:"damaged"`
	Repaired  int `json:"repaired"`
	Remaining int `json:"remaining"`
}

// verifyProducer is one producer's segments.
type verifyProducer struct {
	// Producer is the producer part of the file names.
	Producer string           `json:"producer"`
	Segments []*VerifySegment `json:"segments"`
	Lines    int              `json:"lines"`
	// With the stream: lines whose message was found, and lines whose message the stream does not hold
	// (older than the stream, purged, or written from another stream).
	InStream    int `json:"in_stream"`
	NotInStream int `json:"not_in_stream"`
}

// VerifySegment is one segment file.
type VerifySegment struct {
	Path  string `json:"path"`
	Index uint64 `json:"index"`
	Bytes int64  `json:"bytes"`
	// Lines is the lines read (whole ones of intact members, and those read from damaged bytes).
	Lines int `json:"lines"`
	// Active: the producer's newest segment. It is read (its lines bound the damage before it) but
	// checked only with IncludeActive (Checked).
	Active   bool      `json:"active"`
	Checked  bool      `json:"checked"`
	Findings []Finding `json:"findings"`
	// Repaired: the segment was rewritten; RepairError: why a rewrite failed.
	Repaired    bool   `json:"repaired"`
	RepairError string `json:"repair_error,omitempty"`
}

// Finding is one problem in a segment.
type Finding struct {
	Kind    string `json:"kind"`
	Segment string `json:"segment"`
	// Offset is a byte offset in the segment: for damaged bytes their first byte, for a line or missing
	// lines the gzip member holding the line (or the line they follow); End is just past damaged bytes.
	Offset int64 `json:"offset"`
	End    int64 `json:"end,omitempty"`
	// Line is a 1-based line number in the segment (0: none). After damaged bytes it counts the lines
	// that could be read.
	Line   int    `json:"line,omitempty"`
	Reason string `json:"reason"`
	// Heal (with the stream; damaged bytes, missing lines, duplicates and an order finding on a copy's
	// line): what the stream can do.
	Heal *heal `json:"heal,omitempty"`
}

// heal says what the stream can do for damaged bytes or missing lines.
type heal struct {
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	// StreamAfter and StreamBefore are the stream sequences of the lines around the damage (0: none,
	// or not in the stream): its messages lie strictly between them.
	StreamAfter  uint64 `json:"stream_after,omitempty"`
	StreamBefore uint64 `json:"stream_before,omitempty"`
	// Lines restored (or restorable) from the stream; for incomplete damage, the lines the stream still
	// holds (not restored).
	Lines int `json:"lines"`
	// Of the lines restored: timestamps read from the damaged bytes or pinned by equal neighbours
	// (exact), and timestamps that are the line before's (estimated: a lower bound).
	TimestampsExact     int `json:"timestamps_exact"`
	TimestampsEstimated int `json:"timestamps_estimated"`
	// Verified: the rebuilt member matches the CRC-32 and size of the damaged member's gzip trailer:
	// byte-identical to what was written.
	Verified bool `json:"verified"`
	// Missing lists, per key, the counter_ids of lines that were (or may have been) there and that
	// neither the file nor the stream holds any more.
	Missing []missingLines `json:"missing,omitempty"`
	// Unconfirmed lists lines read from the damaged bytes whose message the stream does not hold: they
	// may be the originals or garbage, and are not written back.
	Unconfirmed []lineID `json:"unconfirmed,omitempty"`
}

// missingLines is a range of lines of one key that are lost: counter_ids CounterFrom..CounterTo
// (inclusive) lie between the key's last line before the damage and its first line after it
// (observed at ObservedAfterMs and ObservedBeforeMs); -1 (and 0) where there is no such line. A range
// can include counter_ids the bridge never received (gaps are not lines).
type missingLines struct {
	Namespace        string `json:"namespace"`
	Component        string `json:"component"`
	ProducerID       string `json:"producer_id"`
	WorkerID         string `json:"worker_id"`
	DPRank           int64  `json:"dp_rank"`
	CounterFrom      int64  `json:"counter_from"`
	CounterTo        int64  `json:"counter_to"`
	ObservedAfterMs  int64  `json:"observed_after_unix_ms,omitempty"`
	ObservedBeforeMs int64  `json:"observed_before_unix_ms,omitempty"`
}

// lineID identifies a line for a report: where it was read, its key, counter_id and observation time.
type lineID struct {
	Line         int    `json:"line"`
	Namespace    string `json:"namespace"`
	Component    string `json:"component"`
	ProducerID   string `json:"producer_id"`
	WorkerID     string `json:"worker_id"`
	DPRank       int64  `json:"dp_rank"`
	CounterID    int64  `json:"counter_id"`
	ObservedAtMs int64  `json:"observed_at_unix_ms"`
}

// Verify checks the segments of cfg.OutputPath (see above). js may be nil: then the files alone are
// checked. A damaged segment is a finding, not an error; the error is for what prevents the check (no
// segments, an unreadable file, the stream unreachable).
func Verify(ctx context.Context, cfg VerifyConfig, js jetstream.JetStream) (*VerifyReport, error) {
	if cfg.OutputPath == "" {
		return nil, fmt.Errorf("%w: verify: no output path", ErrInvalidConfig)
	}
	if cfg.FilterSubject == "" {
		cfg.FilterSubject = streams.FPMWildcard
	}
	if cfg.Repair && js == nil {
		return nil, fmt.Errorf("%w: verify: repairing needs the stream", ErrInvalidConfig)
	}
	set, err := newSettings(cfg)
	if err != nil {
		return nil, err
	}
	if js != nil {
		if err := refuseShards(ctx, js); err != nil {
			return nil, err
		}
	}
	v := &verifier{cfg: cfg, set: set, log: set.logger, keys: newKeyTable(), byPrefix: map[string]*vproducer{}}
	if cfg.Repair {
		// A repair owns every producer before it reads (owner.go): refused while a writer, another
		// repair or a backfill holds any of them, so it never rewrites a file a live writer holds.
		own, err := OwnOutput(cfg.OutputPath, "trace verify --repair", v.log)
		if err != nil {
			return nil, err
		}
		defer own.ReleaseAll()
	}
	if err := v.read(); err != nil {
		return nil, err
	}
	if js != nil {
		if err := v.matchStream(ctx, js); err != nil {
			return nil, err
		}
		for _, p := range v.producers {
			v.heal(p)
		}
	}
	if cfg.Repair {
		if err := v.repair(); err != nil {
			return nil, err
		}
	}
	return v.report(js != nil), nil
}

// verifier is one Verify.
type verifier struct {
	cfg       VerifyConfig
	set       settings
	log       *slog.Logger
	keys      *keyTable
	producers []*vproducer
	byPrefix  map[string]*vproducer
	// From the stream.
	firstSeq, lastSeq uint64
	deleted           []uint64 // interior deletes of stream FPM, ascending
}

// vproducer is one producer's segments and lines.
type vproducer struct {
	name, prefix string
	segs         []*vsegment
	lines        []vline // every line read, in file order (segments oldest first)
	ids          map[LineIdentity]*idLines
	// head is the identity of the producer's first line when it was read from damaged bytes (the
	// oldest segment's first member damaged, the segments before it pruned): confirmed by the stream
	// (headSeq, its message), it says where the damaged region's lines begin (verify_stream.go).
	head    *LineIdentity
	headSeq uint64
	// Stream matching (verify_stream.go).
	started, done bool        // a line was matched; the last line was matched
	lastLine      int         // index of the last valid intact line, -1 if none
	maxObserved   int64       // of its valid lines
	cands         []candidate // messages without a line, between the first and last matched line
	orderBroken   bool
	inStream      int
	notInStream   int
}

// vline is a checked line and the segment it is in.
type vline struct {
	checkedLine
	seg int
	seq uint64 // stream sequence of its message (0: not found)
}

// idLines are the valid intact lines of one identity, in file order, and how many messages of that
// identity the stream held.
type idLines struct {
	lines []int
	next  int
	seen  int
}

// vsegment is one segment: the file as read, what the check found, and its repair plan.
type vsegment struct {
	Segment
	fi        os.FileInfo
	chk       *segmentCheck
	firstLine int // its lines are p.lines[firstLine : firstLine+len(chk.lines)]
	active    bool
	checked   bool
	findings  []Finding
	edits     []edit // verify_repair.go
	repaired  bool
	repairErr error
}

// read reads and checks every segment of every producer under the output.
func (v *verifier) read() error {
	names, err := Producers(v.cfg.OutputPath)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("%w under %s", ErrNoSegments, v.cfg.OutputPath)
	}
	// The segments first, for the total the progress counts bytes against.
	segsOf := make([][]Segment, len(names))
	var total, done uint64
	for i, name := range names {
		segs, err := ListSegments(OutputBase(v.cfg.OutputPath) + "." + name)
		if err != nil {
			return err
		}
		segsOf[i] = segs
		for _, s := range segs {
			if fi, err := os.Lstat(s.Path); err == nil && s.Regular {
				total += uint64(fi.Size())
			}
		}
	}
	v.progress("read", 0, total)
	for ni, name := range names {
		p := &vproducer{name: name, prefix: OutputBase(v.cfg.OutputPath) + "." + name, ids: map[LineIdentity]*idLines{}, lastLine: -1}
		segs := segsOf[ni]
		newest := -1
		for i, s := range segs {
			if s.Regular {
				newest = i
			}
		}
		for i, s := range segs {
			if !s.Regular {
				// Reported, not skipped: a sealed segment replaced by a link to elsewhere still held
				// lines, which must not be "restored" into its neighbours (the link's target has them).
				p.segs = append(p.segs, notRegularSegment(s, len(p.lines)))
				continue
			}
			data, fi, err := readFileInfo(s.Path)
			if err != nil {
				return fmt.Errorf("trace: verify: %w", err)
			}
			done += uint64(len(data))
			v.progress("read", min(done, max(total, done)), max(total, done))
			vs := &vsegment{Segment: s, fi: fi, chk: checkSegment(s.Path, p.prefix, data, v.keys), firstLine: len(p.lines), active: i == newest}
			vs.checked = !vs.active || v.cfg.IncludeActive
			if vs.checked {
				vs.findings = vs.chk.findings
			} else {
				// A writer may be writing the active segment: its lines count only up to its first
				// damage (a member being written), which is not reported.
				fd := firstDamaged(vs.chk)
				n := len(vs.chk.lines)
				if fd < len(vs.chk.pieces) {
					n = vs.chk.pieces[fd].first
				}
				vs.chk.pieces, vs.chk.lines = vs.chk.pieces[:fd], vs.chk.lines[:n]
			}
			for _, l := range vs.chk.lines {
				idx := len(p.lines)
				if l.valid && !l.salvaged {
					e := p.ids[l.id]
					if e == nil {
						e = &idLines{}
						p.ids[l.id] = e
					}
					e.lines = append(e.lines, idx)
					p.lastLine = idx
					p.maxObserved = max(p.maxObserved, l.id.observed)
				}
				p.lines = append(p.lines, vline{checkedLine: l, seg: len(p.segs)})
			}
			p.segs = append(p.segs, vs)
		}
		if len(p.lines) > 0 && p.lines[0].salvaged && p.lines[0].valid {
			// The first line of a damaged region's bytes is its first line (a region starts at a
			// member boundary, and its salvaged content is decoded from there).
			p.head = &p.lines[0].id
		}
		v.producers = append(v.producers, p)
		v.byPrefix[p.prefix] = p
	}
	return nil
}

// notRegularSegment is the vsegment of an entry with a segment's name that is not a regular file:
// one damaged region, with no lines, and its finding (FindingNotRegular).
func notRegularSegment(s Segment, firstLine int) *vsegment {
	reason := "not a regular file"
	if _, err := fsutil.CheckRegular(s.Path); err != nil {
		reason = err.Error()
	}
	f := Finding{Kind: FindingNotRegular, Segment: s.Path, Reason: reason + "; its lines cannot be read, and the lines around it are not taken to be adjacent"}
	chk := &segmentCheck{pieces: []piece{{damaged: true, finding: 0}}, findings: []Finding{f}}
	return &vsegment{Segment: s, chk: chk, firstLine: firstLine, checked: true, findings: chk.findings}
}

// firstDamaged is the index of the first damaged piece of c (len(c.pieces) if none).
func firstDamaged(c *segmentCheck) int {
	for i, pc := range c.pieces {
		if pc.damaged {
			return i
		}
	}
	return len(c.pieces)
}

// readFileInfo reads the regular file path (never through a symbolic link) and stats the file it read.
func readFileInfo(path string) ([]byte, os.FileInfo, error) { return fsutil.ReadRegular(path) }

// report builds the VerifyReport.
func (v *verifier) report(stream bool) *VerifyReport {
	r := &VerifyReport{Output: v.cfg.OutputPath, Stream: stream, Repair: v.cfg.Repair, Producers: []*verifyProducer{}}
	if stream {
		r.StreamFirstSeq, r.StreamLastSeq = v.firstSeq, v.lastSeq
	}
	for _, p := range v.producers {
		vp := &verifyProducer{Producer: p.name, Lines: len(p.lines), InStream: p.inStream, NotInStream: p.notInStream}
		for _, s := range p.segs {
			vs := &VerifySegment{Path: s.Path, Index: s.Index, Bytes: s.chk.size, Lines: len(s.chk.lines), Active: s.active,
				Checked: s.checked, Findings: slices.Clone(s.findings), Repaired: s.repaired}
			if vs.Findings == nil {
				vs.Findings = []Finding{}
			}
			// In file order (the stream's findings were added after the file's).
			slices.SortStableFunc(vs.Findings, func(a, b Finding) int { return cmp.Or(cmp.Compare(a.Offset, b.Offset), cmp.Compare(a.Line, b.Line)) })
			if s.repairErr != nil {
				vs.RepairError = s.repairErr.Error()
			}
			r.Segments++
			if s.checked {
				r.Checked++
			}
			for _, f := range s.findings {
				r.Damaged++
				if f.Heal != nil && f.Heal.Status == HealRestored {
					r.Repaired++
				}
			}
			vp.Segments = append(vp.Segments, vs)
		}
		r.Lines += vp.Lines
		r.Producers = append(r.Producers, vp)
	}
	r.Remaining = r.Damaged - r.Repaired
	return r
}
