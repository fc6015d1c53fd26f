package tracefile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A repair renames only over the file it read, and only over a sealed segment.
func TestVerifyRenameRule(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	prefix := filepath.Join(dir, "fpm.w")
	write := func(i uint64, data string) os.FileInfo {
		t.Helper()
		p := SegmentPath(prefix, i)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}
	fi0 := write(0, "zero")
	write(1, "one")
	p := &vproducer{prefix: prefix}
	seg := func(i uint64, fi os.FileInfo) *vsegment {
		return &vsegment{Segment: Segment{Index: i, Path: SegmentPath(prefix, i), Regular: true}, fi: fi}
	}
	v := &verifier{}
	if err := v.sealed(p, seg(0, fi0)); err != nil {
		t.Fatalf("sealed, unchanged segment: %v", err)
	}
	for name, tc := range map[string]func() *vsegment{
		"the newest segment": func() *vsegment {
			fi, _ := os.Stat(SegmentPath(prefix, 1))
			return seg(1, fi)
		},
		"changed since it was read": func() *vsegment {
			s := seg(0, fi0)
			write(0, "zero, rewritten")
			return s
		},
		"removed since it was read": func() *vsegment {
			s := seg(0, fi0)
			if err := os.Remove(s.Path); err != nil {
				t.Fatal(err)
			}
			return s
		},
	} {
		t.Run(name, func(t *testing.T) {
			if err := v.sealed(p, tc()); !errors.Is(err, errSegmentChanged) {
				t.Fatalf("got %v, want ErrSegmentChanged", err)
			}
		})
	}
}
