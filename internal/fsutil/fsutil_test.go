package fsutil

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteAtomicReplacesTheFile(t *testing.T) {
	tests := map[string]struct {
		opts    func(dir string) []option
		leftTmp string // a stale temporary file present before the write ("" none)
	}{
		"random temporary name": {opts: func(string) []option { return nil }},
		"fixed temporary name, stale leftover truncated": {
			opts:    func(dir string) []option { return []option{TempPath(filepath.Join(dir, "m.json.repair.tmp"))} },
			leftTmp: "m.json.repair.tmp",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "m.json")
			if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.leftTmp != "" {
				if err := os.WriteFile(filepath.Join(dir, tc.leftTmp), []byte("a much longer stale leftover"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := WriteFileAtomic(path, []byte("new"), 0o644, tc.opts(dir)...); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil || string(b) != "new" {
				t.Fatalf("content %q, %v; want %q", b, err, "new")
			}
			if st, _ := os.Stat(path); st.Mode().Perm() != 0o644 {
				t.Fatalf("mode %v, want 0644", st.Mode().Perm())
			}
			entries, _ := os.ReadDir(dir)
			if len(entries) != 1 {
				t.Fatalf("%d files left, want only %s", len(entries), path)
			}
		})
	}
}

func TestWriteAtomicLeavesOldFileOnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.json")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk full")
	err := WriteAtomic(path, 0o644, func(w io.Writer) error {
		_, _ = w.Write([]byte("half a merged arte"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Fatalf("the old file was replaced by a torn one: %q", b)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("%d files left, want only the old one", len(entries))
	}
}

func TestWriteAtomicCreatesTheDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b", "m.json")
	if err := WriteFileAtomic(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "x" {
		t.Fatalf("content %q, %v", b, err)
	}
}

func TestTempPathOutsideTheDirectoryIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.json")
	err := WriteFileAtomic(path, []byte("x"), 0o644, TempPath(filepath.Join(dir, "sub", "m.tmp")))
	if !errors.Is(err, errInvalidOption) {
		t.Fatalf("err %v, want ErrInvalidOption", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s written despite the refused option: %v", path, err)
	}
}

func TestSyncDir(t *testing.T) {
	if err := SyncDir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := SyncDir(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err %v, want ErrNotExist", err)
	}
}
