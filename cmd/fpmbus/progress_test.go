package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
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

// `datasets publish` and `datasets ls` over many cells show their progress as the other long
// operations do: lines ending at 100% of the cells published and of the revisions read; none with
// --progress none.
func TestDatasetsShowProgress(t *testing.T) {
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	const cells = 12
	ds := schemas.Dataset{SchemaVersion: schemas.DatasetSchemaVersion, Kind: schemas.DatasetKind, RunID: "progress-run"}
	for i := range cells {
		c := schemas.Cell{Identity: schemas.CellIdentity{SchemaVersion: schemas.DatasetSchemaVersion, Model: fmt.Sprintf("m/%02d", i),
			Hardware: "H200-SXM", Backend: "vllm", BackendVersion: "0.29.0", Quantization: "fp8", KVCacheDType: "auto",
			Parallelism:       schemas.Parallelism{TP: 4, PP: 1, DP: 1, MoETP: 4, MoEEP: 1, CP: 1},
			BackendSelections: map[string]string{"attention_backend": "auto"}, ProfileName: "default", ProfileVersion: "1",
			SettingsDigest: strings.Repeat("ab", 32)},
			Provenance: schemas.Provenance{RunID: ds.RunID, GridDigest: "g", ArtefactDigest: strings.Repeat("0f", 32)},
			Rows:       []schemas.Row{{Phase: schemas.PhaseDecode, NumDecodeRequests: 8, SumDecodeKVTokens: 4096, LatencyMS: 10}}}
		c.Finish()
		ds.Cells = append(ds.Cells, c)
	}
	body, err := json.Marshal(ds)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dataset.json")
	if err := os.WriteFile(file, body, 0o644); err != nil {
		t.Fatal(err)
	}

	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0) // the report and the listing: not what is tested
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = devNull
	t.Cleanup(func() { os.Stdout = stdout; devNull.Close() })

	out := captureProgress(t)
	if code, o := run(t, "datasets", "publish", "--server", url, "--progress", "lines", file); code != 0 {
		t.Fatalf("datasets publish: exit %d:\n%s", code, o)
	}
	if want := fmt.Sprintf("datasets publish: %d/%d cells (100%%)", cells, cells); !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(want) + `$`).MatchString(out.String()) {
		t.Fatalf("datasets publish: no line %q in:\n%s", want, out)
	}

	out.Reset()
	if code, o := run(t, "datasets", "ls", "--server", url, "--progress", "lines"); code != 0 {
		t.Fatalf("datasets ls: exit %d:\n%s", code, o)
	}
	// Every cell and the campaign the publication recorded: at least one revision each.
	m := regexp.MustCompile(`(?m)^datasets ls: reading revisions: ([0-9]+)/([0-9]+) revisions \(100%\)$`).FindStringSubmatch(out.String())
	if m == nil || m[1] != m[2] {
		t.Fatalf("datasets ls: no line at 100%% in:\n%s", out)
	}
	if n, _ := strconv.Atoi(m[1]); n < cells+1 {
		t.Fatalf("datasets ls read %d revisions, want at least the %d cells and the campaign", n, cells)
	}

	out.Reset()
	if code, o := run(t, "datasets", "ls", "--server", url, "--progress", "none"); code != 0 || out.Len() != 0 {
		t.Fatalf("datasets ls --progress none: exit %d, progress %q:\n%s", code, out, o)
	}
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
