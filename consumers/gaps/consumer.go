package gaps

import (
	"context"
	"time"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/streams"
)

// The detector as a durable.Consumer and durable.PartitionObserver. The runner calls these methods on
// its loop goroutine, one at a time, and acknowledges a message once the detector has marked it done:
// with the checkpoint that follows it (see the invariants in doc.go), or at once when the message can
// never be used (Msg.Reject: the runner dead-letters it). Results of the detector's own goroutines (a
// finished checkpoint, pulled drop markers) come back to the same loop with Runner.Do.

// releasePause is how long Release waits before trying a failed checkpoint again.
const releasePause = 100 * time.Millisecond

// Handle applies a batch of FPMs of one owned partition, in stream order.
func (d *Detector) Handle(_ context.Context, batch []*durable.Msg) error {
	if d.fault != nil {
		return d.fault
	}
	now := d.now()
	for _, m := range batch {
		if err := d.handleFPM(m, now); err != nil {
			return err
		}
	}
	d.backlog = len(batch) >= handBatch
	d.maybeCommit()
	return nil
}

// Tick runs the wall-clock checks (stale publishers, marker graces passed) and starts a checkpoint
// when one is due.
func (d *Detector) Tick(context.Context, time.Time) error {
	if d.fault != nil {
		return d.fault
	}
	d.checkClock()
	d.maybeCommit()
	return nil
}

// Close ends the run once every partition was released or lost: it stops reading drop markers and
// waits for a checkpoint still in flight (what it covers is not acknowledged any more: the
// partitions' next owners get those messages again and skip what the checkpoint reflects).
func (d *Detector) Close(ctx context.Context) error {
	d.markers.stop()
	if ok, _ := d.awaitFlight(ctx); !ok {
		d.logger.Warn("gap detector: a checkpoint was still being written at the stop deadline")
	}
	for _, e := range d.keys {
		d.drop(e)
	}
	clear(d.orphans)
	clear(d.owned)
	return nil
}

// Assigned starts owning partition p: the publishers of p with state in the bucket are loaded (their
// outboxes published, their drop markers caught up), so that one that stays silent is still found
// stale; their FPMs after the checkpoint are re-read before the first delivered one.
func (d *Detector) Assigned(ctx context.Context, p int) error {
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := d.preload(lctx, p); err != nil {
		return err
	}
	d.owned[p] = true
	d.logger.Info("gap detector: partition acquired", "partition", p, "consumer", d.cfg.PartitionConfig().ConsumerName(p))
	d.maybeCommit()
	return nil
}

// Release hands partition p on gracefully: it checkpoints every publisher of p (state written, events
// stored, even a state that only advanced its sequence), marks their messages done and forgets them.
// If ctx (the release deadline) ends first, what is not checkpointed is forgotten unacknowledged: the
// next owner gets those messages again.
func (d *Detector) Release(ctx context.Context, p int) error {
	d.releasing = p
	defer func() { d.releasing = -1 }()
	for _, e := range d.keys {
		if e.part == p && (e.changed || len(e.st.Outbox) > 0) {
			e.changed = true
			d.markDirty(e)
		}
	}
	for {
		ok, err := d.awaitFlight(ctx)
		if !ok {
			break
		}
		if !d.busy(p) {
			d.forget(p)
			delete(d.owned, p)
			d.logger.Info("gap detector: partition handed on", "partition", p)
			return nil
		}
		if err != nil && !pause(ctx, releasePause) {
			break
		}
		d.retryOrphans()
		d.startCommit()
		if d.flight == nil && !pause(ctx, releasePause) { // only orphans left, their reload failed
			break
		}
	}
	d.logger.Warn("gap detector: partition handed on before all of its publishers were checkpointed; the next owner gets their unacked messages again",
		"partition", p, "err", ctx.Err())
	d.forget(p)
	delete(d.owned, p)
	return nil
}

// Lost forgets partition p without writing anything (another instance may own it already). Its
// unacknowledged messages are redelivered to the next owner.
func (d *Detector) Lost(p int) {
	d.forget(p)
	delete(d.owned, p)
	d.logger.Info("gap detector: partition lost", "partition", p)
}

// owns reports whether k's partition is owned.
func (d *Detector) owns(k streams.Key) bool { return d.owned[d.partitionOf(k)] }

// busy reports whether a publisher of partition p holds something not checkpointed yet.
func (d *Detector) busy(p int) bool {
	for _, e := range d.keys {
		if e.part == p && (e.changed || e.isDirty || len(e.msgs) > 0 || len(e.st.Outbox) > 0) {
			return true
		}
	}
	for k := range d.orphans {
		if d.partitionOf(k) == p {
			return true
		}
	}
	return false
}

// applyMarkers applies, on the loop, the drop markers the reader has pulled.
func (d *Detector) applyMarkers() {
	var ended bool
	d.mkBuf, ended = d.markers.take(d.mkBuf[:0])
	for _, m := range d.mkBuf {
		if err := d.handleMarker(m); err != nil {
			if d.fault == nil {
				d.fault = err
			}
			break
		}
	}
	clear(d.mkBuf)
	if ended && d.fault == nil {
		d.fault = d.markers.failure()
	}
	d.maybeCommit()
}

// pause waits for d or until ctx ends; it reports whether ctx is still live.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
