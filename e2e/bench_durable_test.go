package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/streams"
)

// BenchmarkUpSyncPolicy measures what durability costs `fpmbus up` as a whole: the real binary with
// its defaults (sync_interval: always: nothing acked before it is on disk, every stage running: trace
// writer in full mode, gap detector, merger, sealer) against the same with `--sync 2m`, each fed by an
// independent `fpmbus publish` offering more than either sustains (4 ranks × FPMBUS_BENCH_RATE per
// second, default 3000, for FPMBUS_BENCH_SECONDS, default 5), timed from the publisher's start until
// the FPM stream holds every FPM. Each iteration is one run of both sides, alternating; it reports per
// side the sustained rate and the ratio always/2m as the min, median and max over the runs, and the
// load average (the machine is shared).
//
// Run with: go test ./e2e -run '^$' -bench UpSyncPolicy -benchtime 3x (./taskw bench:durable)
func BenchmarkUpSyncPolicy(b *testing.B) {
	const ranks = 4
	rate := 3000
	if v, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_RATE")); err == nil && v > 0 {
		rate = v
	}
	secs := 5
	if v, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	perRank := rate * secs
	sides := []struct {
		name string
		args []string
	}{{"always", nil}, {"sync-2m", []string{"--sync", "2m"}}}
	runs := map[string][]float64{}
	for b.Loop() {
		got := make([]float64, len(sides))
		for i, s := range sides {
			got[i] = upSustainedRate(b, ranks, perRank, rate, s.args)
			runs[s.name+"-fpm/s"] = append(runs[s.name+"-fpm/s"], got[i])
		}
		runs["ratio"] = append(runs["ratio"], got[0]/got[1])
	}
	for name, v := range runs {
		slices.Sort(v)
		b.ReportMetric(v[0], name+"-min")
		b.ReportMetric(v[len(v)/2], name+"-med")
		b.ReportMetric(v[len(v)-1], name+"-max")
	}
	if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
		if la, err := strconv.ParseFloat(strings.Fields(string(raw))[0], 64); err == nil {
			b.ReportMetric(la, "loadavg-1m")
		}
	}
	b.ReportMetric(0, "ns/op")
}

// upSustainedRate runs one `fpmbus up` (with extra flags) and one publisher of perRank FPMs per rank
// at rate per rank, and returns the FPMs stored per second from the publisher's start.
func upSustainedRate(b *testing.B, ranks, perRank, rate int, extra []string) float64 {
	b.Helper()
	dir := b.TempDir()
	base := producertest.FreeBasePort(b, "", ranks)
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(b))
	args := append([]string{"up", "--listen", listen, "--data-dir", filepath.Join(dir, "data"),
		"--fpm-port", strconv.Itoa(base), "--dp-size", strconv.Itoa(ranks), "--trace-mode", "full",
		"--trace-output", filepath.Join(dir, "trace", "fpm")}, extra...)
	up := fpmbus(b, "fpmbus up", args...)
	up.waitOutput("bridge ready", 30*time.Second)
	js := jsClient(b, "nats://"+listen)
	want := uint64(ranks * perRank)
	start := time.Now()
	pub := publish(b, 1, base, ranks, perRank, "bench-w", "--rate", strconv.Itoa(rate), "--seed", "5")
	for {
		n, err := streamCount(b, js, streams.StreamFPM)
		if err == nil && n >= want {
			break
		}
		if time.Since(start) > 5*time.Minute {
			b.Fatalf("stream FPM holds %d of %d after 5 minutes (%v)", n, want, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	d := time.Since(start)
	if err := pub.wait(time.Minute); err != nil {
		b.Fatalf("publisher: %v", err)
	}
	if err := up.signal(syscall.SIGTERM, time.Minute); err != nil {
		b.Fatalf("fpmbus up: %v", err)
	}
	return float64(want) / d.Seconds()
}
