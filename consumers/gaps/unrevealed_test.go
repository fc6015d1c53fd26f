package gaps

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

func TestDropUnrevealedCountsOnlyNumbersNoGapEventCanName(t *testing.T) {
	t.Parallel()
	const e1, e2, e3 = 1000, 2000, 3000
	mk := func(epoch int64, first, last uint64) streams.DropMarker {
		return streams.DropMarker{Epoch: epoch, FirstSeq: first, LastSeq: last, Count: last - first + 1}
	}
	// The current run began at epoch e2 and has got to 99.
	cur := &state{Started: true, Run: runSummary{FirstEpoch: e2, LastEpoch: e2}, MaxEpoch: e2, Last: point{Seq: 99, Epoch: e2}}
	ended := []endedRun{{firstEpoch: e1, lastEpoch: e1 + 5, lastSeq: 49}} // a restart ended e1's run at 49
	lateTail := &state{Started: true, Run: cur.Run, MaxEpoch: e2, Last: cur.Last,
		Epochs: []epochSeen{{Epoch: e1 + 5, Seen: [][2]uint64{{0, 54}}, RunLast: &point{Seq: 54, Epoch: e1 + 5}}}}
	// Another bridge stored numbers 0-5 of a run under its own epoch, 200 ms from the marker's (the two
	// bridges did not agree on the run); an epoch 600 ms away is another run.
	otherBridge := &state{Started: true, Run: cur.Run, MaxEpoch: e2, Last: cur.Last,
		Epochs: []epochSeen{{Epoch: e3 + 200, Seen: [][2]uint64{{0, 5}}}, {Epoch: e3 + 600, Seen: [][2]uint64{{6, 7}}}}}
	// The other bridge joined the run 750 ms after the marker's bridge received its 3 (its epoch is its
	// receive time of 18): it stored 18-39 and a gap event named 0-17 under its epoch. The next run
	// began after the marker's last number was received.
	joinedLater := &state{Started: true, Run: cur.Run, MaxEpoch: e2, Last: cur.Last,
		Epochs: []epochSeen{{Epoch: e3 + 750, Seen: [][2]uint64{{0, 39}}}, {Epoch: e3 + 1900, Seen: [][2]uint64{{0, 60}}}}}
	// The other bridge was in the run all along, under an older epoch (its copies received from 900 ms
	// before the marker's first to 2 s after), while the marker's bridge, starting, recorded the run
	// anew and dropped 50-59 of it at its stop; or that run was ended by a restart before the marker's
	// first, and a stalled bridge received its numbers late.
	allAlong := &state{Started: true, Run: cur.Run, MaxEpoch: e2, Last: cur.Last,
		Epochs: []epochSeen{{Epoch: e3 - 900, Seen: [][2]uint64{{0, 99}}, First: &point{Seq: 0, ObservedAtMs: e3 - 900}, LastAtMs: e3 + 2000}}}
	endedBeforeIt := []endedRun{{firstEpoch: e3 - 900, lastEpoch: e3 - 900, lastSeq: 99, nextBeganMs: e3 - 100}}
	received := func(m streams.DropMarker, firstMs, lastMs int64) streams.DropMarker {
		m.FirstReceivedAtMs, m.LastReceivedAtMs = firstMs, lastMs
		return m
	}
	for name, tc := range map[string]struct {
		markers []streams.DropMarker
		st      *state
		ended   []endedRun
		want    uint64
	}{
		"none":                                            {st: cur, want: 0},
		"below the last number seen: a gap's":             {markers: []streams.DropMarker{mk(e2, 10, 20)}, st: cur, want: 0},
		"after the last number seen":                      {markers: []streams.DropMarker{mk(e2, 100, 149)}, st: cur, want: 50},
		"across the last number seen":                     {markers: []streams.DropMarker{mk(e2, 90, 109)}, st: cur, want: 10},
		"overlapping markers count once":                  {markers: []streams.DropMarker{mk(e2, 100, 149), mk(e2, 120, 159), mk(e2, 160, 160)}, st: cur, want: 61},
		"a newer epoch nothing was seen of":               {markers: []streams.DropMarker{mk(e3, 0, 9)}, st: cur, want: 10},
		"an ended run's tail":                             {markers: []streams.DropMarker{mk(e1+3, 40, 59)}, st: cur, ended: ended, want: 10},
		"an ended run's numbers it had got past":          {markers: []streams.DropMarker{mk(e1, 0, 49)}, st: cur, ended: ended, want: 0},
		"a run between known ones, never seen":            {markers: []streams.DropMarker{mk(e1+500, 0, 4)}, st: cur, ended: ended, want: 5},
		"older than every run known":                      {markers: []streams.DropMarker{mk(e1-1, 0, 4)}, st: cur, ended: ended, want: 0},
		"a publisher nothing was ever stored of":          {markers: []streams.DropMarker{mk(e1, 0, 9), mk(e1, 5, 14)}, want: 15},
		"same numbers of two runs count for both":         {markers: []streams.DropMarker{mk(e2, 100, 109), mk(e3, 100, 109)}, st: cur, want: 20},
		"a run another bridge stored under its own epoch": {markers: []streams.DropMarker{mk(e3, 0, 9)}, st: otherBridge, want: 4},
		"a run another bridge joined later stored under its own epoch": {
			markers: []streams.DropMarker{received(mk(e3, 3, 39), e3, e3+1800), received(mk(e3, 40, 44), e3+1850, e3+1890)}, st: joinedLater, want: 5},
		"a run another bridge was in all along, under an older epoch": {
			markers: []streams.DropMarker{received(mk(e3, 50, 59), e3, e3+450)}, st: allAlong, want: 0},
		"a run a restart ended before the marker's first, its numbers received late": {
			markers: []streams.DropMarker{received(mk(e3, 50, 59), e3, e3+450)}, st: allAlong, ended: endedBeforeIt, want: 10},
		// e1's run got to 54 with FPMs stored after the next run began (its old_run says 49).
		"an ended run's tail, past its last FPMs stored late": {markers: []streams.DropMarker{mk(e1+3, 40, 59)}, st: lateTail, ended: ended, want: 5},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			equal(t, tc.want, dropUnrevealed(tc.markers, tc.st, tc.ended))
		})
	}
}

// TestReportCountsDropsAfterTheLastFPMOfARun: a bridge dropped the last numbers of a run (its drop
// marker stored, no later FPM): no gap event can name them, and the report counts them as missing all
// the same (never 0 %). When a later FPM reveals the gap, the gap event names them instead, and they
// are counted once.
func TestReportCountsDropsAfterTheLastFPMOfARun(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	start := time.Now()
	t0 := start.UnixMilli()
	k := key("tail", 0)
	publishAll(t, env.JS, fpms(k, 0, 9, t0, t0)...)
	publishAll(t, env.JS, markerMsg(k, t0, 10, 14, "buffer_full"))
	h := startDetector(t, env.Server.ClientURL(), testConfig())
	consumerDone(t, env.JS, streams.StreamFPM, defaultGroup)
	check(t, h.stop() == nil, "stop")

	report := func() PublisherReport {
		t.Helper()
		rep, err := BuildReport(context.Background(), env.JS, ReportConfig{})
		check(t, err == nil, "report: %v", err)
		equal(t, 1, len(rep.Publishers))
		return rep.Publishers[0]
	}
	p := report()
	equal(t, uint64(10), p.Messages)
	equal(t, uint64(5), p.DroppedUnrevealed)
	equal(t, uint64(5), p.MissingTotal)
	check(t, p.LossPercent > 33.33 && p.LossPercent < 33.34, "loss %v, want 5/15", p.LossPercent)
	rep, err := BuildReport(context.Background(), env.JS, ReportConfig{})
	check(t, err == nil, "report: %v", err)
	var sb strings.Builder
	check(t, rep.WriteText(&sb) == nil, "text")
	check(t, strings.Contains(sb.String(), "5 FPM(s) dropped by a bridge after the last one seen of their run"), "text report:\n%s", sb.String())

	// The publisher goes on: FPM 20 reveals 10-19, 10-14 covered by the marker.
	publishAll(t, env.JS, fpms(k, 20, 20, t0, t0+1000)...)
	h = startDetector(t, env.Server.ClientURL(), testConfig())
	waitEvents(t, env.JS, 2, 10*time.Second)
	consumerDone(t, env.JS, streams.StreamFPM, defaultGroup)
	check(t, h.stop() == nil, "stop")
	p = report()
	equal(t, uint64(0), p.DroppedUnrevealed)
	equal(t, CauseCounts{BridgeDrop: 5, ZMQDrop: 5}, p.Missing)
	equal(t, uint64(10), p.MissingTotal)
}

// TestRestartAfterDroppedTailNamesTheNumbersBeforeTheMarker: a bridge was killed after FPM 9 of a run,
// a new bridge (epoch e2) received 15-19 and stopped before it could store them (its drop marker is
// stored), then the publisher restarted. The markers say the old run got to 19: 15-19 are the bridge's
// drops and 10-14, sent while no bridge was subscribed, are named too (never counted nowhere), each
// number once.
func TestRestartAfterDroppedTailNamesTheNumbersBeforeTheMarker(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	t0 := time.Now().UnixMilli()
	e1, e2, e3 := t0, t0+1000, t0+2000
	k := key("killedtail", 0)
	publishAll(t, env.JS, fpms(k, 0, 9, e1, e1)...)
	publishAll(t, env.JS, markerMsg(k, e2, 15, 19, "shutdown"))
	publishAll(t, env.JS, fpms(k, 0, 4, e3, e3)...)
	h := startDetector(t, env.Server.ClientURL(), testConfig())
	waitEvents(t, env.JS, 3, 10*time.Second) // the restart, and the old run's tail in two causes
	consumerDone(t, env.JS, streams.StreamFPM, defaultGroup)
	check(t, h.stop() == nil, "stop")

	named := map[uint64]int{}
	for _, e := range storedEvents(t, env.JS) {
		if e.Type != TypeGap || e.FirstMissing == nil || e.Cause == CausePublisherRestart {
			continue
		}
		for q := *e.FirstMissing; q <= *e.LastMissing; q++ {
			named[q]++
		}
	}
	for q := uint64(10); q <= 19; q++ {
		equal(t, 1, named[q])
	}
	equal(t, 10, len(named))
	rep, err := BuildReport(context.Background(), env.JS, ReportConfig{})
	check(t, err == nil, "report: %v", err)
	equal(t, 1, len(rep.Publishers))
	p := rep.Publishers[0]
	equal(t, uint64(0), p.DroppedUnrevealed)
	equal(t, CauseCounts{BridgeDrop: 5, ZMQDrop: 5}, p.Missing)
	equal(t, uint64(10), p.MissingTotal)
}
