package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// groupDone reports whether every partition consumer of group (P partitions, on FPM_PART_<group>) has
// acked everything and the partition stream holds total messages.
func groupDone(js jetstream.JetStream, group string, parts int, total uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream := streams.StreamFPM + "_PART_" + group
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	if n := s.CachedInfo().State.Msgs; n != total {
		return fmt.Errorf("%s holds %d of %d", stream, n, total)
	}
	for p := range parts {
		c, err := js.PushConsumer(ctx, stream, group+"-"+strconv.Itoa(p))
		if err != nil {
			return err
		}
		if ci := c.CachedInfo(); ci.NumPending != 0 || ci.NumAckPending != 0 {
			return fmt.Errorf("partition %d: pending %d, ack pending %d", p, ci.NumPending, ci.NumAckPending)
		}
	}
	return nil
}

// Three `fpmbus trace --partitions 6` processes of one group share one output directory while the
// stream fills; one is stopped (SIGTERM) mid-run and one killed (SIGKILL) mid-run. Afterwards every
// message of the stream is exactly once in the segments, and each producer's lines are in order.
func TestTraceScaleOutThreeProcessesOneStoppedOneKilled(t *testing.T) {
	t.Parallel()
	const total, parts, group = 30_000, 6, "scale"
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	out := filepath.Join(t.TempDir(), "trace", "fpm")
	args := []string{"trace", "--server", url, "--trace-mode", "full", "--trace-output", out,
		"--group", group, "--partitions", strconv.Itoa(parts), "--pinned-ttl", "3s",
		"--roll-bytes", "262144", "--max-segments", "1000000", "--trace-flush-interval", "100ms"}
	fillFPMOffset(t, env.JS, 0, total/3, 10, 2, 1_782_777_600_000)
	var ps []*proc
	for i := range 3 {
		p := fpmbus(t, fmt.Sprintf("fpmbus trace %d", i), append(args, "--member-id", "m"+strconv.Itoa(i))...)
		p.waitOutput("trace writer started", 20*time.Second)
		ps = append(ps, p)
	}
	time.Sleep(500 * time.Millisecond)
	if err := ps[0].signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("stop member 0: %v", err)
	}
	fillFPMOffset(t, env.JS, total/3, total/3, 10, 2, 1_782_777_600_000)
	time.Sleep(200 * time.Millisecond)
	_ = ps[1].signal(syscall.SIGKILL, 10*time.Second)
	fillFPMOffset(t, env.JS, 2*total/3, total-2*total/3, 10, 2, 1_782_777_600_000)
	eventually(t, 90*time.Second, func() error { return groupDone(env.JS, group, parts, total) })
	if err := ps[2].signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("stop member 2: %v", err)
	}
	checkTraceOnce(t, env.JS, out, total)
}

// checkTraceOnce checks that every message of the stream is exactly once in the segments under out
// (total lines in all) and that each producer's lines are in counter order.
func checkTraceOnce(t *testing.T, js jetstream.JetStream, out string, total int) {
	t.Helper()
	want := map[string]int{}
	for _, m := range storedFPMs(t, js, ">") {
		want[m.header.Get(streams.HeaderReceivedAt)+" "+string(m.body)]++
	}
	files, _ := filepath.Glob(out + ".*.jsonl.gz")
	sort.Strings(files) // per producer, in index order (zero-padded)
	got := map[string]int{}
	last := map[string]int64{}
	n := 0
	for _, f := range files {
		for _, l := range traceLines(t, f) {
			n++
			got[strconv.FormatInt(l.Event.ObservedAtUnixMs, 10)+" "+string(l.Event.FPM)]++
			fp, err := schemas.ParseFPMJSON(l.Event.FPM)
			if err != nil {
				t.Fatal(err)
			}
			k := fp.WorkerID + "/" + strconv.FormatInt(fp.DPRank, 10)
			if prev, ok := last[k]; ok && fp.CounterID <= prev {
				t.Fatalf("%s: counter %d after %d in %s: out of order", k, fp.CounterID, prev, filepath.Base(f))
			}
			last[k] = fp.CounterID
		}
	}
	if n != total {
		t.Errorf("%d lines for %d messages", n, total)
	}
	for k, c := range want {
		if got[k] != c {
			t.Fatalf("message stored %d times, written %d times: %.160s", c, got[k], k)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d distinct lines, %d distinct messages", len(got), len(want))
	}
	t.Logf("%d segments, %d lines", len(files), n)
}

// A trace writer frozen (SIGSTOP: a hung host, a paused VM) while it owns partitions keeps its
// connection open, and the server does not move a partition's subject while it has a subscriber. The
// server closes the connection once the frozen process has not answered its pings for about 30 s
// (natsserver.DefaultPingInterval, DefaultMaxPingsOut; nats-server's defaults take about 6 min), and the
// other writer then takes the partitions over and writes every message once, in order. The frozen
// writer never resumes.
func TestTraceWriterFrozenOwnerIsTakenOver(t *testing.T) {
	t.Parallel()
	const half, parts, group = 3_000, 2, "frozen"
	env := natsservertest.Start(t)
	out := filepath.Join(t.TempDir(), "trace", "fpm")
	args := []string{"trace", "--server", env.Server.ClientURL(), "--trace-mode", "full", "--trace-output", out,
		"--group", group, "--partitions", strconv.Itoa(parts), "--pinned-ttl", "3s", "--trace-flush-interval", "100ms"}
	fillFPMOffset(t, env.JS, 0, half, 10, 2, 1_782_777_600_000)
	ps := []*proc{
		startDebug(t, "fpmbus trace a", append(args, "--member-id", "a")...),
		startDebug(t, "fpmbus trace b", append(args, "--member-id", "b")...),
	}
	eventually(t, 30*time.Second, func() error {
		if len(ps[0].owned())+len(ps[1].owned()) != parts {
			return fmt.Errorf("owned: a %v, b %v", ps[0].owned(), ps[1].owned())
		}
		return groupDone(env.JS, group, parts, half)
	})
	frozen := owner(t, ps)
	if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = frozen.signal(syscall.SIGKILL, 10*time.Second) })
	stoppedAt := time.Now()
	fillFPMOffset(t, env.JS, half, half, 10, 2, 1_782_777_600_000)
	eventually(t, 90*time.Second, func() error { return groupDone(env.JS, group, parts, 2*half) })
	took := time.Since(stoppedAt)
	if bound := time.Duration(natsserver.DefaultMaxPingsOut+1)*natsserver.DefaultPingInterval + 20*time.Second; took > bound {
		t.Errorf("the frozen writer's partitions were written %v after it froze, past %v", took, bound)
	}
	_ = frozen.signal(syscall.SIGKILL, 10*time.Second)
	for _, p := range ps {
		if p != frozen {
			if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
				t.Fatalf("stop %s: %v", p.name, err)
			}
		}
	}
	checkTraceOnce(t, env.JS, out, 2*half)
	t.Logf("the frozen writer's partitions were taken over and written %v after it froze", took.Round(time.Millisecond))
}
