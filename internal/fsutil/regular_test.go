package fsutil

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// plant puts what at path: "symlink" (to victim), "dangling" (a symlink to nothing), "fifo", "dir",
// "regular" (a file holding "old"), or "" (nothing).
func plant(t *testing.T, what, path, victim string) {
	t.Helper()
	var err error
	switch what {
	case "symlink":
		err = os.Symlink(victim, path)
	case "dangling":
		err = os.Symlink(filepath.Join(filepath.Dir(path), "nothing-here"), path)
	case "fifo":
		err = syscall.Mkfifo(path, 0o644)
	case "dir":
		err = os.Mkdir(path, 0o755)
	case "regular":
		err = os.WriteFile(path, []byte("old"), 0o644)
	case "":
	default:
		t.Fatalf("plant %q", what)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// victimFile is a file outside the directory under test that nothing may change.
func victimFile(t *testing.T) string {
	t.Helper()
	v := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(v, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	return v
}

func checkVictim(t *testing.T, v string) {
	t.Helper()
	if b, err := os.ReadFile(v); err != nil || string(b) != "precious" {
		t.Fatalf("the file a planted link points to changed: %q, %v", b, err)
	}
}

// Every way fpmbus creates, replaces, reads to rewrite or removes a file refuses what is not a regular
// file at its name, naming the path, and writes nothing through it.
func TestNothingIsWrittenThroughAPlantedFile(t *testing.T) {
	t.Parallel()
	ops := map[string]struct {
		name string // the file name the operation opens
		run  func(dir string) error
	}{
		"WriteAtomic: path": {"out.json", func(dir string) error {
			return WriteFileAtomic(filepath.Join(dir, "out.json"), []byte("new"), 0o644)
		}},
		"WriteAtomic: fixed temporary file": {"seg.jsonl.gz.repair.tmp", func(dir string) error {
			p := filepath.Join(dir, "seg.jsonl.gz")
			if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
				return err
			}
			return WriteFileAtomic(p, []byte("new"), 0o644, TempPath(p+".repair.tmp"))
		}},
		"CreateRegular": {"records.csv", func(dir string) error {
			f, err := CreateRegular(filepath.Join(dir, "records.csv"), 0o644)
			if err == nil {
				_, err = f.WriteString("new")
				f.Close()
			}
			return err
		}},
		"OpenRegular": {"token", func(dir string) error {
			f, err := openRegular(filepath.Join(dir, "token"))
			if err == nil {
				f.Close()
			}
			return err
		}},
		"AppendRegular: created if missing": {"sent.jsonl", func(dir string) error {
			f, err := AppendRegular(filepath.Join(dir, "sent.jsonl"), os.O_CREATE, 0o644)
			if err == nil {
				_, err = f.WriteString("new")
				f.Close()
			}
			return err
		}},
		"AppendRegular: existing only": {"seg.000002.jsonl.gz", func(dir string) error {
			f, err := AppendRegular(filepath.Join(dir, "seg.000002.jsonl.gz"), 0, 0)
			if err == nil {
				_, err = f.WriteString("new")
				f.Close()
			}
			return err
		}},
		"RemoveRegular": {"sidecar.json", func(dir string) error { return RemoveRegular(filepath.Join(dir, "sidecar.json")) }},
		"CreateExclusive": {"seg.000001.jsonl.gz", func(dir string) error {
			f, err := CreateExclusive(filepath.Join(dir, "seg.000001.jsonl.gz"), os.O_WRONLY, 0o644)
			if err == nil {
				f.Close()
			}
			return err
		}},
	}
	for _, what := range []string{"symlink", "dangling", "fifo", "dir"} {
		for name, op := range ops {
			t.Run(name+"/"+what, func(t *testing.T) {
				t.Parallel()
				dir, victim := t.TempDir(), victimFile(t)
				path := filepath.Join(dir, op.name)
				plant(t, what, path, victim)
				err := op.run(dir)
				var nr *NotRegularError
				if !errors.As(err, &nr) || nr.Path != path || !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), path) {
					t.Fatalf("err %v, want a *NotRegularError naming %s", err, path)
				}
				checkVictim(t, victim)
				if fi, lerr := os.Lstat(path); lerr != nil || fi.Mode().IsRegular() {
					t.Fatalf("what was planted at %s was replaced: %v, %v", path, fi, lerr)
				}
			})
		}
	}
}

func TestRegularFilesAreHandled(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	plant(t, "regular", p, "")
	f, err := CreateRegular(p, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(f, "new"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if b, fi, err := ReadRegular(p); err != nil || string(b) != "new" || !fi.Mode().IsRegular() {
		t.Fatalf("read %q %v %v", b, fi, err)
	}
	if _, err := CreateExclusive(p, os.O_WRONLY, 0o644); !errors.Is(err, os.ErrExist) || errors.Is(err, ErrNotRegular) {
		t.Fatalf("exclusive create over a regular file: %v, want ErrExist only", err)
	}
	a, err := AppendRegular(p, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(a, "er"); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if b, _, err := ReadRegular(p); err != nil || string(b) != "newer" {
		t.Fatalf("after appending: %q %v", b, err)
	}
	if err := RemoveRegular(p); err != nil {
		t.Fatal(err)
	}
	if _, err := AppendRegular(p, 0, 0); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("appending to a missing file without os.O_CREATE: %v, want ErrNotExist", err)
	}
	if err := RemoveRegular(p); err != nil {
		t.Fatalf("removing a missing file: %v", err)
	}
}

func TestEnsureDir(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		plant   string
		wantErr bool
	}{
		"missing: created":               {plant: ""},
		"a directory":                    {plant: "dir"},
		"a symbolic link to a directory": {plant: "symlink", wantErr: true},
		"a regular file":                 {plant: "regular", wantErr: true},
		"a named pipe":                   {plant: "fifo", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			p := filepath.Join(dir, "data")
			plant(t, tc.plant, p, t.TempDir())
			err := EnsureDir(filepath.Join(p, "."), 0o755)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), p) {
					t.Fatalf("err %v, want one naming %s", err, p)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
				t.Fatalf("%s: %v %v", p, fi, err)
			}
		})
	}
}
