package trace

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
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
// unchanged-counter rule starts fresh at the range's first interval.

// ErrBadRange is returned for a backfill range that selects nothing sensible.
var ErrBadRange = errors.New("trace: invalid backfill range")

// BackfillRange selects what a backfill replays from stream FPM: by stream sequence (StartSeq to
// EndSeq, inclusive) or by stream time (Since to Until, inclusive), not both. A zero bound is open: the
// start of the stream, or its last message when the backfill starts. With FPM shards (each numbered on
// its own) only a time range, or the whole of every shard, can be selected.
type BackfillRange struct {
	StartSeq, EndSeq uint64
	Since, Until     time.Time
}

func (r BackfillRange) validate() error {
	if err := streams.CheckFPMRange(r.StartSeq, r.EndSeq, r.Since, r.Until); err != nil {
		return fmt.Errorf("%w: %w", ErrBadRange, err)
	}
	return nil
}

// BackfillProgress is reported while a backfill reads its range.
type BackfillProgress struct {
	// Done messages of Total read so far (Total counts the range's messages on the filter when the
	// backfill started). Seq is the last stream sequence read (with shards, in its shard).
	Done, Total uint64
	Seq         uint64
}

// BackfillResult says what a backfill did.
type BackfillResult struct {
	Messages          uint64 // read from the range
	Lines             uint64 // written (full mode: Messages minus invalid ones)
	Invalid           uint64 // not valid FPMs: skipped
	FirstSeq, LastSeq uint64 // stream sequences of the first and last message read (0: none)
}

// Backfill replays rng of stream FPM (cfg.FilterSubject) into cfg.OutputPath in cfg.Mode (see
// above) and returns once every line is fsynced and the files are closed. It is not a durable
// consumer: one plain loop reads the ordered consumer's messages until the range ends and hands them
// to the same writer as the live Consumer, without a group, acknowledgements or takeovers. progress,
// if not nil, is called from Backfill's goroutine, at most every 100 ms and once at the end. The group
// settings of cfg (Group, Partitions, PinnedTTL, MaxAckPending, AckWait) are not used, except that
// MaxAckPending sizes the pull batches and flushes. When ctx ends first, what was read is written and
// Backfill returns ctx's error. Options: WithLogger, WithClock, WithCompressionLevel, WithWriteRetry.
func Backfill(ctx context.Context, cfg Config, js jetstream.JetStream, rng BackfillRange, progress func(BackfillProgress), opts ...Option) (BackfillResult, error) {
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
	own, err := ownOutput(cfg.OutputPath, "trace backfill", log) // no live writer's files are touched
	if err != nil {
		return res, err
	}
	defer own.releaseAll()
	if _, err := repairPrefixes(own.prefixes(), log); err != nil {
		return res, fmt.Errorf("trace: backfill: repair output: %w", err)
	}
	m, err := newMetrics(cfg.Registerer, cfg.Mode)
	if err != nil {
		return res, fmt.Errorf("trace: register metrics: %w", err)
	}
	names, err := streams.FPMRangeStreams(ctx, js, rng.StartSeq, rng.EndSeq)
	switch {
	case errors.Is(err, streams.ErrSeqRangeOverShards):
		return res, fmt.Errorf("%w: %w", ErrBadRange, err)
	case err != nil:
		return res, fmt.Errorf("trace: backfill: %w", err)
	}
	var parts []rangePart
	var total, last uint64
	for _, name := range names {
		s, startCfg, shardLast, err := streams.OpenFPMRangeOf(ctx, js, name, cfg.FilterSubject, rng.StartSeq, rng.EndSeq, rng.Since)
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
		"start_seq", rng.StartSeq, "end_seq", last, "since", rng.Since, "until", rng.Until, "messages", total, "fpm_streams", len(names))
	w := newWriter(cfg, set, log, m, set.Clock(), nil)
	w.own = own
	if w.sampler != nil {
		w.sampler.hold = 0 // event time only
	}
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
	complete := len(parts) == 0
	if !complete {
		complete, err = backfillRange(ctx, parts, rng, w, &res, report)
		if err != nil {
			w.abort()
			return res, err
		}
	}
	stop, cancel := context.WithTimeout(context.Background(), cfg.StopTimeout)
	err = w.finish(stop.Done())
	cancel()
	res.Lines = w.linesWritten
	report(true)
	if err != nil {
		return res, err
	}
	if !complete {
		return res, ctx.Err()
	}
	log.Info("trace backfill done", "messages", res.Messages, "lines", res.Lines, "invalid", res.Invalid,
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

// advance reads the part's next message of the range into head, or marks the part done.
func (p *partReader) advance(ctx context.Context, rng BackfillRange) error {
	p.head, p.md = nil, nil
	if p.done {
		return nil
	}
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
	p.head, p.md = raw, md
	if md.Sequence.Stream >= p.last || md.NumPending == 0 {
		p.done = true // the part's last message: handed, then no more reads
	}
	return nil
}

// backfillRange is Backfill's loop: it reads the range in order and hands each message to w, flushing
// every FlushInterval (sampled mode: writing the samples whose interval is over by event time), until
// the range is complete (true) or ctx ends (false). With shards it reads every shard at once and hands
// their messages merged by stored time (the order one stream would have stored them in; a key's
// messages are in one shard, so their order is the shard's): sampled intervals then close by event
// time as they do on one stream.
func backfillRange(ctx context.Context, parts []rangePart, rng BackfillRange, w *writer, res *BackfillResult, report func(bool)) (bool, error) {
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
	keys := subjectKeys{}
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
		r, err := parseRecord(replayMsg{raw}, msgMeta{seq: md.Sequence.Stream, stored: md.Timestamp}, w.cfg.ProducerID, keys)
		if err != nil {
			res.Invalid++
			w.log.Debug("trace backfill: invalid FPM message skipped", "subject", raw.Subject(), "stream_seq", md.Sequence.Stream, "err", err)
		} else if err := w.handle(&r); err != nil {
			var me *messageError
			if !errors.As(err, &me) {
				return false, err
			}
			res.Invalid++
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

// replayMsg is a replayed message: nothing to settle.
type replayMsg struct{ jetstream.Msg }

func (replayMsg) Done()        {}
func (replayMsg) Reject(error) {}
