package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/predict"
)

// errWatchClosed: the bucket watch ended while the catalog was running (the bucket was deleted, or the
// connection closed for good).
var errWatchClosed = errors.New("service: FPM_DATASETS watch closed")

// catalog holds the current snapshot of FPM_DATASETS. Run keeps it current; Snapshot may be called
// from any goroutine at any time (before the first load it is the empty bucket).
type catalog struct {
	cur    atomic.Pointer[predict.Snapshot]
	loaded chan struct{}
	once   sync.Once
	log    *slog.Logger
}

// newCatalog returns an empty catalog; log may be nil.
func newCatalog(log *slog.Logger) *catalog {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &catalog{loaded: make(chan struct{}), log: log}
}

// Snapshot is the bucket as last applied.
func (c *catalog) Snapshot() *predict.Snapshot { return c.cur.Load() }

// Loaded is closed once every entry the bucket held when Run started has been applied.
func (c *catalog) Loaded() <-chan struct{} { return c.loaded }

// Run watches kv until ctx ends (then it returns nil) or the watch fails. It reads the bucket's whole
// history (a sealed cell is its key's first revision, predict.Snapshot.Apply), applies it as one
// snapshot (in steps of loadStep entries, so the history is never held at once), closes Loaded, then
// applies each change as it is stored (entries already waiting are applied together). A revision it
// ignores as tampering is logged at Warn.
func (c *catalog) Run(ctx context.Context, kv jetstream.KeyValue) error {
	w, err := kv.WatchAll(ctx, jetstream.IncludeHistory())
	if err != nil {
		return fmt.Errorf("service: watch %s: %w", kv.Bucket(), err)
	}
	defer func() { _ = w.Stop() }()
	var pending []predict.Update
	var staged *predict.Snapshot // the history applied so far, before Loaded
	initial := true
	for {
		var e jetstream.KeyValueEntry
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case e, ok = <-w.Updates():
		}
		if !ok {
			if ctx.Err() != nil {
				return nil
			}
			return errWatchClosed
		}
		if e == nil { // the end of the bucket's current entries
			c.cur.Store(staged)
			c.apply(pending)
			pending, staged, initial = nil, nil, false
			c.once.Do(func() { close(c.loaded) })
			continue
		}
		pending = append(pending, update(e))
		if initial {
			if len(pending) >= loadStep {
				staged = staged.Apply(pending...)
				c.logIgnored(staged)
				pending = nil
			}
			continue
		}
	drain:
		for {
			select {
			case e, ok = <-w.Updates():
				if !ok || e == nil {
					break drain
				}
				pending = append(pending, update(e))
			default:
				break drain
			}
		}
		c.apply(pending)
		pending = nil
	}
}

func update(e jetstream.KeyValueEntry) predict.Update {
	return predict.Update{Key: e.Key(), Revision: e.Revision(), Value: e.Value(),
		Deleted: e.Operation() == jetstream.KeyValueDelete || e.Operation() == jetstream.KeyValuePurge}
}

// loadStep is how many entries of the bucket's history the first load applies at a time.
const loadStep = 1024

func (c *catalog) logIgnored(s *predict.Snapshot) {
	for _, ig := range s.Ignored() {
		c.log.Warn("FPM_DATASETS revision ignored: no fpmbus writer stores it (tampering); the sealed value stands",
			"key", ig.Key, "revision", ig.Revision, "reason", ig.Reason)
	}
}

func (c *catalog) apply(us []predict.Update) {
	old := c.cur.Load()
	next := old.Apply(us...)
	c.cur.Store(next)
	c.logIgnored(next)
	for _, u := range us {
		if cell := next.Cell(u.Key); cell != nil && cell.Revision == u.Revision && !cell.Valid() {
			c.log.Warn("sealed cell fails validation: every query for it is refused", "key", u.Key, "revision", u.Revision, "problems", cell.Problems)
		}
	}
	c.log.Debug("FPM_DATASETS applied", "entries", len(us), "revision", next.Revision(), "cells", len(next.Cells()))
}

// Load reads the bucket's current entries once (a watch that stops at the end of them).
func Load(ctx context.Context, kv jetstream.KeyValue) (*predict.Snapshot, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := newCatalog(nil)
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx, kv) }()
	select {
	case <-c.Loaded():
		cancel()
		<-errc
		return c.Snapshot(), nil
	case err := <-errc:
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
}
