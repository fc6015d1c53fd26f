package partition

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ownerRecord is the value of a partition's owner key in the members bucket,
// <stream>.<group>.owner.<p>: who owns the partition and on which subject the server delivers its
// messages to that owner. It is written only with compare-and-set on the key's revision, so that of
// two members that decide to take a partition at the same moment exactly one does; only the member
// whose write succeeded points the consumer at its subject. The revision is the ownership's epoch: an
// owner rewrites the record (same revision expected) every PinnedTTL/2 and ends its session at once
// when that fails, because someone else took the partition. The rewrites are also the owner's
// liveness: a record the server stored less than PinnedTTL ago has a live owner, also in the moments
// between its claim and its subscription.
type ownerRecord struct {
	Member string `json:"member"`
	// Deliver is the owner's session subject (the consumer's DeliverSubject while it owns).
	Deliver string `json:"deliver,omitempty"`
	// Released: the owner gave the partition up gracefully, with everything it handled acked; the
	// next member may take it at once.
	Released bool  `json:"released,omitempty"`
	At       int64 `json:"at_unix_ms"`
}

// ownerKey is partition p's owner key: one token more than a member key (<stream>.<group>.<member>),
// so the members watch (<stream>.<group>.*) never sees it.
func (c Config) ownerKey(p int) string {
	return c.Stream + "." + c.Group + ".owner." + strconv.Itoa(p)
}

// errOwnerTaken: the owner record changed since it was read (another member wrote it first).
var errOwnerTaken = errors.New("partition: owner record changed: another member took the partition")

// readOwner returns partition p's owner record, its revision and when the server stored it (nil,
// 0 and the zero time when there is none).
func (m *Member) readOwner(ctx context.Context, p int) (*ownerRecord, uint64, time.Time, error) {
	e, err := m.kv.Get(ctx, m.cfg.ownerKey(p))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, time.Time{}, nil
	}
	if err != nil {
		return nil, 0, time.Time{}, err
	}
	var rec ownerRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, e.Revision(), time.Time{}, nil // unreadable: treated as no owner, replaced by the next taker
	}
	return &rec, e.Revision(), e.Created(), nil
}

// writeOwner writes partition p's owner record if its revision is still rev (0: the key must not
// exist) and returns the new revision; errOwnerTaken if another member wrote it first.
func (m *Member) writeOwner(ctx context.Context, p int, rec ownerRecord, rev uint64) (uint64, error) {
	rec.At = time.Now().UnixMilli()
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, err
	}
	var n uint64
	if rev == 0 {
		n, err = m.kv.Create(ctx, m.cfg.ownerKey(p), b)
	} else {
		n, err = m.kv.Update(ctx, m.cfg.ownerKey(p), b, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, errOwnerTaken
	}
	return n, err
}
