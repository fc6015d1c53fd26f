package durable

import "github.com/prometheus/client_golang/prometheus"

// metrics are the collectors every consumer has, labelled with its name.
type metrics struct {
	delivered   prometheus.Counter
	redelivered prometheus.Counter
	acked       prometheus.Counter
	terminated  prometheus.Counter
	lost        prometheus.Counter
	lag         prometheus.Gauge
	handle      prometheus.Histogram
}

func newMetrics(name string) *metrics {
	l := prometheus.Labels{"consumer": name}
	c := func(n, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: n, Help: help, ConstLabels: l})
	}
	return &metrics{
		delivered:   c("fpmbus_consumer_delivered_total", "Messages delivered to the consumer (redeliveries included)."),
		redelivered: c("fpmbus_consumer_redelivered_total", "Deliveries of a message delivered before (crash, takeover, ack wait)."),
		acked:       c("fpmbus_consumer_acked_total", "Messages acknowledged after their effect was durable (a cumulative ack counts each message it covers once handled)."),
		terminated:  c("fpmbus_consumer_terminated_total", "Messages dead-lettered and terminated: rejected by the consumer or over the delivery limit."),
		lost:        c("fpmbus_consumer_retention_lost_total", "Messages the stream removed (limits, deletes) before the consumer read them."),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fpmbus_consumer_lag_messages", ConstLabels: l,
			Help: "Messages still pending on the server for the partition last delivered from."}),
		handle: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fpmbus_consumer_handle_seconds", ConstLabels: l,
			Help:    "Time the consumer took to handle one batch of messages.",
			Buckets: []float64{.00005, .0001, .0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 5}}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.delivered, m.redelivered, m.acked, m.terminated, m.lost, m.lag, m.handle}
}
