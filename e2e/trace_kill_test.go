package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/trace"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// fillFPM publishes n FPMs straight into stream FPM, as the bridge publishes them (subject, canonical
// JSON body, Fpm-* headers), round-robin over workers × ranks.
func fillFPM(t *testing.T, js jetstream.JetStream, n, workers, ranks int, startMs int64) {
	t.Helper()
	fillFPMOffset(t, js, 0, n, workers, ranks, startMs)
}

// fillFPMOffset publishes messages from..from+n-1 of fillFPM's sequence (same keys, counters, bodies and
// observation times), so that the stream can be filled in steps.
func fillFPMOffset(t *testing.T, js jetstream.JetStream, from, n, workers, ranks int, startMs int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	keys := workers * ranks
	for i := from; i < from+n; i++ {
		k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: fmt.Sprintf("kw%d", i%keys/ranks), DPRank: i % ranks}
		counter := int64(i / keys)
		f := &schemas.FPM{Version: 1, WorkerID: k.WorkerID, DPRank: int64(k.DPRank), CounterID: counter}
		if i%10 != 9 { // every tenth an idle heartbeat
			f.WallTime = 0.02 + float64(i%13)/1000
			f.Scheduled = schemas.ScheduledRequests{NumPrefillRequests: 1, SumPrefillTokens: int64(i % 977), NumDecodeRequests: 4, SumDecodeKVTokens: int64(i)}
			f.Queued = schemas.QueuedRequests{NumPrefillRequests: int64(i % 3)}
		}
		d, err := schemas.DecodeFPM(schemas.EncodeMsgpack(f))
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(streams.FPMSubject(k))
		m.Data = d.JSON
		m.Header.Set(streams.HeaderMsgID, streams.MsgID(k, 1, uint64(counter)))
		m.Header.Set(streams.HeaderSeq, strconv.FormatInt(counter, 10))
		m.Header.Set(streams.HeaderEpoch, "1")
		m.Header.Set(streams.HeaderReceivedAt, strconv.FormatInt(startMs+int64(i), 10))
		m.Header.Set(streams.HeaderNamespace, k.Namespace)
		m.Header.Set(streams.HeaderComponent, k.Component)
		m.Header.Set(streams.HeaderWorkerID, k.WorkerID)
		m.Header.Set(streams.HeaderDPRank, strconv.Itoa(k.DPRank))
		m.Header.Set(streams.HeaderProducer, k.WorkerID)
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		if i%2000 == 1999 || i == from+n-1 {
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatal("publish: timeout")
			}
		}
	}
}

// consumerState returns how many of total messages the trace consumer has had acked (neither pending
// nor waiting for an ack), its ack floor and its ack-pending count; zeros before it exists.
func consumerState(t *testing.T, js jetstream.JetStream, durable string, total uint64) (acked, floor uint64, pending int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.PushConsumer(ctx, streams.StreamFPM, durable)
	if err != nil {
		return 0, 0, 0
	}
	ci, err := c.Info(ctx)
	if err != nil {
		return 0, 0, 0
	}
	return total - ci.NumPending - uint64(ci.NumAckPending), ci.AckFloor.Stream, ci.NumAckPending
}

// The trace writer in full mode, SIGKILLed at random moments (during startup, repair and recovery,
// and while writing: between a member's fsync and its acks too) and restarted each time, ends with
// every message of the stream exactly once in its segments: the multiset of (fpm, observed_at) of the
// lines equals the stream's (body, Fpm-Received-At-Ms).
func TestTraceWriterKill9AtRandomMomentsExactlyOnce(t *testing.T) {
	t.Parallel()
	const total, kills = 50_000, 12
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0x6b696c6c))
	t.Logf("seed %d", seed)

	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	fillFPM(t, env.JS, total, 4, 2, 1_782_777_600_000)
	waitStreamCount(t, env.JS, streams.StreamFPM, total, 30*time.Second)

	t0 := time.Now()
	t.Logf("stream filled with %d messages", total)
	out := filepath.Join(t.TempDir(), "trace", "fpm")
	// One member id for every run: each restart is the same instance, and takes the partition back at
	// once (without, it would wait --pinned-ttl for the killed run's pin).
	args := []string{"trace", "--server", url, "--trace-mode", "full", "--trace-output", out,
		"--roll-bytes", "262144", "--max-segments", "1000000", "--member-id", "kill-test",
		"--trace-ack-wait", "2s", "--trace-max-ack-pending", "400", "--trace-flush-interval", "100ms"}
	var outputs []string
	midRun := 0
	for i := 0; i < kills; i++ {
		p := fpmbus(t, fmt.Sprintf("fpmbus trace run %d", i), args...)
		acked0, floor0, _ := consumerState(t, env.JS, "fpm-trace", total)
		if i%4 == 0 {
			// At a random moment of the start: repair, recovery, the first fetches.
			time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
		} else {
			// Once the writer has made a random amount of progress, then a little later.
			target := min(acked0+1+uint64(rng.IntN(max(int(total-acked0)/(kills-i+1), 1))), total)
			deadline := time.Now().Add(20 * time.Second)
			for {
				if a, _, _ := consumerState(t, env.JS, "fpm-trace", total); a >= target || time.Now().After(deadline) {
					break
				}
				select {
				case <-p.done:
					t.Fatalf("trace writer exited early: %v", p.err)
				case <-time.After(time.Millisecond):
				}
			}
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		}
		_ = p.signal(syscall.SIGKILL, 10*time.Second)
		acked, floor, pending := consumerState(t, env.JS, "fpm-trace", total)
		if acked > acked0 && acked < total {
			midRun++
		}
		t.Logf("kill %d at %v: acked %d -> %d (ack floor %d -> %d), ack pending %d", i+1, time.Since(t0).Round(time.Millisecond), acked0, acked, floor0, floor, pending)
		outputs = append(outputs, p.Output())
	}
	if midRun < kills/2 {
		t.Fatalf("only %d of %d kills landed mid-run", midRun, kills)
	}

	last := fpmbus(t, "fpmbus trace final", args...)
	eventually(t, 60*time.Second, func() error {
		if _, f, pending := consumerState(t, env.JS, "fpm-trace", total); f != total || pending != 0 {
			return fmt.Errorf("ack floor %d, ack pending %d", f, pending)
		}
		return nil
	})
	t.Logf("final run done at %v", time.Since(t0).Round(time.Millisecond))
	if err := last.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("final trace writer: %v\n%s", err, last.Output())
	}
	outputs = append(outputs, last.Output())

	// The union of all segments against the stream, as multisets.
	want := map[string]int{}
	for _, m := range storedFPMs(t, env.JS, ">") {
		want[m.header.Get(streams.HeaderReceivedAt)+" "+string(m.body)]++
	}
	lines := traceLines(t, out+".*.jsonl.gz")
	got := map[string]int{}
	for _, l := range lines {
		if l.Event.CaptureMode != "full" {
			t.Fatalf("capture_mode %q", l.Event.CaptureMode)
		}
		got[strconv.FormatInt(l.Event.ObservedAtUnixMs, 10)+" "+string(l.Event.FPM)]++
	}
	if len(lines) != total {
		t.Errorf("%d lines for %d messages", len(lines), total)
	}
	for k, n := range got {
		if want[k] != n {
			t.Fatalf("line written %d times, stream holds it %d times: %.160s", n, want[k], k)
		}
	}
	for k, n := range want {
		if got[k] != n {
			t.Fatalf("message stored %d times, written %d times: %.160s", n, got[k], k)
		}
	}

	// What the restarts had to deal with (from their logs): torn tails cut, and lines already written
	// for messages whose acks the kill lost (found by the takeover recovery, skipped when redelivered).
	repaired, recoveries, maxFound := 0, 0, 0
	foundRe := regexp.MustCompile(`trace takeover:.* skipped=(\d+)`)
	for _, o := range outputs {
		repaired += strings.Count(o, "trace segment repaired")
		if m := foundRe.FindStringSubmatch(o); m != nil {
			if n, _ := strconv.Atoi(m[1]); n > 0 {
				recoveries++
				maxFound = max(maxFound, n)
			}
		}
	}
	files, _ := filepath.Glob(out + ".*.jsonl.gz")
	t.Logf("%d kills (%d mid-run); %d torn segments repaired; %d restarts found lines written but unacked (up to %d); %d segments, %d lines",
		kills, midRun, repaired, recoveries, maxFound, len(files), len(lines))
}

// reclaimedRe matches the partitions a member released for its dead incarnation, when there are some.
var reclaimedRe = regexp.MustCompile(`partitions="?\[\d`)

// lineIDs reads the lines of the segments matching pattern, in file order (names sort by producer,
// then index), and returns their identities "<observed_at_unix_ms> <fpm>"; a segment being written
// (a torn last member) is read up to its last whole member.
func lineIDs(t *testing.T, pattern string) []string {
	t.Helper()
	files, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	var out []string
	for _, f := range files {
		err := tracefile.ReadSegment(f, func(line []byte) error {
			l, err := schemas.ParseTraceLine(line)
			if err != nil {
				return err
			}
			out = append(out, strconv.FormatInt(l.Event.ObservedAtUnixMs, 10)+" "+string(l.Event.FPM))
			return nil
		})
		var ce *tracefile.CorruptError
		if err != nil && !errors.As(err, &ce) && !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: %v", f, err)
		}
	}
	return out
}

// streamIDs returns the identities ("<Fpm-Received-At-Ms> <body>") of the FPM stream's messages up to
// stream sequence upTo (0: the last one now) by stream sequence, and that last sequence.
func streamIDs(t *testing.T, js jetstream.JetStream, upTo uint64) (map[string]uint64, uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, streams.StreamFPM)
	if err != nil {
		t.Fatal(err)
	}
	if upTo == 0 {
		upTo = s.CachedInfo().State.LastSeq
	}
	out := map[string]uint64{}
	// Each read has its own deadline: thousands of them one after the other outlast any single one on a
	// loaded machine.
	for seq := uint64(1); seq <= upTo; seq++ {
		gctx, gcancel := context.WithTimeout(context.Background(), 10*time.Second)
		m, err := s.GetMsg(gctx, seq)
		gcancel()
		if err != nil {
			t.Fatalf("stream %s sequence %d: %v", streams.StreamFPM, seq, err)
		}
		out[m.Header.Get(streams.HeaderReceivedAt)+" "+string(m.Data)] = seq
	}
	return out, upTo
}

// `fpmbus up --demo` is killed (SIGKILL) mid-stream, while its trace writer holds messages it received
// but has not acknowledged, and started again on the same data directory (its trace writer is the same
// group member: `up` derives the id from the data directory). The restarted trace writer recognises its
// dead incarnation and releases the partitions it held at once, rather than waiting PinnedTTL for them;
// every message the stream held at the kill gets its line; the producer's lines are in stream order,
// none twice, and they are exactly the stream's first messages.
func TestTraceUpKill9RestartWritesInFlightInOrder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "trace", "fpm")
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	url := "nats://" + listen
	base := producertest.FreeBasePort(t, "", 4)
	args := []string{"up", "--demo", "--demo-rate", "200", "--listen", listen, "--data-dir", filepath.Join(dir, "data"),
		"--fpm-port", strconv.Itoa(base), "--dp-size", "4", "--trace-mode", "full", "--trace-output", out}
	first := fpmbus(t, "fpmbus up (killed)", args...)
	first.waitOutput("demo publishers ready", 30*time.Second)
	js := jsClient(t, url)
	var held int
	var floor uint64
	eventually(t, 30*time.Second, func() error {
		_, floor, held = consumerState(t, js, trace.DefaultGroup, 0)
		if floor < 1000 || held < 100 { // between two flushes (1 s apart): hundreds received, not yet durable

			return fmt.Errorf("trace writer: ack floor %d, %d unacknowledged", floor, held)
		}
		return nil
	})
	_ = first.signal(syscall.SIGKILL, 10*time.Second)
	t.Logf("killed with ack floor %d and %d messages received but not acknowledged", floor, held)

	restarted := time.Now()
	second := fpmbus(t, "fpmbus up (restarted)", args...)
	second.waitOutput("embedded server ready", 30*time.Second)
	js2 := jsClient(t, url)
	// What the stream holds right after the restarted server came up: the messages stored before the
	// kill (the restarted bridge starts last; a few newer messages among them must be written too).
	atKill, last := streamIDs(t, js2, 0)
	for {
		missing := 0
		have := map[string]bool{}
		for _, id := range lineIDs(t, out+".*.jsonl.gz") {
			have[id] = true
		}
		for id := range atKill {
			if !have[id] {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Since(restarted) > 60*time.Second {
			t.Fatalf("%d of the %d messages stored before the restart have no line %v after it", missing, len(atKill), time.Since(restarted).Round(time.Millisecond))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("every line of the %d messages stored before the kill written %v after the restart", len(atKill), time.Since(restarted).Round(time.Millisecond))
	// How the restarted trace writer got its partitions back: it found its dead incarnation's key and
	// released the partitions that key lists, which a takeover after PinnedTTL would not have logged.
	reclaimed := false
	for _, l := range strings.Split(second.Output(), "\n") {
		reclaimed = reclaimed || strings.Contains(l, "previous incarnation of this member found") &&
			strings.Contains(l, "group="+trace.DefaultGroup+" ") && reclaimedRe.MatchString(l)
	}
	if !reclaimed {
		t.Fatalf("the restarted trace writer did not release its dead incarnation's partitions:\n%s", second.Output())
	}

	time.Sleep(2 * time.Second) // traffic after the restart
	if err := second.signal(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("fpmbus up: %v", err)
	}
	// The store as the stopped run left it, read through a server of the test's own.
	stored := natsservertest.StartAt(t, "127.0.0.1:0", filepath.Join(dir, "data", "jetstream"))
	bySeq, _ := streamIDs(t, stored.JS, 0)
	// One bridge across the restart: `up` names its bridge after its data directory, so the gap
	// detector reads the restart as the same bridge's new epoch, not as a second bridge.
	bridges := map[string]int{}
	for _, m := range storedFPMs(t, stored.JS, ">") {
		bridges[m.header.Get(streams.HeaderBridge)]++
	}
	if len(bridges) != 1 {
		t.Fatalf("FPMs by %s header: %v, want one bridge across the restart", streams.HeaderBridge, bridges)
	}
	for b := range bridges {
		if !strings.HasPrefix(b, "up-") {
			t.Fatalf("bridge %q, want up's own name", b)
		}
	}

	lines := lineIDs(t, out+".*.jsonl.gz")
	files, _ := filepath.Glob(out + ".*.jsonl.gz")
	producers := map[string]bool{}
	for _, f := range files {
		stem := strings.TrimSuffix(filepath.Base(f), ".jsonl.gz")
		producers[stem[:strings.LastIndexByte(stem, '.')]] = true
	}
	if len(producers) != 1 {
		t.Fatalf("producers %v, want the demo worker's only", producers)
	}
	var prev uint64
	for i, id := range lines {
		seq, ok := bySeq[id]
		switch {
		case !ok:
			t.Fatalf("line %d is no message of the stream: %.120s", i, id)
		case seq <= prev:
			t.Fatalf("line %d: stream sequence %d after %d: out of order or written twice", i, seq, prev)
		case seq != prev+1:
			t.Fatalf("line %d: stream sequence %d after %d: messages %d..%d have no line", i, seq, prev, prev+1, seq-1)
		}
		prev = seq
	}
	if prev < last {
		t.Fatalf("lines up to stream sequence %d, the stream held %d when the restart began", prev, last)
	}
	t.Logf("%d lines: stream sequences 1..%d in order (%d stored in all, %d when the restart began)", len(lines), prev, len(bySeq), last)
}
