package trace

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/tracefile"
)

// Producers whose newest segment cannot be repaired.
//
// The start-up repair, and a takeover's, cuts a torn tail off a producer's newest segment through the
// temporary file <segment>.repair.tmp. Anything under that name that is not a regular file (a symbolic
// link planted into another directory, a FIFO) is refused, never written through
// (fsutil.ErrNotRegular), and it concerns that producer alone, as a lock file that cannot be had does
// (tracefile/owner.go): the producer's newest segment stays as it is, and its messages are rejected
// (dead-lettered, naming the file) rather than written after a tail nobody cut; the other producers go
// on. The repair is tried again at the producer's first message after each Tick (every flush
// interval), so the producer goes on as soon as what was planted is removed, without a restart.

// unrepaired are the producers whose repair was refused, by segment prefix. Loop only.
type unrepaired map[string]*refusedRepair

type refusedRepair struct {
	err   error // why its messages are rejected
	tried bool  // the repair was tried since the last Tick
}

// repairRefused reports an error of a repair that concerns its producer alone: a file under the name
// the repair needs that is not fpmbus's to write.
func repairRefused(err error) bool { return errors.Is(err, fsutil.ErrNotRegular) }

// refuse records that prefix's repair was refused (err, repairRefused) and returns the reason its
// messages are rejected with. The refusal is logged once, until the producer is repaired.
func (u unrepaired) refuse(prefix string, err error, log *slog.Logger) error {
	err = fmt.Errorf("trace: producer %s: its newest segment cannot be repaired, so its messages are rejected until it can: %w", prefix, err)
	if r := u[prefix]; r != nil {
		r.err, r.tried = err, true
		return err
	}
	u[prefix] = &refusedRepair{err: err, tried: true}
	log.Error("trace writer: a producer's newest segment cannot be repaired: its messages are rejected (dead-lettered) "+
		"until it can be, the other producers go on; remove what is in the way", "prefix", prefix, "err", err)
	return err
}

// retry lets each refused repair be tried again at its producer's next message (Consumer.Tick).
func (u unrepaired) retry() {
	for _, r := range u {
		r.tried = false
	}
}

// repairRefusedProducer gives r's producer, when its repair was refused, another try (once per Tick):
// repaired, it goes on; still refused, r is rejected (a *messageError naming what is in the way).
func (w *writer) repairRefusedProducer(r *record) error {
	if len(w.unrepaired) == 0 {
		return nil
	}
	prefix := tracefile.SegmentPrefix(w.cfg.OutputPath, r.Producer)
	ref := w.unrepaired[prefix]
	switch {
	case ref == nil:
		return nil
	case ref.tried:
		return &messageError{ref.err}
	}
	ref.tried = true
	if err := w.claim(prefix); err != nil { // the repair needs the producer owned
		if w.rejectHeld && tracefile.RefusesProducer(err) {
			w.own.Rejecting(prefix, err)
			return &messageError{err}
		}
		return err
	}
	if _, err := tracefile.RepairPrefixes([]string{prefix}, w.log); err != nil {
		if !repairRefused(err) {
			return err
		}
		return &messageError{w.unrepaired.refuse(prefix, err, w.log)}
	}
	delete(w.unrepaired, prefix)
	w.log.Info("trace writer: the producer's newest segment is repaired now; its messages are written again", "prefix", prefix)
	return nil
}
