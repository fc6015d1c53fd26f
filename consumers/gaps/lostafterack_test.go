package gaps

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// TestReportCountsLostAfterAck: the bridge's lost_after_ack event (streams.LostAfterAck, published on
// the publisher's gap subject) reads as a gap Event, and `gaps report` counts it, with and without
// --since, next to the detector's own causes.
func TestReportCountsLostAfterAck(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	start := time.Now()
	t0 := start.UnixMilli()
	k := key("lost", 0)
	publishAll(t, env.JS, fpms(k, 0, 9, t0, t0)...)
	h := startDetector(t, env.Server.ClientURL(), testConfig())
	consumerDone(t, env.JS, streams.StreamFPM, defaultGroup)
	check(t, h.stop() == nil, "stop")

	first, last := uint64(10), uint64(14)
	lost := &streams.LostAfterAck{GapEventFields: streams.GapEventFields{Schema: streams.GapEventSchema, Type: streams.GapEventType,
		ID: streams.LostAfterAckMsgID(k, t0, first, last), Key: k, Cause: streams.GapCauseLostAfterAck, Epoch: t0,
		FirstMissing: &first, LastMissing: &last, Missing: 5,
		Before: &streams.GapPoint{Seq: 9, ObservedAtMs: t0, Epoch: t0, Bridge: "b"}},
		Evidence: streams.LostAfterAckEvidence{Summary: "5 FPMs lost", Bridge: "b", AckedBy: "b", CountExact: true}}
	publishAll(t, env.JS, lost.Msg())

	evs := storedEvents(t, env.JS)
	equal(t, 1, len(evs))
	e := evs[0]
	equal(t, EventSchema, e.Schema)
	equal(t, TypeGap, e.Type)
	equal(t, streams.GapCauseLostAfterAck, e.Cause)
	equal(t, k, e.Key)
	equal(t, t0, e.Epoch)
	equal(t, uint64(5), e.Missing)
	check(t, e.FirstMissing != nil && *e.FirstMissing == 10 && e.LastMissing != nil && *e.LastMissing == 14, "range %v-%v", e.FirstMissing, e.LastMissing)
	check(t, e.Before != nil && e.Before.Seq == 9, "before %+v", e.Before)
	equal(t, "5 FPMs lost", e.Evidence.Summary)
	equal(t, lost.Msg().Subject, e.Subject())

	for _, since := range []time.Time{{}, start.Add(-time.Minute)} {
		rep, err := BuildReport(context.Background(), env.JS, ReportConfig{Since: since})
		check(t, err == nil, "report: %v", err)
		equal(t, 1, len(rep.Publishers))
		p := rep.Publishers[0]
		equal(t, k, p.Key)
		equal(t, uint64(10), p.Messages)
		equal(t, uint64(1), p.LostAfterAckGaps)
		equal(t, uint64(5), p.LostAfterAckMissing)
		equal(t, CauseCounts{}, p.Gaps)
		equal(t, uint64(1), p.GapsTotal)
		equal(t, uint64(5), p.MissingTotal)
		check(t, p.LossPercent > 33.33 && p.LossPercent < 33.34, "loss %v", p.LossPercent)
		var sb strings.Builder
		check(t, rep.WriteText(&sb) == nil, "text")
		check(t, strings.Contains(sb.String(), "LOST_AFTER_ACK") && strings.Contains(sb.String(), " 1/5 "), "text report:\n%s", sb.String())
	}
}
