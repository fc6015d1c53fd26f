package main

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/rungroup"
)

// The embedded server's store, as `fpmbus up` reports it: the server component's Health (a full disk or
// a write error degrades it in /healthz, naming the store and its filesystem; a lost store fails it) and
// the fpmbus_store_* metrics (natsserver.RegisterStoreMetrics), read from the current server's store
// watch (natsserver.WatchStore).
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
