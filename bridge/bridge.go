package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	zmq "github.com/pebbe/zmq4"

	"github.com/fpmbus/fpmbus/internal/fdbudget"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

var (
	// errAlreadyRunning is returned by a second call of Run.
	errAlreadyRunning = errors.New("bridge: already running")
	// errConnClosed stops a bridge whose NATS connection was closed under it.
	errConnClosed = fmt.Errorf("bridge: publish: %w", nats.ErrConnectionClosed)
)

// applyAttemptTimeout bounds one attempt to apply the streams at start.
const applyAttemptTimeout = 10 * time.Second

// Bridge subscribes to Dynamo's FPM publishers over ZMQ and publishes every FPM to JetStream. Create
// it with New, start it with Run; Ready and Stats may be called from any goroutine.
type Bridge struct {
	cfg       Config
	nc        *nats.Conn
	js        jetstream.JetStream
	log       *slog.Logger
	opts      options
	endpoints []Endpoint
	ranks     []*rankCounters // one per endpoint, same index
	metrics   *metrics
	buf       *buffer
	epochs    *epochs
	pub       *publisher
	// spooled are the marker items loaded from the marker spool not yet acknowledged (markerspool.go).
	spooled map[*item]bool
	// acks is the ack records bucket (nil when it could not be opened: no lost_after_ack checks);
	// ckpt writes the publisher's records to it. Both are set by Run before the publisher starts.
	acks jetstream.KeyValue
	ckpt *checkpointer
	// runsKV is the agreed runs bucket (nil when it could not be opened: local epochs, runs.go), set by
	// Run before the publisher starts; startMs is when Run started (Unix ms, the bridge's clock).
	runsKV  jetstream.KeyValue
	startMs int64
	// readyMs is when Run was ready to publish (streams applied, buckets opened; the bridge's clock),
	// set before the publisher starts: a run received while the bridge was starting has its evidence
	// waits counted from it (runs.go).
	readyMs int64
	// runsUnanswered: a run's agreement was held for runHold while the bucket did not answer and then
	// given up; later runs take their local epoch at once until the bucket answers again (runs.go).
	// Publisher goroutine.
	runsUnanswered bool
	// runsBackAt is when the bucket first answered a run held while it did not (the bridge's clock):
	// the evidence waits of the runs held in that outage count from it (runs.go). Publisher goroutine.
	runsBackAt time.Time
	// runsReopen: the agreed runs bucket did not answer when Run opened it (a server restarting, a
	// full disk), or Run was stopped before it opened it; the publisher goroutine opens it at the next
	// run to agree, which waits for it like for a bucket that does not answer (runs.go). Publisher
	// goroutine once it runs.
	runsReopen bool
	// fpmShards is the server's FPM shard count (shards.go), set by Run before the publisher starts.
	fpmShards int

	lineReserve int // bytes of an HPUB line besides the subject (see limits.go)
	keyRoom     int // keyRoomFor(Namespace, Component)

	deadLetterN atomic.Uint64
	rankWarned  []atomic.Bool     // per endpoint: logged a payload dp_rank that differs from the endpoint's
	decoders    []schemas.Decoder // per endpoint, owned by that endpoint's reader goroutine
	ready       chan struct{}
	started     atomic.Bool

	// sessions holds, per endpoint, the connection its reader delivers messages from now (a number
	// from sessionSeq, new at every connect: socket.go), so epochs can tell a reconnect.
	sessions   []atomic.Uint64
	sessionSeq atomic.Uint64
}

// New returns a bridge for cfg that publishes over nc. nc belongs to the caller, who creates it with
// natsconn.Connect (infinite reconnects and no reconnect buffer, so publishes fail fast while the broker
// is away and the bridge's own buffer, with exact drop accounting, takes over) and closes it after Run
// has returned; the bridge never closes or drains it. New registers the bridge's metrics on
// cfg.Registerer when it is set. Options (for tests): withClock, withProcPath.
func New(cfg Config, nc *nats.Conn, opts ...option) (*Bridge, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil NATS connection", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	b := &Bridge{
		cfg:         cfg,
		nc:          nc,
		log:         cfg.Logger.With("component", "bridge", "bridge_id", cfg.BridgeID),
		endpoints:   append([]Endpoint(nil), cfg.Endpoints...),
		buf:         newBuffer(cfg.MaxBuffer, cfg.MaxBufferBytes),
		epochs:      newEpochs(),
		ready:       make(chan struct{}),
		rankWarned:  make([]atomic.Bool, len(cfg.Endpoints)),
		sessions:    make([]atomic.Uint64, len(cfg.Endpoints)),
		decoders:    make([]schemas.Decoder, len(cfg.Endpoints)),
		lineReserve: lineReserve(nc),
		keyRoom:     keyRoomFor(cfg.Namespace, cfg.Component),
	}
	for _, o := range opts {
		o(&b.opts)
	}
	b.pub = newPublisher(b)
	b.metrics = newMetrics(
		func() float64 { return float64(b.buf.len()) },
		func() float64 { return float64(b.buf.high.Load()) },
		func() float64 { return float64(b.pub.inFlight.Load()) },
	)
	for _, ep := range b.endpoints {
		b.ranks = append(b.ranks, &rankCounters{m: b.metrics.forRank(ep.DPRank)})
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncAckHandler(b.pub.onAck),
		jetstream.WithPublishAsyncErrHandler(b.pub.onErr),
		jetstream.WithPublishAsyncMaxPending(cfg.MaxInFlight),
		jetstream.WithPublishAsyncTimeout(cfg.AckTimeout),
	)
	if err != nil {
		return nil, fmt.Errorf("bridge: jetstream: %w", err)
	}
	b.js, b.pub.js = js, js
	b.pub.refreshServerMax()
	if cfg.Registerer != nil {
		if err := b.metrics.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("bridge: register metrics: %w", err)
		}
	}
	return b, nil
}

// Ready is closed once every ZMQ socket is connected and the streams are applied. ZMQ connects in the
// background, so Ready does not mean a publisher is up: messages flow as soon as one is.
func (b *Bridge) Ready() <-chan struct{} { return b.ready }

// Stats returns a snapshot of the counters.
func (b *Bridge) Stats() stats {
	s := stats{
		Ranks:            make(map[int]RankStats, len(b.ranks)),
		Buffered:         b.buf.len(),
		BufferedHigh:     int(b.buf.high.Load()),
		InFlight:         int(b.pub.inFlight.Load()),
		MarkersPublished: b.pub.markersPub.Load(),
	}
	for i, rc := range b.ranks {
		s.Ranks[b.endpoints[i].DPRank] = rc.snapshot()
	}
	return s
}

// Run reads every endpoint and publishes until ctx is cancelled, then stops gracefully and returns nil:
//
//  1. stop reading ZMQ (each reader closes its socket; the ZMQ context is terminated);
//  2. publish what is buffered, in order, and wait for the acks, for at most Config.StopTimeout;
//  3. report anything still unacknowledged as dropped with reason "shutdown", and publish drop markers
//     for it if the broker is reachable.
//
// Run returns an error if a socket cannot be set up, if the server refuses the stream configuration,
// or if the NATS connection is closed under it (after the same accounting). Run may be called once.
func (b *Bridge) Run(ctx context.Context) error {
	if !b.started.CompareAndSwap(false, true) {
		return errAlreadyRunning
	}
	b.startMs = b.now().UnixMilli()
	if b.cfg.BasePort > 0 {
		if w := checkEphemeralPorts(b.cfg.BasePort, b.cfg.DPSize, b.opts.procPath); w != "" {
			b.log.Warn(w)
		}
	}
	// libzmq fails badly when it runs out of descriptors: check the budget before the first socket.
	if err := fdbudget.Check(fmt.Sprintf("%d SUB sockets (one per endpoint)", len(b.endpoints)), len(b.endpoints)*DescriptorsPerEndpoint); err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		return fmt.Errorf("bridge: zmq context: %w", err)
	}
	var readers []*reader
	stopReaders := func() {
		for _, r := range readers {
			r.stop()
		}
		b.epochs.stopReading()
		if err := zctx.Term(); err != nil {
			b.log.Warn("zmq context term", "error", err)
		}
	}
	for i := range b.endpoints {
		r, err := b.startReader(zctx, i)
		if err != nil {
			stopReaders()
			return err
		}
		readers = append(readers, r)
	}

	if err := b.applyStreams(ctx); err != nil {
		stopReaders()
		b.pub.finish()
		return err
	}
	if ctx.Err() == nil {
		b.startAckRecords(ctx)
	}
	b.openRunBucket(ctx) // also when stopped meanwhile: the stop then opens it (runs.go)
	b.readyMs = b.now().UnixMilli()
	if ctx.Err() == nil {
		close(b.ready)
		urls := make([]string, len(b.endpoints))
		for i, ep := range b.endpoints {
			urls[i] = ep.URL
		}
		b.log.Debug("bridge ready", "endpoints", urls)
	}

	b.pub.markers = append(b.loadMarkerSpool(), b.pub.markers...) // an earlier run's unstored markers first
	drain := make(chan struct{})
	pubDone := make(chan struct{})
	var deadline time.Time
	go b.pub.run(drain, &deadline, pubDone)

	select {
	case <-ctx.Done():
	case <-pubDone:
	}
	stopReaders()
	select {
	case <-pubDone: // the publisher stopped by itself: the connection is closed
		b.pub.finish()
	default:
		deadline = time.Now().Add(b.cfg.StopTimeout)
		close(drain)
		<-pubDone
	}
	b.pub.stopBatches()
	if b.ckpt != nil {
		b.ckpt.stop(b.pub.ledger)
	}
	b.writeMarkerSpool(b.pub.unstored)
	t := b.Stats().Total()
	b.log.Info("bridge stopped", "received", t.Received, "published", t.Published, "invalid", t.Invalid,
		"dead_lettered", t.DeadLettered, "dropped", t.Dropped, "duplicates", t.Duplicates, "seq_mismatches", t.SeqMismatches)
	if b.pub.fatal != nil {
		return b.pub.fatal
	}
	return nil
}

// startAckRecords opens the ack records bucket, checks every record in it against the FPM stream
// (lostcheck.go) and starts writing this bridge's records. Before the publisher runs, so nothing new on
// a key's subject hides a loss. Without the bucket the bridge runs on, unable to notice FPMs the
// server loses after acknowledging them, and says so.
func (b *Bridge) startAckRecords(ctx context.Context) {
	kv, err := b.openAckBucket(ctx)
	if err != nil {
		if ctx.Err() == nil {
			b.log.Error("ack records unavailable: acknowledged FPMs the server loses will not be reported (lost_after_ack)",
				"bucket", streams.BucketBridgeAcks, "error", err)
		}
		return
	}
	b.acks = kv
	n, err := b.checkAtStart(ctx)
	switch {
	case err != nil && ctx.Err() == nil:
		b.log.Error("lost_after_ack check at start incomplete; the records not checked are checked at the next start",
			"lost_reported", n, "error", err)
	case n > 0:
		b.log.Error("lost_after_ack check at start: acknowledged FPMs are gone from the stream", "lost", n)
	default:
		b.log.Debug("lost_after_ack check at start: every acknowledged FPM recorded is still stored")
	}
	b.pub.reconnects = b.nc.Stats().Reconnects
	b.ckpt = startCheckpointer(b, kv)
}

// applyStreams ensures the streams exist (streams.Ensure: created from cfg.Streams when missing, used
// as they are otherwise), retrying while the broker is unreachable; it gives up only when ctx ends
// (returning nil: the stop path takes over), when the server refuses the configuration, or when an
// existing stream cannot serve the bridge.
func (b *Bridge) applyStreams(ctx context.Context) error {
	bo := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second),
		backoff.WithMaxElapsedTime(0),
	)
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, applyAttemptTimeout)
		r, err := streams.Ensure(actx, b.js, b.cfg.Streams, b.log)
		cancel()
		if err == nil {
			b.fpmShards = max(r.FPMShards, 1)
			b.pub.startBatches(r.Atomic)
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) || errors.Is(err, streams.ErrIncompatible) || errors.Is(err, streams.ErrShardMismatch) {
			return fmt.Errorf("bridge: %w", err)
		}
		b.log.Warn("cannot apply streams yet; retrying (ZMQ input is buffered meanwhile)", "attempt", attempt, "error", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(bo.NextBackOff()):
		}
	}
}

// receive turns one multipart from endpoint slot into the item to enqueue, on that endpoint's reader
// goroutine. frames may be reused once it returns: the item keeps no reference to them.
func (b *Bridge) receive(slot int, frames [][]byte) *item {
	mono := time.Now()
	recv := mono
	if b.opts.now != nil {
		recv = b.opts.now()
	}
	b.ranks[slot].countReceived()
	it := b.process(slot, frames, recv, mono)
	if it.kind == kindFPM && it.key.DPRank != b.endpoints[slot].DPRank && b.rankWarned[slot].CompareAndSwap(false, true) {
		b.log.Warn("payload dp_rank differs from the endpoint's rank; the subject uses the payload's",
			"endpoint", b.endpoints[slot].URL, "endpoint_rank", b.endpoints[slot].DPRank, "payload_dp_rank", it.key.DPRank)
	}
	return it
}

// enqueue pushes the items of endpoint slot without blocking and counts the ones the full buffer
// dropped. It returns rejected (reused as scratch space) for the next call.
func (b *Bridge) enqueue(slot int, its []*item, rejected []*item) []*item {
	rejected = b.buf.pushBatch(its, rejected)
	rc := b.ranks[slot]
	for _, it := range rejected {
		switch it.kind {
		case kindFPM:
			rc.countDropped(reasonBufferFull)
		case kindDeadLetter:
			rc.countDeadLetterLost(reasonBufferFull)
			b.log.Error("dead letter lost: buffer full", "endpoint", b.endpoints[slot].URL, "error", it.msg.Header.Get(streams.HeaderError))
		}
	}
	clear(rejected)
	return rejected[:0]
}
