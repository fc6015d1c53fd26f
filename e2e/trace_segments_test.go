package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/consumers/trace"
	"github.com/fpmbus/fpmbus/internal/freeport"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// streamSeqs returns the stream sequence of every FPM message by its line identity
// ("<Fpm-Received-At-Ms> <body>", unique in fillFPM's messages).
func streamSeqs(t *testing.T, js jetstream.JetStream) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, m := range natsservertest.Messages(t, js, streams.StreamFPM, ">") {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		out[m.Headers().Get(streams.HeaderReceivedAt)+" "+string(m.Data())] = md.Sequence.Stream
	}
	return out
}

// checkFullLines checks, by decoding every segment under out, that its full-mode lines are exactly the
// stream messages with sequences from..to, each once, and in stream order per producer.
func checkFullLines(t *testing.T, seqs map[string]uint64, out string, from, to uint64) {
	t.Helper()
	files, err := filepath.Glob(out + ".*" + tracefile.SegmentSuffix)
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files) // per producer, in index order (zero-padded)
	seen := map[uint64]int{}
	last := map[string]uint64{}
	for _, f := range files {
		err := tracefile.ReadSegment(f, func(line []byte) error {
			l, err := schemas.ParseTraceLine(line)
			if err != nil {
				return err
			}
			id := strconv.FormatInt(l.Event.ObservedAtUnixMs, 10) + " " + string(l.Event.FPM)
			seq, ok := seqs[id]
			if !ok {
				return fmt.Errorf("a line that is no stream message: %.100s", id)
			}
			p := l.Event.Source.ProducerID
			if seq <= last[p] {
				return fmt.Errorf("producer %s: stream sequence %d after %d: written twice or out of order", p, seq, last[p])
			}
			last[p] = seq
			seen[seq]++
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	for seq := from; seq <= to; seq++ {
		if seen[seq] != 1 {
			t.Fatalf("stream sequence %d has %d lines, want 1 (lines for %d messages of %d..%d)", seq, seen[seq], len(seen), from, to)
		}
	}
	if len(seen) != int(to-from+1) {
		t.Fatalf("lines for %d messages, want %d (%d..%d)", len(seen), to-from+1, from, to)
	}
}

// The server under a running `fpmbus trace` restarts: the writer is cut off, its partition ends at the
// disconnect and is taken again after the reconnect, within the same process. That is neither a roll
// nor a writer's start, so it opens no segment: each producer's lines, before and after, are in one
// segment, every message once and in stream order.
func TestTraceWriterPartitionRetakenOpensNoSegment(t *testing.T) {
	t.Parallel()
	const half = 2000
	listen := fmt.Sprintf("127.0.0.1:%d", freeport.Block(t, "", 1))
	store := t.TempDir()
	env := natsservertest.StartAt(t, listen, store)
	url := env.Server.ClientURL()
	out := filepath.Join(t.TempDir(), "trace", "fpm")
	fillFPMOffset(t, env.JS, 0, half, 2, 2, 1_782_777_600_000)
	p := startDebug(t, "fpmbus trace", "trace", "--server", url, "--trace-mode", "full", "--trace-output", out,
		"--trace-flush-interval", "100ms")
	p.waitOutput("trace writer started", 30*time.Second)
	eventually(t, 30*time.Second, func() error { return consumerAcked(env.JS, streams.StreamFPM, trace.DefaultGroup) })
	gained := strings.Count(p.Output(), `msg="partition acquired"`)

	env.Stop()
	env = natsservertest.StartAt(t, listen, store)
	fillFPMOffset(t, env.JS, half, half, 2, 2, 1_782_777_600_000)
	eventually(t, 60*time.Second, func() error {
		if n := strings.Count(p.Output(), `msg="partition acquired"`); n <= gained {
			return fmt.Errorf("the partition was not taken again after the server restart (%d takes)", n)
		}
		return consumerAcked(env.JS, streams.StreamFPM, trace.DefaultGroup)
	})
	if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("trace writer: %v", err)
	}
	files, _ := filepath.Glob(out + ".*" + tracefile.SegmentSuffix)
	sort.Strings(files)
	if len(files) != 2 {
		t.Fatalf("segments %v, want one per producer (kw0, kw1): the retaken partition opened new ones", files)
	}
	checkFullLines(t, streamSeqs(t, env.JS), out, 1, 2*half)
}

// Retention pruning (--trace-max-segments) removes acknowledged lines: every pruned segment is named by
// a loss event on fpmevents.loss.trace (cause pruned, the segment, its line count and stream
// sequences), counted by `fpmbus gaps report` and by fpmbus_trace_pruned_lines_total; the lines the
// events name and the lines still in the files add up to every message of the stream, once.
func TestTraceSegmentPruningIsALossEvent(t *testing.T) {
	t.Parallel()
	const total = 3000
	dir := t.TempDir()
	out := filepath.Join(dir, "trace", "fpm")
	listen := fmt.Sprintf("127.0.0.1:%d", freeport.Block(t, "", 1))
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freeport.Block(t, "", 1))
	url := "nats://" + listen
	up := fpmbus(t, "fpmbus up", "up", "--listen", listen, "--data-dir", filepath.Join(dir, "data"), "--dp-size", "1",
		"--fpm-port", strconv.Itoa(freeport.Block(t, "", 1)), "--metrics-addr", metricsAddr, "--trace-mode", "full", "--trace-output", out,
		"--trace-roll-bytes", "40000", "--trace-max-segments", "2", "--trace-flush-interval", "100ms")
	up.waitOutput("trace writer started", 60*time.Second)
	js := jsClient(t, url)
	fillFPM(t, js, total, 2, 2, 1_782_777_600_000)
	eventually(t, 60*time.Second, func() error { return consumerAcked(js, streams.StreamFPM, trace.DefaultGroup) })

	kept := len(traceLines(t, out+".*"+tracefile.SegmentSuffix))
	if kept >= total {
		t.Fatalf("%d lines kept of %d: nothing was pruned", kept, total)
	}
	pruned := uint64(total - kept)
	var events uint64
	eventually(t, 30*time.Second, func() error {
		events = 0
		for _, m := range natsservertest.Messages(t, js, streams.StreamEvents, streams.ConsumerLossSubject(trace.ConsumerName)) {
			var l streams.ConsumerLoss
			if err := json.Unmarshal(m.Data(), &l); err != nil {
				return err
			}
			if l.Cause != streams.LossPruned || l.Segment == "" || l.Count == 0 || l.First == 0 || l.Last < l.First {
				return fmt.Errorf("loss event %s", m.Data())
			}
			events += l.Count
		}
		if events != pruned {
			return fmt.Errorf("loss events name %d pruned lines, the files lost %d", events, pruned)
		}
		return nil
	})
	samples, err := scrapeSamples(metricsAddr)
	if err != nil {
		t.Fatal(err)
	}
	if got := sumSamples(samples, "fpmbus_trace_pruned_lines_total"); got != float64(pruned) {
		t.Fatalf("fpmbus_trace_pruned_lines_total %v, want %d", got, pruned)
	}
	report, err := run(t, 30*time.Second, fpmbusBin, "gaps", "report", "--server", url, "--json")
	if err != nil {
		t.Fatalf("gaps report: %v\n%s", err, report)
	}
	var rep gaps.Report
	if err := json.Unmarshal([]byte(report), &rep); err != nil {
		t.Fatalf("gaps report JSON: %v\n%s", err, report)
	}
	var counted uint64
	for _, l := range rep.StreamLosses {
		if l.Consumer == trace.ConsumerName && l.Cause == streams.LossPruned {
			counted += l.Messages
		}
	}
	if counted != pruned {
		t.Fatalf("gaps report counts %d pruned lines (%+v), the files lost %d", counted, rep.StreamLosses, pruned)
	}
	if err := up.signal(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("fpmbus up: %v", err)
	}
	t.Logf("%d of %d lines pruned, each named by a loss event", pruned, total)
}
