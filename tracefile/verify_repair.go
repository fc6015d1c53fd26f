package tracefile

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/klauspost/compress/gzip"

	"github.com/fpmbus/fpmbus/internal/fsutil"
)

// Rewriting a segment from the stream (Verify with Repair). The new file keeps every intact member byte
// for byte; a damaged region the stream can restore becomes one gzip member of its rebuilt lines (none
// if it held no line); missing lines become a member after the line they follow (the block holding
// that line is re-encoded when the line is not its last); a line that is a copy of an earlier one (a
// stream message traced twice) is removed (its block re-encoded without it, or dropped when nothing
// is left of it); damage the stream cannot restore is kept byte for byte, so nothing that might still
// be read is lost. The result is checked (read back in memory:
// no new damage, exactly the expected lines) before it is written.
//
// It is written like every file fpmbus replaces: a temporary file "<segment>.verify.tmp" next to it
// (created exclusively: a symbolic link planted under that name is refused, never written through),
// fsynced, renamed over the segment, the directory fsynced (fsutil.WriteAtomic); the segment keeps its
// name, permissions and modification time (the writer's takeover recovery reads segments by their
// age). A leftover temporary file of an interrupted repair is removed by the next one.
//
// Ownership first. A repair owns every producer of the output (owner.go) before it reads them, and is
// refused while a writer, a backfill or another repair holds any: a live writer's files are never
// rewritten, whatever their names say (a segment copied in from another run with a higher index once
// made the live writer's active segment look sealed). The rename rule stays as a second guard: a
// repair renames only over the file it read (same inode, size and modification time; else
// errSegmentChanged), and, unless IncludeActive, only over a segment below the producer's newest
// regular segment, checked again just before the rename.

// VerifyTmpSuffix names a verify repair's temporary file (fsutil.TempPath).
const VerifyTmpSuffix = ".verify.tmp"

// edit is one change to a segment: a damaged region replaced (piece >= 0), lines inserted after an
// intact line (after >= 0, an index in vproducer.lines) or an intact line removed (remove >= 0, an
// index in vproducer.lines; piece and after are -1).
type edit struct {
	piece   int
	after   int
	remove  int
	content []byte // the lines, each ending with a newline
	lines   int
	finding int   // index in vsegment.findings of the finding it heals
	also    []int // further findings it heals
}

// repair rewrites every checked segment that has edits.
func (v *verifier) repair() error {
	var total, done uint64
	for _, p := range v.producers {
		for _, s := range p.segs {
			if s.checked && len(s.edits) > 0 {
				total++
			}
		}
	}
	v.progress("repair", 0, total)
	for _, p := range v.producers {
		if err := removeLeftovers(p.prefix, VerifyTmpSuffix, v.log); err != nil {
			return fmt.Errorf("trace: verify: %w", err)
		}
		for _, s := range p.segs {
			if !s.checked || len(s.edits) == 0 {
				continue
			}
			done++
			v.progress("repair", done, total)
			if err := v.rewrite(p, s); err != nil {
				s.repairErr = err
				v.log.Warn("trace verify: segment not repaired", "segment", s.Path, "err", err)
				continue
			}
			s.repaired = true
			for _, e := range s.edits {
				s.findings[e.finding].Heal.Status = HealRestored
				for _, k := range e.also {
					s.findings[k].Heal.Status = HealRestored
				}
			}
			v.log.Info("trace verify: segment repaired from the stream", "segment", s.Path, "edits", len(s.edits))
		}
	}
	return nil
}

// rewrite builds s's new bytes from the file (unchanged since it was checked) and its edits, checks
// them, and replaces the file (see the rename rule above).
func (v *verifier) rewrite(p *vproducer, s *vsegment) error {
	data, fi, err := readFileInfo(s.Path)
	if err != nil {
		return err
	}
	if !sameFile(fi, s.fi) {
		return fmt.Errorf("%w: %s", errSegmentChanged, s.Path)
	}
	regions := map[int]*edit{}
	inserts := map[int]*edit{} // by the segment-relative line index they follow
	removes := map[int]bool{}  // segment-relative line indexes
	for i := range s.edits {
		e := &s.edits[i]
		switch {
		case e.piece >= 0:
			regions[e.piece] = e
		case e.after >= 0:
			inserts[e.after-s.firstLine] = e
		default:
			removes[e.remove-s.firstLine] = true
		}
	}
	zw, err := gzip.NewWriterLevel(nil, v.set.level)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	member := func(content []byte) error {
		if len(content) == 0 {
			return nil
		}
		zw.Reset(&out)
		if _, err := zw.Write(content); err != nil {
			return err
		}
		return zw.Close()
	}
	kept, lines := 0, 0
	for k, pc := range s.chk.pieces {
		if pc.damaged {
			if e := regions[k]; e != nil {
				if err := member(e.content); err != nil {
					return err
				}
				lines += e.lines
			} else {
				out.Write(data[pc.off:pc.end])
				kept++
				lines += pc.n
			}
			continue
		}
		lines += pc.n
		last := pc.first + pc.n - 1
		inner := false
		for i := pc.first; i <= last; i++ {
			inner = inner || i < last && inserts[i] != nil || removes[i]
		}
		if inner {
			content, err := decodeBlock(data[pc.off:pc.end])
			if err != nil {
				return fmt.Errorf("%w: %s: block at byte %d: %v", errSegmentChanged, s.Path, pc.off, err)
			}
			var merged []byte
			for i := pc.first; len(content) > 0; i++ {
				n := bytes.IndexByte(content, '\n') + 1
				if removes[i] {
					lines--
				} else {
					merged = append(merged, content[:n]...)
				}
				content = content[n:]
				if e := inserts[i]; e != nil && i < last {
					merged = append(merged, e.content...)
					lines += e.lines
				}
			}
			if err := member(merged); err != nil {
				return err
			}
		} else {
			out.Write(data[pc.off:pc.end])
		}
		if e := inserts[last]; e != nil && pc.n > 0 {
			if err := member(e.content); err != nil {
				return err
			}
			lines += e.lines
		}
	}
	// Read back: the kept damage and nothing else, and the lines expected.
	chk := checkSegment(s.Path, p.prefix, out.Bytes(), newKeyTable())
	damaged := 0
	for _, pc := range chk.pieces {
		if pc.damaged {
			damaged++
		}
	}
	if out.Len() > 0 && (damaged != kept || len(chk.lines) != lines) {
		return fmt.Errorf("trace: verify: %s: the rewritten segment reads back with %d damaged regions and %d lines, want %d and %d",
			s.Path, damaged, len(chk.lines), kept, lines)
	}
	if err := v.sealed(p, s); err != nil {
		return err
	}
	if out.Len() == 0 {
		// Nothing left to keep (an empty file, or damage that held no line): removed, as the writer's
		// own repair removes an empty segment.
		if err := fsutil.RemoveRegular(s.Path); err != nil {
			return err
		}
		return fsutil.SyncDir(filepath.Dir(s.Path))
	}
	mtime := s.fi.ModTime()
	tmp := s.Path + VerifyTmpSuffix
	return fsutil.WriteAtomic(s.Path, s.fi.Mode().Perm(), func(w io.Writer) error {
		if _, err := w.Write(out.Bytes()); err != nil {
			return err
		}
		if err := v.sealed(p, s); err != nil {
			return err
		}
		return os.Chtimes(tmp, mtime, mtime)
	}, fsutil.TempPath(tmp))
}

// sealed checks the rename rule for s: still the file that was read and, unless IncludeActive, not the
// producer's newest segment.
func (v *verifier) sealed(p *vproducer, s *vsegment) error {
	fi, err := os.Stat(s.Path)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", errSegmentChanged, s.Path, err)
	}
	if !sameFile(fi, s.fi) {
		return fmt.Errorf("%w: %s", errSegmentChanged, s.Path)
	}
	if v.cfg.IncludeActive {
		return nil
	}
	segs, err := ListSegments(p.prefix)
	if err != nil {
		return err
	}
	for i := len(segs) - 1; i >= 0; i-- {
		if segs[i].Regular {
			if segs[i].Index <= s.Index {
				return fmt.Errorf("%w: %s is now its producer's newest segment", errSegmentChanged, s.Path)
			}
			return nil
		}
	}
	return nil
}

// sameFile reports whether a and b describe the same file with the same size and modification time.
func sameFile(a, b os.FileInfo) bool {
	return os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}

// decodeBlock decodes the whole members of an intact block.
func decodeBlock(data []byte) ([]byte, error) {
	var zr gzip.Reader
	var out []byte
	for pos := 0; pos < len(data); {
		var n int
		var err error
		if out, n, err = decodeMember(&zr, data[pos:], out); err != nil {
			return nil, err
		}
		pos += n
	}
	if len(out) > 0 && out[len(out)-1] != '\n' {
		return nil, errTornLine
	}
	return out, nil
}
