package gaps

import (
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/streams"
)

// subjectOf parses (once per subject) the publisher key of an FPM or drop marker subject.
func (d *Detector) subjectOf(subject, root string) *subjectKey {
	if sk := d.subjects[subject]; sk != nil {
		return sk
	}
	k, err := streams.ParseKeySubject(subject, root)
	if len(d.subjects) > 1<<16 {
		clear(d.subjects)
	}
	sk := &subjectKey{key: k, ok: err == nil}
	d.subjects[subject] = sk
	return sk
}

// entryOf is the owned publisher of subject sk, loaded on first use (cached in sk until dropped).
func (d *Detector) entryOf(sk *subjectKey) (*entry, error) {
	if e := sk.e; e != nil && !e.dropped {
		return e, nil
	}
	e, err := d.entry(sk.key)
	sk.e = e
	return e, err
}

// handleFPM applies one delivered FPM. It is held until its publisher's next checkpoint; one that
// can never be used is rejected (dead-lettered by the runner).
func (d *Detector) handleFPM(m *durable.Msg, now time.Time) error {
	seq := m.StreamSeq // the FPM stream sequence, also when the group reads a partition stream
	sk := d.subjectOf(m.Subject(), streams.FPMRoot)
	if !sk.ok {
		d.reject(m, streams.StreamFPM, fmt.Errorf("subject %q is not fpm.<namespace>.<component>.<worker_id>.<dp_rank>", m.Subject()))
		return nil
	}
	key := sk.key
	e, err := d.entryOf(sk)
	if err != nil {
		// Not done and not skippable: give the partition up (the runner fails, another member takes it).
		return fmt.Errorf("gaps: load state of %s: %w", key, err)
	}
	if e.part != m.Partition {
		d.logger.Warn("gap detector: publisher delivered on another partition than computed", "key", key.String(), "partition", m.Partition, "computed", e.part)
	}
	if seq <= e.st.StreamSeq {
		d.hold(e, m)
		d.metrics.skipped.Inc()
		return nil
	}
	if e.catchUp {
		if err := d.catchUpFPM(e, seq); err != nil {
			return err
		}
	}
	o, err := observation(m.Headers(), m.Data(), seq, m.Stored)
	d.touch(e)
	if err != nil {
		if e.waitSeq == 0 {
			e.st.StreamSeq = seq // passed: a catch-up read skips it too
		}
		d.reject(m, streams.StreamFPM, fmt.Errorf("FPM without usable sequence headers: %w", err))
		return nil
	}
	d.hold(e, m)
	if d.waitsForMarkers(e, &o) {
		return nil // read from the stream once the markers are applied
	}
	d.apply(e, &o)
	e.lastLocal = now
	return nil
}

// reject gives up a message of stream that can never be used: the runner dead-letters it (under
// cumulative acks it is then done, acknowledged with the ones around it).
func (d *Detector) reject(m *durable.Msg, stream string, err error) {
	d.metrics.invalid.WithLabelValues(stream).Inc()
	d.logger.Warn("gap detector: unusable message rejected", "subject", m.Subject(), "stream_seq", m.StreamSeq, "err", err)
	m.Reject(err)
}

// waitsForMarkers reports whether o is left unapplied for now: it waits for drop markers
// (tracker.waitsForMarkers) or comes after an FPM of e that does. It is then read from the stream
// (catchUpFPM) once the markers stored up to its stream time plus the marker grace are applied.
// Its delivery is acknowledged with e's next checkpoint, which stays before it: a detector started
// from that checkpoint reads it from the stream the same way.
func (d *Detector) waitsForMarkers(e *entry, o *fpmObservation) bool {
	if e.waitSeq == 0 {
		if !e.t.waitsForMarkers(o) {
			return false
		}
		e.waitSeq, e.waitUntilMs = o.StreamSeq, o.StoredMs+d.rules.graceMs
	}
	if o.StreamSeq == e.waitSeq && d.markersAppliedMs() >= e.waitUntilMs {
		e.waitSeq, e.waitUntilMs = 0, 0
		return false
	}
	e.catchUp = true
	return true
}

// markersAppliedMs is the stream time up to which every drop marker stored has been applied, as far
// as the loop knows: the newest marker applied, or when the marker reader was last seen caught up.
func (d *Detector) markersAppliedMs() int64 { return max(d.mkLastStoredMs, d.mkCaughtUpMs) }

func (d *Detector) apply(e *entry, o *fpmObservation) {
	c := e.st.Counters
	e.t.observe(o)
	n := &e.st.Counters
	add := func(m prometheus.Counter, before, after uint64) {
		if after != before { // most FPMs change one counter: spare the others an atomic add
			m.Add(float64(after - before))
		}
	}
	add(d.metrics.messages, c.Messages, n.Messages)
	add(d.metrics.heartbeats, c.Heartbeats, n.Heartbeats)
	add(d.metrics.duplicates, c.Duplicates, n.Duplicates)
	add(d.metrics.outOfOrder, c.OutOfOrder, n.OutOfOrder)
}

// handleMarker applies one drop marker from the reader (nothing to ack; a publisher loaded later
// reads the markers after its MarkerSeq by direct get).
func (d *Detector) handleMarker(m jetstream.Msg) error {
	meta, err := m.Metadata()
	if err != nil {
		return nil
	}
	seq := meta.Sequence.Stream
	d.mkDelivered, d.mkDeliveredFrom = meta.Sequence.Consumer, meta.Consumer
	d.mkLastStoredMs = max(d.mkLastStoredMs, meta.Timestamp.UnixMilli())
	d.markerSubjects[m.Subject()] = true
	sk := d.subjectOf(m.Subject(), streams.DropMarkerRoot)
	key := sk.key
	if !sk.ok {
		d.metrics.invalid.WithLabelValues(streams.StreamEvents).Inc()
		d.logger.Warn("gap detector: drop marker with a bad subject ignored", "subject", m.Subject())
		return nil
	}
	if !d.owns(key) {
		return nil
	}
	e, err := d.entry(key)
	if err != nil {
		return fmt.Errorf("gaps: load state of %s: %w", key, err)
	}
	if seq <= e.st.MarkerSeq {
		d.metrics.skipped.Inc()
		return nil
	}
	d.applyMarker(e, m.Data(), seq, m.Subject())
	return nil
}

// applyMarker parses and applies a drop marker body stored at FPM_EVENTS sequence seq.
func (d *Detector) applyMarker(e *entry, body []byte, seq uint64, subject string) {
	d.touch(e)
	dm, err := streams.ParseDropMarker(body)
	if err != nil {
		e.st.MarkerSeq = seq
		d.metrics.invalid.WithLabelValues(streams.StreamEvents).Inc()
		d.logger.Warn("gap detector: bad drop marker skipped", "subject", subject, "stream_seq", seq, "err", err)
		return
	}
	if dm.Key != e.key {
		d.logger.Warn("gap detector: drop marker key differs from its subject; the subject wins", "subject", subject, "marker_key", dm.Key)
	}
	e.t.addMarker(dm, seq)
	d.metrics.markers.Inc()
}

// observation reads an FPM's sequence, epoch, observed time, bridge and how its run began from its
// headers (Fpm-Seq, Fpm-Epoch, Fpm-Received-At-Ms, Fpm-Bridge, Fpm-Run-Start) and whether its body is
// a heartbeat. Without
// Fpm-Seq the payload's counter_id is used; without Fpm-Received-At-Ms the stream time.
func observation(h map[string][]string, body []byte, streamSeq uint64, stored time.Time) (fpmObservation, error) {
	get := func(k string) string {
		if v := h[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	o := fpmObservation{StreamSeq: streamSeq, StoredMs: stored.UnixMilli(), Bridge: get(streams.HeaderBridge)}
	if s := get(streams.HeaderSeq); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return o, fmt.Errorf("%s %q: %w", streams.HeaderSeq, s, err)
		}
		o.Seq = v
	} else {
		f, err := parseCounter(body)
		if err != nil {
			return o, fmt.Errorf("no %s header and %w", streams.HeaderSeq, err)
		}
		o.Seq = f
	}
	if s := get(streams.HeaderEpoch); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return o, fmt.Errorf("%s %q: %w", streams.HeaderEpoch, s, err)
		}
		o.Epoch = v
	}
	o.ObservedAtMs = o.StoredMs
	if s := get(streams.HeaderReceivedAt); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return o, fmt.Errorf("%s %q: %w", streams.HeaderReceivedAt, s, err)
		}
		o.ObservedAtMs = v
	}
	o.SeqMismatch = get(streams.HeaderSeqMismatch) != ""
	o.RunStart = get(streams.HeaderRunStart)
	o.Heartbeat = isHeartbeat(body)
	return o, nil
}
