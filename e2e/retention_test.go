package e2e

import (
	"context"
	"encoding/json"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// Loss to retention is counted, through the real binaries: `fpmbus trace` reads 400 FPMs and stops;
// 1,600 more arrive while FPM sits at an operator's limit of 1,000 messages, so the oldest 600 of them
// go before any trace writer reads them. The restarted writer reports exactly those (sequences
// 401..1000) as a retention loss event, writes the 1,000 the stream still holds, and `fpmbus gaps
// report --json` shows the loss.
func TestTraceWriterReportsRetentionLossThroughTheBinary(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	ctx := context.Background()
	out := filepath.Join(t.TempDir(), "trace", "fpm")
	args := []string{"trace", "--server", url, "--trace-mode", "full", "--trace-output", out, "--trace-flush-interval", "50ms"}
	fillFPM(t, env.JS, 400, 2, 2, 1_782_777_600_000)
	first := fpmbus(t, "fpmbus trace", args...)
	first.waitOutput("trace writer started", 30*time.Second)
	eventually(t, 30*time.Second, func() error { return consumerAcked(env.JS, streams.StreamFPM, "fpm-trace") })
	if err := first.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("trace writer exit: %v", err)
	}

	st, err := env.JS.Stream(ctx, streams.StreamFPM)
	if err != nil {
		t.Fatal(err)
	}
	sc := st.CachedInfo().Config
	sc.MaxMsgs = 1000 // the operator's limit: the stream keeps the newest 1,000
	if _, err := env.JS.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	fillFPMOffset(t, env.JS, 400, 1600, 2, 2, 1_782_777_600_000)

	second := fpmbus(t, "fpmbus trace (restarted)", args...)
	second.waitOutput("trace writer started", 30*time.Second)
	eventually(t, 30*time.Second, func() error { return consumerAcked(env.JS, streams.StreamFPM, "fpm-trace") })
	if err := second.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("trace writer exit: %v", err)
	}
	var losses []streams.ConsumerLoss
	for _, m := range natsservertest.Messages(t, env.JS, streams.StreamEvents, streams.ConsumerLossSubject("trace")) {
		var l streams.ConsumerLoss
		if err := json.Unmarshal(m.Data(), &l); err != nil {
			t.Fatal(err)
		}
		losses = append(losses, l)
	}
	if len(losses) != 1 || losses[0].Cause != streams.LossRetention || losses[0].First != 401 || losses[0].Last != 1000 || losses[0].Count != 600 {
		t.Fatalf("loss events %+v, want one retention loss of sequences 401..1000 (600)", losses)
	}
	if lines := traceLines(t, out+".*.jsonl.gz"); len(lines) != 1400 {
		t.Fatalf("trace has %d lines, want 1,400 (400 before, the 1,000 the stream kept)", len(lines))
	}

	report, err := run(t, 30*time.Second, fpmbusBin, "gaps", "report", "--server", url, "--json")
	if err != nil {
		t.Fatalf("gaps report: %v\n%s", err, report)
	}
	var rep gaps.Report
	if err := json.Unmarshal([]byte(report), &rep); err != nil {
		t.Fatalf("gaps report JSON: %v\n%s", err, report)
	}
	want := gaps.StreamLoss{Consumer: "trace", Stream: streams.StreamFPM, Cause: streams.LossRetention, Ranges: 1, Messages: 600, FirstSeq: 401, LastSeq: 1000}
	if len(rep.StreamLosses) != 1 || rep.StreamLosses[0] != want {
		t.Fatalf("gaps report stream losses %+v, want %+v", rep.StreamLosses, want)
	}
}
