package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/streams/streamstest"
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
	c, err := js.Consumer(ctx, streams.StreamFPM, durable)
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
	const total, kills = 50_000, 12
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0x6b696c6c))
	t.Logf("seed %d", seed)

	env := streamstest.Start(t)
	url := env.Server.ClientURL()
	fillFPM(t, env.JS, total, 4, 2, 1_782_777_600_000)
	waitStreamCount(t, env.JS, streams.StreamFPM, total, 30*time.Second)

	t0 := time.Now()
	t.Logf("stream filled with %d messages", total)
	out := filepath.Join(t.TempDir(), "trace", "fpm")
	args := []string{"trace", "--server", url, "--trace-mode", "full", "--trace-output", out,
		"--roll-bytes", "262144", "--max-segments", "1000000",
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
	// for messages whose acks the kill lost (found by the recovery, skipped when redelivered).
	repaired, recoveries, maxFound := 0, 0, 0
	foundRe := regexp.MustCompile(`trace recovery:.* found=(\d+)`)
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
