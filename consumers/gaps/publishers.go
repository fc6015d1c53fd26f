package gaps

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// maxCatchUp bounds one catch-up read (messages); a longer one continues at the next message.
const maxCatchUp = 1 << 20

// entry is one owned publisher: its State (as last checkpointed, plus what the loop applied since),
// the KV revision of the checkpoint and the messages waiting for the next one.
type entry struct {
	key     streams.Key
	part    int // its partition
	kvSubj  string
	st      state
	t       tracker
	rev     uint64
	isDirty bool // in Detector.dirty: held messages or changes wait for a checkpoint
	changed bool // st differs from the checkpoint at rev
	// written is when st was last checkpointed (or loaded).
	written time.Time
	// catchUp: FPMs of this publisher may exist between st.StreamSeq and the next one delivered (a
	// fresh load after a restart, a takeover or a lost checkpoint race); read them from the stream
	// before applying the next delivered one (or before calling it stale).
	catchUp bool
	// waitSeq is the stream sequence of an FPM of it that waits for the drop markers stored up to
	// waitUntilMs (stream time) to be applied (Detector.waitsForMarkers), 0 if none: it and the FPMs
	// after it are read from the stream once they are. catchUp is set meanwhile.
	waitSeq     uint64
	waitUntilMs int64
	lastLocal   time.Time // when the loop last applied an FPM of it (wall clock, for the live stale check)
	msgs        []*durable.Msg
	dropped     bool // forgotten (drop): a subject's cached entry is looked up again
}

func (d *Detector) newEntry(k streams.Key) *entry {
	now := d.now()
	e := &entry{key: k, part: d.partitionOf(k), kvSubj: d.store.kvSubject(k), catchUp: true, lastLocal: now, written: now}
	e.st.V, e.st.Key = stateVersion, k
	e.t = tracker{key: k, st: &e.st, r: d.rules, onEmit: func(*Event) { d.newEvents = true }}
	return e
}

// partitionOf is k's partition.
func (d *Detector) partitionOf(k streams.Key) int { return d.cfg.PartitionOf(k) }

// restore sets e from its state entry raw; a deleted or unreadable entry leaves a fresh state.
func (d *Detector) restore(e *entry, raw *jetstream.RawStreamMsg) {
	e.rev = raw.Sequence
	st, err := decodeState(raw)
	if err != nil {
		d.logger.Error("gap detector: unreadable publisher state replaced by a fresh one", "key", e.key.String(),
			"revision", raw.Sequence, "err", err)
		return
	}
	if st.V == 0 {
		return // deleted
	}
	e.st = st
	e.st.Key = e.key
}

// preload loads the state of every publisher of partition p of the group not loaded yet, so that a
// publisher that stays silent after a takeover is still found stale, and publishes what its outbox
// holds.
func (d *Detector) preload(ctx context.Context, p int) error {
	return d.store.scanStates(ctx, func(k streams.Key, raw *jetstream.RawStreamMsg) error {
		if d.keys[k] != nil || d.partitionOf(k) != p {
			return nil
		}
		e := d.newEntry(k)
		d.restore(e, raw)
		if err := d.prepare(e); err != nil {
			return err
		}
		d.keys[k] = e
		return nil
	})
}

// entry returns the owned publisher k, loading its state from the bucket on first use.
func (d *Detector) entry(k streams.Key) (*entry, error) {
	if e := d.keys[k]; e != nil {
		return e, nil
	}
	return d.load(k, false)
}

// load loads k's state from the bucket, unless its partition's keys were read when it was assigned
// and k was not among them (a write by someone else since makes the first checkpoint fail and k
// reload with reread).
func (d *Detector) load(k streams.Key, reread bool) (*entry, error) {
	orphans, reread := d.orphans[k], reread || d.orphans[k] != nil
	e := d.newEntry(k)
	var raw *jetstream.RawStreamMsg
	var err error = jetstream.ErrMsgNotFound
	if reread || !d.owned[e.part] {
		raw, err = d.store.lastState(k)
	}
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// Never checkpointed: none of its FPMs was acked (the first one changes more than the
		// sequence, so it is acked only after its state is written), nothing to re-read.
		e.catchUp = false
	case err != nil:
		return nil, fmt.Errorf("load state: %w", err)
	default:
		d.restore(e, raw)
	}
	if err := d.prepare(e); err != nil {
		return nil, err
	}
	d.keys[k] = e
	if orphans != nil {
		delete(d.orphans, k)
		d.done(orphans)
	}
	return e, nil
}

// prepare finishes loading e: events of its outbox already stored are dropped from it, and drop
// markers stored after its MarkerSeq are applied.
func (d *Detector) prepare(e *entry) error {
	if len(e.st.Outbox) > 0 {
		if err := d.reconcileOutbox(e); err != nil {
			return err
		}
		d.touch(e)
	}
	if !d.markerSubjects[streams.DropMarkerSubject(e.key)] {
		return nil // no marker of it stored before the marker reader started nor read since
	}
	before := e.st.MarkerSeq
	if err := d.catchUpMarkers(e); err != nil {
		return err
	}
	if e.st.MarkerSeq != before {
		d.touch(e)
	}
	return nil
}

// reconcileOutbox removes from e's outbox the events already stored on its gap subject after
// EventStreamSeq (a previous run published them but could not checkpoint that).
func (d *Detector) reconcileOutbox(e *entry) error {
	stored := map[string]bool{}
	from := e.st.EventStreamSeq + 1
	for {
		raw, err := d.store.nextEvent(e.key, from)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return fmt.Errorf("gaps: read events of %s: %w", e.key, err)
		}
		stored[raw.Header.Get(streams.HeaderMsgID)] = true
		e.st.EventStreamSeq = raw.Sequence
		from = raw.Sequence + 1
	}
	keep := e.st.Outbox[:0]
	for _, ev := range e.st.Outbox {
		if !stored[ev.ID] {
			keep = append(keep, ev)
		}
	}
	e.st.Outbox = keep
	return nil
}

// catchUpMarkers applies the drop markers of e stored after its MarkerSeq.
func (d *Detector) catchUpMarkers(e *entry) error {
	for from, n := e.st.MarkerSeq+1, 0; n < maxCatchUp; n++ {
		raw, err := d.store.nextMarker(e.key, from)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("gaps: read drop markers of %s: %w", e.key, err)
		}
		d.applyMarker(e, raw.Data, raw.Sequence, raw.Subject)
		from = raw.Sequence + 1
	}
	return nil
}

// catchUpFPM applies the FPMs of e stored after its StreamSeq and before stream sequence before.
func (d *Detector) catchUpFPM(e *entry, before uint64) error {
	for n := 0; n < maxCatchUp && e.st.StreamSeq+1 < before; n++ {
		raw, err := d.store.nextFPM(e.key, e.st.StreamSeq+1)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return fmt.Errorf("gaps: catch up %s: %w", e.key, err)
		}
		if raw.Sequence >= before {
			break
		}
		o, err := observation(raw.Header, raw.Data, raw.Sequence, raw.Time)
		d.touch(e)
		if err != nil {
			e.st.StreamSeq = raw.Sequence
			continue
		}
		if d.waitsForMarkers(e, &o) {
			return nil // catchUp stays set: read on once the markers are applied
		}
		d.apply(e, &o)
	}
	e.catchUp = false
	return nil
}

// parseCounter reads counter_id from an FPM body (for messages without Fpm-Seq).
func parseCounter(body []byte) (uint64, error) {
	f, err := schemas.ParseFPMJSON(body)
	if err != nil {
		return 0, err
	}
	if f.CounterID < 0 {
		return 0, fmt.Errorf("counter_id %d is negative", f.CounterID)
	}
	return uint64(f.CounterID), nil
}

// drop forgets e; its held messages are not marked done (the partition's next owner gets them again).
func (d *Detector) drop(e *entry) {
	e.dropped = true
	d.held -= len(e.msgs)
	e.msgs = nil
	delete(d.keys, e.key)
	for i, x := range d.dirty {
		if x == e {
			d.dirty = append(d.dirty[:i], d.dirty[i+1:]...)
			break
		}
	}
	e.isDirty = false
}

// forget drops every loaded publisher of partition p and the orphans of p, without marking their
// held messages done.
func (d *Detector) forget(p int) {
	for _, e := range d.keys {
		if e.part == p {
			d.drop(e)
		}
	}
	for k := range d.orphans {
		if d.partitionOf(k) == p {
			delete(d.orphans, k)
		}
	}
}

// reload replaces e, whose checkpoint another writer changed, by the state in the bucket. Its held
// messages are marked done once it is: the reloaded entry re-reads from the stream every FPM after
// its checkpoint. If the bucket cannot be read, they wait as orphans until a later load succeeds.
func (d *Detector) reload(e *entry, msgs []*durable.Msg) {
	d.drop(e)
	d.orphans[e.key] = append(d.orphans[e.key], msgs...)
	if _, err := d.load(e.key, true); err != nil {
		d.logger.Warn("gap detector: reload publisher state (retried)", "key", e.key.String(), "err", err)
	}
}

// retryOrphans loads again the publishers whose reload failed (marking their messages done), and
// forgets the orphans of partitions no longer owned.
func (d *Detector) retryOrphans() {
	for k := range d.orphans {
		if !d.owns(k) {
			delete(d.orphans, k)
			continue
		}
		if _, err := d.entry(k); err != nil {
			d.logger.Warn("gap detector: reload publisher state (retried)", "key", k.String(), "err", err)
		}
	}
}
