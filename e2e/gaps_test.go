package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/consumers/partition"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/streams"
)

// These tests run the gap detector end to end: scripted Dynamo publishers in the test process (real
// libzmq XPUB sockets that know exactly which numbers libzmq refused), the real `fpmbus bridge` and
// `fpmbus gaps` processes, and an embedded JetStream server that the test can stop and restart.

// gapsArgs are the detector flags both tests share: a stale period far beyond the test (quiet ranks
// must not become stale) and a 3 s pinned TTL so that a SIGKILLed instance's partitions move quickly.
func gapsArgs(url, metricsAddr, markerGrace string, extra ...string) []string {
	args := []string{"gaps", "--server", url, "--marker-grace", markerGrace, "--stale-after", "1h",
		"--gaps-pinned-ttl", "3s", "--metrics-addr", metricsAddr}
	return append(args, extra...)
}

// startGaps runs `fpmbus gaps` and waits until it has joined its group.
func startGaps(t *testing.T, name string, args []string) *proc {
	t.Helper()
	p := fpmbus(t, name, args...)
	p.waitOutput("gap detector started", 30*time.Second)
	return p
}

// rankPublisher is one scripted publisher and the key the bridge files its FPMs under.
type rankPublisher struct {
	*producertest.Scripted
	key streams.Key
}

func newRankPublisher(t *testing.T, base, rank int, worker string, zmqDrops bool) *rankPublisher {
	t.Helper()
	hwm := 0 // unlimited: never refuses
	if zmqDrops {
		hwm = 1 // the pipe holds one message: a burst is mostly refused (XPUB_NODROP: refused, not silently dropped)
	}
	p := producertest.NewScripted(t, fmt.Sprintf("tcp://127.0.0.1:%d", base+rank), hwm, zmqDrops, worker, rank)
	return &rankPublisher{Scripted: p, key: streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: worker, DPRank: rank}}
}

// burst sends bursts as fast as possible until libzmq refused at least one more number.
func (p *rankPublisher) burst(t *testing.T) {
	t.Helper()
	before := len(p.Lost())
	for try := 0; len(p.Lost()) == before; try++ {
		if try == 20 {
			t.Fatalf("%s: 20 bursts of 2000 with a send HWM of 1 and no ZMQ drop", p.key)
		}
		p.SendN(2000, 0)
		time.Sleep(100 * time.Millisecond)
	}
}

// tail sends paced messages until at least three were tried and the last one got through, so every
// refused number before it is followed by a delivered one (the jump that reveals the gap).
func (p *rankPublisher) tail() {
	for ok, n := false, 0; !ok || n < 3; n++ {
		ok = p.Send(false)
		time.Sleep(20 * time.Millisecond)
	}
}

// subjectCount is the number of messages stream holds on subject.
func subjectCount(js jetstream.JetStream, stream, subject string) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, err
	}
	return info.State.Subjects[subject], nil
}

// markedSeqs returns, per key, the sequence numbers covered by the bridge's drop markers (each once:
// a number in two markers fails the test).
func markedSeqs(t *testing.T, js jetstream.JetStream) map[streams.Key][]uint64 {
	t.Helper()
	out := map[streams.Key][]uint64{}
	seen := map[streams.Key]map[uint64]bool{}
	for _, m := range natsservertest.Messages(t, js, streams.StreamEvents, streams.DropMarkerWildcard) {
		dm, err := streams.ParseDropMarker(m.Data())
		if err != nil {
			t.Fatalf("drop marker %s: %v", m.Data(), err)
		}
		k := dm.Key
		if seen[k] == nil {
			seen[k] = map[uint64]bool{}
		}
		for q := dm.FirstSeq; q <= dm.LastSeq; q++ {
			if seen[k][q] {
				t.Fatalf("%s: seq %d in two drop markers", k, q)
			}
			seen[k][q] = true
			out[k] = append(out[k], q)
		}
	}
	return out
}

// gapEvents reads every event on fpmevents.gap.>, checking its subject and headers against its body.
func gapEvents(t *testing.T, js jetstream.JetStream) []gaps.Event {
	t.Helper()
	var out []gaps.Event
	for _, m := range natsservertest.Messages(t, js, streams.StreamEvents, streams.GapEventWildcard) {
		var e gaps.Event
		if err := json.Unmarshal(m.Data(), &e); err != nil {
			t.Fatalf("gap event %s: %v", m.Data(), err)
		}
		h := m.Headers()
		if m.Subject() != streams.GapEventSubject(e.Key) || h.Get(streams.HeaderMsgID) != e.ID ||
			h.Get(streams.HeaderEventType) != e.Type || h.Get(streams.HeaderGapEventSeq) != strconv.FormatUint(e.EventSeq, 10) {
			t.Fatalf("gap event %s on %s with headers %v", m.Data(), m.Subject(), h)
		}
		out = append(out, e)
	}
	return out
}

func describeEvents(evs []gaps.Event) string {
	var s []string
	for _, e := range evs {
		s = append(s, e.ID+"/"+e.Cause)
	}
	return strings.Join(s, " ")
}

// expectedGap is one gap event the test expects.
type expectedGap struct {
	first, last uint64
	cause       string
}

func (g expectedGap) String() string { return fmt.Sprintf("%s %d-%d", g.cause, g.first, g.last) }

// expectGaps is one event per maximal run of seqs, with cause.
func expectGaps(seqs []uint64, cause string) []expectedGap {
	var out []expectedGap
	for _, r := range producertest.Runs(seqs) {
		out = append(out, expectedGap{r[0], r[1], cause})
	}
	return out
}

// storedSeqs returns the sequence numbers stored on FPM for k; a number stored twice fails the test
// (one bridge process, one epoch: the bridge's dedup must hold).
func storedSeqs(t *testing.T, js jetstream.JetStream, k streams.Key) map[uint64]bool {
	t.Helper()
	out := map[uint64]bool{}
	for _, m := range storedFPMs(t, js, streams.FPMSubject(k)) {
		if out[m.seq] {
			t.Fatalf("%s: seq %d stored twice", k, m.seq)
		}
		out[m.seq] = true
	}
	return out
}

// accounted reports whether every number each publisher sent is stored on FPM, covered by a drop
// marker, or refused by libzmq, and the bridge holds nothing any more.
func accounted(js jetstream.JetStream, bridgeMetrics string, pubs []*rankPublisher, marked func() map[streams.Key][]uint64) error {
	m, err := scrapeSamples(bridgeMetrics)
	if err != nil {
		return err
	}
	if b, f := sumSamples(m, "fpmbus_bridge_buffered_messages"), sumSamples(m, "fpmbus_bridge_in_flight"); b != 0 || f != 0 {
		return fmt.Errorf("bridge: %v buffered, %v in flight", b, f)
	}
	marks := marked()
	for _, p := range pubs {
		rank := strconv.Itoa(p.key.DPRank)
		recv := sumSamples(m, "fpmbus_bridge_received_total", "rank", rank)
		if want := float64(p.Sent() - uint64(len(p.Lost()))); recv != want {
			return fmt.Errorf("%s: bridge received %v of the %v libzmq accepted", p.key, recv, want)
		}
		dropped := sumSamples(m, "fpmbus_bridge_dropped_total", "rank", rank)
		if float64(len(marks[p.key])) != dropped {
			return fmt.Errorf("%s: drop markers cover %d of %v dropped", p.key, len(marks[p.key]), dropped)
		}
		n, err := subjectCount(js, streams.StreamFPM, streams.FPMSubject(p.key))
		if err != nil {
			return err
		}
		if got := n + uint64(len(marks[p.key])) + uint64(len(p.Lost())); got != p.Sent() {
			return fmt.Errorf("%s: stored %d + marked %d + refused %d != sent %d", p.key, n, len(marks[p.key]), len(p.Lost()), p.Sent())
		}
	}
	return nil
}

// waitEventCount waits until exactly-or-more n gap events are stored and returns them.
func waitEventCount(t *testing.T, js jetstream.JetStream, n int, d time.Duration) []gaps.Event {
	t.Helper()
	var evs []gaps.Event
	eventually(t, d, func() error {
		evs = gapEvents(t, js)
		if len(evs) < n {
			return fmt.Errorf("%d of %d gap events stored: %s", len(evs), n, describeEvents(evs))
		}
		return nil
	})
	return evs
}

// consumerAcked reports whether durable on stream has nothing pending and nothing unacked.
func consumerAcked(js jetstream.JetStream, stream, durable string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.PushConsumer(ctx, stream, durable)
	if err != nil {
		return err
	}
	ci := c.CachedInfo()
	if ci.NumPending != 0 || ci.NumAckPending != 0 {
		return fmt.Errorf("%s/%s: %d pending, %d unacked", stream, durable, ci.NumPending, ci.NumAckPending)
	}
	return nil
}

// checkGapEvents asserts, per publisher, the exact gap events: sorted by first missing number they
// are exactly want (range, count, cause), nothing else was published for it (no publisher_restart,
// stale or resumed), event_seq is 1..n each once, no range is reported twice, the numbers stored,
// marked and refused partition 0..sent-1, and sent == delivered + reported missing.
func checkGapEvents(t *testing.T, js jetstream.JetStream, evs []gaps.Event, pubs []*rankPublisher, want map[streams.Key][]expectedGap, marks map[streams.Key][]uint64) {
	t.Helper()
	by := map[streams.Key][]gaps.Event{}
	ids := map[string]bool{}
	for _, e := range evs {
		if e.Schema != gaps.EventSchema || e.Type != gaps.TypeGap || (e.Cause != gaps.CauseZMQDrop && e.Cause != gaps.CauseBridgeDrop) {
			t.Fatalf("unexpected event %s: schema %s, type %s, cause %s", e.ID, e.Schema, e.Type, e.Cause)
		}
		if ids[e.ID] {
			t.Fatalf("event id %s stored twice", e.ID)
		}
		ids[e.ID] = true
		by[e.Key] = append(by[e.Key], e)
	}
	known := map[streams.Key]bool{}
	for _, p := range pubs {
		known[p.key] = true
	}
	for k, es := range by {
		if !known[k] {
			t.Fatalf("events for unknown publisher %s: %s", k, describeEvents(es))
		}
	}
	for _, p := range pubs {
		k := p.key
		es := slices.Clone(by[k])
		slices.SortFunc(es, func(a, b gaps.Event) int { return cmp.Compare(*a.FirstMissing, *b.FirstMissing) })
		var got []expectedGap
		var missing uint64
		var seqs []uint64
		for i, e := range es {
			if e.FirstMissing == nil || e.LastMissing == nil || *e.LastMissing < *e.FirstMissing {
				t.Fatalf("%s: event %s has no missing range", k, e.ID)
			}
			if e.Missing != *e.LastMissing-*e.FirstMissing+1 {
				t.Fatalf("%s: event %s: missing %d for range %d-%d", k, e.ID, e.Missing, *e.FirstMissing, *e.LastMissing)
			}
			if i > 0 && *e.FirstMissing <= *es[i-1].LastMissing {
				t.Fatalf("%s: events %s and %s report overlapping ranges", k, es[i-1].ID, e.ID)
			}
			if e.Cause == gaps.CauseBridgeDrop && (len(e.Evidence.Markers) == 0 || e.Evidence.Markers[0].Reason != "buffer_full") {
				t.Fatalf("%s: bridge_drop event %s without buffer_full marker evidence: %+v", k, e.ID, e.Evidence)
			}
			got = append(got, expectedGap{*e.FirstMissing, *e.LastMissing, e.Cause})
			missing += e.Missing
			seqs = append(seqs, e.EventSeq)
		}
		if !slices.Equal(got, want[k]) {
			t.Fatalf("%s: gap events\n got %v\nwant %v", k, got, want[k])
		}
		slices.Sort(seqs)
		for i, s := range seqs {
			if s != uint64(i+1) {
				t.Fatalf("%s: event_seq %v, want 1..%d each once", k, seqs, len(seqs))
			}
		}
		stored := storedSeqs(t, js, k)
		fate := map[uint64]string{}
		for q := range stored {
			fate[q] = "stored"
		}
		for _, list := range []struct {
			name string
			seqs []uint64
		}{{"marked dropped", marks[k]}, {"refused by libzmq", p.Lost()}} {
			for _, q := range list.seqs {
				if f, ok := fate[q]; ok {
					t.Fatalf("%s: seq %d %s and %s", k, q, f, list.name)
				}
				fate[q] = list.name
			}
		}
		for q := range p.Sent() {
			if _, ok := fate[q]; !ok {
				t.Fatalf("%s: seq %d neither stored, marked dropped nor refused by libzmq", k, q)
			}
		}
		if uint64(len(fate)) != p.Sent() {
			t.Fatalf("%s: %d numbers accounted for, %d sent", k, len(fate), p.Sent())
		}
		if delivered := uint64(len(stored)); delivered+missing != p.Sent() {
			t.Fatalf("%s: delivered %d + reported missing %d != sent %d", k, delivered, missing, p.Sent())
		}
	}
}

// loggedGapEvents counts the gap events a detector process logged as stored, by cause.
func loggedGapEvents(p *proc, cause string) int {
	return strings.Count(p.Output(), `msg="gap event" type=gap cause=`+cause+" ")
}

var gapEventLog = regexp.MustCompile(`msg="gap event" type=gap cause=\S+ key=\S+ missing=\d+ id=(\S+)`)

// loggedGapIDs lists the ids of the gap events a detector process logged as stored, in order.
func loggedGapIDs(p *proc) []string {
	var out []string
	for _, m := range gapEventLog.FindAllStringSubmatch(p.Output(), -1) {
		out = append(out, m[1])
	}
	return out
}

// TestGapDetectorKilledMidGapOverZMQ: two ranks through the real bridge. Rank 0's publisher (send HWM
// 1, XPUB_NODROP) bursts while the bridge process is stopped (SIGSTOP: a stalled subscriber), so
// libzmq refuses numbers that never reach the bridge; the detector sees the
// jumps and waits --marker-grace for a drop marker, and is SIGKILLed while the gaps are pending (none
// stored). Rank 0 sends nothing more: a new detector takes the idle partition over by itself and
// reports each run of refused numbers once as zmq_drop. Then the broker goes
// away while rank 1 keeps sending (rank 0 quiet): the bridge buffers --max-buffer and drops the rest,
// the second detector is SIGKILLed during the outage, the broker comes back at the same address and
// store, and a third detector reports each run the bridge's drop markers cover once as bridge_drop.
func TestGapDetectorKilledMidGapOverZMQ(t *testing.T) {
	t.Parallel()
	const worker, grace = "e2e-gap-kill", 5 * time.Second
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	listen, store := env.Server.NATS().Addr().String(), env.StoreDir
	base := producertest.FreeBasePort(t, "127.0.0.1", 2)
	zmqPub := newRankPublisher(t, base, 0, worker, true)
	outagePub := newRankPublisher(t, base, 1, worker, false)
	pubs := []*rankPublisher{zmqPub, outagePub}
	bridgeMetrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	bridge := startBridge(t, "bridge", url, base, 2, "--max-buffer", "50", "--ack-timeout", "1s",
		"--metrics-addr", bridgeMetrics, "--bridge-id", "e2e-gaps-bridge")
	for _, p := range pubs {
		p.WaitSubscribed()
	}
	gapsMetrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	args := gapsArgs(url, gapsMetrics, grace.String())
	d1 := startGaps(t, "fpmbus gaps 1", args)
	start := time.Now()

	// Phase 1: ZMQ drops on rank 0, detector killed while they wait for their grace.
	for _, p := range pubs {
		p.SendN(20, 2*time.Millisecond)
	}
	// A stalled subscriber: the bridge process is stopped while rank 0 bursts, so its pipe (HWM 1)
	// and the socket buffers fill and libzmq refuses the rest.
	if err := bridge.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	zmqPub.burst(t)
	if err := bridge.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	zmqPub.tail()
	eventually(t, 30*time.Second, func() error {
		n, err := subjectCount(env.JS, streams.StreamFPM, streams.FPMSubject(zmqPub.key))
		if err != nil {
			return err
		}
		if want := zmqPub.Sent() - uint64(len(zmqPub.Lost())); n != want {
			return fmt.Errorf("rank 0: %d of %d accepted messages stored", n, want)
		}
		return nil
	})
	eventually(t, grace, func() error {
		m, err := scrapeSamples(gapsMetrics)
		if err != nil {
			return err
		}
		if p := sumSamples(m, "fpmbus_gaps_pending_gaps"); p < 1 {
			return fmt.Errorf("detector has %v gaps pending", p)
		}
		return nil
	})
	if evs := gapEvents(t, env.JS); len(evs) != 0 {
		t.Fatalf("gap events stored before the kill: %s", describeEvents(evs))
	}
	_ = d1.signal(syscall.SIGKILL, 10*time.Second)
	// Dead now: whatever it had not stored it never will.
	if evs := gapEvents(t, env.JS); len(evs) != 0 {
		t.Fatalf("the detector stored gap events before it was killed (a marker grace of %v too short for this machine?): %s", grace, describeEvents(evs))
	}
	t.Logf("%v: detector 1 killed with rank 0's gaps pending: %d refused in %d runs", time.Since(start).Round(time.Millisecond),
		len(zmqPub.Lost()), len(producertest.Runs(zmqPub.Lost())))

	d2 := startGaps(t, "fpmbus gaps 2", args)
	// Detector 1 had acked every message (the pending gaps live in its checkpoint) and rank 0 sends
	// nothing more: detector 2 must take the idle partition over by itself (consumers/partition needs
	// no message to hand a partition over), load the checkpointed state, read what detector 1 applied
	// after it from the stream, and report the pending gaps.
	zmqWant := expectGaps(zmqPub.Lost(), gaps.CauseZMQDrop)
	var evs []gaps.Event
	eventually(t, 30*time.Second, func() error {
		evs = gapEvents(t, env.JS)
		if len(evs) < len(zmqWant) {
			return fmt.Errorf("%d of %d gap events stored: %s", len(evs), len(zmqWant), describeEvents(evs))
		}
		return nil
	})
	if got := loggedGapEvents(d2, gaps.CauseZMQDrop); got != len(zmqWant) {
		t.Fatalf("detector 2 logged %d zmq_drop events, want %d: %s", got, len(zmqWant), describeEvents(evs))
	}
	t.Logf("%v: detector 2 stored %d zmq_drop events", time.Since(start).Round(time.Millisecond), len(evs))

	// Phase 2: broker outage while rank 1 sends; detector 2 killed during it.
	eventually(t, 30*time.Second, func() error {
		return accounted(env.JS, bridgeMetrics, pubs, func() map[streams.Key][]uint64 { return nil })
	})
	env.Stop()
	outagePub.SendN(300, 2*time.Millisecond) // 50 buffered, the rest dropped
	_ = d2.signal(syscall.SIGKILL, 10*time.Second)
	env = natsservertest.StartAt(t, listen, store)
	eventually(t, 30*time.Second, func() error {
		m, err := scrapeSamples(bridgeMetrics)
		if err != nil {
			return err
		}
		if b := sumSamples(m, "fpmbus_bridge_buffered_messages"); b != 0 {
			return fmt.Errorf("bridge still buffers %v", b)
		}
		if d := sumSamples(m, "fpmbus_bridge_dropped_total", "rank", "1"); d == 0 {
			return fmt.Errorf("bridge dropped nothing during the outage")
		}
		return nil
	})
	d3 := startGaps(t, "fpmbus gaps 3", args)
	t.Logf("%v: broker back, detector 3 started", time.Since(start).Round(time.Millisecond))

	// Tails on every rank, then wait until everything is stored, marked or refused.
	outagePub.SendN(10, 5*time.Millisecond)
	zmqPub.tail()
	var marks map[streams.Key][]uint64
	eventually(t, 30*time.Second, func() error {
		return accounted(env.JS, bridgeMetrics, pubs, func() map[streams.Key][]uint64 {
			marks = markedSeqs(t, env.JS)
			return marks
		})
	})
	want := map[streams.Key][]expectedGap{
		zmqPub.key:    expectGaps(zmqPub.Lost(), gaps.CauseZMQDrop),
		outagePub.key: expectGaps(marks[outagePub.key], gaps.CauseBridgeDrop),
	}
	if len(marks[zmqPub.key]) != 0 {
		t.Fatalf("rank 0 was quiet during the outage but the bridge marked %d of its numbers dropped", len(marks[zmqPub.key]))
	}
	total := len(want[zmqPub.key]) + len(want[outagePub.key])
	waitEventCount(t, env.JS, total, 30*time.Second)
	cfg := gaps.DefaultConfig()
	eventually(t, 30*time.Second, func() error { return consumerAcked(env.JS, streams.StreamFPM, cfg.FPMDurable()) })
	if err := d3.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("detector 3 exit: %v", err)
	}
	// No detector runs any more: what is stored now is final.
	evs = gapEvents(t, env.JS)
	checkGapEvents(t, env.JS, evs, pubs, want, marks)
	if got := loggedGapEvents(d3, gaps.CauseBridgeDrop); got != len(want[outagePub.key]) {
		t.Fatalf("detector 3 logged %d bridge_drop events, want %d", got, len(want[outagePub.key]))
	}
	t.Logf("%v: rank 0 sent %d, %d refused in %d zmq_drop events; rank 1 sent %d, %d dropped by the bridge in %d bridge_drop events",
		time.Since(start).Round(time.Millisecond), zmqPub.Sent(), len(zmqPub.Lost()), len(want[zmqPub.key]),
		outagePub.Sent(), len(marks[outagePub.key]), len(want[outagePub.key]))
}

// TestTwoGapDetectorsOverZMQ: one bridge, six ranks, four of them bursting past a send HWM of 1 in
// every round; two `fpmbus gaps --gaps-partitions 4` processes of one group share the publishers.
// Mid-run one is SIGKILLed (gaps pending) and replaced, later the other is stopped with SIGTERM
// (graceful handover). Every run of refused numbers is reported exactly once, by whichever instance
// owned the publisher, with exact ranges; the clean ranks get no event.
func TestTwoGapDetectorsOverZMQ(t *testing.T) {
	t.Parallel()
	const ranks, parts = 6, 4
	zmqRanks := []int{0, 1, 2, 3}
	cfg := gaps.DefaultConfig()
	cfg.Partitions = parts
	// A worker id whose bursting ranks fall into at least three of the four partitions, so that each of
	// two instances (two partitions each) owns some of them.
	worker := ""
	for i := 0; i < 100 && worker == ""; i++ {
		w := fmt.Sprintf("e2e-two-%d", i)
		used := map[int]bool{}
		for _, r := range zmqRanks {
			used[cfg.PartitionOf(streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: w, DPRank: r})] = true
		}
		if len(used) >= 3 {
			worker = w
		}
	}
	if worker == "" {
		t.Fatal("no worker id spreads the bursting ranks over three partitions")
	}

	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	base := producertest.FreeBasePort(t, "127.0.0.1", ranks)
	var pubs, bursting []*rankPublisher
	for r := range ranks {
		p := newRankPublisher(t, base, r, worker, slices.Contains(zmqRanks, r))
		pubs = append(pubs, p)
		if slices.Contains(zmqRanks, r) {
			bursting = append(bursting, p)
		}
	}
	bridgeMetrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startBridge(t, "bridge", url, base, ranks, "--metrics-addr", bridgeMetrics, "--bridge-id", "e2e-gaps-bridge")
	for _, p := range pubs {
		p.WaitSubscribed()
	}
	detector := func(name string) (*proc, string) {
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		return startGaps(t, name, gapsArgs(url, addr, "2s", "--gaps-partitions", strconv.Itoa(parts))), addr
	}
	a, aMetrics := detector("fpmbus gaps A")
	b, _ := detector("fpmbus gaps B")
	// Both members see each other before traffic, so the first partitions are pinned as assigned.
	eventually(t, 20*time.Second, func() error {
		kv, err := env.JS.KeyValue(t.Context(), partition.MembersBucket)
		if err != nil {
			return err
		}
		lister, err := kv.ListKeysFiltered(t.Context(), streams.StreamFPM+"."+cfg.Group+".*")
		if err != nil {
			return err
		}
		n := 0
		for range lister.Keys() {
			n++
		}
		if n != 2 {
			return fmt.Errorf("%d members in the group", n)
		}
		return nil
	})
	start := time.Now()
	zmqEvents := func() int {
		n := 0
		for _, p := range bursting {
			n += len(producertest.Runs(p.Lost()))
		}
		return n
	}
	round := func() {
		for _, p := range pubs {
			p.SendN(10, time.Millisecond)
		}
		for _, p := range bursting {
			p.burst(t)
		}
		time.Sleep(100 * time.Millisecond)
		for _, p := range bursting {
			p.tail()
		}
	}

	round()
	round()
	waitEventCount(t, env.JS, zmqEvents(), 30*time.Second)
	for _, p := range []*proc{a, b} {
		if loggedGapEvents(p, gaps.CauseZMQDrop) == 0 {
			t.Fatalf("%s stored no gap event: the two instances do not share the publishers", p.name)
		}
	}
	t.Logf("%v: rounds 0-1 reported by both instances", time.Since(start).Round(time.Millisecond))
	round()
	pending := -1.0 // how many of round 2's gaps A holds, waiting for their 2 s grace (informational)
	if m, err := scrapeSamples(aMetrics); err == nil {
		pending = sumSamples(m, "fpmbus_gaps_pending_gaps")
	}
	_ = a.signal(syscall.SIGKILL, 10*time.Second)
	a2, _ := detector("fpmbus gaps A2")
	round()
	round()
	if err := b.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("detector B exit: %v", err)
	}
	t.Logf("%v: A killed after round 2 with %v gaps pending, A2 joined, B stopped after round 4", time.Since(start).Round(time.Millisecond), pending)
	round()
	for _, p := range pubs {
		p.SendN(5, 2*time.Millisecond)
		p.tail()
	}
	eventually(t, 30*time.Second, func() error {
		return accounted(env.JS, bridgeMetrics, pubs, func() map[streams.Key][]uint64 { return nil })
	})
	want := map[streams.Key][]expectedGap{}
	for _, p := range bursting {
		want[p.key] = expectGaps(p.Lost(), gaps.CauseZMQDrop)
	}
	waitEventCount(t, env.JS, zmqEvents(), 30*time.Second)
	var total uint64
	for _, p := range pubs {
		total += p.Sent() - uint64(len(p.Lost()))
	}
	eventually(t, 30*time.Second, func() error { return groupDone(env.JS, cfg.Group, parts, total) })
	if err := a2.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("detector A2 exit: %v", err)
	}
	if loggedGapEvents(a2, gaps.CauseZMQDrop) == 0 {
		t.Fatalf("the replacement instance stored no gap event")
	}
	evs := gapEvents(t, env.JS)
	checkGapEvents(t, env.JS, evs, pubs, want, markedSeqs(t, env.JS))
	// The server deduplicates an event published twice with its id, so the stream alone cannot show
	// a range reported by two instances: their logs can. Only the SIGKILLed instance may share ids
	// with another (its checkpointed outbox is published again by the next owner, by design).
	byA := map[string]bool{}
	for _, id := range loggedGapIDs(a) {
		byA[id] = true
	}
	for _, p := range []*proc{a, b, a2} {
		if n, m := len(loggedGapIDs(p)), loggedGapEvents(p, gaps.CauseZMQDrop); n != m {
			t.Fatalf("%s: %d gap event ids parsed from %d gap event log lines", p.name, n, m)
		}
	}
	seen := map[string]string{}
	repub := 0
	for _, p := range []*proc{b, a2} {
		for _, id := range loggedGapIDs(p) {
			if other, ok := seen[id]; ok {
				t.Fatalf("gap %s reported by %s and by %s", id, other, p.name)
			}
			seen[id] = p.name
			if byA[id] {
				repub++
			}
		}
	}
	var refused int
	for _, p := range bursting {
		refused += len(p.Lost())
	}
	t.Logf("%v: %d events for %d refused numbers; logged by A %d, B %d, A2 %d (%d of A's again after its crash)", time.Since(start).Round(time.Millisecond),
		len(evs), refused, loggedGapEvents(a, gaps.CauseZMQDrop), loggedGapEvents(b, gaps.CauseZMQDrop), loggedGapEvents(a2, gaps.CauseZMQDrop), repub)
}
