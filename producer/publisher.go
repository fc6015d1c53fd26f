package producer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pebbe/zmq4"

	"github.com/fpmbus/fpmbus/internal/fdbudget"
	"github.com/fpmbus/fpmbus/schemas"
)

// Publisher runs one synthetic Dynamo FPM publisher per DP rank: an Engine feeding a bounded queue, and a
// sender draining it onto the rank's PUB socket exactly as _FpmPublisherThread does.
//
// Invariants, per rank: the sequence is shared by FPMs and heartbeats and starts at 0 per Publisher;
// every sequence number is used once, in order, and a dropped send (EAGAIN) still consumes its number;
// counter_id equals the sequence frame; an empty batch is never published.
type Publisher struct {
	cfg   Config // defaults applied
	log   *slog.Logger
	zctx  *zmq4.Context
	ranks []*rank
	ready chan struct{}

	mu      sync.Mutex
	state   runState
	cancel  context.CancelFunc // set while running
	runDone chan struct{}      // closed when Run has released everything
}

type runState int

const (
	stateNew runState = iota
	stateRunning
	stateDone
)

// rank is one DP rank: its engine, queue, sender and counters.
type rank struct {
	id       int
	workerID string
	engine   *Engine          // owned by the generator goroutine
	sender   *Sender          // owned by the sender goroutine once Run starts it
	queue    chan schemas.FPM // closed by the generator when it stops
	genDone  chan struct{}    // closed when the generator goroutine has returned
	sendDone chan struct{}    // closed when the sender goroutine has returned
	log      *slog.Logger

	generated, sent, heartbeats       atomic.Uint64
	queueDrops, sendDrops, sendErrors atomic.Uint64
	lastSeq                           atomic.Int64
}

// RankStats counts what one rank did. Sent + SendDrops + SendErrors is the number of sequence numbers
// used, so LastSeq == Sent + SendDrops + SendErrors - 1.
type RankStats struct {
	Rank     int
	Endpoint string
	// Generated is the number of FPMs the engine produced (non-empty batches), queued or not.
	Generated uint64
	// Sent is the number of messages libzmq accepted, heartbeats included. (A PUB socket accepts a message
	// even when no subscriber is connected, or when it then drops it for a slow one; see Config.NoDrop.)
	Sent uint64
	// Heartbeats is the number of heartbeats among Sent.
	Heartbeats uint64
	// QueueDrops is the number of FPMs dropped because the rank's queue was full.
	QueueDrops uint64
	// SendDrops is the number of messages libzmq refused with EAGAIN.
	SendDrops uint64
	// SendErrors is the number of messages that failed with any other error (logged, as Dynamo does).
	SendErrors uint64
	// LastSeq is the last sequence number used, or -1 before the first message.
	LastSeq int64
}

// New validates cfg, applies its defaults and binds one PUB socket per rank on
// tcp://<Host>:<BasePort+rank>. A bind failure closes the sockets already bound and returns a *BindError
// naming the endpoint and rank ("bind tcp://127.0.0.1:20381 (dp_rank 1): address already in use").
//
// Call Run to publish; call Close to release the sockets if Run is never called.
func New(cfg Config) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	// libzmq aborts the process when it runs out of descriptors while binding: check first.
	per := DescriptorsPerSocket + max(cfg.WaitSubscribers, 1) // and its subscribers' connections
	if cfg.WaitSubscribers > 0 {
		per = DescriptorsPerSocketCounted + cfg.WaitSubscribers
	}
	if err := fdbudget.Check(fmt.Sprintf("%d PUB sockets (one per rank)", cfg.DPSize), cfg.DPSize*per); err != nil {
		return nil, fmt.Errorf("producer: %w", err)
	}
	zctx, err := zmq4.NewContext()
	if err != nil {
		return nil, fmt.Errorf("producer: new zmq context: %w", err)
	}
	p := &Publisher{cfg: cfg, log: cfg.Logger, zctx: zctx, ready: make(chan struct{})}
	opts := []SenderOption{WithLinger(cfg.Linger), WithNoDrop(cfg.NoDrop)}
	if cfg.WaitSubscribers > 0 {
		opts = append(opts, WithSubscriberCount())
	}
	for i := range cfg.DPSize {
		ep := cfg.Endpoint(i)
		s, err := NewSender(zctx, ep, cfg.SendHWM, opts...)
		if err != nil {
			if be, ok := errors.AsType[*BindError](err); ok {
				be.Rank = i
			}
			p.release()
			return nil, err
		}
		r := &rank{
			id:       i,
			workerID: cfg.WorkerID,
			engine:   NewEngine(cfg.Seed, cfg.WorkerID, i),
			sender:   s,
			queue:    make(chan schemas.FPM, cfg.QueueSize),
			genDone:  make(chan struct{}),
			sendDone: make(chan struct{}),
			log:      p.log.With("dp_rank", i, "endpoint", ep),
		}
		r.lastSeq.Store(-1)
		p.ranks = append(p.ranks, r)
		p.log.Info("FPM publisher bound", "endpoint", ep, "dp_rank", i, "worker_id", cfg.WorkerID)
	}
	return p, nil
}

// Config returns the configuration in use, defaults applied.
func (p *Publisher) Config() Config { return p.cfg }

// Endpoints returns each rank's bind endpoint, indexed by rank.
func (p *Publisher) Endpoints() []string {
	eps := make([]string, len(p.ranks))
	for i, r := range p.ranks {
		eps[i] = r.sender.Endpoint()
	}
	return eps
}

// Ready returns a channel that is closed once Run has waited out StartDelay and started every rank:
// from then on messages may be sent. It is never closed if Run is not called or stops before that.
func (p *Publisher) Ready() <-chan struct{} { return p.ready }

// Run publishes until ctx is done or, with Count set (and IdleAfterCount not), until every rank has
// produced Count FPMs. Either way it then stops the generators, lets each sender flush its queue, closes
// the sockets and terminates the ZMQ context (waiting at most Linger for queued frames) before it returns
// nil: stopping is not an error. Run may be called once; a second call, or a call after Close, returns
// ErrClosed.
func (p *Publisher) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.state != stateNew {
		p.mu.Unlock()
		return ErrClosed
	}
	ctx, cancel := context.WithCancel(ctx)
	p.state, p.cancel, p.runDone = stateRunning, cancel, make(chan struct{})
	p.mu.Unlock()
	defer func() {
		cancel()
		p.mu.Lock()
		p.state = stateDone
		p.mu.Unlock()
		close(p.runDone)
	}()

	if n := p.cfg.WaitSubscribers; n > 0 {
		timeout := p.cfg.WaitTimeout
		if timeout == 0 {
			timeout = 30 * time.Second
		}
		// The rank goroutines, which own the sockets later, have not started. One deadline for all ranks.
		senders, labels := make([]*Sender, len(p.ranks)), make([]string, len(p.ranks))
		for i, r := range p.ranks {
			senders[i], labels[i] = r.sender, fmt.Sprintf("dp_rank %d", r.id)
		}
		if err := AwaitSubscribers(ctx, senders, labels, n, timeout); err != nil {
			p.release()
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	if d := p.cfg.StartDelay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			p.release()
			return nil
		case <-t.C:
		}
	}

	quit := make(chan struct{})
	for _, r := range p.ranks {
		go func() {
			defer close(r.genDone)
			defer close(r.queue)
			r.generate(quit, p.cfg)
		}()
		go func() {
			defer close(r.sendDone)
			defer func() {
				if err := r.sender.Close(); err != nil {
					r.log.Warn("close FPM publisher socket", "err", err)
				}
			}()
			r.send(p.cfg.HeartbeatInterval, p.cfg.OnSent)
		}()
	}
	close(p.ready)

	// Wait for every sender to finish on its own (Count reached) or for ctx.
wait:
	for _, r := range p.ranks {
		select {
		case <-r.sendDone:
		case <-ctx.Done():
			break wait
		}
	}
	close(quit)
	for _, r := range p.ranks {
		<-r.genDone
		<-r.sendDone
	}
	if err := p.zctx.Term(); err != nil {
		p.log.Warn("terminate zmq context", "err", err)
	}
	for _, st := range p.Stats() {
		p.log.Info("FPM publisher stopped", "dp_rank", st.Rank, "sent", st.Sent, "heartbeats", st.Heartbeats,
			"queue_drops", st.QueueDrops, "send_drops", st.SendDrops, "send_errors", st.SendErrors,
			"last_seq", st.LastSeq)
	}
	return nil
}

// Close stops Run if it is running and waits for it to return; if Run was never called it closes the
// sockets and the ZMQ context. Close is idempotent and safe to call from any goroutine.
func (p *Publisher) Close() error {
	p.mu.Lock()
	switch p.state {
	case stateNew:
		p.state = stateDone
		p.mu.Unlock()
		return p.release()
	case stateRunning:
		cancel, done := p.cancel, p.runDone
		p.mu.Unlock()
		cancel()
		<-done
		return nil
	}
	p.mu.Unlock()
	return nil
}

// release closes every socket and terminates the context; only for sockets no goroutine owns.
func (p *Publisher) release() error {
	var err error
	for _, r := range p.ranks {
		err = errors.Join(err, r.sender.Close())
	}
	return errors.Join(err, p.zctx.Term())
}

// Stats returns a snapshot of every rank's counters, indexed by rank. Safe to call at any time.
func (p *Publisher) Stats() []RankStats {
	out := make([]RankStats, len(p.ranks))
	for i, r := range p.ranks {
		out[i] = RankStats{
			Rank:       r.id,
			Endpoint:   p.cfg.Endpoint(r.id),
			Generated:  r.generated.Load(),
			Sent:       r.sent.Load(),
			Heartbeats: r.heartbeats.Load(),
			QueueDrops: r.queueDrops.Load(),
			SendDrops:  r.sendDrops.Load(),
			SendErrors: r.sendErrors.Load(),
			LastSeq:    r.lastSeq.Load(),
		}
	}
	return out
}

// generate is the rank's "engine" goroutine: one simulated forward pass per tick (or back to back when
// Rate <= 0), each non-empty one offered to the queue without blocking. It returns when quit is closed,
// or after Count FPMs unless IdleAfterCount holds it until quit.
func (r *rank) generate(quit <-chan struct{}, cfg Config) {
	var tick <-chan time.Time
	if cfg.Rate > 0 {
		if d := time.Duration(float64(time.Second) / cfg.Rate); d > 0 {
			t := time.NewTicker(d)
			defer t.Stop()
			tick = t.C
		}
	}
	produced := 0
	for {
		if tick != nil {
			select {
			case <-quit:
				return
			case <-tick:
			}
		} else {
			select {
			case <-quit:
				return
			default:
			}
		}
		f, ok := r.engine.Step()
		if !ok {
			continue // empty batch: Dynamo skips it
		}
		r.generated.Add(1)
		select {
		case r.queue <- f:
		default:
			r.queueDrops.Add(1) // queue.Full: dropped silently
		}
		produced++
		if cfg.Count > 0 && produced >= cfg.Count {
			if cfg.IdleAfterCount {
				<-quit
			}
			return
		}
	}
}

// send is the rank's sender goroutine, _FpmPublisherThread._run: it publishes queued FPMs and, after hb
// without a successful publish, a heartbeat; onSent (may be nil) hears of each accepted send. It
// returns once the queue is closed and drained.
func (r *rank) send(hb time.Duration, onSent func(int, uint64, bool, []byte)) {
	var (
		seq         uint64
		buf         = make([]byte, 0, 512)
		lastPublish = time.Now()
		timer       = time.NewTimer(hb)
	)
	defer timer.Stop()
	publish := func(f *schemas.FPM, heartbeat bool) {
		s := seq
		seq++
		f.CounterID = int64(s)
		buf = schemas.AppendMsgpack(buf[:0], f)
		err := r.sender.Send(s, buf)
		r.lastSeq.Store(int64(s))
		switch {
		case err == nil:
			r.sent.Add(1)
			if heartbeat {
				r.heartbeats.Add(1)
			}
			lastPublish = time.Now()
			if onSent != nil {
				onSent(r.id, s, heartbeat, buf)
			}
		case errors.Is(err, ErrDropped):
			r.sendDrops.Add(1) // zmq.Again: dropped
		default:
			if r.sendErrors.Add(1) == 1 {
				r.log.Warn("FPM publisher send failed", "seq", s, "err", err)
			}
		}
	}
	for {
		select {
		case f, ok := <-r.queue:
			if !ok {
				return
			}
			publish(&f, false)
		case <-timer.C:
			if time.Since(lastPublish) >= hb {
				h := Heartbeat(r.workerID, r.id, 0)
				publish(&h, true)
			}
		}
		timer.Reset(hb)
	}
}
