package trace

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics of the trace writer (its runner has the common fpmbus_consumer_* ones). New always builds
// them; with a nil Registerer they are not registered.
type metrics struct {
	written     *prometheus.CounterVec
	invalid     prometheus.Counter
	rolled      prometheus.Counter
	flush       prometheus.Histogram
	retries     prometheus.Counter
	skipped     *prometheus.CounterVec
	pruned      prometheus.Counter
	prunedLines prometheus.Counter
	writtenMode prometheus.Counter // written.WithLabelValues(mode), resolved once
	// skipped.WithLabelValues("written"), resolved once
	skippedWritten prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, mode Mode) (*metrics, error) {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &metrics{
		written: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fpmbus_trace_written_total",
			Help: "Trace lines written and fsynced (their messages then acknowledged), by capture mode."}, []string{"mode"}),
		invalid: counter("fpmbus_trace_invalid_total",
			"FPM messages not written because their subject or body is invalid (dead-lettered on fpmevents.deadletter.consumer.trace, not redelivered)."),
		rolled: counter("fpmbus_trace_segments_rolled_total",
			"Trace segments finished because the next line would exceed the roll size."),
		flush: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fpmbus_trace_flush_seconds",
			Help:    "Time to compress, write and fsync one flush of every dirty segment, before acking.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		retries: counter("fpmbus_trace_write_retries_total",
			"Failed segment writes (disk full, I/O error) retried after a backoff; nothing is acknowledged meanwhile."),
		pruned: counter("fpmbus_trace_segments_pruned_total",
			"Trace segments removed by retention (--max-segments), each reported as a loss event on fpmevents.loss.trace."),
		prunedLines: counter("fpmbus_trace_pruned_lines_total",
			"Trace lines (acknowledged messages) in segments removed by retention (--max-segments): no longer in the trace."),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fpmbus_trace_redelivered_skipped_total",
			Help: "Redelivered FPM messages not written again because their line is already on disk (reason written: found by the takeover recovery)."},
			[]string{"reason"}),
	}
	if reg != nil {
		r := &registrar{reg: reg}
		use(r, &m.written)
		use(r, &m.invalid)
		use(r, &m.rolled)
		use(r, &m.flush)
		use(r, &m.retries)
		use(r, &m.skipped)
		use(r, &m.pruned)
		use(r, &m.prunedLines)
		if r.err != nil {
			return nil, r.err
		}
	}
	m.writtenMode = m.written.WithLabelValues(string(mode))
	m.skippedWritten = m.skipped.WithLabelValues("written")
	return m, nil
}

// registrar registers collectors until the first error, which it keeps.
type registrar struct {
	reg prometheus.Registerer
	err error
}

// use registers *c with register, replacing it by the equal collector registered before where there is
// one; after an error it does nothing.
func use[C prometheus.Collector](r *registrar, c *C) {
	if r.err == nil {
		*c, r.err = register(r.reg, *c)
	}
}

// register registers c, or returns the equal collector registered before (two writers in one process
// share the series).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, err
	}
	return c, nil
}
