package trace

import (
	"bytes"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/golden"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// ackMsg is a message of the fake consumer: it records whether it was said done (or rejected).
type ackMsg struct {
	fakeMsg
	seq   uint64
	acked bool
	termd bool
}

func (m *ackMsg) Done()        { m.acked = true }
func (m *ackMsg) Reject(error) { m.termd = true }

// harness drives a partition's writer by hand, without a server: messages, flush ticks at a fake
// wall-clock time, and the graceful end. Every flush is awaited, so what is done is deterministic.
type harness struct {
	t    *testing.T
	w    *writer
	cfg  Config
	now  time.Time
	seq  uint64
	msgs []*ackMsg
}

var harnessStart = time.Date(2026, 6, 30, 0, 0, 0, 0, time.UTC)

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	h := &harness{t: t, cfg: cfg, now: harnessStart}
	set, err := newSettings([]durable.Option{durable.WithClock(func() time.Time { return h.now })})
	if err != nil {
		t.Fatal(err)
	}
	set = set.configured(logTo(cfg, slog.New(slog.DiscardHandler)))
	m, err := newMetrics(nil, cfg.Mode)
	if err != nil {
		t.Fatal(err)
	}
	h.w = newWriter(cfg, set, set.Logger, m, h.now, nil)
	t.Cleanup(h.w.abort) // stops the flusher if the test did not finish the writer
	return h
}

// send hands one message to the writer; the wall clock advances 1 ms per message.
func (h *harness) send(f testFPM) *ackMsg {
	h.t.Helper()
	h.seq++
	m := f.msg(h.t)
	am := &ackMsg{fakeMsg: fakeMsg{subject: m.Subject, data: m.Data, hdr: m.Header}, seq: h.seq}
	r, err := parseRecord(am, tracefile.MsgMeta{Seq: h.seq, Stored: time.UnixMilli(1_782_777_600_000)}, h.cfg.ProducerID, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.w.handle(&r); err != nil {
		h.t.Fatal(err)
	}
	h.now = h.now.Add(time.Millisecond)
	h.msgs = append(h.msgs, am)
	return am
}

// tick is the loop's flush tick at wall time at (since start), with the flush awaited.
func (h *harness) tick(at time.Duration) {
	h.t.Helper()
	h.now = harnessStart.Add(at)
	if err := h.w.sampler.emitDue(h.w, h.now); err != nil {
		h.t.Fatal(err)
	}
	h.flushNow()
}

func (h *harness) flushNow() {
	h.t.Helper()
	if err := h.w.flush(); err != nil {
		h.t.Fatal(err)
	}
	if err := h.w.awaitFlush(nil); err != nil {
		h.t.Fatal(err)
	}
}

// stop is the graceful end: every pending sample written, flushed, done, files closed.
func (h *harness) stop() {
	h.t.Helper()
	if err := h.w.finish(nil); err != nil {
		h.t.Fatal(err)
	}
}

// lines returns "rank/counter@observed-base" per line of producer w, in file order.
func (h *harness) lines(base int64) []string {
	h.t.Helper()
	var out []string
	for _, l := range outputLines(h.t, h.cfg.OutputPath)["w"] {
		tl, err := schemas.ParseTraceLine(l)
		if err != nil {
			h.t.Fatal(err)
		}
		if tl.Event.CaptureMode != schemas.CaptureSampled {
			h.t.Fatalf("capture_mode %q", tl.Event.CaptureMode)
		}
		f, _ := schemas.ParseFPMJSON(tl.Event.FPM)
		out = append(out, fmt.Sprintf("%d/%d@%d", f.DPRank, f.CounterID, tl.Event.ObservedAtUnixMs-base))
	}
	return out
}

func (h *harness) unacked() []int {
	var out []int
	for i, m := range h.msgs {
		if !m.acked {
			out = append(out, i)
		}
	}
	return out
}

func sampledConfig(t *testing.T) Config {
	cfg := testConfig(t)
	cfg.Mode = schemas.CaptureSampled
	cfg.SampleInterval = time.Second
	cfg.FlushInterval = 100 * time.Millisecond // wall-clock fallback after 1s + 2*100ms
	return cfg
}

// step is one event of a sampled-mode scenario: a message (observed at ms after base), or a flush tick
// at a wall-clock time, or the graceful stop.
type step struct {
	rank, counter int64
	at            int64         // observed_at - base, for a message
	tick          time.Duration // > 0: a flush tick at this wall time since start
	stop          bool
	// After the step: the lines written so far, and the messages (by index) not yet acked.
	lines   []string
	unacked []int
}

func msgStep(rank, counter, at int64) step { return step{rank: rank, counter: counter, at: at} }

func TestSampledModeFakeClock(t *testing.T) {
	t.Parallel()
	const base = 1_782_777_600_000 // a multiple of the 1 s interval
	for name, steps := range map[string][]step{
		"a changed counter is written once per interval, the newest of it": {
			msgStep(0, 1, 100), msgStep(0, 2, 600), msgStep(0, 3, 999),
			msgStep(0, 4, 1000), // interval 1 starts: interval 0's newest (3) is written
			step{tick: 10 * time.Millisecond, lines: []string{"0/3@999"}, unacked: []int{3}},
			msgStep(0, 5, 2500),
			step{stop: true, lines: []string{"0/3@999", "0/4@1000", "0/5@2500"}, unacked: []int{}},
		},
		"an unchanged counter is not repeated, but its message is acked": {
			msgStep(0, 7, 100),
			msgStep(0, 7, 1100), // same counter in interval 1
			msgStep(0, 8, 2100),
			msgStep(0, 8, 3100),
			step{stop: true, lines: []string{"0/7@100", "0/8@2100"}, unacked: []int{}},
		},
		"interval boundaries are multiples of the interval of observed_at": {
			msgStep(0, 1, 1500), msgStep(0, 2, 1999), // interval [1000, 2000)
			msgStep(0, 3, 2000), msgStep(0, 4, 2001), // interval [2000, 3000): 1999 and 2000 are apart
			msgStep(0, 5, 3999),
			step{stop: true, lines: []string{"0/2@1999", "0/4@2001", "0/5@3999"}, unacked: []int{}},
		},
		"the graceful stop writes every pending sample": {
			msgStep(0, 1, 10), msgStep(1, 1, 20), msgStep(0, 2, 30),
			step{tick: 50 * time.Millisecond, lines: nil, unacked: []int{1, 2}}, // 0/1 superseded: acked after the flush
			step{stop: true, lines: []string{"0/2@30", "1/1@20"}, unacked: []int{}},
		},
		"wall-clock fallback: a pending sample is written when nothing newer arrives": {
			msgStep(0, 1, 10),
			step{tick: 1100 * time.Millisecond, lines: nil, unacked: []int{0}}, // held 1.1s < 1s + 2*100ms
			step{tick: 1250 * time.Millisecond, lines: []string{"0/1@10"}, unacked: []int{}},
			msgStep(0, 2, 20), // late: its interval is written already
			step{tick: 1300 * time.Millisecond, lines: []string{"0/1@10"}, unacked: []int{}},
		},
		"event time, not the wall clock, ends an idle key's interval": {
			msgStep(0, 1, 10),  // rank 0 then falls silent
			msgStep(1, 1, 100), // rank 1 goes on into interval 2
			msgStep(1, 2, 1100),
			msgStep(1, 3, 2000), // watermark 2000 = one whole interval past rank 0's interval end
			step{tick: 20 * time.Millisecond, lines: []string{"0/1@10", "1/1@100", "1/2@1100"}, unacked: []int{3}},
		},
		"one flush writes its keys in Dynamo's key order, whatever order their intervals ended in": {
			msgStep(2, 1, 100), msgStep(0, 1, 200), msgStep(1, 1, 300),
			msgStep(2, 2, 1100), msgStep(0, 2, 1200), msgStep(1, 2, 1300), // interval 0 ends for 2, then 0, then 1
			step{tick: 10 * time.Millisecond, lines: []string{"0/1@200", "1/1@300", "2/1@100"}, unacked: []int{3, 4, 5}},
			step{stop: true, lines: []string{"0/1@200", "1/1@300", "2/1@100", "0/2@1200", "1/2@1300", "2/2@1100"}, unacked: []int{}},
		},
		"a key gets at most one line per interval": {
			msgStep(0, 1, 100), msgStep(0, 2, 1100), // interval 0 decided
			msgStep(0, 3, 900), // late for interval 0: no second line for it
			step{stop: true, lines: []string{"0/1@100", "0/2@1100"}, unacked: []int{}},
		},
		"a repeat of the last counter is ignored: the newer pending sample is still written": {
			msgStep(0, 1, 100),
			msgStep(0, 2, 1100), // interval 0 decided with counter 1; 2 pending
			msgStep(0, 1, 1200), // counter 1 again, observed later: ignored, 2 stays pending
			step{tick: 10 * time.Millisecond, lines: []string{"0/1@100"}, unacked: []int{1}},
			step{stop: true, lines: []string{"0/1@100", "0/2@1100"}, unacked: []int{}},
		},
		"an older message than the pending one is acked without a line": {
			msgStep(0, 5, 500), msgStep(0, 4, 400),
			step{tick: 10 * time.Millisecond, lines: nil, unacked: []int{0}},
			step{stop: true, lines: []string{"0/5@500"}, unacked: []int{}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, sampledConfig(t))
			for i, s := range steps {
				switch {
				case s.stop:
					h.stop()
				case s.tick > 0:
					h.tick(s.tick)
				default:
					h.send(testFPM{key: streams.Key{Namespace: "ns", Component: "c", WorkerID: "w", DPRank: int(s.rank)},
						counter: s.counter, receivedMs: base + s.at})
				}
				if s.lines == nil && s.unacked == nil && !s.stop && s.tick == 0 {
					continue
				}
				if got := h.lines(base); strings.Join(got, " ") != strings.Join(s.lines, " ") {
					t.Fatalf("step %d: lines %v, want %v", i, got, s.lines)
				}
				if got := h.unacked(); fmt.Sprint(got) != fmt.Sprint(nilIfEmpty(s.unacked)) {
					t.Fatalf("step %d: unacked messages %v, want %v", i, got, s.unacked)
				}
			}
		})
	}
}

func nilIfEmpty(s []int) []int {
	if len(s) == 0 {
		return nil
	}
	return s
}

// No message is acked before the line that holds or replaces it is durable: after every step, each
// acked message has a durable line of its key observed at or after it, or an unacked newer message of
// its key and interval that will carry its observation (a superseded message is acked at the next
// flush, see sampler).
func TestSampledModeAcksOnlyBehindDurableLines(t *testing.T) {
	t.Parallel()
	const base = 1_782_777_600_000
	h := newHarness(t, sampledConfig(t))
	observed := func(j int) int64 { return base + int64(j)*13 }
	for i := range 400 {
		k := streams.Key{Namespace: "ns", Component: "c", WorkerID: "w", DPRank: i % 2}
		h.send(testFPM{key: k, counter: int64(i / 2), receivedMs: observed(i)})
		if i%37 == 0 {
			h.tick(time.Duration(i) * time.Millisecond)
		}
		newest := map[int]int64{}
		for _, l := range outputLines(t, h.cfg.OutputPath)["w"] {
			tl, _ := schemas.ParseTraceLine(l)
			f, _ := schemas.ParseFPMJSON(tl.Event.FPM)
			newest[int(f.DPRank)] = max(newest[int(f.DPRank)], tl.Event.ObservedAtUnixMs)
		}
		for j, am := range h.msgs {
			if !am.acked || newest[j%2] >= observed(j) {
				continue
			}
			carried := false
			for n := j + 2; n < len(h.msgs) && observed(n)/1000 == observed(j)/1000; n += 2 {
				carried = carried || !h.msgs[n].acked
			}
			if !carried {
				t.Fatalf("after message %d: message %d (observed %d) acked; newest durable line of its key %d, no newer unacked message in its interval",
					i, j, observed(j), newest[j%2])
			}
		}
	}
	h.stop()
	if u := h.unacked(); len(u) != 0 {
		t.Fatalf("unacked after stop: %v", u)
	}
}

func TestSampledModeGolden(t *testing.T) {
	t.Parallel()
	const base = 1_782_777_600_000
	cfg := sampledConfig(t)
	cfg.SampleInterval = 500 * time.Millisecond
	h := newHarness(t, cfg)
	a := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "4192", DPRank: 0}
	b := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "4192", DPRank: 1}
	c := streams.Key{Namespace: "team \"x\"", Component: "prefill", WorkerID: "", DPRank: 0}
	for i, f := range []testFPM{
		{key: a, counter: 40, receivedMs: base + 1250},
		{key: a, counter: 41, receivedMs: base + 1260},
		{key: b, counter: 7, receivedMs: base + 1270},
		{key: c, counter: 0, receivedMs: base + 1300},
		{key: a, counter: 42, receivedMs: base + 1520, heartbeat: true},
		{key: b, counter: 8, receivedMs: base + 1530, producer: "conn/7"},
		{key: a, counter: 43, receivedMs: base + 2010},
		{key: b, counter: 9, receivedMs: base + 2020},
		{key: a, counter: 43, receivedMs: base + 2600}, // unchanged: not repeated
	} {
		h.send(f)
		if i == 5 {
			h.tick(300 * time.Millisecond)
		}
	}
	h.tick(2 * time.Second) // wall-clock fallback for the keys left idle
	h.stop()
	golden.Check(t, filepath.Join("testdata", "sampled_trace.golden.jsonl"), goldenLines(t, cfg, "4192", "conn_7", "unknown"), *update)
}

// goldenLines returns the decoded lines of the given producers' segment 0, each producer's under a
// "# <segment file name>" line.
func goldenLines(t *testing.T, cfg Config, producers ...string) []byte {
	t.Helper()
	out := outputLines(t, cfg.OutputPath)
	var got bytes.Buffer
	for _, p := range producers {
		fmt.Fprintf(&got, "# %s\n", filepath.Base(tracefile.SegmentPath(tracefile.SegmentPrefix(cfg.OutputPath, p), 0)))
		for _, l := range out[p] {
			got.Write(l)
			got.WriteByte('\n')
		}
	}
	return got.Bytes()
}

// The exact lines of sampled mode's per-interval rules, each scenario in its own golden file: the
// summary (rank/counter@observed, as TestSampledModeFakeClock writes it) says what the golden file
// must show, so that regenerating it cannot quietly accept a broken rule.
func TestSampledModeRulesGolden(t *testing.T) {
	t.Parallel()
	const base = 1_782_777_600_000 // a multiple of the 500 ms interval
	type msg struct{ rank, counter, at int64 }
	for _, tc := range []struct {
		golden string
		msgs   []msg
		tickAt int // a flush tick after this many messages
		want   []string
	}{{
		// A key gets at most one line per interval [k*500, (k+1)*500) of observed_at: the newest of it.
		// Rank 0's interval [1000, 1500) ends when 4@1500 arrives; 5@1300, late for it, gets no second
		// line, and 6@1600 supersedes 4@1500 in [1500, 2000). Rank 1's [1000, 1500) ends with 3@2100.
		golden: "sampled_one_line_per_interval",
		msgs: []msg{
			{0, 1, 1050}, {0, 2, 1200}, {0, 3, 1490}, {1, 1, 1100}, {1, 2, 1499},
			{0, 4, 1500}, {0, 5, 1300}, {0, 6, 1600}, {1, 3, 2100},
		},
		tickAt: 8,
		want:   []string{"0/3@1490", "1/2@1499", "0/6@1600", "1/3@2100"},
	}, {
		// An arrival repeating the last counter written for its key is ignored, so the newer pending
		// sample is still written: 10@1700 leaves 11@1600 pending, 11@2200 leaves 12@2100, and 12@2600,
		// alone in [2500, 3000), gets no line there. The same counter on another key is no repeat:
		// rank 1's 10@1800 is written.
		golden: "sampled_repeated_counter",
		msgs: []msg{
			{0, 10, 1100}, {0, 11, 1600}, {0, 10, 1700}, {1, 10, 1800},
			{0, 12, 2100}, {0, 11, 2200}, {0, 12, 2600}, {0, 13, 3100},
		},
		tickAt: 3,
		want:   []string{"0/10@1100", "0/11@1600", "1/10@1800", "0/12@2100", "0/13@3100"},
	}} {
		t.Run(tc.golden, func(t *testing.T) {
			t.Parallel()
			cfg := sampledConfig(t)
			cfg.SampleInterval = 500 * time.Millisecond
			h := newHarness(t, cfg)
			for i, m := range tc.msgs {
				h.send(testFPM{key: streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "w", DPRank: int(m.rank)},
					counter: m.counter, receivedMs: base + m.at})
				if i+1 == tc.tickAt {
					h.tick(10 * time.Millisecond)
				}
			}
			h.stop()
			if got := h.lines(base); strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Fatalf("lines %v, want %v", got, tc.want)
			}
			if u := h.unacked(); len(u) != 0 {
				t.Fatalf("unacked after stop: %v", u)
			}
			golden.Check(t, filepath.Join("testdata", tc.golden+".golden.jsonl"), goldenLines(t, cfg, "w"), *update)
		})
	}
}

// Releasing a partition (its writer's graceful end) writes its producers' pending samples, makes
// their lines durable, says their messages done and closes their files, leaving the producers of other
// partitions alone; when the partition is taken again, a later message of a released producer starts
// a new segment.
func TestReleaseHandsProducersBack(t *testing.T) {
	t.Parallel()
	const base = 1_782_777_600_000
	for _, mode := range []string{schemas.CaptureFull, schemas.CaptureSampled} {
		t.Run(mode, func(t *testing.T) {
			cfg := sampledConfig(t)
			cfg.Mode = Mode(mode)
			p0, p1 := newHarness(t, cfg), newHarness(t, cfg) // the partitions of w0 and of w1
			w0 := streams.Key{Namespace: "ns", Component: "c", WorkerID: "w0"}
			w1 := streams.Key{Namespace: "ns", Component: "c", WorkerID: "w1"}
			var m0, m1 []*ackMsg
			for i := range 10 {
				m0 = append(m0, p0.send(testFPM{key: w0, counter: int64(i), receivedMs: base + int64(i)}))
				m1 = append(m1, p1.send(testFPM{key: w1, counter: int64(i), receivedMs: base + int64(i)}))
			}
			p0.stop() // the release of w0's partition
			for i, m := range m0 {
				if !m.acked {
					t.Fatalf("w0 message %d not done after its release", i)
				}
			}
			for i, m := range m1 {
				// Sampled mode says superseded messages done at any flush; the pending one waits for its line.
				if m.acked && (mode == schemas.CaptureFull || i == len(m1)-1) {
					t.Fatalf("w1 message %d done: it was not released", i)
				}
			}
			for _, p := range p0.w.bySegment {
				if !p.sw.closed {
					t.Fatal("released producer still open")
				}
			}
			want := 10
			if mode == schemas.CaptureSampled {
				want = 1 // the newest of the interval
			}
			if got := len(prefixLines(t, tracefile.SegmentPrefix(cfg.OutputPath, "w0"))[0]); got != want {
				t.Fatalf("w0 segment 0: %d lines, want %d", got, want)
			}
			again := newHarness(t, cfg) // w0's partition taken again
			again.send(testFPM{key: w0, counter: 99, receivedMs: base + 5000})
			again.stop()
			p1.stop()
			segs := prefixLines(t, tracefile.SegmentPrefix(cfg.OutputPath, "w0"))
			if len(segs) != 2 || len(segs[1]) != 1 {
				t.Fatalf("w0 segments after a new message: %v", segs)
			}
		})
	}
}
