package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/streams"
)

// One `fpmbus up` (full trace mode, every component) takes hostile and careless input in its stride:
// FPMs whose worker_id makes the subject too long for the server (4,100 characters) and FPMs whose
// worker_id makes a trace file name too long (300 characters) mixed into normal traffic on three ranks,
// then a merged artefact that is garbage, published with the nats CLI. Every other FPM reaches the
// stream and the trace; each subject-breaking FPM is exactly one dead letter; the 300-character
// producer's lines are in the trace under a file name the file system takes; the garbage artefact is
// one consumer dead letter and is never delivered again; /healthz answers 200 throughout.
func TestUpTakesHostileInputInItsStride(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	const n = 300
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	up := startUp(t, 3, "--metrics-addr", metrics)
	mixed := newRawPublisher(t, up.basePort)
	others := []*producertest.Scripted{
		producertest.NewScripted(t, fmt.Sprintf("tcp://127.0.0.1:%d", up.basePort+1), 0, false, "rank-1", 1),
		producertest.NewScripted(t, fmt.Sprintf("tcp://127.0.0.1:%d", up.basePort+2), 0, false, "rank-2", 2),
	}
	mixed.waitSubscribed()
	for _, p := range others {
		p.WaitSubscribed()
	}
	waitHealth(t, metrics, 200, 30*time.Second)

	long, medium := strings.Repeat("L", 4100), strings.Repeat("m", 300)
	worker := func(seq uint64) string {
		switch seq % 10 {
		case 3:
			return long
		case 7:
			return medium
		}
		return "rank-0"
	}
	for seq := uint64(0); seq < n; seq++ {
		mixed.sendFPM(seq, worker(seq), 0)
		for _, p := range others {
			p.Send(false)
		}
		time.Sleep(time.Millisecond)
	}
	const stored = n - n/10 + 2*n // every FPM but the 30 over the control line
	js := jsClient(t, up.url)
	waitStreamCount(t, js, streams.StreamFPM, stored, 60*time.Second)

	bridgeDL := natsservertest.Messages(t, js, streams.StreamEvents, streams.DeadLetterSubject("dynamo", "backend", 0))
	if len(bridgeDL) != n/10 {
		t.Fatalf("%d bridge dead letters, want %d (one per 4,100-character worker_id)", len(bridgeDL), n/10)
	}
	for _, dl := range bridgeDL {
		if h := dl.Headers(); h.Get(streams.HeaderErrorStage) != streams.StageSize {
			t.Fatalf("dead letter stage %q, error %q", h.Get(streams.HeaderErrorStage), h.Get(streams.HeaderError))
		}
	}

	// A merged artefact that can never be sealed: one dead letter, never delivered again.
	if out, err := run(t, 20*time.Second, natsBin, "--server", up.url, "pub", streams.BenchMergedSubject("run4"), "garbage"); err != nil {
		t.Fatalf("nats pub: %v\n%s", err, out)
	}
	sealDL := streams.ConsumerDeadLetterSubject("seal")
	eventually(t, 30*time.Second, func() error {
		if got := len(natsservertest.Messages(t, js, streams.StreamEvents, sealDL)); got != 1 {
			return fmt.Errorf("%d dead letters on %s, want 1", got, sealDL)
		}
		return nil
	})
	time.Sleep(6 * time.Second) // longer than the old 5 s redelivery of a garbage artefact
	dls := natsservertest.Messages(t, js, streams.StreamEvents, sealDL)
	if len(dls) != 1 {
		t.Fatalf("%d dead letters on %s after 6 s, want still 1", len(dls), sealDL)
	}
	if h := dls[0].Headers(); h.Get(streams.HeaderConsumer) != "seal" || h.Get(streams.HeaderSubject) != streams.BenchMergedSubject("run4") ||
		h.Get(streams.HeaderStream) != streams.StreamBench || h.Get(streams.HeaderError) == "" || string(dls[0].Data()) != "garbage" {
		t.Fatalf("seal dead letter %q headers %v", dls[0].Data(), h)
	}
	waitHealth(t, metrics, 200, 10*time.Second)

	if err := up.proc.signal(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("fpmbus up exit: %v", err)
	}
	files, err := filepath.Glob(up.traceOut + ".*.jsonl.gz")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if len(filepath.Base(f)) > 255 {
			t.Fatalf("segment name of %d bytes: %s", len(filepath.Base(f)), f)
		}
	}
	lines := traceLines(t, up.traceOut+".*.jsonl.gz")
	if len(lines) != stored {
		t.Fatalf("trace has %d lines, want %d (every stored FPM once)", len(lines), stored)
	}
	byProducer := map[string]int{}
	for _, l := range lines {
		byProducer[l.Event.Source.ProducerID]++
	}
	if byProducer[medium] != n/10 || byProducer["rank-0"] != n-2*n/10 || byProducer["rank-1"] != n || byProducer["rank-2"] != n {
		t.Fatalf("trace lines per producer: 300-character id %d, rank-0 %d, rank-1 %d, rank-2 %d",
			byProducer[medium], byProducer["rank-0"], byProducer["rank-1"], byProducer["rank-2"])
	}
}
