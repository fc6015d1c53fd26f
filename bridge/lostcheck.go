package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/streams"
)

// The lost_after_ack check: compare what the bridge counted as stored (its ack records, acked.go)
// with what the FPM stream holds, and report every acknowledged FPM that is gone.
//
// A power cut or OS crash before the server's fsync, or a damaged block file the server cuts on its
// next start, loses the newest messages of a stream: the stream's tail. So the check asks, per
// publisher key, for the newest FPM the stream still holds on the key's subject (a direct get by
// subject, answered by the stream's leader) and compares its stream sequence with the newest one an ack named:
//
//   - a run whose newest acknowledged stream sequence is at or below the stored one lost nothing;
//   - a run whose acks all lie below the stream's first sequence was removed from the stream's head,
//     by its limits (age, size) or by a purge that reached the head, which is not reported;
//   - otherwise the run's acknowledged FPMs after the stored one are lost: after its sequence number
//     when the stored FPM is of the same run, the whole run when the stream holds nothing of the key
//     or only an older run's.
//
// Each loss becomes one streams.LostAfterAck event on the key's gap subject (deterministic id: a loss
// found twice is stored once within the duplicate window), a log line and the counter
// fpmbus_bridge_lost_after_ack_total; the record is then cut back to what the stream holds, so the
// same loss is not reported again. The check runs before the bridge publishes anything: at start,
// over every record in the bucket, and after each reconnect, over the records of this bridge's keys,
// before the first publish on the new connection (a new FPM on the key's subject would hide the loss).
// A loss in the middle of a run (the stream still holding newer FPMs of the key) is not a tail and is
// not seen; neither is anything acknowledged after the record's last write (at most
// ackCheckpointInterval before a crash of the bridge itself).

const (
	// startCheckTimeout bounds the check at start.
	startCheckTimeout = 30 * time.Second
	// reconnectCheckBudget bounds the check after a reconnect, retries included (JetStream may still be
	// recovering its streams when clients are back); publishing waits for it.
	reconnectCheckBudget = 10 * time.Second
	checkOpTimeout       = 2 * time.Second
)

const (
	triggerStart     = "start"
	triggerReconnect = "reconnect"
)

// storedRecord is an ack record read from the bucket with its revision.
type storedRecord struct {
	rec ackRecord
	rev uint64
}

// openAckBucket opens (creating when missing) the ack records bucket.
func (b *Bridge) openAckBucket(ctx context.Context) (jetstream.KeyValue, error) {
	return b.openBucket(ctx, b.cfg.Streams.BridgeAcksBucket())
}

// openBucket opens (creating when missing) one of the bridge's own KV buckets within startCheckTimeout.
// A user whose permissions do not cover the bucket gets no answer at all from the server, so a refusal
// ends the wait at once and is the error returned (wrapping natsconn.ErrRefused).
func (b *Bridge) openBucket(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	ctx, cancel := context.WithTimeout(ctx, startCheckTimeout)
	defer cancel()
	ctx, stop := natsconn.RefusalContext(ctx, b.js.Conn())
	defer stop()
	kv, err := streams.EnsureKeyValue(ctx, b.js, cfg)
	if cause := context.Cause(ctx); err != nil && errors.Is(cause, natsconn.ErrRefused) {
		err = cause
	}
	return kv, err
}

// checkAtStart compares every record in the bucket with the stream, reports what is lost and cuts the
// records back. It returns the number of FPMs reported lost.
func (b *Bridge) checkAtStart(ctx context.Context) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, startCheckTimeout)
	defer cancel()
	recs, err := b.readAckRecords(ctx)
	if err != nil {
		return 0, err
	}
	bounds, err := b.fpmBounds(ctx)
	if err != nil {
		return 0, err
	}
	var total uint64
	var errs []error
	for _, sr := range recs {
		rec := sr.rec
		n, changed, err := b.checkRecord(ctx, &rec, bounds, triggerStart)
		total += n
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !changed {
			continue
		}
		body, _ := json.Marshal(rec)
		octx, ocancel := context.WithTimeout(ctx, checkOpTimeout)
		// Expect the revision read: a record its live bridge rewrote meanwhile is newer than the check.
		_, err = b.acks.Update(octx, streams.BridgeAckKey(rec.Key), body, sr.rev)
		ocancel()
		if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			errs = append(errs, fmt.Errorf("bridge: cut back the ack record of %s: %w", rec.Key, err))
		}
	}
	return total, errors.Join(errs...)
}

// checkLedger compares the records of this bridge's keys with the stream after a reconnect, cutting
// them back in place (they are written with the next checkpoint). It retries for up to
// reconnectCheckBudget while JetStream does not answer.
func (b *Bridge) checkLedger(l *ledger) (uint64, error) {
	if len(l.recs) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), reconnectCheckBudget)
	defer cancel()
	done := map[streams.Key]bool{}
	var total uint64
	for {
		bounds, err := b.fpmBounds(ctx)
		if err == nil {
			for k, rec := range l.recs {
				if done[k] {
					continue
				}
				var n uint64
				var changed bool
				if n, changed, err = b.checkRecord(ctx, rec, bounds, triggerReconnect); err != nil {
					break
				}
				total += n
				done[k] = true
				if changed {
					l.dirty[k] = true
				}
			}
		}
		if err == nil {
			return total, nil
		}
		select {
		case <-ctx.Done():
			return total, fmt.Errorf("bridge: lost_after_ack check after reconnect: %d of %d publisher keys checked: %w", len(done), len(l.recs), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// readAckRecords reads every record of the bucket with its revision.
func (b *Bridge) readAckRecords(ctx context.Context) ([]storedRecord, error) {
	w, err := b.acks.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("bridge: read ack records: %w", err)
	}
	defer func() { _ = w.Stop() }()
	var out []storedRecord
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				return out, nil
			}
			var rec ackRecord
			if err := json.Unmarshal(e.Value(), &rec); err != nil {
				b.log.Warn("ack record unreadable; skipped", "bucket", streams.BucketBridgeAcks, "key", e.Key(), "error", err)
				continue
			}
			out = append(out, storedRecord{rec: rec, rev: e.Revision()})
		case <-ctx.Done():
			return nil, fmt.Errorf("bridge: read ack records: %w", ctx.Err())
		}
	}
}

// streamBounds are the FPM stream's first and last sequence (from its leader) when a check ran; with
// shards, each shard's (a key's sequences are its shard's: see forKey).
type streamBounds struct {
	first, last uint64
	shards      []streamBounds
}

func (b *Bridge) fpmBounds(ctx context.Context) (streamBounds, error) {
	octx, cancel := context.WithTimeout(ctx, checkOpTimeout)
	defer cancel()
	var out streamBounds
	for _, name := range streams.FPMStreamNames(b.fpmShards) {
		s, err := b.js.Stream(octx, name)
		if err != nil {
			return streamBounds{}, fmt.Errorf("bridge: stream %s: %w", name, err)
		}
		st := s.CachedInfo().State
		out.shards = append(out.shards, streamBounds{first: st.FirstSeq, last: st.LastSeq})
	}
	if len(out.shards) == 1 {
		return out.shards[0], nil
	}
	return out, nil
}

// checkRecord compares rec with the stream, publishes an event per run with lost FPMs and cuts rec
// back to what the stream holds. It returns how many FPMs it reported and whether rec changed.
func (b *Bridge) checkRecord(ctx context.Context, rec *ackRecord, bounds streamBounds, trigger string) (uint64, bool, error) {
	if len(rec.Runs) == 0 {
		return 0, false, nil
	}
	bounds = bounds.forKey(rec.Key)
	octx, cancel := context.WithTimeout(ctx, checkOpTimeout)
	// From the stream's leader: a replica still catching up would report a loss that is not one.
	last, err := natsconn.LastMsgFromLeader(octx, b.js, b.fpmStreamOf(rec.Key), streams.FPMSubject(rec.Key))
	cancel()
	var stored *jetstream.RawStreamMsg
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return 0, false, fmt.Errorf("bridge: newest FPM of %s: %w", rec.Key, err)
	default:
		stored = last
	}
	var storedSeq, storedFPMSeq uint64
	var storedEpoch int64
	if stored != nil {
		storedSeq = stored.Sequence
		storedEpoch, _ = strconv.ParseInt(stored.Header.Get(streams.HeaderEpoch), 10, 64)
		storedFPMSeq, _ = strconv.ParseUint(stored.Header.Get(streams.HeaderSeq), 10, 64)
	}
	var reported uint64
	changed := false
	keep := rec.Runs[:0]
	for _, run := range rec.Runs {
		if run.LastStreamSeq <= storedSeq || run.LastStreamSeq < bounds.first {
			keep = append(keep, run)
			continue
		}
		from := run.FirstSeq
		var before *streams.GapPoint
		switch {
		case stored != nil && run.Epoch == storedEpoch:
			from = storedFPMSeq + 1
			recvMs, _ := strconv.ParseInt(stored.Header.Get(streams.HeaderReceivedAt), 10, 64)
			before = &streams.GapPoint{Seq: storedFPMSeq, ObservedAtMs: recvMs, Epoch: storedEpoch, Bridge: stored.Header.Get(streams.HeaderBridge)}
		case stored != nil && run.Epoch < storedEpoch:
			keep = append(keep, run) // the stored FPM is of a later run: this one's acks are older than it
			continue
		}
		ranges, n, exact := run.acknowledgedIn(from)
		if n == 0 {
			keep = append(keep, run)
			continue
		}
		ev := b.lostEvent(rec, &run, ranges, n, exact, before, storedSeq, bounds, trigger)
		octx, cancel := context.WithTimeout(ctx, checkOpTimeout)
		_, err := b.js.PublishMsg(octx, ev.Msg())
		cancel()
		if err != nil {
			return reported, changed, fmt.Errorf("bridge: publish the lost_after_ack event of %s (%d FPMs): %w", rec.Key, n, err)
		}
		reported += n
		b.metrics.lostAfterAck.Add(float64(n))
		b.log.Error("acknowledged FPMs are no longer in the stream (lost_after_ack gap event stored)",
			"key", rec.Key.String(), "epoch", run.Epoch, "first_seq", *ev.FirstMissing, "last_seq", *ev.LastMissing,
			"count", n, "acked_stream_seqs", fmt.Sprintf("%d-%d", ev.Evidence.AckedFirstStreamSeq, ev.Evidence.AckedLastStreamSeq),
			"stored_last_stream_seq", storedSeq, "acked_by", rec.Bridge, "trigger", trigger)
		changed = true
		if from > run.FirstSeq {
			run.cut(from, storedSeq, n)
			keep = append(keep, run)
		}
	}
	rec.Runs = keep
	return reported, changed, nil
}

// cut drops the numbers from seq on (n of them acknowledged) from the run: the stream holds the run up
// to its FPM at stream sequence storedSeq.
func (r *ackRun) cut(from, storedSeq, n uint64) {
	r.LastSeq = from - 1
	r.LastStreamSeq = storedSeq
	r.Acked -= min(n, r.Acked)
	holes := r.Holes[:0]
	for _, h := range r.Holes {
		if h[0] >= from {
			break
		}
		h[1] = min(h[1], from-1)
		holes = append(holes, h)
	}
	r.Holes = holes
}

// lostEvent builds the event for the acknowledged numbers ranges (n of them) of run.
func (b *Bridge) lostEvent(rec *ackRecord, run *ackRun, ranges [][2]uint64, n uint64, exact bool, before *streams.GapPoint,
	storedSeq uint64, bounds streamBounds, trigger string) *streams.LostAfterAck {
	first, last := ranges[0][0], ranges[len(ranges)-1][1]
	ev := &streams.LostAfterAck{
		GapEventFields: streams.GapEventFields{
			Schema: streams.GapEventSchema, Type: streams.GapEventType, ID: streams.LostAfterAckMsgID(rec.Key, run.Epoch, first, last),
			Key: rec.Key, Cause: streams.GapCauseLostAfterAck, Epoch: run.Epoch,
			FirstMissing: &first, LastMissing: &last, Missing: n, Before: before,
		},
		Evidence: streams.LostAfterAckEvidence{
			Bridge: b.cfg.BridgeID, AckedBy: rec.Bridge,
			AckedFirstStreamSeq: max(storedSeq+1, run.FirstStreamSeq), AckedLastStreamSeq: run.LastStreamSeq,
			StoredLastStreamSeq: storedSeq, StreamFirstSeq: bounds.first, StreamLastSeq: bounds.last,
			RecordedAtMs: rec.UpdatedAtMs, CheckedAtMs: b.now().UnixMilli(), Trigger: trigger, CountExact: exact,
		},
	}
	if len(ranges) > 1 {
		ev.MissingRanges = ranges
	}
	where := "the stream holds no FPM of this publisher"
	if storedSeq > 0 {
		where = "the newest FPM of this publisher the stream holds is at stream sequence " + strconv.FormatUint(storedSeq, 10)
	}
	ev.Evidence.Summary = fmt.Sprintf("%d FPM(s) of run %d (sequences %d-%d) were acknowledged at stream sequences up to %d and are no longer in stream %s; %s",
		n, run.Epoch, first, last, run.LastStreamSeq, b.fpmStreamOf(rec.Key), where)
	return ev
}

// now is the bridge's clock (withClock in tests).
func (b *Bridge) now() time.Time {
	if b.opts.now != nil {
		return b.opts.now()
	}
	return time.Now()
}
