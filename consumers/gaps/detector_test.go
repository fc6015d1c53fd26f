package gaps

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/durable/durabletest"
	"github.com/fpmbus/fpmbus/consumers/partition"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

func key(worker string, rank int) streams.Key {
	return streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: worker, DPRank: rank}
}

// want is the expected content of one event.
type want struct {
	typ, cause  string
	first, last int64 // -1: no missing range
	missing     uint64
	restarted   int // resumed: 1 true, 0 false, -1 unset
}

func gapW(cause string, first, last int64) want {
	return want{TypeGap, cause, first, last, uint64(last - first + 1), -1}
}

func (w want) String() string {
	return fmt.Sprintf("%s/%s/%d-%d/%d", w.typ, w.cause, w.first, w.last, w.missing)
}

func match(t testing.TB, k streams.Key, got []Event, ws ...want) {
	t.Helper()
	if len(got) != len(ws) {
		t.Fatalf("%s: %d events %v, want %v", k, len(got), summarizeAll(got), ws)
	}
	for i, w := range ws {
		e := got[i]
		first, last := int64(-1), int64(-1)
		if e.FirstMissing != nil {
			first, last = int64(*e.FirstMissing), int64(*e.LastMissing)
		}
		restarted := -1
		if e.Restarted != nil {
			restarted = 0
			if *e.Restarted {
				restarted = 1
			}
		}
		g := want{e.Type, e.Cause, first, last, e.Missing, restarted}
		if g != w {
			b, _ := json.Marshal(e)
			t.Fatalf("%s event %d: got %v, want %v\n%s", k, i, g, w, b)
		}
		if e.Key != k || e.Schema != EventSchema || e.EventSeq != uint64(i+1) {
			t.Fatalf("%s event %d: key %v schema %s event_seq %d", k, i, e.Key, e.Schema, e.EventSeq)
		}
	}
}

// TestDetectorClassifiesScriptedStreams publishes what a bridge would publish for five publishers
// (bridge drop with a late marker, ZMQ drop, publisher restart, duplicates and reordering, a bridge
// restart) and checks every event, and that delivered + reported missing == sent.
func TestDetectorClassifiesScriptedStreams(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	t0 := time.Now().UnixMilli()
	kb, kz, kr, kd, kn := key("bridge", 0), key("zmq", 1), key("restart", 0), key("dup", 0), key("newbridge", 2)
	var msgs []*nats.Msg
	// bridge_drop: 10..14 dropped by the bridge; its marker is stored after the FPMs that follow.
	msgs = append(msgs, fpms(kb, 0, 9, t0, t0)...)
	msgs = append(msgs, fpms(kb, 15, 30, t0, t0+200)...)
	// zmq_drop: 10..12 and 20..20 never reached the bridge.
	msgs = append(msgs, fpms(kz, 0, 9, t0, t0)...)
	msgs = append(msgs, fpms(kz, 13, 19, t0, t0+100)...)
	msgs = append(msgs, fpms(kz, 21, 25, t0, t0+200)...)
	// publisher_restart: the run got to 39; the new one (epoch t0+1000) starts at 0.
	msgs = append(msgs, fpms(kr, 0, 39, t0, t0)...)
	msgs = append(msgs, fpms(kr, 0, 9, t0+1000, t0+1000)...)
	// duplicates and out-of-order: 0..5, 5 again, 7, 6, 8..10, 3 again (stored twice by a late retry).
	msgs = append(msgs, fpms(kd, 0, 5, t0, t0)...)
	dup := fpmMsg(kd, 5, t0, t0+50, false, "test-bridge")
	dup.Header.Set(streams.HeaderMsgID, "retry-5") // outside the duplicate window, say
	msgs = append(msgs, dup, fpmMsg(kd, 7, t0, t0+70, false, "test-bridge"), fpmMsg(kd, 6, t0, t0+60, false, "test-bridge"))
	msgs = append(msgs, fpms(kd, 8, 10, t0, t0+80)...)
	dup3 := fpmMsg(kd, 3, t0, t0+30, false, "test-bridge")
	dup3.Header.Set(streams.HeaderMsgID, "retry-3")
	msgs = append(msgs, dup3)
	// a bridge restart: new epoch, the sequence goes on: nothing to report.
	msgs = append(msgs, fpms(kn, 0, 9, t0, t0)...)
	msgs = append(msgs, fpms(kn, 10, 19, t0+500, t0+500)...)
	publishAll(t, env.JS, msgs...)

	h := startDetector(t, env.Server.ClientURL(), testConfig())
	time.Sleep(100 * time.Millisecond)
	publishAll(t, env.JS, markerMsg(kb, t0, 10, 14, "buffer_full"))

	by := waitEvents(t, env.JS, 4, 20*time.Second)
	match(t, kb, by[kb], gapW(CauseBridgeDrop, 10, 14))
	match(t, kz, by[kz], gapW(CauseZMQDrop, 10, 12), gapW(CauseZMQDrop, 20, 20))
	match(t, kr, by[kr], want{TypeGap, CausePublisherRestart, -1, -1, 0, -1})
	match(t, kd, by[kd])
	match(t, kn, by[kn])

	r := by[kr][0]
	check(t, r.Evidence.OldRun != nil && r.Evidence.OldRun.LastSeq == 39 && r.Evidence.OldRun.Messages == 40 &&
		r.Before.Seq == 39 && r.After.Seq == 0 && r.Epoch == t0+1000, "restart evidence %+v", r)
	b := by[kb][0]
	check(t, len(b.Evidence.Markers) == 1 && b.Evidence.Markers[0].Reason == "buffer_full" && b.Before.Seq == 9 && b.After.Seq == 15 &&
		b.Before.ObservedAtMs == t0+90 && b.After.ObservedAtMs == t0+200 && b.ID == streams.GapMsgID(kb, t0, 10, 14), "bridge_drop evidence %+v", b)
	z := by[kz][0]
	check(t, z.Evidence.MarkerGraceMs == 300 && len(z.Evidence.Markers) == 0, "zmq evidence %+v", z.Evidence)

	sent := map[streams.Key]uint64{kb: 31, kz: 26, kr: 50, kd: 11, kn: 20}
	consumerDone(t, env.JS, streams.StreamFPM, defaultGroup)
	for k, n := range sent {
		d := delivered(t, env.JS, k)
		if k == kd {
			d -= 2 // the two retries stored twice
		}
		equal(t, n, d+missingOf(by[k]), k.String()+": delivered + missing != sent")
	}
	equal(t, 2.0, h.metric("fpmbus_gaps_duplicates_total"))
	equal(t, 1.0, h.metric("fpmbus_gaps_out_of_order_total"))
	equal(t, 4.0, h.metric("fpmbus_gaps_missing_messages_total", "cause", CauseZMQDrop))
	equal(t, 5.0, h.metric("fpmbus_gaps_missing_messages_total", "cause", CauseBridgeDrop))
	equal(t, 1.0, h.metric("fpmbus_gaps_events_total", "cause", CausePublisherRestart))
	check(t, h.stop() == nil, "stop")

	// The checkpointed state matches.
	kv, err := env.JS.KeyValue(context.Background(), defaultStateBucket)
	check(t, err == nil, "bucket: %v", err)
	ent, err := kv.Get(context.Background(), kvKey(defaultGroup, kd))
	check(t, err == nil, "state of %s: %v", kd, err)
	var st state
	check(t, json.Unmarshal(ent.Value(), &st) == nil, "state json")
	equal(t, counters{Messages: 11, Heartbeats: 3, Duplicates: 2, OutOfOrder: 1}, st.Counters)
	equal(t, 0, len(st.Outbox))
}

// skewedClock is the detector's clock in the tests of silent publishers: the wall clock plus what the
// test added. With StaleAfter far beyond any pause a busy host makes, a publisher goes stale when the
// test moves the clock past StaleAfter, and only then, whatever the pace of the messages before.
type skewedClock struct{ skew atomic.Int64 }

func (c *skewedClock) now() time.Time { return time.Now().Add(time.Duration(c.skew.Load())) }

// advance moves the clock d ahead.
func (c *skewedClock) advance(d time.Duration) { c.skew.Add(int64(d)) }

// waitApplied waits until the detector has applied n FPMs: it heard the last of them before the test
// moves its clock.
func waitApplied(t testing.TB, h *harness, n int) {
	t.Helper()
	checkFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if got := h.metric("fpmbus_gaps_messages_total"); got != float64(n) {
			return fmt.Errorf("%v of %d FPMs applied", got, n)
		}
		return nil
	})
}

// TestDetectorStaleAndResumed: a publisher that goes silent is reported stale by the detector's clock
// once it has heard nothing for StaleAfter, a later message closes the period (resumed, no restart), a
// second silence ends with a restart. The clock is a skewedClock: each silence is the test moving it.
func TestDetectorStaleAndResumed(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig()
	cfg.StaleAfter = time.Hour
	clock := &skewedClock{}
	h := startDetector(t, env.Server.ClientURL(), cfg, durable.WithClock(clock.now))
	k := key("silent", 0)
	now := func() int64 { return time.Now().UnixMilli() }
	e1 := now()
	publishAll(t, env.JS, fpms(k, 0, 4, e1, now())...)
	waitApplied(t, h, 5)
	if evs := storedEvents(t, env.JS); len(evs) != 0 {
		t.Fatalf("events before the publisher fell silent: %v", summarizeAll(evs))
	}
	clock.advance(cfg.StaleAfter)
	by := waitEvents(t, env.JS, 1, 10*time.Second)
	match(t, k, by[k], want{typeStale, CauseStale, -1, -1, 0, -1})
	check(t, by[k][0].Before.Seq == 4 && by[k][0].StaleAfterMs == cfg.StaleAfter.Milliseconds(), "stale event %+v", by[k][0])
	equal(t, 1.0, h.metric("fpmbus_gaps_stale_publishers"))

	publishAll(t, env.JS, fpms(k, 5, 6, e1, now())...)
	waitApplied(t, h, 7)
	// Resumed, then silent again: stale a second time.
	clock.advance(cfg.StaleAfter)
	by = waitFirstEvents(t, env.JS, 3, 10*time.Second)
	match(t, k, by[k], want{typeStale, CauseStale, -1, -1, 0, -1}, want{typeResumed, CauseStale, -1, -1, 0, 0},
		want{typeStale, CauseStale, -1, -1, 0, -1})
	// The publisher comes back restarted.
	publishAll(t, env.JS, fpms(k, 0, 2, now(), now())...)
	by = waitFirstEvents(t, env.JS, 5, 10*time.Second)
	match(t, k, by[k], want{typeStale, CauseStale, -1, -1, 0, -1}, want{typeResumed, CauseStale, -1, -1, 0, 0},
		want{typeStale, CauseStale, -1, -1, 0, -1}, want{TypeGap, CausePublisherRestart, -1, -1, 0, -1},
		want{typeResumed, CauseStale, -1, -1, 0, 1})
	check(t, by[k][3].Evidence.AfterStale && by[k][3].Evidence.OldRun.LastSeq == 6, "restart after stale %+v", by[k][3].Evidence)
}

// TestDetectorKilledMidGap kills a detector (its connection closed under it, nothing flushed) while a
// bridge-dropped gap waits for its marker and a ZMQ gap waits for its grace; the restarted detector
// reports each exactly once, and nothing else, although everything unacked is redelivered.
func TestDetectorKilledMidGap(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig()
	cfg.MarkerGrace = 3 * time.Second
	k := key("crash", 0)
	t0 := time.Now().UnixMilli()
	h := startDetector(t, env.Server.ClientURL(), cfg)
	publishAll(t, env.JS, fpms(k, 0, 9, t0, t0)...)
	publishAll(t, env.JS, fpms(k, 20, 29, t0, t0+200)...) // 10..19: the bridge dropped them
	publishAll(t, env.JS, fpms(k, 35, 40, t0, t0+400)...) // 30..34: lost upstream
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := h.metric("fpmbus_gaps_messages_total"); n != 26 {
			return fmt.Errorf("%v of 26 applied", n)
		}
		if n := h.metric("fpmbus_gaps_pending_gaps"); n != 2 {
			return fmt.Errorf("%v of 2 gaps pending", n)
		}
		return nil
	})
	h.kill()
	check(t, len(storedEvents(t, env.JS)) == 0, "no event before the crash")

	h2 := startDetector(t, env.Server.ClientURL(), cfg)
	publishAll(t, env.JS, markerMsg(k, t0, 10, 19, "buffer_full"))
	publishAll(t, env.JS, fpms(k, 41, 45, t0, t0+600)...)
	by := waitEvents(t, env.JS, 2, 20*time.Second)
	match(t, k, by[k], gapW(CauseBridgeDrop, 10, 19), gapW(CauseZMQDrop, 30, 34))
	// Redeliveries of the unacked messages arrive after AckWait; none may add an event.
	time.Sleep(cfg.AckWait + time.Second)
	consumerDone(t, env.JS, streams.StreamFPM, defaultGroup)
	by = waitEvents(t, env.JS, 2, time.Second)
	equal(t, uint64(46), delivered(t, env.JS, k)+missingOf(by[k]), "delivered + missing")
	check(t, h2.stop() == nil, "stop")
}

// TestDetectorPublishesACheckpointedOutbox: a detector that checkpointed events but died before
// storing all of them; the next one stores exactly the missing ones.
func TestDetectorPublishesACheckpointedOutbox(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx := context.Background()
	cfg := testConfig()
	k := key("outbox", 0)
	t0 := time.Now().UnixMilli()
	publishAll(t, env.JS, fpms(k, 0, 3, t0, t0)...)
	publishAll(t, env.JS, fpms(k, 6, 7, t0, t0+100)...)
	publishAll(t, env.JS, fpms(k, 9, 9, t0, t0+200)...)
	// What the dead detector had applied: both gaps classified, the first event stored.
	st := &state{V: stateVersion, Key: k}
	tr := &tracker{key: k, st: st, r: cfg.rules()}
	for i, m := range natsservertest.Messages(t, env.JS, streams.StreamFPM, ">") {
		meta, _ := m.Metadata()
		o, err := observation(m.Headers(), m.Data(), meta.Sequence.Stream, meta.Timestamp)
		check(t, err == nil, "observation %d: %v", i, err)
		tr.observe(&o)
	}
	tr.expire(time.Now().Add(time.Hour).UnixMilli())
	equal(t, 2, len(st.Outbox))
	first := st.Outbox[0]
	body, _ := json.Marshal(&first)
	m := nats.NewMsg(first.Subject())
	m.Data = body
	m.Header.Set(streams.HeaderMsgID, first.ID)
	m.Header.Set(streams.HeaderEventType, first.Type)
	publishAll(t, env.JS, m)
	kv, err := env.JS.CreateOrUpdateKeyValue(ctx, cfg.StateBucketConfig())
	check(t, err == nil, "bucket: %v", err)
	data, _ := json.Marshal(st)
	_, err = kv.Put(ctx, kvKey(cfg.Group, k), data)
	check(t, err == nil, "put: %v", err)

	h := startDetector(t, env.Server.ClientURL(), cfg)
	by := waitEvents(t, env.JS, 2, 10*time.Second)
	match(t, k, by[k], gapW(CauseZMQDrop, 4, 5), gapW(CauseZMQDrop, 8, 8))
	checkFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if n := h.metric("fpmbus_gaps_events_total"); n != 1 {
			return fmt.Errorf("%v events published by the new detector, want 1 (the other was stored)", n)
		}
		return nil
	})
	consumerDone(t, env.JS, streams.StreamFPM, defaultGroup)
	time.Sleep(200 * time.Millisecond)
	equal(t, 1.0, h.metric("fpmbus_gaps_events_total"), "no event re-applied from the redelivered FPMs")
}

// TestScaleOutStopJoinAndCrashReportEveryGapOnce runs a group of four partitions on three instances
// while gaps (ZMQ drops and bridge drops with markers) keep coming: one instance stops gracefully
// mid-run, a fourth joins, one crashes (its connection closed under it). Every gap is stored exactly
// once with its exact range and cause, event_seq stays contiguous per publisher, and per publisher
// delivered + reported missing == sent.
func TestScaleOutStopJoinAndCrashReportEveryGapOnce(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig()
	cfg.Partitions = 4
	var keys []streams.Key
	parts := map[int]int{}
	for i := range 12 {
		k := key(fmt.Sprint("so-", i), i%3)
		keys = append(keys, k)
		parts[cfg.PartitionOf(k)]++
	}
	check(t, len(parts) >= 3, "publishers spread over the partitions: %v", parts)
	url := env.Server.ClientURL()
	start := func(id string) *harness { return startDetector(t, url, cfg, durable.WithMemberID(id)) }
	owners := func(hs ...*harness) error {
		n := 0
		for _, h := range hs {
			n += len(h.d.runner.Owned())
		}
		if n != len(parts) { // an empty partition is pinned to no one
			return fmt.Errorf("%d of %d partitions owned", n, len(parts))
		}
		return nil
	}
	t0 := time.Now().UnixMilli()
	now := func() int64 { return time.Now().UnixMilli() }
	next := map[streams.Key]uint64{}
	wants := map[streams.Key][]want{}
	total := 0
	// round publishes, per publisher, 20 messages, a gap of 1-3 numbers (odd rounds: dropped by the
	// bridge, with a marker) and 5 more messages.
	round := func(r int) {
		var msgs []*nats.Msg
		for i, k := range keys {
			base := next[k]
			msgs = append(msgs, fpms(k, base, base+19, t0, now())...)
			first := base + 20
			last := first + uint64(i%3)
			cause := CauseZMQDrop
			if r%2 == 1 {
				cause = CauseBridgeDrop
				msgs = append(msgs, markerMsg(k, t0, first, last, "buffer_full"))
			}
			wants[k] = append(wants[k], gapW(cause, int64(first), int64(last)))
			msgs = append(msgs, fpms(k, last+1, last+5, t0, now())...)
			next[k] = last + 6
		}
		publishAll(t, env.JS, msgs...)
		total += len(keys)
	}

	a, b, c := start("a"), start("b"), start("c")
	round(0)
	waitEvents(t, env.JS, total, 20*time.Second)
	checkFor(t, 20*time.Second, 50*time.Millisecond, func() error { return owners(a, b, c) })
	round(1)
	check(t, a.stop() == nil, "graceful stop of a")
	round(2)
	d := start("d")
	round(3)
	waitEvents(t, env.JS, total, 30*time.Second)
	checkFor(t, 20*time.Second, 50*time.Millisecond, func() error { return owners(b, c, d) })
	round(4)
	b.kill()
	round(5)
	// A bridge drop whose marker is there is classified at once, a ZMQ drop after the grace: the
	// events of a publisher are in classification order, so compare them by range.
	inOrder := func(evs []Event) []Event {
		evs = slices.Clone(evs)
		slices.SortFunc(evs, func(x, y Event) int { return cmp.Compare(*x.FirstMissing, *y.FirstMissing) })
		for i := range evs {
			evs[i].EventSeq = uint64(i + 1) // match checks 1..n; checked as a set below
		}
		return evs
	}
	seqs := func(evs []Event) []uint64 {
		var out []uint64
		for _, e := range evs {
			out = append(out, e.EventSeq)
		}
		slices.Sort(out)
		return out
	}
	by := waitEvents(t, env.JS, total, 40*time.Second)
	for _, k := range keys {
		match(t, k, inOrder(by[k]), wants[k]...)
	}
	for p := range cfg.Partitions {
		consumerDone(t, env.JS, cfg.PartitionConfig().ConsumerStream(), cfg.PartitionConfig().ConsumerName(p))
	}
	time.Sleep(500 * time.Millisecond)
	by = waitEvents(t, env.JS, total, time.Second)
	for _, k := range keys {
		match(t, k, inOrder(by[k]), wants[k]...)
		equal(t, seqs(inOrder(by[k])), seqs(by[k]), k.String(), ": event_seq 1..n, each once")
		equal(t, next[k], delivered(t, env.JS, k)+missingOf(by[k]), k.String(), ": delivered + missing")
	}
	equal(t, 0.0, c.metric("fpmbus_gaps_duplicates_total")+d.metric("fpmbus_gaps_duplicates_total"), "duplicates")
	check(t, c.stop() == nil && d.stop() == nil, "stop")
}

// TestReport builds the report from the state bucket and, with --since, from the streams.
func TestReport(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	start := time.Now()
	t0 := start.UnixMilli()
	kz, kr := key("zmq", 0), key("restart", 1)
	var msgs []*nats.Msg
	msgs = append(msgs, fpms(kz, 0, 9, t0, t0)...)
	msgs = append(msgs, fpms(kz, 12, 19, t0, t0+100)...)
	msgs = append(msgs, fpms(kr, 0, 19, t0, t0)...)
	msgs = append(msgs, fpms(kr, 0, 4, t0+1, t0+300)...)
	publishAll(t, env.JS, msgs...)
	h := startDetector(t, env.Server.ClientURL(), testConfig())
	waitEvents(t, env.JS, 2, 10*time.Second)
	consumerDone(t, env.JS, streams.StreamFPM, defaultGroup)
	check(t, h.stop() == nil, "stop")

	for _, since := range []time.Time{{}, start.Add(-time.Minute)} {
		rep, err := BuildReport(context.Background(), env.JS, ReportConfig{Since: since})
		check(t, err == nil, "report: %v", err)
		equal(t, 2, len(rep.Publishers))
		r, z := rep.Publishers[0], rep.Publishers[1]
		equal(t, kr, r.Key)
		equal(t, conditionRestarted, r.State)
		equal(t, uint64(25), r.Messages)
		equal(t, uint64(1), r.Gaps.PublisherRestart)
		equal(t, uint64(0), r.MissingTotal)
		equal(t, conditionLive, z.State)
		equal(t, uint64(18), z.Messages)
		equal(t, uint64(3), z.Heartbeats) // 0, 5, 15
		equal(t, CauseCounts{ZMQDrop: 1}, z.Gaps)
		equal(t, uint64(2), z.MissingTotal)
		check(t, z.LossPercent > 9.99 && z.LossPercent < 10.01, "loss %v", z.LossPercent)
		var sb strings.Builder
		check(t, rep.WriteText(&sb) == nil, "text")
		check(t, strings.Contains(sb.String(), "zmq\t") || strings.Contains(sb.String(), "zmq "), "text report:\n%s", sb.String())
	}
}

// TestDetectorRereadsWhatItAckedPastItsCheckpoint: messages that only advance a sequence are acked
// before their publisher's state is checkpointed; a detector killed then must not see a false gap
// (the next one re-reads them from the stream), neither for a publisher that goes on nor for one
// that stays silent.
func TestDetectorRereadsWhatItAckedPastItsCheckpoint(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig()
	cfg.CheckpointInterval = time.Hour
	cfg.StaleAfter = 2 * time.Second
	ka, kb := key("goes-on", 0), key("silent", 1)
	now := func() int64 { return time.Now().UnixMilli() }
	t0 := now()
	h := startDetector(t, env.Server.ClientURL(), cfg)
	publishAll(t, env.JS, append(fpms(ka, 0, 9, t0, now()), fpms(kb, 0, 9, t0, now())...)...)
	consumerDone(t, env.JS, streams.StreamFPM, defaultGroup)
	time.Sleep(100 * time.Millisecond)
	publishAll(t, env.JS, append(fpms(ka, 10, 49, t0, now()), fpms(kb, 10, 29, t0, now())...)...)
	consumerDone(t, env.JS, streams.StreamFPM, defaultGroup)
	kv, err := env.JS.KeyValue(context.Background(), defaultStateBucket)
	check(t, err == nil, "bucket: %v", err)
	ent, err := kv.Get(context.Background(), kvKey(defaultGroup, ka))
	check(t, err == nil, "state: %v", err)
	var st state
	check(t, json.Unmarshal(ent.Value(), &st) == nil && st.Last.Seq == 9, "checkpoint holds only the first ten messages: %+v", st.Last)
	h.kill()

	h2 := startDetector(t, env.Server.ClientURL(), cfg)
	publishAll(t, env.JS, fpms(ka, 50, 59, t0, now())...)
	publishAll(t, env.JS, fpms(ka, 65, 66, t0, now())...)
	by := waitFirstEvents(t, env.JS, 3, 15*time.Second) // ka's gap, both stale by now
	match(t, ka, by[ka], gapW(CauseZMQDrop, 60, 64), want{typeStale, CauseStale, -1, -1, 0, -1})
	match(t, kb, by[kb], want{typeStale, CauseStale, -1, -1, 0, -1})
	check(t, by[kb][0].Before.Seq == 29, "the silent publisher's last message is 29: %+v", by[kb][0].Before)
	equal(t, 0.0, h2.metric("fpmbus_gaps_duplicates_total"))
}

// TestDetectorRefusesAGroupDeclaredWithPerMessageAcks: a group consumer declared with per-message acks
// (by hand, with the nats CLI say: the server cannot switch it to AckAll) is refused at start with an
// error naming the consumer, its ack policy and what to do; the consumer is left as it is.
func TestDetectorRefusesAGroupDeclaredWithPerMessageAcks(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx := context.Background()
	cfg := testConfig()
	k := key("declared", 0)
	t0 := time.Now().UnixMilli()
	if _, err := streams.Ensure(ctx, env.JS, streams.DefaultConfig(), nil); err != nil {
		t.Fatal(err)
	}
	publishAll(t, env.JS, fpms(k, 0, 9, t0, t0)...)
	explicit := cfg.PartitionConfig()
	explicit.CumulativeAcks = false
	for _, m := range durabletest.Take(t, env.JS, streams.StreamFPM, explicit.ConsumerConfig(0), 10) {
		check(t, m.DoubleAck(ctx) == nil, "ack")
	}

	cfg.Registerer, cfg.Logger = prometheus.NewRegistry(), testLogger()
	d, err := New(cfg, env.JS)
	check(t, err == nil, "new: %v", err)
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err = d.Run(rctx)
	check(t, errors.Is(err, partition.ErrGroupMismatch) && strings.Contains(err.Error(), "consumer "+defaultGroup+" acks with policy AckExplicit"),
		"run: %v", err)
	ci, err := env.JS.PushConsumer(ctx, streams.StreamFPM, defaultGroup)
	check(t, err == nil && ci.CachedInfo().Config.AckPolicy == jetstream.AckExplicitPolicy, "the consumer is left as it was: %v", err)
}

// TestDetectorRejectsUnusableFPMs: an FPM whose subject names no publisher and one whose Fpm-Seq is
// not a number can never be applied. Each is dead-lettered on fpmevents.deadletter.consumer.gaps with where it was
// stored and why, and holds nothing up: everything is acked, the publisher's own messages are applied,
// and the number the unusable FPM carried is reported missing like any lost one.
func TestDetectorRejectsUnusableFPMs(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	k := key("rejects", 0)
	t0 := time.Now().UnixMilli()
	badSubject := fpmMsg(k, 0, t0, t0, false, "test-bridge")
	badSubject.Subject = "fpm.dynamo.backend.rejects.rank-zero"
	badSubject.Header.Set(streams.HeaderMsgID, "bad-subject") // not a duplicate of message 0
	badSeq := fpmMsg(k, 5, t0, t0+50, false, "test-bridge")
	badSeq.Header.Set(streams.HeaderSeq, "five")
	var msgs []*nats.Msg
	msgs = append(msgs, fpms(k, 0, 4, t0, t0)...)
	msgs = append(msgs, badSubject, badSeq)
	msgs = append(msgs, fpms(k, 6, 9, t0, t0+60)...)
	publishAll(t, env.JS, msgs...)

	h := startDetector(t, env.Server.ClientURL(), testConfig())
	by := waitEvents(t, env.JS, 1, 20*time.Second)
	match(t, k, by[k], gapW(CauseZMQDrop, 5, 5))
	consumerDone(t, env.JS, streams.StreamFPM, defaultGroup)
	equal(t, 2.0, h.metric("fpmbus_gaps_invalid_total", "stream", streams.StreamFPM))
	equal(t, 9.0, h.metric("fpmbus_gaps_messages_total"))

	dl := natsservertest.Messages(t, env.JS, streams.StreamEvents, durable.RejectedSubject(ConsumerName))
	equal(t, 2, len(dl), "dead letters")
	for i, want := range []struct {
		subject, seq, reason string
		body                 []byte
	}{
		{badSubject.Subject, "6", "is not fpm.<namespace>.<component>.<worker_id>.<dp_rank>", badSubject.Data},
		{badSeq.Subject, "7", streams.HeaderSeq + ` "five"`, badSeq.Data},
	} {
		hd := dl[i].Headers()
		check(t, hd.Get(streams.HeaderConsumer) == ConsumerName && hd.Get(streams.HeaderStream) == streams.StreamFPM &&
			hd.Get(streams.HeaderSubject) == want.subject && hd.Get(streams.HeaderStreamSeq) == want.seq &&
			strings.Contains(hd.Get(streams.HeaderError), want.reason) && string(dl[i].Data()) == string(want.body),
			"dead letter %d: headers %v body %q", i, hd, dl[i].Data())
	}
	check(t, h.stop() == nil, "stop")
}

// TestIdleTakeoverReportsPendingGaps: a detector dies with a gap waiting for its grace and every FPM
// acked, some of them applied after its last checkpoint (FPMs that only advance the sequence are
// acked without one). Nothing new arrives, so nothing is delivered to the next owner: it must still
// read those FPMs from the stream and report the gap once its grace passed.
func TestIdleTakeoverReportsPendingGaps(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig()
	cfg.MarkerGrace = 2 * time.Second
	k := key("idle-takeover", 0)
	t0 := time.Now().UnixMilli()
	h := startDetector(t, env.Server.ClientURL(), cfg)
	publishAll(t, env.JS, fpms(k, 0, 9, t0, t0)...)
	publishAll(t, env.JS, fpms(k, 15, 20, t0, t0+100)...) // 10..14: lost upstream
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := h.metric("fpmbus_gaps_pending_gaps"); n != 1 {
			return fmt.Errorf("%v of 1 gap pending", n)
		}
		return nil
	})
	publishAll(t, env.JS, fpms(k, 21, 40, t0, t0+200)...)
	consumerDone(t, env.JS, streams.StreamFPM, defaultGroup)
	h.kill()
	check(t, len(storedEvents(t, env.JS)) == 0, "no event before the crash")

	h2 := startDetector(t, env.Server.ClientURL(), cfg)
	by := waitEvents(t, env.JS, 1, 20*time.Second)
	match(t, k, by[k], gapW(CauseZMQDrop, 10, 14))
	check(t, h2.stop() == nil, "stop")
}
