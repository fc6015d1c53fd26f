package seal

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
)

// Entry is one FPM_DATASETS key as every reader reads it (revisions.go): a cell is its first
// revision, a campaign record its legitimate revisions; the other revisions are Ignored.
type Entry struct {
	Key string
	// Revision is the revision read: a cell's first, a campaign record's last legitimate one.
	Revision uint64
	Created  time.Time
	Cell     *schemas.SealedCell // a cell key's sealed value
	Campaign *schemas.Campaign   // a campaign key's record
	// Problem says why the key holds no usable record (a first revision that is a marker, does not
	// decode, or is not a frozen plan); Cell and Campaign are nil then.
	Problem string
	// Ignored are the key's revisions no fpmbus writer stores (tampering), oldest first.
	Ignored []Tampered
}

// fold reads one key's revisions in order into its Entry.
type fold struct {
	e      Entry
	seen   bool
	noRows bool // drop a cell's rows (listings)
}

func (f *fold) add(r Revision) {
	key := f.e.Key
	switch {
	case !f.seen:
		f.seen = true
		f.e.Revision, f.e.Created = r.Revision, r.Created
		if strings.HasPrefix(key, schemas.CampaignKeyPrefix) {
			c, err := schemas.NextCampaign(nil, r.Value, r.Deleted())
			if err != nil {
				f.e.Problem = "campaign record's first revision: " + err.Error()
				return
			}
			f.e.Campaign = c
			return
		}
		v, err := sealedValue(key, &r)
		if err != nil {
			f.e.Problem = err.Error()
			return
		}
		if f.noRows {
			v.Rows = nil
		}
		f.e.Cell = v
	case f.e.Campaign != nil:
		next, err := schemas.NextCampaign(f.e.Campaign, r.Value, r.Deleted())
		if err != nil {
			f.e.Ignored = append(f.e.Ignored, Tampered{Key: key, CampaignID: f.e.Campaign.CampaignID, Revision: r.Revision, Op: r.OpName(), Reason: err.Error()})
			return
		}
		f.e.Campaign, f.e.Revision, f.e.Created = next, r.Revision, r.Created
	default:
		why := fmt.Sprintf("a %s stored after the sealed value (revision %d), which stands", r.OpName(), f.e.Revision)
		if f.e.Problem != "" {
			why = "a " + r.OpName() + " stored after a first revision that is no record"
		}
		f.e.Ignored = append(f.e.Ignored, Tampered{Key: key, Revision: r.Revision, Op: r.OpName(), Reason: why})
	}
}

// Read reads key as every reader does (Entry); jetstream.ErrKeyNotFound when it never had a revision.
func Read(ctx context.Context, kv jetstream.KeyValue, key string) (*Entry, error) {
	revs, err := bucketHistory(kv).all(ctx, key)
	if err != nil {
		return nil, err
	}
	if len(revs) == 0 {
		return nil, jetstream.ErrKeyNotFound
	}
	f := fold{e: Entry{Key: key}}
	for _, r := range revs {
		f.add(r)
	}
	return &f.e, nil
}

// List reads every cell and campaign key of the bucket as Read does, in key order, with one watch of
// the bucket's whole history (cells without their rows).
func List(ctx context.Context, kv jetstream.KeyValue) ([]Entry, error) {
	return ListProgress(ctx, kv, nil)
}

// ListProgress is List calling progress (when not nil) as it reads the bucket's revisions: those read so
// far and those the bucket held when the listing started.
func ListProgress(ctx context.Context, kv jetstream.KeyValue, progress func(read, total uint64)) ([]Entry, error) {
	var total, read uint64
	if progress != nil {
		if st, err := kv.Status(ctx); err == nil {
			total = st.Values()
		}
		progress(0, total)
	}
	w, err := kv.WatchAll(ctx, jetstream.IncludeHistory())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	folds := map[string]*fold{}
	for {
		var e jetstream.KeyValueEntry
		select {
		case e = <-w.Updates():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if e == nil {
			break
		}
		if read++; progress != nil && (read%256 == 0 || read == total) {
			progress(read, total)
		}
		k := e.Key()
		if !strings.HasPrefix(k, schemas.CellKeyPrefix) && !strings.HasPrefix(k, schemas.CampaignKeyPrefix) {
			continue
		}
		f := folds[k]
		if f == nil {
			f = &fold{e: Entry{Key: k}, noRows: true}
			folds[k] = f
		}
		f.add(Revision{Revision: e.Revision(), Op: e.Operation(), Value: e.Value(), Created: e.Created()})
	}
	out := make([]Entry, 0, len(folds))
	for _, f := range folds {
		out = append(out, f.e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}
