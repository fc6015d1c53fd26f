package e2e

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// rawPublisher is a Dynamo-shaped PUB socket (an XPUB, identical on the wire) that sends any frames.
type rawPublisher struct {
	t *testing.T
	s *producer.Sender
}

func newRawPublisher(t *testing.T, port int) *rawPublisher {
	t.Helper()
	s, err := producer.NewSender(nil, fmt.Sprintf("tcp://127.0.0.1:%d", port), -1, producer.WithSubscriberCount(), producer.WithLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &rawPublisher{t: t, s: s}
}

// waitSubscribed waits for the next subscription: the bridge's first, or the one it sends when it
// reconnects.
func (p *rawPublisher) waitSubscribed() {
	p.t.Helper()
	if err := p.s.WaitSubscribers(1, 15*time.Second); err != nil {
		p.t.Fatal(err)
	}
}

func (p *rawPublisher) sendFPM(seq uint64, worker string, rank int) {
	p.t.Helper()
	f := &schemas.FPM{Version: 1, WorkerID: worker, DPRank: int64(rank), CounterID: int64(seq), WallTime: 0.02,
		Scheduled: schemas.ScheduledRequests{NumPrefillRequests: 1, SumPrefillTokens: 128, NumDecodeRequests: 2, SumDecodeKVTokens: 512}}
	if err := p.s.Send(seq, schemas.EncodeMsgpack(f)); err != nil {
		p.t.Fatalf("send seq %d: %v", seq, err)
	}
}

// peakRSS is the process's peak resident set (VmHWM) in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// metricsOf scrapes the bridge's /metrics.
func metricsOf(t *testing.T, addr string) map[string][]metricSample {
	t.Helper()
	m, err := scrapeSamples(addr)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	return m
}

// FPMs whose worker_id makes the subject too long for the server's max control line (4,100 bytes)
// are mixed into normal traffic, on one rank alongside valid FPMs (one with a 300-byte worker_id that
// fits) while two other ranks publish. Through the real binary: every other FPM is stored, exactly one
// dead letter names each bad FPM's reason and size, nothing stored is counted as dropped, and the
// bridge stays up and keeps publishing.
func TestBridgeDeadLettersOverlongWorkerIDsAndKeepsPublishing(t *testing.T) {
	t.Parallel()
	const n, bad = 300, 4100
	env := natsservertest.Start(t)
	base := producertest.FreeBasePort(t, "127.0.0.1", 3)
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	mixed := newRawPublisher(t, base)
	others := []*producertest.Scripted{
		producertest.NewScripted(t, fmt.Sprintf("tcp://127.0.0.1:%d", base+1), 0, false, "rank-1", 1),
		producertest.NewScripted(t, fmt.Sprintf("tcp://127.0.0.1:%d", base+2), 0, false, "rank-2", 2),
	}
	bridge := startBridge(t, "bridge", env.Server.ClientURL(), base, 3, "--metrics-addr", metrics)
	mixed.waitSubscribed()
	for _, p := range others {
		p.WaitSubscribed()
	}
	long, medium := strings.Repeat("L", bad), strings.Repeat("m", 300)
	worker := func(seq uint64) string {
		switch seq % 10 {
		case 3:
			return long
		case 7:
			return medium
		}
		return "rank-0"
	}
	var badSeqs []uint64
	for seq := uint64(0); seq < n; seq++ {
		mixed.sendFPM(seq, worker(seq), 0)
		if worker(seq) == long {
			badSeqs = append(badSeqs, seq)
		}
		for _, p := range others {
			p.Send(false)
		}
		time.Sleep(200 * time.Microsecond)
	}
	want := uint64(3*n - len(badSeqs))
	waitStreamCount(t, env.JS, streams.StreamFPM, want, 30*time.Second)
	waitStreamCount(t, env.JS, streams.StreamEvents, uint64(len(badSeqs)), 30*time.Second)

	// Still publishing after the bad ones, and still the same process.
	mixed.sendFPM(n, "rank-0", 0)
	waitStreamCount(t, env.JS, streams.StreamFPM, want+1, 15*time.Second)
	select {
	case <-bridge.done:
		t.Fatalf("bridge exited: %v", bridge.err)
	default:
	}

	perRank := map[int]map[uint64]string{}
	for _, m := range storedFPMs(t, env.JS, ">") {
		if perRank[m.key.DPRank] == nil {
			perRank[m.key.DPRank] = map[uint64]string{}
		}
		if _, dup := perRank[m.key.DPRank][m.seq]; dup {
			t.Fatalf("rank %d seq %d stored twice", m.key.DPRank, m.seq)
		}
		perRank[m.key.DPRank][m.seq] = m.key.WorkerID
	}
	for r := 1; r <= 2; r++ {
		if len(perRank[r]) != n {
			t.Fatalf("rank %d: %d of %d FPMs stored", r, len(perRank[r]), n)
		}
	}
	for seq := uint64(0); seq <= n; seq++ {
		w, ok := perRank[0][seq]
		switch {
		case seq < n && worker(seq) == long:
			if ok {
				t.Fatalf("rank 0 seq %d with a %d-byte worker_id was stored", seq, bad)
			}
		case !ok:
			t.Fatalf("rank 0 seq %d missing", seq)
		case seq < n && w != worker(seq):
			t.Fatalf("rank 0 seq %d stored under worker_id of %d bytes, want %d", seq, len(w), len(worker(seq)))
		}
	}
	subjectLen := len(streams.DropMarkerSubject(streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: long, DPRank: 0}))
	dls := natsservertest.Messages(t, env.JS, streams.StreamEvents, streams.DeadLetterWildcard)
	if len(dls) != len(badSeqs) {
		t.Fatalf("%d dead letters, want one per bad FPM (%d)", len(dls), len(badSeqs))
	}
	for i, dl := range dls {
		h := dl.Headers()
		if h.Get(streams.HeaderSeq) != strconv.FormatUint(badSeqs[i], 10) || h.Get(streams.HeaderErrorStage) != "size" ||
			h.Get("Fpm-Error-Size") != strconv.Itoa(subjectLen) || h.Get("Fpm-Error-Limit") == "" ||
			!strings.Contains(h.Get(streams.HeaderError), "worker_id of 4100 bytes") ||
			!strings.Contains(h.Get(streams.HeaderError), "max control line of 4096 bytes") {
			t.Fatalf("dead letter %d: subject %s headers %v", i, dl.Subject(), h)
		}
	}

	m := metricsOf(t, metrics)
	for r, wantPub := range map[string]float64{"0": float64(n - len(badSeqs) + 1), "1": n, "2": n} {
		pub := sumSamples(m, "fpmbus_bridge_published_total", "rank", r)
		recv := sumSamples(m, "fpmbus_bridge_received_total", "rank", r)
		inv := sumSamples(m, "fpmbus_bridge_invalid_total", "rank", r)
		if pub != wantPub || recv != pub+inv {
			t.Fatalf("rank %s: published %v (want %v), received %v, invalid %v", r, pub, wantPub, recv, inv)
		}
	}
	if d := sumSamples(m, "fpmbus_bridge_dropped_total"); d != 0 {
		t.Fatalf("%v FPMs counted as dropped; every one was stored or dead-lettered", d)
	}
	if got := sumSamples(m, "fpmbus_bridge_invalid_total", "rank", "0", "stage", "size"); got != float64(len(badSeqs)) {
		t.Fatalf("invalid{rank=0,stage=size} = %v", got)
	}
	if got := sumSamples(m, "fpmbus_bridge_dead_letters_total", "rank", "0"); got != float64(len(badSeqs)) {
		t.Fatalf("dead_letters{rank=0} = %v", got)
	}
	if err := bridge.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("bridge exit: %v\n%s", err, bridge.Output())
	}
}

// memFlags are the bridge flags (and the server limit) the README's memory bound is a formula of.
type memFlags struct {
	ranks          int64 // --dp-size
	maxBuffer      int64 // --max-buffer (also libzmq's ZMQ_RCVHWM per socket)
	maxBufferBytes int64 // --max-buffer-bytes
	maxPayload     int64 // --max-payload (ZMQ_MAXMSGSIZE)
	serverMax      int64 // the server's max_payload
}

func (f memFlags) args() []string {
	return []string{"--max-buffer", strconv.FormatInt(f.maxBuffer, 10), "--max-buffer-bytes", strconv.FormatInt(f.maxBufferBytes, 10),
		"--max-payload", strconv.FormatInt(f.maxPayload, 10)}
}

// memoryBound is the README's worst-case peak RSS of `fpmbus bridge` (bridge section, "Memory"):
//
//	R0 + Z + 2 × H
//	Z = ranks × (max-buffer + 1) × (max-payload + 256)                 libzmq queues, C heap
//	H = 2 × (max-buffer-bytes + S + 1280)                              buffer, and what the publisher holds
//	    + ranks × (1 MiB + S + 1280 + 56 × max-payload) + 8 MiB         readers, decoding; fixed
//
// with S the server's max_payload, R0 = 64 MiB the binary, runtime and threads, and the factor 2 on H
// Go's garbage collector (GOGC=100) letting the heap reach twice its live data.
func memoryBound(f memFlags) int64 {
	const r0, fixed, item = 64 << 20, 8 << 20, 1280
	z := f.ranks * (f.maxBuffer + 1) * (f.maxPayload + 256)
	h := 2*(f.maxBufferBytes+f.serverMax+item) + f.ranks*(1<<20+f.serverMax+item+56*f.maxPayload) + fixed
	return r0 + z + 2*h
}

// waitQuiet waits until the bridge has resolved everything it received: nothing buffered or in flight,
// and received == published + dropped + invalid, stable for half a second.
func waitQuiet(t *testing.T, addr string, d time.Duration) map[string][]metricSample {
	t.Helper()
	var m map[string][]metricSample
	last, since := -1.0, time.Now()
	eventually(t, d, func() error {
		m = metricsOf(t, addr)
		recv := sumSamples(m, "fpmbus_bridge_received_total")
		done := sumSamples(m, "fpmbus_bridge_published_total") + sumSamples(m, "fpmbus_bridge_dropped_total") +
			sumSamples(m, "fpmbus_bridge_invalid_total")
		busy := sumSamples(m, "fpmbus_bridge_buffered_messages") + sumSamples(m, "fpmbus_bridge_in_flight")
		if recv != last {
			last, since = recv, time.Now()
		}
		if recv == 0 || recv != done || busy != 0 || time.Since(since) < 500*time.Millisecond {
			return fmt.Errorf("received %v, resolved %v, buffered+in flight %v", recv, done, busy)
		}
		return nil
	})
	return m
}

// The bridge's peak RSS, read from /proc/<pid>/status, stays within the README's formula of its flags
// under a 200,000-message burst and under oversized frames (one of 300 MB, then 30 of 20 MB, against
// the default --max-payload of 1 MiB), which libzmq must refuse without reading them.
func TestBridgePeakMemoryWithinTheDocumentedBound(t *testing.T) {
	t.Run("200k burst", func(t *testing.T) {
		const burst = 200_000
		env := natsservertest.Start(t)
		base := producertest.FreeBasePort(t, "127.0.0.1", 1)
		metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		f := memFlags{ranks: 1, maxBuffer: 20_000, maxBufferBytes: 16 << 20, maxPayload: 4096, serverMax: natsserver.DefaultMaxPayload}
		pub := newRawPublisher(t, base)
		bridge := startBridge(t, "bridge", env.Server.ClientURL(), base, 1, append(f.args(), "--metrics-addr", metrics)...)
		pub.waitSubscribed()
		idle := peakRSS(t, bridge.cmd.Process.Pid)
		for seq := range uint64(burst) {
			pub.sendFPM(seq, "burst-worker", 0)
		}
		m := waitQuiet(t, metrics, 60*time.Second)
		peak, bound := peakRSS(t, bridge.cmd.Process.Pid), memoryBound(f)
		stored, err := streamCount(t, env.JS, streams.StreamFPM)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("burst of %d: received %v, stored %d, dropped %v; peak RSS %d MiB (idle %d MiB), bound %d MiB",
			burst, sumSamples(m, "fpmbus_bridge_received_total"), stored, sumSamples(m, "fpmbus_bridge_dropped_total"),
			peak>>20, idle>>20, bound>>20)
		if peak > bound {
			t.Fatalf("peak RSS %d MiB exceeds the documented bound of %d MiB", peak>>20, bound>>20)
		}
		if stored == 0 || float64(stored) != sumSamples(m, "fpmbus_bridge_published_total") {
			t.Fatalf("stored %d, published %v", stored, sumSamples(m, "fpmbus_bridge_published_total"))
		}
	})
	t.Run("oversized frames", func(t *testing.T) {
		env := natsservertest.Start(t)
		base := producertest.FreeBasePort(t, "127.0.0.1", 1)
		metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		// The buffer holds the 100 FPMs sent after the refusals even when a loaded host stalls publishing.
		f := memFlags{ranks: 1, maxBuffer: 256, maxBufferBytes: 8 << 20, maxPayload: 1 << 20, serverMax: natsserver.DefaultMaxPayload}
		pub := newRawPublisher(t, base)
		bridge := startBridge(t, "bridge", env.Server.ClientURL(), base, 1,
			"--max-buffer", strconv.FormatInt(f.maxBuffer, 10), "--max-buffer-bytes", strconv.FormatInt(f.maxBufferBytes, 10), "--metrics-addr", metrics)
		pub.waitSubscribed()
		idle := peakRSS(t, bridge.cmd.Process.Pid)
		seq := uint64(0)
		refuse := func(size int) {
			frame := make([]byte, size)
			if err := pub.s.SendFrames(nil, []byte{0, 0, 0, 0, 0, 0, 0, byte(seq)}, frame); err != nil {
				t.Fatal(err)
			}
			seq++
			pub.waitSubscribed() // refused: libzmq dropped the connection, the bridge reconnected
		}
		refuse(300 << 20)
		for range 30 {
			refuse(20 << 20)
		}
		for range 100 {
			pub.sendFPM(seq, "after-oversized", 0)
			seq++
		}
		waitStreamCount(t, env.JS, streams.StreamFPM, 100, 30*time.Second)
		m := waitQuiet(t, metrics, 30*time.Second)
		peak, bound := peakRSS(t, bridge.cmd.Process.Pid), memoryBound(f)
		t.Logf("31 oversized frames: refused %v, dead letters %v; peak RSS %d MiB (idle %d MiB), bound %d MiB",
			sumSamples(m, "fpmbus_bridge_oversized_frames_total"), sumSamples(m, "fpmbus_bridge_dead_letters_total"), peak>>20, idle>>20, bound>>20)
		if got := sumSamples(m, "fpmbus_bridge_oversized_frames_total", "rank", "0"); got != 31 {
			t.Fatalf("oversized_frames{rank=0} = %v, want 31", got)
		}
		dls := natsservertest.Messages(t, env.JS, streams.StreamEvents, streams.DeadLetterWildcard)
		if len(dls) != 31 {
			t.Fatalf("%d dead letters, want 31", len(dls))
		}
		for _, dl := range dls {
			if h := dl.Headers(); h.Get("Fpm-Error-Limit") != "1048576" || h.Get(streams.HeaderErrorStage) != "size" || len(dl.Data()) != 0 {
				t.Fatalf("dead letter %v", h)
			}
		}
		if peak > bound {
			t.Fatalf("peak RSS %d MiB exceeds the documented bound of %d MiB", peak>>20, bound>>20)
		}
		if peak-idle > 100<<20 {
			t.Fatalf("peak RSS grew by %d MiB over idle: an oversized frame was read into memory", (peak-idle)>>20)
		}
	})
}
