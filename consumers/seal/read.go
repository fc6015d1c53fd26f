package seal

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
)

// entry is one FPM_DATASETS key as every reader reads it (schemas.KeyHistory): a cell is its first
// revision that is a seal, a campaign record its first frozen plan and the revisions that legitimately
// follow; the other revisions are Ignored.
type entry struct {
	Key string
	// Revision is the revision read: a cell's seal, a campaign record's last legitimate one; while the
	// key holds no record, its last revision.
	Revision uint64
	Created  time.Time
	Cell     *schemas.SealedCell // a cell key's sealed value
	Campaign *schemas.Campaign   // a campaign key's record
	// Problem says why the key holds no record (none of its revisions is a seal, or a frozen plan of
	// the campaign: the last one says why); Cell and Campaign are nil then. The key is not sealed: the
	// next honest seal or plan goes on top of those revisions and is the record.
	Problem string
	// Ignored are the key's revisions no fpmbus writer stores (tampering), oldest first.
	Ignored []tampered
}

// readEntry reads key as every reader does (Entry); jetstream.ErrKeyNotFound when it never had a revision.
func readEntry(ctx context.Context, kv jetstream.KeyValue, key string) (*entry, error) {
	revs, err := bucketHistory(kv).all(ctx, key)
	if err != nil {
		return nil, err
	}
	if len(revs) == 0 {
		return nil, jetstream.ErrKeyNotFound
	}
	return foldAll(key, revs).entry(), nil
}

// list reads every cell and campaign key of the bucket as Read does, in key order, with one watch of
// the bucket's whole history (cells without their rows).
func list(ctx context.Context, kv jetstream.KeyValue) ([]entry, error) {
	return ListProgress(ctx, kv, nil)
}

// ListProgress is List calling progress (when not nil) as it reads the bucket's revisions: those read so
// far and those the bucket held when the listing started.
func ListProgress(ctx context.Context, kv jetstream.KeyValue, progress func(read, total uint64)) ([]entry, error) {
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
			f = newFold(k, true)
			folds[k] = f
		}
		f.add(revision{Revision: e.Revision(), Op: e.Operation(), Value: e.Value(), Created: e.Created()})
	}
	out := make([]entry, 0, len(folds))
	for _, f := range folds {
		out = append(out, *f.entry())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}
