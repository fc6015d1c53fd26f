package merge

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// runsTotal counts the outcome events the merger published, by event (label outcome); the runner adds
// fpmbus_consumer_*{consumer="merge"}.
func newRunsTotal() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fpmbus_merge_runs_total",
		Help: "Benchmark runs the merger published an outcome for, by outcome (bench_merged, bench_rejected, bench_incomplete; bench_conflict: a rank that disagrees with a run already merged).",
	}, []string{"outcome"})
	for _, o := range []string{EventMerged, EventRejected, eventIncomplete, eventConflict} {
		c.WithLabelValues(o)
	}
	return c
}

// registerRuns registers c on reg, or returns the equal collector registered before (two mergers in
// one process share the series).
func registerRuns(reg prometheus.Registerer, c *prometheus.CounterVec) (*prometheus.CounterVec, error) {
	if reg == nil {
		return c, nil
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing, nil
			}
		}
		return nil, err
	}
	return c, nil
}
