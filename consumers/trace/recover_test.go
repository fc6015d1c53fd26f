package trace

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/streams/streamstest"
)

// pullUnacked takes n messages from the writer's durable consumer without acking them: as a writer that
// is killed before its acks leave does.
func pullUnacked(t *testing.T, js jetstream.JetStream, cfg Config, n int) []jetstream.Msg {
	t.Helper()
	ctx := context.Background()
	cons, err := js.CreateOrUpdateConsumer(ctx, streams.StreamFPM, cfg.ConsumerConfig())
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for len(out) < n {
		b, err := cons.Fetch(n-len(out), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			out = append(out, m)
		}
		if b.Error() != nil {
			t.Fatal(b.Error())
		}
	}
	return out
}

// writeLines writes the lines of msgs the way a writer does (one flush per call, per producer), and
// leaves them unacked.
func writeLines(t *testing.T, cfg Config, msgs []jetstream.Msg) {
	t.Helper()
	sws := map[string]*SegmentWriter{}
	for _, m := range msgs {
		r, err := parseRecord(m, cfg.ProducerID, nil)
		if err != nil {
			t.Fatal(err)
		}
		prefix := SegmentPrefix(cfg.OutputPath, r.producer)
		sw := sws[prefix]
		if sw == nil {
			if sw, err = NewSegmentWriter(prefix, cfg.RollBytes, cfg.MaxSegments); err != nil {
				t.Fatal(err)
			}
			sws[prefix] = sw
		}
		if err := sw.Append(appendLine(nil, &r, 0, cfg.Mode)); err != nil {
			t.Fatal(err)
		}
	}
	for _, sw := range sws {
		if err := sw.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// A writer killed after its lines were fsynced but before its acks reached the server: the next run
// finds those lines, skips their redeliveries (acking them), and writes everything else, exactly once.
func TestRecoverySkipsLinesWrittenBeforeTheCrash(t *testing.T) {
	for name, tc := range map[string]struct {
		n, pulled, written int   // messages, taken unacked by the dead writer, of which written
		roll               int64 // roll bytes of the dead writer and the new one
		flushes            int   // the dead writer's flushes (members / segments)
	}{
		"crash after the fsync of one member": {n: 600, pulled: 400, written: 300, roll: 1 << 20, flushes: 1},
		"lines spread over rolled segments":   {n: 600, pulled: 600, written: 500, roll: 16 << 10, flushes: 5},
		"crash before any fsync":              {n: 300, pulled: 300, written: 0, roll: 1 << 20, flushes: 1},
	} {
		t.Run(name, func(t *testing.T) {
			env := streamstest.Start(t)
			msgs, published := manyFPMs(t, testKeys(4), tc.n, 1_782_777_600_000)
			publish(t, env.JS, msgs)
			cfg := testConfig(t)
			cfg.RollBytes = tc.roll
			cfg.MaxSegments = 1000
			cfg.AckWait = time.Second // redelivery soon after the new writer starts
			taken := pullUnacked(t, env.JS, cfg, tc.pulled)
			per := (tc.written + tc.flushes - 1) / max(tc.flushes, 1)
			for i := 0; i < tc.written; i += per {
				writeLines(t, cfg, taken[i:min(i+per, tc.written)])
			}

			r := startWriter(t, cfg, env.JS)
			rec := r.w.Recovery()
			if rec.Candidates != tc.pulled || rec.Found != tc.written || rec.AckFloor != 0 || rec.Delivered != uint64(tc.pulled) {
				t.Fatalf("recovery %+v, want %d candidates, %d found", rec, tc.pulled, tc.written)
			}
			waitConsumed(t, env.JS, cfg.Durable)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			if got := counterValue(t, r.w.metrics.skippedWritten); got != float64(tc.written) {
				t.Fatalf("skipped as written: %v, want %d", got, tc.written)
			}
			checkExactlyOnce(t, outputLines(t, cfg.OutputPath), published, schemas.CaptureFull)
		})
	}
}

// Sampled mode: the dead writer had written interval 0's sample, unacked. The next run skips it, and,
// seeded with that line, treats the rest of interval 0 as late instead of writing a second sample.
func TestRecoverySeedsTheSampler(t *testing.T) {
	env := streamstest.Start(t)
	const base = 1_782_777_600_000
	k := streams.Key{Namespace: "ns", Component: "c", WorkerID: "w", DPRank: 0}
	var msgs []*nats.Msg
	for i := range 20 { // interval 0: counters 0..9, interval 1: 10..19
		m := testFPM{key: k, counter: int64(i), receivedMs: base + int64(i)*100}.msg(t)
		msgs = append(msgs, m)
	}
	publish(t, env.JS, msgs)
	cfg := testConfig(t)
	cfg.Mode = schemas.CaptureSampled
	cfg.SampleInterval = time.Second
	cfg.AckWait = 3 * time.Second
	taken := pullUnacked(t, env.JS, cfg, 20)
	writeLines(t, cfg, taken[9:10]) // interval 0's sample: counter 9, never acked

	r := startWriter(t, cfg, env.JS)
	if rec := r.w.Recovery(); rec.Found != 1 || rec.Seeded != 1 {
		t.Fatalf("recovery %+v", rec)
	}
	waitConsumed(t, env.JS, cfg.Durable)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range outputLines(t, cfg.OutputPath)["w"] {
		tl, err := schemas.ParseTraceLine(l)
		if err != nil {
			t.Fatal(err)
		}
		f, _ := schemas.ParseFPMJSON(tl.Event.FPM)
		got = append(got, fmt.Sprint(f.CounterID))
	}
	if strings.Join(got, " ") != "9 19" {
		t.Fatalf("sampled counters %v, want [9 19]: one sample per interval", got)
	}
}

// lossySource loses the first ack of every seventh message, as a connection cut does: the server
// redelivers them after the ack wait, to the same running writer, which must not write them again.
type lossySource struct {
	msgSource
	mu   sync.Mutex
	lost map[uint64]bool
}

type lossyMsg struct {
	jetstream.Msg
	s   *lossySource
	seq uint64
}

func (s *lossySource) Next(opts ...jetstream.NextOpt) (jetstream.Msg, error) {
	m, err := s.msgSource.Next(opts...)
	if err != nil {
		return m, err
	}
	md, merr := m.Metadata()
	if merr != nil || md.Sequence.Stream%7 != 0 {
		return m, nil
	}
	return &lossyMsg{Msg: m, s: s, seq: md.Sequence.Stream}, nil
}

func (m *lossyMsg) Ack() error {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	if !m.s.lost[m.seq] {
		m.s.lost[m.seq] = true
		return nil // sent, never arrived
	}
	return m.Msg.Ack()
}

func TestLostAcksInRunAreNotWrittenTwice(t *testing.T) {
	for _, mode := range []string{schemas.CaptureFull, schemas.CaptureSampled} {
		t.Run(mode, func(t *testing.T) {
			env := streamstest.Start(t)
			msgs, published := manyFPMs(t, testKeys(2), 700, 1_782_777_600_000)
			publish(t, env.JS, msgs)
			cfg := testConfig(t)
			cfg.Mode = mode
			cfg.SampleInterval = 100 * time.Millisecond
			cfg.AckWait = time.Second
			w, err := New(cfg, env.JS, WithLogger(testLogger(t)))
			if err != nil {
				t.Fatal(err)
			}
			src := &lossySource{lost: map[uint64]bool{}}
			w.wrap = func(s msgSource) msgSource { src.msgSource = s; return src }
			r := runWriter(t, w)
			waitConsumed(t, env.JS, cfg.Durable)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			src.mu.Lock()
			lost := len(src.lost)
			src.mu.Unlock()
			if got := counterValue(t, w.metrics.skippedWritten); lost < 50 || got != float64(lost) {
				t.Fatalf("%d acks lost, %v redeliveries skipped", lost, got)
			}
			out := outputLines(t, cfg.OutputPath)
			if mode == schemas.CaptureFull {
				checkExactlyOnce(t, out, published, mode)
				return
			}
			// Sampled: one line per key and interval at most.
			seen := map[string]bool{}
			for _, lines := range out {
				for _, l := range lines {
					tl, _ := schemas.ParseTraceLine(l)
					f, _ := schemas.ParseFPMJSON(tl.Event.FPM)
					id := fmt.Sprint(f.WorkerID, "/", f.DPRank, "@", tl.Event.ObservedAtUnixMs/100)
					if seen[id] {
						t.Fatalf("two samples for %s", id)
					}
					seen[id] = true
				}
			}
		})
	}
}

func TestSeqState(t *testing.T) {
	type op struct {
		do  string // hold, finish, release, trim
		seq uint64
	}
	for name, tc := range map[string]struct {
		limit    int
		ops      []op
		held     []uint64
		done     []uint64
		unknown  []uint64 // neither
		maxSpan  int
		forgotAt int // s.forgot after the ops
	}{
		"hold then finish": {
			ops:  []op{{"hold", 5}, {"hold", 6}, {"finish", 5}},
			held: []uint64{6}, done: []uint64{5}, unknown: []uint64{4, 7, 0},
		},
		"release forgets a hold": {
			ops:     []op{{"hold", 100}, {"release", 100}},
			unknown: []uint64{100},
		},
		"a lower sequence after a higher one": {
			ops:  []op{{"finish", 1000}, {"finish", 3}, {"hold", 64}},
			done: []uint64{3, 1000}, held: []uint64{64}, unknown: []uint64{4, 999},
		},
		"trim forgets the settled range": {
			ops:  []op{{"finish", 10}, {"finish", 200}, {"hold", 201}, {"trim", 199}},
			done: []uint64{200}, held: []uint64{201}, unknown: []uint64{10},
			maxSpan: 128,
		},
		"sequence 0 is unknown": {
			ops:     []op{{"hold", 0}, {"finish", 0}},
			unknown: []uint64{0},
		},
		"the window limit forgets the oldest": {
			limit: 256,
			ops:   []op{{"finish", 1}, {"finish", 2}, {"finish", 1000}},
			done:  []uint64{1000}, unknown: []uint64{1, 2},
			maxSpan:  256,
			forgotAt: 2,
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := newSeqState(tc.limit)
			for _, o := range tc.ops {
				switch o.do {
				case "hold":
					s.hold(o.seq)
				case "finish":
					s.finish(o.seq)
				case "release":
					s.release(o.seq)
				case "trim":
					s.trim(o.seq)
				}
			}
			for _, q := range tc.held {
				if h, d := s.status(q); !h || d {
					t.Errorf("%d: held %v done %v, want held", q, h, d)
				}
			}
			for _, q := range tc.done {
				if h, d := s.status(q); h || !d {
					t.Errorf("%d: held %v done %v, want done", q, h, d)
				}
			}
			for _, q := range tc.unknown {
				if h, d := s.status(q); h || d {
					t.Errorf("%d: held %v done %v, want neither", q, h, d)
				}
			}
			if tc.maxSpan > 0 && s.span() > tc.maxSpan {
				t.Errorf("span %d, want <= %d", s.span(), tc.maxSpan)
			}
			if s.forgot != uint64(tc.forgotAt) {
				t.Errorf("forgot %d, want %d", s.forgot, tc.forgotAt)
			}
		})
	}
}
