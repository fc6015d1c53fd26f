package seal

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/retrywait"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// ErrConflict: a different attempt sealed the cell first. The sealed value is untouched.
var ErrConflict = errors.New("seal: cell already sealed by a different attempt")

// errUnsettled: the outcome of a Create stayed unknown (timeouts, no leader) for every retry.
var errUnsettled = errors.New("seal: outcome unknown after retries")

// ErrTooLarge: a sealed cell or campaign record is larger than the server's max_payload, so the
// server can never store it (nats.ErrMaxPayload, refused before it is sent). It is final, never retried.
var ErrTooLarge = errors.New("seal: record larger than the server's max_payload")

// tooLarge wraps err in ErrTooLarge when it is nats.ErrMaxPayload, naming what (a key) and its size.
func tooLarge(err error, what string, size int) error {
	if errors.Is(err, nats.ErrMaxPayload) {
		return fmt.Errorf("%w: %s is %d bytes: %w", ErrTooLarge, what, size, err)
	}
	return err
}

// conflictError names both identities of a refused seal: what is sealed and what was refused.
type conflictError struct {
	Key     string
	Sealed  attempt
	Refused attempt
	// Missing: the bucket does not hold the cell, but campaign CampaignID's record names it sealed by
	// Sealed; the seal is refused while that record stands (lost.go). errors.Is(err, ErrSealMissing).
	Missing    bool
	CampaignID string
}

// attempt is what makes two publications "the same attempt": run id and dataset digest (plus the
// unique attempt id, which only says who wrote the value).
type attempt struct {
	RunID         string `json:"run_id"`
	DatasetDigest string `json:"dataset_digest"`
	AttemptID     string `json:"attempt_id"`
	Source        string `json:"source,omitempty"`
}

func (e *conflictError) Error() string {
	if e.Missing {
		return fmt.Sprintf("%v: %s is missing from FPM_DATASETS, but campaign %s records it sealed by run %q (dataset %s); refused run %q (dataset %s, attempt %s) while that record stands",
			ErrConflict, e.Key, e.CampaignID, e.Sealed.RunID, e.Sealed.DatasetDigest, e.Refused.RunID, e.Refused.DatasetDigest, e.Refused.AttemptID)
	}
	return fmt.Sprintf("%v: %s sealed by run %q (dataset %s, attempt %s, source %q); refused run %q (dataset %s, attempt %s)",
		ErrConflict, e.Key, e.Sealed.RunID, e.Sealed.DatasetDigest, e.Sealed.AttemptID, e.Sealed.Source,
		e.Refused.RunID, e.Refused.DatasetDigest, e.Refused.AttemptID)
}

func (e *conflictError) Unwrap() error { return ErrConflict }

// Is makes a refusal of a missing cell match ErrSealMissing too.
func (e *conflictError) Is(target error) bool { return e.Missing && target == ErrSealMissing }

// result is how one seal ended.
type result int

const (
	// sealed: this call's Create won (possibly found out by reading the key back after a lost ack).
	sealed result = iota + 1
	// alreadySealed: the same attempt (run id and dataset digest) was sealed before: idempotent success.
	alreadySealed
	// conflict: a different attempt was sealed first; err is a *conflictError.
	conflict
)

func (r result) String() string {
	switch r {
	case sealed:
		return "sealed"
	case alreadySealed:
		return "already_sealed"
	case conflict:
		return "conflict"
	}
	return "unknown"
}

// outcome of one Seal.
type outcome struct {
	Key      string
	Result   result
	Revision uint64 // the sealed value's revision
	// Settled is true when the result was found by reading the key back after an unknown outcome.
	Settled bool
	Value   *schemas.SealedCell // the value in the bucket
}

// Sealer seals cells into FPM_DATASETS with compare-and-set. It holds no lock and no state besides the
// bucket handle: any number of sealers, in any number of processes, may race on the same cells; for
// each key the first successful Create is the only value ever stored. Safe for concurrent use.
type Sealer struct {
	kv        jetstream.KeyValue
	js        jetstream.JetStream // optional: leader reads of what the campaign records name (lost.go)
	source    string
	retries   int
	backoff   time.Duration
	opTimeout time.Duration
	now       func() time.Time
}

// option configures a Sealer.
type option func(*Sealer) error

// WithSource names the publisher in sealed values ("fpmbus seal", "fpmbus datasets publish").
func WithSource(s string) option { return func(x *Sealer) error { x.source = s; return nil } }

// withJetStream lets the sealer read the campaign records and the cells they name from the bucket
// stream's leader (lost.go); js must be on the bucket's connection. The consumer always gives its own.
func withJetStream(js jetstream.JetStream) option {
	return func(x *Sealer) error {
		if js == nil {
			return fmt.Errorf("seal: nil JetStream")
		}
		x.js = js
		return nil
	}
}

// withJetStream returns a copy of s that reads from the leader through js (unless s already does).
func (s *Sealer) withJetStream(js jetstream.JetStream) *Sealer {
	if s.js != nil {
		return s
	}
	c := *s
	c.js = js
	return &c
}

// withRetries sets how often an unknown outcome is retried (default 20) and the first pause (default
// 100 ms, doubling up to 2 s).
func withRetries(n int, backoff time.Duration) option {
	return func(x *Sealer) error {
		if n < 1 || backoff <= 0 {
			return fmt.Errorf("seal: retries %d and backoff %v must be positive", n, backoff)
		}
		x.retries, x.backoff = n, backoff
		return nil
	}
}

// withOpTimeout bounds one KV request (default 5 s).
func withOpTimeout(d time.Duration) option {
	return func(x *Sealer) error {
		if d <= 0 {
			return fmt.Errorf("seal: op timeout %v must be positive", d)
		}
		x.opTimeout = d
		return nil
	}
}

// OpenBucket opens FPM_DATASETS, creating it when it is missing, protected (streams.DatasetsBucket:
// every revision of every key kept, no delete, purge or rollup) with the replicas and storage of sc.
// An existing bucket is used as it is: Protect adds what it lacks.
func OpenBucket(ctx context.Context, js jetstream.JetStream, sc streams.Config) (jetstream.KeyValue, error) {
	kv, err := streams.EnsureDatasets(ctx, js, sc)
	if err != nil {
		return nil, fmt.Errorf("seal: open bucket: %w", err)
	}
	return kv, nil
}

// Protect adds to an existing FPM_DATASETS the protection it lacks (streams.ProtectDatasets), as the
// sealer does at start: every change keeps what the bucket holds. A credential that may not change the
// stream (the service users of ops/nats/permissions.conf) gets an error wrapping
// streams.errUnprotected within 5 s, naming what is missing; `fpmbus streams apply` as the operator
// adds it.
func Protect(ctx context.Context, js jetstream.JetStream, log *slog.Logger) ([]streams.Change, error) {
	return streams.ProtectDatasets(ctx, js, 5*time.Second, log)
}

// NewSealer returns a Sealer on kv. Options: WithSource, withJetStream, withRetries, withOpTimeout.
func NewSealer(kv jetstream.KeyValue, opts ...option) (*Sealer, error) {
	s := &Sealer{kv: kv, source: "fpmbus", retries: 20, backoff: 100 * time.Millisecond, opTimeout: 5 * time.Second, now: time.Now}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// KV is the bucket.
func (s *Sealer) KV() jetstream.KeyValue { return s.kv }

// newAttemptID returns a random 128-bit attempt id.
func newAttemptID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Seal publishes one validated cell (the caller validated it) under a fresh attempt id.
func (s *Sealer) Seal(ctx context.Context, c *schemas.Cell, campaignID string) (outcome, error) {
	return s.SealAttempt(ctx, c, campaignID, newAttemptID())
}

// SealAttempt publishes c with the given attempt id.
//
// The write (compare-and-set on the key's last revision, revisions.go) wins or loses atomically. When
// the key holds revisions the seal is read: the same attempt is alreadySealed (or sealed, when the
// value carries our attempt id: our earlier write won but its ack was lost), a different one is a
// Conflict; revisions none of which is a seal (a delete marker, junk) seal nothing, and the write is
// made again on top of the last of them. Any other error (timeout, leader election, no responders)
// leaves the outcome unknown: the key is read back and, if still not sealed, the write is retried.
// The sealed value is never modified.
func (s *Sealer) SealAttempt(ctx context.Context, c *schemas.Cell, campaignID, attemptID string) (outcome, error) {
	val := schemas.SealedCell{
		SchemaVersion: schemas.DatasetSchemaVersion, Key: c.Key, Identity: c.Identity, Provenance: c.Provenance,
		Rows: c.Rows, AttemptID: attemptID, CampaignID: campaignID, Source: s.source, SealedAtUnixMS: s.now().UnixMilli(),
	}
	body, err := json.Marshal(val)
	if err != nil {
		return outcome{}, fmt.Errorf("seal: encode %s: %w", c.Key, err)
	}
	pauses := s.pauses()
	var lastErr error
	unknown := false
	expect := uint64(0) // the key's last revision, none of them a seal: 0 for a key that never had one
	for try := 0; try < s.retries; try++ {
		if err := ctx.Err(); err != nil {
			return outcome{}, fmt.Errorf("seal %s: %w", c.Key, err)
		}
		if unknown {
			// Settle an unknown outcome by reading the key back.
			out, found, last, err := s.readBack(ctx, c, attemptID)
			if err == nil && found {
				out.Settled = true
				return s.finish(out, c, attemptID)
			}
			if err != nil {
				lastErr = err
				sleep(ctx, pauses)
				continue
			}
			expect = last
		}
		octx, cancel := context.WithTimeout(ctx, s.opTimeout)
		rev, err := s.kv.Update(octx, c.Key, body, expect) // only on the revisions read, none a seal (revisions.go)
		cancel()
		if err == nil {
			return outcome{Key: c.Key, Result: sealed, Revision: rev, Value: &val, Settled: unknown}, nil
		}
		if errors.Is(err, nats.ErrMaxPayload) {
			return outcome{}, tooLarge(err, "sealed cell "+c.Key, len(body))
		}
		if isKeyTaken(err) {
			out, found, last, rerr := s.readBack(ctx, c, attemptID)
			if rerr == nil && found {
				out.Settled = unknown
				return s.finish(out, c, attemptID)
			}
			if rerr == nil {
				// The key holds revisions none of which is a seal (a delete marker, junk): they seal
				// nothing, and the seal goes on top of the last of them (compare-and-set, so a seal
				// stored meanwhile still wins).
				expect = last
				continue
			}
			lastErr = fmt.Errorf("read back after lost create: %v", rerr)
		} else {
			lastErr = err
		}
		unknown = true
		sleep(ctx, pauses)
	}
	return outcome{}, fmt.Errorf("%w: %s: %v", errUnsettled, c.Key, lastErr)
}

func (s *Sealer) finish(out outcome, c *schemas.Cell, attemptID string) (outcome, error) {
	if out.Result == conflict {
		return out, &conflictError{Key: c.Key,
			Sealed:  attempt{RunID: out.Value.Provenance.RunID, DatasetDigest: out.Value.Provenance.DatasetDigest, AttemptID: out.Value.AttemptID, Source: out.Value.Source},
			Refused: attempt{RunID: c.Provenance.RunID, DatasetDigest: c.Provenance.DatasetDigest, AttemptID: attemptID, Source: s.source}}
	}
	return out, nil
}

// readBack reads the sealed value of key c.Key (its first revision that is a seal, revisions.go);
// found is false when no revision of the key is a seal, and last is then the key's last revision (0
// when it never had one), which the next seal must expect.
func (s *Sealer) readBack(ctx context.Context, c *schemas.Cell, attemptID string) (out outcome, found bool, last uint64, err error) {
	octx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	kh, err := s.history().sealed(octx, c.Key)
	if err != nil {
		return outcome{}, false, 0, err
	}
	if kh.Cell == nil {
		return outcome{}, false, kh.Last, nil
	}
	v := kh.Cell
	out = outcome{Key: c.Key, Revision: kh.Revision, Value: v}
	switch {
	case v.AttemptID == attemptID:
		out.Result = sealed
	case v.SameAttempt(c):
		out.Result = alreadySealed
	default:
		out.Result = conflict
	}
	return out, true, kh.Last, nil
}

// pauses are the waits between two tries of one operation: the sealer's backoff, doubling up to 2 s.
func (s *Sealer) pauses() backoff.BackOff { return retrywait.Doubling(s.backoff, 2*time.Second) }

// sleep waits the next of pauses, or until ctx ends.
func sleep(ctx context.Context, pauses backoff.BackOff) {
	t := time.NewTimer(pauses.NextBackOff())
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// get reads a sealed cell: its key's first revision that is a seal (revisions.go), whatever was
// written before or after it, and that revision. jetstream.ErrKeyNotFound when no revision of the key
// is a seal (it never had one, or only delete markers and junk: the cell is not sealed).
func get(ctx context.Context, kv jetstream.KeyValue, key string) (*schemas.SealedCell, uint64, error) {
	kh, err := bucketHistory(kv).sealed(ctx, key)
	if err != nil {
		return nil, 0, err
	}
	if kh.Cell == nil {
		return nil, 0, jetstream.ErrKeyNotFound
	}
	return kh.Cell, kh.Revision, nil
}
