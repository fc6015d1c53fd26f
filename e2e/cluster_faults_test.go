package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/streams"
)

// publishedLastSeq parses `fpmbus publish`'s exit stats: rank → last sequence number sent.
func publishedLastSeq(t *testing.T, out string) map[int]uint64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^rank (\d+) .*last seq (\d+)$`)
	last := map[int]uint64{}
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		r, _ := strconv.Atoi(m[1])
		s, _ := strconv.ParseUint(m[2], 10, 64)
		last[r] = s
	}
	return last
}

// allConsumersDone reports whether every consumer of FPM and of its partition streams has nothing
// pending and nothing unacknowledged: every component has read and settled everything stored.
func allConsumersDone(js jetstream.JetStream) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	names := js.StreamNames(ctx)
	var consumed []string
	for n := range names.Name() {
		if n == streams.StreamFPM || strings.HasPrefix(n, streams.StreamFPM+"_PART_") {
			consumed = append(consumed, n)
		}
	}
	if err := names.Err(); err != nil {
		return err
	}
	for _, sn := range consumed {
		s, err := js.Stream(ctx, sn)
		if err != nil {
			return err
		}
		cl := s.ListConsumers(ctx)
		for ci := range cl.Info() {
			if ci.NumPending != 0 || ci.NumAckPending != 0 {
				return fmt.Errorf("%s/%s: %d pending, %d unacked", sn, ci.Name, ci.NumPending, ci.NumAckPending)
			}
		}
		if err := cl.Err(); err != nil {
			return err
		}
	}
	return nil
}

// partitionStreamsCaughtUp reports whether every partition stream of FPM holds as many messages as
// FPM: the server has copied everything stored (the copy is what the partitioned consumers read).
func partitionStreamsCaughtUp(js jetstream.JetStream) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src, err := js.Stream(ctx, streams.StreamFPM)
	if err != nil {
		return err
	}
	want := src.CachedInfo().State.Msgs
	names := js.StreamNames(ctx)
	for n := range names.Name() {
		if !strings.HasPrefix(n, streams.StreamFPM+"_PART_") {
			continue
		}
		s, err := js.Stream(ctx, n)
		if err != nil {
			return err
		}
		info := s.CachedInfo()
		if info.State.Msgs != want {
			var srcs []string
			for _, si := range info.Sources {
				j, _ := json.Marshal(si)
				srcs = append(srcs, string(j))
			}
			lead := ""
			if info.Cluster != nil {
				lead = info.Cluster.Leader
			}
			return fmt.Errorf("%s holds %d of the %d messages of %s (leader %s, sources %s)", n, info.State.Msgs, want, streams.StreamFPM, lead, strings.Join(srcs, " "))
		}
	}
	return names.Err()
}

// gapRanges are the numbers a gap event names as missing.
func gapRanges(e gaps.Event) [][2]uint64 {
	if len(e.MissingRanges) > 0 {
		return e.MissingRanges
	}
	if e.Missing == 0 || e.FirstMissing == nil || e.LastMissing == nil {
		return nil
	}
	return [][2]uint64{{*e.FirstMissing, *e.LastMissing}}
}

// A real 3-node cluster (the shipped ops/nats/cluster configuration, each node a process) with R3
// streams, the bridge, two trace writers sharing two partitions and the gap detector, all real fpmbus
// processes, while a publisher sends on four ranks. Faults, one after the other: the FPM stream
// leader's server is stopped and restarted, a trace writer is SIGKILLed and restarted, and the node
// leading FPM then is cut off from the others (paused past two route pings) and let back. After
// recovery: every number each rank sent is stored exactly once or named missing by exactly one gap
// event (the bridge's buffer is small, so a stalled leader makes it drop, with drop markers), no gap
// event names a stored FPM, and the trace lines are exactly the stream's messages.
func TestClusterUnderFaultsStreamTracesAndGapsAgree(t *testing.T) {
	t.Parallel()
	const ranks, perRank, rate = 4, 5000, 150
	t0 := time.Now()
	c := startProcessCluster(t)
	js := jsClient(t, c.url)
	// Retried until every node has joined JetStream's meta group (before, an R3 stream has no placement).
	eventually(t, 60*time.Second, func() error {
		if out, err := run(t, 30*time.Second, fpmbusBin, "streams", "apply", "--server", c.url, "--replicas", "3", "--max-bytes", "1073741824"); err != nil {
			return fmt.Errorf("streams apply: %v\n%s", err, out)
		}
		return nil
	})
	for _, s := range []string{streams.StreamFPM, streams.StreamEvents} {
		st, err := js.Stream(t.Context(), s)
		if err != nil {
			t.Fatal(err)
		}
		if r := st.CachedInfo().Config.Replicas; r != 3 {
			t.Fatalf("%s has %d replicas, want 3", s, r)
		}
	}

	// Every component runs as the shipped units run it: restarted after a failure (Restart=on-failure).
	base := producertest.FreeBasePort(t, "", ranks)
	bridgeMetrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	bridge := superviseFpmbus(t, "bridge", "bridge ready", "bridge", "--server", c.url, "--fpm-port", strconv.Itoa(base),
		"--dp-size", strconv.Itoa(ranks), "--replicas", "3", "--metrics-addr", bridgeMetrics,
		// A buffer smaller than what a stalled leader holds back (seconds at 600 FPM/s): the bridge drops,
		// with drop markers, and the gap events for them are checked against the stream.
		"--max-buffer", "1000")
	gapsProc := superviseFpmbus(t, "gaps", "gap detector started", gapsArgs(c.url, fmt.Sprintf("127.0.0.1:%d", freePort(t)), "10s", "--replicas", "3")...)
	out := filepath.Join(t.TempDir(), "trace", "fpm")
	traces := map[string]*supervised{}
	for _, m := range []string{"ta", "tb"} {
		traces[m] = superviseFpmbus(t, "trace "+m, "trace writer started", "trace", "--server", c.url, "--replicas", "3",
			"--trace-mode", "full", "--trace-output", out, "--partitions", "2", "--pinned-ttl", "3s", "--member-id", m,
			"--max-segments", "1000000", "--roll-bytes", "1048576", "--trace-flush-interval", "200ms")
	}
	t.Logf("cluster and components up at %v", time.Since(t0).Round(time.Millisecond))

	pub := publish(t, 1, base, ranks, perRank, "cw", "--rate", strconv.Itoa(rate), "--seed", "11")
	time.Sleep(5 * time.Second)

	// Fault 1: the FPM stream leader's server stops (cleanly) and comes back on its store.
	leader := c.streamLeader(t, js, streams.StreamFPM)
	t.Logf("%v: stopping %s, the leader of %s", time.Since(t0).Round(time.Millisecond), leader.name, streams.StreamFPM)
	leader.stop()
	time.Sleep(3 * time.Second)
	leader.start()
	t.Logf("%v: %s restarted; leader now %s", time.Since(t0).Round(time.Millisecond), leader.name, c.streamLeader(t, js, streams.StreamFPM).name)

	// Fault 2: one trace writer is SIGKILLed mid-write; its unit restarts it under its id, and it takes its
	// partition back.
	time.Sleep(2 * time.Second)
	traces["ta"].kill(syscall.SIGKILL)
	t.Logf("%v: trace ta killed", time.Since(t0).Round(time.Millisecond))
	time.Sleep(4 * time.Second)

	// Fault 3: the node leading FPM now is cut off: paused past two route pings (its routes close) and
	// past an election (the other two elect a leader without it), then let back with its stale view of the cluster.
	cut := c.streamLeader(t, js, streams.StreamFPM)
	t.Logf("%v: pausing %s (leader of %s)", time.Since(t0).Round(time.Millisecond), cut.name, streams.StreamFPM)
	cut.signal(syscall.SIGSTOP)
	time.Sleep(12 * time.Second) // past nats-server's longest Raft election timeout (9s)
	cut.signal(syscall.SIGCONT)
	t.Logf("%v: %s resumed; leader now %s", time.Since(t0).Round(time.Millisecond), cut.name, c.streamLeader(t, js, streams.StreamFPM).name)

	if err := pub.wait(90 * time.Second); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	last := publishedLastSeq(t, pub.Output())
	if len(last) != ranks {
		t.Fatalf("publisher stats name %d ranks, want %d:\n%s", len(last), ranks, pub.Output())
	}
	t.Logf("%v: publisher done: last seq per rank %v", time.Since(t0).Round(time.Millisecond), last)

	// Recovery: the bridge holds nothing, every component has settled everything stored, and every number
	// sent is stored or named by a gap event.
	key := func(r int) streams.Key {
		return streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "cw", DPRank: r}
	}
	type id struct {
		rank  int
		epoch string
		seq   uint64
	}
	var stored map[id]bool
	var evs []gaps.Event
	var logged time.Time
	waiting := func(err error) error { // what recovery waits for, every few seconds (for the report)
		if time.Since(logged) >= 5*time.Second {
			logged = time.Now()
			t.Logf("%v: recovery waits: %.600v", time.Since(t0).Round(time.Millisecond), err)
		}
		return err
	}
	eventually(t, 60*time.Second, func() error {
		m, err := scrapeSamples(bridgeMetrics)
		if err != nil {
			return err
		}
		if b, f := sumSamples(m, "fpmbus_bridge_buffered_messages"), sumSamples(m, "fpmbus_bridge_in_flight"); b != 0 || f != 0 {
			return waiting(fmt.Errorf("bridge: %v buffered, %v in flight", b, f))
		}
		if err := allConsumersDone(js); err != nil {
			return waiting(err)
		}
		if err := partitionStreamsCaughtUp(js); err != nil {
			return waiting(err)
		}
		stored = map[id]bool{}
		bySeq := map[int]map[uint64]bool{}
		for _, s := range storedFPMs(t, js, ">") {
			k := id{s.key.DPRank, s.epoch, s.seq}
			if stored[k] {
				t.Fatalf("rank %d epoch %s seq %d stored twice", k.rank, k.epoch, k.seq)
			}
			stored[k] = true
			if bySeq[k.rank] == nil {
				bySeq[k.rank] = map[uint64]bool{}
			}
			bySeq[k.rank][k.seq] = true
		}
		evs = gapEvents(t, js)
		named := map[int]map[uint64]bool{}
		for _, e := range evs {
			for _, r := range gapRanges(e) {
				for q := r[0]; q <= r[1]; q++ {
					if named[e.Key.DPRank] == nil {
						named[e.Key.DPRank] = map[uint64]bool{}
					}
					named[e.Key.DPRank][q] = true
				}
			}
		}
		for r := range ranks {
			for q := uint64(0); q <= last[r]; q++ {
				if !bySeq[r][q] && !named[r][q] {
					return fmt.Errorf("rank %d seq %d neither stored nor named by a gap event (%d events: %s)", r, q, len(evs), describeEvents(evs))
				}
			}
		}
		return nil
	})

	// No false gap event: every number an event names missing is really absent from the stream (for its
	// publisher and bridge epoch), no number is named twice (so per rank delivered + missing = sent), and
	// each cause is one the detector or bridge defines.
	causes := map[string]bool{gaps.CauseZMQDrop: true, gaps.CauseBridgeDrop: true, gaps.CausePublisherRestart: true,
		gaps.CauseStale: true, gaps.CauseLateStart: true, streams.GapCauseLostAfterAck: true}
	missing := 0
	namedOnce := map[id]string{}
	for _, e := range evs {
		if !causes[e.Cause] {
			t.Fatalf("gap event %s has cause %q", e.ID, e.Cause)
		}
		if e.Key != key(e.Key.DPRank) || e.Key.DPRank >= ranks {
			t.Fatalf("gap event %s for an unknown publisher %v", e.ID, e.Key)
		}
		for _, r := range gapRanges(e) {
			for q := r[0]; q <= r[1]; q++ {
				missing++
				k := id{e.Key.DPRank, strconv.FormatInt(e.Epoch, 10), q}
				if other, ok := namedOnce[k]; ok {
					t.Fatalf("rank %d seq %d named missing by two gap events: %s and %s", k.rank, q, other, e.ID)
				}
				namedOnce[k] = e.ID
				if stored[k] {
					// Where the named number and its neighbours sit in the stream, to tell a late store from a
					// misread.
					j, _ := json.Marshal(e)
					for _, m := range natsservertest.Messages(t, js, streams.StreamFPM, streams.FPMSubject(e.Key)) {
						sq := m.Headers().Get(streams.HeaderSeq)
						if sq == strconv.FormatUint(q, 10) || sq == strconv.FormatUint(e.After.Seq, 10) || sq == strconv.FormatUint(e.Before.Seq, 10) {
							md, _ := m.Metadata()
							t.Logf("rank %d seq %s: stream sequence %d, stored at %s", e.Key.DPRank, sq, md.Sequence.Stream, md.Timestamp.Format(time.RFC3339Nano))
						}
					}
					t.Fatalf("false gap event: seq %d is stored: %s", q, j)
				}
			}
		}
	}

	// The traces equal the stream: the multiset of (observed_at, fpm) over every segment of both writers.
	want := map[string]int{}
	for _, m := range storedFPMs(t, js, ">") {
		want[m.header.Get(streams.HeaderReceivedAt)+" "+string(m.body)]++
	}
	lines := traceLines(t, out+".*.jsonl.gz")
	got := map[string]int{}
	for _, l := range lines {
		got[strconv.FormatInt(l.Event.ObservedAtUnixMs, 10)+" "+string(l.Event.FPM)]++
	}
	if len(lines) != len(stored) {
		t.Errorf("%d trace lines for %d stored FPMs", len(lines), len(stored))
	}
	for k, n := range want {
		if got[k] != n {
			t.Fatalf("FPM stored %d times, traced %d times: %.160s", n, got[k], k)
		}
	}
	for k, n := range got {
		if want[k] != n {
			// Every copy of this FPM (by body) in FPM and in the partition streams, to tell a copy the
			// stream lost after it was sourced from a bridge's re-stamped resend.
			body := k[strings.Index(k, " ")+1:]
			for _, m := range storedFPMs(t, js, ">") {
				if string(m.body) == body {
					t.Logf("in %s: %v", streams.StreamFPM, m.header)
				}
			}
			names := js.StreamNames(t.Context())
			for sn := range names.Name() {
				if strings.HasPrefix(sn, streams.StreamFPM+"_PART_") {
					for _, m := range natsservertest.Messages(t, js, sn, ">") {
						if string(m.Data()) == body {
							md, _ := m.Metadata()
							t.Logf("in %s at %d: %v", sn, md.Sequence.Stream, m.Headers())
						}
					}
				}
			}
			t.Fatalf("line traced %d times, stored %d times: %.160s", n, want[k], k)
		}
	}

	for name, p := range map[string]*supervised{"bridge": bridge, "gaps": gapsProc, "trace ta": traces["ta"], "trace tb": traces["tb"]} {
		if err := p.stop(syscall.SIGTERM); err != nil {
			t.Errorf("%s exit: %v", name, err)
		}
		// What the faults made a component exit with (a unit restart each), for the report.
		for _, f := range p.failed() {
			t.Logf("%s failed and was restarted: %s", name, f)
		}
		// How often a member found its partition stream's source stalled and had its leader moved.
		p.mu.Lock()
		for _, r := range p.runs {
			if n := strings.Count(r.Output(), "source has been inactive"); n > 0 {
				t.Logf("%s: %d partition stream leader step-downs asked for a stalled source", name, n)
			}
		}
		p.mu.Unlock()
	}
	if want := uint64(ranks) * perRank; uint64(len(stored)+missing) != want {
		t.Errorf("stored %d + named missing %d != sent %d", len(stored), missing, want)
	}
	if n := len(traces["ta"].failed()); n < 1 {
		t.Errorf("trace ta: %d failed runs, want at least the SIGKILLed one", n)
	}
	t.Logf("%v: %d FPMs stored and traced, %d gap events naming %d missing", time.Since(t0).Round(time.Millisecond), len(stored), len(evs), missing)
}
