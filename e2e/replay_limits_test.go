package e2e

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/schemas"
)

// writeRecording writes a full trace segment of producer to dir: one FPM per observed time, on rank
// i % ranks, and returns its path.
func writeRecording(t *testing.T, dir, producer string, ranks int, observed []int64) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	for i, at := range observed {
		f := &schemas.FPM{Version: 1, WorkerID: producer, DPRank: int64(i % ranks), CounterID: int64(i), WallTime: 0.01,
			Scheduled: schemas.ScheduledRequests{NumDecodeRequests: int64(i%7 + 1), SumDecodeKVTokens: int64(100 * i)}}
		d, err := schemas.DecodeFPM(schemas.EncodeMsgpack(f))
		if err != nil {
			t.Fatal(err)
		}
		l := schemas.TraceLine{Event: schemas.TraceEvent{Schema: schemas.TraceSchema, CaptureMode: schemas.CaptureFull,
			Source:           schemas.TraceSource{Namespace: "dynamo", Component: "backend", ProducerID: producer},
			ObservedAtUnixMs: at, FPM: d.JSON}}
		if _, err := zw.Write(append(schemas.AppendTraceLine(nil, &l), '\n')); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "fpm."+producer+".000000.jsonl.gz")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Extreme pace values through the binary: a speed (or rate cap) whose schedule does not fit the
// longest span is refused with exit 2 naming it, one that fits is computed exactly (the plan's
// duration is the recording's divided by the speed, to the nanosecond), and a recording whose observed
// times span their whole range is described exactly, never as a negative duration.
func TestTraceReplayExtremePaceValues(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rec := writeRecording(t, filepath.Join(dir, "a"), "w", 2, []int64{1_782_777_600_000, 1_782_777_600_010, 1_782_777_601_000})
	wide := writeRecording(t, filepath.Join(dir, "b"), "w", 1, []int64{0, 1, math.MaxInt64})

	for name, c := range map[string]struct {
		args []string
		code int
		out  string
	}{
		"--speed 1e-12 is refused":      {[]string{rec, "--dry-run", "--speed", "1e-12"}, 2, "speed 1e-12: the record observed 0.010s after the window's start (w/1) would be due 317 years"},
		"--speed 1e-300 is refused":     {[]string{rec, "--dry-run", "--speed", "1e-300"}, 2, "beyond the 292 years a schedule can span"},
		"--speed 1e-10 of a second":     {[]string{rec, "--dry-run", "--speed", "1e-10"}, 2, "the record observed 1.000s after the window's start (w/0) would be due 317 years"},
		"--max-rate 1e-12 is refused":   {[]string{rec, "--dry-run", "--max-rate", "1e-12"}, 2, "max rate 1e-12: one record every 3.17e+04 years"},
		"the whole range is refused":    {[]string{wide, "--dry-run"}, 2, "the record observed 9223372036854775.807s after the window's start"},
		"the whole range, described":    {[]string{wide, "--info"}, 0, "recorded: 3 records over 9223372036854775.807s"},
		"a schedule that fits, exact":   {[]string{rec, "--dry-run", "--speed", "1e-9"}, 0, "records over 1000000000.000s"},
		"a third of the pace, exact":    {[]string{rec, "--dry-run", "--json", "--speed", "3"}, 0, `"duration_ms": 333`},
		"a loop beyond the span":        {[]string{rec, "--dry-run", "--speed", "1e-9", "--loop", "100"}, 2, "loops 100: passes of"},
		"a loop within the span, exact": {[]string{rec, "--dry-run", "--speed", "1e-9", "--loop", "2"}, 0, "each 1500000000.000s"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out, err := run(t, 30*time.Second, fpmbusBin, append([]string{"trace", "replay"}, c.args...)...)
			if code := exitCode(err); code != c.code || !strings.Contains(out, c.out) {
				t.Fatalf("exit %d, want %d, and output saying %q:\n%s", code, c.code, c.out, out)
			}
		})
	}
	// The plan's figures at speed 3: every due time rounded up, never early.
	out, err := run(t, 30*time.Second, fpmbusBin, "trace", "replay", rec, "--dry-run", "--json", "--speed", "3")
	if err != nil {
		t.Fatal(err, out)
	}
	var plan struct {
		Plan struct {
			DurationS float64 `json:"duration_s"`
		} `json:"plan"`
		PeriodS float64 `json:"period_s"`
	}
	if err := json.Unmarshal([]byte(out), &plan); err != nil || plan.Plan.DurationS != 0.333333334 {
		t.Fatalf("plan %+v (%v):\n%s", plan, err, out)
	}
}
