package e2e

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/streams"
)

// upProcess runs `fpmbus up` on fresh ports and returns it with its client URL, FPM base port and
// trace prefix.
type upEnv struct {
	proc     *proc
	url      string
	basePort int
	traceOut string
	dataDir  string
}

func startUp(t *testing.T, dpSize int, extra ...string) *upEnv {
	t.Helper()
	dir := t.TempDir()
	e := &upEnv{basePort: producertest.FreeBasePort(t, "", dpSize), dataDir: filepath.Join(dir, "data"), traceOut: filepath.Join(dir, "trace", "fpm")}
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	e.url = "nats://" + listen
	args := []string{"up", "--listen", listen, "--data-dir", e.dataDir,
		"--fpm-port", strconv.Itoa(e.basePort), "--dp-size", strconv.Itoa(dpSize),
		"--trace-mode", "full", "--trace-output", e.traceOut}
	e.proc = fpmbus(t, "fpmbus up", append(args, extra...)...)
	e.proc.waitOutput("bridge ready", 30*time.Second)
	return e
}

// publish runs `fpmbus publish`, which waits until subs subscribers (the bridge, plus any capture
// sockets) have joined every rank before its first message.
func publish(t testing.TB, subs, basePort, dpSize, count int, workerID string, extra ...string) *proc {
	t.Helper()
	args := []string{"publish", "--fpm-port", strconv.Itoa(basePort), "--dp-size", strconv.Itoa(dpSize),
		"--count", strconv.Itoa(count), "--worker-id", workerID, "--wait-subscribers", strconv.Itoa(subs)}
	return fpmbus(t, "fpmbus publish "+workerID, append(args, extra...)...)
}

// Four DP ranks × 5,000 FPMs through the real binary: each in FPM exactly once, on its rank's subject,
// with the body the publisher sent; the trace writer's lines carry the same bodies, once each.
func TestPipelineFourRanksEveryMessageOnceInStreamAndTrace(t *testing.T) {
	t.Parallel()
	const ranks, perRank = 4, 5000
	up := startUp(t, ranks)
	caps := make([]*capture, ranks)
	for r := range caps {
		caps[r] = startCapture(t, fmt.Sprintf("tcp://127.0.0.1:%d", up.basePort+r))
	}
	pub := publish(t, 2, up.basePort, ranks, perRank, "e2e-w", "--rate", "2500", "--seed", "7")
	if err := pub.wait(60 * time.Second); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	js := jsClient(t, up.url)
	waitStreamCount(t, js, streams.StreamFPM, ranks*perRank, 60*time.Second)

	stored := storedFPMs(t, js, ">")
	bySeq := make([]map[uint64]storedFPM, ranks)
	for r := range bySeq {
		bySeq[r] = map[uint64]storedFPM{}
	}
	for _, m := range stored {
		if m.key.WorkerID != "e2e-w" || m.key.Namespace != "dynamo" || m.key.Component != "backend" {
			t.Fatalf("unexpected key %+v", m.key)
		}
		if want := streams.FPMSubject(m.key); m.subject != want {
			t.Fatalf("subject %q, want %q", m.subject, want)
		}
		if _, dup := bySeq[m.key.DPRank][m.seq]; dup {
			t.Fatalf("rank %d seq %d stored twice", m.key.DPRank, m.seq)
		}
		bySeq[m.key.DPRank][m.seq] = m
	}
	for r := 0; r < ranks; r++ {
		caps[r].stop()
		sent := caps[r].snapshot()
		if len(sent) != perRank || len(bySeq[r]) != perRank {
			t.Fatalf("rank %d: captured %d, stored %d, want %d each", r, len(sent), len(bySeq[r]), perRank)
		}
		for seq, body := range sent {
			m, ok := bySeq[r][seq]
			if !ok {
				t.Fatalf("rank %d seq %d published but not stored", r, seq)
			}
			if !bytes.Equal(m.body, body) {
				t.Fatalf("rank %d seq %d: stored body\n%s\nwant\n%s", r, seq, m.body, body)
			}
		}
	}

	// Stop gracefully: the trace writer flushes and acks what it holds.
	if err := up.proc.signal(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("fpmbus up exit: %v", err)
	}
	lines := traceLines(t, up.traceOut+".e2e-w.*.jsonl.gz")
	if len(lines) != ranks*perRank {
		t.Fatalf("trace has %d lines, want %d", len(lines), ranks*perRank)
	}
	byBody := make(map[string]storedFPM, len(stored))
	for _, m := range stored {
		byBody[string(m.body)] = m // bodies are unique: each carries its dp_rank and counter_id
	}
	seen := map[string]bool{}
	for _, l := range lines {
		m, ok := byBody[string(l.Event.FPM)]
		if !ok {
			t.Fatalf("trace line fpm not in the stream: %s", l.Event.FPM)
		}
		if seen[m.subject+"/"+strconv.FormatUint(m.seq, 10)] {
			t.Fatalf("trace line for %s seq %d written twice", m.subject, m.seq)
		}
		seen[m.subject+"/"+strconv.FormatUint(m.seq, 10)] = true
		if got := m.header.Get(streams.HeaderReceivedAt); got != strconv.FormatInt(l.Event.ObservedAtUnixMs, 10) {
			t.Fatalf("%s seq %d: observed_at_unix_ms %d, header %s", m.subject, m.seq, l.Event.ObservedAtUnixMs, got)
		}
		if l.Event.CaptureMode != "full" || l.Event.Source.ProducerID != "e2e-w" || l.Event.Source.Namespace != "dynamo" {
			t.Fatalf("envelope: %+v", l.Event)
		}
	}
}
