package gaps

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/streams"
)

// metrics are the detector's Prometheus metrics (all prefixed fpmbus_gaps_).
type metrics struct {
	events      *prometheus.CounterVec   // gap events stored, by cause
	missing     *prometheus.CounterVec   // missing messages reported, by cause
	recovered   *prometheus.CounterVec   // of those, stored after all (recovered events), by cause
	stateEvents *prometheus.CounterVec   // stale / resumed events stored
	stale       prometheus.Gauge         // publishers currently stale
	publishers  prometheus.Gauge         // publishers tracked by this instance
	pending     prometheus.Gauge         // gaps waiting for a drop marker or the grace
	messages    prometheus.Counter       // FPMs applied
	heartbeats  prometheus.Counter       // heartbeats among them
	duplicates  prometheus.Counter       // duplicate FPMs
	outOfOrder  prometheus.Counter       // out-of-order FPMs
	skipped     prometheus.Counter       // redelivered FPMs already reflected in the state
	markers     prometheus.Counter       // drop markers applied
	invalid     *prometheus.CounterVec   // unusable messages (FPMs rejected, drop markers skipped), by stream
	conflicts   prometheus.Counter       // state writes that lost to another writer
	delay       *prometheus.HistogramVec // gap end (observed time of the message after it) to event stored
	commit      prometheus.Histogram     // checkpoint + publish + ack duration
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "fpmbus_gaps_" + name, Help: help})
	}
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fpmbus_gaps_events_total",
			Help: "Gap events stored on FPM_EVENTS, by cause (bridge_drop, zmq_drop, publisher_restart, stale)."}, []string{"cause"}),
		missing: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fpmbus_gaps_missing_messages_total",
			Help: "Missing FPM sequence numbers reported in gap events, by cause."}, []string{"cause"}),
		recovered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fpmbus_gaps_recovered_messages_total",
			Help: "Sequence numbers gap events named missing that were stored after all (recovered events), by the gap's cause; missing less recovered is what is missing."}, []string{"cause"}),
		stateEvents: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fpmbus_gaps_state_events_total",
			Help: "Stale and resumed events stored on FPM_EVENTS."}, []string{"type"}),
		stale:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "fpmbus_gaps_stale_publishers", Help: "Publishers currently stale (nothing heard for --stale-after)."}),
		publishers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fpmbus_gaps_publishers", Help: "Publishers tracked by this instance."}),
		pending:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "fpmbus_gaps_pending_gaps", Help: "Revealed gaps waiting for a drop marker or the end of the marker grace."}),
		messages:   counter("messages_total", "FPMs applied to the per-publisher state."),
		heartbeats: counter("heartbeats_total", "Idle heartbeats among the FPMs applied."),
		duplicates: counter("duplicates_total", "FPMs whose sequence number was already seen (counted, not a gap)."),
		outOfOrder: counter("out_of_order_total", "FPMs that arrived after a later one and filled a pending gap (counted, not a gap)."),
		skipped:    counter("redelivered_skipped_total", "Redelivered FPMs and markers already reflected in the checkpointed state."),
		markers:    counter("drop_markers_total", "Bridge drop markers applied."),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fpmbus_gaps_invalid_total",
			Help: "Messages the detector cannot use (bad subject, headers or marker body): FPMs dead-lettered, drop markers skipped."}, []string{"stream"}),
		conflicts: counter("state_conflicts_total", "State checkpoints refused because another writer updated the publisher (state reloaded)."),
		delay: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fpmbus_gaps_event_delay_seconds",
			Help:    "From the bridge's receive time of the message after a gap to its event being stored (zmq_drop includes the marker grace).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 15, 20, 30, 60}}, []string{"cause"}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fpmbus_gaps_commit_seconds",
			Help: "One checkpoint: state writes, event publishes and acks.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
	}
	// Every series exists from the start (at zero), so a dashboard's expression has data before the
	// first event of its kind.
	for _, c := range Causes {
		m.events.WithLabelValues(c)
		m.missing.WithLabelValues(c)
		m.recovered.WithLabelValues(c)
		m.delay.WithLabelValues(c)
	}
	for _, t := range []string{typeStale, typeResumed} {
		m.stateEvents.WithLabelValues(t)
	}
	m.invalid.WithLabelValues(streams.StreamFPM)
	m.invalid.WithLabelValues(streams.StreamEvents)
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.events, m.missing, m.recovered, m.stateEvents, m.stale, m.publishers, m.pending,
		m.messages, m.heartbeats, m.duplicates, m.outOfOrder, m.skipped, m.markers, m.invalid, m.conflicts, m.delay, m.commit} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
