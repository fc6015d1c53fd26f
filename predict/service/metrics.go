package service

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// The service's Prometheus metrics: the same counts `nats micro stats fpm-predict` shows (stats.go),
// read when scraped, so the request path pays nothing more for them.

var (
	answersDesc = prometheus.NewDesc("fpmbus_predict_answers_total",
		"Predictions answered, by status (measured, interpolated, composed, refused).", []string{"status"}, nil)
	refusalsDesc = prometheus.NewDesc("fpmbus_predict_refusals_total",
		"Refused predictions, by reason.", []string{"reason"}, nil)
	errorsDesc = prometheus.NewDesc("fpmbus_predict_errors_total",
		"Error replies, by endpoint subject and code (400 not a query, 413 too large, 500 not encodable, 503 busy).", []string{"endpoint", "code"}, nil)
	cellsDesc = prometheus.NewDesc("fpmbus_predict_cells",
		"Cells of FPM_DATASETS the service answers from (corrupt ones included).", nil, nil)
	corruptDesc = prometheus.NewDesc("fpmbus_predict_corrupt_cells",
		"Cells of FPM_DATASETS that do not decode: never used in an answer.", nil, nil)
	revisionDesc = prometheus.NewDesc("fpmbus_predict_revision",
		"The FPM_DATASETS revision the service answers from.", nil, nil)
	queuedDesc = prometheus.NewDesc("fpmbus_predict_queued",
		"Requests waiting for a worker (at most --queue-size; a full queue answers 503).", nil, nil)
)

// WithRegisterer registers the service's metrics on reg (default: not registered).
func WithRegisterer(reg prometheus.Registerer) option {
	return func(s *Service) error {
		if reg == nil {
			return fmt.Errorf("%w: nil registerer", errInvalidConfig)
		}
		s.reg = reg
		return nil
	}
}

type collector struct{ s *Service }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{answersDesc, refusalsDesc, errorsDesc, cellsDesc, corruptDesc, revisionDesc, queuedDesc} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for st, n := range s.counts.status {
		counter(answersDesc, n.Load(), st)
	}
	for r, n := range s.counts.reason {
		counter(refusalsDesc, n.Load(), string(r))
	}
	for subj, byCode := range s.counts.errors {
		for code, n := range byCode {
			counter(errorsDesc, n.Load(), subj, code)
		}
	}
	snap := s.catalog.Snapshot()
	cells, corrupt := 0, 0
	for _, cl := range snap.Cells() {
		cells++
		if !cl.Valid() {
			corrupt++
		}
	}
	ch <- prometheus.MustNewConstMetric(cellsDesc, prometheus.GaugeValue, float64(cells))
	ch <- prometheus.MustNewConstMetric(corruptDesc, prometheus.GaugeValue, float64(corrupt))
	ch <- prometheus.MustNewConstMetric(revisionDesc, prometheus.GaugeValue, float64(snap.Revision()))
	queued := 0
	if s.svc.Load() != nil { // the pool exists once the service is registered (Run stores svc after it)
		queued = s.pool.queued()
	}
	ch <- prometheus.MustNewConstMetric(queuedDesc, prometheus.GaugeValue, float64(queued))
}
