package e2e

import (
	"bytes"
	"compress/gzip"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// replaySummary is what the tests read of `trace replay --summary-json`.
type replaySummary struct {
	StartedAt time.Time `json:"started_at"`
	Overall   struct {
		Replayed   int `json:"replayed"`
		Failed     int `json:"failed"`
		Heartbeats int `json:"heartbeats"`
		Lateness   struct {
			P99Ms float64 `json:"p99_ms"`
			MaxMs float64 `json:"max_ms"`
		} `json:"lateness"`
	} `json:"overall"`
	Skipped map[string]int `json:"skipped"`
	// rows are the --records-csv rows per dp_rank, in sequence order.
	rows map[int64][]replayRow
}

// replayRow is one --records-csv row.
type replayRow struct {
	seq            uint64
	scheduledMs    float64
	actualMs, late float64
}

func readRecordsCSV(t *testing.T, path string) map[int64][]replayRow {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64][]replayRow{}
	for _, r := range recs[1:] {
		rank, _ := strconv.ParseInt(r[1], 10, 64)
		seq, _ := strconv.ParseUint(r[4], 10, 64)
		sched, _ := strconv.ParseFloat(r[6], 64)
		act, _ := strconv.ParseFloat(r[7], 64)
		late, _ := strconv.ParseFloat(r[8], 64)
		if r[9] != "sent" {
			t.Fatalf("record %v not sent", r)
		}
		out[rank] = append(out[rank], replayRow{seq, sched, act, late})
	}
	for _, rows := range out {
		sort.Slice(rows, func(i, j int) bool { return rows[i].seq < rows[j].seq })
	}
	return out
}

// rankLines groups trace lines by dp_rank of producer, each in replay order (observed time, ties by
// line order), with the fpm's dp_rank parsed.
func rankLines(t *testing.T, lines []*schemas.TraceLine, producer string) map[int64][]*schemas.TraceLine {
	t.Helper()
	out := map[int64][]*schemas.TraceLine{}
	for _, l := range lines {
		if l.Event.Source.ProducerID != producer {
			continue
		}
		f, err := schemas.ParseFPMJSON(l.Event.FPM)
		if err != nil {
			t.Fatal(err)
		}
		out[f.DPRank] = append(out[f.DPRank], l)
	}
	for _, ls := range out {
		sort.SliceStable(ls, func(i, j int) bool { return ls[i].Event.ObservedAtUnixMs < ls[j].Event.ObservedAtUnixMs })
	}
	return out
}

// A recording replayed into a second pipeline comes out the same: per rank, the same fpm objects in the
// same order (worker ids mapped where asked), and inter-arrival times (of observed_at_unix_ms, at the
// replay's speed) equal to the recording's within the lateness the replay reported, plus the
// millisecond rounding of both traces and the second bridge's receive jitter. From a full trace, a
// sampled trace of the same run, to ZMQ and straight onto the stream, and at ten times the pace.
func TestTraceReplayRoundTrip(t *testing.T) {
	t.Parallel()
	const (
		ranks   = 2
		perRank = 250
		rate    = 100 // per rank per second
	)
	// The recording: a publisher drives a first pipeline writing a full trace.
	up1 := startUp(t, ranks)
	pub := publish(t, 1, up1.basePort, ranks, perRank, "e2e-w", "--rate", strconv.Itoa(rate), "--seed", "3")
	if err := pub.wait(60 * time.Second); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	js1 := jsClient(t, up1.url)
	waitStreamCount(t, js1, streams.StreamFPM, ranks*perRank, 30*time.Second)
	// The sampled trace of the same run, by backfill from the stream.
	sampledOut := filepath.Join(t.TempDir(), "sampled", "fpm")
	if out, err := run(t, 60*time.Second, fpmbusBin, "trace", "backfill", "--server", up1.url, "--trace-mode", "sampled",
		"--sample-interval", "100", "--trace-output", sampledOut, "--progress", "none"); err != nil {
		t.Fatalf("backfill: %v\n%s", err, out)
	}
	if err := up1.proc.signal(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("first fpmbus up: %v", err)
	}
	full := traceLines(t, up1.traceOut+".e2e-w.*.jsonl.gz")
	sampled := traceLines(t, sampledOut+".e2e-w.*.jsonl.gz")
	if len(full) != ranks*perRank || len(sampled) < 40 || sampled[0].Event.CaptureMode != schemas.CaptureSampled {
		t.Fatalf("recorded %d full lines and %d sampled ones", len(full), len(sampled))
	}

	// The second pipeline, and the replays into it, one after the other.
	up2 := startUp(t, ranks)
	type replayCase struct {
		name   string
		src    string
		lines  []*schemas.TraceLine
		worker string // the producer and worker_id it is replayed as
		speed  float64
		stream bool
		args   []string
	}
	cases := []replayCase{
		{"full trace to zmq", up1.traceOut, full, "e2e-w", 1, false, nil},
		{"sampled trace to zmq", sampledOut, sampled, "sampled-copy", 1, false, []string{"--map-worker", "e2e-w=sampled-copy"}},
		{"full trace to the stream", up1.traceOut, full, "stream-copy", 1, true, []string{"--to", "stream", "--server", up2.url, "--map-worker", "e2e-w=stream-copy"}},
		{"full trace at ten times the pace", up1.traceOut, full, "fast-copy", 10, false, []string{"--speed", "10", "--map-worker", "e2e-w=fast-copy"}},
	}
	js2 := jsClient(t, up2.url)
	summaries := map[string]replaySummary{}
	stored := uint64(0)
	for _, c := range cases {
		summary := filepath.Join(t.TempDir(), "summary.json")
		rows := filepath.Join(t.TempDir(), "records.csv")
		args := append([]string{"trace", "replay", c.src, "--summary-json", summary, "--records-csv", rows, "--progress-every", "0"}, c.args...)
		if !c.stream {
			args = append(args, "--fpm-port", strconv.Itoa(up2.basePort), "--wait-subscribers", "1")
		}
		out, err := run(t, 60*time.Second, fpmbusBin, args...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", c.name, err, out)
		}
		raw, err := os.ReadFile(summary)
		if err != nil {
			t.Fatal(err)
		}
		var s replaySummary
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatal(err)
		}
		if s.Overall.Replayed != len(c.lines) || s.Overall.Failed != 0 || len(s.Skipped) != 0 {
			t.Fatalf("%s: replayed %d of %d, failed %d, skipped %v\n%s", c.name, s.Overall.Replayed, len(c.lines), s.Overall.Failed, s.Skipped, out)
		}
		s.rows = readRecordsCSV(t, rows)
		summaries[c.name] = s
		stored += uint64(s.Overall.Replayed + s.Overall.Heartbeats)
		waitStreamCount(t, js2, streams.StreamFPM, stored, 30*time.Second)
	}
	if err := up2.proc.signal(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("second fpmbus up: %v", err)
	}
	second := traceLines(t, up2.traceOut+".*.jsonl.gz")

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := summaries[c.name]
			want := rankLines(t, c.lines, "e2e-w")
			got := rankLines(t, second, c.worker)
			// Where the second trace's observed times come from: the replay's sends (their lateness is
			// reported) plus the second bridge's receive delay, which the replay does not control; it is
			// measured here, per record, as observed_at minus the send's wall time.
			minDelay, maxDelay := math.Inf(1), math.Inf(-1)
			for rank, wl := range want {
				rows, gl := s.rows[rank], got[rank]
				if len(rows) != len(wl) || len(gl) != len(wl) {
					t.Fatalf("rank %d: recorded %d, replayed %d, the second trace holds %d", rank, len(wl), len(rows), len(gl))
				}
				for i := range wl {
					// The schedule is the recording's offsets at the replay's speed.
					wantOff := float64(wl[i].Event.ObservedAtUnixMs-wl[0].Event.ObservedAtUnixMs) / c.speed
					if d := rows[i].scheduledMs - rows[0].scheduledMs - wantOff; math.Abs(d) > 0.002 {
						t.Fatalf("rank %d record %d scheduled %.3f ms after the first, recorded %.3f ms", rank, i, rows[i].scheduledMs-rows[0].scheduledMs, wantOff)
					}
					sent := float64(s.StartedAt.UnixMicro())/1000 + rows[i].actualMs
					d := float64(gl[i].Event.ObservedAtUnixMs) - sent
					minDelay, maxDelay = math.Min(minDelay, d), math.Max(maxDelay, d)
				}
			}
			// One inter-arrival time may deviate by the replay's worst lateness (a late send shortens
			// the gap after it and lengthens the one before), the spread of the receive delay, and 2 ms
			// of millisecond rounding in the two traces. Both are measured in this run: a busy host
			// widens the tolerance by exactly the disturbance it caused, rather than failing the test.
			spread := maxDelay - minDelay
			// Nothing is received before the replay reports sending it: the receive delay is never
			// negative, but for the second trace's whole milliseconds (up to 1 ms), with a margin.
			if minDelay < -3 {
				t.Errorf("a record was observed %.1f ms before the replay reports sending it", -minDelay)
			}
			tol := s.Overall.Lateness.MaxMs + spread + 2
			worst := 0.0
			for rank, wl := range want {
				gl := got[rank]
				for i := range wl {
					wantFPM := wl[i].Event.FPM
					if c.worker != "e2e-w" {
						wantFPM = bytes.Replace(wantFPM, []byte(`"worker_id":"e2e-w"`), []byte(`"worker_id":"`+c.worker+`"`), 1)
					}
					if !bytes.Equal(gl[i].Event.FPM, wantFPM) {
						t.Fatalf("rank %d line %d:\n%s\nwant\n%s", rank, i, gl[i].Event.FPM, wantFPM)
					}
					if i == 0 {
						continue
					}
					wantGap := float64(wl[i].Event.ObservedAtUnixMs-wl[i-1].Event.ObservedAtUnixMs) / c.speed
					gotGap := float64(gl[i].Event.ObservedAtUnixMs - gl[i-1].Event.ObservedAtUnixMs)
					worst = math.Max(worst, math.Abs(gotGap-wantGap))
					if math.Abs(gotGap-wantGap) > tol {
						t.Errorf("rank %d line %d: %.1f ms after the one before, the recording %.1f ms (tolerance %.1f ms: lateness max %.2f ms + receive delay spread %.1f ms + 2 ms rounding)",
							rank, i, gotGap, wantGap, tol, s.Overall.Lateness.MaxMs, spread)
					}
				}
			}
			t.Logf("inter-arrival deviation at most %.1f ms (tolerance %.1f); replay lateness p99 %.2f ms, max %.2f ms; receive delay %.1f..%.1f ms",
				worst, tol, s.Overall.Lateness.P99Ms, s.Overall.Lateness.MaxMs, minDelay, maxDelay)
		})
	}
}

// `fpmbus up --demo --demo-trace` replays a recording as the demo's load: the ranks it holds, on the
// bridge's ports, looped, counter ids renumbered so that the pipeline sees one live publisher per rank.
func TestUpDemoTraceReplaysARecording(t *testing.T) {
	t.Parallel()
	const ranks, perRank = 2, 40
	// A recording of 40 FPMs per rank, 10 ms apart (0.4 s).
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	var fpms [ranks][][]byte
	for i := range perRank {
		for r := range ranks {
			f := &schemas.FPM{Version: 1, WorkerID: "rec-w", DPRank: int64(r), CounterID: int64(5000 + i), WallTime: 0.01,
				Scheduled: schemas.ScheduledRequests{NumDecodeRequests: int64(i + 1), SumDecodeKVTokens: int64(100 * i)}}
			d, err := schemas.DecodeFPM(schemas.EncodeMsgpack(f))
			if err != nil {
				t.Fatal(err)
			}
			fpms[r] = append(fpms[r], d.JSON)
			l := schemas.TraceLine{Event: schemas.TraceEvent{Schema: schemas.TraceSchema, CaptureMode: schemas.CaptureFull,
				Source:           schemas.TraceSource{Namespace: "dynamo", Component: "backend", ProducerID: "rec-w"},
				ObservedAtUnixMs: 1_782_777_600_000 + int64(10*i), FPM: d.JSON}}
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

	dir := t.TempDir()
	base := producertest.FreeBasePort(t, "", ranks)
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	up := fpmbus(t, "fpmbus up --demo-trace", "up", "--demo", "--demo-trace", rec, "--listen", listen, "--data-dir", filepath.Join(dir, "data"),
		"--fpm-port", strconv.Itoa(base), "--trace-output", filepath.Join(dir, "trace", "fpm"))
	up.waitOutput("demo publishers ready", 30*time.Second)
	js := jsClient(t, "nats://"+listen)
	// More than two passes: the loop goes on.
	eventually(t, 30*time.Second, func() error {
		n, err := streamCount(t, js, streams.StreamFPM)
		if err != nil || n < 2*ranks*perRank+ranks {
			return fmt.Errorf("stream FPM holds %d messages (%v)", n, err)
		}
		return nil
	})
	if err := up.signal(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("fpmbus up: %v", err)
	}
	// Read what was stored from the stopped pipeline's store.
	env := natsservertest.StartAt(t, "127.0.0.1:0", filepath.Join(dir, "data", "jetstream"))
	got := storedFPMs(t, env.JS, ">")
	if len(got) < 2*ranks*perRank+ranks {
		t.Fatalf("stored %d", len(got))
	}
	next := map[int]uint64{}
	for _, m := range got {
		r := m.key.DPRank
		if m.key.WorkerID != "rec-w" || r >= ranks || m.seq != next[r] {
			t.Fatalf("%s seq %d, want seq %d of rec-w's ranks", m.subject, m.seq, next[r])
		}
		i := int(m.seq % perRank) // the pass's record
		want := bytes.Replace(fpms[r][i], []byte(`"counter_id":`+strconv.Itoa(5000+i)), []byte(`"counter_id":`+strconv.FormatUint(m.seq, 10)), 1)
		if !bytes.Equal(m.body, want) || m.header.Get(streams.HeaderSeqMismatch) != "" {
			t.Fatalf("rank %d seq %d:\n%s\nwant\n%s", r, m.seq, m.body, want)
		}
		next[r]++
	}
}
