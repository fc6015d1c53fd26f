package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/streams"
)

// The embedded server's store, as `fpmbus up` reports it: the server component's Health (a full disk or
// a write error degrades it in /healthz, naming the store and its filesystem; a lost store fails it) and
// the fpmbus_store_* metrics below, read from the current server's store watch (streams.WatchStore).

// storeStatus returns the current embedded server's store status (StoreOK before it started).
func (r *upRun) storeStatus() streams.StoreStatus {
	r.mu.Lock()
	srv := r.srv
	r.mu.Unlock()
	if srv == nil {
		return streams.StoreStatus{State: streams.StoreOK}
	}
	return srv.StoreStatus()
}

// storeFaultStates are the labels of fpmbus_store_faults_total.
var storeFaultStates = []streams.StoreState{streams.StoreDiskFull, streams.StoreWriteError, streams.StoreLost}

// registerStoreMetrics registers the store metrics on reg (nothing when reg is nil). Counters are of the
// current server; a restarted server counts from zero, as a restarted process would.
func registerStoreMetrics(reg prometheus.Registerer, status func() streams.StoreStatus) {
	if reg == nil {
		return
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fpmbus_store_ok",
			Help: "1 while the embedded server's JetStream store takes writes; 0 while its disk is full, it refuses writes after a write error, or it was lost.",
		}, func() float64 {
			if status().State == streams.StoreOK {
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
