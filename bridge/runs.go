package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
)

// Agreeing on publisher runs with the other bridges subscribed to the same publishers.
//
// Redundant bridges each receive every message of a publisher (ZMQ PUB sends to every subscriber) and
// publish it; JetStream keeps the first copy of each message id. For the stream to read as if one
// bridge had published it, every bridge must tag a run with the same epoch. The first bridge to see a
// run writes it to streams.BucketBridgeRuns (one record per publisher key: the newest run) with a
// compare-and-set; the others adopt it. When the publisher goroutine meets a run not yet agreed (before
// publishing its first FPM or a drop marker of it), it resolves it:
//
//   - The bridge saw the sequence go back (a publisher restart): if the record is of a restart and
//     holds an epoch newer than the previous run's, another bridge saw this restart first and the
//     bridge adopts it (a newer record of a starting bridge that saw no live bridge is not a restart);
//     otherwise it writes the new run (epoch: its receive time of the run's first message, raised above
//     the record's), at the revision it read.
//   - The bridge's first run of the key since it started (a bridge start or restart): with no record
//     it creates one. With a record, it adopts the record's epoch if another bridge is live on the
//     publisher: the newest FPM of the key in the stream was received (Fpm-Received-At-Ms) after this
//     bridge started. It looks for that until liveProbe after it received the run's first message.
//     With no live bridge it writes a new run, as a lone bridge restarting always did (the publisher
//     may have restarted while no bridge ran).
//   - A compare-and-set that fails means another bridge wrote the record between the read and the
//     write, seeing the same run (it is live): the bridge adopts what it wrote, if newer than the
//     previous run for a restart.
//
// Epochs of a publisher therefore strictly increase in the bucket, and since the epoch is part of every
// FPM's message id (streams.FPMMsgID), two publisher runs are stored as two runs even when their bytes
// agree, while the bridges that agreed on a run store each of its FPMs once.
//
// A bridge's first run of a key after it starts never re-stores what it stored before it stopped: ZMQ
// PUB delivers a message only to the subscribers connected when it is sent, so a restarted bridge
// receives only FPMs sent after its subscription joined, which no earlier instance received; what the
// earlier instance had in flight when it died is lost with its memory (a gap), never republished.
// Whether it adopts the live bridge's epoch or writes a new one therefore changes only how the gap
// detector reads the restart, not what is stored.
//
// While the connection is down the run's FPMs wait like any publish. When the bucket cannot be opened
// or answered otherwise (no permission, runAgreeTimeout), the bridge uses its local epoch (its receive
// time of the run's first message, strictly increasing per key) and logs it at error level: a lone
// bridge still stores every run once and tells runs apart, but redundant bridges each tag the run with
// their own epoch, so each stores its own copy of every FPM of that run (never fewer: nothing is lost),
// and the gap detector reads the interleaved epochs as bridge restarts.
//
// Limits of the rule, stated, each ending in the same doubling of one run, never in a loss: a
// publisher restart within milliseconds of a bridge start, before the live bridge's record is written,
// makes the starting bridge adopt the old run (its idle heartbeats at the old run's sequences within
// the duplicate window are then taken for the old run's; its busy FPMs differ by their payload); a live
// bridge whose publishing lags by more than liveProbe, or whose clock is behind this one's by more than
// the time to its next FPM, is not seen as live (a new epoch, as for a bridge restart, and that run is
// stored by both bridges).

const (
	// runAgreeTimeout bounds one run's resolution.
	runAgreeTimeout = 3 * time.Second
	// liveProbe is how long a starting bridge looks for another live bridge's FPMs of a key.
	liveProbe = 500 * time.Millisecond
	// liveProbeEvery is the interval between two looks.
	liveProbeEvery = 25 * time.Millisecond
	// runCASAttempts bounds the compare-and-set loop (each failure means another bridge wrote).
	runCASAttempts = 5
)

// openRunBucket opens (creating when missing) the agreed runs bucket. Without it the bridge tags runs
// with its local epochs (see above) and says so.
func (b *Bridge) openRunBucket(ctx context.Context) {
	kv, err := b.openBucket(ctx, b.cfg.Streams.BridgeRunsBucket())
	if err != nil {
		if !errors.Is(err, context.Canceled) || errors.Is(err, streams.ErrRefused) {
			b.log.Error("agreed runs unavailable: redundant bridges each store their own copy of every FPM and disagree on epochs",
				"bucket", streams.BucketBridgeRuns, "error", err)
		}
		return
	}
	b.runsKV = kv
}

// errRunNotAgreed: a run's epoch could not be agreed because the broker is away; the FPM waits for it
// like for any publish (the publisher's recovery retries it once the connection is back).
var errRunNotAgreed = errors.New("bridge: publisher run not agreed yet: not connected")

// runEpoch returns r's agreed epoch, resolving it (and the runs before it) first. While the connection
// is down it returns errRunNotAgreed and resolves nothing; any other failure makes the bridge use its
// local epoch for the run, and say so. Publisher goroutine.
func (b *Bridge) runEpoch(r *run) (int64, error) {
	if r.agreed != 0 {
		return r.agreed, nil
	}
	var prev int64
	if r.prev != nil {
		var err error
		if prev, err = b.runEpoch(r.prev); err != nil {
			return 0, err
		}
	}
	e, err := b.agreeRun(r, prev)
	if err != nil {
		if b.runsKV != nil && !b.nc.IsConnected() {
			return 0, errRunNotAgreed
		}
		e = max(r.local, prev+1)
		b.log.Error("publisher run not agreed with other bridges; using this bridge's epoch: a redundant bridge stores its own copy of the run",
			"key", r.key.String(),
			"epoch", e, "first_seq", r.firstSeq, "error", err)
	}
	r.agreed, r.agreedStr, r.prev = e, strconv.FormatInt(e, 10), nil
	return e, nil
}

// agreeRun resolves r's epoch through the bucket; prev is the previous run's epoch (0 if none).
func (b *Bridge) agreeRun(r *run, prev int64) (int64, error) {
	if b.runsKV == nil {
		return 0, errors.New("bucket " + streams.BucketBridgeRuns + " not open")
	}
	ctx, cancel := context.WithTimeout(context.Background(), runAgreeTimeout)
	defer cancel()
	key := streams.BridgeRunKey(r.key)
	lostRace := false
	for range runCASAttempts {
		rec, rev, err := b.readRun(ctx, key)
		if err != nil {
			return 0, err
		}
		if rec != nil && rec.Epoch > 0 {
			switch {
			case r.restarted || prev != 0:
				if rec.Epoch > prev && (rec.Restart || lostRace) {
					return rec.Epoch, nil // another bridge saw this restart first
				}
			case lostRace:
				return rec.Epoch, nil
			default:
				live, err := b.otherBridgeLive(ctx, r)
				if err != nil {
					return 0, err
				}
				if live {
					return rec.Epoch, nil
				}
			}
		}
		next := max(r.local, prev+1)
		if rec != nil && next <= rec.Epoch {
			next = rec.Epoch + 1
		}
		body, _ := json.Marshal(streams.RunRecord{Key: r.key, Epoch: next, FirstSeq: r.firstSeq, Bridge: b.cfg.BridgeID,
			Restart: r.restarted})
		if rev == 0 {
			_, err = b.runsKV.Create(ctx, key, body)
		} else {
			_, err = b.runsKV.Update(ctx, key, body, rev)
		}
		if err == nil {
			return next, nil
		}
		if !casConflict(err) {
			return 0, fmt.Errorf("bridge: write run of %s: %w", r.key, err)
		}
		lostRace = true
	}
	return 0, fmt.Errorf("bridge: run of %s: %d compare-and-set conflicts", r.key, runCASAttempts)
}

// readRun reads key's record and revision; nil when there is none.
func (b *Bridge) readRun(ctx context.Context, key string) (*streams.RunRecord, uint64, error) {
	e, err := b.runsKV.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("bridge: read run %s: %w", key, err)
	}
	var rec streams.RunRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		// A damaged record is replaced at its revision like an outdated one.
		return &streams.RunRecord{}, e.Revision(), nil
	}
	return &rec, e.Revision(), nil
}

// otherBridgeLive reports whether another bridge publishes r's key: the newest FPM of the key stored
// was received after this bridge started. It looks until liveProbe after this bridge received the
// run's first message, so the publishers a starting bridge meets at once share one wait.
func (b *Bridge) otherBridgeLive(ctx context.Context, r *run) (bool, error) {
	deadline := time.Now().Add(liveProbe)
	if d := time.UnixMilli(r.local).Add(liveProbe); d.Before(deadline) {
		deadline = d
	}
	for {
		last, err := streams.LastMsgFromLeader(ctx, b.js, b.fpmStreamOf(r.key), r.subject)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return false, err
		default:
			at, perr := strconv.ParseInt(last.Header.Get(streams.HeaderReceivedAt), 10, 64)
			if perr == nil && at >= b.startMs {
				return true, nil
			}
		}
		if !time.Now().Add(liveProbeEvery).Before(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(liveProbeEvery):
		}
	}
}

// casConflict reports whether a KV create or update failed because the key changed meanwhile.
func casConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// stamp gives FPM item it its agreed epoch before its first publication: header Fpm-Epoch and its
// message id (streams.FPMMsgID), which its retries keep. Publisher goroutine.
func (b *Bridge) stamp(it *item) error {
	b.routeToShard(it)
	if it.agreed != 0 || it.run == nil {
		return nil
	}
	e, err := b.runEpoch(it.run)
	if err != nil {
		return err
	}
	it.agreed = e
	it.m.Header[streams.HeaderEpoch][0] = it.run.agreedStr
	it.m.Header[streams.HeaderMsgID][0] = streams.FPMMsgID(it.key, it.seq, it.digest, e)
	return nil
}

// dropRangeEpoch returns the agreed epoch of drop range r's run, recording it in r for the logs; the
// run's local epoch when it has none or the broker is away (a marker is only built to be published
// once the broker is back, so that is rare). Publisher goroutine.
func (b *Bridge) dropRangeEpoch(r *dropRange) int64 {
	if r.run != nil {
		if e, err := b.runEpoch(r.run); err == nil {
			r.epoch = e
		}
	}
	return r.epoch
}
