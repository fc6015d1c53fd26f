package streams

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/nats-io/nats.go/jetstream"
)

// CheckFPMRange checks a range of stream FPM as openFPMRange and a reader's end (until) take it: by
// sequence or by time, not both, and no end before its start. Zero bounds are open.
func CheckFPMRange(startSeq, endSeq uint64, since, until time.Time) error {
	switch {
	case (startSeq != 0 || endSeq != 0) && (!since.IsZero() || !until.IsZero()):
		return errors.New("select by sequence or by time, not both")
	case endSeq != 0 && endSeq < startSeq:
		return fmt.Errorf("end sequence %d is before start sequence %d", endSeq, startSeq)
	case !until.IsZero() && until.Before(since):
		return fmt.Errorf("until %s is before since %s", until.Format(time.RFC3339Nano), since.Format(time.RFC3339Nano))
	}
	return nil
}

// ParseTimeBound parses the bound of a range of stored messages given by flag flagName (--since,
// --until): RFC 3339 (with or without fraction) or Unix milliseconds; "" is open. A bad one is an
// invalid.FlagError.
func ParseTimeBound(flagName, v string) (time.Time, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return time.Time{}, nil
	}
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms >= 0 {
		return time.UnixMilli(ms), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, invalid.Flagf("%s %q: want RFC 3339 (2026-06-30T12:00:00Z) or Unix milliseconds", flagName, v)
	}
	return t, nil
}

// ErrSeqRangeOverShards is the reason a range of FPM chosen by stream sequence is refused on a server
// with FPM shards: each shard numbers its messages on its own, so one sequence names a message in
// every shard.
var ErrSeqRangeOverShards = errors.New("select the range by time (since, until)")

// FPMRangeStreams returns the FPM streams a range of FPM is read from, in order: FPM, or every shard
// of the server's FPM (FPMStreamNames). A range by sequence (startSeq or endSeq set) over more than one
// shard is an error wrapping ErrSeqRangeOverShards; a failed shard discovery is returned as it is.
func FPMRangeStreams(ctx context.Context, js jetstream.JetStream, startSeq, endSeq uint64) ([]string, error) {
	n, err := FPMShardsOf(ctx, js)
	if err != nil {
		return nil, err
	}
	if n > 1 && (startSeq != 0 || endSeq != 0) {
		return nil, fmt.Errorf("FPMs are spread over %d shard streams, each numbered on its own: %w", n, ErrSeqRangeOverShards)
	}
	return FPMStreamNames(n), nil
}

// openFPMRange prepares an ordered read of a range of stream FPM on filter, chosen by stream sequence
// (startSeq, endSeq; 0 is open) or by stored time (since; zero is open), as `fpmbus trace backfill`
// and `fpmbus trace replay --from-stream` choose it. It returns the stream, the ordered consumer that
// starts at the range's start (startSeq, else the first message stored at or after since, else the
// stream's first) and the range's last sequence stored now: the stream's last, or endSeq when lower.
// The read stops there, so messages stored while it runs are not part of the range. Errors name the
// stream.
func openFPMRange(ctx context.Context, js jetstream.JetStream, filter string, startSeq, endSeq uint64, since time.Time) (jetstream.Stream, jetstream.OrderedConsumerConfig, uint64, error) {
	return OpenFPMRangeOf(ctx, js, StreamFPM, filter, startSeq, endSeq, since)
}

// OpenFPMRangeOf is openFPMRange on the FPM stream named stream: FPM, or one of its shards
// (FPMStreamNames), whose sequences are its own.
func OpenFPMRangeOf(ctx context.Context, js jetstream.JetStream, stream, filter string, startSeq, endSeq uint64, since time.Time) (jetstream.Stream, jetstream.OrderedConsumerConfig, uint64, error) {
	start := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverAllPolicy}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, start, 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, start, 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	last := info.State.LastSeq
	if endSeq != 0 {
		last = min(last, endSeq)
	}
	switch {
	case startSeq != 0:
		start.DeliverPolicy, start.OptStartSeq = jetstream.DeliverByStartSequencePolicy, startSeq
	case !since.IsZero():
		start.DeliverPolicy, start.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	return s, start, last, nil
}

// CountPending counts the messages of s on filter from where cfg's deliver policy (DeliverPolicy,
// OptStartSeq, OptStartTime) starts, with an ephemeral consumer in memory that acknowledges nothing
// and is deleted at once (or, should the delete fail, by the server after a minute unused).
func CountPending(ctx context.Context, s jetstream.Stream, filter string, cfg jetstream.ConsumerConfig) (uint64, error) {
	c, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{
		DeliverPolicy: cfg.DeliverPolicy, OptStartSeq: cfg.OptStartSeq, OptStartTime: cfg.OptStartTime,
		FilterSubject: filter, AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: time.Minute, MemoryStorage: true,
	})
	if err != nil {
		return 0, err
	}
	ci := c.CachedInfo()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	_ = s.DeleteConsumer(dctx, ci.Name)
	cancel()
	return ci.NumPending, nil
}
