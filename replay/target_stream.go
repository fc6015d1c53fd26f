package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// The stream target: the replay publishes straight onto stream FPM, as a bridge would have published
// what it received from the replayed sockets, under another namespace so that the replay never mixes
// with live data: subject fpm.<namespace>.<component>.<worker_id>.<dp_rank>, the canonical JSON body
// (the payload decoded by schemas, exactly as the bridge does), and the bridge's headers
// (streams.FPMMessage). The receive time (Fpm-Received-At-Ms, a trace line's observed_at_unix_ms) is
// the send time; the publisher run (Fpm-Epoch) is the socket's first send of this replay, so message
// ids never collide with an earlier replay's. With FPM shards (streams.DiscoverFPMShards) each key is
// published to its shard's ingest subject, fpmin.<shard>.<namespace>.<component>.<worker_id>.<dp_rank>,
// as the bridge publishes it, and stored in that shard under the same fpm. subject.

// defaultNamespace is the namespace a stream replay publishes under unless told otherwise.
const defaultNamespace = "replay"

// defaultMaxInFlight bounds the publishes awaiting their ack.
const defaultMaxInFlight = 1024

// streamConfig configures the stream target.
type streamConfig struct {
	// Conn is the NATS connection to publish on (the caller's: never closed here).
	Conn *nats.Conn
	// Namespace replaces the recorded namespace (default defaultNamespace). Component replaces the
	// recorded component when set.
	Namespace, Component string
	// BridgeID is the Fpm-Bridge header (default "replay-<host>-<pid>").
	BridgeID string
	// MaxInFlight bounds the publishes awaiting an ack (default defaultMaxInFlight); at the bound the
	// pacer waits, and the lateness report shows it.
	MaxInFlight int
	// AckTimeout bounds the wait for one publish's ack (default 10 s); a publish without one fails.
	AckTimeout time.Duration
	// FPMShards is the server's FPM shard count (1: the single stream FPM; 0: read from the server
	// when the replay starts).
	FPMShards int
}

func (c streamConfig) withDefaults() streamConfig {
	if c.Namespace == "" {
		c.Namespace = defaultNamespace
	}
	if c.BridgeID == "" {
		host, _ := os.Hostname()
		c.BridgeID = "replay-" + host + "-" + strconv.Itoa(os.Getpid())
	}
	c.MaxInFlight = cmp.Or(c.MaxInFlight, defaultMaxInFlight)
	c.AckTimeout = cmp.Or(c.AckTimeout, 10*time.Second)
	return c
}

func (c streamConfig) validate() error {
	bad := invalid.Reporter(errInvalidConfig)
	switch {
	case strings.TrimSpace(c.Namespace) == "":
		return bad("namespace must not be blank")
	case c.MaxInFlight < 1:
		return bad("max in flight %d: want >= 1", c.MaxInFlight)
	case c.AckTimeout < 0:
		return bad("ack timeout %v: want > 0", c.AckTimeout)
	case c.FPMShards < 0 || c.FPMShards > streams.MaxFPMShards:
		return bad("FPM shards %d: want 1 to %d (0: the server's)", c.FPMShards, streams.MaxFPMShards)
	}
	return nil
}

// inflight is one publish awaiting its ack, with the event it settles.
type inflight struct {
	fut jetstream.PubAckFuture
	ev  event // zero socket and ok=false for a heartbeat
	hb  bool
	s   int
	err error // a publish refused at once
}

// streamTarget publishes on the pacer's goroutine and settles acks on its collector goroutine, which
// it owns (started by open, stopped by close).
type streamTarget struct {
	cfg     streamConfig
	plan    *Plan
	rep     *reporter
	js      jetstream.JetStream
	dec     schemas.Decoder
	epochs  []int64
	pending chan inflight
	done    chan struct{}
}

func newStreamTarget(cfg streamConfig, p *Plan, rep *reporter) (*streamTarget, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &streamTarget{cfg: cfg, plan: p, rep: rep, epochs: make([]int64, len(p.Sockets))}, nil
}

func (t *streamTarget) describe(s int) string {
	so := &t.plan.Sockets[s]
	comp := so.Component
	if t.cfg.Component != "" {
		comp = t.cfg.Component
	}
	worker := "*"
	if so.Active() {
		worker = streams.EncodeToken(so.WorkerID)
	}
	return streams.FPMRoot + "." + streams.EncodeToken(t.cfg.Namespace) + "." + streams.EncodeToken(comp) + "." + worker + "." + strconv.FormatInt(so.DPRank, 10)
}

func (t *streamTarget) open(ctx context.Context, _ *Plan) error {
	if t.cfg.Conn == nil {
		return fmt.Errorf("%w: stream target: no NATS connection", errInvalidConfig)
	}
	js, err := jetstream.New(t.cfg.Conn,
		jetstream.WithPublishAsyncMaxPending(2*t.cfg.MaxInFlight),
		jetstream.WithPublishAsyncTimeout(t.cfg.AckTimeout))
	if err != nil {
		return fmt.Errorf("replay: jetstream: %w", err)
	}
	if t.cfg.FPMShards == 0 {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		t.cfg.FPMShards, err = streams.FPMShardsOf(dctx, js)
		cancel()
		if err != nil {
			return fmt.Errorf("replay: stream target: FPM shards: %w", err)
		}
	}
	t.js = js
	t.pending = make(chan inflight, t.cfg.MaxInFlight)
	t.done = make(chan struct{})
	go t.collect()
	return nil
}

// collect settles publishes in the order they were made.
func (t *streamTarget) collect() {
	defer close(t.done)
	for in := range t.pending {
		err := in.err
		if err == nil {
			select {
			case <-in.fut.Ok():
			case err = <-in.fut.Err():
			}
		}
		if in.hb {
			t.rep.heartbeat(in.s, false, err)
			continue
		}
		in.ev.err = err
		t.rep.record(&in.ev)
	}
}

// message builds the stream message of payload sent on socket s with sequence seq.
func (t *streamTarget) message(s int, seq uint64, payload []byte) (*nats.Msg, error) {
	var f schemas.FPM
	if err := t.dec.DecodeFPM(payload, &f); err != nil {
		return nil, fmt.Errorf("decode the payload: %w", err) // cannot happen: every payload was checked
	}
	so := &t.plan.Sockets[s]
	now := time.Now().UnixMilli()
	if t.epochs[s] == 0 {
		t.epochs[s] = now
	}
	comp := so.Component
	if t.cfg.Component != "" {
		comp = t.cfg.Component
	}
	producer := so.Producer
	if nw, ok := t.plan.Config.MapWorker[producer]; ok {
		producer = nw // a producer filed under its worker id follows the worker map
	}
	m := streams.FPMMessage{
		Key:          streams.Key{Namespace: t.cfg.Namespace, Component: comp, WorkerID: f.WorkerID, DPRank: int(f.DPRank)},
		Body:         append([]byte(nil), f.JSON...),
		Seq:          seq,
		CounterID:    f.CounterID,
		EpochMs:      t.epochs[s],
		ReceivedAtMs: now,
		Producer:     producer,
		Endpoint:     "replay:" + so.Label(),
		Bridge:       t.cfg.BridgeID,
	}
	msg := m.Msg()
	msg.Subject = streams.FPMPublishSubject(m.Key, t.cfg.FPMShards) // the key's shard, as the bridge publishes
	return msg, nil
}

func (t *streamTarget) publish(ctx context.Context, in inflight, payload []byte) bool {
	msg, err := t.message(in.s, in.ev.seq, payload)
	if err == nil {
		in.fut, err = t.js.PublishMsgAsync(msg)
		for errors.Is(err, jetstream.ErrTooManyStalledMsgs) && ctx.Err() == nil {
			in.fut, err = t.js.PublishMsgAsync(msg)
		}
	}
	in.err = err
	select {
	case t.pending <- in: // blocks at MaxInFlight: the pacer waits for acks
	case <-ctx.Done():
		if in.err == nil {
			in.err = ctx.Err()
		}
		t.pending <- in // the collector keeps reading until close
	}
	return err == nil
}

func (t *streamTarget) send(ctx context.Context, ev *event, payload []byte) bool {
	return t.publish(ctx, inflight{ev: *ev, s: int(ev.socket)}, payload)
}

func (t *streamTarget) heartbeat(ctx context.Context, s int, seq uint64, payload []byte) bool {
	return t.publish(ctx, inflight{hb: true, s: s, ev: event{seq: seq}}, payload)
}

// close waits for every outstanding ack (each bounded by AckTimeout) and stops the collector.
func (t *streamTarget) close() error {
	if t.pending == nil {
		return nil
	}
	close(t.pending)
	<-t.done
	return nil
}
