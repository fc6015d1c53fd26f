package trace

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzReadSegment reads arbitrary bytes as a segment: it must never panic, and it either delivers
// lines or returns a *CorruptError whose offset is inside the file; Repair then leaves a segment that
// reads cleanly with exactly the lines before the offset. Seeds: the writer's own output (added here)
// plus testdata/fuzz/FuzzReadSegment.
func FuzzReadSegment(f *testing.F) {
	f.Add(append(member(f, "{\"a\":1}\n"), member(f, "{\"b\":2}\n{\"c\":3}\n")...))
	f.Add(member(f, "no newline"))
	f.Add([]byte{})
	f.Add([]byte{0x1f, 0x8b})
	dir := f.TempDir()
	// Small members keep decompression bombs fast; the limit's error path is fuzzed too.
	defer func(n int) { maxMemberBytes = n }(maxMemberBytes)
	maxMemberBytes = 1 << 20
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "t.w.000000.jsonl.gz")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		var before int
		err := ReadSegment(path, func(l []byte) error { before++; return nil })
		var ce *CorruptError
		if err != nil {
			if !errors.As(err, &ce) {
				t.Fatalf("error is not a *CorruptError: %v", err)
			}
			if ce.Offset < 0 || ce.Offset > int64(len(data)) || ce.Segment != path {
				t.Fatalf("bad CorruptError %+v for %d bytes", ce, len(data))
			}
		}
		res, rerr := Repair(path, nil)
		if rerr != nil {
			t.Fatalf("Repair: %v", rerr)
		}
		if res.Repaired != (err != nil) || res.KeptLines != before {
			t.Fatalf("Repair %+v disagrees with ReadSegment (%d lines, %v)", res, before, err)
		}
		if res.Removed {
			return
		}
		var after int
		if err := ReadSegment(path, func([]byte) error { after++; return nil }); err != nil {
			t.Fatalf("segment still corrupt after Repair: %v", err)
		}
		if after != before {
			t.Fatalf("lines after Repair %d, before %d", after, before)
		}
	})
}
