package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A partition takeover resets the partition consumer to its ack floor (ordered takeover), and a reset
// restarts the server's delivery count: a message that crashes every instance that takes it would be
// delivered as "first delivery" forever. So the runner counts takeovers itself, durably: every
// session records in KV bucket attemptsBucket the ack floor it started from. A session that starts
// from the same floor as a previous one that did not end in a graceful hand-over (its instance crashed,
// was cut off or failed) made no progress; after MaxDeliveries such sessions in a row the
// runner hands the partition's messages one at a time, recording each one's sequence before handing
// it (the suspect), and the next session dead-letters the suspect instead of handing it. Progress
// (an ack past the floor) ends the careful mode. The common path costs one KV read and write per
// takeover.

// attemptsBucket is the KV bucket of takeover records: key <stream>.<group>.<partition>.
const attemptsBucket = "FPM_CONSUMER_ATTEMPTS"

const attemptsTTL = 24 * time.Hour

// attempts is the value of a takeover record.
type attempts struct {
	Floor    uint64 `json:"floor"`             // the ack floor the last session started from
	Sessions int    `json:"sessions"`          // sessions in a row that started from Floor and did not end cleanly
	Suspect  uint64 `json:"suspect,omitempty"` // the message being handled when the careful mode last handed one
}

func (r *Runner) attemptsKey(p int) string {
	return r.group.ConsumerStream() + "." + r.group.Group + "." + strconv.Itoa(p)
}

func (r *Runner) attemptsBucket(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := r.js.KeyValue(ctx, attemptsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		replicas := 1
		if st, serr := r.js.Stream(ctx, r.group.SourceStreams()[0]); serr == nil {
			replicas = st.CachedInfo().Config.Replicas
		}
		kv, err = r.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: attemptsBucket, Description: "fpmbus: partition takeovers without progress (crash-loop guard)",
			TTL: attemptsTTL, Storage: jetstream.FileStorage, Replicas: replicas, History: 1,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = r.js.KeyValue(ctx, attemptsBucket)
		}
	}
	return kv, err
}

// startAttempt records a session of s.p starting from ack floor floor and sets the session's careful
// mode and suspect.
func (r *Runner) startAttempt(ctx context.Context, s *session, floor uint64) error {
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	if r.kv == nil {
		kv, err := r.attemptsBucket(cctx)
		if err != nil {
			return fmt.Errorf("attempts bucket %s: %w", attemptsBucket, err)
		}
		r.kv = kv
	}
	var a attempts
	if e, err := r.kv.Get(cctx, r.attemptsKey(s.p)); err == nil {
		_ = json.Unmarshal(e.Value(), &a)
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("attempts of partition %d: %w", s.p, err)
	}
	if a.Floor != floor {
		a = attempts{Floor: floor}
	}
	a.Sessions++
	s.floor, s.attempt = floor, a
	if a.Sessions > r.cfg.MaxDeliveries {
		s.careful = true
		r.log.Warn("partition taken over repeatedly without progress: handing its messages one at a time",
			"partition", s.p, "floor", floor, "sessions", a.Sessions, "suspect", a.Suspect)
	}
	return r.putAttempt(cctx, s)
}

func (r *Runner) putAttempt(ctx context.Context, s *session) error {
	b, _ := json.Marshal(s.attempt)
	if _, err := r.kv.Put(ctx, r.attemptsKey(s.p), b); err != nil {
		return fmt.Errorf("attempts of partition %d: %w", s.p, err)
	}
	return nil
}

// suspect records that message seq is about to be handled in careful mode.
func (r *Runner) suspect(ctx context.Context, s *session, seq uint64) error {
	s.attempt.Suspect = seq
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	return r.putAttempt(cctx, s)
}

// progressed ends careful mode once a message past the floor was acknowledged.
func (r *Runner) progressed(ctx context.Context, s *session, ackedSeq uint64) {
	if !s.careful || ackedSeq <= s.floor {
		return
	}
	s.careful = false
	s.attempt = attempts{Floor: ackedSeq, Sessions: 1}
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	if err := r.putAttempt(cctx, s); err != nil {
		r.log.Warn("attempts record not updated", "partition", s.p, "err", err)
	}
	r.log.Info("partition progressing again", "partition", s.p, "acked_seq", ackedSeq)
}

// endedCleanly records that s ended in a graceful hand-over: it does not count towards a crash loop,
// whatever its floor (a rebalance, a stop, an idle partition handed on).
func (r *Runner) endedCleanly(ctx context.Context, s *session) {
	if r.kv == nil {
		return
	}
	s.attempt.Sessions, s.attempt.Suspect = 0, 0
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	if err := r.putAttempt(cctx, s); err != nil {
		r.log.Warn("attempts record not updated", "partition", s.p, "err", err)
	}
}
