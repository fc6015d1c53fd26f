package bridge

import (
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/streams"
)

// metrics are the bridge's Prometheus collectors. Counters are labelled with the endpoint's rank; the
// children of every rank, stage and reason are created up front so the hot path never looks one up.
type metrics struct {
	received    *prometheus.CounterVec
	published   *prometheus.CounterVec
	invalid     *prometheus.CounterVec
	dropped     *prometheus.CounterVec
	duplicates  *prometheus.CounterVec
	seqMismatch *prometheus.CounterVec
	oversized   *prometheus.CounterVec
	deadLetters *prometheus.CounterVec
	dlLost      *prometheus.CounterVec
	markers     prometheus.Counter
	// lostAfterAck counts acknowledged FPMs the stream no longer held (lost_after_ack gap events);
	// checkpointErrors the ack record writes that failed.
	lostAfterAck     prometheus.Counter
	checkpointErrors prometheus.Counter
	buffered         prometheus.GaugeFunc
	bufferedHigh     prometheus.GaugeFunc
	inFlight         prometheus.GaugeFunc
	receiveToAck     prometheus.Histogram
	// batches counts the atomic batches committed (batch.go), batchSize their sizes, batchesFailed those
	// the server did not acknowledge (retried whole or republished one by one).
	batches       prometheus.Counter
	batchSize     prometheus.Histogram
	batchesFailed prometheus.Counter
}

func newMetrics(buffered, bufferedHigh, inFlight func() float64) *metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append([]string{"rank"}, labels...))
	}
	return &metrics{
		received:    counter("fpmbus_bridge_received_total", "ZMQ multiparts received, valid or not."),
		published:   counter("fpmbus_bridge_published_total", "FPMs acknowledged by JetStream (duplicates included)."),
		invalid:     counter("fpmbus_bridge_invalid_total", "Multiparts that are not a valid FPM or cannot be published, by stage (frames, decode, validate, size, publish).", "stage"),
		dropped:     counter("fpmbus_bridge_dropped_total", "Valid FPMs dropped, by reason (buffer_full, shutdown); each is in a drop marker.", "reason"),
		duplicates:  counter("fpmbus_bridge_duplicates_total", "Publishes JetStream acknowledged as duplicates (a retry of a stored message)."),
		seqMismatch: counter("fpmbus_bridge_seq_mismatch_total", "FPMs whose counter_id differs from the ZMQ sequence frame (stored, flagged)."),
		oversized: counter("fpmbus_bridge_oversized_frames_total",
			"ZMQ frames larger than --max-payload that libzmq refused unread (ZMQ_MAXMSGSIZE), closing the connection; the bridge reconnects and dead-letters each."),
		deadLetters: counter("fpmbus_bridge_dead_letters_total", "Dead letters acknowledged on FPM_EVENTS."),
		dlLost:      counter("fpmbus_bridge_dead_letters_lost_total", "Dead letters that could not be stored, by reason.", "reason"),
		markers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fpmbus_bridge_drop_markers_total", Help: "Drop markers acknowledged on FPM_EVENTS.",
		}),
		lostAfterAck: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fpmbus_bridge_lost_after_ack_total",
			Help: "FPMs JetStream had acknowledged that the FPM stream no longer held when the bridge checked (at start, after a reconnect); each is in a lost_after_ack gap event.",
		}),
		checkpointErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fpmbus_bridge_ack_checkpoint_errors_total",
			Help: "Writes of the bridge's ack records (" + streams.BucketBridgeAcks + ") that failed; lost_after_ack checks see the previous record.",
		}),
		buffered: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fpmbus_bridge_buffered_messages", Help: "Messages waiting in the bridge's buffer (at most MaxBuffer).",
		}, buffered),
		bufferedHigh: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fpmbus_bridge_buffered_messages_high", Help: "The most messages the buffer held at once since start (never above MaxBuffer).",
		}, bufferedHigh),
		inFlight: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fpmbus_bridge_in_flight", Help: "Publishes awaiting a JetStream ack (at most MaxInFlight).",
		}, inFlight),
		receiveToAck: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fpmbus_bridge_receive_to_ack_seconds",
			Help:    "Time from ZMQ receive to JetStream ack of one FPM.",
			Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fpmbus_bridge_batches_total", Help: "Atomic batches of FPMs sent (group commit: one fsync per batch under sync_interval: always).",
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fpmbus_bridge_batch_size", Help: "FPMs per atomic batch sent.",
			Buckets: []float64{64, 100, 200, 500, 1000},
		}),
		batchesFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fpmbus_bridge_batches_failed_total",
			Help: "Atomic batches the server did not acknowledge: retried whole, or republished one FPM at a time (a batch holding an id already stored).",
		}),
	}
}

// register registers every collector on r; a collector already registered is an error.
func (m *metrics) register(r prometheus.Registerer) error {
	var errs []error
	for _, c := range []prometheus.Collector{m.received, m.published, m.invalid, m.dropped, m.duplicates,
		m.seqMismatch, m.oversized, m.deadLetters, m.dlLost, m.markers, m.lostAfterAck, m.checkpointErrors, m.buffered, m.bufferedHigh, m.inFlight, m.receiveToAck,
		m.batches, m.batchSize, m.batchesFailed} {
		if err := r.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// rankMetrics holds the children of one rank.
type rankMetrics struct {
	received, published, duplicates, seqMismatch, oversized, deadLetters prometheus.Counter
	invalid, dropped, dlLost                                             map[string]prometheus.Counter
}

func (m *metrics) forRank(rank int) rankMetrics {
	r := strconv.Itoa(rank)
	rm := rankMetrics{
		received:    m.received.WithLabelValues(r),
		published:   m.published.WithLabelValues(r),
		duplicates:  m.duplicates.WithLabelValues(r),
		seqMismatch: m.seqMismatch.WithLabelValues(r),
		oversized:   m.oversized.WithLabelValues(r),
		deadLetters: m.deadLetters.WithLabelValues(r),
		invalid:     map[string]prometheus.Counter{},
		dropped:     map[string]prometheus.Counter{},
		dlLost:      map[string]prometheus.Counter{},
	}
	for _, s := range stages {
		rm.invalid[s] = m.invalid.WithLabelValues(r, s)
	}
	for _, s := range reasons {
		rm.dropped[s] = m.dropped.WithLabelValues(r, s)
		rm.dlLost[s] = m.dlLost.WithLabelValues(r, s)
	}
	return rm
}
