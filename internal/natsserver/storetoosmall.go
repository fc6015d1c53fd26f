package natsserver

import (
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/invalid"
)

// errCodeStorageResources is nats-server's JSStorageResourcesExceededErr ("insufficient storage resources
// available"), which nats.go does not export: a new stream's size limit is over what JetStream may
// still reserve on its disk.
const errCodeStorageResources jetstream.ErrorCode = 10047

// StoreTooSmall turns srv's refusal (err) to create a stream for lack of disk into an invalid.FlagError
// naming the disk, the space and what the streams reserve (reserved: their flags and sizes): JetStream's
// share of the disk is fixed when it starts (3/4 of what the filesystem has available then), so
// restarting the clients cannot change the answer. status reads srv's store status; srv may be nil.
// Any other error is returned as it is.
func StoreTooSmall(srv *Server, status func() StoreStatus, reserved string, err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeStorageResources {
		return err
	}
	var maxStore int64
	if srv != nil {
		if jc := srv.NATS().JetStreamConfig(); jc != nil {
			maxStore = jc.MaxStore
		}
	}
	st := status()
	return invalid.Flagf("the streams' size limits do not fit the JetStream store's disk: JetStream may reserve %d bytes in %s "+
		"(nats-server gives it 3/4 of what the filesystem at %s had available when it started; %d bytes are available now), "+
		"and %s: lower them, or free space and start again (%v)",
		maxStore, st.Dir, st.Mount, st.FreeBytes, reserved, err)
}
