package seal

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the sealer's own collectors (the runner adds fpmbus_consumer_*{consumer="seal"}).
type metrics struct {
	// missing is the number of recorded seals whose cell the last audit found missing (or undecodable).
	missing prometheus.Gauge
	// replaced counts recorded seals the last audit found held by another run.
	replaced prometheus.Gauge
	// refusals counts seals refused because a campaign record names the missing cell sealed by another run.
	refusals prometheus.Counter
	// tamperedCells and tamperedCampaigns count the keys the last audit found revisions of that no
	// fpmbus writer stores; unprotected is 1 while FPM_DATASETS lacks its protection.
	tamperedCells, tamperedCampaigns, unprotected prometheus.Gauge
	// runs counts merged artefacts with a final outcome, by outcome (runOutcomes); cells the cells of
	// their reports, by state (sealed, already_sealed, conflict, rejected, missing).
	runs, cells *prometheus.CounterVec
}

// Outcomes of a merged artefact in fpmbus_seal_runs_total.
const (
	outcomeSealed   = "sealed"   // every cell sealed (or sealed before by the same run)
	outcomePartial  = "partial"  // settled, some cells not sealed: a conflict, a partial or incomplete campaign
	outcomeRejected = "rejected" // dead-lettered: it can never be sealed
)

var runOutcomes = []string{outcomeSealed, outcomePartial, outcomeRejected}

var cellStates = []string{sealed.String(), alreadySealed.String(), conflict.String(), stateRejected, stateMissing}

func newMetrics() *metrics {
	return &metrics{
		missing: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fpmbus_seal_sealed_cells_missing",
			Help: "Cells a campaign record names sealed that FPM_DATASETS did not hold (or could not decode) at the sealer's last audit.",
		}),
		replaced: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fpmbus_seal_sealed_cells_replaced",
			Help: "Cells a campaign record names sealed that FPM_DATASETS held under another run at the sealer's last audit.",
		}),
		refusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fpmbus_seal_missing_cell_refusals_total",
			Help: "Seals refused because a campaign record names the cell sealed by another run while FPM_DATASETS has lost it.",
		}),
		tamperedCells: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fpmbus_seal_tampered_cells",
			Help: "Cell keys the sealer's last audit found revisions of that are no seal or follow the seal (junk, overwrites, delete markers): ignored by every reader, the sealed value stands.",
		}),
		tamperedCampaigns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fpmbus_seal_tampered_campaigns",
			Help: "Campaign records the sealer's last audit found revisions of that are no frozen plan or do not follow the record (ignored by every reader).",
		}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fpmbus_seal_runs_total",
			Help: "Merged artefacts with a final outcome, by outcome: sealed, partial (settled with cells not sealed: a conflict, a partial or incomplete campaign), rejected (dead-lettered).",
		}, []string{"outcome"}),
		cells: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fpmbus_seal_cells_total",
			Help: "Cells in the reports of those outcomes, by state: sealed, already_sealed, conflict, rejected, missing.",
		}, []string{"state"}),
		unprotected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fpmbus_seal_bucket_unprotected",
			Help: "1 while FPM_DATASETS lacks its protection (deny delete and purge, no rollups, discard new per key) and the sealer could not add it: run `fpmbus streams apply` as the operator.",
		}),
	}
}

func (m *metrics) register(r prometheus.Registerer) error {
	var errs []error
	for _, o := range runOutcomes {
		m.runs.WithLabelValues(o)
	}
	for _, st := range cellStates {
		m.cells.WithLabelValues(st)
	}
	for _, c := range []prometheus.Collector{m.missing, m.replaced, m.refusals, m.tamperedCells, m.tamperedCampaigns, m.unprotected, m.runs, m.cells} {
		if err := r.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
