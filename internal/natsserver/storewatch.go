package natsserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/internal/retrywait"
)

// The store watch of the embedded server: whether its JetStream store can take writes, said where a user
// looks (StoreStatus, and through `fpmbus up` /healthz, metrics and an error-level log naming the
// directory and its filesystem), and the two failures of the disk under it handled at their cause.
//
// A full disk. nats-server marks a stream failed at its first write error (ENOSPC, EIO) and from then
// on refuses every write to it without answering the publisher, until the stream is loaded again;
// nothing in nats-server loads it again while the process runs, so freeing space alone changes nothing.
// The watch reloads it: once the filesystem has room again (storeLowFree) and a probe file next to the
// store is written and synced, it restarts JetStream in-process (ShutdownJetStream, then EnableJetStream
// with the configuration it first ran with). Every stream and consumer is loaded again from disk;
// client connections stay open; a publisher's retries (same Nats-Msg-Id) are stored, or deduplicated if
// the store had them. What JetStream acknowledged was on disk first (a write error is never acked), so
// the restart loses nothing acknowledged.
//
// A store limit fixed too small. Given no max_file_store, nats-server fixes JetStream's store limit when
// JetStream starts, at 3/4 of what the filesystem has available then: started (or restarted here) on a
// nearly full disk, the limit stays small after space returns and every publish is refused
// "insufficient resources". The watch restarts such a JetStream too, with the limit left to be fixed
// again (staleStoreLimit).
//
// A store directory deleted or replaced under the running server (the directory nats-server opened is
// no longer at its path: `rm -rf` of the data directory, a restore over it). The server keeps writing
// into deleted files and acknowledging writes no disk will keep. The watch shuts JetStream down at once,
// so nothing more is acknowledged, and WatchStore returns ErrStoreLost: no restart inside this process
// brings back what was stored there. Publishers then see JetStream as unavailable and buffer or count
// drops, as in an outage.
//
// Invariants: one goroutine (WatchStore's) checks and acts; StoreStatus reads the last result under a
// mutex from any goroutine. The watch only restarts a JetStream that failed (a stream write error, or
// JetStream disabled by nats-server itself) and only when the probe write succeeded; it never restarts
// a healthy one, and never one whose directory is lost.

// StoreState is whether the embedded server's JetStream store takes writes.
type StoreState string

const (
	// StoreOK: the store takes writes.
	StoreOK StoreState = "ok"
	// StoreDiskFull: the filesystem holding the store has less than storeLowFree available; JetStream
	// refuses (or is about to refuse) writes.
	StoreDiskFull StoreState = "disk_full"
	// StoreWriteError: JetStream refuses writes after a write error although the filesystem has room
	// (the probe write says why: an I/O error, a read-only or unwritable filesystem).
	StoreWriteError StoreState = "write_error"
	// StoreLost: the store directory was deleted or replaced under the running server; JetStream was
	// shut down.
	StoreLost StoreState = "lost"
)

// storeLowFree is the space the store's filesystem must have available: below it the store counts as
// full, and a failed JetStream is restarted only once it has at least this much again.
const storeLowFree = 1 << 20

// storeCheckInterval is how often WatchStore checks; a deleted store is acknowledged into for at most
// about this long.
const storeCheckInterval = time.Second

// storeLogRepeat is how often a store fault that lasts is logged again.
const storeLogRepeat = 30 * time.Second

// storeRestartFirstWait and storeRestartMaxWait bound the waits between JetStream restarts while a
// fault outlives them; the first restart after a healthy check is at once.
const (
	storeRestartFirstWait = 2 * time.Second
	storeRestartMaxWait   = 5 * time.Minute
)

// storeProbeName is the probe file written next to nats-server's store directory (in
// ServerConfig.StoreDir, never inside nats-server's, whose entries it reads as accounts).
const storeProbeName = ".fpmbus-store-probe"

// storeProbeSize is how much the probe writes: a message block's worth is not needed, only proof that
// the filesystem accepts and syncs a write.
const storeProbeSize = 64 << 10

// ErrStoreLost is wrapped by WatchStore's error when the store directory was deleted or replaced under
// the running server.
var ErrStoreLost = errors.New("streams: JetStream store lost")

// StoreStatus is the last result of the store watch.
type StoreStatus struct {
	State StoreState
	// Dir is nats-server's JetStream store directory (<ServerConfig.StoreDir>/jetstream).
	Dir string
	// Mount is the mount point of the filesystem holding Dir.
	Mount string
	// FreeBytes is what that filesystem had available at the last check.
	FreeBytes uint64
	// Reason says, for a state other than StoreOK, what is wrong, naming Dir and its filesystem.
	Reason string
	// Since is when the store entered State.
	Since time.Time
	// Faults counts the times the store entered each state other than StoreOK; Recoveries the
	// JetStream restarts after the store took writes again.
	Faults     map[StoreState]uint64
	Recoveries uint64
}

// Err returns nil for StoreOK, else an error with the reason.
func (st StoreStatus) Err() error {
	if st.State == StoreOK || st.State == "" {
		return nil
	}
	return errors.New(st.Reason)
}

// StoreWatchConfig configures WatchStore.
type StoreWatchConfig struct {
	// Logger receives the faults (error level, naming the directory and filesystem) and recoveries
	// (default slog.Default()).
	Logger *slog.Logger
	// Interval between checks (default one second).
	Interval time.Duration
}

// storeWatch is the watch state of one Server.
type storeWatch struct {
	dir      string // nats-server's store directory
	probeDir string // where the probe file goes (ServerConfig.StoreDir)
	// held is dir, opened when the server started and kept open until it shuts down: a deleted
	// directory shows as no links left on it, and its inode number cannot be reused by a new directory
	// at the same path while it is held, which a comparison of numbers alone would miss.
	held     *os.File
	dev, ino uint64 // held's device and inode
	mount    string
	jsConfig server.JetStreamConfig // what JetStream first ran with, to enable it again
	// dynamicMax: the server was given no store limit (max_file_store), so nats-server fixes one each
	// time JetStream starts, at 3/4 of what the filesystem has available then (staleStoreLimit).
	dynamicMax bool

	mu     sync.Mutex // guards status
	status StoreStatus

	// owned by WatchStore's goroutine
	logged time.Time // when the current fault was last logged
	// restartAt is the earliest time of the next JetStream restart and restartWaits the waits after it:
	// a fault that a restart does not clear (a stream nats-server cannot load) is retried ever more
	// rarely, up to storeRestartMaxWait, instead of every second. A healthy check starts over.
	restartAt    time.Time
	restartWaits backoff.BackOff
	// seen are the faults nats-server reported at the previous check. Only a fault reported twice in
	// a row counts: a stream being created (or deleted) has its directory on disk a moment before (or
	// after) it is loaded, which nats-server's health check reports as a stream it could not load.
	seen map[string]bool
}

// newStoreWatch records the identity of the store the server just opened.
func newStoreWatch(ns *server.Server, probeDir string, dynamicMax bool) (*storeWatch, error) {
	jc := ns.JetStreamConfig()
	if jc == nil {
		return nil, errors.New("streams: embedded server started without JetStream")
	}
	held, err := os.Open(jc.StoreDir)
	if err != nil {
		return nil, fmt.Errorf("streams: JetStream store: %w", err)
	}
	dev, ino, _, err := fileID(held)
	if err != nil {
		held.Close()
		return nil, fmt.Errorf("streams: JetStream store %s: %w", jc.StoreDir, err)
	}
	w := &storeWatch{dir: jc.StoreDir, probeDir: probeDir, held: held, dev: dev, ino: ino, mount: mountPoint(jc.StoreDir, dev), jsConfig: *jc, dynamicMax: dynamicMax,
		restartWaits: retrywait.Doubling(storeRestartFirstWait, storeRestartMaxWait)}
	w.status = StoreStatus{State: StoreOK, Dir: w.dir, Mount: w.mount, Since: time.Now(), Faults: map[StoreState]uint64{}}
	w.status.FreeBytes, _ = freeBytes(w.dir)
	return w, nil
}

// StoreStatus returns the last result of the store watch (StoreOK before the first check).
func (s *Server) StoreStatus() StoreStatus {
	s.watch.mu.Lock()
	defer s.watch.mu.Unlock()
	st := s.watch.status
	st.Faults = make(map[StoreState]uint64, len(s.watch.status.Faults))
	for k, v := range s.watch.status.Faults {
		st.Faults[k] = v
	}
	return st
}

// WatchStore checks the store every Interval until ctx ends (then it returns nil): it reports a full
// disk or a write error in StoreStatus and restarts JetStream once the store takes writes again (see
// the comment at the top of this file). When the store directory was deleted or replaced, it shuts
// JetStream down and returns an error wrapping ErrStoreLost. One WatchStore per Server at a time.
func (s *Server) WatchStore(ctx context.Context, cfg StoreWatchConfig) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	every := cfg.Interval
	if every <= 0 {
		every = storeCheckInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := s.checkStore(log, time.Now()); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// checkStore runs one check; it returns an error only when the store is lost.
func (s *Server) checkStore(log *slog.Logger, now time.Time) error {
	w := s.watch
	if why := w.lost(); why != "" {
		if s.ns.JetStreamEnabled() {
			_ = s.ns.ShutdownJetStream()
		}
		reason := fmt.Sprintf("JetStream store %s %s under the running server: what it held is gone; JetStream was shut down so that nothing more is acknowledged into deleted files; restart to begin a new store", w.dir, why)
		w.set(log, now, StoreLost, reason, 0, false)
		return fmt.Errorf("%w: %s", ErrStoreLost, reason)
	}
	free, ferr := freeBytes(w.dir)
	reported := s.storeFaults()
	faults := w.lasting(reported)
	full := ferr == nil && free < storeLowFree
	if len(faults) == 0 && !full && ferr == nil {
		if f := s.staleStoreLimit(free); f != "" {
			faults = []string{f}
		}
	}
	switch {
	case len(faults) == 0 && !full:
		if len(reported) == 0 { // healthy: the next fault is restarted at once
			w.restartAt = time.Time{}
			w.restartWaits.Reset()
		}
		w.set(log, now, StoreOK, "", free, false)
		return nil
	case len(faults) == 0:
		w.set(log, now, StoreDiskFull, fmt.Sprintf("disk full: the filesystem at %s holding the JetStream store %s has %d bytes available (under %d); JetStream refuses writes once it runs out",
			w.mount, w.dir, free, storeLowFree), free, false)
		return nil
	case full:
		w.set(log, now, StoreDiskFull, fmt.Sprintf("disk full: the filesystem at %s holding the JetStream store %s has %d bytes available; JetStream refuses writes until it has room again (then it is restarted): %s",
			w.mount, w.dir, free, strings.Join(faults, "; ")), free, false)
		return nil
	}
	// The filesystem has room: restart JetStream if the store takes a write.
	if err := w.probe(); err != nil {
		why := fmt.Sprintf("a probe write failed: %v", err)
		if errors.Is(err, fsutil.ErrNotRegular) {
			why = fmt.Sprintf("the probe file is refused: %v; JetStream is not restarted until it is removed", err)
		}
		w.set(log, now, StoreWriteError, fmt.Sprintf("JetStream store %s (filesystem at %s, %d bytes available) refuses writes: %s; %s",
			w.dir, w.mount, free, strings.Join(faults, "; "), why), free, false)
		return nil
	}
	if now.Before(w.restartAt) {
		w.set(log, now, StoreWriteError, fmt.Sprintf("JetStream store %s (filesystem at %s) takes writes, but JetStream still refuses them after a restart: %s; restarting it again at %s",
			w.dir, w.mount, strings.Join(faults, "; "), w.restartAt.UTC().Format(time.RFC3339)), free, false)
		return nil
	}
	w.restartAt = now.Add(w.restartWaits.NextBackOff())
	w.seen = nil // a restarted JetStream's faults are new ones
	if err := s.restartJetStream(); err != nil {
		w.set(log, now, StoreWriteError, fmt.Sprintf("JetStream store %s (filesystem at %s) takes writes again but JetStream did not restart: %v (after: %s)",
			w.dir, w.mount, err, strings.Join(faults, "; ")), free, false)
		return nil
	}
	w.set(log, now, StoreOK, "", free, true)
	return nil
}

// staleStoreLimit describes JetStream refusing every write at a store limit too small for the disk it
// now has, "" otherwise. Given no limit, nats-server fixes one when JetStream starts, at 3/4 of what the
// filesystem has available then (plus what the store already holds): started, or restarted by this
// watch, on a nearly full disk, it stays that small after space returns, and every publish is refused
// with "insufficient resources", which nats-server's health check does not report. Restarting
// JetStream fixes the limit again from the space there is now (restartJetStream).
func (s *Server) staleStoreLimit(free uint64) string {
	if !s.watch.dynamicMax || !s.ns.JetStreamEnabled() {
		return ""
	}
	info, err := s.ns.Jsz(&server.JSzOptions{})
	if err != nil || info == nil {
		return ""
	}
	used, limit := int64(info.Store), info.Config.MaxStore
	again := int64(free/4*3) + used/4*3
	if used+storeLowFree < limit || again < limit+limit/4+storeLowFree {
		return ""
	}
	return fmt.Sprintf("JetStream's store limit of %d bytes, fixed when it started with little space available, is used up (%d bytes stored) while the filesystem has %d bytes available now",
		limit, used, free)
}

// storeFaults returns what nats-server reports wrong with JetStream: a stream refusing writes after a
// write error, JetStream disabled (nats-server disables it itself on some write errors), a stream it
// could not load.
func (s *Server) storeFaults() []string {
	h := s.ns.Healthz(&server.HealthzOptions{Details: true})
	var out []string
	for _, e := range h.Errors {
		switch e.Type {
		case server.HealthzErrorJetStream, server.HealthzErrorStream, server.HealthzErrorAccount:
			out = append(out, e.Error)
		}
	}
	return out
}

// lasting returns the faults of now that the previous check reported too, and remembers now's.
func (w *storeWatch) lasting(now []string) []string {
	var out []string
	seen := make(map[string]bool, len(now))
	for _, f := range now {
		if w.seen[f] {
			out = append(out, f)
		}
		seen[f] = true
	}
	w.seen = seen
	return out
}

// restartJetStream loads every stream and consumer again from disk, clearing the write errors
// nats-server keeps until then.
func (s *Server) restartJetStream() error {
	if s.ns.JetStreamEnabled() {
		if err := s.ns.ShutdownJetStream(); err != nil {
			return fmt.Errorf("shut down: %w", err)
		}
	}
	cfg := s.watch.jsConfig
	// EnableJetStream adds "jetstream" to a configured StoreDir, as at the server's start.
	cfg.StoreDir = filepath.Dir(cfg.StoreDir)
	if s.watch.dynamicMax {
		cfg.MaxStore = 0 // fixed again from the space available now, as at the server's start
	}
	if err := s.ns.EnableJetStream(&cfg); err != nil {
		return fmt.Errorf("enable: %w", err)
	}
	return nil
}

// lost says how the store directory is no longer the one the server opened ("" while it is).
func (w *storeWatch) lost() string {
	if _, _, links, err := fileID(w.held); err == nil && links == 0 {
		if _, err := os.Stat(w.dir); err == nil {
			return "was deleted (a new, empty directory is at its path now)"
		}
		return "was deleted"
	}
	dev, ino, err := dirID(w.dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "was deleted or moved away"
	case err != nil:
		return fmt.Sprintf("cannot be checked (%v)", err)
	case dev != w.dev || ino != w.ino:
		return "was replaced by another directory (moved away, or restored over)"
	}
	return ""
}

// close releases the store directory.
func (w *storeWatch) close() { _ = w.held.Close() }

// probe writes, syncs and removes a small file next to the store. The data directory may be shared
// with other users (an edge directory under /tmp), so a symbolic link or named pipe planted under the
// probe's name is refused (*fsutil.NotRegularError, naming it) and left as it is, never written
// through: the probe then fails, and the store's status says why.
func (w *storeWatch) probe() error {
	path := filepath.Join(w.probeDir, storeProbeName)
	f, err := fsutil.CreateRegular(path, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(make([]byte, storeProbeSize))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if rerr := fsutil.RemoveRegular(path); err == nil && rerr != nil {
		err = rerr
	}
	return err
}

// set records the check's result and logs a change: a fault at error level (again every
// storeLogRepeat while it lasts), the return to StoreOK at warn level.
func (w *storeWatch) set(log *slog.Logger, now time.Time, state StoreState, reason string, free uint64, restarted bool) {
	w.mu.Lock()
	prev := w.status.State
	if prev != state {
		w.status.Since = now
		if state != StoreOK {
			w.status.Faults[state]++
		}
	}
	if restarted {
		w.status.Recoveries++
	}
	w.status.State, w.status.Reason, w.status.FreeBytes = state, reason, free
	w.mu.Unlock()
	attrs := []any{"store", w.dir, "filesystem", w.mount}
	if state != StoreLost {
		attrs = append(attrs, "free_bytes", free)
	}
	switch {
	case state != StoreOK && (prev != state || now.Sub(w.logged) >= storeLogRepeat):
		w.logged = now
		log.Error("JetStream store fault: "+string(state), append(attrs, "reason", reason)...)
	case restarted:
		log.Warn("JetStream store takes writes again: JetStream restarted, streams and consumers loaded again from disk", attrs...)
	case state == StoreOK && prev != StoreOK:
		log.Warn("JetStream store has room again", attrs...)
	}
}

// fileID returns the device, inode and link count of an open file.
func fileID(f *os.File) (dev, ino, links uint64, err error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, 0, errors.New("no device and inode on this system")
	}
	return uint64(st.Dev), uint64(st.Ino), uint64(st.Nlink), nil
}

// dirID returns the device and inode of dir.
func dirID(dir string) (dev, ino uint64, err error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return 0, 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, errors.New("no device and inode on this system")
	}
	return uint64(st.Dev), uint64(st.Ino), nil
}

// freeBytes returns what the filesystem holding dir has available to unprivileged writers.
func freeBytes(dir string) (uint64, error) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return 0, err
	}
	return uint64(fs.Bavail) * uint64(fs.Bsize), nil
}

// mountPoint returns the topmost ancestor of dir on the same device: where its filesystem is mounted.
func mountPoint(dir string, dev uint64) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return dir
	}
	for {
		parent := filepath.Dir(abs)
		if parent == abs {
			return abs
		}
		if d, _, err := dirID(parent); err != nil || d != dev {
			return abs
		}
		abs = parent
	}
}
