package trace

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/durable/durabletest"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// pullUnacked takes n messages from the writer group's partition consumer without acking them, as a
// writer that is killed before its acks leave does; the consumer is left without a subscriber, so the
// next writer takes it at once (durabletest.Take).
func pullUnacked(t *testing.T, js jetstream.JetStream, cfg Config, n int) []jetstream.Msg {
	t.Helper()
	pc, err := cfg.PartitionConfig()
	if err != nil {
		t.Fatal(err)
	}
	return durabletest.Take(t, js, streams.StreamFPM, pc.ConsumerConfig(0), n)
}

// writeLines writes the lines of msgs the way a writer does (one flush per call, per producer), and
// leaves them unacked.
func writeLines(t *testing.T, cfg Config, msgs []jetstream.Msg) {
	t.Helper()
	sws := map[string]*SegmentWriter{}
	for _, m := range msgs {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		r, err := parseRecord(replayMsg{m}, tracefile.MsgMeta{Seq: md.Sequence.Stream, Stored: md.Timestamp}, cfg.ProducerID, nil)
		if err != nil {
			t.Fatal(err)
		}
		prefix := tracefile.SegmentPrefix(cfg.OutputPath, r.Producer)
		sw := sws[prefix]
		if sw == nil {
			if sw, err = newDefaultSegmentWriter(prefix, cfg.RollBytes, cfg.MaxSegments); err != nil {
				t.Fatal(err)
			}
			sws[prefix] = sw
		}
		if err := sw.Append(tracefile.AppendLine(nil, &r.Record, 0, string(cfg.Mode))); err != nil {
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
// takes the partition over (its consumer reset to the ack floor, so everything comes again), finds
// those lines, skips their redeliveries, and writes everything else, exactly once.
func TestRecoverySkipsLinesWrittenBeforeTheCrash(t *testing.T) {
	t.Parallel()
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
			env := natsservertest.Start(t)
			msgs, published := manyFPMs(t, testKeys(4), tc.n, 1_782_777_600_000)
			publish(t, env.JS, msgs)
			cfg := testConfig(t)
			cfg.RollBytes = tc.roll
			cfg.MaxSegments = 1000
			cfg.AckWait = time.Second // irrelevant: the takeover's reset redelivers at once
			taken := pullUnacked(t, env.JS, cfg, tc.pulled)
			per := (tc.written + tc.flushes - 1) / max(tc.flushes, 1)
			for i := 0; i < tc.written; i += per {
				writeLines(t, cfg, taken[i:min(i+per, tc.written)])
			}

			r := startWriter(t, cfg, env.JS)
			ci := waitConsumed(t, env.JS, cfg.Group)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			// Both producers (w0, w1) were checked; every line on disk was found.
			if rec := r.w.Recovery(); rec.Producers != 2 || rec.Found != tc.written || tc.written > 0 && rec.LinesRead != tc.written {
				t.Fatalf("recovery %+v, want 2 producers checked and %d lines found", rec, tc.written)
			}
			if ci.AckFloor.Stream != uint64(tc.n) {
				t.Fatalf("ack floor %d, want %d", ci.AckFloor.Stream, tc.n)
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
	t.Parallel()
	env := natsservertest.Start(t)
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
	waitConsumed(t, env.JS, cfg.Group)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if rec := r.w.Recovery(); rec.Found != 1 || rec.Seeded != 1 {
		t.Fatalf("recovery %+v", rec)
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

// lostDone loses the first Done of every seventh stream sequence up to upTo: the message's line is
// written, but its acknowledgement never reaches the server, as in a connection cut.
type lostDone struct {
	upTo        uint64
	mu          sync.Mutex
	seen        map[uint64]bool
	lost        map[uint64]bool
	redelivered map[uint64]bool
}

type lostDoneMsg struct{ *durable.Msg }

func (lostDoneMsg) Done() {}

func (l *lostDone) deliver(m *durable.Msg) delivery {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[m.StreamSeq] {
		l.redelivered[m.StreamSeq] = true
		return m
	}
	l.seen[m.StreamSeq] = true
	if m.StreamSeq%7 == 0 && m.StreamSeq <= l.upTo {
		l.lost[m.StreamSeq] = true
		return lostDoneMsg{m}
	}
	return m
}

// Acknowledgements lost in a running writer (every seventh message's) hold the partition back; then
// the connection is cut while traffic goes on: the same running writer takes its partition again,
// gets every message that was not acknowledged once more, and writes none of them twice. Every
// redelivered message whose line is on disk is skipped as written.
func TestLostAcksInRunAreNotWrittenTwice(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{schemas.CaptureFull, schemas.CaptureSampled} {
		t.Run(mode, func(t *testing.T) {
			env := natsservertest.Start(t)
			const n, base = 700, 1_782_777_600_000
			msgs, published := manyFPMs(t, testKeys(2), n, base)
			publish(t, env.JS, msgs)
			nc, err := nats.Connect(env.Server.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(t)
			cfg.Mode = Mode(mode)
			cfg.SampleInterval = 100 * time.Millisecond
			w, err := New(logTo(cfg, testLogger(t)), js, durable.WithMemberID("lossy"))
			if err != nil {
				t.Fatal(err)
			}
			l := &lostDone{upTo: n, seen: map[uint64]bool{}, lost: map[uint64]bool{}, redelivered: map[uint64]bool{}}
			w.deliver = l.deliver
			r := runConsumer(t, w)
			// Every message handled and every line durable; what is unacknowledged is held back by the
			// lost acknowledgements.
			lines := func() map[uint64]bool {
				seqs := map[uint64]bool{}
				for _, ls := range outputLines(t, cfg.OutputPath) {
					for _, line := range ls {
						tl, err := schemas.ParseTraceLine(line)
						if err != nil {
							t.Fatal(err)
						}
						seqs[uint64(tl.Event.ObservedAtUnixMs-base+1)] = true // manyFPMs: message i observed at base+i
					}
				}
				return seqs
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				l.mu.Lock()
				seen, lost := len(l.seen), len(l.lost)
				l.mu.Unlock()
				_, pending := consumerInfo(t, env, cfg.Group)
				if seen == n && (mode == schemas.CaptureFull && len(lines()) == n || mode == schemas.CaptureSampled && pending == uint64(lost)) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not every message handled: %d seen, %d unacknowledged (%d lost)", seen, pending, lost)
				}
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(3 * cfg.FlushInterval)
			written := lines()
			floor, pending := consumerInfo(t, env, cfg.Group)
			if err := nc.ForceReconnect(); err != nil {
				t.Fatal(err)
			}
			// Traffic goes on (the partition is pinned again when a message is deliverable).
			more, published2 := manyFPMs(t, testKeys(2), 70, base+n)
			for i := range published2 {
				published2[i].counter += n / 2
				more[i] = published2[i].msg(t)
			}
			publish(t, env.JS, more)
			published = append(published, published2...)
			waitConsumed(t, env.JS, cfg.Group)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			l.mu.Lock()
			lost, redelivered := len(l.lost), 0
			skippable := 0
			for seq := range l.redelivered {
				redelivered++
				if written[seq] {
					skippable++
				}
			}
			l.mu.Unlock()
			t.Logf("%d acknowledgements lost; ack floor %d, %d unacknowledged before the cut; %d redelivered, %d of them written before", lost, floor, pending, redelivered, skippable)
			if lost < 50 || redelivered < lost || skippable == 0 {
				t.Fatalf("%d acks lost, %d redeliveries of which %d written: the case did not test what it should", lost, redelivered, skippable)
			}
			if got := counterValue(t, w.metrics.skippedWritten); got != float64(skippable) {
				t.Fatalf("%v redeliveries skipped as written, want %d (those whose line was on disk)", got, skippable)
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

// seqState, per producer after a takeover: in full mode the lines on disk are a prefix of the
// redelivered messages and the first message not found ends the check; in sampled mode any found
// message is skipped until every line was found or a message is stored after the last write.
func TestSeqState(t *testing.T) {
	t.Parallel()
	const prefix = "/out/fpm.w"
	lastWrite := time.Unix(1_782_777_600, 0)
	msg := func(seq uint64, observed int64, stored time.Time) *record {
		return &record{Record: tracefile.Record{Key: streams.Key{Namespace: "ns", Component: "c", WorkerID: "w"}, Producer: "w",
			Body: []byte(fmt.Sprint(`{"counter_id":`, observed, `}`)), Observed: observed, Seq: seq, Stored: stored}}
	}
	before := lastWrite.Add(-time.Second)
	for name, tc := range map[string]struct {
		sampled bool
		lines   []int64   // observed_at of the lines on disk (bodies follow from it)
		msgs    []*record // redelivered messages, in stream order
		skipped []bool    // whether each is skipped as written
		last    uint64    // last sequence found written
		ended   bool      // the check is over after the messages
	}{
		"full: the written prefix is skipped, the first miss ends the check": {
			lines:   []int64{10, 11, 12, 40},
			msgs:    []*record{msg(5, 10, before), msg(6, 11, before), msg(7, 13, before), msg(8, 12, before)},
			skipped: []bool{true, true, false, false},
			last:    6, ended: true,
		},
		"full: every line found ends the check": {
			lines:   []int64{10, 11},
			msgs:    []*record{msg(5, 10, before), msg(6, 11, before), msg(7, 11, before)},
			skipped: []bool{true, true, false},
			last:    6, ended: true,
		},
		"full: two identical messages, one line": {
			lines:   []int64{10, 30},
			msgs:    []*record{msg(5, 10, before), msg(6, 10, before)},
			skipped: []bool{true, false},
			last:    5, ended: true,
		},
		"sampled: found messages are skipped wherever they are": {
			sampled: true,
			lines:   []int64{12, 15, 90},
			msgs:    []*record{msg(1, 10, before), msg(2, 12, before), msg(3, 14, before), msg(4, 15, before)},
			skipped: []bool{false, true, false, true},
			last:    4, ended: false,
		},
		"sampled: a message stored after the last write ends the check": {
			sampled: true,
			lines:   []int64{12, 15},
			msgs:    []*record{msg(1, 12, before), msg(2, 14, lastWrite.Add(tracefile.RecoverySlack+time.Second)), msg(3, 15, before)},
			skipped: []bool{true, false, false},
			last:    1, ended: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			st := &seqState{prefix: prefix, ids: map[tracefile.LineIdentity]int{}, sampled: tc.sampled, lastWrite: lastWrite}
			for _, o := range tc.lines {
				r := msg(0, o, time.Time{})
				st.ids[tracefile.IdentityOf(prefix, "ns", "c", "w", o, r.Body)]++
			}
			for i, r := range tc.msgs {
				if got := st.written(r); got != tc.skipped[i] {
					t.Fatalf("message %d (seq %d): skipped %v, want %v", i, r.Seq, got, tc.skipped[i])
				}
			}
			if st.last != tc.last || st.checking() == tc.ended {
				t.Fatalf("last written %d (want %d), check over %v (want %v)", st.last, tc.last, !st.checking(), tc.ended)
			}
		})
	}
}

// replayMsg is a replayed message: nothing to settle.
type replayMsg struct{ jetstream.Msg }

func (replayMsg) Done()        {}
func (replayMsg) Reject(error) {}
