package gaps

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fpmbus/fpmbus/consumers/durable"
)

// inflight is a checkpoint being written by its goroutine; done is closed when it has finished.
type inflight struct {
	items []*commitItem
	done  chan struct{}
	start time.Time
}

// touch records that e's state changed since its checkpoint.
func (d *Detector) touch(e *entry) {
	e.changed = true
	d.markDirty(e)
}

func (d *Detector) markDirty(e *entry) {
	if !e.isDirty {
		e.isDirty = true
		d.dirty = append(d.dirty, e)
	}
}

// hold keeps m until e's next checkpoint.
func (d *Detector) hold(e *entry, m *durable.Msg) {
	e.msgs = append(e.msgs, m)
	d.held++
	d.markDirty(e)
}

// done marks messages whose effect is checkpointed done: the runner acknowledges them (a message of
// a partition handed on or lost since is not acknowledged here any more).
func (d *Detector) done(msgs []*durable.Msg) {
	for _, m := range msgs {
		m.Done()
	}
}

// maybeCommit starts a checkpoint, unless one is in flight, when no more messages are waiting, when
// events wait to be published, when an eighth of MaxAckPending waits, or when CommitInterval has
// passed. (A partition being handed on is checkpointed by Release itself.)
func (d *Detector) maybeCommit() {
	if len(d.dirty) == 0 || d.flight != nil {
		return
	}
	now := d.now()
	idle := !d.backlog && d.markers.idle()
	if !idle && d.held < d.cfg.MaxAckPending/8 && now.Sub(d.lastCommit) < d.cfg.CommitInterval && !d.newEvents {
		return
	}
	d.lastCommit = now
	d.startCommit()
}

// startCommit snapshots every dirty publisher into a checkpoint and writes it in the background,
// so that the loop goes on applying messages meanwhile; the result comes back to the loop with
// Runner.Do. At most one checkpoint is in flight: the next one needs the revisions this one writes.
func (d *Detector) startCommit() {
	if d.flight != nil || len(d.dirty) == 0 {
		return
	}
	f := &inflight{done: make(chan struct{}), start: time.Now()}
	d.newEvents = false
	for _, e := range d.dirty {
		e.isDirty = false
		it := &commitItem{e: e, rev: e.rev, msgs: e.msgs}
		e.msgs = nil
		// A state that only advanced its sequence is written at most every CheckpointInterval: its
		// messages are acked anyway (a restart re-reads them from the stream after the checkpoint).
		if e.changed && (e.t.significant || e.part == d.releasing || f.start.Sub(e.written) >= d.cfg.CheckpointInterval) {
			data, err := json.Marshal(&e.st)
			if err != nil { // cannot happen: State has only plain fields
				d.logger.Error("gap detector: encode state", "key", e.key.String(), "err", err)
				e.msgs = it.msgs
				continue
			}
			it.data = data
			e.changed = false
			e.t.significant = false
			e.written = f.start
		}
		it.events = append([]Event(nil), e.st.Outbox...)
		f.items = append(f.items, it)
	}
	d.dirty = d.dirty[:0]
	d.flight = f
	go func() {
		d.store.write(f.items)
		close(f.done)
		d.runner.Do(func() {
			if d.flight == f { // not finished by a synchronous wait (Release, Close) meanwhile
				d.finishFlight()
			}
		})
	}()
}

// finishFlight applies the finished checkpoint and considers the next one.
func (d *Detector) finishFlight() {
	if err := d.finishCommit(); err != nil {
		d.logger.Warn("gap detector: checkpoint failed; retrying (messages stay unacked)", "err", err)
	}
	d.maybeCommit()
}

// awaitFlight waits for the checkpoint in flight, if any, and applies it; err is its failure (its
// messages wait for the next one). It reports false when ctx ended first (still in flight).
func (d *Detector) awaitFlight(ctx context.Context) (ok bool, err error) {
	if d.flight == nil {
		return true, nil
	}
	select {
	case <-d.flight.done:
	case <-ctx.Done():
		return false, nil
	}
	if err = d.finishCommit(); err != nil {
		d.logger.Warn("gap detector: checkpoint failed; retrying (messages stay unacked)", "err", err)
	}
	return true, err
}

// finishCommit applies a finished checkpoint's results to the loop state.
func (d *Detector) finishCommit() error {
	f := d.flight
	d.flight = nil
	d.metrics.commit.Observe(time.Since(f.start).Seconds())
	var firstErr error
	for _, it := range f.items {
		e := it.e
		live := d.keys[e.key] == e
		if it.safe || it.conflict {
			d.held -= len(it.msgs)
		}
		if it.safe {
			d.done(it.msgs)
		}
		if it.conflict {
			if live {
				d.metrics.conflicts.Inc()
				d.logger.Warn("gap detector: publisher state changed by another writer; reloading", "key", e.key.String())
				d.held -= len(e.msgs)
				held := append(it.msgs, e.msgs...)
				e.msgs = nil
				d.reload(e, held)
			}
			continue
		}
		if it.data != nil && it.err == nil {
			e.rev = it.newRev
		}
		for i := range it.events {
			if seq, ok := it.confirmed[it.events[i].ID]; ok {
				d.stored(&it.events[i])
				e.st.EventStreamSeq = max(e.st.EventStreamSeq, seq)
			}
		}
		if len(it.confirmed) > 0 {
			keep := e.st.Outbox[:0]
			for _, ev := range e.st.Outbox {
				if _, ok := it.confirmed[ev.ID]; !ok {
					keep = append(keep, ev)
				}
			}
			clear(e.st.Outbox[len(keep):])
			e.st.Outbox = keep
			if live {
				d.touch(e) // checkpoint the emptied outbox with the next commit
			}
		}
		if it.safe {
			continue
		}
		if firstErr == nil {
			firstErr = it.err
			if firstErr == nil {
				firstErr = fmt.Errorf("events of %s not all stored", e.key)
			}
		}
		if !live {
			d.held -= len(it.msgs) // not done: the partition's next owner gets them again
			continue
		}
		// Retry with the next checkpoint: the messages wait again, the state is written again.
		e.msgs = append(it.msgs, e.msgs...)
		if it.data != nil && it.err != nil {
			e.changed, e.t.significant = true, true
		}
		d.markDirty(e)
	}
	return firstErr
}

// stored records metrics for an event confirmed stored on FPM_EVENTS.
func (d *Detector) stored(ev *Event) {
	switch ev.Type {
	case TypeGap:
		d.metrics.events.WithLabelValues(ev.Cause).Inc()
		d.metrics.missing.WithLabelValues(ev.Cause).Add(float64(ev.Missing))
		if ev.After != nil && ev.After.ObservedAtMs > 0 {
			delay := time.Since(time.UnixMilli(ev.After.ObservedAtMs))
			d.metrics.delay.WithLabelValues(ev.Cause).Observe(max(delay.Seconds(), 0))
		}
	case TypeRecovered:
		d.metrics.recovered.WithLabelValues(ev.Cause).Add(float64(ev.Missing))
	default:
		d.metrics.stateEvents.WithLabelValues(ev.Type).Inc()
	}
	d.logger.Info("gap event", "type", ev.Type, "cause", ev.Cause, "key", ev.Key.String(),
		"missing", ev.Missing, "id", ev.ID)
}
