package golden

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recorder is a testing.TB that records a failure instead of stopping the test running it.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	panic(r)
}
func (r *recorder) Fatal(args ...any) { r.failed = fmt.Sprint(args...); panic(r) }

func check(t *testing.T, path string, got []byte, update bool) (failed string) {
	r := &recorder{TB: t}
	defer func() {
		if v := recover(); v != nil && v != any(r) {
			panic(v)
		}
		failed = r.failed
	}()
	Check(r, path, got, update)
	return ""
}

func TestCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "out.golden.txt")
	if err := os.WriteFile(path, []byte("a\nb\nc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		got      string
		wantFail string // a substring of the failure; empty: passes
	}{
		"equal":                {got: "a\nb\nc\n"},
		"second line differs":  {got: "a\nB\nc\n", wantFail: "at line 2"},
		"missing last newline": {got: "a\nb\nc", wantFail: "at line 3"},
		"longer":               {got: "a\nb\nc\nd\n", wantFail: "at line 4"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			failed := check(t, path, []byte(tc.got), false)
			switch {
			case tc.wantFail == "" && failed != "":
				t.Fatalf("failed: %s", failed)
			case tc.wantFail != "" && !strings.Contains(failed, tc.wantFail):
				t.Fatalf("failure %q, want it to say %q", failed, tc.wantFail)
			}
		})
	}
	if failed := check(t, filepath.Join(dir, "missing.golden.txt"), []byte("x"), false); !strings.Contains(failed, "-update") {
		t.Fatalf("a missing file: failure %q, want it to name -update", failed)
	}
	created := filepath.Join(dir, "new.golden.txt")
	if failed := check(t, created, []byte("new\n"), true); failed != "" {
		t.Fatalf("update: %s", failed)
	}
	if b, err := os.ReadFile(created); err != nil || string(b) != "new\n" {
		t.Fatalf("update wrote %q, %v", b, err)
	}
}
