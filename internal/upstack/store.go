package upstack

import (
	"errors"
	"fmt"

	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/rungroup"
)

// The embedded server's store, as `fpmbus up` reports it: the server component's Health (a full disk or
// a write error degrades it in /healthz, naming the store and its filesystem; a lost store fails it) and
// the fpmbus_store_* metrics (natsserver.RegisterStoreMetrics), read from the current server's store
// watch (natsserver.WatchStore).
// The edge bridge (`fpmbus bridge --edge-dir`) reports its node-local server's store the same way.

// storeStatus returns the current embedded server's store status (StoreOK before it started).
func (r *Run) storeStatus() natsserver.StoreStatus {
	r.mu.Lock()
	srv := r.srv
	r.mu.Unlock()
	if srv == nil {
		return natsserver.StoreStatus{State: natsserver.StoreOK}
	}
	return srv.StoreStatus()
}

// storeTooSmall turns the server's refusal to create a stream for lack of disk into a usage error (exit
// 2) naming the flags, the disk and the space (natsserver.StoreTooSmall), marked Permanent: no restart
// of the components can change the answer. Any other error is returned as it is.
func (r *Run) storeTooSmall(err error) error {
	r.mu.Lock()
	srv := r.srv
	r.mu.Unlock()
	reserved := fmt.Sprintf("FPM reserves --max-bytes %d, FPM_EVENTS --events-max-bytes %d", r.Streams.MaxBytes, r.Streams.EventsMaxBytes)
	if err = natsserver.StoreTooSmall(srv, r.storeStatus, reserved, err); errors.As(err, new(*invalid.FlagError)) {
		return rungroup.Permanent(fmt.Errorf("%w: %v", ErrUsage, err))
	}
	return err
}
