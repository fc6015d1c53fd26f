package upstack

import (
	"os"

	"github.com/fpmbus/fpmbus/internal/fsutil"
)

// Prepare takes, before anything starts or is written, what up needs that another process may hold or the system
// may lack: its data directory (one process per directory, for its whole life: its server's store,
// its member id and its traces' member id are this directory's, partition.StableMemberID; the lock of one that was
// killed is free and taken over), the file descriptors its sockets need (libzmq aborts the process
// when it runs out) and every address it listens on (a taken one is named at once, not retried as
// a crash loop). A refusal leaves no trace: a directory that does not exist yet, which nobody can
// hold, is created by taking its lock only once the rest has been checked; one that exists is
// checked first, so that a second up on it is told so rather than that its addresses are taken.// release gives the directory back once the run is over; it is never nil, and is called on a refusal too.
func (r *Run) Prepare(dataDir, metricsAddr string) (release func(), err error) {
	var own *fsutil.Lock
	release = func() {
		if own != nil {
			_ = own.Unlock()
		}
	}
	takeDir := func() (err error) {
		own, err = ownDataDir(dataDir)
		return err
	}
	_, statErr := os.Lstat(dataDir)
	exists := statErr == nil
	if exists {
		if err := takeDir(); err != nil {
			return release, err
		}
	}
	if err := r.CheckSockets(); err != nil {
		return release, err
	}
	if err := r.CheckPorts(metricsAddr); err != nil {
		return release, err
	}
	if !exists {
		if err := takeDir(); err != nil {
			return release, err
		}
	}
	return release, nil
}
