package trace

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/klauspost/compress/gzip"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/tracefile"
)

// errWriterClosed is returned by a SegmentWriter used after Close.
var errWriterClosed = errors.New("trace: segment writer closed")

// SegmentWriter writes one producer's trace segments, as Dynamo's gzip JSONL sink does:
//
//   - Lines are buffered uncompressed; Flush compresses the buffer into one complete gzip member,
//     writes it with one write and fsyncs the file. A segment is a sequence of members, so a crash
//     loses at most the member being written (see Repair).
//   - Rotation counts uncompressed bytes, newline included: before a line, when the segment already
//     has lines and its bytes plus the line's exceed RollBytes, the line starts the next segment (the
//     lines before it are flushed into the current one first). A single line larger than RollBytes is
//     written intact into an otherwise empty segment. Lines are never split across segments.
//   - A segment file is created exclusively at its first flush; an existing file of that name is an
//     error (another writer owns the producer). After that first write the directory is fsynced and the
//     oldest segments of the prefix are removed until MaxSegments remain, the active one included:
//     each removed segment is recorded (prunedSegment: its lines, their stream sequences and
//     observation times) for the trace writer to report as a loss. Files whose names do not match the
//     prefix exactly are never touched.
//   - A segment is opened only at a roll or at a writer's start. A writer starts at
//     NextSegmentIndex(prefix): a segment left by an earlier process is never appended to. A writer
//     that continues this process's own writing of the producer (the trace writer's partition taken
//     again, or its component restarted in the process: processSegments) appends to the segment the
//     previous writer left, if that is still the producer's newest segment and holds exactly the
//     bytes it left; otherwise (another writer wrote the producer meanwhile) it starts at
//     NextSegmentIndex too.
//   - A write that fails (short write, failed fsync, full disk) leaves the file with a torn tail. The
//     trace writer's flusher then cuts the segment back to its last fsynced member and fsyncs it
//     (writeBatchRetry), and after a backoff writes the lines again into the same segment. So no
//     segment but the newest ever has a torn tail, and a line is in exactly one segment. Flush, used
//     alone, does not retry.
//
// The writer has two sides. The line side (Append, Buffered, Appended, Durable) only touches memory;
// the file side (compress, write, fsync, roll the file, prune) runs in Flush, or, for the trace writer,
// on a flusher goroutine between detach and complete, while the line side goes on buffering. Errors
// are sticky: after a failed write or sync every call returns the same error. A SegmentWriter is not
// safe for concurrent use, except that the file side of one detached batch may run concurrently with
// the line side.
type SegmentWriter struct {
	prefix      string
	rollBytes   int64
	maxSegments int
	logger      *slog.Logger
	onRoll      func()

	// Line side.
	index    uint64 // segment the next line goes to
	segBytes int64  // uncompressed bytes in that segment, flushed and buffered
	segLines int64
	appended uint64  // lines appended since the writer was created
	durable  uint64  // lines among them that are flushed and fsynced
	chunks   []chunk // lines not yet detached: one chunk per segment
	spare    [][]byte
	err      error
	closed   bool

	// Handed from the file side by complete (pruned by the last batches, not yet taken).
	pruned []prunedSegment

	// File side.
	open       func(path string) (file, error)
	reopen     func(path string) (file, int64, error)
	f          file                     // open segment file, nil before its first write
	fIndex     uint64                   // index of f
	fSize      int64                    // bytes of f written and fsynced (whole members)
	fBytes     int64                    // uncompressed bytes of those members
	fDirSynced bool                     // f's directory entry is durable (fsynced after its creation)
	shift      uint64                   // a continued segment found changed: file index = line-side index + shift
	cont       *segmentState            // the segment to continue at the first write, if any (see continueFrom)
	tallies    map[uint64]*segmentTally // what this writer wrote into each segment, by file index
	prunedFile []prunedSegment          // pruned by the batch being written
	zw         *gzip.Writer
	zbuf       bytes.Buffer
}

// chunk is buffered lines of one segment, with the stream sequences and observation times of their
// records (the trace writer's; zero for lines appended with Append).
type chunk struct {
	index uint64
	data  []byte
	tally segmentTally
}

// segmentTally is what a writer wrote into one segment: lines, the stream sequences of their records
// (zero when not known) and the earliest and latest of their observation times; on the file side also
// the bytes written (whole members).
//
// Lines are written in stream order, so the first and last sequences bound them; observation times do
// not follow stream order (a bridge's buffered backlog, a redundant bridge's copies and a replay reach
// the stream after FPMs observed later), so the tally keeps their minimum and maximum: a loss event
// naming the segment's lines by observation time then covers every one of them.
type segmentTally struct {
	lines                    int
	firstSeq, lastSeq        uint64
	minObserved, maxObserved int64
	size                     int64
}

// add counts one line of a record at stream sequence seq (0: not known) observed at observed (< 0:
// not known).
func (t *segmentTally) add(seq uint64, observed int64) {
	if t.lines == 0 {
		t.firstSeq, t.minObserved, t.maxObserved = seq, observed, observed
	}
	t.lines++
	t.lastSeq = seq
	t.observe(observed)
	if seq == 0 {
		t.firstSeq = 0 // a line of unknown sequence: the range is not known
	}
}

// observe widens the tally's observation times to include observed (< 0: not known, ignored).
func (t *segmentTally) observe(observed int64) {
	if observed < 0 {
		return
	}
	if t.minObserved < 0 || observed < t.minObserved {
		t.minObserved = observed
	}
	t.maxObserved = max(t.maxObserved, observed)
}

// merge adds the tally u of later lines.
func (t *segmentTally) merge(u segmentTally) {
	if u.lines == 0 {
		return
	}
	if t.lines == 0 {
		size := t.size
		*t = u
		t.size = size
		return
	}
	if u.firstSeq == 0 {
		t.firstSeq = 0
	}
	t.lines += u.lines
	t.lastSeq = u.lastSeq
	t.observe(u.minObserved)
	t.observe(u.maxObserved)
}

// batch is what detach hands to the file side: the chunks to write, in order, and the line count they
// make durable.
type batch struct {
	chunks []chunk
	upTo   uint64
}

// newDefaultSegmentWriter returns a writer for prefix (see SegmentPrefix) that starts at the next free index.
// rollBytes and maxSegments must be positive. The directory is created if missing; no file is
// created until the first Flush with data.
func newDefaultSegmentWriter(prefix string, rollBytes int64, maxSegments int) (*SegmentWriter, error) {
	return newSegmentWriter(prefix, rollBytes, maxSegments, tracefile.DefaultCompressionLevel, nil)
}

func newSegmentWriter(prefix string, rollBytes int64, maxSegments, level int, logger *slog.Logger) (*SegmentWriter, error) {
	if rollBytes <= 0 || maxSegments <= 0 {
		return nil, fmt.Errorf("%w: segment writer %s: roll bytes %d and max segments %d must be positive", ErrInvalidConfig, prefix, rollBytes, maxSegments)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(filepath.Dir(prefix), 0o755); err != nil {
		return nil, fmt.Errorf("create trace directory: %w", err)
	}
	next, err := tracefile.NextSegmentIndex(prefix)
	if err != nil {
		return nil, err
	}
	zw, err := gzip.NewWriterLevel(nil, level)
	if err != nil {
		return nil, fmt.Errorf("%w: gzip level %d: %v", ErrInvalidConfig, level, err)
	}
	return &SegmentWriter{
		prefix:      prefix,
		rollBytes:   rollBytes,
		maxSegments: maxSegments,
		logger:      logger,
		open:        createFile,
		reopen:      openAppend,
		zw:          zw,
		index:       next,
		tallies:     map[uint64]*segmentTally{},
	}, nil
}

// Prefix is the writer's segment prefix.
func (w *SegmentWriter) Prefix() string { return w.prefix }

// Path is the file of the segment the next line goes to (it may not exist yet). After a failed write
// the files are numbered higher (see SegmentWriter); Path then names the segment the line would have
// gone to.
func (w *SegmentWriter) Path() string { return tracefile.SegmentPath(w.prefix, w.index) }

// Buffered is the number of uncompressed bytes waiting for Flush.
func (w *SegmentWriter) Buffered() int {
	n := 0
	for _, c := range w.chunks {
		n += len(c.data)
	}
	return n
}

// Appended is the number of lines appended so far; line n (1-based) is durable once Durable() >= n.
func (w *SegmentWriter) Appended() uint64 { return w.appended }

// Durable is the number of lines flushed and fsynced so far.
func (w *SegmentWriter) Durable() uint64 { return w.durable }

// Err returns the sticky error, if any.
func (w *SegmentWriter) Err() error { return w.err }

// Append buffers line (without its newline; Append adds it), starting a new segment first if the line
// does not fit the current one (see SegmentWriter). The line is durable only after the next Flush
// returns nil.
func (w *SegmentWriter) Append(line []byte) error { return w.appendRecord(line, 0, -1) }

// appendRecord is Append for the line of a record at stream sequence seq, observed at observed (what
// a pruned segment's report says of its lines).
func (w *SegmentWriter) appendRecord(line []byte, seq uint64, observed int64) error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return errWriterClosed
	}
	n := int64(len(line)) + 1
	if w.segLines > 0 && w.segBytes+n > w.rollBytes {
		w.index++
		w.segBytes, w.segLines = 0, 0
		if w.onRoll != nil {
			w.onRoll()
		}
	}
	if len(w.chunks) == 0 || w.chunks[len(w.chunks)-1].index != w.index {
		w.chunks = append(w.chunks, chunk{index: w.index, data: w.takeSpare()})
	}
	c := &w.chunks[len(w.chunks)-1]
	if need := len(c.data) + len(line) + 1; need > cap(c.data) {
		c.data = growChunk(c.data, need)
	}
	c.data = append(c.data, line...)
	c.data = append(c.data, '\n')
	c.tally.add(seq, observed)
	w.segBytes += n
	w.segLines++
	w.appended++
	return nil
}

// minChunk is the capacity of a producer's first line buffer.
const minChunk = 4 << 10

// growChunk returns b with room for need bytes: at least twice its capacity, so that a buffer grows to
// what a flush interval's lines need in a few copies (append's own growth of a large slice, by a
// quarter, copied the buffer again and again: a sixth of the writer's CPU per line).
func growChunk(b []byte, need int) []byte {
	nb := make([]byte, len(b), max(need, 2*cap(b), minChunk))
	copy(nb, b)
	return nb
}

// takeSpare returns the largest recycled line buffer, emptied (nil when there is none).
func (w *SegmentWriter) takeSpare() []byte {
	if len(w.spare) == 0 {
		return nil
	}
	i := 0
	for j := range w.spare {
		if cap(w.spare[j]) > cap(w.spare[i]) {
			i = j
		}
	}
	b := w.spare[i]
	w.spare = slices.Delete(w.spare, i, i+1)
	return b[:0]
}

// recycle keeps b for later lines: the two largest buffers are kept, the size that the lines between
// two flushes have needed.
func (w *SegmentWriter) recycle(b []byte) {
	if len(w.spare) < maxSpare {
		w.spare = append(w.spare, b)
		return
	}
	i := 0
	for j := range w.spare {
		if cap(w.spare[j]) < cap(w.spare[i]) {
			i = j
		}
	}
	if cap(b) > cap(w.spare[i]) {
		w.spare[i] = b
	}
}

// maxSpare is how many line buffers a SegmentWriter keeps besides the one filling: one being
// written, one more when chunks of two segments were written together.
const maxSpare = 2

// detach takes the buffered lines for the file side. The line side may go on appending while the
// batch is written; complete must follow.
func (w *SegmentWriter) detach() batch {
	b := batch{chunks: w.chunks, upTo: w.appended}
	w.chunks = nil
	return b
}

// complete records the result of writing b (err from writeBatch) and recycles its buffers. The
// segments the batch pruned are kept for takePruned, written or not.
func (w *SegmentWriter) complete(b batch, err error) error {
	w.pruned = append(w.pruned, w.prunedFile...)
	w.prunedFile = nil
	if err != nil {
		return w.fail(err)
	}
	w.durable = max(w.durable, b.upTo)
	for _, c := range b.chunks {
		w.recycle(c.data)
	}
	return nil
}

// writeBatch is the file side: each chunk becomes one gzip member, written with one write and fsynced;
// a chunk of a new segment first closes the previous segment's file. It touches only file-side fields.
func (w *SegmentWriter) writeBatch(b batch) error {
	_, err := w.writeChunks(b.chunks)
	return err
}

// writeChunks writes chunks in order and returns how many were written completely.
func (w *SegmentWriter) writeChunks(chunks []chunk) (int, error) {
	for i, c := range chunks {
		if len(c.data) == 0 {
			continue
		}
		if err := w.writeChunk(c); err != nil {
			return i, err
		}
	}
	return len(chunks), nil
}

// writeBatchRetry writes b like writeBatch, but retries a failed chunk: it waits bo's next backoff
// (report is told), cuts the segment back to its last fsynced member (cutBack) and writes the chunk
// again into it, until it succeeds or stop is closed; then it returns the last error. An error that retrying cannot fix (the segment file exists already:
// another writer owns the producer; the file system refuses the name) is returned at once, as is any
// error when bo is nil.
func (w *SegmentWriter) writeBatchRetry(b batch, stop <-chan struct{}, bo backoff.BackOff, report func(*SegmentWriter, error, time.Duration)) error {
	chunks := b.chunks
	for retried := false; ; retried = true {
		n, err := w.writeChunks(chunks)
		if err == nil {
			if retried {
				w.logger.Info("trace segment write succeeded after retrying", "segment", tracefile.SegmentPath(w.prefix, w.fIndex))
			}
			return nil
		}
		chunks = chunks[n:]
		if bo == nil || errors.Is(err, os.ErrExist) || tracefile.NameRefused(err) {
			return err
		}
		for {
			wait := bo.NextBackOff()
			if wait == backoff.Stop {
				return err
			}
			if report != nil {
				report(w, err, wait)
			}
			t := time.NewTimer(wait)
			select {
			case <-stop:
				t.Stop()
				return err
			case <-t.C:
			}
			cerr := w.cutBack()
			if cerr == nil {
				break
			}
			err = cerr
		}
	}
}

// cutBack undoes a failed write of the open segment: it cuts the file back to the bytes that were
// fsynced (whole members) and fsyncs it; the file stays open and the next write appends there. Until
// it succeeds the file keeps its torn tail, and it is the newest segment, so a crash meanwhile leaves
// a torn tail only where the startup repair looks.
func (w *SegmentWriter) cutBack() error {
	if w.f == nil {
		return nil // the failure was creating or opening the file: nothing to cut
	}
	path := tracefile.SegmentPath(w.prefix, w.fIndex)
	if err := w.f.Truncate(w.fSize); err != nil {
		return fmt.Errorf("cut segment %s back to byte %d: %w", path, w.fSize, err)
	}
	if err := w.f.Sync(); err != nil {
		return fmt.Errorf("sync segment %s after cutting it back to byte %d: %w", path, w.fSize, err)
	}
	w.logger.Warn("trace segment cut back to its last durable member after a failed write; its lines are written again",
		"segment", path, "offset", w.fSize)
	return nil
}

func (w *SegmentWriter) writeChunk(c chunk) error {
	idx := c.index + w.shift
	path := tracefile.SegmentPath(w.prefix, idx)
	w.zbuf.Reset()
	w.zw.Reset(&w.zbuf)
	if _, err := w.zw.Write(c.data); err != nil {
		return fmt.Errorf("compress segment %s: %w", path, err)
	}
	if err := w.zw.Close(); err != nil {
		return fmt.Errorf("compress segment %s: %w", path, err)
	}
	if w.f != nil && w.fIndex != idx {
		// The previous segment is complete: its last member was fsynced when written.
		f := w.f
		w.f = nil
		if err := f.Close(); err != nil {
			w.logger.Warn("trace segment close", "segment", tracefile.SegmentPath(w.prefix, w.fIndex), "err", err)
		}
	}
	if w.f == nil {
		if err := w.openSegment(idx); err != nil {
			return err
		}
		idx, path = w.fIndex, tracefile.SegmentPath(w.prefix, w.fIndex)
	}
	member := w.zbuf.Bytes()
	if n, err := w.f.Write(member); err != nil || n != len(member) {
		if err == nil {
			err = fmt.Errorf("short write: %d of %d bytes", n, len(member))
		}
		return fmt.Errorf("write segment %s at byte %d: %w", path, w.fSize, err)
	}
	if err := w.f.Sync(); err != nil {
		return fmt.Errorf("sync segment %s at byte %d: %w", path, w.fSize, err)
	}
	if !w.fDirSynced {
		// The new file's directory entry must be durable too, before any line in it is acked.
		if err := fsutil.SyncDir(filepath.Dir(path)); err != nil {
			return fmt.Errorf("sync directory of %s: %w", path, err)
		}
		w.fDirSynced = true
		w.prune(idx)
	}
	w.fSize += int64(len(member))
	w.fBytes += int64(len(c.data))
	t := w.tallies[idx]
	if t == nil {
		t = &segmentTally{}
		w.tallies[idx] = t
	}
	t.merge(c.tally)
	t.size += int64(len(member))
	return nil
}

// openSegment opens the file of segment idx for the first write into it: the segment this writer
// continues (continueFrom), appended to if it still holds exactly the bytes the previous writer left,
// or else a new file, created exclusively. A continued segment found changed is not written: the
// writer moves to the producer's next free index (shift), as a writer's start does.
func (w *SegmentWriter) openSegment(idx uint64) error {
	c := w.cont
	w.cont = nil // continued now, or rolled past before any write into it
	if c != nil && c.index == idx {
		path := tracefile.SegmentPath(w.prefix, idx)
		f, size, err := w.reopen(path)
		if err == nil && size == c.size {
			w.f, w.fIndex, w.fSize, w.fBytes, w.fDirSynced = f, idx, size, c.bytes, true
			if c.tally.lines > 0 {
				t := c.tally
				w.tallies[idx] = &t
			}
			w.logger.Debug("trace segment continued", "segment", path, "offset", size)
			return nil
		}
		if err == nil {
			_ = f.Close()
			err = fmt.Errorf("it holds %d bytes, not the %d the previous writer left", size, c.size)
		}
		next, nerr := tracefile.NextSegmentIndex(w.prefix)
		if nerr != nil {
			return fmt.Errorf("segment %s changed since this process wrote it (%v): %w", path, err, nerr)
		}
		moved := max(next, idx+1)
		w.shift += moved - idx
		w.logger.Info("trace segment not continued: it changed since this process wrote it; a new segment is started",
			"segment", path, "reason", err, "next", tracefile.SegmentPath(w.prefix, moved))
		idx = moved
	}
	path := tracefile.SegmentPath(w.prefix, idx)
	f, err := w.open(path)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create segment %s: %w (another writer owns this producer's files?)", path, err)
		}
		return fmt.Errorf("create segment %s: %w", path, err)
	}
	w.f, w.fIndex, w.fSize, w.fBytes, w.fDirSynced = f, idx, 0, 0, false
	return nil
}

// Flush writes the buffered lines (one gzip member per segment they belong to) and fsyncs. With
// nothing buffered it only returns the sticky error.
func (w *SegmentWriter) Flush() error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return errWriterClosed
	}
	b := w.detach()
	return w.complete(b, w.writeBatch(b))
}

// prunedSegment is a segment that retention (MaxSegments) removed, and what it held: its lines are
// no longer in the trace.
type prunedSegment struct {
	Segment string
	Index   uint64
	// Producer is the producer part of its file name (set by the trace writer).
	Producer string
	// Lines it held (read before it was removed, or counted as this writer wrote them); Damaged when
	// it could be read only up to damage, which Lines then does not count past.
	Lines   int
	Damaged bool
	// FirstSeq..LastSeq are the stream sequences of its lines' messages when this writer wrote every
	// line (and knew them), else 0. FirstObservedMs and LastObservedMs are the earliest and latest
	// observed_at_unix_ms of its lines (-1: none), which need not be its first and last lines'.
	FirstSeq, LastSeq               uint64
	FirstObservedMs, LastObservedMs int64
}

// prune removes the oldest regular segments of the prefix until maxSegments remain, active (the one
// just created) included, and records what each held (prunedFile: the trace writer reports every one
// as a loss). A failure to remove is logged, not returned: the segment stays, nothing is lost.
func (w *SegmentWriter) prune(active uint64) {
	segs, err := tracefile.ListSegments(w.prefix)
	if err != nil {
		w.logger.Warn("trace prune: list segments", "prefix", w.prefix, "err", err)
		return
	}
	regular := segs[:0]
	for _, s := range segs {
		if s.Regular {
			regular = append(regular, s)
		}
	}
	removed := 0
	for i := 0; i < len(regular)-w.maxSegments; i++ {
		s := regular[i]
		if s.Index >= active {
			break // never the active segment, nor anything newer
		}
		ps := w.held(s)
		if err := fsutil.RemoveRegular(s.Path); err != nil {
			w.logger.Warn("trace prune: remove segment", "segment", s.Path, "err", err)
			continue
		}
		delete(w.tallies, s.Index)
		removed++
		w.prunedFile = append(w.prunedFile, ps)
	}
	if removed > 0 {
		if err := fsutil.SyncDir(filepath.Dir(w.prefix)); err != nil {
			w.logger.Warn("trace prune: sync directory", "prefix", w.prefix, "err", err)
		}
	}
}

// held says what segment s holds: as this writer wrote it, or read from the file.
func (w *SegmentWriter) held(s tracefile.Segment) prunedSegment {
	ps := prunedSegment{Segment: s.Path, Index: s.Index, FirstObservedMs: -1, LastObservedMs: -1}
	if t := w.tallies[s.Index]; t != nil && t.lines > 0 && fileSizeIs(s.Path, t.size) {
		ps.Lines, ps.FirstSeq, ps.LastSeq, ps.FirstObservedMs, ps.LastObservedMs = t.lines, t.firstSeq, t.lastSeq, t.minObserved, t.maxObserved
		if ps.FirstSeq == 0 {
			ps.LastSeq = 0
		}
		return ps
	}
	err := tracefile.ReadSegment(s.Path, func(line []byte) error {
		if l, err := schemas.ParseTraceLine(line); err == nil {
			if o := l.Event.ObservedAtUnixMs; ps.FirstObservedMs < 0 || o < ps.FirstObservedMs {
				ps.FirstObservedMs = o
			}
			ps.LastObservedMs = max(ps.LastObservedMs, l.Event.ObservedAtUnixMs)
		}
		ps.Lines++
		return nil
	})
	if err != nil {
		ps.Damaged = true
		w.logger.Warn("trace prune: the segment could not be read to its end; its lines are counted up to the damage", "segment", s.Path, "err", err)
	}
	return ps
}

// fileSizeIs reports whether the file at path holds size bytes (not rewritten since this writer wrote
// it, as verify --repair may have).
func fileSizeIs(path string, size int64) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Size() == size
}

// takePruned returns the segments pruned since the last call (line side; after complete).
func (w *SegmentWriter) takePruned() []prunedSegment {
	ps := w.pruned
	w.pruned = nil
	return ps
}

// takeFilePruned returns what takePruned would after complete, when the batch will never be completed
// (the writer aborts): only while no batch is being written.
func (w *SegmentWriter) takeFilePruned() []prunedSegment {
	ps := append(w.takePruned(), w.prunedFile...)
	w.prunedFile = nil
	return ps
}

// segmentState is where a writer left a producer's segment, for the next writer of the producer in
// this process to continue it (processSegments): its file index, the bytes it holds (whole members,
// fsynced), the uncompressed bytes and lines it holds as the roll counts them, and what this
// process wrote into it.
type segmentState struct {
	index        uint64
	size         int64
	bytes, lines int64
	tally        segmentTally
}

// state returns where w left its current segment: the segment of its last durable write, or the one
// it was to continue. ok is false when it has none (nothing written; or its last write failed and was
// not cut back, so what the file holds is not known).
func (w *SegmentWriter) state() (segmentState, bool) {
	if w.cont != nil {
		return *w.cont, true
	}
	t := w.tallies[w.fIndex]
	if t == nil || t.lines == 0 || w.fSize == 0 {
		return segmentState{}, false
	}
	return segmentState{index: w.fIndex, size: w.fSize, bytes: w.fBytes, lines: int64(t.lines), tally: *t}, true
}

// continueFrom makes a new writer (nothing appended yet) continue st, where a writer of this process
// left the producer's segment, if that is still the producer's newest segment and holds st.size
// bytes; it reports whether it does. The file is checked again when it is opened (openSegment).
func (w *SegmentWriter) continueFrom(st segmentState) bool {
	next, err := tracefile.NextSegmentIndex(w.prefix)
	if err != nil || next != st.index+1 {
		return false
	}
	fi, err := os.Lstat(tracefile.SegmentPath(w.prefix, st.index))
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != st.size {
		return false
	}
	w.index, w.segBytes, w.segLines = st.index, st.bytes, st.lines
	w.cont = &st
	return true
}

// Close flushes the buffer, fsyncs and closes the active segment. It returns the first error; a
// second Close returns nil (or the sticky error). Close closes only the file the writer created.
func (w *SegmentWriter) Close() error {
	if w.closed {
		return w.err
	}
	err := w.Flush()
	w.closed = true
	w.closeFile()
	return err
}

// closeFile closes the open segment file without flushing (after a failure, or after Flush).
func (w *SegmentWriter) closeFile() {
	if w.f != nil {
		if cerr := w.f.Close(); cerr != nil {
			_ = w.fail(fmt.Errorf("close segment %s: %w", tracefile.SegmentPath(w.prefix, w.fIndex), cerr))
		}
		w.f = nil
	}
}

func (w *SegmentWriter) fail(err error) error {
	if w.err == nil {
		w.err = err
	}
	return w.err
}
