package trace

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/schemas"
)

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The writer's names are the trace format's (schemas/trace_files_test.go tests the rule itself): the
// same prefix, producer and segment names, and the same files claimed in a shared directory.
func TestSegmentNamesAreTheTraceFormats(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "trace.jsonl.gz")
	for name, id := range map[string]string{
		"clean id":        "4192",
		"odd characters":  "worker/a:b ö",
		"empty id":        "",
		"long id, hashed": strings.Repeat("x/", 300),
	} {
		t.Run(name, func(t *testing.T) {
			if got, want := SanitizeProducerID(id), schemas.SanitizeProducerID(id); got != want {
				t.Fatalf("SanitizeProducerID = %q, want %q", got, want)
			}
			if got, want := ProducerFileName(out, id), schemas.TraceProducerFileName(out, id); got != want {
				t.Fatalf("ProducerFileName = %q, want %q", got, want)
			}
			prefix := SegmentPrefix(out, id)
			if want := filepath.Join(dir, "trace") + "." + schemas.TraceProducerFileName(out, id); prefix != want || OutputBase(out) != filepath.Join(dir, "trace") {
				t.Fatalf("SegmentPrefix = %q, want %q", prefix, want)
			}
			for _, i := range []uint64{0, 1_000_000, ^uint64(0)} {
				if got, want := SegmentPath(prefix, i), schemas.TraceSegmentPath(prefix, i); got != want {
					t.Fatalf("SegmentPath(%d) = %q, want %q", i, got, want)
				}
			}
		})
	}
	for _, n := range []string{
		"trace.w.000000.jsonl.gz", "trace.w.000003.jsonl.gz", "trace.w.1000000000000000000.jsonl.gz",
		"trace.w10.000001.jsonl.gz", "trace.w.0000004.jsonl.gz", "trace.w.000005.jsonl.gz.tmp", "other.w.000000.jsonl.gz",
	} {
		touch(t, filepath.Join(dir, n))
	}
	prefix := filepath.Join(dir, "trace.w")
	segs, err := ListSegments(prefix)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, s := range segs {
		got = append(got, s.Index)
	}
	if want := []uint64{0, 3, 1000000000000000000}; !slices.Equal(got, want) {
		t.Fatalf("ListSegments indexes = %v, want %v", got, want)
	}
	if next, err := NextSegmentIndex(prefix); err != nil || next != 1000000000000000001 {
		t.Fatalf("NextSegmentIndex = %d, %v", next, err)
	}
	if p, err := Producers(out); err != nil || !slices.Equal(p, []string{"w", "w10"}) {
		t.Fatalf("Producers = %q, %v", p, err)
	}
}
