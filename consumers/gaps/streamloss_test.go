package gaps

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// The durable consumers' loss events (messages a stream removed before they were read, and trace lines
// pruned with their segments) are in the report, summed per consumer, stream and cause, in JSON and
// text; a pruned segment whose stream sequences the writer did not know leaves the bounds alone.
func TestReportIncludesStreamLosses(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	for _, l := range []streams.ConsumerLoss{
		{Event: "loss", Cause: streams.LossRetention, Consumer: "trace", Stream: streams.StreamFPM, First: 31, Last: 50, Count: 20},
		{Event: "loss", Cause: streams.LossRetention, Consumer: "trace", Stream: streams.StreamFPM, First: 101, Last: 110, Count: 10},
		{Event: "loss", Cause: streams.LossDeleted, Consumer: "trace", Stream: streams.StreamFPM, First: 60, Last: 62, Count: 3},
		{Event: "loss", Cause: streams.LossRetention, Consumer: "gaps", Stream: streams.StreamFPM, First: 1, Last: 5, Count: 5},
		{Event: "loss", Cause: streams.LossPruned, Consumer: "trace", Stream: streams.StreamFPM, First: 200, Last: 399, Count: 100, Segment: "/t/fpm.w.000000.jsonl.gz"},
		{Event: "loss", Cause: streams.LossPruned, Consumer: "trace", Stream: streams.StreamFPM, Count: 40, Segment: "/t/fpm.v.000000.jsonl.gz"},
		{Event: "loss", Cause: streams.LossPruned, Consumer: "trace", Stream: streams.StreamFPM, First: 150, Last: 180, Count: 31, Segment: "/t/fpm.w.000001.jsonl.gz"},
	} {
		body, _ := json.Marshal(l)
		m := nats.NewMsg(streams.ConsumerLossSubject(l.Consumer))
		m.Data = body
		if _, err := env.JS.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := BuildReport(context.Background(), env.JS, ReportConfig{})
	if err != nil {
		t.Fatal(err)
	}
	want := []StreamLoss{
		{Consumer: "gaps", Stream: streams.StreamFPM, Cause: streams.LossRetention, Ranges: 1, Messages: 5, FirstSeq: 1, LastSeq: 5},
		{Consumer: "trace", Stream: streams.StreamFPM, Cause: streams.LossDeleted, Ranges: 1, Messages: 3, FirstSeq: 60, LastSeq: 62},
		{Consumer: "trace", Stream: streams.StreamFPM, Cause: streams.LossPruned, Ranges: 3, Messages: 171, FirstSeq: 150, LastSeq: 399},
		{Consumer: "trace", Stream: streams.StreamFPM, Cause: streams.LossRetention, Ranges: 2, Messages: 30, FirstSeq: 31, LastSeq: 110},
	}
	equal(t, len(want), len(rep.StreamLosses))
	for i := range want {
		equal(t, want[i], rep.StreamLosses[i])
	}
	var text strings.Builder
	check(t, rep.WriteText(&text) == nil, "write text")
	check(t, strings.Contains(text.String(), "consumer trace: 30 message(s) of FPM removed (retention) before it read them, in 2 range(s) between stream sequences 31 and 110"),
		"text report:\n%s", text.String())
	check(t, strings.Contains(text.String(), "consumer trace: 171 line(s) removed from its output with 3 segment(s) pruned by its retention (--max-segments), of messages of FPM between stream sequences 150 and 399"),
		"text report:\n%s", text.String())
}
