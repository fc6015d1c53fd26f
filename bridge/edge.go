package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/edgenode"
	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/streams"
)

// ErrEdgeShards: the central server stores FPMs in shards; the edge topology needs its single stream
// FPM (a central stream sources an edge's FPM whole, and a shard may hold only its own workers).
var ErrEdgeShards = errors.New("bridge: the edge topology needs one central stream FPM")

// Edge is the node-local JetStream of the edge topology (see internal/edgenode): an embedded server in a
// JetStream domain of its own, a leaf node of the central server. The bridge publishes to it over Conn
// as it would to any server, so its buffer, ack accounting and drop markers are unchanged; the central
// FPM and FPM_EVENTS streams source the edge's streams.
//
// Who declares the sources: the edge itself, at start (declareSources). It creates its streams and
// their durable source consumers locally, then adds itself to the central streams' sources. An edge
// that comes up is sourced without an operator step, and the declaration is idempotent, so every
// restart repeats it harmlessly. It runs in the background with backoff because the central server
// may be away when the node starts — which is the case the edge exists for; the edge stores meanwhile
// and the central stream catches up once the source is there. Removing an edge for good is the operator's step
// (README: "Edge topology").
type Edge struct {
	cfg    edgenode.EdgeConfig
	lock   *fsutil.Lock // the store directory's ownership: one edge server per directory
	srv    *natsserver.Server
	nc     *nats.Conn
	log    *slog.Logger
	scfg   streams.Config
	srcd   chan struct{}
	failed chan error // the reason the edge cannot go on (ErrEdgeShards, natsserver.ErrStoreLost), once
	cancel context.CancelFunc
	done   chan struct{}
	// watched is closed when the store watch has returned: the edge's own disk filling is ridden out
	// like a central outage (JetStream restarted once it has room again, streams.WatchStore); a lost
	// store is sent on failed.
	watched chan struct{}
}

// StartEdge starts the edge server for cfg, connects to it in-process, and starts declaring the
// central sources in the background (Sourced is closed once they are there; Failed receives
// ErrEdgeShards if the central server turns out to have FPM shards). scfg defines the streams
// the edge creates on the central server if they are missing there (the bridge's own Ensure creates
// them at the edge). Close stops it all; the store stays on disk.
func StartEdge(cfg edgenode.EdgeConfig, scfg streams.Config, logger *slog.Logger) (*Edge, error) {
	if logger == nil {
		logger = slog.Default()
	}
	sc, err := cfg.ServerConfig()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if scfg == (streams.Config{}) {
		scfg = streams.DefaultConfig()
	}
	if scfg.FPMShards > 1 {
		return nil, fmt.Errorf("%w: FPM shards %d declared", ErrEdgeShards, scfg.FPMShards)
	}
	// Two servers on one store would corrupt it: the directory has one owner (fsutil.OwnDir), and a
	// second edge on it is refused, naming the first.
	lock, err := fsutil.OwnDir(cfg.StoreDir, "bridge edge server")
	if err != nil {
		return nil, fmt.Errorf("bridge: edge directory %s: %w", cfg.StoreDir, err)
	}
	if lock.Previous != nil {
		logger.Warn("edge directory taken over from an owner that ended without releasing it (killed?)", "dir", cfg.StoreDir, "previous_owner", lock.Previous.String())
	}
	srv, err := natsserver.StartServer(sc)
	if err != nil {
		_ = lock.Unlock()
		return nil, fmt.Errorf("bridge: edge server %s: %w", cfg.Domain(), err)
	}
	nc, err := natsconn.Connect(natsconn.ConnConfig{InProcess: srv, Name: "fpmbus-bridge-edge", Logger: logger})
	if err != nil {
		_ = srv.Shutdown(context.Background())
		_ = lock.Unlock()
		return nil, fmt.Errorf("bridge: edge server %s: connect: %w", cfg.Domain(), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Edge{cfg: cfg, lock: lock, srv: srv, nc: nc, scfg: scfg, srcd: make(chan struct{}), failed: make(chan error, 1), cancel: cancel, done: make(chan struct{}),
		watched: make(chan struct{}), log: logger.With("component", "bridge-edge", "domain", cfg.Domain())}
	go func() {
		defer close(e.done)
		e.declareSources(ctx)
	}()
	go func() {
		defer close(e.watched)
		if err := srv.WatchStore(ctx, natsserver.StoreWatchConfig{Logger: e.log}); err != nil {
			select {
			case e.failed <- err:
			default:
			}
		}
	}()
	return e, nil
}

// Conn is the bridge's connection to the edge server. It belongs to the Edge: Close closes it.
func (e *Edge) Conn() *nats.Conn { return e.nc }

// Server is the edge's embedded server.
func (e *Edge) Server() *natsserver.Server { return e.srv }

// Sourced is closed once the central streams source this edge.
func (e *Edge) Sourced() <-chan struct{} { return e.srcd }

// Failed receives, once, why the edge cannot go on: the central streams can never source it
// (ErrEdgeShards; the edge stops declaring then, what it stored stays on its disk), or its store was
// deleted under it (natsserver.ErrStoreLost; its JetStream is shut down).
func (e *Edge) Failed() <-chan error { return e.failed }

// Close stops declaring, closes Conn and shuts the edge server down (its store stays). Call it after
// the bridge's Run has returned: the bridge publishes over Conn until then.
func (e *Edge) Close(ctx context.Context) error {
	e.cancel()
	<-e.done
	<-e.watched
	e.nc.Close()
	err := e.srv.Shutdown(ctx)
	return errors.Join(err, e.lock.Unlock())
}

// declareSources retries until the central streams source this edge or ctx ends.
func (e *Edge) declareSources(ctx context.Context) {
	local, err := jetstream.New(e.nc)
	if err != nil {
		e.log.Error("edge: JetStream", "err", err)
		return
	}
	central, err := jetstream.NewWithDomain(e.nc, e.cfg.CentralDomainOrDefault())
	if err != nil {
		e.log.Error("edge: central JetStream", "err", err)
		return
	}
	bo := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(250*time.Millisecond),
		backoff.WithMaxInterval(10*time.Second),
		backoff.WithMaxElapsedTime(0),
	)
	consumers := false // the edge's source consumers are there
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if !consumers {
			err = e.declareConsumers(actx, local)
			consumers = err == nil
		}
		if consumers {
			err = e.declareOnce(actx, central)
		}
		cancel()
		if err == nil {
			close(e.srcd)
			return
		}
		if errors.Is(err, ErrEdgeShards) { // no retry changes the central server's shard count
			e.log.Error("edge: the central server cannot source this edge", "err", err)
			e.failed <- err
			return
		}
		if ctx.Err() != nil {
			return
		}
		// The leaf connects in the background, so the first attempts at start often find no central
		// API, and the central server being away is what the edge exists for: warn from the third
		// attempt (about a second in), then every 10th.
		if attempt == 3 || attempt%10 == 0 {
			e.log.Warn("edge: central streams do not source this edge yet; retrying", "attempt", attempt, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(bo.NextBackOff()):
		}
	}
}

// declareConsumers creates the edge's streams (the bridge's Ensure does the same; whichever comes
// first) and the durable consumers the central streams source them through. Both are local: they do
// not wait for the central server.
func (e *Edge) declareConsumers(ctx context.Context, local jetstream.JetStream) error {
	if _, err := streams.Ensure(ctx, local, e.scfg, e.log); err != nil {
		return fmt.Errorf("edge streams: %w", err)
	}
	return edgenode.EnsureEdgeSourceConsumers(ctx, local, e.cfg.Domain())
}

func (e *Edge) declareOnce(ctx context.Context, central jetstream.JetStream) error {
	n, err := streams.DiscoverFPMShards(ctx, central)
	if err != nil {
		return err
	}
	if n > 1 || e.scfg.FPMShards > 1 {
		return fmt.Errorf("%w: the central server (domain %s) spreads FPMs over %d shard streams, and a central "+
			"stream sources an edge's FPM whole, so no shard could take only its workers; run the bridge with "+
			"--server (straight to the sharded central server), or the central server with one stream FPM (no --fpm-shards)",
			ErrEdgeShards, e.cfg.CentralDomainOrDefault(), max(n, e.scfg.FPMShards))
	}
	if _, err := streams.Ensure(ctx, central, e.scfg, e.log); err != nil {
		if errors.Is(err, streams.ErrIncompatible) {
			e.log.Error("edge: central stream cannot serve fpmbus", "err", err)
		}
		return err
	}
	res, err := edgenode.AddEdgeSources(ctx, central, e.cfg.Domain())
	if err != nil {
		return err
	}
	e.log.Info("edge: central streams source this edge", "central_domain", e.cfg.CentralDomainOrDefault(),
		"added_to", res.Added)
	if len(res.NotDurable) > 0 {
		e.log.Warn("edge: central streams source this edge without its durable source consumer; left as they are "+
			"(replacing them would store the edge's FPMs twice), but catching up after an outage can wait 30 s and more",
			"streams", res.NotDurable, "consumer", edgenode.EdgeSourceConsumer)
	}
	return nil
}
