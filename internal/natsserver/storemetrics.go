package natsserver

import "github.com/prometheus/client_golang/prometheus"

// The store's metrics, fpmbus_store_*, as `fpmbus up` and the edge bridge export them: status is the
// current server's StoreStatus (StoreOK before it started).

// storeFaultStates are the labels of fpmbus_store_faults_total.
var storeFaultStates = []StoreState{StoreDiskFull, StoreWriteError, StoreLost}

// RegisterStoreMetrics registers the store metrics on reg (nothing when reg is nil). Counters are of the
// current server; a restarted server counts from zero, as a restarted process would.
func RegisterStoreMetrics(reg prometheus.Registerer, status func() StoreStatus) {
	if reg == nil {
		return
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fpmbus_store_ok",
			Help: "1 while the embedded server's JetStream store takes writes; 0 while its disk is full, it refuses writes after a write error, or it was lost.",
		}, func() float64 {
			if status().State == StoreOK {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fpmbus_store_free_bytes",
			Help: "Bytes available on the filesystem holding the embedded server's JetStream store, at the last check (every second).",
		}, func() float64 { return float64(status().FreeBytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "fpmbus_store_recoveries_total",
			Help: "JetStream restarts after its store took writes again (a full disk freed): every stream and consumer loaded again from disk.",
		}, func() float64 { return float64(status().Recoveries) }),
	)
	for _, state := range storeFaultStates {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "fpmbus_store_faults_total",
			Help:        "Times the embedded server's JetStream store entered a fault, by state (disk_full, write_error, lost).",
			ConstLabels: prometheus.Labels{"state": string(state)},
		}, func() float64 { return float64(status().Faults[state]) }))
	}
}
