package e2e

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// `fpmbus trace info` on a directory with a torn segment prints the whole report, the torn segment
// read up to its damage, and exits 1; on intact segments it exits 0.
func TestTraceInfoExitsNonzeroOnADamagedSegment(t *testing.T) {
	t.Parallel()
	golden, err := os.Open("../consumers/trace/testdata/full_trace.golden.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer golden.Close()
	var lines []string
	sc := bufio.NewScanner(golden)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if l := sc.Text(); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	if len(lines) < 4 {
		t.Fatalf("golden trace has %d lines", len(lines))
	}
	segment := func(ls []string) []byte {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		for _, l := range ls {
			zw.Write([]byte(l + "\n"))
		}
		zw.Close()
		return b.Bytes()
	}
	dir := t.TempDir()
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("fpm.w.000000.jsonl.gz", segment(lines))
	out, err := run(t, 30*time.Second, fpmbusBin, "trace", "info", dir)
	if err != nil {
		t.Fatalf("trace info on intact segments: %v\n%s", err, out)
	}
	whole := segment(lines)
	write("fpm.w.000001.jsonl.gz", whole[:len(whole)-12]) // torn: the gzip trailer and more are missing
	out, err = run(t, 30*time.Second, fpmbusBin, "trace", "info", dir)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("trace info on a torn segment: %v, want exit status 1\n%s", err, out)
	}
	for _, want := range []string{"fpm.w.000000.jsonl.gz", "TRUNCATED", "damaged: " + filepath.Join(dir, "fpm.w.000001.jsonl.gz"), "damaged segment"} {
		if !strings.Contains(out, want) {
			t.Fatalf("trace info output lacks %q:\n%s", want, out)
		}
	}
}
