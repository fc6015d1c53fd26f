package main

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/rungroup"
)

// The embedded server's store, as `fpmbus up` reports it: the server component's Health (a full disk or
// a write error degrades it in /healthz, naming the store and its filesystem; a lost store fails it) and
// the fpmbus_store_* metrics below, read from the current server's store watch (streams.WatchStore).
// The edge bridge (`fpmbus bridge --edge-dir`) reports its node-local server's store the same way.

// storeStatus returns the current embedded server's store status (StoreOK before it started).
func (r *upRun) storeStatus() natsserver.StoreStatus {
	r.mu.Lock()
	srv := r.srv
	r.mu.Unlock()
	if srv == nil {
		return natsserver.StoreStatus{State: natsserver.StoreOK}
	}
	return srv.StoreStatus()
}

// storeFaultStates are the labels of fpmbus_store_faults_total.
var storeFaultStates = []natsserver.StoreState{natsserver.StoreDiskFull, natsserver.StoreWriteError, natsserver.StoreLost}

// registerStoreMetrics registers the store metrics on reg (nothing when reg is nil). Counters are of the
// current server; a restarted server counts from zero, as a restarted process would.
func registerStoreMetrics(reg prometheus.Registerer, status func() natsserver.StoreStatus) {
	if reg == nil {
		return
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fpmbus_store_ok",
			Help: "1 while the embedded server's JetStream store takes writes; 0 while its disk is full, it refuses writes after a write error, or it was lost.",
		}, func() float64 {
			if status().State == natsserver.StoreOK {
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

// errCodeStorageResources is nats-server's JSStorageResourcesExceededErr ("insufficient storage resources
// available"), which nats.go does not export: a new stream's size limit is over what JetStream may
// still reserve on its disk.
const errCodeStorageResources jetstream.ErrorCode = 10047

// storeTooSmall turns the server's refusal to create a stream for lack of disk into a usage error (exit
// 2) naming the flags, the disk and the space, marked Permanent: JetStream's share of the disk is fixed
// when it starts (3/4 of what the filesystem has available then), so restarting the components cannot
// change the answer. Any other error is returned as it is.
func (r *upRun) storeTooSmall(err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeStorageResources {
		return err
	}
	r.mu.Lock()
	srv := r.srv
	r.mu.Unlock()
	var maxStore int64
	if srv != nil {
		if jc := srv.NATS().JetStreamConfig(); jc != nil {
			maxStore = jc.MaxStore
		}
	}
	st := r.storeStatus()
	return rungroup.Permanent(fmt.Errorf("%w: the streams' size limits do not fit the JetStream store's disk: JetStream may reserve %d bytes in %s "+
		"(nats-server gives it 3/4 of what the filesystem at %s had available when it started; %d bytes are available now), "+
		"and FPM reserves --max-bytes %d, FPM_EVENTS --events-max-bytes %d: lower them, or free space and start again (%v)",
		errUsage, maxStore, st.Dir, st.Mount, st.FreeBytes, r.scfg.MaxBytes, r.scfg.EventsMaxBytes, err))
}
