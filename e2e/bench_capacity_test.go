package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/streams"
)

// capEnv reads an integer setting of BenchmarkCapacity from the environment.
func capEnv(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's utime and stime (100 on Linux).
const clockTicks = 100

// procCPU is the user+system CPU time a process has used so far.
func procCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The command name (field 2) may hold spaces: count fields after its closing parenthesis.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, _ := strconv.ParseInt(f[12], 10, 64) // field 15
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// procRSS is a process's resident set size in bytes (VmRSS).
func procRSS(tb testing.TB, pid int) int64 {
	tb.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb * 1024
		}
	}
	tb.Fatalf("no VmRSS for pid %d", pid)
	return 0
}

// dirBytes is the size of every regular file under dir.
func dirBytes(tb testing.TB, dir string) int64 {
	tb.Helper()
	var n int64
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// BenchmarkCapacity runs the production shape scaled down, every part a real process: a 3-node
// cluster on the shipped configuration (fsync always) with R3 streams, FPMBUS_CAP_PUBLISHERS synthetic
// publisher processes (`fpmbus publish`, FPMBUS_CAP_RANKS ranks each, real ZMQ PUB sockets,
// FPMBUS_CAP_RATE FPM/s per rank for FPMBUS_CAP_SECONDS), one bridge per publisher process (one per
// worker host), two trace writers sharing two partitions (full mode) and one gap detector. Once every
// FPM is stored and every consumer has settled it, it reports per FPM stored: the CPU each component
// used (summed over its instances), the bytes JetStream accounts per replica and the bytes on the
// nodes' disks (all three), the gzip trace bytes; per publisher key: the resident memory the bridges
// and the detector grew by while the keys appeared; and the average Nats-Msg-Id length (the duplicate
// window's per-entry key).
//
// Run with: go test ./e2e -run '^$' -bench Capacity -benchtime 1x
func BenchmarkCapacity(b *testing.B) {
	pubs := capEnv("FPMBUS_CAP_PUBLISHERS", 2)
	ranks := capEnv("FPMBUS_CAP_RANKS", 100)
	rate := capEnv("FPMBUS_CAP_RATE", 5)
	secs := capEnv("FPMBUS_CAP_SECONDS", 20)
	perRank := rate * secs
	keys := pubs * ranks
	for b.Loop() {
		c := startProcessCluster(b)
		js := jsClient(b, c.url)
		eventually(b, 60*time.Second, func() error {
			if out, err := run(b, 30*time.Second, fpmbusBin, "streams", "apply", "--server", c.url, "--replicas", "3"); err != nil {
				return fmt.Errorf("streams apply: %v\n%s", err, out)
			}
			return nil
		})

		var bridges []*supervised
		bases := make([]int, pubs)
		block := producertest.FreeBasePort(b, "", pubs*ranks)
		for p := range pubs {
			bases[p] = block + p*ranks
			bridges = append(bridges, superviseFpmbus(b, fmt.Sprintf("bridge %d", p), "bridge ready", "bridge", "--server", c.url,
				"--fpm-port", strconv.Itoa(bases[p]), "--dp-size", strconv.Itoa(ranks), "--replicas", "3"))
		}
		detector := superviseFpmbus(b, "gaps", "gap detector started", gapsArgs(c.url, fmt.Sprintf("127.0.0.1:%d", freePort(b)), "10s", "--replicas", "3")...)
		out := filepath.Join(b.TempDir(), "trace", "fpm")
		var traces []*supervised
		for _, m := range []string{"ta", "tb"} {
			traces = append(traces, superviseFpmbus(b, "trace "+m, "trace writer started", "trace", "--server", c.url, "--replicas", "3",
				"--trace-mode", "full", "--trace-output", out, "--partitions", "2", "--member-id", m, "--max-segments", "1000000"))
		}
		// On a fresh R3 cluster a consumer may exit once while a bucket it needs has no leader yet
		// ("no responders"); its unit restarts it. Measure from when that has settled.
		all := append(append(append([]*supervised{}, bridges...), detector), traces...)
		failedBefore := map[*supervised]int{}
		for settled := false; !settled; {
			settled = true
			time.Sleep(12 * time.Second) // longer than a failing request's timeout plus restartSec
			for _, s := range all {
				if n := len(s.failed()); n != failedBefore[s] {
					failedBefore[s], settled = n, false
				}
			}
		}
		components := map[string][]*supervised{"bridge": bridges, "gaps": {detector}, "trace": traces}
		cpu := func() map[string]time.Duration {
			out := map[string]time.Duration{}
			for g, ss := range components {
				for _, s := range ss {
					out[g] += s.cpu(b)
				}
			}
			for _, n := range c.nodes {
				out["server"] += procCPU(b, n.cmd.Process.Pid)
			}
			return out
		}
		rss := func(ss []*supervised) (n int64) {
			for _, s := range ss {
				n += procRSS(b, s.current().cmd.Process.Pid)
			}
			return n
		}
		cpu0 := cpu()
		bridgeRSS0, gapsRSS0 := rss(bridges), rss(components["gaps"])

		var publishers []*proc
		start := time.Now()
		for p := range pubs {
			publishers = append(publishers, publish(b, 1, bases[p], ranks, perRank, fmt.Sprintf("cap%d", p),
				"--rate", strconv.Itoa(rate), "--seed", strconv.Itoa(p)))
		}
		var pubCPU time.Duration
		for _, p := range publishers {
			if err := p.wait(time.Duration(secs)*time.Second + 2*time.Minute); err != nil {
				b.Fatalf("publisher: %v\n%s", err, p.Output())
			}
			pubCPU += time.Duration(p.cmd.ProcessState.UserTime() + p.cmd.ProcessState.SystemTime())
		}
		// Memory with every key present and the load still flowing through the consumers.
		bridgeRSS, gapsRSS := rss(bridges), rss(components["gaps"])
		want := uint64(keys * perRank)
		eventually(b, 5*time.Minute, func() error {
			n, err := streamCount(b, js, streams.StreamFPM)
			if err != nil {
				return err
			}
			if n < want {
				return fmt.Errorf("FPM holds %d of %d", n, want)
			}
			return allConsumersDone(js)
		})
		elapsed := time.Since(start)
		cpu1 := cpu()
		restarts := 0
		for _, s := range all {
			if f := s.failed(); len(f) > failedBefore[s] {
				restarts += len(f) - failedBefore[s]
				b.Logf("%s failed during the measured run (its CPU counts, its memory figure is the new run's): %v", s.name, f[failedBefore[s]:])
			}
		}

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := js.Stream(ctx, streams.StreamFPM)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		state := st.CachedInfo().State
		var idBytes int
		msgs := storedFPMs(b, js, ">")
		for _, m := range msgs {
			idBytes += len(m.header.Get(streams.HeaderMsgID))
		}
		for _, s := range all {
			if err := s.stop(syscall.SIGTERM); err != nil {
				b.Fatalf("%s exit: %v", s.name, err)
			}
		}
		lines := len(traceLines(b, out+".*.jsonl.gz"))
		if uint64(lines) != state.Msgs {
			b.Fatalf("%d trace lines for %d stored FPMs", lines, state.Msgs)
		}
		gz, _ := filepath.Glob(out + ".*.jsonl.gz")
		var gzBytes int64
		for _, f := range gz {
			fi, err := os.Stat(f)
			if err != nil {
				b.Fatal(err)
			}
			gzBytes += fi.Size()
		}
		var disk int64
		for _, n := range c.nodes {
			disk += dirBytes(b, filepath.Join(filepath.Dir(n.conf), "store-"+n.name))
		}

		fpms := float64(state.Msgs)
		for _, g := range []string{"bridge", "trace", "gaps", "server"} {
			b.ReportMetric(float64((cpu1[g]-cpu0[g]).Microseconds())/fpms, g+"-cpu-µs/fpm")
		}
		b.ReportMetric(float64(pubCPU.Microseconds())/fpms, "publisher-cpu-µs/fpm")
		b.ReportMetric(float64(state.Bytes)/fpms, "stream-B/fpm")
		b.ReportMetric(float64(disk)/fpms, "disk-3nodes-B/fpm")
		b.ReportMetric(float64(gzBytes)/fpms, "trace-gz-B/fpm")
		b.ReportMetric(float64(bridgeRSS-bridgeRSS0)/float64(keys), "bridge-rss-B/key")
		b.ReportMetric(float64(gapsRSS-gapsRSS0)/float64(keys), "gaps-rss-B/key")
		b.ReportMetric(float64(idBytes)/float64(len(msgs)), "msgid-B")
		b.ReportMetric(fpms/elapsed.Seconds(), "fpm/s")
		b.ReportMetric(float64(restarts), "restarts")
		b.ReportMetric(0, "ns/op")
		b.Logf("%d publishers × %d ranks × %d FPM/s × %ds: %d FPMs stored in %v; CPU %v -> %v; RSS bridges %d -> %d, gaps %d -> %d; disk %d B, trace %d B in %d segments",
			pubs, ranks, rate, secs, state.Msgs, elapsed.Round(time.Millisecond), cpu0, cpu1, bridgeRSS0, bridgeRSS, gapsRSS0, gapsRSS, disk, gzBytes, len(gz))
	}
}
