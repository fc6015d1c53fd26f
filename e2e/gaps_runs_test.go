package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/streams"
)

// These tests follow publisher runs (epochs) end to end: scripted Dynamo publishers in the test
// process, the real `fpmbus bridge` and `fpmbus gaps` processes and `fpmbus gaps report`.

// gapsReport runs `fpmbus gaps report --json` and decodes its report.
func gapsReport(t *testing.T, url string) *gaps.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, fpmbusBin, "gaps", "report", "--server", url, "--json")
	cmd.Env = testEnv(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("gaps report: %v\n%s", err, out)
	}
	var r gaps.Report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("gaps report output %q: %v", out, err)
	}
	return &r
}

// reportOf is k's line of r.
func reportOf(t *testing.T, r *gaps.Report, k streams.Key) gaps.PublisherReport {
	t.Helper()
	for _, p := range r.Publishers {
		if p.Key == k {
			return p
		}
	}
	t.Fatalf("gaps report has no line for %s: %+v", k, r.Publishers)
	return gaps.PublisherReport{}
}

// pacedRun sends n numbers on every publisher, round robin, at rate messages per second per
// publisher, skipping (never sending) each number q with skip(q).
func pacedRun(pubs []*rankPublisher, n int, rate float64, skip func(uint64) bool) {
	start := time.Now()
	every := time.Duration(float64(time.Second) / rate)
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * every)); d > 0 {
			time.Sleep(d)
		}
		for _, p := range pubs {
			if skip(p.Sent()) {
				p.Skip()
			} else {
				p.Send(false)
			}
		}
	}
}

// repullMarkers makes the server look for the next drop marker of the detector's marker consumer
// now, as the consumer's own pull requests do when they expire (every 30 s) or after a reconnect: a
// pull request that waits 200 ms. No marker may be stored (it would be delivered here).
func repullMarkers(t *testing.T, env *natsservertest.Env) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := env.JS.Stream(ctx, streams.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for ci := range s.ListConsumers(ctx).Info() {
		if ci.Config.Durable == "" && ci.Config.FilterSubject == streams.DropMarkerWildcard {
			names = append(names, ci.Name)
		}
	}
	if len(names) != 1 {
		t.Fatalf("%d drop marker consumers on %s: %v", len(names), streams.StreamEvents, names)
	}
	resp, err := env.NC.RequestWithContext(ctx, "$JS.API.CONSUMER.MSG.NEXT."+streams.StreamEvents+"."+names[0], []byte(`{"batch":1,"expires":200000000}`))
	if err != nil {
		t.Fatal(err)
	}
	if st := resp.Header.Get("Status"); st != "408" {
		t.Fatalf("pull on the drop marker consumer: status %q, %q (a marker was stored?)", st, resp.Data)
	}
}

// runEvents splits k's events by epoch: the gap events (any cause but publisher_restart) sorted by
// first missing number, and the publisher_restart events.
func runEvents(evs []gaps.Event, k streams.Key) (byEpoch map[int64][]gaps.Event, restarts []gaps.Event) {
	byEpoch = map[int64][]gaps.Event{}
	for _, e := range evs {
		if e.Key != k {
			continue
		}
		if e.Cause == gaps.CausePublisherRestart {
			restarts = append(restarts, e)
			continue
		}
		byEpoch[e.Epoch] = append(byEpoch[e.Epoch], e)
	}
	for _, es := range byEpoch {
		slices.SortFunc(es, func(a, b gaps.Event) int { return cmp.Compare(*a.FirstMissing, *b.FirstMissing) })
	}
	return byEpoch, restarts
}

// TestGapDetectorSkipsAcrossPublisherRestart: two ranks of a Dynamo-like publisher at 1,000 FPM/s
// skip every 97th number (lost before the socket: no drop marker) and restart at 1,500 (new sockets
// on the same ports, numbering from 0). Every skipped number of both runs is one zmq_drop event of its
// run's epoch, each restart one publisher_restart event with nothing missing, and `gaps report`
// holds no pending gap. Between the runs the detector's drop marker consumer pulls anew (as it does
// every 30 s), which moves the server's position for it past the gap events already stored: the
// gaps revealed after that (the first run's last ones, all of the second run's) must be classified
// all the same, although no drop marker ever comes.
func TestGapDetectorSkipsAcrossPublisherRestart(t *testing.T) {
	t.Parallel()
	const (
		worker      = "e2e-gap-restart"
		ranks       = 2
		perRun      = 1500
		rate        = 1000.0
		skipEvery   = 97
		markerGrace = time.Second
	)
	skip := func(q uint64) bool { return q%skipEvery == skipEvery-1 }
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	base := producertest.FreeBasePort(t, "127.0.0.1", ranks)
	var pubs []*rankPublisher
	for r := range ranks {
		pubs = append(pubs, newRankPublisher(t, base, r, worker, false))
	}
	startBridge(t, "bridge", url, base, ranks, "--bridge-id", "e2e-gaps-bridge")
	for _, p := range pubs {
		p.WaitSubscribed()
	}
	startGaps(t, "fpmbus gaps", gapsArgs(url, fmt.Sprintf("127.0.0.1:%d", freePort(t)), markerGrace.String()))
	start := time.Now()

	pacedRun(pubs, perRun, rate, skip)
	eventually(t, 10*time.Second, func() error {
		if n, err := streamCount(t, env.JS, streams.StreamEvents); err != nil || n == 0 {
			return fmt.Errorf("no gap event stored yet (%v)", err)
		}
		return nil
	})
	repullMarkers(t, env)
	skipped := make([][][]uint64, ranks) // per rank and run, the numbers skipped
	for r, p := range pubs {
		skipped[r] = append(skipped[r], p.Lost())
		p.Close()
	}
	// The restart: new sockets on the same ports, numbering from 0.
	for r := range pubs {
		pubs[r] = newRankPublisher(t, base, r, worker, false)
	}
	for _, p := range pubs {
		p.WaitSubscribed()
	}
	pacedRun(pubs, perRun, rate, skip)
	for r, p := range pubs {
		skipped[r] = append(skipped[r], p.Lost())
	}
	t.Logf("%v: two runs of %d numbers sent on %d ranks", time.Since(start).Round(time.Millisecond), perRun, ranks)

	total := 0
	for r := range ranks {
		total += len(skipped[r][0]) + len(skipped[r][1]) + 1 // + the publisher_restart event
	}
	evs := waitEventCount(t, env.JS, total, 20*time.Second)
	if len(evs) != total {
		t.Fatalf("%d gap events stored, want %d: %s", len(evs), total, describeEvents(evs))
	}
	t.Logf("%v: %d gap events stored", time.Since(start).Round(time.Millisecond), len(evs))
	for r, p := range pubs {
		byEpoch, restarts := runEvents(evs, p.key)
		if len(restarts) != 1 || restarts[0].Missing != 0 {
			t.Fatalf("%s: publisher_restart events %s", p.key, describeEvents(restarts))
		}
		rs := restarts[0]
		if rs.Evidence.OldRun == nil || rs.Evidence.OldRun.LastSeq != perRun-1 || rs.Before.Seq != perRun-1 || rs.After.Seq != 0 ||
			rs.Before.Epoch >= rs.After.Epoch {
			t.Fatalf("%s: restart event %+v", p.key, rs)
		}
		if len(byEpoch) != 2 {
			t.Fatalf("%s: gap events under %d epochs, want the two runs'", p.key, len(byEpoch))
		}
		var missing uint64
		for i, epoch := range []int64{rs.Before.Epoch, rs.After.Epoch} {
			var got []uint64
			for _, e := range byEpoch[epoch] {
				if e.Cause != gaps.CauseZMQDrop || e.Missing != 1 || *e.FirstMissing != *e.LastMissing ||
					e.Before.Seq+2 != e.After.Seq || e.Before.Epoch != epoch || e.After.Epoch != epoch {
					t.Fatalf("%s run %d: event %s (%s, %d missing, %d..%d), want one zmq_drop per skipped number", p.key, i, e.ID, e.Cause, e.Missing, e.Before.Seq, e.After.Seq)
				}
				got = append(got, *e.FirstMissing)
				missing += e.Missing
			}
			if want := skipped[r][i]; !slices.Equal(got, want) {
				t.Fatalf("%s run %d (epoch %d): zmq_drop events for %v, skipped %v", p.key, i, epoch, got, want)
			}
		}
		stored := uint64(len(storedFPMs(t, env.JS, streams.FPMSubject(p.key))))
		if stored+missing != 2*perRun {
			t.Fatalf("%s: delivered %d + reported missing %d != sent %d", p.key, stored, missing, 2*perRun)
		}
	}
	// `gaps report` from the detector's checkpoints: nothing pending, the loss is the skipped numbers.
	eventually(t, 15*time.Second, func() error {
		rep := gapsReport(t, url)
		for r, p := range pubs {
			pr := reportOf(t, rep, p.key)
			lost := uint64(len(skipped[r][0]) + len(skipped[r][1]))
			if pr.PendingGaps != 0 || pr.Messages != 2*perRun-lost || pr.Missing != (gaps.CauseCounts{ZMQDrop: lost}) ||
				pr.Gaps != (gaps.CauseCounts{ZMQDrop: lost, PublisherRestart: 1}) || pr.Restarts != 1 {
				return fmt.Errorf("%s: gaps report %+v, want %d messages, %d zmq_drop gaps, 1 restart, none pending", p.key, pr, 2*perRun-lost, lost)
			}
			if want := float64(lost) * 100 / (2 * perRun); math.Abs(pr.LossPercent-want) > 1e-9 {
				return fmt.Errorf("%s: loss %v%%, want %v%%", p.key, pr.LossPercent, want)
			}
		}
		return nil
	})
}

// TestGapDetectorLateStart: a publisher at 1,000 FPM/s starts before the bridge (it sends about a
// second's worth before the bridge process even starts, and on while the bridge connects). The
// numbers sent before the bridge was subscribed are one late_start gap, 0 up to the first number
// stored, with that number and the run's epoch as evidence, and `gaps report` counts them as lost.
func TestGapDetectorLateStart(t *testing.T) {
	t.Parallel()
	const (
		worker          = "e2e-gap-late"
		total           = 5002
		rate            = 1000.0
		beforeTheBridge = 1000
	)
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	base := producertest.FreeBasePort(t, "127.0.0.1", 1)
	pub := newRankPublisher(t, base, 0, worker, false)
	startGaps(t, "fpmbus gaps", gapsArgs(url, fmt.Sprintf("127.0.0.1:%d", freePort(t)), "1s"))

	// The publisher runs from the start; the bridge process starts after its first 1,000 numbers and
	// subscribes while it goes on.
	never := func(uint64) bool { return false }
	pacedRun([]*rankPublisher{pub}, beforeTheBridge, rate, never)
	bridge := fpmbus(t, "bridge", "bridge", "--server", url, "--fpm-port", strconv.Itoa(base), "--dp-size", "1",
		"--bridge-id", "e2e-gaps-bridge")
	pacedRun([]*rankPublisher{pub}, total-beforeTheBridge, rate, never)
	bridge.waitOutput("bridge ready", 30*time.Second)
	if len(pub.Lost()) != 0 || pub.Sent() != total {
		t.Fatalf("publisher sent %d, libzmq refused %d", pub.Sent(), len(pub.Lost()))
	}

	// What reached the bridge: every number from the first one stored on.
	var first uint64
	var epoch string
	eventually(t, 20*time.Second, func() error {
		fpms := storedFPMs(t, env.JS, streams.FPMSubject(pub.key))
		if len(fpms) == 0 {
			return fmt.Errorf("nothing stored")
		}
		first, epoch = fpms[0].seq, fpms[0].epoch
		seen := map[uint64]bool{}
		for _, m := range fpms {
			if m.epoch != epoch || seen[m.seq] {
				t.Fatalf("seq %d stored twice, or under epochs %s and %s: one run, one bridge", m.seq, epoch, m.epoch)
			}
			seen[m.seq] = true
			first = min(first, m.seq)
		}
		if uint64(len(seen)) != total-first {
			return fmt.Errorf("%d of the %d numbers from %d on stored", len(seen), total-first, first)
		}
		return nil
	})
	if first < beforeTheBridge {
		t.Fatalf("seq %d stored, sent before the bridge started", first)
	}
	t.Logf("first stored seq %d of %d sent (%d sent before the bridge process started)", first, total, beforeTheBridge)

	evs := waitEventCount(t, env.JS, 1, 20*time.Second)
	if len(evs) != 1 {
		t.Fatalf("gap events %s, want one late_start", describeEvents(evs))
	}
	e := evs[0]
	if e.Cause != gaps.CauseLateStart || e.FirstMissing == nil || *e.FirstMissing != 0 || *e.LastMissing != first-1 || e.Missing != first ||
		e.Before != nil || e.After == nil || e.After.Seq != first || strconv.FormatInt(e.Epoch, 10) != epoch ||
		e.Evidence.FirstSeenSeq == nil || *e.Evidence.FirstSeenSeq != first || e.Evidence.SubscribedByMs != e.Epoch {
		b, _ := json.Marshal(e)
		t.Fatalf("late_start event for 0-%d (epoch %s) expected, got %s", first-1, epoch, b)
	}
	eventually(t, 15*time.Second, func() error {
		pr := reportOf(t, gapsReport(t, url), pub.key)
		if pr.PendingGaps != 0 || pr.Messages != total-first || pr.Missing != (gaps.CauseCounts{LateStart: first}) ||
			pr.Gaps != (gaps.CauseCounts{LateStart: 1}) || pr.MissingTotal != first {
			return fmt.Errorf("gaps report %+v, want %d messages and one late_start gap of %d", pr, total-first, first)
		}
		if want := float64(first) * 100 / total; math.Abs(pr.LossPercent-want) > 1e-9 {
			return fmt.Errorf("loss %v%%, want %v%%", pr.LossPercent, want)
		}
		return nil
	})
	out, err := run(t, 30*time.Second, fpmbusBin, "gaps", "report", "--server", url)
	if err != nil || !strings.Contains(out, "LATE_START") || !strings.Contains(out, fmt.Sprintf(" 1/%d ", first)) {
		t.Fatalf("gaps report (%v):\n%s", err, out)
	}
}
