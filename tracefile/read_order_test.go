package tracefile

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestTraceReadOrder(t *testing.T) {
	for name, tc := range map[string]struct{ in, want []string }{
		"segments by index, not by name": {
			in:   []string{"d/o.w.1000000.jsonl.gz", "d/o.w.999999.jsonl.gz", "d/o.w.000002.jsonl.gz"},
			want: []string{"d/o.w.000002.jsonl.gz", "d/o.w.999999.jsonl.gz", "d/o.w.1000000.jsonl.gz"},
		},
		"producers by prefix": {
			in:   []string{"d/o.b.000000.jsonl.gz", "d/o.a.000001.jsonl.gz", "d/o.a.000000.jsonl.gz"},
			want: []string{"d/o.a.000000.jsonl.gz", "d/o.a.000001.jsonl.gz", "d/o.b.000000.jsonl.gz"},
		},
		"repeats dropped": {
			in:   []string{"d/o.a.000001.jsonl.gz", "d/o.a.000000.jsonl.gz", "d/o.a.000001.jsonl.gz"},
			want: []string{"d/o.a.000000.jsonl.gz", "d/o.a.000001.jsonl.gz"},
		},
		"a name that is not a segment's before the segments of its prefix": {
			in:   []string{"d/o.a.000000.jsonl.gz", "d/o.a"},
			want: []string{"d/o.a", "d/o.a.000000.jsonl.gz"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			if got := ReadOrder(tc.in); !slices.Equal(got, tc.want) {
				t.Errorf("ReadOrder(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestTraceSegmentFilesIn(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"o.a.000000.jsonl.gz", "o.a.000001.jsonl.gz", "notes.txt", "o.a.jsonl"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub.jsonl.gz"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := SegmentFilesIn(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "o.a.000000.jsonl.gz"), filepath.Join(dir, "o.a.000001.jsonl.gz")}
	if !slices.Equal(got, want) {
		t.Errorf("SegmentFilesIn = %q, want %q", got, want)
	}
	if _, err := SegmentFilesIn(filepath.Join(dir, "missing")); !os.IsNotExist(err) {
		t.Errorf("missing directory: %v, want a not-exist error", err)
	}
}
