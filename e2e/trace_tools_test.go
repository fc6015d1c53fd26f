package e2e

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// eventsByProducer reads the segments matching pattern and returns, per producer_id, the "event"
// objects in file order (producer files in index order).
func eventsByProducer(t *testing.T, pattern string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, l := range traceLines(t, pattern) {
		ev, err := json.Marshal(l.Event)
		if err != nil {
			t.Fatal(err)
		}
		out[l.Event.Source.ProducerID] = append(out[l.Event.Source.ProducerID], string(ev))
	}
	return out
}

// `fpmbus trace backfill` over a range writes the events the live `fpmbus trace` wrote for it (both
// modes), and `fpmbus trace info` describes the result; a file that is not a trace is an error naming
// it.
func TestTraceBackfillAndInfoCommands(t *testing.T) {
	t.Parallel()
	const total = 6000
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	fillFPM(t, env.JS, total, 2, 2, 1_782_777_600_000)
	waitStreamCount(t, env.JS, streams.StreamFPM, total, 30*time.Second)
	dir := t.TempDir()

	for _, mode := range []string{"full", "sampled"} {
		t.Run(mode, func(t *testing.T) {
			live := filepath.Join(dir, mode, "live", "fpm")
			group := "live-" + mode
			p := fpmbus(t, "fpmbus trace "+mode, "trace", "--server", url, "--trace-mode", mode, "--trace-output", live,
				"--group", group, "--sample-interval", "1000")
			eventually(t, 30*time.Second, func() error {
				c, err := env.JS.PushConsumer(t.Context(), streams.StreamFPM, group)
				if err != nil {
					return err
				}
				ci, err := c.Info(t.Context())
				if err != nil {
					return err
				}
				if ci.Delivered.Stream != total || ci.NumPending != 0 {
					return fmt.Errorf("delivered %d", ci.Delivered.Stream)
				}
				return nil
			})
			time.Sleep(200 * time.Millisecond)
			if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
				t.Fatalf("live writer: %v", err)
			}
			// The range: whole sampled intervals (4 keys, 1 ms apart: 1000 messages per second of
			// event time), sequences 2001..5000.
			back := filepath.Join(dir, mode, "backfill", "fpm")
			out, err := run(t, 60*time.Second, fpmbusBin, "trace", "backfill", "--server", url, "--trace-mode", mode,
				"--trace-output", back, "--sample-interval", "1000", "--start-seq", "2001", "--end-seq", "5000", "--progress", "lines")
			if err != nil {
				t.Fatalf("backfill: %v\n%s", err, out)
			}
			if !strings.Contains(out, "backfill: 3000 messages (stream sequences 2001..5000)") || !strings.Contains(out, "backfill: 3000/3000 messages (100%)") {
				t.Fatalf("backfill output:\n%s", out)
			}
			want := map[string][]string{}
			for p, evs := range eventsByProducer(t, live+".*.jsonl.gz") {
				for _, e := range evs {
					var ev struct {
						Observed int64 `json:"observed_at_unix_ms"`
					}
					_ = json.Unmarshal([]byte(e), &ev)
					if seq := ev.Observed - 1_782_777_600_000 + 1; seq >= 2001 && seq <= 5000 {
						want[p] = append(want[p], e)
					}
				}
			}
			got := eventsByProducer(t, back+".*.jsonl.gz")
			if len(got) != len(want) || len(want) == 0 {
				t.Fatalf("producers: backfill %d, live %d", len(got), len(want))
			}
			for p := range want {
				if strings.Join(got[p], "\n") != strings.Join(want[p], "\n") {
					t.Fatalf("producer %s: backfill wrote %d events, live %d for the range, or they differ", p, len(got[p]), len(want[p]))
				}
			}

			// trace info --json on the backfill's directory.
			js, err := run(t, 30*time.Second, fpmbusBin, "trace", "info", filepath.Dir(back), "--json")
			if err != nil {
				t.Fatalf("info: %v\n%s", err, js)
			}
			var rep struct {
				Producers []struct {
					Producer string `json:"producer"`
					Lines    int    `json:"lines"`
					Keys     []struct {
						CaptureModes []string `json:"capture_modes"`
						Lines        int      `json:"lines"`
						Missing      int64    `json:"missing"`
						Heartbeats   int      `json:"heartbeats"`
					} `json:"keys"`
				} `json:"producers"`
				Damaged []any `json:"damaged"`
			}
			if err := json.Unmarshal([]byte(js), &rep); err != nil {
				t.Fatalf("info --json: %v\n%s", err, js)
			}
			lines, heartbeats := 0, 0
			for _, p := range rep.Producers {
				lines += p.Lines
				for _, k := range p.Keys {
					heartbeats += k.Heartbeats
					if k.CaptureModes[0] != mode || mode == "full" && k.Missing != 0 {
						t.Fatalf("info key %+v", k)
					}
				}
			}
			if mode == "full" && heartbeats != 300 { // every tenth message of 3000
				t.Fatalf("info: %d heartbeats, want 300", heartbeats)
			}
			wantLines := 0
			for _, evs := range want {
				wantLines += len(evs)
			}
			if lines != wantLines || len(rep.Damaged) != 0 {
				t.Fatalf("info: %d lines, %d damaged; the backfill wrote %d lines", lines, len(rep.Damaged), wantLines)
			}
		})
	}

	// Not a trace: an error naming the file, exit status 1.
	bad := filepath.Join(dir, "bad", "fpm.x.000000.jsonl.gz")
	if err := os.MkdirAll(filepath.Dir(bad), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write([]byte("{\"msg\":\"a log line\"}\n"))
	_ = zw.Close()
	if err := os.WriteFile(bad, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, 30*time.Second, fpmbusBin, "trace", "info", bad)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out, bad+":1:") {
		t.Fatalf("info on a non-trace: %v\n%s", err, out)
	}
}
