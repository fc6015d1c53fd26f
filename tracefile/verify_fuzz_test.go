package tracefile

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// FuzzCheckSegment checks arbitrary bytes as a segment (verify's decoder of the files it is given): it
// never panics; its pieces cover the file in order; each intact block decodes whole, to its lines, and
// each damaged region has its finding inside the file; it reads whatever ReadSegment reads before the
// first damage; and the intact blocks alone, concatenated, check clean with the same lines (the
// resynchronisation never takes damage for a member). Seeds: segments the writer wrote, damaged, plus
// testdata/fuzz/FuzzCheckSegment.
func FuzzCheckSegment(f *testing.F) {
	k := streams.Key{Namespace: "ns", Component: "c", WorkerID: "w"}
	var lines []string
	for i := range 4 {
		m := testFPM{key: k, counter: int64(i), receivedMs: 1000 + int64(i)}.msg(f)
		r, err := ParseRecord(&fakeMsg{subject: m.Subject, data: m.Data, hdr: m.Header}, MsgMeta{}, "", nil)
		if err != nil {
			f.Fatal(err)
		}
		lines = append(lines, string(AppendLine(nil, &r, int64(i), schemas.CaptureFull))+"\n")
	}
	seg := append(append(member(f, lines[0]+lines[1]), member(f, lines[2])...), member(f, lines[3])...)
	f.Add(seg)
	flipped := bytes.Clone(seg)
	flipped[len(member(f, lines[0]+lines[1]))+15] ^= 0xff
	f.Add(flipped)
	f.Add(seg[:len(seg)-7])
	f.Add(append(bytes.Clone(seg), "\x1f\x8b\x08garbage"...))
	f.Add(append(member(f, lines[0][:20]), member(f, lines[0][20:])...))
	f.Add(member(f, "not a trace line\n"))
	f.Add([]byte{})
	defer func(n int) { maxMemberBytes = n }(maxMemberBytes)
	maxMemberBytes = 1 << 20
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		const path = "t.w.000000.jsonl.gz"
		c := checkSegment(path, "t.w", data, newKeyTable())
		if len(c.pieces) == 0 || c.pieces[0].off != 0 || c.pieces[len(c.pieces)-1].end != int64(len(data)) {
			t.Fatalf("pieces %+v do not cover %d bytes", c.pieces, len(data))
		}
		var intact []byte
		intactLines, before := 0, -1
		for i, pc := range c.pieces {
			if i > 0 && pc.off != c.pieces[i-1].end || pc.end < pc.off || pc.first+pc.n > len(c.lines) {
				t.Fatalf("piece %d %+v out of place", i, pc)
			}
			for _, l := range c.lines[pc.first : pc.first+pc.n] {
				if l.piece != i || l.salvaged != pc.damaged {
					t.Fatalf("line %+v in piece %d", l, i)
				}
			}
			if pc.damaged {
				if before < 0 {
					before = intactLines
				}
				fd := c.findings[pc.finding]
				if fd.Offset != pc.off || fd.End != pc.end || fd.Segment != path {
					t.Fatalf("finding %+v for piece %+v", fd, pc)
				}
				continue
			}
			content, err := decodeBlock(data[pc.off:pc.end])
			if err != nil || bytes.Count(content, []byte{'\n'}) != pc.n {
				t.Fatalf("intact block %+v: %v, %d lines", pc, err, bytes.Count(content, []byte{'\n'}))
			}
			intact = append(intact, data[pc.off:pc.end]...)
			intactLines += pc.n
		}
		if before < 0 {
			before = intactLines
		}
		file := filepath.Join(dir, path)
		if err := os.WriteFile(file, data, 0o644); err != nil {
			t.Fatal(err)
		}
		read := 0
		err := ReadSegment(file, func([]byte) error { read++; return nil })
		var ce *CorruptError
		if err != nil && !errors.As(err, &ce) {
			t.Fatal(err)
		}
		if len(data) > 0 && read != before {
			t.Fatalf("ReadSegment read %d lines before the damage, the check %d", read, before)
		}
		again := checkSegment(path, "t.w", intact, newKeyTable())
		n := 0
		for _, pc := range again.pieces {
			if pc.damaged && len(intact) > 0 {
				t.Fatalf("the intact blocks alone are damaged: %+v", again.findings)
			}
			n += pc.n
		}
		if n != intactLines {
			t.Fatalf("the intact blocks alone have %d lines, %d in place", n, intactLines)
		}
	})
}
