package tracefile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/klauspost/compress/gzip"

	"github.com/fpmbus/fpmbus/schemas"
)

// Checking one segment's bytes for Verify. ReadSegment stops at the first damage, which is all a
// writer's recovery needs; the check goes on past it. After a damaged gzip member it looks for the next
// intact one — a gzip header from which a member decodes to its end with a matching CRC-32 and size —
// so one flipped byte costs only the lines of its own member, and the damage is located exactly: its
// first and last byte, the lines before and after it. A false start inside compressed data would have
// to decode as deflate and match a CRC-32 to be taken for a member.
//
// A segment is cut into pieces, in file order, covering every byte:
//
//   - an intact block: one or more whole members whose decoded content ends with a newline. The writer
//     writes one member per flush, each ending its last line, so a block is normally one member; new
//     members can go before or after a block without touching it.
//   - a damaged region: bytes from the end of the last block to the start of the next intact member (or
//     the end of the file). The whole lines the gzip reader produced from it before failing are
//     salvaged: they may be the member's true beginning, or garbage, so they are never trusted without
//     the stream (see verify_stream.go).
//
// Every line of an intact block is checked against the envelope schema (schemas.ParseTraceLine), and
// the "timestamp" of the valid ones must not decrease within the segment: one writer instance writes a
// segment, counting milliseconds from its start on a monotonic clock.

// gzipMagic starts every gzip member: ID1, ID2 and CM 8 (deflate), the only method gzip defines.
var gzipMagic = []byte{0x1f, 0x8b, 0x08}

// gzipTrailerLen is a member's trailer: CRC-32 and size of the uncompressed data, little-endian.
const gzipTrailerLen = 8

// segmentCheck is what checkSegment found in one segment's bytes.
type segmentCheck struct {
	size     int64
	pieces   []piece
	lines    []checkedLine
	findings []Finding
}

// piece is a byte range of a segment: an intact block or a damaged region (see above).
type piece struct {
	off, end int64
	damaged  bool
	// first and n select the piece's lines in segmentCheck.lines: an intact block's lines, or the whole
	// lines salvaged from a region.
	first, n int
	// Damaged only: finding is the index of its Finding; trailer is the region's last gzipTrailerLen
	// bytes when the region does not end the file inside a member (they are then the CRC-32 and size
	// of its last member), else nil.
	finding int
	trailer []byte
}

// segmentPiece is a byte range of a segment's bytes as Verify cuts them (see above): an intact block (normally
// one gzip member, one writer flush) or a damaged region. Lines are an intact block's lines, or the
// whole lines salvaged from a damaged region.
type segmentPiece struct {
	Offset, End int64
	Damaged     bool
	Lines       int
}

// Pieces cuts data, the bytes of a segment, into its pieces, in file order, as Verify does: past
// damage, the next intact member is found.
func Pieces(data []byte) []segmentPiece {
	c := checkSegment("", "", data, newKeyTable())
	out := make([]segmentPiece, len(c.pieces))
	for i, pc := range c.pieces {
		out[i] = segmentPiece{Offset: pc.off, End: pc.end, Damaged: pc.damaged, Lines: pc.n}
	}
	return out
}

// checkedLine is one line read from a segment.
type checkedLine struct {
	piece  int
	lineNo int   // 1-based, counting every line read before it in the segment (salvaged ones too)
	member int64 // byte offset of the piece holding the line: its gzip member (a writer's block is one)
	// valid: the line is a dynamo.fpm.trace.v1 record; the fields below are set only then.
	valid    bool
	salvaged bool  // read from a damaged region
	full     bool  // capture_mode "full" (else "sampled")
	key      int32 // in the keyTable
	ts       int64
	counter  int64
	id       LineIdentity
	raw      []byte // salvaged lines only: the bytes, to compare with the line restored from the stream
}

// parse checks line and fills l from it.
func (l *checkedLine) parse(line []byte, prefix string, keys *keyTable) error {
	tl, err := schemas.ParseTraceLine(line)
	if err != nil {
		return err
	}
	e := &tl.Event
	f, err := CheckFPM(e.FPM)
	if err != nil { // ParseTraceLine checked the fpm object already
		return err
	}
	l.valid = true
	l.full = e.CaptureMode == schemas.CaptureFull
	l.key = keys.index(keyID{e.Source.Namespace, e.Source.Component, e.Source.ProducerID, f.WorkerID, f.DPRank})
	l.ts = tl.Timestamp
	l.counter = f.CounterID
	l.id = IdentityOf(prefix, e.Source.Namespace, e.Source.Component, e.Source.ProducerID, e.ObservedAtUnixMs, e.FPM)
	return nil
}

// keyTable numbers the keys (namespace, component, producer_id, worker_id, dp_rank) of the lines read:
// a line keeps a number, not five fields.
type keyTable struct {
	ids  map[keyID]int32
	keys []keyID
}

func newKeyTable() *keyTable { return &keyTable{ids: map[keyID]int32{}} }

func (t *keyTable) index(k keyID) int32 {
	if i, ok := t.ids[k]; ok {
		return i
	}
	i := int32(len(t.keys))
	t.ids[k] = i
	t.keys = append(t.keys, k)
	return i
}

// segmentScanner is checkSegment's state.
type segmentScanner struct {
	c      *segmentCheck
	path   string
	prefix string
	keys   *keyTable
	out    []byte // decoded content since the end of the last block
	start  int64  // where the bytes of out begin: the end of the last piece
	lineNo int
	lastTS int64 // timestamp of the last valid intact line, -1 before the first
	lastAt int   // its line number
}

// checkSegment cuts data (the bytes of segment path, whose producer prefix is prefix) into pieces and
// checks every line (see above); keys numbers the lines' keys. It never fails: what cannot be read is
// a damaged region, with its Finding.
func checkSegment(path, prefix string, data []byte, keys *keyTable) *segmentCheck {
	s := &segmentScanner{c: &segmentCheck{size: int64(len(data))}, path: path, prefix: prefix, keys: keys, lastTS: -1}
	var zr gzip.Reader
	var scratch []byte
	pos := 0
	if len(data) == 0 {
		s.c.findings = append(s.c.findings, Finding{Kind: FindingTruncated, Segment: path, Offset: 0, End: 0, Reason: "empty file: no gzip member"})
		s.c.pieces = append(s.c.pieces, piece{damaged: true, finding: 0})
		return s.c
	}
	for pos < len(data) {
		content, n, err := decodeMember(&zr, data[pos:], s.out)
		if err == nil {
			s.out = content
			pos += n
			if len(s.out) == 0 || s.out[len(s.out)-1] == '\n' {
				s.block(int64(pos))
			}
			continue
		}
		next := -1
		for from := pos + 1; from < len(data); {
			i := bytes.Index(data[from:], gzipMagic)
			if i < 0 {
				break
			}
			q := from + i
			var rerr error
			if scratch, _, rerr = decodeMember(&zr, data[q:], scratch[:0]); rerr == nil {
				next = q
				break
			}
			from = q + 1
		}
		end := len(data)
		if next >= 0 {
			end = next
		}
		kind := FindingGzip
		if next < 0 && errors.Is(err, io.ErrUnexpectedEOF) {
			kind = FindingTruncated
		}
		var trailer []byte
		if kind != FindingTruncated && end-pos >= 10+gzipTrailerLen { // a gzip header and a trailer at least
			trailer = data[end-gzipTrailerLen : end]
		}
		s.region(int64(end), content, kind, "gzip member at byte "+strconv.Itoa(pos)+": "+err.Error(), trailer)
		pos = end
	}
	if len(s.out) > 0 {
		s.region(int64(len(data)), s.out, findingTornLine, errTornLine.Error(), data[len(data)-gzipTrailerLen:])
	}
	return s.c
}

// block ends an intact block at end: the members since the last piece, whose content is out.
func (s *segmentScanner) block(end int64) {
	idx := len(s.c.pieces)
	first := len(s.c.lines)
	n := 0
	for rest := s.out; len(rest) > 0; n++ {
		i := bytes.IndexByte(rest, '\n')
		s.lineNo++
		l := checkedLine{piece: idx, lineNo: s.lineNo, member: s.start}
		if err := l.parse(rest[:i], s.prefix, s.keys); err != nil {
			s.c.findings = append(s.c.findings, Finding{Kind: FindingLine, Segment: s.path, Offset: s.start, Line: s.lineNo, Reason: err.Error()})
		} else {
			if l.ts < s.lastTS {
				s.c.findings = append(s.c.findings, Finding{Kind: FindingOrder, Segment: s.path, Offset: s.start, Line: s.lineNo,
					Reason: fmt.Sprintf("timestamp %d after %d on line %d: one writer writes a segment, in order", l.ts, s.lastTS, s.lastAt)})
			}
			s.lastTS, s.lastAt = l.ts, s.lineNo
		}
		s.c.lines = append(s.c.lines, l)
		rest = rest[i+1:]
	}
	s.c.pieces = append(s.c.pieces, piece{off: s.start, end: end, first: first, n: n})
	s.out = s.out[:0]
	s.start = end
}

// region ends a damaged region at end; content is what was decoded from it (the unaligned members
// before the damaged one, then what the reader produced from that one).
func (s *segmentScanner) region(end int64, content []byte, kind, reason string, trailer []byte) {
	idx := len(s.c.pieces)
	first := len(s.c.lines)
	n := 0
	for rest := content; ; n++ {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		s.lineNo++
		l := checkedLine{piece: idx, lineNo: s.lineNo, member: s.start, salvaged: true}
		if l.parse(rest[:i], s.prefix, s.keys) == nil {
			l.raw = append([]byte(nil), rest[:i]...)
		}
		s.c.lines = append(s.c.lines, l)
		rest = rest[i+1:]
	}
	s.c.findings = append(s.c.findings, Finding{Kind: kind, Segment: s.path, Offset: s.start, End: end, Reason: reason})
	s.c.pieces = append(s.c.pieces, piece{off: s.start, end: end, damaged: true, first: first, n: n,
		finding: len(s.c.findings) - 1, trailer: trailer})
	s.out = s.out[:0]
	s.start = end
}

// decodeMember decodes the gzip member at the start of data, appending its content to dst, and
// returns dst and the member's length in bytes. On an error dst holds what the reader produced
// before it. Content over maxMemberBytes in dst (a member, with the content since the last line
// boundary) is an error (errMemberTooLarge), as for ReadSegment.
func decodeMember(zr *gzip.Reader, data, dst []byte) ([]byte, int, error) {
	br := bytes.NewReader(data) // an io.ByteReader: the reader takes exactly the member's bytes
	if err := zr.Reset(br); err != nil {
		return dst, 0, eofIsUnexpected(err)
	}
	zr.Multistream(false)
	for {
		if cap(dst)-len(dst) < 32<<10 {
			dst = append(dst[:cap(dst)], make([]byte, 32<<10)...)[:len(dst)]
		}
		k, err := zr.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+k]
		if len(dst) > maxMemberBytes {
			return dst, len(data) - br.Len(), fmt.Errorf("%w (over %d bytes)", errMemberTooLarge, maxMemberBytes)
		}
		if err == io.EOF {
			return dst, len(data) - br.Len(), nil
		}
		if err != nil {
			return dst, len(data) - br.Len(), err
		}
	}
}
