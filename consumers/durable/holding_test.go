package durable

import (
	"errors"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/streams"
)

var errStageConfig = errors.New("stage: invalid config")

func TestHoldingConfigFill(t *testing.T) {
	t.Parallel()
	var h HoldingConfig
	if err := h.Fill("stage-group", errStageConfig); err != nil {
		t.Fatal(err)
	}
	want := HoldingConfig{Durable: "stage-group", Partitions: DefaultHoldingPartitions, PinnedTTL: DefaultPinnedTTL,
		AckWait: DefaultHoldingAckWait, StopTimeout: DefaultStopTimeout}
	if h != want {
		t.Errorf("defaults: got %+v, want %+v", h, want)
	}
	for name, bad := range map[string]HoldingConfig{
		"negative partitions":  {Partitions: -1},
		"too many partitions":  {Partitions: MaxPartitions + 1},
		"ack wait below 1s":    {AckWait: time.Millisecond},
		"negative stop window": {StopTimeout: -time.Second},
	} {
		if err := bad.Fill("g", errStageConfig); !errors.Is(err, errStageConfig) {
			t.Errorf("%s: got %v, want the stage's sentinel", name, err)
		}
	}
}

func TestHoldingConfigGroupAndRunner(t *testing.T) {
	t.Parallel()
	h := HoldingConfig{Durable: "g", Partitions: 3, PinnedTTL: 7 * time.Second, AckWait: 9 * time.Second, StopTimeout: 11 * time.Second}
	g := h.Group(100, 8, streams.BenchMergedRoot+".*")
	if g.Stream != streams.StreamBench || g.Group != "g" || g.Partitions != 3 || g.PinnedTTL != 7*time.Second ||
		g.AckWait != 9*time.Second || g.ReleaseTimeout != 11*time.Second || g.MaxAckPending != 100 || g.Batch != 8 {
		t.Errorf("group: %+v", g)
	}
	if len(g.Filters) != 1 || g.Filters[0].Subject != streams.BenchMergedRoot+".*" || len(g.Filters[0].KeyTokens) != 1 || g.Filters[0].KeyTokens[0] != 1 {
		t.Errorf("filters %+v: want the subject keyed by the run token", g.Filters)
	}
	rc := h.RunnerConfig("stage", g, time.Second)
	if rc.Name != "stage" || rc.TickInterval != time.Second || rc.MaxDeliveries != holdingMaxDeliveries || rc.StopTimeout != 11*time.Second {
		t.Errorf("runner config: %+v", rc)
	}
	h.MaxDeliveries = 3
	if rc := h.RunnerConfig("stage", g, time.Second); rc.MaxDeliveries != 3 {
		t.Errorf("max deliveries %d, want the configured 3", rc.MaxDeliveries)
	}
	if err := rc.Validate(); err != nil {
		t.Errorf("runner config does not validate: %v", err)
	}
}
