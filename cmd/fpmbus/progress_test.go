package main

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// captureProgress sends the progress of the commands run in t to a buffer.
func captureProgress(t *testing.T) *bytes.Buffer {
	var b bytes.Buffer
	progressOut = &b
	t.Cleanup(func() { progressOut = os.Stderr })
	return &b
}

// A long operation shows how far it is the same way everywhere: --progress lines prints lines that
// end at 100% of what the operation reads; none prints nothing; a bad mode is a usage error.
func TestLongOperationsShowProgress(t *testing.T) {
	src := filepath.Join("..", "..", "consumers", "merge", "testdata", "golden", "protocol_4rank")
	copyRanks := func(t *testing.T) (string, []string) {
		dir := t.TempDir()
		var files []string
		for _, f := range []string{"benchmark_results.json", "benchmark_results_dp1.json", "benchmark_results_dp2.json", "benchmark_results_dp3.json"} {
			body, err := os.ReadFile(filepath.Join(src, f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), body, 0o644); err != nil {
				t.Fatal(err)
			}
			files = append(files, filepath.Join(dir, f))
		}
		return dir, files
	}
	t.Run("bench merge, lines", func(t *testing.T) {
		out := captureProgress(t)
		_, files := copyRanks(t)
		if code, o := run(t, append([]string{"bench", "merge", "--progress", "lines"}, files...)...); code != 0 {
			t.Fatalf("exit %d:\n%s", code, o)
		}
		if !regexp.MustCompile(`(?m)^bench merge: reading ranks: [0-9.]+ kB of [0-9.]+ kB \(100%\)$`).MatchString(out.String()) {
			t.Fatalf("no line at 100%% in:\n%s", out)
		}
	})
	t.Run("bench merge, none", func(t *testing.T) {
		out := captureProgress(t)
		_, files := copyRanks(t)
		if code, o := run(t, append([]string{"bench", "merge", "--progress", "none"}, files...)...); code != 0 || out.Len() != 0 {
			t.Fatalf("exit %d, progress %q:\n%s", code, out, o)
		}
	})
	t.Run("trace verify, lines", func(t *testing.T) {
		out := captureProgress(t)
		// A trace output whose one producer has two segments: both are read (the newest is active).
		dir := t.TempDir()
		line := `{"timestamp":0,"event":{"schema":"dynamo.fpm.trace.v1","source":{"namespace":"dynamo","component":"backend","producer_id":"w"},"capture_mode":"full","observed_at_unix_ms":1,"fpm":{"version":1,"worker_id":"w","dp_rank":0,"counter_id":0,"wall_time":0.0,"scheduled_requests":{"num_prefill_requests":0,"sum_prefill_tokens":0,"var_prefill_length":0.0,"sum_prefill_kv_tokens":0,"num_decode_requests":0,"sum_decode_kv_tokens":0,"var_decode_kv_tokens":0.0},"queued_requests":{"num_prefill_requests":0,"sum_prefill_tokens":0,"var_prefill_length":0.0,"num_decode_requests":0,"sum_decode_kv_tokens":0,"var_decode_kv_tokens":0.0}}}}`
		for _, seg := range []string{"fpm.w.000000.jsonl.gz", "fpm.w.000001.jsonl.gz"} {
			writeGzip(t, filepath.Join(dir, seg), line+"\n")
		}
		if code, o := run(t, "trace", "verify", "--progress", "lines", filepath.Join(dir, "fpm")); code != 0 {
			t.Fatalf("exit %d:\n%s", code, o)
		}
		if !regexp.MustCompile(`(?m)^verify: reading segments: [0-9.]+ B of [0-9.]+ B \(100%\)$`).MatchString(out.String()) {
			t.Fatalf("no line at 100%% in:\n%s", out)
		}
	})
	t.Run("a bad mode", func(t *testing.T) {
		_, files := copyRanks(t)
		if code, o := run(t, append([]string{"bench", "merge", "--progress", "sometimes"}, files...)...); code != 2 || !strings.Contains(o, `--progress "sometimes"`) {
			t.Fatalf("exit %d:\n%s", code, o)
		}
	})
}

// writeGzip writes text, gzipped, to path.
func writeGzip(t *testing.T, path, text string) {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte(text))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
