package trace

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// Backfill: replay a range of stream FPM into trace segments through the live writer's own code path
// (parse, line, sampler, SegmentWriter, flusher: writer.go), so that the "event" objects it writes are
// byte-identical to the ones the live writer wrote for that range: observed_at_unix_ms comes from the
// message's header, sampled intervals are aligned to event time. It reads with an ordered consumer —
// ephemeral, unacknowledged, invisible to every durable consumer — and acks nothing.
//
// Differences from the live writer, all on purpose: the outer "timestamp" counts from the backfill's
// start (it is writer-relative in Dynamo too); sampled mode has no wall-clock fallback (pending samples
// are written by event time, and the rest when the range ends), so a live writer that wrote a sample
// early by its clock and then dropped a late message of that interval can differ there; and the
// unchanged-counter rule starts at the key's last line the output holds before the interval (none:
// fresh at the range's first interval).
//
// Idempotent: a line the output already holds is not written again (backfill_existing.go), so a rerun
// over the same range writes nothing, and a run over a range that overlaps what is written writes only
// what is not.
//
// Resumable: a backfill that ends before its range does (interrupted, or failed) says where to go on
// (BackfillResult.Resume): the first stream sequence whose line is not durable — in sampled mode the
// first message of an interval whose sample is not written, since an interrupted run does not write a
// sample of an interval it did not read to its end. A run of the same range from there
// (BackfillRange.ResumeSeq) then writes exactly what the uninterrupted run would have: what the first
// run wrote after that point is recognised as written. With FPM shards, each numbered on its own, the
// resume point is a stored time (read with Since, messages of that very time recognised the same
// way). In sampled mode this is exact while a key's observation times and counter_ids do not go back
// in stream order (one publisher run, one bridge clock): an interval cut by the interruption is then
// sampled by the same message.

// ErrBadRange is returned for a backfill range that selects nothing sensible.
var ErrBadRange = errors.New("trace: invalid backfill range")

// BackfillRange selects what a backfill replays from stream FPM: by stream sequence (StartSeq to
// EndSeq, inclusive) or by stream time (Since to Until, inclusive), not both. A zero bound is open: the
// start of the stream, or its last message when the backfill starts. With FPM shards (each numbered on
// its own) only a time range, or the whole of every shard, can be selected.
//
// ResumeSeq (not with shards) continues an interrupted backfill of the range: the range's messages
// before that stream sequence are not read (BackfillResult.Resume gives it). It must not be before
// StartSeq; past the range's end there is nothing left to read.
type BackfillRange struct {
	StartSeq, EndSeq uint64
	Since, Until     time.Time
	ResumeSeq        uint64
}

func (r BackfillRange) validate() error {
	if err := streams.CheckFPMRange(r.StartSeq, r.EndSeq, r.Since, r.Until); err != nil {
		return fmt.Errorf("%w: %w", ErrBadRange, err)
	}
	if r.ResumeSeq != 0 && r.ResumeSeq < r.StartSeq {
		return fmt.Errorf("%w: resume sequence %d is before the range's start sequence %d", ErrBadRange, r.ResumeSeq, r.StartSeq)
	}
	return nil
}

// first is the stream sequence the read starts at (0: by Since, or the stream's first).
func (r BackfillRange) first() uint64 { return max(r.StartSeq, r.ResumeSeq) }

// BackfillProgress is reported while a backfill reads its range.
type BackfillProgress struct {
	// Done messages of Total read so far (Total counts the range's messages on the filter when the
	// backfill started). Seq is the last stream sequence read (with shards, in its shard).
	Done, Total uint64
	Seq         uint64
}

// BackfillResult says what a backfill did.
type BackfillResult struct {
	Messages uint64 // read from the range
	Lines    uint64 // written (full mode: Messages minus invalid ones and those already written)
	Invalid  uint64 // not valid FPMs: skipped
	// Found is what the output held already and was not written again (backfill_existing.go): full
	// mode, messages whose line is there; sampled mode, samples whose interval or message has a line.
	Found uint64
	// Rejected messages can never be written (their producer's file name is refused): skipped.
	Rejected          uint64
	FirstSeq, LastSeq uint64 // stream sequences of the first and last message read (0: none)
	// Resume is where to go on when the backfill ended before its range did (interrupted, or failed);
	// nil when it completed.
	Resume *BackfillResume
	// Pruned are the segments --max-segments removed while the backfill wrote (their lines are gone).
	Pruned []prunedSegment
}

// BackfillResume is where an unfinished backfill goes on: run the same range with
// BackfillRange.ResumeSeq = Seq, or with FPM shards with Since = Since (and the same Until).
type BackfillResume struct {
	Seq   uint64    // single stream FPM: the first stream sequence whose line is not written
	Since time.Time // with FPM shards: the stored time of the first such message, in any shard
	// Written is the number of messages, read before the end, whose lines are durable.
	Written uint64
}

// Backfill replays rng of stream FPM (cfg.FilterSubject) into cfg.OutputPath in cfg.Mode (see
// above) and returns once every line is fsynced and the files are closed. It is not a durable
// consumer: one plain loop reads the ordered consumer's messages until the range ends and hands them
// to the same writer as the live Consumer, without a group, acknowledgements or takeovers. progress,
// if not nil, is called from Backfill's goroutine, at most every 100 ms and once at the end. The group
// settings of cfg (Group, Partitions, PinnedTTL, MaxAckPending, AckWait) are not used, except that
// MaxAckPending sizes the pull batches and flushes. When ctx ends first, the lines of what was read
// are written (in sampled mode those of the intervals read to their end), Backfill returns ctx's
// error and the result says where to resume (BackfillResult.Resume), as it does after any other error
// once the range is being read. Options: durable.WithClock.
func Backfill(ctx context.Context, cfg Config, js jetstream.JetStream, rng BackfillRange, progress func(BackfillProgress), opts ...durable.Option) (BackfillResult, error) {
	var res BackfillResult
	set, err := prepare(cfg, js, opts)
	if err != nil {
		return res, err
	}
	if err := rng.validate(); err != nil {
		return res, err
	}
	log := set.Logger
	if err := ProbeOutput(cfg.OutputPath); err != nil {
		return res, err
	}
	// The output's files are this backfill's from here on: the ownership of its producers' prefixes
	// (the live writer, verify --repair and backfill exclude one another) is taken before the repair
	// below reads or rewrites anything.
	own, err := tracefile.OwnOutput(cfg.OutputPath, "trace backfill", log)
	if err != nil {
		return res, err
	}
	defer own.ReleaseAll()
	if _, err := tracefile.RepairPrefixes(own.Prefixes(), log); err != nil {
		return res, fmt.Errorf("trace: backfill: repair output: %w", err)
	}
	m, err := newMetrics(cfg.Registerer, cfg.Mode)
	if err != nil {
		return res, fmt.Errorf("trace: register metrics: %w", err)
	}
	names, err := streams.FPMRangeStreams(ctx, js, rng.first(), rng.EndSeq)
	switch {
	case errors.Is(err, streams.ErrSeqRangeOverShards):
		if rng.ResumeSeq != 0 {
			err = fmt.Errorf("%w; resume a backfill over shards with the time it printed (--since)", err)
		}
		return res, fmt.Errorf("%w: %w", ErrBadRange, err)
	case err != nil:
		return res, fmt.Errorf("trace: backfill: %w", err)
	}
	var parts []rangePart
	var total, last uint64
	for _, name := range names {
		s, startCfg, shardLast, err := streams.OpenFPMRangeOf(ctx, js, name, cfg.FilterSubject, rng.first(), rng.EndSeq, rng.Since)
		if err != nil {
			return res, fmt.Errorf("trace: backfill: %w", err)
		}
		count, err := rangeCount(ctx, s, cfg.FilterSubject, startCfg, rng, shardLast)
		if err != nil {
			return res, fmt.Errorf("trace: backfill: count the range of %s: %w", name, err)
		}
		if count > 0 { // an empty range would wait for a message forever
			parts = append(parts, rangePart{stream: name, s: s, start: startCfg, last: shardLast})
		}
		total, last = total+count, max(last, shardLast)
	}
	log.Info("trace backfill started", "mode", cfg.Mode, "output", cfg.OutputPath, "filter", cfg.FilterSubject,
		"start_seq", rng.StartSeq, "resume_seq", rng.ResumeSeq, "end_seq", last, "since", rng.Since, "until", rng.Until,
		"messages", total, "fpm_streams", len(names))
	w := newWriter(cfg, set, log, m, set.Clock(), nil)
	w.own = own
	if w.sampler != nil {
		w.sampler.hold = 0 // event time only
	}
	w.existing = newExistingLines(w)
	w.onPrune = func(ps prunedSegment) { res.Pruned = append(res.Pruned, ps) }
	report := func(force bool) {}
	if progress != nil {
		var lastReport time.Time
		report = func(force bool) {
			if force || time.Since(lastReport) >= 100*time.Millisecond {
				lastReport = time.Now()
				progress(BackfillProgress{Done: res.Messages, Total: max(total, res.Messages), Seq: res.LastSeq})
			}
		}
	}
	tr := newBackfillTracker(len(names) > 1)
	complete := len(parts) == 0
	if !complete {
		complete, err = backfillRange(ctx, parts, rng, w, tr, &res, report)
		if err != nil {
			tr.cut(w)
			w.abort()
			res.Lines, res.Found, res.Rejected = w.linesWritten, w.existing.found, tr.rejected
			res.Resume = tr.resume(rng)
			return res, err
		}
	}
	stop, cancel := context.WithTimeout(context.Background(), cfg.StopTimeout)
	if complete {
		err = w.finish(stop.Done())
	} else {
		tr.cut(w)
		err = w.finishCut(stop.Done())
	}
	cancel()
	res.Lines, res.Found, res.Rejected = w.linesWritten, w.existing.found, tr.rejected
	report(true)
	if err != nil || !complete {
		res.Resume = tr.resume(rng)
	}
	if err != nil {
		return res, err
	}
	if !complete {
		return res, ctx.Err()
	}
	log.Info("trace backfill done", "messages", res.Messages, "lines", res.Lines, "already_written", res.Found, "invalid", res.Invalid,
		"first_seq", res.FirstSeq, "last_seq", res.LastSeq)
	return res, nil
}

// rangePart is the range on one FPM stream (FPM, or one shard): its stream, where the read starts and
// the last sequence of the range.
type rangePart struct {
	stream string
	s      jetstream.Stream
	start  jetstream.OrderedConsumerConfig
	last   uint64
}

// partReader reads one part in order; head is its next message in the range (nil once done).
type partReader struct {
	rangePart
	it   jetstream.MessagesContext
	head jetstream.Msg
	md   *jetstream.MsgMetadata
	done bool
}

// advance reads the part's next message of the range into head, or marks the part done. Messages
// stored before rng.Since are not in the range (a resumed read by sequence may start before it).
func (p *partReader) advance(ctx context.Context, rng BackfillRange) error {
	p.head, p.md = nil, nil
	for !p.done {
		raw, err := p.it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("trace: backfill: read %s: %w", p.stream, err)
		}
		md, err := raw.Metadata()
		if err != nil {
			return fmt.Errorf("trace: backfill: read %s: %w", p.stream, err)
		}
		if md.Sequence.Stream > p.last || !rng.Until.IsZero() && md.Timestamp.After(rng.Until) {
			p.done = true
			return nil
		}
		if md.Sequence.Stream >= p.last || md.NumPending == 0 {
			p.done = true // the part's last message: handed, then no more reads
		}
		if !rng.Since.IsZero() && md.Timestamp.Before(rng.Since) {
			continue
		}
		p.head, p.md = raw, md
		return nil
	}
	return nil
}

// backfillRange is Backfill's loop: it reads the range in order and hands each message to w, flushing
// every FlushInterval (sampled mode: writing the samples whose interval is over by event time), until
// the range is complete (true) or ctx ends (false). With shards it reads every shard at once and hands
// their messages merged by stored time (the order one stream would have stored them in; a key's
// messages are in one shard, so their order is the shard's): sampled intervals then close by event
// time as they do on one stream. tr follows which messages handed are not done yet.
func backfillRange(ctx context.Context, parts []rangePart, rng BackfillRange, w *writer, tr *backfillTracker, res *BackfillResult, report func(bool)) (bool, error) {
	readers := make([]*partReader, 0, len(parts))
	for _, part := range parts {
		oc, err := part.s.OrderedConsumer(ctx, part.start)
		if err != nil {
			return false, fmt.Errorf("trace: backfill: ordered consumer on %s: %w", part.stream, err)
		}
		it, err := oc.Messages(jetstream.PullMaxMessages(w.cfg.pullBatch()))
		if err != nil {
			return false, fmt.Errorf("trace: backfill: ordered consumer on %s: %w", part.stream, err)
		}
		defer it.Stop()
		unblock := context.AfterFunc(ctx, it.Stop) // ends a Next waiting for the server
		defer unblock()
		r := &partReader{rangePart: part, it: it}
		if err := r.advance(ctx, rng); err != nil {
			if ctx.Err() != nil {
				return false, nil
			}
			return false, err
		}
		readers = append(readers, r)
	}
	flushed := time.Now()
	keys := tracefile.SubjectKeys{}
	for {
		var next *partReader
		for _, r := range readers {
			if r.head != nil && (next == nil || r.md.Timestamp.Before(next.md.Timestamp)) {
				next = r
			}
		}
		if next == nil {
			return true, nil // every part's last message handed
		}
		raw, md := next.head, next.md
		res.Messages++
		if res.FirstSeq == 0 {
			res.FirstSeq = md.Sequence.Stream
		}
		res.LastSeq = md.Sequence.Stream
		report(false)
		meta := tracefile.MsgMeta{Seq: md.Sequence.Stream, Stored: md.Timestamp}
		d := tr.hand(raw, meta)
		r, err := parseRecord(d, meta, w.cfg.ProducerID, keys)
		if err != nil {
			res.Invalid++
			d.skip()
			w.log.Debug("trace backfill: invalid FPM message skipped", "subject", raw.Subject(), "stream_seq", md.Sequence.Stream, "err", err)
		} else if err := w.handle(&r); err != nil {
			var me *messageError
			if !errors.As(err, &me) {
				return false, err
			}
			res.Invalid++
			d.skip()
			w.log.Warn("trace backfill: message skipped", "subject", raw.Subject(), "stream_seq", md.Sequence.Stream, "err", err)
		}
		if err := w.collect(); err != nil {
			return false, err
		}
		if time.Since(flushed) >= w.cfg.FlushInterval {
			flushed = time.Now()
			if w.sampler != nil {
				if err := w.sampler.emitDue(w, flushed); err != nil {
					return false, err
				}
			}
			if err := w.flush(); err != nil {
				return false, err
			}
		}
		if err := next.advance(ctx, rng); err != nil {
			if ctx.Err() != nil {
				return false, nil
			}
			return false, err
		}
	}
}

// rangeCount counts the range's messages on the filter: those from its start minus those after its
// end, read from the pending counts of two ephemeral consumers (deleted at once).
func rangeCount(ctx context.Context, s jetstream.Stream, filter string, start jetstream.OrderedConsumerConfig, rng BackfillRange, last uint64) (uint64, error) {
	pending := func(cfg jetstream.ConsumerConfig) (uint64, error) { return streams.CountPending(ctx, s, filter, cfg) }
	from, err := pending(jetstream.ConsumerConfig{DeliverPolicy: start.DeliverPolicy, OptStartSeq: start.OptStartSeq, OptStartTime: start.OptStartTime})
	if err != nil || from == 0 {
		return 0, err
	}
	after := jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: last + 1}
	if !rng.Until.IsZero() {
		t := rng.Until.Add(time.Nanosecond)
		after = jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &t}
	}
	rest, err := pending(after)
	if err != nil {
		return 0, err
	}
	if rest >= from {
		return 0, nil
	}
	return from - rest, nil
}

// backfillTracker follows the messages a backfill handed to its writer until each is done (its line,
// or the lines before it, durable) or skipped for good, so that an unfinished backfill can say where
// to resume (BackfillResume). Owned by the backfill's goroutine (Done is called from it too: the
// writer marks messages done in collect and its other calls).
type backfillTracker struct {
	shards   bool
	pending  map[*backfillMsg]struct{}
	last     tracefile.MsgMeta // the last message handed
	handed   uint64
	doneN    uint64
	rejected uint64
	open     tracefile.MsgMeta // sampled mode, once cut: the first message of an interval whose sample is not written
	hasOpen  bool
}

func newBackfillTracker(shards bool) *backfillTracker {
	return &backfillTracker{shards: shards, pending: map[*backfillMsg]struct{}{}}
}

// hand registers raw as handed to the writer.
func (t *backfillTracker) hand(raw jetstream.Msg, md tracefile.MsgMeta) *backfillMsg {
	m := &backfillMsg{Msg: raw, md: md, t: t}
	t.pending[m] = struct{}{}
	t.last = md
	t.handed++
	return m
}

// before orders messages as the backfill handed them: by stored time across shards, by sequence on
// one stream.
func (t *backfillTracker) before(a, b tracefile.MsgMeta) bool {
	if t.shards && !a.Stored.Equal(b.Stored) {
		return a.Stored.Before(b.Stored)
	}
	return a.Seq < b.Seq
}

// cut records, before an unfinished backfill writes what it can (or gives up), the first message of
// any interval whose sample will not be written: the sampled samples still pending are not written
// at an interruption, and their intervals are read again from there.
func (t *backfillTracker) cut(w *writer) {
	if w.sampler != nil {
		// The decided samples are of intervals read to their end: they are written now (a sample that
		// does not reach the disk stays not done, which the resume point covers); what is still open,
		// or decided and not written, is read again.
		_ = w.sampler.writeDecided(w)
		t.open, t.hasOpen = w.sampler.openSince(t.before)
	}
}

// resume says where an unfinished backfill of rng goes on: at the first message handed that is not
// done, or of an interval cut (see cut), or after the last message handed when everything handed is
// done; where rng starts when nothing was handed (Seq and Since zero: rng as it was).
func (t *backfillTracker) resume(rng BackfillRange) *BackfillResume {
	r := &BackfillResume{Written: t.doneN}
	if t.handed == 0 {
		r.Seq = rng.first()
		return r
	}
	first, ok := t.open, t.hasOpen
	for m := range t.pending {
		if !ok || t.before(m.md, first) {
			first, ok = m.md, true
		}
	}
	switch {
	case ok && t.shards:
		r.Since = first.Stored
	case ok:
		r.Seq = first.Seq
	case t.shards:
		r.Since = t.last.Stored // what was handed at that very time is recognised as written
	default:
		r.Seq = t.last.Seq + 1
	}
	return r
}

// backfillMsg is a message a backfill handed to its writer.
type backfillMsg struct {
	jetstream.Msg
	md tracefile.MsgMeta
	t  *backfillTracker
}

// Done: its line (or the lines before it) is durable.
func (m *backfillMsg) Done() {
	if _, ok := m.t.pending[m]; ok {
		delete(m.t.pending, m)
		m.t.doneN++
	}
}

// Reject: it can never be written (its producer's file name is refused): skipped for good, counted.
func (m *backfillMsg) Reject(error) {
	if _, ok := m.t.pending[m]; ok {
		delete(m.t.pending, m)
		m.t.rejected++
	}
}

// skip: not a message the writer can take (invalid): it has no line, for good.
func (m *backfillMsg) skip() { delete(m.t.pending, m) }
