package tracefile

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/fpmbus/fpmbus/internal/fsutil"
)

// Reading and repairing segments. A segment is a sequence of complete gzip members, each holding whole
// lines (the trace writer's SegmentWriter writes one member per flush and acks nothing before the member is fsynced). A
// kill -9 can leave the newest segment with a torn last member: Repair, run explicitly at startup,
// cuts it off. Because no message in a torn member was ever acked, JetStream redelivers all of them
// and they are written again: nothing is lost and nothing is written twice.

// maxMemberBytes bounds one member's uncompressed size when reading (a guard against decompression
// bombs; the writer's members are at most about BufferSize, or one oversized line). A variable so that
// the fuzz test can lower it.
var maxMemberBytes = 64 << 20

// Sentinels carried in CorruptError.Err (next to gzip's own errors and io.ErrUnexpectedEOF); the
// reader of gzip members (fsutil.ScanGzipLines) is shared with replay.
var (
	// errTornLine: the data ends inside a line (no trailing newline).
	errTornLine = fsutil.ErrTornLine
	// errMemberTooLarge: a member decompresses to more than maxMemberBytes.
	errMemberTooLarge = fsutil.ErrMemberTooLarge
)

// CorruptError reports a damaged segment. Everything before Offset is whole gzip members holding whole
// lines; the damage starts at Offset (Err says what it is and where it was found). Repair truncates
// the segment at Offset.
type CorruptError struct {
	Segment string
	Offset  int64
	Err     error
}

func (e *CorruptError) Error() string {
	return "trace: segment " + e.Segment + ": corrupt after byte " + strconv.FormatInt(e.Offset, 10) + ": " + e.Err.Error()
}

// Unwrap returns the cause (for example io.ErrUnexpectedEOF for a truncated member).
func (e *CorruptError) Unwrap() error { return e.Err }

// ReadSegment calls fn with every line of the segment at path, in order, without its newline. The
// slice is valid only during the call. Lines are delivered a member at a time, only once the member
// (and the line it ends with) is complete, so on a *CorruptError fn has seen exactly the lines before
// CorruptError.Offset. An error from fn stops the read and is returned as is.
func ReadSegment(path string, fn func(line []byte) error) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read segment: %w", err)
	}
	_, err = scanMembers(path, data, fn)
	return err
}

// scanMembers reads data (the bytes of segment path) member by member; see ReadSegment. A damaged
// tail is a *CorruptError.
func scanMembers(path string, data []byte, fn func(line []byte) error) (fsutil.GzipLinesScan, error) {
	res, err := fsutil.ScanGzipLines(data, maxMemberBytes, fn)
	if err == nil && res.Damage != nil {
		err = &CorruptError{Segment: path, Offset: res.Good, Err: res.Damage}
	}
	return res, err
}

// eofIsUnexpected turns a bare io.EOF inside a member's header into io.ErrUnexpectedEOF: bytes were
// there, so the member is truncated.
func eofIsUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// repairResult says what Repair did to one segment.
type repairResult struct {
	Segment string
	// Repaired is true when the segment was torn and has been cut at Offset (removed if Offset is 0).
	Repaired bool
	// Removed is true when nothing was left: a torn first member, or an empty file (a crash between
	// creating the segment and its first flush; gzip tools reject an empty file).
	Removed  bool
	Offset   int64 // bytes kept
	CutBytes int64
	// KeptLines are the lines in the kept part; CutLines the whole lines decoded from the cut part.
	KeptLines, CutLines int
	// Cause is the *CorruptError that was found, or nil.
	Cause error
}

// Repair checks the segment at path and, if its tail is damaged, cuts it off atomically: the whole
// members before the damage are copied byte for byte into path + ".repair.tmp" (created exclusively, a
// leftover of an interrupted repair removed first; a symbolic link or other non-regular file under
// that name is refused, never written through), which is fsynced and renamed over path, and the
// directory is fsynced. A segment that is not a regular file is refused. A segment with no whole member left is removed,
// and so is an empty one. What was cut (file, byte offset, lines) is logged at warn level. An
// undamaged segment is not touched. logger may be nil.
func Repair(path string, logger *slog.Logger) (repairResult, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	res := repairResult{Segment: path}
	data, _, err := fsutil.ReadRegular(path)
	if err != nil {
		return res, fmt.Errorf("repair segment: %w", err)
	}
	if len(data) == 0 {
		if err := fsutil.RemoveRegular(path); err != nil {
			return res, fmt.Errorf("repair segment %s: remove empty segment: %w", path, err)
		}
		if err := fsutil.SyncDir(filepath.Dir(path)); err != nil {
			return res, fmt.Errorf("repair segment %s: sync directory: %w", path, err)
		}
		res.Removed = true
		logger.Info("empty trace segment removed (created, never flushed)", "segment", path)
		return res, nil
	}
	scan, cerr := scanMembers(path, data, nil)
	res.Offset, res.KeptLines, res.CutLines = int64(len(data)), scan.GoodLines, scan.CutLines
	if cerr == nil {
		return res, nil
	}
	res.Cause = cerr
	res.Repaired = true
	res.Offset = scan.Good
	res.CutBytes = int64(len(data)) - scan.Good
	if scan.Good == 0 {
		if err := fsutil.RemoveRegular(path); err != nil {
			return res, fmt.Errorf("repair segment %s: remove: %w", path, err)
		}
		res.Removed = true
		if err := fsutil.SyncDir(filepath.Dir(path)); err != nil {
			return res, fmt.Errorf("repair segment %s: sync directory: %w", path, err)
		}
	} else if err := fsutil.WriteFileAtomic(path, data[:scan.Good], 0o644, fsutil.TempPath(path+RepairTmpSuffix)); err != nil {
		return res, fmt.Errorf("repair segment %s: %w", path, err)
	}
	logger.Warn("trace segment repaired: torn tail cut",
		"segment", path, "offset", res.Offset, "cut_bytes", res.CutBytes,
		"kept_lines", res.KeptLines, "cut_lines", res.CutLines, "removed", res.Removed, "cause", cerr)
	return res, nil
}

// RepairTmpSuffix names the temporary file of a repair (fsutil.TempPath), so that repairOutput finds
// and removes what a crash during Repair left behind.
const RepairTmpSuffix = ".repair.tmp"

// repairOutput is the startup repair step: for every producer with segments under outputPath it
// removes leftover ".repair.tmp" files of that producer and repairs the newest segment (only the
// newest can be torn: a segment is finished, fsynced, before the next one is started). The caller must
// own every producer (owner.go); the trace writer and backfill repair only the prefixes they own
// (RepairPrefixes).
func repairOutput(outputPath string, logger *slog.Logger) ([]repairResult, error) {
	producers, err := Producers(outputPath)
	if err != nil {
		return nil, err
	}
	prefixes := make([]string, len(producers))
	for i, p := range producers {
		prefixes[i] = OutputBase(outputPath) + "." + p
	}
	return RepairPrefixes(prefixes, logger)
}

// RepairPrefixes is repairOutput for the producers of prefixes.
func RepairPrefixes(prefixes []string, logger *slog.Logger) ([]repairResult, error) {
	var out []repairResult
	for _, prefix := range prefixes {
		if err := RemoveRepairLeftovers(prefix, logger); err != nil {
			return out, err
		}
		segs, err := ListSegments(prefix)
		if err != nil {
			return out, err
		}
		for i := len(segs) - 1; i >= 0; i-- {
			if !segs[i].Regular {
				continue
			}
			r, err := Repair(segs[i].Path, logger)
			if err != nil {
				return out, err
			}
			out = append(out, r)
			break
		}
	}
	return out, nil
}

// RemoveRepairLeftovers deletes "<segment>.repair.tmp" files of prefix left by a crash during Repair.
func RemoveRepairLeftovers(prefix string, logger *slog.Logger) error {
	return removeLeftovers(prefix, RepairTmpSuffix, logger)
}

// removeLeftovers deletes the regular files "<segment><suffix>" of prefix's segments: the temporary
// files of an interrupted rewrite. Anything else under such a name is not fpmbus's: it is left, and
// the rewrite that needs the name refuses it (fsutil.WriteAtomic), naming it.
func removeLeftovers(prefix, suffix string, logger *slog.Logger) error {
	dir, base := filepath.Split(prefix)
	if dir == "" {
		dir = "."
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	for _, e := range entries {
		seg, ok := strings.CutSuffix(e.Name(), suffix)
		if !ok {
			continue
		}
		if _, ok := segmentIndex(base, seg); !ok || !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if err := fsutil.RemoveRegular(p); err != nil {
			return fmt.Errorf("remove leftover of an interrupted rewrite: %w", err)
		}
		if logger != nil {
			logger.Info("trace: removed the leftover of an interrupted rewrite", "file", p)
		}
	}
	return nil
}
