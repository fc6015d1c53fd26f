package gaps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// maxCatchUp bounds one catch-up read (messages); a longer one continues at the next message.
const maxCatchUp = 1 << 20

// kvSubject is the subject of k's state entry in the bucket.
func (d *Detector) kvSubject(k streams.Key) string {
	return "$KV." + d.cfg.StateBucket + "." + kvKey(d.cfg.Group, k)
}

func (d *Detector) newEntry(k streams.Key) *entry {
	now := d.now()
	e := &entry{key: k, part: d.partitionOf(k), kvSubj: d.kvSubject(k), catchUp: true, lastLocal: now, written: now}
	e.st.V, e.st.Key = stateVersion, k
	e.t = tracker{key: k, st: &e.st, r: d.rules, onEmit: func(*Event) { d.newEvents = true }}
	return e
}

// decodeState reads one state entry (a KV message) into e; a deleted entry leaves a fresh state.
func (d *Detector) decodeState(e *entry, raw *jetstream.RawStreamMsg) {
	e.rev = raw.Sequence
	switch raw.Header.Get("KV-Operation") {
	case "DEL", "PURGE":
		return
	}
	var st State
	if err := json.Unmarshal(raw.Data, &st); err != nil || st.V != stateVersion {
		d.logger.Error("gap detector: unreadable publisher state replaced by a fresh one", "key", e.key.String(),
			"revision", raw.Sequence, "err", err, "version", st.V)
		return
	}
	e.st = st
	e.st.Key = e.key
}

// preload loads the state of every publisher of partition p of the group not loaded yet, so that a
// publisher that stays silent after a takeover is still found stale, and publishes what its outbox
// holds.
func (d *Detector) preload(ctx context.Context, p int) error {
	filter := "$KV." + d.cfg.StateBucket + "." + d.cfg.Group + ".>"
	oc, err := d.kvStream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return fmt.Errorf("gaps: read state bucket %s: %w", d.cfg.StateBucket, err)
	}
	info, err := oc.Info(ctx)
	if err != nil {
		return fmt.Errorf("gaps: read state bucket %s: %w", d.cfg.StateBucket, err)
	}
	left := info.NumPending
	prefix := len("$KV." + d.cfg.StateBucket + ".")
	for left > 0 {
		batch, err := oc.Fetch(int(min(left, 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("gaps: read state bucket %s: %w", d.cfg.StateBucket, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			left--
			k, ok := keyFromKV(d.cfg.Group, m.Subject()[prefix:])
			if !ok || d.keys[k] != nil || d.partitionOf(k) != p {
				continue
			}
			meta, err := m.Metadata()
			if err != nil {
				continue
			}
			e := d.newEntry(k)
			d.decodeState(e, &jetstream.RawStreamMsg{Subject: m.Subject(), Sequence: meta.Sequence.Stream, Header: m.Headers(), Data: m.Data()})
			if err := d.prepare(e); err != nil {
				return err
			}
			d.keys[k] = e
		}
		if err := batch.Error(); err != nil {
			return fmt.Errorf("gaps: read state bucket %s: %w", d.cfg.StateBucket, err)
		}
		if n == 0 {
			break
		}
	}
	return nil
}

// entry returns the owned publisher k, loading its state from the bucket on first use.
func (d *Detector) entry(k streams.Key) (*entry, error) {
	if e := d.keys[k]; e != nil {
		return e, nil
	}
	return d.load(k, false)
}

// load loads k's state from the bucket, unless its partition's keys were read when it was acquired
// and k was not among them (a write by someone else since makes the first checkpoint fail and k
// reload with reread).
func (d *Detector) load(k streams.Key, reread bool) (*entry, error) {
	orphans, reread := d.orphans[k], reread || d.orphans[k] != nil
	e := d.newEntry(k)
	var raw *jetstream.RawStreamMsg
	var err error = jetstream.ErrMsgNotFound
	if s := d.part.sess[e.part]; reread || s == nil || !s.scanned {
		ctx, cancel := d.ioCtx()
		raw, err = d.kvStream.GetLastMsgForSubject(ctx, e.kvSubj)
		cancel()
	}
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// Never checkpointed: none of its FPMs was acked (the first one changes more than the
		// sequence, so it is acked only after its state is written), nothing to re-read.
		e.catchUp = false
	case err != nil:
		return nil, fmt.Errorf("load state: %w", err)
	default:
		d.decodeState(e, raw)
	}
	if err := d.prepare(e); err != nil {
		return nil, err
	}
	d.keys[k] = e
	if orphans != nil {
		delete(d.orphans, k)
		d.release(orphans)
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
		return nil // no marker of it stored before the marker consumer started nor read since
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
	subj := streams.GapEventSubject(e.key)
	for {
		ctx, cancel := d.ioCtx()
		raw, err := d.evStream.GetMsg(ctx, from, jetstream.WithGetMsgSubject(subj))
		cancel()
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
	subj := streams.DropMarkerSubject(e.key)
	for from, n := e.st.MarkerSeq+1, 0; n < maxCatchUp; n++ {
		ctx, cancel := d.ioCtx()
		raw, err := d.evStream.GetMsg(ctx, from, jetstream.WithGetMsgSubject(subj))
		cancel()
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
	subj := streams.FPMSubject(e.key)
	for n := 0; n < maxCatchUp && e.st.StreamSeq+1 < before; n++ {
		ctx, cancel := d.ioCtx()
		raw, err := d.fpmStream.GetMsg(ctx, e.st.StreamSeq+1, jetstream.WithGetMsgSubject(subj))
		cancel()
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

// drop forgets e; its held messages stay unacked (the partition's next owner gets them again).
func (d *Detector) drop(e *entry) {
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

// reload replaces e, whose checkpoint another writer changed, by the state in the bucket. Its held
// messages are released: the reloaded entry re-reads from the stream every FPM after its checkpoint.
// If the bucket cannot be read, they wait as orphans until a later load succeeds.
func (d *Detector) reload(e *entry, msgs []heldMsg) {
	d.drop(e)
	d.orphans[e.key] = append(d.orphans[e.key], msgs...)
	if _, err := d.load(e.key, true); err != nil {
		d.logger.Warn("gap detector: reload publisher state (retried)", "key", e.key.String(), "err", err)
	}
}

// retryOrphans loads again the publishers whose reload failed (releasing their messages), and
// forgets the orphans of partitions no longer owned.
func (d *Detector) retryOrphans() {
	for k := range d.orphans {
		if !d.part.Owns(k) {
			delete(d.orphans, k)
			continue
		}
		if _, err := d.entry(k); err != nil {
			d.logger.Warn("gap detector: reload publisher state (retried)", "key", k.String(), "err", err)
		}
	}
}

// isRevoking reports whether partition p is being handed on (checkpoint everything changed).
func (d *Detector) isRevoking(p int) bool {
	s := d.part.sess[p]
	return s != nil && s.revoking
}

// commitItem is one publisher's part of a checkpoint: its state bytes (nil when only already
// reflected redeliveries are held), the events of its outbox and the messages the checkpoint covers.
// The loop fills the inputs; the commit goroutine fills the results.
type commitItem struct {
	e      *entry
	data   []byte
	rev    uint64
	events []Event
	msgs   []heldMsg

	newRev    uint64
	conflict  bool
	err       error
	confirmed map[string]uint64 // event id -> FPM_EVENTS sequence
	safe      bool              // state and events stored: the loop releases the messages
}

// inflight is a checkpoint being written by its goroutine; done is closed when it has finished.
type inflight struct {
	items []*commitItem
	done  chan struct{}
	start time.Time
}

// startCommit snapshots every dirty publisher into a checkpoint and writes it in the background,
// so that the loop goes on applying messages meanwhile. At most one checkpoint is in flight: the
// next one needs the revisions this one writes.
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
		if e.changed && (e.t.significant || d.stopping || d.isRevoking(e.part) || f.start.Sub(e.written) >= d.cfg.CheckpointInterval) {
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
	go d.write(f)
}

// write is the checkpoint goroutine. For every publisher, in this order:
//
//  1. its state (outbox included) is written to the bucket, expecting the revision last read or
//     written; a refusal means another writer updated it (the loop drops and reloads it);
//  2. its outbox events are published with their ids (the server deduplicates a repeat);
//  3. the messages the checkpoint covers are safe to ack once 1 and 2 succeeded (finishCommit
//     releases them, ackSafe acks); on a conflict they are released after the publisher is reloaded
//     (which re-reads them from the stream).
//
// It touches no loop state: results go into the items, read by finishCommit after done is closed.
func (d *Detector) write(f *inflight) {
	defer close(f.done)
	timeout := time.NewTimer(d.cfg.PublishTimeout)
	defer timeout.Stop()
	expired := false
	wait := func(fut jetstream.PubAckFuture) (*jetstream.PubAck, error) {
		if expired {
			select {
			case ack := <-fut.Ok():
				return ack, nil
			case err := <-fut.Err():
				return nil, err
			default:
				return nil, jetstream.ErrAsyncPublishTimeout
			}
		}
		select {
		case ack := <-fut.Ok():
			return ack, nil
		case err := <-fut.Err():
			return nil, err
		case <-timeout.C:
			expired = true
			return nil, jetstream.ErrAsyncPublishTimeout
		}
	}
	futs := make([]jetstream.PubAckFuture, len(f.items))
	for i, it := range f.items {
		if it.data == nil {
			continue
		}
		fut, err := d.js.PublishMsgAsync(&nats.Msg{Subject: it.e.kvSubj, Data: it.data}, jetstream.WithExpectLastSequencePerSubject(it.rev))
		if err != nil {
			it.err = fmt.Errorf("write state of %s: %w", it.e.key, err)
			continue
		}
		futs[i] = fut
	}
	for i, it := range f.items {
		if futs[i] == nil {
			continue
		}
		ack, err := wait(futs[i])
		var apiErr *jetstream.APIError
		switch {
		case err == nil:
			it.newRev = ack.Sequence
		case errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence:
			it.conflict = true
		default:
			it.err = fmt.Errorf("write state of %s: %w", it.e.key, err)
		}
	}
	type pub struct {
		it  *commitItem
		id  string
		fut jetstream.PubAckFuture
	}
	var pubs []pub
	for _, it := range f.items {
		if it.conflict || it.err != nil {
			continue
		}
		for i := range it.events {
			ev := &it.events[i]
			body, err := json.Marshal(ev)
			if err != nil {
				it.err = fmt.Errorf("encode event %s: %w", ev.ID, err)
				break
			}
			msg := nats.NewMsg(ev.Subject())
			msg.Data = body
			msg.Header.Set(streams.HeaderEventType, ev.Type)
			msg.Header.Set(streams.HeaderGapEventSeq, strconv.FormatUint(ev.EventSeq, 10))
			msg.Header.Set(streams.HeaderEpoch, strconv.FormatInt(ev.Epoch, 10))
			fut, err := d.js.PublishMsgAsync(msg, jetstream.WithMsgID(ev.ID))
			if err != nil {
				it.err = fmt.Errorf("publish event %s: %w", ev.ID, err)
				break
			}
			pubs = append(pubs, pub{it, ev.ID, fut})
		}
	}
	if len(pubs) > 0 && expired {
		expired = false
		timeout.Reset(d.cfg.PublishTimeout)
	}
	for _, p := range pubs {
		ack, err := wait(p.fut)
		if err != nil {
			if p.it.err == nil {
				p.it.err = fmt.Errorf("publish event %s: %w", p.id, err)
			}
			continue
		}
		if p.it.confirmed == nil {
			p.it.confirmed = map[string]uint64{}
		}
		p.it.confirmed[p.id] = ack.Sequence
	}
	for _, it := range f.items {
		switch {
		case it.conflict:
			// Left to finishCommit: the publisher is reloaded, then its messages acked.
		case it.err == nil && len(it.confirmed) == len(it.events):
			it.safe = true
		}
	}
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
			d.release(it.msgs)
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
			d.held -= len(it.msgs) // unacked: the partition's next owner gets them again
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
	default:
		d.metrics.stateEvents.WithLabelValues(ev.Type).Inc()
	}
	d.logger.Info("gap event", "type", ev.Type, "cause", ev.Cause, "key", ev.Key.String(),
		"missing", ev.Missing, "id", ev.ID)
}
