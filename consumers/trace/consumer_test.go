package trace

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/golden"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// lineID identifies a published FPM in the output.
type lineID struct {
	producer, worker string
	rank             int64
	counter          int64
}

// checkExactlyOnce parses every output line and checks it against the published messages: one line
// per message, fpm bytes identical to the body, observed_at from the header.
func checkExactlyOnce(t *testing.T, out map[string][][]byte, published []testFPM, mode string) {
	t.Helper()
	want := map[lineID]testFPM{}
	for _, f := range published {
		want[lineID{tracefile.SanitizeProducerID(f.key.WorkerID), f.key.WorkerID, int64(f.key.DPRank), f.counter}] = f
	}
	seen := map[lineID]bool{}
	total := 0
	for producer, lines := range out {
		for i, l := range lines {
			total++
			tl, err := schemas.ParseTraceLine(l)
			if err != nil {
				t.Fatalf("%s line %d: %v\n%s", producer, i, err, l)
			}
			f, err := schemas.ParseFPMJSON(tl.Event.FPM)
			if err != nil {
				t.Fatal(err)
			}
			id := lineID{producer, f.WorkerID, f.DPRank, f.CounterID}
			if seen[id] {
				t.Fatalf("duplicate line for %+v", id)
			}
			seen[id] = true
			p, ok := want[id]
			if !ok {
				t.Fatalf("line for %+v was never published", id)
			}
			if !bytes.Equal(tl.Event.FPM, p.body(t)) {
				t.Fatalf("%+v: fpm %s, published %s", id, tl.Event.FPM, p.body(t))
			}
			if tl.Event.ObservedAtUnixMs != p.receivedMs {
				t.Fatalf("%+v: observed_at %d, header %d", id, tl.Event.ObservedAtUnixMs, p.receivedMs)
			}
			if tl.Event.CaptureMode != mode || tl.Event.Source.Namespace != p.key.Namespace ||
				tl.Event.Source.Component != p.key.Component || tl.Event.Source.ProducerID != p.key.WorkerID {
				t.Fatalf("%+v: event %+v", id, tl.Event)
			}
		}
	}
	if total != len(published) {
		t.Fatalf("%d lines, %d messages published", total, len(published))
	}
}

func TestFullModeWritesEveryMessageExactlyOnce(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	const n = 5000
	msgs, published := manyFPMs(t, testKeys(4), n, 1_782_777_600_000)
	publish(t, env.JS, msgs)

	cfg := testConfig(t)
	cfg.RollBytes = 256 << 10 // several segments per producer
	cfg.MaxSegments = 1000
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	r := startWriter(t, cfg, env.JS)
	if err := r.w.Run(context.Background()); !errors.Is(err, errAlreadyRunning) {
		t.Fatalf("second Run = %v, want ErrAlreadyRunning", err)
	}
	ci := waitConsumed(t, env.JS, cfg.Group)
	mfs, err := reg.Gather() // the runner's metrics are registered while it runs
	if err != nil {
		t.Fatal(err)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if ci.NumAckPending != 0 || ci.NumPending != 0 || ci.AckFloor.Stream != n {
		t.Fatalf("consumer: ack pending %d, pending %d, ack floor %d", ci.NumAckPending, ci.NumPending, ci.AckFloor.Stream)
	}
	out := outputLines(t, cfg.OutputPath)
	if len(out) != 2 {
		t.Fatalf("producers %d, want 2 (w0, w1)", len(out))
	}
	checkExactlyOnce(t, out, published, schemas.CaptureFull)
	if got := counterValue(t, r.w.metrics.writtenMode); got != n {
		t.Fatalf("fpmbus_trace_written_total = %v, want %d", got, n)
	}
	if got := counterValue(t, r.w.metrics.rolled); got == 0 {
		t.Fatal("no segment rolled")
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
		if mf.GetName() == "fpmbus_trace_flush_seconds" && mf.GetMetric()[0].GetHistogram().GetSampleCount() == 0 {
			t.Fatal("no flush observed")
		}
	}
	for _, n := range []string{"fpmbus_trace_written_total", "fpmbus_trace_segments_rolled_total", "fpmbus_trace_flush_seconds",
		"fpmbus_consumer_acked_total"} {
		if !names[n] {
			t.Fatalf("metric %s not registered (have %v)", n, names)
		}
	}
	// Within each producer, lines keep the stream order of each key.
	for p, lines := range out {
		last := map[int64]int64{}
		for _, l := range lines {
			tl, _ := schemas.ParseTraceLine(l)
			f, _ := schemas.ParseFPMJSON(tl.Event.FPM)
			if prev, ok := last[f.DPRank]; ok && f.CounterID != prev+1 {
				t.Fatalf("%s rank %d: counter %d after %d", p, f.DPRank, f.CounterID, prev)
			}
			last[f.DPRank] = f.CounterID
		}
	}

	// A restart writes nothing twice and never touches the old segments; new messages go to new ones.
	sizes := map[string]int64{}
	for _, p := range []string{"w0", "w1"} {
		segs, _ := tracefile.ListSegments(tracefile.OutputBase(cfg.OutputPath) + "." + p)
		for _, s := range segs {
			fi, _ := os.Stat(s.Path)
			sizes[s.Path] = fi.Size()
		}
	}
	cfg.Registerer = nil
	r2 := startWriter(t, cfg, env.JS)
	more, published2 := manyFPMs(t, testKeys(4), 400, 1_782_777_700_000)
	for i := range published2 {
		published2[i].counter += n / 4
	}
	for i := range more {
		more[i] = published2[i].msg(t)
	}
	publish(t, env.JS, more)
	waitConsumed(t, env.JS, cfg.Group)
	if err := r2.stop(); err != nil {
		t.Fatal(err)
	}
	for path, size := range sizes {
		fi, err := os.Stat(path)
		if err != nil || fi.Size() != size {
			t.Fatalf("old segment %s changed after restart: %v", path, err)
		}
	}
	checkExactlyOnce(t, outputLines(t, cfg.OutputPath), append(published, published2...), schemas.CaptureFull)
}

func TestGracefulStopFlushesAndAcks(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	msgs, published := manyFPMs(t, testKeys(2), 300, 1_782_777_600_000)
	publish(t, env.JS, msgs)
	cfg := testConfig(t)
	cfg.FlushInterval = time.Hour // only the stop flushes
	cfg.AckWait = 2 * time.Hour
	r := startWriter(t, cfg, env.JS)

	// Wait until the writer holds every message unacked.
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := env.JS.PushConsumer(context.Background(), streams.StreamFPM, cfg.Group)
		if err != nil {
			t.Fatal(err)
		}
		ci, err := c.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if ci.NumPending == 0 && ci.NumAckPending == 300 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not all delivered: %+v", ci)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // the writer's loop has handled what it received
	if out := outputLines(t, cfg.OutputPath); len(out) != 0 {
		t.Fatalf("lines written before the stop: %d producers", len(out))
	}
	if err := r.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	ci := waitConsumed(t, env.JS, cfg.Group)
	if ci.NumAckPending != 0 {
		t.Fatalf("ack pending %d after stop", ci.NumAckPending)
	}
	checkExactlyOnce(t, outputLines(t, cfg.OutputPath), published, schemas.CaptureFull)
}

// An invalid message is dead-lettered (fpmevents.deadletter.consumer.trace) with the reason, counted, and never
// holds up the others.
func TestInvalidMessagesAreDeadLetteredAndCounted(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	good := testFPM{key: streams.Key{Namespace: "ns", Component: "c", WorkerID: "w", DPRank: 0}, counter: 1, receivedMs: 1000}
	badBody := good.msg(t)
	badBody.Data = []byte(`{"version":2}`)
	badBody.Header.Set(streams.HeaderMsgID, "bad-body")
	badSubject := good.msg(t)
	badSubject.Subject = "fpm.ns.c.w"
	badSubject.Header.Set(streams.HeaderMsgID, "bad-subject")
	notJSON := good.msg(t)
	notJSON.Data = []byte("\x87\xa7version\x01")
	notJSON.Header.Set(streams.HeaderMsgID, "not-json")
	publish(t, env.JS, []*nats.Msg{badBody, good.msg(t), badSubject, notJSON})

	cfg := testConfig(t)
	r := startWriter(t, cfg, env.JS)
	ci := waitConsumed(t, env.JS, cfg.Group)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if ci.NumAckPending != 0 || ci.NumRedelivered != 0 {
		t.Fatalf("consumer %+v", ci)
	}
	if got := counterValue(t, r.w.metrics.invalid); got != 3 {
		t.Fatalf("invalid = %v, want 3", got)
	}
	checkExactlyOnce(t, outputLines(t, cfg.OutputPath), []testFPM{good}, schemas.CaptureFull)
	dl := deadLetters(t, env.JS)
	if len(dl) != 3 {
		t.Fatalf("%d dead letters, want 3", len(dl))
	}
	for i, want := range []struct {
		seq    string
		reason string
	}{{"1", "fpmbus trace: body:"}, {"3", "fpmbus trace:"}, {"4", "fpmbus trace: body:"}} {
		h := dl[i].Headers()
		if h.Get(streams.HeaderStreamSeq) != want.seq || !strings.HasPrefix(h.Get(streams.HeaderError), want.reason) || h.Get(streams.HeaderConsumer) != ConsumerName {
			t.Fatalf("dead letter %d: headers %v, want stream sequence %s and a reason starting %q", i, h, want.seq, want.reason)
		}
	}
}

func TestProducerIDAndObservedAt(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	k := streams.Key{Namespace: "ns", Component: "c", WorkerID: "4192", DPRank: 0}
	msgs := []*nats.Msg{
		testFPM{key: k, counter: 1, receivedMs: 1111, producer: "worker/a:b"}.msg(t),
		testFPM{key: k, counter: 2, receivedMs: 2222, producer: "worker:a/b"}.msg(t), // same file
		testFPM{key: k, counter: 3}.msg(t),                                           // no headers
	}
	publish(t, env.JS, msgs)
	cfg := testConfig(t)
	before := time.Now().UnixMilli()
	r := startWriter(t, cfg, env.JS)
	waitConsumed(t, env.JS, cfg.Group)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	out := outputLines(t, cfg.OutputPath)
	if len(out) != 2 || len(out["worker_a_b"]) != 2 || len(out["4192"]) != 1 {
		t.Fatalf("producers: %v", keysOf(out))
	}
	for i, want := range []struct {
		producer string
		observed int64
	}{{"worker/a:b", 1111}, {"worker:a/b", 2222}} {
		tl, err := schemas.ParseTraceLine(out["worker_a_b"][i])
		if err != nil {
			t.Fatal(err)
		}
		if tl.Event.Source.ProducerID != want.producer || tl.Event.ObservedAtUnixMs != want.observed {
			t.Fatalf("line %d: %+v", i, tl.Event)
		}
	}
	tl, err := schemas.ParseTraceLine(out["4192"][0])
	if err != nil {
		t.Fatal(err)
	}
	// No Fpm-Received-At-Ms: the stream timestamp (set when the test published it).
	if obs := tl.Event.ObservedAtUnixMs; obs < before-60_000 || obs > time.Now().UnixMilli() {
		t.Fatalf("observed_at %d is not the stream timestamp", obs)
	}

	// --producer-id files everything under one producer.
	cfg2 := testConfig(t)
	cfg2.ProducerID = "fixed"
	cfg2.Group = "other"
	r2 := startWriter(t, cfg2, env.JS)
	waitConsumed(t, env.JS, cfg2.Group)
	if err := r2.stop(); err != nil {
		t.Fatal(err)
	}
	if out := outputLines(t, cfg2.OutputPath); len(out) != 1 || len(out["fixed"]) != 3 {
		t.Fatalf("override: %v", keysOf(out))
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func keysOf(m map[string][][]byte) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[k] = len(v)
	}
	return out
}

func TestFullModeGolden(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	a := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "4192", DPRank: 0}
	b := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "4192", DPRank: 1}
	c := streams.Key{Namespace: "team \"x\"", Component: "prefill", WorkerID: "", DPRank: 0}
	var msgs []*nats.Msg
	for i, f := range []testFPM{
		{key: a, counter: 41, receivedMs: 1782777601250},
		{key: b, counter: 7, receivedMs: 1782777601251},
		{key: a, counter: 42, receivedMs: 1782777601275, heartbeat: true},
		{key: c, counter: 0, receivedMs: 1782777601300},
		{key: b, counter: 8, receivedMs: 1782777601301, producer: "conn/7"},
	} {
		m := f.msg(t)
		m.Header.Set(streams.HeaderMsgID, fmt.Sprint("golden-", i))
		msgs = append(msgs, m)
	}
	publish(t, env.JS, msgs)
	cfg := testConfig(t)
	start := time.Date(2026, 6, 30, 0, 0, 0, 0, time.UTC)
	ticks := 0
	clock := func() time.Time { ticks++; return start.Add(time.Duration(ticks-1) * 250 * time.Millisecond) }
	r := startWriter(t, cfg, env.JS, durable.WithClock(clock))
	waitConsumed(t, env.JS, cfg.Group)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	out := outputLines(t, cfg.OutputPath)
	var got bytes.Buffer
	for _, p := range []string{"4192", "conn_7", "unknown"} {
		fmt.Fprintf(&got, "# %s\n", filepath.Base(tracefile.SegmentPath(tracefile.SegmentPrefix(cfg.OutputPath, p), 0)))
		for _, l := range out[p] {
			got.Write(l)
			got.WriteByte('\n')
		}
	}
	golden.Check(t, filepath.Join("testdata", "full_trace.golden.jsonl"), got.Bytes(), *update)
}

func TestSampledMode(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	const base = 1_782_777_600_000 // a multiple of the interval
	a := streams.Key{Namespace: "ns", Component: "c", WorkerID: "w", DPRank: 0}
	b := streams.Key{Namespace: "ns", Component: "c", WorkerID: "w", DPRank: 1}
	var fs []testFPM
	// Key a: interval 0 counters 0..9, interval 1 counters 10..19, interval 2 counter 20, interval 3
	// counter 20 again (unchanged: not repeated), interval 5 counter 21.
	for i := range 20 {
		fs = append(fs, testFPM{key: a, counter: int64(i), receivedMs: base + int64(i)*100})
	}
	fs = append(fs,
		testFPM{key: a, counter: 20, receivedMs: base + 2500},
		testFPM{key: b, counter: 100, receivedMs: base + 2600}, // key b: only one message
		testFPM{key: a, counter: 20, receivedMs: base + 3100},
		testFPM{key: a, counter: 5, receivedMs: base + 900}, // late: interval 0 is written
		testFPM{key: a, counter: 21, receivedMs: base + 5999},
	)
	var msgs []*nats.Msg
	for i, f := range fs {
		m := f.msg(t)
		m.Header.Set(streams.HeaderMsgID, fmt.Sprint("s-", i))
		msgs = append(msgs, m)
	}
	// Publish in observation order except the deliberately late one.
	publish(t, env.JS, msgs)

	cfg := testConfig(t)
	cfg.Mode = schemas.CaptureSampled
	cfg.SampleInterval = time.Second
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	r := startWriter(t, cfg, env.JS)
	// Sampling waits for the interval to end; the stop writes what is pending.
	waitHanded(t, reg, len(fs))
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	ci := waitConsumed(t, env.JS, cfg.Group)
	if ci.NumAckPending != 0 || ci.AckFloor.Stream != uint64(len(fs)) {
		t.Fatalf("consumer %+v", ci)
	}
	out := outputLines(t, cfg.OutputPath)
	var got []string
	for _, l := range out["w"] {
		tl, err := schemas.ParseTraceLine(l)
		if err != nil {
			t.Fatal(err)
		}
		f, _ := schemas.ParseFPMJSON(tl.Event.FPM)
		if tl.Event.CaptureMode != schemas.CaptureSampled {
			t.Fatalf("capture_mode %q", tl.Event.CaptureMode)
		}
		got = append(got, fmt.Sprintf("%d/%d@%d", f.DPRank, f.CounterID, tl.Event.ObservedAtUnixMs-base))
	}
	// Key b's line may come before or after key a's last one (written at a flush tick or at the stop).
	sort.Strings(got)
	want := []string{"0/19@1900", "0/20@2500", "0/21@5999", "0/9@900", "1/100@2600"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("sampled lines %v, want %v", got, want)
	}
}

// Producer ids of every length are written: one whose segment names fit NAME_MAX keeps Dynamo's file
// name, a longer one a shortened name (ProducerFileName); every line carries the full id, no file name
// exceeds 255 bytes, nothing is rejected or stalled, and `trace info` groups each producer's segments.
func TestLongProducerIDsAreWritten(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ids := []string{
		"w0",
		strings.Repeat("p", 233),       // the longest that keeps Dynamo's name (output base "trace")
		strings.Repeat("p", 234),       // one more: shortened
		strings.Repeat("q", 299) + "1", // two 300-character ids sharing 299 characters
		strings.Repeat("q", 299) + "2",
		strings.Repeat("w/", 2050), // 4,100 characters
		strings.Repeat("é", 233),   // 466 bytes, 233 characters: sanitized to 233 '_', fits
		strings.Repeat("ü", 234),   // shortened
	}
	const perProducer = 10
	var msgs []*nats.Msg
	var published []testFPM
	for i := range perProducer {
		for j, id := range ids {
			f := testFPM{key: streams.Key{Namespace: "ns", Component: "c", WorkerID: fmt.Sprint("w", j)}, counter: int64(i),
				receivedMs: 1_782_777_600_000 + int64(i*len(ids)+j), producer: id}
			published = append(published, f)
			msgs = append(msgs, f.msg(t))
		}
	}
	publish(t, env.JS, msgs)
	cfg := testConfig(t)
	cfg.OutputPath = filepath.Join(t.TempDir(), "trace.jsonl.gz")
	cfg.RollBytes = 4 << 10 // several segments per producer
	cfg.MaxSegments = 1000
	r := startWriter(t, cfg, env.JS)
	ci := waitConsumed(t, env.JS, cfg.Group)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if ci.AckFloor.Stream != uint64(len(msgs)) || len(deadLetters(t, env.JS)) != 0 {
		t.Fatalf("ack floor %d of %d, %d dead letters", ci.AckFloor.Stream, len(msgs), len(deadLetters(t, env.JS)))
	}
	entries, err := os.ReadDir(filepath.Dir(cfg.OutputPath))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if len(e.Name()) > 255 {
			t.Fatalf("file name of %d bytes: %s", len(e.Name()), e.Name())
		}
	}
	for j, id := range ids {
		prefix := tracefile.SegmentPrefix(cfg.OutputPath, id)
		if fits := len(tracefile.SanitizeProducerID(id)) <= 233; fits != (filepath.Base(prefix) == "trace."+tracefile.SanitizeProducerID(id)) {
			t.Fatalf("producer %d (%d characters): file name %s", j, len([]rune(id)), filepath.Base(prefix))
		}
		var counters []int64
		segs := prefixLines(t, prefix)
		for _, idx := range slices.Sorted(maps.Keys(segs)) {
			for _, l := range segs[idx] {
				tl, err := schemas.ParseTraceLine([]byte(l))
				if err != nil {
					t.Fatal(err)
				}
				if tl.Event.Source.ProducerID != id {
					t.Fatalf("producer %d: a line of producer_id %.40q… in its file", j, tl.Event.Source.ProducerID)
				}
				f, _ := schemas.ParseFPMJSON(tl.Event.FPM)
				counters = append(counters, f.CounterID)
			}
		}
		if fmt.Sprint(counters) != fmt.Sprint([]int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}) {
			t.Fatalf("producer %d (%d characters): counters %v in file order", j, len([]rune(id)), counters)
		}
	}
	rep, err := tracefile.Info([]string{filepath.Dir(cfg.OutputPath)})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Producers) != len(ids) {
		t.Fatalf("trace info: %d producers, want %d", len(rep.Producers), len(ids))
	}
	multi := 0
	for _, p := range rep.Producers {
		if p.Lines != perProducer || len(p.Keys) != 1 || p.Keys[0].Lines != perProducer || !slices.Contains(ids, p.Keys[0].ProducerID) {
			t.Fatalf("trace info: producer %s: %d lines in %d segments, keys %d", p.Producer, p.Lines, len(p.Segments), len(p.Keys))
		}
		if len(p.Segments) > 1 {
			multi++
		}
	}
	if multi < len(ids)/2 {
		t.Fatalf("only %d producers have several segments: the grouping was not tested", multi)
	}
	checkExactlyOnceByProducer(t, published, cfg.OutputPath)
}

// checkExactlyOnceByProducer checks that every published message has exactly one line, in its
// producer's files.
func checkExactlyOnceByProducer(t *testing.T, published []testFPM, outputPath string) {
	t.Helper()
	want := map[string]int{}
	for _, f := range published {
		want[fmt.Sprint(f.producer, "|", f.receivedMs)]++
	}
	got := map[string]int{}
	for _, lines := range outputLines(t, outputPath) {
		for _, l := range lines {
			tl, err := schemas.ParseTraceLine(l)
			if err != nil {
				t.Fatal(err)
			}
			got[fmt.Sprint(tl.Event.Source.ProducerID, "|", tl.Event.ObservedAtUnixMs)]++
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("lines per message differ from one each: %d distinct lines, %d messages", len(got), len(want))
	}
}

// A producer whose file name its file system refuses concerns that producer alone: its messages are
// rejected (dead letters naming the file and the reason) while the other producers are written and
// everything is acknowledged; nothing is retried forever.
func TestRefusedFileNameRejectsOnlyItsProducer(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	var msgs []*nats.Msg
	var ok []testFPM
	for i := range 20 {
		for _, w := range []string{"ok", "refused"} {
			f := testFPM{key: streams.Key{Namespace: "ns", Component: "c", WorkerID: w}, counter: int64(i), receivedMs: 1_782_777_600_000 + int64(2*i)}
			if w == "refused" {
				f.receivedMs++
			} else {
				ok = append(ok, f)
			}
			msgs = append(msgs, f.msg(t))
		}
	}
	publish(t, env.JS, msgs)
	cfg := testConfig(t)
	w, err := New(logTo(retrying(cfg, time.Millisecond, 10*time.Millisecond), testLogger(t)), env.JS, durable.WithMemberID("names"))
	if err != nil {
		t.Fatal(err)
	}
	w.set.open = func(path string) (file, error) {
		if strings.Contains(filepath.Base(path), ".refused.") {
			return nil, &os.PathError{Op: "open", Path: path, Err: syscall.ENAMETOOLONG}
		}
		return createFile(path)
	}
	r := runConsumer(t, w)
	ci := waitConsumed(t, env.JS, cfg.Group)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if ci.AckFloor.Stream != 40 || ci.NumRedelivered != 0 {
		t.Fatalf("consumer: ack floor %d, %d redelivered", ci.AckFloor.Stream, ci.NumRedelivered)
	}
	out := outputLines(t, cfg.OutputPath)
	if len(out) != 1 {
		t.Fatalf("producers with lines: %v, want only ok", keysOf(out))
	}
	checkExactlyOnce(t, out, ok, schemas.CaptureFull)
	dl := deadLetters(t, env.JS)
	if len(dl) != 20 {
		t.Fatalf("%d dead letters, want the 20 messages of the refused producer", len(dl))
	}
	for _, m := range dl {
		reason := m.Headers().Get(streams.HeaderError)
		if m.Headers().Get(streams.HeaderSubject) != "fpm.ns.c.refused.0" ||
			!strings.Contains(reason, "dynamo-fpm.refused") || !strings.Contains(reason, "file name too long") {
			t.Fatalf("dead letter of %s: reason %q", m.Headers().Get(streams.HeaderSubject), reason)
		}
	}
}

// Messages the stream removed (a message limit) while the writer was stopped are reported when it
// comes back: a loss event with the exact range and count, the rest written.
func TestRetentionLossIsReported(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	msgs, first := manyFPMs(t, testKeys(2), 30, 1_782_777_600_000)
	publish(t, env.JS, msgs)
	cfg := testConfig(t)
	r := startWriter(t, cfg, env.JS)
	waitConsumed(t, env.JS, cfg.Group)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	more, pub := manyFPMs(t, testKeys(2), 40, 1_782_777_700_000) // stream sequences 31..70
	for i := range pub {
		pub[i].counter += 15
		more[i] = pub[i].msg(t)
	}
	publish(t, env.JS, more)
	ctx := context.Background()
	st, err := env.JS.Stream(ctx, streams.StreamFPM)
	if err != nil {
		t.Fatal(err)
	}
	sc := st.CachedInfo().Config
	sc.MaxMsgs = 20 // FPM at its limit: 31..50 are removed before the writer reads them
	if _, err := env.JS.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	r = startWriter(t, cfg, env.JS)
	waitConsumed(t, env.JS, cfg.Group)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	var losses []streams.ConsumerLoss
	for _, m := range natsservertest.Messages(t, env.JS, streams.StreamEvents, streams.ConsumerLossSubject(ConsumerName)) {
		var l streams.ConsumerLoss
		if err := json.Unmarshal(m.Data(), &l); err != nil {
			t.Fatal(err)
		}
		l.DetectedAt = 0
		losses = append(losses, l)
	}
	want := []streams.ConsumerLoss{{Event: "loss", Cause: streams.LossRetention, Consumer: ConsumerName, Stream: streams.StreamFPM, First: 31, Last: 50, Count: 20}}
	if fmt.Sprint(losses) != fmt.Sprint(want) {
		t.Fatalf("loss events\n got %+v\nwant %+v", losses, want)
	}
	checkExactlyOnce(t, outputLines(t, cfg.OutputPath), append(first, pub[20:]...), schemas.CaptureFull)
}
