package observe

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The cost of what a page view and the sampler do at 1,000 ranks: the bridge's per-rank series (as
// bridge/metrics.go registers them: 6 counters, 5 invalid stages and 3 drop reasons per rank) and
// 1,000 publishers. Compare the ns/op of the three: gather (every SampleInterval), a status, a page.
func BenchmarkThousandRanks(b *testing.B) {
	reg := prometheus.NewRegistry()
	counter := func(name string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name}, append([]string{"rank"}, labels...))
		reg.MustRegister(c)
		return c
	}
	plain := []*prometheus.CounterVec{counter("fpmbus_bridge_received_total"), counter("fpmbus_bridge_published_total"),
		counter("fpmbus_bridge_duplicates_total"), counter("fpmbus_bridge_seq_mismatch_total"), counter("fpmbus_bridge_oversized_frames_total"),
		counter("fpmbus_bridge_dead_letters_total")}
	invalid, dropped := counter("fpmbus_bridge_invalid_total", "stage"), counter("fpmbus_bridge_dropped_total", "reason")
	for r := range 1000 {
		rank := strconv.Itoa(r)
		for _, c := range plain {
			c.WithLabelValues(rank).Add(1000)
		}
		for _, s := range []string{"frames", "decode", "validate", "size", "publish"} {
			invalid.WithLabelValues(rank, s)
		}
		for _, s := range []string{"buffer_full", "shutdown", "rejected"} {
			dropped.WithLabelValues(rank, s)
		}
	}
	now := time.Now()
	s := New(Options{Process: "up", Gatherer: reg, Publishers: fleet(125, 8, now), Bridge: &BridgeRef{Component: "bridge", Ranks: 1000}})
	b.Run("gather", func(b *testing.B) {
		for b.Loop() {
			s.sampleNow()
		}
	})
	b.Run("status.json", func(b *testing.B) {
		for b.Loop() {
			s.Status(context.Background(), query{Sort: "missing", Desc: true, Limit: defaultGroupLimit})
		}
	})
	b.Run("page", func(b *testing.B) {
		for b.Loop() {
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/?sort=missing&desc=1", nil))
			b.SetBytes(int64(rec.Body.Len()))
		}
	})
}
