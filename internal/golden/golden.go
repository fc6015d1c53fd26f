// Package golden compares what a test made with an expected file under testdata, byte for byte.
// Each test package has its own -update flag: run with it, Check first rewrites the files from what
// the code makes now (review their diff before committing it).
package golden

import (
	"bytes"
	"os"
	"testing"
)

// Check fails t unless got equals the file at path, naming the first line that differs. With update
// it writes got to path first.
func Check(t testing.TB, path string, got []byte, update bool) {
	t.Helper()
	if update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if bytes.Equal(got, want) {
		return
	}
	n := 0
	for n < len(got) && n < len(want) && got[n] == want[n] {
		n++
	}
	line := 1 + bytes.Count(got[:n], []byte("\n"))
	t.Fatalf("%s differs from the output at line %d (rerun with -update if the change is intended):\n got %q\nwant %q",
		path, line, lineAt(got, line), lineAt(want, line))
}

// lineAt is line n (1-based) of b, empty past its end.
func lineAt(b []byte, n int) []byte {
	lines := bytes.SplitN(b, []byte("\n"), n+1)
	if len(lines) < n {
		return nil
	}
	return lines[n-1]
}
