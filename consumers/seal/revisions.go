package seal

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/schemas"
)

// Reading sealed history.
//
// FPM_DATASETS keeps every revision of every key (streams.DatasetsBucket), and a leaked or buggy
// credential that may write the bucket can still add revisions: an overwrite of a sealed cell, a
// delete marker, a rewritten campaign record, or junk stored under a key before anyone sealed it. So
// nothing here reads a key's latest value; every reader folds its history with schemas.KeyHistory:
//
//   - a sealed cell is its key's first revision that is a seal (schemas.sealedValue); a delete marker
//     or junk before it seals nothing, every revision after it is tampering: the audit reports them
//     (lost.go) and every reader ignores them;
//   - a campaign record is its first frozen plan followed by each revision that legitimately follows
//     (nextCampaign in schemas); the others are skipped (and reported by the audit), and the next honest
//     write goes on top of them (compare-and-set on the key's last revision).
//
// A seal is a compare-and-set write on the key's last revision: 0 (kv.Update at revision 0, "only on
// a key that never had a revision") for a new key, or the last of revisions none of which is a seal.
// Whoever stores the first seal wins; any write that lands between the read and the write makes the
// write fail, and the sealer reads again. nats.go's kv.Create would write over a delete marker without
// looking at what came before it, and a delete marker stored after a seal must never let a second
// value in.

// revision is one stored revision of an FPM_DATASETS key.
type revision struct {
	Revision uint64
	// Op is jetstream.KeyValuePut, KeyValueDelete or KeyValuePurge (a marker: Value is empty).
	Op      jetstream.KeyValueOp
	Value   []byte
	Created time.Time
}

// Deleted reports a delete or purge marker.
func (r *revision) Deleted() bool { return r.Op != jetstream.KeyValuePut }

// OpName is the revision's operation as the KV-Operation header names it: PUT, DEL or PURGE.
func (r *revision) OpName() string {
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

// sealed reads key's revisions, oldest first, up to its sealed value, and returns them folded: Cell
// is nil when no revision is a seal (Last is then the key's last revision, 0 when it never had one).
func (h history) sealed(ctx context.Context, key string) (*schemas.KeyHistory, error) {
	kh := &schemas.KeyHistory{Key: key}
	if h.js == nil {
		revs, err := h.all(ctx, key)
		if err != nil {
			return nil, err
		}
		for _, r := range revs {
			_ = kh.Add(r.Revision, r.Value, r.Deleted()) // one that is no seal is read past
			if kh.Cell != nil {
				break
			}
		}
		return kh, nil
	}
	for from := uint64(0); ; {
		r, err := h.leaderNext(ctx, key, from)
		if err != nil || r == nil {
			return kh, err
		}
		_ = kh.Add(r.Revision, r.Value, r.Deleted()) // one that is no seal is read past
		if kh.Cell != nil {
			return kh, nil
		}
		from = r.Revision + 1
	}
}

// all returns every revision of key, oldest first (none: nil).
func (h history) all(ctx context.Context, key string) ([]revision, error) {
	if h.js == nil {
		es, err := h.kv.History(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		out := make([]revision, len(es))
		for i, e := range es {
			out[i] = revision{Revision: e.Revision(), Op: e.Operation(), Value: e.Value(), Created: e.Created()}
		}
		return out, nil
	}
	var out []revision
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
func (h history) leaderNext(ctx context.Context, key string, from uint64) (*revision, error) {
	var m *jetstream.RawStreamMsg
	err := h.retry(ctx, func(ctx context.Context) (err error) {
		m, err = natsconn.NextMsgFromLeader(ctx, h.js, "KV_"+h.kv.Bucket(), h.subject(key), from)
		return err
	})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r := &revision{Revision: m.Sequence, Op: jetstream.KeyValuePut, Value: m.Data, Created: m.Time}
	switch m.Header.Get("KV-Operation") {
	case "DEL":
		r.Op = jetstream.KeyValueDelete
	case "PURGE":
		r.Op = jetstream.KeyValuePurge
	}
	return r, nil
}

// fold reads one key's revisions, oldest first, into the Entry every reader reads (schemas.KeyHistory),
// collecting what it ignores.
type fold struct {
	h      schemas.KeyHistory
	e      entry
	noRows bool // drop a cell's rows (listings)
}

func newFold(key string, noRows bool) *fold {
	return &fold{h: schemas.KeyHistory{Key: key}, e: entry{Key: key}, noRows: noRows}
}

func (f *fold) add(r revision) {
	err := f.h.Add(r.Revision, r.Value, r.Deleted())
	if err != nil {
		f.e.Ignored = append(f.e.Ignored, tampered{Key: f.e.Key, Revision: r.Revision, Op: r.OpName(), Reason: err.Error()})
	}
	switch {
	case err == nil:
		f.e.Revision, f.e.Created, f.e.Problem = r.Revision, r.Created, ""
		if f.noRows && f.h.Cell != nil && f.h.Cell.Rows != nil {
			c := *f.h.Cell // the fold needs only to know the key is sealed: a listing holds no rows
			c.Rows = nil
			f.h.Cell = &c
		}
		f.e.Cell, f.e.Campaign = f.h.Cell, f.h.Campaign
	case f.h.Revision == 0: // no record yet: the latest revision says why
		f.e.Revision, f.e.Created, f.e.Problem = r.Revision, r.Created, f.h.NoRecord
	}
}

// entry is the key's Entry, each ignored revision naming the campaign concerned: a campaign record's,
// or the one that sealed the cell (none while the cell is not sealed).
func (f *fold) entry() *entry {
	id := ""
	switch {
	case f.h.Cell != nil:
		id = f.h.Cell.CampaignID
	case strings.HasPrefix(f.e.Key, schemas.CampaignKeyPrefix):
		id = strings.TrimPrefix(f.e.Key, schemas.CampaignKeyPrefix) // a record's campaign is its key's
	}
	for i := range f.e.Ignored {
		f.e.Ignored[i].CampaignID = id
	}
	return &f.e
}

// foldAll folds revs, a key's revisions oldest first.
func foldAll(key string, revs []revision) *fold {
	f := newFold(key, false)
	for _, r := range revs {
		f.add(r)
	}
	return f
}

// tampered is a revision of an FPM_DATASETS key that no fpmbus writer stores: a revision of a cell key
// that is no seal or comes after its seal, a campaign revision before its frozen plan or that does not
// follow the record (schemas.CheckSuccessor).
type tampered struct {
	Key string `json:"key"`
	// CampaignID is the campaign whose record it is, or whose campaign sealed the cell ("" unknown).
	CampaignID string `json:"campaign_id,omitempty"`
	Revision   uint64 `json:"revision"`
	Op         string `json:"op"`
	Reason     string `json:"reason"`
}
