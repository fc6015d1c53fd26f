package e2e

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// Fields a producer adds that fpmbus does not know (a vLLM-native FPM's timing_scope between counter_id
// and wall_time, of any type, and nested objects at the end) keep their place and their bytes through
// every path: a recording replayed over ZMQ through the bridge is stored with the recorded fpm as its
// body, traced with it, backfilled from the stream with it, and replayed straight onto the stream with it.
// testdata/unknown_fields.jsonl is both the recording and the expected bytes.
func TestUnknownFieldsKeepTheirPlaceThroughEveryPath(t *testing.T) {
	t.Parallel()
	want := recordingFPMs(t, "testdata/unknown_fields.jsonl")
	rec := filepath.Join(t.TempDir(), "rec", "fpm.rec-w.000000.jsonl.gz")
	writeGzipLines(t, rec, "testdata/unknown_fields.jsonl")

	up := startUp(t, 2)
	out, err := run(t, 60*time.Second, fpmbusBin, "trace", "replay", rec, "--fpm-port", strconv.Itoa(up.basePort),
		"--wait-subscribers", "1", "--speed", "4", "--progress-every", "0")
	if err != nil {
		t.Fatalf("replay to zmq: %v\n%s", err, out)
	}
	out, err = run(t, 60*time.Second, fpmbusBin, "trace", "replay", rec, "--to", "stream", "--server", up.url,
		"--map-worker", "rec-w=stream-w", "--speed", "4", "--progress-every", "0")
	if err != nil {
		t.Fatalf("replay to the stream: %v\n%s", err, out)
	}
	js := jsClient(t, up.url)
	waitStreamCount(t, js, streams.StreamFPM, uint64(2*len(want)), 60*time.Second)

	check := func(path string, got [][]byte, worker string) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d FPMs, want %d", path, len(got), len(want))
		}
		for i, fpm := range got {
			w := want[i]
			if worker != "rec-w" {
				w = bytes.Replace(w, []byte(`"worker_id":"rec-w"`), []byte(`"worker_id":"`+worker+`"`), 1)
			}
			if !bytes.Equal(fpm, w) {
				t.Fatalf("%s, FPM %d:\n got %s\nwant %s", path, i, fpm, w)
			}
		}
	}
	for _, worker := range []string{"rec-w", "stream-w"} {
		var bodies [][]byte
		for _, m := range storedFPMs(t, js, "fpm.*.backend."+worker+".>") {
			bodies = append(bodies, m.body)
		}
		check("stream FPM ("+worker+")", byCounter(t, bodies), worker)
	}

	backfill := filepath.Join(t.TempDir(), "backfill", "fpm")
	if out, err := run(t, 60*time.Second, fpmbusBin, "trace", "backfill", "--server", up.url, "--trace-mode", "full",
		"--trace-output", backfill, "--progress", "none"); err != nil {
		t.Fatalf("backfill: %v\n%s", err, out)
	}
	if err := up.proc.signal(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("fpmbus up: %v", err)
	}
	for _, c := range []struct{ path, worker string }{
		{up.traceOut + ".rec-w.*.jsonl.gz", "rec-w"}, {up.traceOut + ".stream-w.*.jsonl.gz", "stream-w"},
		{backfill + ".rec-w.*.jsonl.gz", "rec-w"}, {backfill + ".stream-w.*.jsonl.gz", "stream-w"},
	} {
		var fpms [][]byte
		for _, l := range traceLines(t, c.path) {
			fpms = append(fpms, l.Event.FPM)
		}
		check(c.path, byCounter(t, fpms), c.worker)
	}
}

// recordingFPMs returns the fpm objects of a trace file's lines, in the order byCounter sorts them.
func recordingFPMs(t *testing.T, path string) [][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var fpms [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		l, err := schemas.ParseTraceLine(sc.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		fpms = append(fpms, append([]byte(nil), l.Event.FPM...))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return byCounter(t, fpms)
}

// byCounter orders fpm objects by (dp_rank, counter_id), a key under which the recording is unique.
func byCounter(t *testing.T, fpms [][]byte) [][]byte {
	t.Helper()
	type keyed struct {
		rank, counter int64
		fpm           []byte
	}
	ks := make([]keyed, len(fpms))
	for i, b := range fpms {
		f, err := schemas.ParseFPMJSON(b)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		ks[i] = keyed{f.DPRank, f.CounterID, b}
	}
	for i := 1; i < len(ks); i++ { // insertion sort: a few dozen FPMs
		for j := i; j > 0 && (ks[j].rank < ks[j-1].rank || ks[j].rank == ks[j-1].rank && ks[j].counter < ks[j-1].counter); j-- {
			ks[j], ks[j-1] = ks[j-1], ks[j]
		}
	}
	out := make([][]byte, len(ks))
	for i, k := range ks {
		out[i] = k.fpm
	}
	return out
}

// writeGzipLines writes the text file src, gzipped, to dst (a trace segment).
func writeGzipLines(t *testing.T, dst, src string) {
	t.Helper()
	body, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write(body)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
