package gaps

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// repullMarkers makes the server look for the next drop marker of the detector's marker consumer
// now, as the consumer's own pull requests do when they expire (every 30 s) or after a reconnect: a
// pull request that waits 200 ms for a marker (none may be stored: it would be delivered here).
func repullMarkers(t testing.TB, env *natsservertest.Env, cfg Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := env.JS.Stream(ctx, streams.StreamEvents)
	check(t, err == nil, "stream: %v", err)
	var names []string
	for ci := range s.ListConsumers(ctx).Info() {
		if ci.Config.Durable == "" && ci.Config.FilterSubject == cfg.MarkerFilter() {
			names = append(names, ci.Name)
		}
	}
	check(t, len(names) == 1, "drop marker consumers on %s: %v", streams.StreamEvents, names)
	resp, err := env.NC.RequestWithContext(ctx, "$JS.API.CONSUMER.MSG.NEXT."+streams.StreamEvents+"."+names[0], []byte(`{"batch":1,"expires":200000000}`))
	check(t, err == nil, "pull: %v", err)
	check(t, resp.Header.Get("Status") == "408", "pull on the drop marker consumer: status %q, %q", resp.Header.Get("Status"), resp.Data)
}

// TestDetectorClassifiesAfterItsMarkerConsumerMovedOn: the marker consumer only matches drop
// markers, and the server moves its stream position past the detector's own gap events whenever it
// looks for the next marker. Gaps revealed after that must still be classified zmq_drop once their
// grace has passed, in every run of the publisher (a restart in between).
func TestDetectorClassifiesAfterItsMarkerConsumerMovedOn(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig()
	t0 := time.Now().UnixMilli()
	k := key("moved-on", 0)
	publishAll(t, env.JS, append(fpms(k, 0, 9, t0, t0), fpms(k, 11, 20, t0, t0+200)...)...)
	startDetector(t, env.Server.ClientURL(), cfg)
	by := waitEvents(t, env.JS, 1, 10*time.Second)
	match(t, k, by[k], gapW(CauseZMQDrop, 10, 10))

	repullMarkers(t, env, cfg) // the consumer's stream position is now past the stored event
	var msgs []*nats.Msg
	msgs = append(msgs, fpms(k, 21, 30, t0, t0+400)...)
	msgs = append(msgs, fpms(k, 32, 40, t0, t0+600)...)     // 31 skipped
	msgs = append(msgs, fpms(k, 0, 4, t0+1000, t0+1000)...) // a restart
	msgs = append(msgs, fpms(k, 6, 9, t0+1000, t0+1100)...) // 5 skipped
	publishAll(t, env.JS, msgs...)
	by = waitEvents(t, env.JS, 4, 10*time.Second)
	match(t, k, by[k], gapW(CauseZMQDrop, 10, 10), want{TypeGap, CausePublisherRestart, -1, -1, 0, -1},
		gapW(CauseZMQDrop, 31, 31), gapW(CauseZMQDrop, 5, 5))
	equal(t, t0, by[k][2].Epoch)
	equal(t, t0+1000, by[k][3].Epoch)
}

// TestDetectorReportsALateStart: a publisher first seen at seq 1310 (the bridge subscribed after it
// had sent 1310 messages) has a late_start gap of 0-1309, counted in the report's loss.
func TestDetectorReportsALateStart(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	start := time.Now()
	t0 := start.UnixMilli()
	k := key("late", 0)
	publishAll(t, env.JS, fpms(k, 1310, 5001, t0, t0)...)
	h := startDetector(t, env.Server.ClientURL(), testConfig())
	by := waitEvents(t, env.JS, 1, 10*time.Second)
	match(t, k, by[k], gapW(CauseLateStart, 0, 1309))
	e := by[k][0]
	check(t, e.Before == nil && e.After.Seq == 1310 && e.After.Epoch == t0 && *e.Evidence.FirstSeenSeq == 1310 &&
		e.Evidence.SubscribedByMs == t0, "late_start event %+v, evidence %+v", e, e.Evidence)
	equal(t, uint64(5002), delivered(t, env.JS, k)+missingOf(by[k]), "delivered + missing != sent")
	equal(t, 1310.0, h.metric("fpmbus_gaps_missing_messages_total", "cause", CauseLateStart))
	consumerDone(t, env.JS, streams.StreamFPM, defaultGroup)
	check(t, h.stop() == nil, "stop")

	for _, since := range []time.Time{{}, start.Add(-time.Minute)} {
		rep, err := BuildReport(context.Background(), env.JS, ReportConfig{Since: since})
		check(t, err == nil, "report: %v", err)
		equal(t, 1, len(rep.Publishers))
		p := rep.Publishers[0]
		equal(t, uint64(3692), p.Messages)
		equal(t, CauseCounts{LateStart: 1}, p.Gaps)
		equal(t, CauseCounts{LateStart: 1310}, p.Missing)
		equal(t, uint64(1310), p.MissingTotal)
		check(t, p.LossPercent > 26.189 && p.LossPercent < 26.190, "loss %v, want 1310/5002", p.LossPercent)
		var sb strings.Builder
		check(t, rep.WriteText(&sb) == nil, "text")
		lines := strings.Split(sb.String(), "\n")
		check(t, len(lines) > 2 && strings.Contains(lines[1], "LATE_START") && strings.Contains(lines[2], " 1/1310 ") &&
			strings.Contains(lines[2], fmt.Sprintf(" %.3f ", p.LossPercent)), "text report:\n%s", sb.String())
	}
}

// TestDetectorWaitsForTheMarkerOfARestartStoredAfterItsFPM: a bridge saw the publisher restart while
// its store refused writes, dropped the new run's first numbers at its stop and spooled their drop
// marker; started again, it stored its first FPM of the run (no run start: a bridge's first run of
// the publisher) before the spooled marker, and the detector read the FPM first. The detector waits
// for the markers stored about when the FPM was: the marker shows the restart, and the new run's
// numbers before its first FPM are named under it, not as a jump of the old run.
func TestDetectorWaitsForTheMarkerOfARestartStoredAfterItsFPM(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig()
	cfg.MarkerGrace = 5 * time.Second // the marker is stored well within it, however loaded the machine
	startDetector(t, env.Server.ClientURL(), cfg)
	t0 := time.Now().UnixMilli()
	k := key("spooled", 0)
	publishAll(t, env.JS, fpms(k, 0, 39, t0, t0)...)
	publishAll(t, env.JS, fpms(k, 60, 70, t0+3000, t0+3000)...)
	consumerDone(t, env.JS, streams.StreamFPM, defaultGroup) // the detector has read the new FPMs
	publishAll(t, env.JS, markerMsg(k, t0, 40, 45, "shutdown"), markerMsg(k, t0+1000, 0, 9, "shutdown"))
	by := waitEvents(t, env.JS, 3, 30*time.Second)
	match(t, k, by[k], gapW(CauseBridgeDrop, 40, 45), want{TypeGap, CausePublisherRestart, 10, 59, 50, -1}, gapW(CauseBridgeDrop, 0, 9))
	equal(t, t0+3000, by[k][1].Epoch)
	equal(t, uint64(40+11+6+50+10), delivered(t, env.JS, k)+missingOf(by[k]), "delivered + missing != sent")
}

// TestDetectorNamesARestartADropMarkerShowsLate: the same drop marker stored only long after the
// restarted bridge's first FPM (the bridge that spooled it started again much later), past the marker
// grace: the jump is classified without it, and the marker, when it comes, names the new run's
// numbers that were taken for the old run's, so that every number sent is stored or named.
func TestDetectorNamesARestartADropMarkerShowsLate(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	startDetector(t, env.Server.ClientURL(), testConfig())
	t0 := time.Now().UnixMilli()
	k := key("spooled-late", 0)
	publishAll(t, env.JS, fpms(k, 0, 39, t0, t0)...)
	publishAll(t, env.JS, fpms(k, 60, 70, t0+3000, t0+3000)...)
	by := waitEvents(t, env.JS, 1, 30*time.Second)
	match(t, k, by[k], gapW(CauseZMQDrop, 40, 59))
	publishAll(t, env.JS, markerMsg(k, t0+1000, 0, 9, "shutdown"))
	by = waitEvents(t, env.JS, 3, 30*time.Second)
	match(t, k, by[k], gapW(CauseZMQDrop, 40, 59), gapW(CauseBridgeDrop, 0, 9), gapW(CausePublisherRestart, 10, 39))
	equal(t, t0+1000, by[k][2].Epoch)
	equal(t, uint64(40+71), delivered(t, env.JS, k)+missingOf(by[k]), "delivered + missing != sent")
}
