package trace

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/klauspost/compress/gzip"

	"github.com/fpmbus/fpmbus/tracefile"
)

// segmentLines returns the lines of one segment file.
func segmentLines(t *testing.T, path string) []string {
	t.Helper()
	var out []string
	if err := tracefile.ReadSegment(path, func(l []byte) error {
		out = append(out, string(l))
		return nil
	}); err != nil {
		t.Fatalf("ReadSegment(%s): %v", path, err)
	}
	return out
}

// prefixLines returns the lines of every segment of prefix, by index.
func prefixLines(t *testing.T, prefix string) map[uint64][]string {
	t.Helper()
	segs, err := tracefile.ListSegments(prefix)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint64][]string{}
	for _, s := range segs {
		out[s.Index] = segmentLines(t, s.Path)
	}
	return out
}

// memberCount counts the gzip members of a file.
func memberCount(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	br := bytes.NewReader(data)
	n := 0
	for br.Len() > 0 {
		zr, err := gzip.NewReader(br)
		if err != nil {
			t.Fatalf("member %d of %s: %v", n, path, err)
		}
		zr.Multistream(false)
		if _, err := io.Copy(io.Discard, zr); err != nil {
			t.Fatalf("member %d of %s: %v", n, path, err)
		}
		n++
	}
	return n
}

func TestSegmentWriterRotation(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		roll  int64
		lines []string
		want  map[uint64][]string
	}{
		"lines fit exactly, newline counted": {
			roll: 10, lines: []string{"aaaa", "bbbb", "cc"},
			want: map[uint64][]string{0: {"aaaa", "bbbb"}, 1: {"cc"}},
		},
		"one byte over rolls": {
			roll: 9, lines: []string{"aaaa", "bbbb"},
			want: map[uint64][]string{0: {"aaaa"}, 1: {"bbbb"}},
		},
		"an oversized row goes intact into an empty segment": {
			roll: 4, lines: []string{"aaaaaaaaaa", "b", "cccccccccc", "d"},
			want: map[uint64][]string{0: {"aaaaaaaaaa"}, 1: {"b"}, 2: {"cccccccccc"}, 3: {"d"}},
		},
		"an oversized row after small ones starts its own segment": {
			roll: 6, lines: []string{"a", "b", "cccccccccccc", "d", "e"},
			want: map[uint64][]string{0: {"a", "b"}, 1: {"cccccccccccc"}, 2: {"d", "e"}},
		},
		"empty lines count their newline": {
			roll: 2, lines: []string{"", "", ""},
			want: map[uint64][]string{0: {"", ""}, 1: {""}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			prefix := filepath.Join(t.TempDir(), "t.w")
			w, err := newDefaultSegmentWriter(prefix, tc.roll, 100)
			if err != nil {
				t.Fatal(err)
			}
			rolls := 0
			w.onRoll = func() { rolls++ }
			for _, l := range tc.lines {
				if err := w.Append([]byte(l)); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			got := prefixLines(t, prefix)
			if len(got) != len(tc.want) {
				t.Fatalf("segments = %v, want %v", got, tc.want)
			}
			for i, lines := range tc.want {
				if !slices.Equal(got[i], lines) {
					t.Fatalf("segment %d = %q, want %q (all: %v)", i, got[i], lines, got)
				}
			}
			if rolls != len(tc.want)-1 {
				t.Fatalf("rolls = %d, want %d", rolls, len(tc.want)-1)
			}
		})
	}
}

func TestSegmentWriterOneMemberPerFlush(t *testing.T) {
	t.Parallel()
	prefix := filepath.Join(t.TempDir(), "t.w")
	w, err := newDefaultSegmentWriter(prefix, 1<<20, 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(w.Path()); !os.IsNotExist(err) {
		t.Fatalf("segment exists before the first flush: %v", err)
	}
	for i := range 3 {
		for range 10 {
			if err := w.Append([]byte(`{"n":` + string(rune('0'+i)) + `}`)); err != nil {
				t.Fatal(err)
			}
		}
		if w.Durable() != uint64(i*10) || w.Appended() != uint64(i*10+10) {
			t.Fatalf("durable %d appended %d before flush %d", w.Durable(), w.Appended(), i)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if w.Durable() != w.Appended() {
			t.Fatalf("durable %d != appended %d after flush", w.Durable(), w.Appended())
		}
	}
	if err := w.Flush(); err != nil { // nothing buffered: no empty member
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if n := memberCount(t, tracefile.SegmentPath(prefix, 0)); n != 3 {
		t.Fatalf("members = %d, want 3", n)
	}
	if got := len(segmentLines(t, tracefile.SegmentPath(prefix, 0))); got != 30 {
		t.Fatalf("lines = %d, want 30", got)
	}
	if err := w.Append([]byte("x")); !errors.Is(err, errWriterClosed) {
		t.Fatalf("Append after Close = %v, want ErrWriterClosed", err)
	}
}

func TestSegmentWriterPrune(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	prefix := filepath.Join(dir, "t.w1")
	untouched := []string{
		"t.w10.000000.jsonl.gz", // a producer whose id extends ours
		"t.w10.000001.jsonl.gz",
		"t.w2.000000.jsonl.gz", // another producer
		"t.w1.000000.jsonl.gz.tmp",
		"t.w1.000000.jsonl",
		"t.w1.0000001.jsonl.gz",
		"t.w1.jsonl.gz",
	}
	for _, n := range untouched {
		touch(t, filepath.Join(dir, n))
	}
	// Left by an earlier run, with a hole: the writer starts at 4.
	touch(t, tracefile.SegmentPath(prefix, 0))
	touch(t, tracefile.SegmentPath(prefix, 3))

	w, err := newDefaultSegmentWriter(prefix, 4, 3)
	if err != nil {
		t.Fatal(err)
	}
	exists := func() []uint64 {
		segs, err := tracefile.ListSegments(prefix)
		if err != nil {
			t.Fatal(err)
		}
		var out []uint64
		for _, s := range segs {
			out = append(out, s.Index)
		}
		return out
	}
	steps := []struct {
		line string
		want []uint64
	}{
		{"aaa", []uint64{0, 3, 4}},    // first write to 4: 3 files, nothing pruned
		{"bbb", []uint64{3, 4, 5}},    // roll to 5: 0 pruned (keeps 3, the active one included)
		{"ccc", []uint64{4, 5, 6}},    // roll to 6
		{"dddddd", []uint64{5, 6, 7}}, // oversized row, its own segment
	}
	for i, s := range steps {
		if err := w.Append([]byte(s.line)); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if got := exists(); !slices.Equal(got, s.want) {
			t.Fatalf("step %d: segments %v, want %v", i, got, s.want)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, n := range untouched {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			t.Errorf("%s was touched: %v", n, err)
		}
	}
	// A restart continues above the highest index and never appends to segment 7.
	w2, err := newDefaultSegmentWriter(prefix, 4, 3)
	if err != nil {
		t.Fatal(err)
	}
	if want := tracefile.SegmentPath(prefix, 8); w2.Path() != want {
		t.Fatalf("restart path %s, want %s", w2.Path(), want)
	}
	if err := w2.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestSegmentWriterRefusesAnExistingSegment(t *testing.T) {
	t.Parallel()
	prefix := filepath.Join(t.TempDir(), "t.w")
	w, err := newDefaultSegmentWriter(prefix, 100, 10)
	if err != nil {
		t.Fatal(err)
	}
	// Another writer created segment 0 after this one chose it: two writers own the producer.
	touch(t, tracefile.SegmentPath(prefix, 0))
	if err := w.Append([]byte("a")); err != nil {
		t.Fatal(err)
	}
	err = w.Flush()
	if !errors.Is(err, os.ErrExist) || !strings.Contains(err.Error(), tracefile.SegmentPath(prefix, 0)) {
		t.Fatalf("Flush = %v, want ErrExist naming the segment", err)
	}
	if got, _ := os.ReadFile(tracefile.SegmentPath(prefix, 0)); string(got) != "x" {
		t.Fatalf("existing segment 0 was modified: %q", got)
	}
	if err := w.Close(); err == nil {
		t.Fatal("Close after a failure returned nil")
	}
}

// faultyFile fails the n-th write (1-based; 0 = never) with a short write, or every Sync.
type faultyFile struct {
	file
	writes    int
	failWrite int
	failSync  bool
	closed    *int
}

func (f *faultyFile) Write(p []byte) (int, error) {
	f.writes++
	if f.writes == f.failWrite {
		n, _ := f.file.Write(p[:len(p)/2])
		return n, syscall.ENOSPC
	}
	return f.file.Write(p)
}

func (f *faultyFile) Sync() error {
	if f.failSync {
		return syscall.EIO
	}
	return f.file.Sync()
}

func (f *faultyFile) Close() error {
	if f.closed != nil {
		*f.closed++
	}
	return f.file.Close()
}

func TestSegmentWriterFaults(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		failWrite int
		failSync  bool
		want      error
		wantLines int // lines readable after the fault (torn tail repaired)
	}{
		"short write of the second member": {failWrite: 2, want: syscall.ENOSPC, wantLines: 2},
		"failing fsync":                    {failSync: true, want: syscall.EIO, wantLines: 0},
	} {
		t.Run(name, func(t *testing.T) {
			prefix := filepath.Join(t.TempDir(), "t.w")
			w, err := newDefaultSegmentWriter(prefix, 1<<20, 4)
			if err != nil {
				t.Fatal(err)
			}
			closed := 0
			w.open = func(path string) (file, error) {
				f, err := createFile(path)
				if err != nil {
					return nil, err
				}
				return &faultyFile{file: f, failWrite: tc.failWrite, failSync: tc.failSync, closed: &closed}, nil
			}
			var err1 error
			for i := 0; i < 3 && err1 == nil; i++ {
				if err1 = w.Append([]byte(`{"line":1}`)); err1 == nil {
					err1 = w.Append([]byte(`{"line":2}`))
				}
				if err1 == nil {
					err1 = w.Flush()
				}
			}
			if !errors.Is(err1, tc.want) {
				t.Fatalf("error = %v, want %v", err1, tc.want)
			}
			if !strings.Contains(err1.Error(), tracefile.SegmentPath(prefix, 0)) {
				t.Fatalf("error %q does not name the segment", err1)
			}
			if err := w.Append([]byte("x")); err != err1 {
				t.Fatalf("Append after a failure = %v, want the sticky %v", err, err1)
			}
			if err := w.Flush(); err != err1 {
				t.Fatalf("Flush after a failure = %v, want the sticky %v", err, err1)
			}
			if w.Durable() != uint64(tc.wantLines) {
				t.Fatalf("Durable = %d, want %d", w.Durable(), tc.wantLines)
			}
			if err := w.Close(); err != err1 {
				t.Fatalf("Close = %v, want the sticky %v", err, err1)
			}
			if closed != 1 {
				t.Fatalf("file closed %d times, want 1", closed)
			}
			if _, err := tracefile.Repair(tracefile.SegmentPath(prefix, 0), nil); err != nil {
				t.Fatal(err)
			}
			var n int
			if _, err := os.Stat(tracefile.SegmentPath(prefix, 0)); err == nil {
				n = len(segmentLines(t, tracefile.SegmentPath(prefix, 0)))
			}
			if tc.failSync {
				return // what reached the page cache is readable; durability is what failed
			}
			if n != tc.wantLines {
				t.Fatalf("lines after repair = %d, want %d", n, tc.wantLines)
			}
		})
	}
}

// A SegmentWriter reuses its line buffers: with flushes overlapping as the trace writer's flusher
// runs them (lines buffered while the previous batch is written), the next lines go into the largest
// buffer kept, so that buffers stop growing once they fit a flush interval; the lines written are still
// every line, in order.
func TestSegmentWriterReusesTheLargestLineBuffer(t *testing.T) {
	t.Parallel()
	prefix := filepath.Join(t.TempDir(), "p")
	w, err := newDefaultSegmentWriter(prefix, 1<<30, 10)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	appendLines := func(n int) {
		for j := range n {
			l := bytes.Repeat([]byte{'a' + byte(j%26)}, 700)
			if err := w.Append(l); err != nil {
				t.Fatal(err)
			}
			want = append(want, string(l))
		}
	}
	write := func(b batch) {
		if err := w.complete(b, w.writeBatch(b)); err != nil {
			t.Fatal(err)
		}
	}
	appendLines(400)
	big := w.detach() // being written while the next lines are buffered
	appendLines(10)
	small := w.detach()
	write(big)
	write(small)
	appendLines(1)
	if got := cap(w.chunks[0].data); got < 400*701 {
		t.Fatalf("the next lines went into a buffer of %d bytes, want the one that held 400 lines (%d bytes)", got, 400*701)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got := prefixLines(t, prefix)
	var all []string
	for _, idx := range slices.Sorted(maps.Keys(got)) {
		all = append(all, got[idx]...)
	}
	if !slices.Equal(all, want) {
		t.Fatalf("%d lines written, want %d in order", len(all), len(want))
	}
}
