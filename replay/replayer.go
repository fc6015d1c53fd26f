package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"
)

// Targets.
const (
	targetZMQ    = "zmq"
	TargetStream = "stream"
)

// Config says where a replay sends: Target targetZMQ (default) with ZMQ, or TargetStream with Stream.
type Config struct {
	Target string
	ZMQ    ZMQConfig
	Stream streamConfig
}

// Option changes a Replayer.
type Option func(*options) error

type options struct {
	logger   *slog.Logger
	progress io.Writer
	every    int
	csv      io.Writer
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", errInvalidConfig)
		}
		o.logger = l
		return nil
	}
}

// WithProgress writes a progress line to w every `every` records (and the warning when the replay
// falls behind its schedule). every must be positive.
func WithProgress(w io.Writer, every int) Option {
	return func(o *options) error {
		if w == nil || every < 1 {
			return fmt.Errorf("%w: progress every %d records: want a writer and at least 1", errInvalidConfig, every)
		}
		o.progress, o.every = w, every
		return nil
	}
}

// WithRecordsCSV writes one CSV row per record sent to w (header producer, dp_rank, pass, index, seq,
// counter_id, scheduled_offset_ms, actual_offset_ms, lateness_ms, outcome). Rows come in the order
// sends are settled; w is flushed when Run returns, never closed.
func WithRecordsCSV(w io.Writer) Option {
	return func(o *options) error {
		if w == nil {
			return fmt.Errorf("%w: nil records CSV writer", errInvalidConfig)
		}
		o.csv = w
		return nil
	}
}

// errAlreadyRun is returned by a second call of Run.
var errAlreadyRun = errors.New("replay: already run")

// replayer replays one Plan into one target. Run owns every socket and goroutine it starts and
// releases them before it returns.
type replayer struct {
	plan   *Plan
	cfg    Config
	opts   options
	target target
	rep    *reporter
	ready  chan struct{}

	mu  sync.Mutex
	ran bool
}

// New checks cfg against the plan (for the ZMQ target: the port layout) and returns the Replayer;
// nothing is bound or connected until Run. Options: WithLogger, WithProgress, WithRecordsCSV.
func New(p *Plan, cfg Config, opts ...Option) (*replayer, error) {
	o := options{logger: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	r := &replayer{plan: p, cfg: cfg, opts: o, ready: make(chan struct{})}
	// The report names each socket's destination as the target describes it, once there is a target.
	r.rep = newReporter(p, r.Endpoint, o.progress, o.every, o.csv)
	var err error
	switch cfg.Target {
	case "", targetZMQ:
		r.cfg.Target = targetZMQ
		var t *zmqTarget
		if t, err = newZMQTarget(cfg.ZMQ, p, r.rep); err == nil {
			r.target = t
		}
	case TargetStream:
		var t *streamTarget
		if t, err = newStreamTarget(cfg.Stream, p, r.rep); err == nil {
			r.target = t
		}
	default:
		err = fmt.Errorf("%w: target %q: want zmq or stream", errInvalidConfig, cfg.Target)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Endpoint names where socket s of the plan sends (its bind endpoint, or its stream subjects).
func (r *replayer) Endpoint(s int) string { return r.target.describe(s) }

// Ready is closed once Run has bound (or connected), waited for subscribers and the start delay: the
// first record goes out right after.
func (r *replayer) Ready() <-chan struct{} { return r.ready }

// Run replays the plan and returns the report. A ctx that ends stops it: Run then closes the target
// (ZMQ: each socket waits at most its linger for queued frames; stream: every outstanding ack is
// awaited) and returns the report of what was sent, marked interrupted, with a nil error: stopping is
// not a failure. An error is returned when the target cannot be opened (a port in use) or the CSV
// cannot be written.
func (r *replayer) Run(ctx context.Context) (*Report, error) {
	r.mu.Lock()
	if r.ran {
		r.mu.Unlock()
		return nil, errAlreadyRun
	}
	r.ran = true
	r.mu.Unlock()

	log := r.opts.logger
	if err := r.target.open(ctx, r.plan); err != nil {
		cerr := r.target.close()
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			r.rep.finish(0, true)
			return r.rep.report(r.cfg.Target), cerr
		}
		return nil, errors.Join(err, cerr)
	}
	for i := range r.plan.Sockets {
		if s := &r.plan.Sockets[i]; s.Active() {
			log.Info("replay socket", "rank", s.Label(), "to", r.target.describe(i), "records", s.Records, "heartbeats", s.Heartbeats)
		}
	}
	pc := &pacer{plan: r.plan, target: r.target, start: time.Now()}
	r.rep.start(pc.start)
	close(r.ready)
	passes, err := pc.run(ctx)
	cerr := r.target.close()
	ferr := r.rep.finish(passes, err != nil)
	rep := r.rep.report(r.cfg.Target)
	for _, rr := range rep.NoSubscriber() {
		log.Error("replay socket had no subscriber: what it sent then was not delivered", "rank", rr.Rank, "endpoint", rr.Endpoint,
			"records", rr.Undelivered, "heartbeats", rr.HeartbeatsUndelivered)
	}
	log.Info("replay finished", "replayed", rep.Overall.Replayed, "undelivered", rep.Overall.Undelivered, "failed", rep.Overall.Failed, "passes", passes,
		"interrupted", err != nil, "lateness_p99_ms", rep.Overall.Lateness.P99Ms)
	return rep, errors.Join(cerr, ferr)
}
