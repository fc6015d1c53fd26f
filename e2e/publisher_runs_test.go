package e2e

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// Two publisher runs with the same bytes are two runs, through the real binary: one recording replayed
// twice into `fpmbus up`, a second apart, and then the deterministic synthetic publisher run twice with
// the same seed. The stream holds every FPM of every run once (each run under its own epoch) and the
// trace writer writes a line for each.
func TestUpStoresEveryRunOfIdenticalBytes(t *testing.T) {
	t.Parallel()
	const ranks, perRank = 2, 150
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	for i := range perRank {
		for r := range ranks {
			f := &schemas.FPM{Version: 1, WorkerID: "rec-w", DPRank: int64(r), CounterID: int64(i), WallTime: 0.01,
				Scheduled: schemas.ScheduledRequests{NumDecodeRequests: int64(i%7 + 1), SumDecodeKVTokens: int64(100 * i)}}
			d, err := schemas.DecodeFPM(schemas.EncodeMsgpack(f))
			if err != nil {
				t.Fatal(err)
			}
			l := schemas.TraceLine{Event: schemas.TraceEvent{Schema: schemas.TraceSchema, CaptureMode: schemas.CaptureFull,
				Source:           schemas.TraceSource{Namespace: "dynamo", Component: "backend", ProducerID: "rec-w"},
				ObservedAtUnixMs: 1_782_777_600_000 + int64(5*i), FPM: d.JSON}}
			_, _ = zw.Write(append(schemas.AppendTraceLine(nil, &l), '\n'))
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	rec := filepath.Join(t.TempDir(), "fpm.rec-w.000000.jsonl.gz")
	if err := os.WriteFile(rec, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	up := startUp(t, ranks)
	js := jsClient(t, up.url)
	stored := uint64(0)
	for pass := range 2 {
		out, err := run(t, 60*time.Second, fpmbusBin, "trace", "replay", rec, "--fpm-port", strconv.Itoa(up.basePort),
			"--wait-subscribers", "1", "--heartbeats", "off", "--progress-every", "0")
		if err != nil {
			t.Fatalf("replay %d: %v\n%s", pass, err, out)
		}
		stored += ranks * perRank
		waitStreamCount(t, js, streams.StreamFPM, stored, 30*time.Second)
		time.Sleep(time.Second) // the schedule: the second replay a second after the first
	}
	for pass := range 2 {
		pub := publish(t, 1, up.basePort, ranks, perRank, "det-w", "--rate", "300", "--seed", "11")
		if err := pub.wait(60 * time.Second); err != nil {
			t.Fatalf("publisher run %d: %v", pass, err)
		}
		for _, m := range sentRe.FindAllStringSubmatch(pub.Output(), -1) {
			n, _ := strconv.ParseUint(m[2], 10, 64)
			hb, _ := strconv.ParseUint(m[3], 10, 64)
			stored += n + hb
		}
		waitStreamCount(t, js, streams.StreamFPM, stored, 30*time.Second)
	}
	// Per worker and rank: every sequence of every run once, one epoch per run.
	copies := map[string]int{}
	epochs := map[string]map[string]bool{}
	for _, m := range storedFPMs(t, js, ">") {
		copies[fmt.Sprintf("%s/%d/%d/%s", m.key.WorkerID, m.key.DPRank, m.seq, m.epoch)]++
		wr := fmt.Sprintf("%s/%d", m.key.WorkerID, m.key.DPRank)
		if epochs[wr] == nil {
			epochs[wr] = map[string]bool{}
		}
		epochs[wr][m.epoch] = true
	}
	for k, n := range copies {
		if n != 1 {
			t.Fatalf("%s stored %d times", k, n)
		}
	}
	if n, _ := streamCount(t, js, streams.StreamFPM); n != stored {
		t.Fatalf("stream FPM holds %d messages, want %d: every FPM of the four runs", n, stored)
	}
	for _, w := range []string{"rec-w", "det-w"} {
		for r := range ranks {
			if got := len(epochs[fmt.Sprintf("%s/%d", w, r)]); got != 2 {
				t.Fatalf("%s rank %d: %d epochs, want one per run", w, r, got)
			}
		}
	}
	if err := up.proc.signal(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("fpmbus up exit: %v", err)
	}
	rl := traceLines(t, up.traceOut+".rec-w.*.jsonl.gz")
	dl := traceLines(t, up.traceOut+".det-w.*.jsonl.gz")
	if len(rl) != 2*ranks*perRank || uint64(len(rl)+len(dl)) != stored {
		t.Fatalf("traced %d lines of the replays (want %d) and %d of the publisher runs; %d stored", len(rl), 2*ranks*perRank, len(dl), stored)
	}
}
