package seal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// Reading sealed history.
//
// FPM_DATASETS keeps every revision of every key (streams.DatasetsBucket), and a leaked or buggy
// credential that may write the bucket can still add revisions: an overwrite of a sealed cell, a
// delete marker, a rewritten campaign record. So nothing here reads a key's latest value:
//
//   - a sealed cell is its key's first revision (Get, Sealer.sealed); a later revision is tampering,
//     which the audit reports (lost.go) and every reader ignores;
//   - a campaign record is its history folded by schemas.NextCampaign: the frozen plan, then each
//     revision that legitimately follows; tampered ones are skipped (and reported by the audit), and
//     the next honest write goes on top of them (compare-and-set on the key's last revision).
//
// A seal is a write with "expected last subject sequence 0" (kv.Update at revision 0): it succeeds
// only on a key that never had a revision. nats.go's kv.Create would also write over a delete marker,
// and a delete marker stored by someone else must never let a second value in.

// Revision is one stored revision of an FPM_DATASETS key.
type Revision struct {
	Revision uint64
	// Op is jetstream.KeyValuePut, KeyValueDelete or KeyValuePurge (a marker: Value is empty).
	Op      jetstream.KeyValueOp
	Value   []byte
	Created time.Time
}

// Deleted reports a delete or purge marker.
func (r *Revision) Deleted() bool { return r.Op != jetstream.KeyValuePut }

// OpName is the revision's operation as the KV-Operation header names it: PUT, DEL or PURGE.
func (r *Revision) OpName() string {
	switch r.Op {
	case jetstream.KeyValueDelete:
		return "DEL"
	case jetstream.KeyValuePurge:
		return "PURGE"
	}
	return "PUT"
}

// history reads keys' revisions from the bucket stream's leader when js is set (a replica still
// catching up could answer from an older state), else through the bucket with an ordered consumer.
type history struct {
	kv jetstream.KeyValue
	js jetstream.JetStream
	// retry runs a leader read again while the cluster cannot answer for the moment (Sealer.untilAvailable).
	retry func(ctx context.Context, f func(context.Context) error) error
}

func (s *Sealer) history() history {
	return history{kv: s.kv, js: s.js, retry: s.untilAvailable}
}

func bucketHistory(kv jetstream.KeyValue) history { return history{kv: kv} }

func (h history) subject(key string) string { return "$KV." + h.kv.Bucket() + "." + key }

// first returns key's first revision, or nil when the key never had one.
func (h history) first(ctx context.Context, key string) (*Revision, error) {
	if h.js == nil {
		w, err := h.kv.WatchFiltered(ctx, []string{key}, jetstream.IncludeHistory())
		if err != nil {
			return nil, err
		}
		defer func() { _ = w.Stop() }()
		select {
		case e := <-w.Updates():
			if e == nil {
				return nil, nil
			}
			return &Revision{Revision: e.Revision(), Op: e.Operation(), Value: e.Value(), Created: e.Created()}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return h.leaderNext(ctx, key, 0)
}

// all returns every revision of key, oldest first (none: nil).
func (h history) all(ctx context.Context, key string) ([]Revision, error) {
	if h.js == nil {
		es, err := h.kv.History(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		out := make([]Revision, len(es))
		for i, e := range es {
			out[i] = Revision{Revision: e.Revision(), Op: e.Operation(), Value: e.Value(), Created: e.Created()}
		}
		return out, nil
	}
	var out []Revision
	for from := uint64(0); ; {
		r, err := h.leaderNext(ctx, key, from)
		if err != nil || r == nil {
			return out, err
		}
		out = append(out, *r)
		from = r.Revision + 1
	}
}

// leaderNext reads key's first revision at or after stream sequence from, from the leader.
func (h history) leaderNext(ctx context.Context, key string, from uint64) (*Revision, error) {
	var m *jetstream.RawStreamMsg
	err := h.retry(ctx, func(ctx context.Context) (err error) {
		m, err = streams.NextMsgFromLeader(ctx, h.js, "KV_"+h.kv.Bucket(), h.subject(key), from)
		return err
	})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r := &Revision{Revision: m.Sequence, Op: jetstream.KeyValuePut, Value: m.Data, Created: m.Time}
	switch m.Header.Get("KV-Operation") {
	case "DEL":
		r.Op = jetstream.KeyValueDelete
	case "PURGE":
		r.Op = jetstream.KeyValuePurge
	}
	return r, nil
}

// sealedValue decodes a cell's first revision: the sealed cell, or why the key holds none (a first
// revision that is a marker, or a value that does not decode: the cell is unusable, and it can never
// be sealed again since its key has a revision).
func sealedValue(key string, r *Revision) (*schemas.SealedCell, error) {
	if r.Deleted() {
		return nil, fmt.Errorf("%w: the first revision of %s (%d) is a delete marker, not a sealed value", ErrCorrupt, key, r.Revision)
	}
	var v schemas.SealedCell
	if err := json.Unmarshal(r.Value, &v); err != nil {
		return nil, fmt.Errorf("%w: sealed value of %s (revision %d) does not decode: %v", ErrCorrupt, key, r.Revision, err)
	}
	return &v, nil
}

// ErrCorrupt: a key's sealed value (its first revision) or campaign record cannot be used.
var ErrCorrupt = errors.New("seal: FPM_DATASETS record is corrupt")

// campaignOf folds a campaign record's revisions (schemas.NextCampaign). It returns the record, the
// revision the next write must expect (the key's last, tampered or not), and the revisions skipped as
// tampering with why; the record is nil when the key has no revision, and ErrCorrupt when its first
// revision is not a frozen plan.
func campaignOf(key string, revs []Revision) (*schemas.Campaign, uint64, []Tampered, error) {
	var cur *schemas.Campaign
	var skipped []Tampered
	for i, r := range revs {
		next, err := schemas.NextCampaign(cur, r.Value, r.Deleted())
		if err != nil && i == 0 {
			return nil, r.Revision, nil, fmt.Errorf("%w: campaign record %s: %v", ErrCorrupt, key, err)
		}
		if err != nil {
			skipped = append(skipped, Tampered{Key: key, Revision: r.Revision, Op: r.OpName(), Reason: err.Error()})
		}
		cur = next
	}
	if len(revs) == 0 {
		return nil, 0, nil, nil
	}
	return cur, revs[len(revs)-1].Revision, skipped, nil
}

// Tampered is a revision of an FPM_DATASETS key that no fpmbus writer stores: a later revision of a
// sealed cell, or a campaign revision that does not follow the record (schemas.CheckSuccessor).
type Tampered struct {
	Key string `json:"key"`
	// CampaignID is the campaign whose record it is, or whose campaign sealed the cell ("" unknown).
	CampaignID string `json:"campaign_id,omitempty"`
	Revision   uint64 `json:"revision"`
	Op         string `json:"op"`
	Reason     string `json:"reason"`
}
