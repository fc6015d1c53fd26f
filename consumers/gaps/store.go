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

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/streams"
)

// stateStore is the detector's I/O with the server beyond its partition consumers: the state bucket
// (one checkpoint per publisher and group), the direct reads by subject of FPM and FPM_EVENTS that
// loading and catching up a publisher need, and the checkpoint writes (states, then events). It holds
// no detector state: the loop calls the reads, the checkpoint goroutine calls write.
type stateStore struct {
	js  jetstream.JetStream
	cfg Config
	// kv is the state bucket's stream, events FPM_EVENTS; fpm the FPM streams: FPM, or its shards
	// FPM_0 … (cfg.FPMShards) by shard index, each key's FPMs (and state.StreamSeq) in its shard.
	kv, events jetstream.Stream
	fpm        []jetstream.Stream
}

// open creates the state bucket if missing (an existing one is used as it is, like every bucket a
// component opens: streams.EnsureKeyValue) and looks up the streams.
func (s *stateStore) open(ctx context.Context) error {
	if _, err := streams.EnsureKeyValue(ctx, s.js, s.cfg.StateBucketConfig()); err != nil {
		return fmt.Errorf("gaps: state bucket %s: %w", s.cfg.StateBucket, err)
	}
	var err error
	if s.kv, err = s.js.Stream(ctx, "KV_"+s.cfg.StateBucket); err != nil {
		return fmt.Errorf("gaps: state bucket %s: %w", s.cfg.StateBucket, err)
	}
	s.fpm = s.fpm[:0]
	for _, name := range streams.FPMStreamNames(s.cfg.FPMShards) {
		st, err := s.js.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("gaps: stream %s: %w", name, err)
		}
		s.fpm = append(s.fpm, st)
	}
	if s.events, err = s.js.Stream(ctx, streams.StreamEvents); err != nil {
		return fmt.Errorf("gaps: stream %s: %w", streams.StreamEvents, err)
	}
	return nil
}

// ioCtx bounds one server call.
func (s *stateStore) ioCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.cfg.PublishTimeout)
}

// kvSubject is the subject of k's state entry in the bucket.
func (s *stateStore) kvSubject(k streams.Key) string {
	return "$KV." + s.cfg.StateBucket + "." + kvKey(s.cfg.Group, k)
}

// decodeState reads one state entry (a KV message). A deleted entry is a fresh state (ok, zero
// State); an entry that does not decode is an error naming why (the caller starts afresh too).
func decodeState(raw *jetstream.RawStreamMsg) (state, error) {
	switch raw.Header.Get("KV-Operation") {
	case "DEL", "PURGE":
		return state{}, nil
	}
	var st state
	if err := json.Unmarshal(raw.Data, &st); err != nil {
		return state{}, err
	}
	if st.V != stateVersion {
		return state{}, fmt.Errorf("state version %d, want %d", st.V, stateVersion)
	}
	return st, nil
}

// lastState is the last entry of k in the bucket (jetstream.ErrMsgNotFound: never checkpointed), read
// from the bucket's leader: a reload follows a write refused for a stale revision, and a replica still
// catching up would answer with the older state again, whose pending gaps would then be reported over
// FPMs that are stored.
func (s *stateStore) lastState(k streams.Key) (*jetstream.RawStreamMsg, error) {
	ctx, cancel := s.ioCtx()
	defer cancel()
	return natsconn.LastMsgFromLeader(ctx, s.js, "KV_"+s.cfg.StateBucket, s.kvSubject(k))
}

// scanStates calls fn with the last entry of every publisher of the group in the bucket.
func (s *stateStore) scanStates(ctx context.Context, fn func(k streams.Key, raw *jetstream.RawStreamMsg) error) error {
	filter := "$KV." + s.cfg.StateBucket + "." + s.cfg.Group + ".>"
	oc, err := s.kv.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return fmt.Errorf("gaps: read state bucket %s: %w", s.cfg.StateBucket, err)
	}
	info, err := oc.Info(ctx)
	if err != nil {
		return fmt.Errorf("gaps: read state bucket %s: %w", s.cfg.StateBucket, err)
	}
	left := info.NumPending
	prefix := len("$KV." + s.cfg.StateBucket + ".")
	for left > 0 {
		batch, err := oc.Fetch(int(min(left, 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("gaps: read state bucket %s: %w", s.cfg.StateBucket, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			left--
			k, ok := keyFromKV(s.cfg.Group, m.Subject()[prefix:])
			if !ok {
				continue
			}
			meta, err := m.Metadata()
			if err != nil {
				continue
			}
			if err := fn(k, &jetstream.RawStreamMsg{Subject: m.Subject(), Sequence: meta.Sequence.Stream, Header: m.Headers(), Data: m.Data()}); err != nil {
				return err
			}
		}
		if err := batch.Error(); err != nil {
			return fmt.Errorf("gaps: read state bucket %s: %w", s.cfg.StateBucket, err)
		}
		if n == 0 {
			break
		}
	}
	return nil
}

// nextOn is the first message on subject subj of stream st at or after sequence from
// (jetstream.ErrMsgNotFound: none).
func (s *stateStore) nextOn(st jetstream.Stream, subj string, from uint64) (*jetstream.RawStreamMsg, error) {
	ctx, cancel := s.ioCtx()
	defer cancel()
	return st.GetMsg(ctx, from, jetstream.WithGetMsgSubject(subj))
}

// nextFPM is k's first FPM at or after sequence from of k's stream (FPM, or k's shard).
func (s *stateStore) nextFPM(k streams.Key, from uint64) (*jetstream.RawStreamMsg, error) {
	return s.nextOn(s.fpm[streams.ShardOf(k, len(s.fpm))], streams.FPMSubject(k), from)
}

// nextMarker is k's first drop marker at or after FPM_EVENTS sequence from.
func (s *stateStore) nextMarker(k streams.Key, from uint64) (*jetstream.RawStreamMsg, error) {
	return s.nextOn(s.events, streams.DropMarkerSubject(k), from)
}

// nextEvent is k's first stored gap event at or after FPM_EVENTS sequence from.
func (s *stateStore) nextEvent(k streams.Key, from uint64) (*jetstream.RawStreamMsg, error) {
	return s.nextOn(s.events, streams.GapEventSubject(k), from)
}

// commitItem is one publisher's part of a checkpoint: its state bytes (nil when only already
// reflected redeliveries or plain advances not due for a write are held), the events of its outbox
// and the messages the checkpoint covers. The loop fills the inputs; write fills the results.
type commitItem struct {
	e      *entry
	data   []byte
	rev    uint64
	events []Event
	msgs   []*durable.Msg

	newRev    uint64
	conflict  bool
	err       error
	confirmed map[string]uint64 // event id -> FPM_EVENTS sequence
	safe      bool              // state and events stored: the loop marks the messages done
}

// write stores a checkpoint. For every publisher, in this order:
//
//  1. its state (outbox included) is written to the bucket, expecting the revision last read or
//     written; a refusal means another writer updated it (the loop drops and reloads it);
//  2. its outbox events are published with their ids (the server deduplicates a repeat);
//  3. the messages the checkpoint covers are safe once 1 and 2 succeeded (the loop marks them done);
//     on a conflict they are marked done after the publisher is reloaded (which re-reads them from
//     the stream).
//
// It reads only the items' inputs and the entries' fixed key and subject, and writes only the items'
// results: it runs on the checkpoint goroutine while the loop goes on.
func (s *stateStore) write(items []*commitItem) {
	timeout := time.NewTimer(s.cfg.PublishTimeout)
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
	futs := make([]jetstream.PubAckFuture, len(items))
	for i, it := range items {
		if it.data == nil {
			continue
		}
		fut, err := s.js.PublishMsgAsync(&nats.Msg{Subject: it.e.kvSubj, Data: it.data}, jetstream.WithExpectLastSequencePerSubject(it.rev))
		if err != nil {
			it.err = fmt.Errorf("write state of %s: %w", it.e.key, err)
			continue
		}
		futs[i] = fut
	}
	for i, it := range items {
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
	for _, it := range items {
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
			fut, err := s.js.PublishMsgAsync(msg, jetstream.WithMsgID(ev.ID))
			if err != nil {
				it.err = fmt.Errorf("publish event %s: %w", ev.ID, err)
				break
			}
			pubs = append(pubs, pub{it, ev.ID, fut})
		}
	}
	if len(pubs) > 0 && expired {
		expired = false
		timeout.Reset(s.cfg.PublishTimeout)
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
	for _, it := range items {
		switch {
		case it.conflict:
			// Left to the loop: the publisher is reloaded, then its messages marked done.
		case it.err == nil && len(it.confirmed) == len(it.events):
			it.safe = true
		}
	}
}
