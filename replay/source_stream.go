package replay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// The stream source: a range of stream FPM, read with an ordered consumer (ephemeral, unacknowledged,
// invisible to every durable consumer), selected as `fpmbus trace backfill` selects it. A message
// becomes the record a full-mode trace writer would have written for it: observed_at_unix_ms from its
// Fpm-Received-At-Ms header (the bridge's receive time), source from its Fpm-Namespace, Fpm-Component
// and Fpm-Producer headers, fpm its body. With FPM shards every shard is read (each numbered on its
// own, so only a time range selects), and the records are merged by observed time; a key's records
// are all in one shard, in its order.

// ErrBadRange is returned for a stream range that selects nothing sensible.
var ErrBadRange = errors.New("replay: invalid stream range")

// StreamRange selects messages of stream FPM by stream sequence (StartSeq to EndSeq) or by stream time
// (Since to Until), both inclusive, not both ways at once. A zero bound is open; an open end is the
// stream's last message when the read starts.
type StreamRange struct {
	Since, Until     time.Time
	StartSeq, EndSeq uint64
	// Filter is the subject filter (default fpm.>, every FPM).
	Filter string
}

func (r StreamRange) validate() error {
	if err := streams.CheckFPMRange(r.StartSeq, r.EndSeq, r.Since, r.Until); err != nil {
		return fmt.Errorf("%w: %w", ErrBadRange, err)
	}
	return nil
}

// readStream reads the range of stream FPM (or of every FPM shard) into a Recording. A message whose
// body is not a valid FPM is counted as invalid (its stream and sequence among the examples), not
// replayed.
func readStream(ctx context.Context, js jetstream.JetStream, rng StreamRange) (*Recording, error) {
	if err := rng.validate(); err != nil {
		return nil, err
	}
	if rng.Filter == "" {
		rng.Filter = streams.FPMWildcard
	}
	names, err := streams.FPMRangeStreams(ctx, js, rng.StartSeq, rng.EndSeq)
	switch {
	case errors.Is(err, streams.ErrSeqRangeOverShards):
		return nil, fmt.Errorf("%w: %w", ErrBadRange, err)
	case err != nil:
		return nil, fmt.Errorf("replay: %w", err)
	}
	rec := &Recording{}
	for _, name := range names {
		if err := readStreamInto(ctx, js, name, rng, rec); err != nil {
			return nil, err
		}
	}
	sortRecords(rec.Records)
	return rec, nil
}

// readStreamInto appends the range of FPM stream name (FPM, or one shard) to rec.
func readStreamInto(ctx context.Context, js jetstream.JetStream, name string, rng StreamRange, rec *Recording) error {
	s, start, last, err := streams.OpenFPMRangeOf(ctx, js, name, rng.Filter, rng.StartSeq, rng.EndSeq, rng.Since)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	n, err := streams.CountPending(ctx, s, rng.Filter, jetstream.ConsumerConfig{
		DeliverPolicy: start.DeliverPolicy, OptStartSeq: start.OptStartSeq, OptStartTime: start.OptStartTime})
	if err != nil {
		return fmt.Errorf("replay: count the range of %s: %w", name, err)
	}
	if n == 0 {
		return nil
	}
	oc, err := s.OrderedConsumer(ctx, start)
	if err != nil {
		return fmt.Errorf("replay: ordered consumer on %s: %w", name, err)
	}
	it, err := oc.Messages(jetstream.PullMaxMessages(1000))
	if err != nil {
		return fmt.Errorf("replay: ordered consumer on %s: %w", name, err)
	}
	defer it.Stop()
	in := interner{}
	var dec schemas.Decoder
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("replay: read stream %s: %w", name, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("replay: read stream %s: %w", name, err)
		}
		if md.Sequence.Stream > last || !rng.Until.IsZero() && md.Timestamp.After(rng.Until) {
			break
		}
		r, err := streamRecord(m, md, in, &dec)
		if err != nil {
			rec.Invalid++
			if len(rec.InvalidExamples) < maxExamples {
				rec.InvalidExamples = append(rec.InvalidExamples, "stream "+name+" sequence "+strconv.FormatUint(md.Sequence.Stream, 10)+": "+err.Error())
			}
		} else {
			rec.Records = append(rec.Records, r)
		}
		if md.Sequence.Stream >= last || md.NumPending == 0 {
			break
		}
	}
	return nil
}

// streamRecord turns one stored FPM message into a record.
func streamRecord(m jetstream.Msg, md *jetstream.MsgMetadata, in interner, dec *schemas.Decoder) (record, error) {
	body := append([]byte(nil), m.Data()...)
	var f schemas.FPM
	if err := dec.ParseFPMJSON(body, &f); err != nil {
		return record{}, err
	}
	h := m.Headers()
	observed := md.Timestamp.UnixMilli()
	if v := h.Get(streams.HeaderReceivedAt); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 {
			return record{}, fmt.Errorf("header %s %q: not Unix milliseconds", streams.HeaderReceivedAt, v)
		}
		observed = ms
	}
	ns, comp := h.Get(streams.HeaderNamespace), h.Get(streams.HeaderComponent)
	if ns == "" || comp == "" {
		k, err := streams.ParseFPMSubject(m.Subject())
		if err != nil {
			return record{}, err
		}
		ns, comp = k.Namespace, k.Component
	}
	producer := h.Get(streams.HeaderProducer)
	if producer == "" {
		producer = f.WorkerID
	}
	return record{
		Namespace:   in.str(ns),
		Component:   in.str(comp),
		Producer:    in.str(producer),
		CaptureMode: schemas.CaptureFull,
		ObservedMs:  observed,
		Order:       int64(md.Sequence.Stream),
		WorkerID:    in.str(f.WorkerID),
		DPRank:      f.DPRank,
		CounterID:   f.CounterID,
		Heartbeat:   f.IsHeartbeat(),
		FPM:         body,
	}, nil
}
