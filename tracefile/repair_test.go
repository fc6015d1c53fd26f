package tracefile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
)

// threeMembers writes a segment of three gzip members of 50 lines each (as three flushes of the trace
// writer leave it) and returns its path and the member end offsets.
func threeMembers(t *testing.T) (string, []int64) {
	t.Helper()
	path := SegmentPath(filepath.Join(t.TempDir(), "t.w"), 0)
	var data []byte
	var ends []int64
	for m := range 3 {
		var lines strings.Builder
		for i := range 50 {
			fmt.Fprintf(&lines, `{"member":%d,"line":%d,"pad":"%s"}`+"\n", m, i, strings.Repeat("x", i))
		}
		data = append(data, member(t, lines.String())...)
		ends = append(ends, int64(len(data)))
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, ends
}

func TestReadSegmentTruncated(t *testing.T) {
	t.Parallel()
	path, ends := threeMembers(t)
	for name, cut := range map[string]int64{
		"mid third member":             ends[1] + (ends[2]-ends[1])/2,
		"inside the third header":      ends[1] + 5,
		"trailer of the third missing": ends[2] - 3,
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), filepath.Base(path))
			data, _ := os.ReadFile(path)
			if err := os.WriteFile(p, data[:cut], 0o644); err != nil {
				t.Fatal(err)
			}
			var lines int
			err := ReadSegment(p, func([]byte) error { lines++; return nil })
			var ce *CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v, want *CorruptError", err)
			}
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("err = %v, want io.ErrUnexpectedEOF inside", err)
			}
			if ce.Segment != p || ce.Offset != ends[1] {
				t.Fatalf("CorruptError{%s, %d}, want {%s, %d}", ce.Segment, ce.Offset, p, ends[1])
			}
			if !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), strconv.FormatInt(ends[1], 10)) {
				t.Fatalf("error %q does not name the segment and offset", err)
			}
			if lines != 100 {
				t.Fatalf("lines before the damage = %d, want 100", lines)
			}
		})
	}
}

func TestRepairCutsTornTail(t *testing.T) {
	t.Parallel()
	path, ends := threeMembers(t)
	data, _ := os.ReadFile(path)
	cut := ends[1] + (ends[2]-ends[1])/2
	if err := os.WriteFile(path, data[:cut], 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	res, err := Repair(path, logger)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Repaired || res.Removed || res.Offset != ends[1] || res.CutBytes != cut-ends[1] || res.KeptLines != 100 {
		t.Fatalf("result %+v", res)
	}
	if !errors.Is(res.Cause, io.ErrUnexpectedEOF) {
		t.Fatalf("cause %v", res.Cause)
	}
	for _, want := range []string{path, "offset=" + strconv.FormatInt(ends[1], 10), "cut_bytes=" + strconv.FormatInt(cut-ends[1], 10)} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("log %q lacks %q", logs.String(), want)
		}
	}
	got, _ := os.ReadFile(path)
	if !bytes.Equal(got, data[:ends[1]]) {
		t.Fatalf("repaired file is not the first two members byte for byte (%d bytes)", len(got))
	}
	lines := segmentLines(t, path)
	if len(lines) != 100 || !strings.HasPrefix(lines[99], `{"member":1,"line":49`) {
		t.Fatalf("lines after repair: %d, last %q", len(lines), lines[len(lines)-1])
	}
	if _, err := os.Stat(path + RepairTmpSuffix); !os.IsNotExist(err) {
		t.Fatalf("repair temp file left: %v", err)
	}
	// Repairing a sound segment changes nothing.
	res, err = Repair(path, logger)
	if err != nil || res.Repaired {
		t.Fatalf("second repair: %+v, %v", res, err)
	}
}

func TestRepairCases(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		data      func(t *testing.T) []byte
		wantLines []string
		wantErr   error // from ReadSegment before the repair
		removed   bool
	}{
		"sound segment": {
			data:      func(t *testing.T) []byte { return append(member(t, "a\n"), member(t, "b\n")...) },
			wantLines: []string{"a", "b"},
		},
		"empty file (created, never flushed): removed": {
			data:    func(t *testing.T) []byte { return nil },
			removed: true,
		},
		"first member torn: removed": {
			data:    func(t *testing.T) []byte { m := member(t, "a\n"); return m[:len(m)-1] },
			wantErr: io.ErrUnexpectedEOF,
			removed: true,
		},
		"zeros after the last member": {
			data:      func(t *testing.T) []byte { return append(member(t, "a\n"), make([]byte, 64)...) },
			wantLines: []string{"a"},
			wantErr:   gzip.ErrHeader,
		},
		"a line spanning two members is one line": {
			data:      func(t *testing.T) []byte { return append(member(t, "a\nb"), member(t, "c\n")...) },
			wantLines: []string{"a", "bc"},
		},
		"last line without newline is cut with its member": {
			data:      func(t *testing.T) []byte { return append(member(t, "a\n"), member(t, "b\nc")...) },
			wantLines: []string{"a"},
			wantErr:   errTornLine,
		},
		"corrupt checksum": {
			data: func(t *testing.T) []byte {
				m := member(t, "b\n")
				m[len(m)-8] ^= 0xff
				return append(member(t, "a\n"), m...)
			},
			wantLines: []string{"a"},
			wantErr:   gzip.ErrChecksum,
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := SegmentPath(filepath.Join(dir, "t.w"), 0)
			if err := os.WriteFile(path, tc.data(t), 0o644); err != nil {
				t.Fatal(err)
			}
			err := ReadSegment(path, func([]byte) error { return nil })
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("ReadSegment = %v, want %v", err, tc.wantErr)
			}
			res, err := Repair(path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.Repaired != (tc.wantErr != nil) || res.Removed != tc.removed {
				t.Fatalf("result %+v", res)
			}
			if tc.removed {
				if _, err := os.Stat(path); !os.IsNotExist(err) {
					t.Fatalf("segment not removed: %v", err)
				}
				return
			}
			if got := segmentLines(t, path); !slices.Equal(got, tc.wantLines) {
				t.Fatalf("lines %q, want %q", got, tc.wantLines)
			}
		})
	}
}

func TestRepairOutputRepairsNewestOfEachProducer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "trace.jsonl.gz")
	a, b := SegmentPrefix(out, "a"), SegmentPrefix(out, "b")
	torn := member(t, "x\n")
	torn = torn[:len(torn)-2]
	write := func(p string, data []byte) {
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(SegmentPath(a, 0), torn) // old: not the newest, left alone
	write(SegmentPath(a, 1), append(member(t, "a1\n"), torn...))
	write(SegmentPath(b, 5), member(t, "b5\n"))
	write(SegmentPath(a, 1)+RepairTmpSuffix, []byte("leftover"))
	write(filepath.Join(dir, "unrelated.repair.tmp"), []byte("keep"))

	res, err := repairOutput(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || !res[0].Repaired || res[0].Segment != SegmentPath(a, 1) || res[1].Repaired {
		t.Fatalf("results %+v", res)
	}
	if got := segmentLines(t, SegmentPath(a, 1)); !slices.Equal(got, []string{"a1"}) {
		t.Fatalf("a/1 = %q", got)
	}
	if got, _ := os.ReadFile(SegmentPath(a, 0)); !bytes.Equal(got, torn) {
		t.Fatal("an older segment was modified")
	}
	if _, err := os.Stat(SegmentPath(a, 1) + RepairTmpSuffix); !os.IsNotExist(err) {
		t.Fatal("repair leftover not removed")
	}
	if _, err := os.Stat(filepath.Join(dir, "unrelated.repair.tmp")); err != nil {
		t.Fatal("an unrelated file was removed")
	}
}
