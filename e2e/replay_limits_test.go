package e2e

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer/producertest"
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

// rankSummary is what the tests read of one rank of `trace replay --summary-json`.
type rankSummary struct {
	Rank        string `json:"rank"`
	Replayed    int    `json:"replayed"`
	Undelivered int    `json:"undelivered"`
	Failed      int    `json:"failed"`
}

// A replay to ZMQ sends nothing until every socket has a subscriber (by default, up to --wait-timeout,
// then it fails naming the sockets without one), and with --wait-subscribers 0 a record sent while its
// socket had no subscriber is reported undelivered, per rank, with exit status 3: the report no longer
// says "replayed" for what nobody received. What a real subscriber received is what the report calls
// replayed on its socket.
func TestTraceReplayToZMQNamesSocketsWithoutSubscribers(t *testing.T) {
	t.Parallel()
	const perRank = 40
	var obs []int64
	for i := range 2 * perRank {
		obs = append(obs, 1_782_777_600_000+int64(10*(i/2)))
	}
	rec := writeRecording(t, t.TempDir(), "w", 2, obs)
	base := producertest.FreeBasePort(t, "", 2)
	ep := func(r int) string { return "tcp://127.0.0.1:" + strconv.Itoa(base+r) }
	replay := func(extra ...string) (string, int, []rankSummary) {
		t.Helper()
		summary := filepath.Join(t.TempDir(), "summary.json")
		out, err := run(t, 60*time.Second, fpmbusBin, append([]string{"trace", "replay", rec, "--fpm-port", strconv.Itoa(base),
			"--speed", "20", "--progress-every", "0", "--summary-json", summary}, extra...)...)
		var s struct {
			Ranks []rankSummary `json:"ranks"`
		}
		if raw, err := os.ReadFile(summary); err == nil {
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Fatal(err)
			}
		}
		return out, exitCode(err), s.Ranks
	}

	// Nobody subscribes: nothing is sent, and both sockets are named.
	out, code, ranks := replay("--wait-timeout", "1s")
	if code != 1 || ranks != nil || !strings.Contains(out, "nothing sent") ||
		!strings.Contains(out, "w/0 ("+ep(0)+") has 0") || !strings.Contains(out, "w/1 ("+ep(1)+") has 0") {
		t.Fatalf("without subscribers: exit %d, report %v:\n%s", code, ranks, out)
	}

	// A subscriber on rank 0 only: still nothing sent, rank 1 named.
	c0 := startCapture(t, ep(0))
	out, code, _ = replay("--wait-timeout", "2s")
	if code != 1 || !strings.Contains(out, "1 of 2 sockets have fewer than 1 subscribers") || !strings.Contains(out, "w/1 ("+ep(1)+") has 0") {
		t.Fatalf("one subscriber: exit %d:\n%s", code, out)
	}
	if got := c0.snapshot(); len(got) != 0 {
		t.Fatalf("a replay that waited in vain sent %d records", len(got))
	}

	// --wait-subscribers 0 (the careless replay): rank 1's records are all undelivered and said so.
	out, code, ranks = replay("--wait-subscribers", "0")
	if code != 3 || len(ranks) != 2 || !strings.Contains(out, "no subscriber: w/1 ("+ep(1)+"): 40 records") || !strings.Contains(out, "NOT DELIVERED") {
		t.Fatalf("--wait-subscribers 0: exit %d, ranks %+v:\n%s", code, ranks, out)
	}
	r0, r1 := ranks[0], ranks[1]
	got := len(c0.snapshot())
	if r1.Replayed != 0 || r1.Undelivered != perRank || r0.Replayed+r0.Undelivered != perRank || got < r0.Replayed || got > r0.Replayed+1 {
		t.Fatalf("rank 0 %+v (its subscriber received %d), rank 1 %+v", r0, got, r1)
	}
	c0.stop()

	// Both subscribed, the default: every record delivered, exit 0.
	c0, c1 := startCapture(t, ep(0)), startCapture(t, ep(1))
	out, code, ranks = replay()
	if code != 0 || len(ranks) != 2 || ranks[0].Replayed != perRank || ranks[1].Replayed != perRank || ranks[0].Undelivered+ranks[1].Undelivered != 0 {
		t.Fatalf("both subscribed: exit %d, ranks %+v:\n%s", code, ranks, out)
	}
	eventually(t, 10*time.Second, func() error {
		if a, b := len(c0.snapshot()), len(c1.snapshot()); a != perRank || b != perRank {
			return fmt.Errorf("subscribers received %d and %d of %d", a, b, perRank)
		}
		return nil
	})
}

// underLimit runs fpmbus args with the descriptor limit (soft and hard) at n, as `ulimit -n n` leaves it.
func underLimit(t *testing.T, n int, args ...string) (string, int) {
	t.Helper()
	out, err := run(t, 60*time.Second, "/bin/sh", append([]string{"-c", `ulimit -n ` + strconv.Itoa(n) + ` && exec "$0" "$@"`, fpmbusBin}, args...)...)
	return out, exitCode(err)
}

// Every command that opens ZMQ sockets checks the descriptor budget first: with `ulimit -n 256`, 3000
// ranks are refused with an error naming the need and the limit, where libzmq used to abort the
// process (SIGABRT in ip_resolver.cpp, a goroutine dump) as soon as it ran out while binding; a
// replay of 20 ranks still runs under the same limit.
func TestZMQSocketsCheckTheDescriptorBudget(t *testing.T) {
	t.Parallel()
	obs := make([]int64, 3000)
	for i := range obs {
		obs[i] = 1_782_777_600_000 + int64(i/100)
	}
	dir := t.TempDir()
	rec := writeRecording(t, filepath.Join(dir, "wide"), "w", 3000, obs)
	small := writeRecording(t, filepath.Join(dir, "small"), "w", 20, obs[:20])
	env := natsservertest.Start(t)
	for name, args := range map[string][]string{
		"trace replay": {"trace", "replay", rec, "--fpm-port", "30000", "--progress-every", "0"},
		"publish":      {"publish", "--dp-size", "3000", "--fpm-port", "30000", "--count", "1"},
		"up --demo":    {"up", "--demo", "--dp-size", "3000", "--fpm-port", "30000", "--data-dir", filepath.Join(dir, "up"), "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t))},
		"bridge":       {"bridge", "--server", env.Server.ClientURL(), "--dp-size", "3000", "--fpm-port", "30000"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out, code := underLimit(t, 256, args...)
			if code != 1 || !strings.Contains(out, "file descriptor limit too low: 3000 ") || !strings.Contains(out, "the limit (RLIMIT_NOFILE, `ulimit -n`) is 256") ||
				strings.Contains(out, "SIGABRT") || strings.Contains(out, "goroutine ") {
				t.Fatalf("exit %d:\n%s", code, out)
			}
		})
	}
	// Twenty ranks fit: the replay runs (nobody subscribes, so every record is reported undelivered).
	out, code := underLimit(t, 256, "trace", "replay", small, "--fpm-port", strconv.Itoa(producertest.FreeBasePort(t, "", 20)),
		"--wait-subscribers", "0", "--start-delay", "0s", "--progress-every", "0")
	if code != 3 || !strings.Contains(out, "0 replayed, 20 undelivered") {
		t.Fatalf("20 ranks under ulimit -n 256: exit %d:\n%s", code, out)
	}
}
