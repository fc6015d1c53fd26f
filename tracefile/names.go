package tracefile

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// The file names of a dynamo.fpm.trace.v1 trace, as Dynamo's writer gives them (lib/llm/src/fpm_trace/
// sink.rs producer_output_path and lib/llm/src/telemetry/jsonl_gz.rs segment_path):
//
//	output base = the output path without a trailing ".jsonl.gz" or ".jsonl"
//	prefix      = output base + "." + producerFileName(id)
//	segment     = prefix + "." + %06d(index) + ".jsonl.gz", index a uint64
//
// This is the one copy of the rule: the trace writer names, lists, prunes and repairs its files by it,
// and replay resolves what a user names by it, so that each reads every file the other (or Dynamo)
// writes.
//
// producerFileName is Dynamo's SanitizeProducerID(id) whenever the segment's file name fits the
// file system's limit (NAME_MAX, 255 bytes for the whole name, index and suffix included, the index at
// its six-digit width). A longer name would make every write of the producer fail (ENAMETOOLONG); it
// is cut to fit and ends with "-" and 16 hex digits of the SHA-256 of the full, unsanitized id, so that
// long ids that share their beginning keep distinct files and a producer's name never changes. The
// lines still carry the full id (event.source.producer_id).
//
// A file is segment i of a prefix only if its name is exactly SegmentPath(prefix, i): at least six
// digits, no leading zero beyond the %06d padding, any uint64 (Dynamo's index is a u64, so up to 20
// digits). So "worker1" never claims "worker10"'s files, "0000001" is nobody's index, and ".tmp" or
// ".bak" siblings are never touched.

// SegmentSuffix ends every trace segment's file name.
const SegmentSuffix = ".jsonl.gz"

// SanitizeProducerID maps a producer id to the form used in file names: every character that is not
// an ASCII letter, digit, '-' or '_' becomes '_' (one '_' per character, not per byte); an empty id
// becomes "unknown".
func SanitizeProducerID(id string) string {
	if id == "" {
		return "unknown"
	}
	if isSanitizedProducerID(id) {
		return id
	}
	var b strings.Builder
	b.Grow(len(id))
	for _, r := range id {
		if dropsProducerRune(r) {
			b.WriteByte('_')
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// isSanitizedProducerID reports whether SanitizeProducerID(s) == s: s is not empty and holds only
// what SanitizeProducerID keeps.
func isSanitizedProducerID(s string) bool {
	return s != "" && strings.IndexFunc(s, dropsProducerRune) < 0
}

// dropsProducerRune reports whether SanitizeProducerID replaces r: anything but an ASCII letter, digit,
// '-' or '_' (an invalid UTF-8 byte reads as utf8.RuneError and is replaced too).
func dropsProducerRune(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_')
}

// nameMax is the longest file name (one path element) the supported file systems take: NAME_MAX,
// 255 bytes on Linux (ext4, xfs, btrfs, tmpfs) and macOS.
const nameMax = 255

// segmentNameExtra is what a segment's file name adds to the output base name and the producer name:
// the two dots, the six-digit index and the suffix.
const segmentNameExtra = len(".") + len(".000000") + len(SegmentSuffix)

// producerHashLen is the length of the "-<16 hex digits>" that ends a shortened producer name.
const producerHashLen = 1 + 16

// MaxOutputBaseName is the longest output base name (the output path's last element without its
// .jsonl[.gz]) that leaves room for a shortened producer name of at least 8 characters.
const MaxOutputBaseName = nameMax - segmentNameExtra - producerHashLen - 8

// producerFileName is the producer part of the segment file names of producer id under
// outputPath: SanitizeProducerID(id) when the segment names fit NAME_MAX, else the sanitized id cut to
// fit and followed by "-" and the first 16 hex digits of the SHA-256 of id (see above).
func producerFileName(outputPath, id string) string {
	name := SanitizeProducerID(id)
	budget := nameMax - segmentNameExtra - len(filepath.Base(OutputBase(outputPath)))
	if len(name) <= budget {
		return name
	}
	sum := sha256.Sum256([]byte(id))
	keep := max(budget-producerHashLen, 0) // an output base within MaxOutputBaseName keeps it at 8 or more
	return name[:keep] + "-" + hex.EncodeToString(sum[:8])
}

// OutputBase strips a trailing ".jsonl.gz" or ".jsonl" from Dynamo's output path.
func OutputBase(outputPath string) string {
	if s, ok := strings.CutSuffix(outputPath, ".jsonl.gz"); ok {
		return s
	}
	if s, ok := strings.CutSuffix(outputPath, ".jsonl"); ok {
		return s
	}
	return outputPath
}

// SegmentPrefix is the prefix of one producer's segments under outputPath.
func SegmentPrefix(outputPath, producerID string) string {
	return OutputBase(outputPath) + "." + producerFileName(outputPath, producerID)
}

// SegmentPath is the file of segment index under prefix.
func SegmentPath(prefix string, index uint64) string {
	return fmt.Sprintf("%s.%06d%s", prefix, index, SegmentSuffix)
}

// segmentIndex returns i when name is exactly the file name of segment i of base (a prefix's last
// path element): base + "." + at least six digits + ".jsonl.gz", formatted as %06d formats i.
func segmentIndex(base, name string) (uint64, bool) {
	rest, ok := strings.CutPrefix(name, base+".")
	if !ok {
		return 0, false
	}
	digits, ok := strings.CutSuffix(rest, SegmentSuffix)
	if !ok || len(digits) < 6 {
		return 0, false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false
		}
	}
	idx, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return 0, false
	}
	// "0000001" parses as 1 but is not SegmentPath(prefix, 1): nobody's segment.
	if fmt.Sprintf("%06d", idx) != digits {
		return 0, false
	}
	return idx, true
}

// parseSegmentPath splits the path of a segment into its prefix and index: path is
// SegmentPath(prefix, index) for a prefix whose last element is not empty. ok is false for any
// other path.
func parseSegmentPath(path string) (prefix string, index uint64, ok bool) {
	dir, name := filepath.Split(path)
	stem, ok := strings.CutSuffix(name, SegmentSuffix)
	if !ok {
		return "", 0, false
	}
	dot := strings.LastIndexByte(stem, '.')
	if dot <= 0 {
		return "", 0, false
	}
	index, ok = segmentIndex(stem[:dot], name)
	if !ok {
		return "", 0, false
	}
	return dir + stem[:dot], index, true
}

// Segment is one segment file found on disk.
type Segment struct {
	Index uint64
	Path  string
	// Regular is false for a directory or other non-file that happens to have a segment's name: it
	// still occupies its index (the next segment goes above it) but is never read, repaired or pruned.
	Regular bool
}

// ListSegments returns the segments of prefix, oldest (lowest index) first. A missing directory
// means no segments.
func ListSegments(prefix string) ([]Segment, error) {
	dir, base, entries, err := listDir(prefix)
	if err != nil {
		return nil, fmt.Errorf("list segments of %s: %w", prefix, err)
	}
	var out []Segment
	for _, e := range entries {
		idx, ok := segmentIndex(base, e.Name())
		if !ok {
			continue
		}
		out = append(out, Segment{Index: idx, Path: filepath.Join(dir, e.Name()), Regular: e.Type().IsRegular()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, nil
}

// listDir lists the directory of path (the working directory when path has none) and returns it,
// path's last element and the entries; a missing directory has none.
func listDir(path string) (dir, base string, entries []os.DirEntry, err error) {
	dir, base = filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	entries, err = os.ReadDir(dir)
	if os.IsNotExist(err) {
		return dir, base, nil, nil
	}
	return dir, base, entries, err
}

// NextSegmentIndex is the index a new writer of prefix starts at: the highest existing index + 1
// (holes are not filled), or 0.
func NextSegmentIndex(prefix string) (uint64, error) {
	segs, err := ListSegments(prefix)
	if err != nil {
		return 0, err
	}
	if len(segs) == 0 {
		return 0, nil
	}
	last := segs[len(segs)-1].Index
	if last == ^uint64(0) {
		return 0, fmt.Errorf("segments of %s: no index above %d", prefix, last)
	}
	return last + 1, nil
}

// Producers returns the producer file names (producerFileName) that have segments under
// outputPath, sorted. A name counts only if its producer part is a sanitized id (letters, digits, '-',
// '_'), so another writer's files that share the directory are not claimed.
func Producers(outputPath string) ([]string, error) {
	_, base, entries, err := listDir(OutputBase(outputPath))
	if err != nil {
		return nil, fmt.Errorf("list producers under %s: %w", outputPath, err)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		prefix, _, ok := parseSegmentPath(e.Name())
		if !ok {
			continue
		}
		producer, ok := strings.CutPrefix(prefix, base+".")
		if ok && isSanitizedProducerID(producer) {
			seen[producer] = true
		}
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}

// NameRefused reports a file-system error that concerns one producer's file name and that retrying
// cannot fix: the name is too long (SegmentPrefix keeps names within NAME_MAX, so only a file system
// with a lower limit says so). Its messages are rejected; the other producers go on.
func NameRefused(err error) bool {
	return errors.Is(err, syscall.ENAMETOOLONG)
}
