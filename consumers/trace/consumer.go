package trace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// errAlreadyRunning is returned by a second call of Consumer.Run.
var errAlreadyRunning = errors.New("trace: writer already running")

// Consumer is the trace writer: a durable.Consumer of stream FPM that turns every message into a
// dynamo.fpm.trace.v1 line in its producer's segments (full mode), or the newest message per key and
// interval into one (sampled mode), and says a message done only once the line holding it (or
// replacing it) is fsynced. Run runs it in a durable.Runner, which owns its partition group
// (Config.Partitions), the acknowledgements, dead letters, retention-loss events and the stop
// sequence; the runner calls Handle, Tick, Assigned, Release, Lost and Close, all from its loop
// goroutine, so none of the state below needs a lock (the flushers' results come back through
// Runner.Do).
//
// Each owned partition has its own writer (writer.go): producers, flusher, sampler and takeover
// recovery. A redelivered message whose line an earlier owner made durable is skipped (seqState); a
// failed write is retried with backoff, without acknowledging, until the disk takes it again; a
// message that can never be written is rejected (dead-lettered) and the others go on.
//
// A Consumer runs once.
type Consumer struct {
	cfg     Config
	js      jetstream.JetStream
	set     settings
	log     *slog.Logger
	metrics *metrics
	group   durable.GroupConfig
	runner  *durable.Runner
	running atomic.Bool
	totals  recoveryTotals
	flushed chan struct{} // a flusher completed a flush: collect it on the loop
	segs    *processSegments

	// deliver presents a runner message to the writer (tests make acknowledgements go missing).
	deliver func(*durable.Msg) delivery
	keys    tracefile.SubjectKeys // loop only

	// Loop only (the runner's goroutine).
	start      time.Time        // lines' timestamps count from the consumer's start, in every partition
	writers    map[int]*writer  // by owned partition
	own        *tracefile.Owner // every writer's prefixes (tracefile/owner.go)
	unrepaired unrepaired       // producers whose repair was refused, every writer's (unrepaired.go)
	repaired   bool             // the whole output was repaired at the first takeover (one partition)
	failed     error            // a flush failed between two calls: returned by the next one
	// unstoredLosses are pruned segments' loss events the server did not store, published again from
	// lossRetryAt on (group.go, retryLosses).
	unstoredLosses []*nats.Msg
	lossRetryAt    time.Time
}

var (
	_ durable.Consumer          = (*Consumer)(nil)
	_ durable.PartitionObserver = (*Consumer)(nil)
)

// New checks cfg and returns a Consumer on js. Nothing is created on the server or on disk until Run.
// Options: durable.WithMemberID, durable.WithClock (the lines' writer-relative "timestamp" and the
// sampled mode's wall-clock fallback).
func New(cfg Config, js jetstream.JetStream, opts ...durable.Option) (*Consumer, error) {
	set, err := prepare(cfg, js, opts)
	if err != nil {
		return nil, err
	}
	if cfg.FPMShards == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		n, err := streams.FPMShardsOf(ctx, js)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("trace: FPM shards: %w", err)
		}
		cfg.FPMShards = n
	}
	cfg.Partitions = cfg.effectivePartitions() // 0: one per shard, known now
	pc, err := cfg.PartitionConfig()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer, cfg.Mode)
	if err != nil {
		return nil, fmt.Errorf("trace: register metrics: %w", err)
	}
	c := &Consumer{
		cfg:     cfg,
		js:      js,
		set:     set,
		log:     set.Logger,
		metrics: m,
		group:   pc,
		flushed: make(chan struct{}, 1),
		segs:    set.segs,
		deliver: func(m *durable.Msg) delivery { return m },
		keys:    tracefile.SubjectKeys{},
		writers: map[int]*writer{},
	}
	if c.segs == nil {
		c.segs = NewProcessSegments()
	}
	rc := cfg.runnerConfig(pc)
	rc.Logger, rc.Registerer = set.Logger, cfg.Registerer // the runner's metrics go where the writer's go
	if c.runner, err = durable.New(rc, js, c, opts...); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return c, nil
}

// Ready is closed once Run has joined the group and is taking partitions. It is never closed if Run
// fails before that; wait for Run's result as well.
func (c *Consumer) Ready() <-chan struct{} { return c.runner.Ready() }

// Owned lists the partitions this instance owns now.
func (c *Consumer) Owned() []int { return c.runner.Owned() }

// Recovery returns what the takeovers found so far (see recoveryResult).
func (c *Consumer) Recovery() recoveryResult { return c.totals.get() }

// Run writes traces as a member of group Config.Group until ctx is done, then stops gracefully: each
// owned partition's pending samples are written, its lines flushed and fsynced, its messages
// acknowledged and its files closed, within StopTimeout per partition; then it is handed to the other
// members. What a stop cuts off stays unacknowledged and goes, at once and in order, to the next owner.
//
// Before joining, Run probes that the output directory is writable (waiting while its disk is full,
// probeOutput) and replaces consumers of the group
// that this configuration cannot use (see replaceIncompatibleConsumers). A failed write is retried
// with backoff (Config.RetryInitial, RetryMax) while nothing more is acknowledged; an error that retrying cannot fix
// (another writer owns a segment, the server is gone) ends Run with that error, the partitions going
// to other members.
// probeOutput probes the output directory (ProbeOutput). While its disk is full it says so and probes
// again with the write retry's backoff, until the probe passes or ctx ends (then nil): a writer started
// on a full disk joins once space returns, as one that meets a full disk later retries its writes
// (writeBatchRetry), instead of failing. Any other failure (a path that cannot be written) is returned.
func (c *Consumer) probeOutput(ctx context.Context) error {
	bo := c.set.retry()
	for waited := false; ; waited = true {
		err := ProbeOutput(c.cfg.OutputPath)
		switch {
		case err == nil:
			if waited {
				c.log.Info("trace output has room again; the writer starts", "output", c.cfg.OutputPath)
			}
			return nil
		case !fsutil.DiskFull(err):
			return err
		case !waited:
			c.log.Error("trace output's disk is full: the writer waits for space before it starts (nothing is read or acknowledged meanwhile)",
				"output", c.cfg.OutputPath, "error", err)
		}
		t := time.NewTimer(bo.NextBackOff())
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errAlreadyRunning
	}
	if err := c.probeOutput(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	c.start = c.set.Clock()
	me := fsutil.Self("trace writer")
	me.Group, me.Member = groupIdentity(c.cfg.Group, c.js), c.set.MemberID
	// The output is one group's (output_group.go): another group's writer is refused here, before it
	// joins, reads or writes anything.
	if err := claimOutput(ctx, c.js, c.cfg.OutputPath, c.cfg.Group, me); err != nil {
		return err
	}
	if err := replaceIncompatibleConsumers(ctx, c.js, c.group, c.log); err != nil {
		return err
	}
	c.own, c.unrepaired = tracefile.NewOwner(me, c.log), unrepaired{}
	defer c.own.ReleaseAll() // what a writer the runner did not end still holds
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() { // hands completed flushes to the runner's loop; owned by Run
		defer close(stopped)
		ready := c.runner.Ready()
		for {
			select {
			case <-ready:
				ready = nil
				c.log.Info("trace writer started", "mode", c.cfg.Mode, "output", c.cfg.OutputPath, "group", c.cfg.Group,
					"partitions", c.cfg.Partitions, "filter", c.cfg.FilterSubject, "cumulative_acks", c.group.CumulativeAcks,
					"retention_loss_events", c.cfg.detectsRetentionLoss())
			case <-c.flushed:
				if !c.runner.Do(c.collectFlushes) {
					return
				}
			case <-stop:
				return
			}
		}
	}()
	err := c.runner.Run(ctx)
	close(stop)
	<-stopped
	return err
}

// groupIdentity names the consumer group in the prefix locks' records: its name on its deployment (the
// cluster's name, or the single server's id), so that a writer of a group of the same name on another
// server, which shares nothing with this one, is never taken for a member (tracefile/owner.go).
func groupIdentity(group string, js jetstream.JetStream) string {
	nc := js.Conn()
	if nc == nil {
		return group
	}
	if cl := nc.ConnectedClusterName(); cl != "" {
		return group + "@" + cl
	}
	return group + "@" + nc.ConnectedServerId()
}

// notifyFlushed is every writer's flusher notification: it never blocks the flusher.
func (c *Consumer) notifyFlushed() {
	select {
	case c.flushed <- struct{}{}:
	default:
	}
}

// collectFlushes completes the flushes that finished (on the loop, through Runner.Do). A failure is
// kept for the next call from the runner, which then ends.
func (c *Consumer) collectFlushes() {
	for p, w := range c.writers {
		if err := w.collect(); err != nil && c.failed == nil {
			c.failed = fmt.Errorf("trace: partition %d: %w", p, err)
		}
	}
}

// Assigned starts a writer for partition p, with a takeover recovery: the consumer was reset to its
// ack floor, so messages whose lines an earlier owner wrote come again and are recognised. With one
// partition this instance owns every producer of the output, and the first takeover also repairs the
// newest segment of each of them (a producer that sends nothing more keeps no torn tail).
func (c *Consumer) Assigned(_ context.Context, p int) error {
	if old := c.writers[p]; old != nil {
		old.abort()
	}
	w := newWriter(c.cfg, c.set, c.log.With("partition", p), c.metrics, c.start, c.notifyFlushed)
	w.own, w.rejectHeld, w.unrepaired = c.own, true, c.unrepaired
	if c.cfg.Partitions == 1 && !c.repaired {
		// Only what this instance owns is repaired: a producer another process holds is its
		// owner's to repair (its messages are rejected until it lets go).
		claimed, refused, err := w.claimOutput()
		for _, r := range refused {
			c.log.Info("trace writer: a producer under the output is owned by another process: not repaired", "err", r)
		}
		for _, prefix := range claimed {
			if err != nil {
				break
			}
			// A repair refused for one producer (something not fpmbus's under its temporary
			// file's name) refuses that producer alone (unrepaired.go).
			if _, rerr := tracefile.RepairPrefixes([]string{prefix}, c.log); rerr != nil && repairRefused(rerr) {
				c.unrepaired.refuse(prefix, rerr, c.log)
			} else {
				err = rerr
			}
		}
		if err != nil {
			w.abort()
			return fmt.Errorf("trace: repair output: %w", err)
		}
		// Owned for the repair only: a producer is owned again at its first message, so the
		// producers of another writer sharing the output directory stay free for it.
		w.releaseClaims()
		c.repaired = true
	}
	w.takeover = newTakeover(w, c.cfg.Partitions, &c.totals)
	w.segs = c.segs
	w.onPrune = func(ps prunedSegment) { c.publishPruned(p, ps) }
	c.writers[p] = w
	return nil
}

// Handle writes a batch of partition messages. An invalid message, or one that can never be written,
// is rejected (dead-lettered with the reason); anything else that fails is a fault of the instance.
func (c *Consumer) Handle(_ context.Context, batch []*durable.Msg) error {
	if c.failed != nil {
		return c.failed
	}
	for _, m := range batch {
		w := c.writers[m.Partition]
		if w == nil {
			return fmt.Errorf("trace: message of partition %d, which was not assigned", m.Partition)
		}
		d := c.deliver(m)
		r, err := parseRecord(d, tracefile.MsgMeta{Seq: m.StreamSeq, Stored: m.Stored}, c.cfg.ProducerID, c.keys)
		if err != nil {
			c.metrics.invalid.Inc()
			d.Reject(fmt.Errorf("fpmbus trace: %w", err))
			continue
		}
		if err := w.handle(&r); err != nil {
			var me *messageError
			if !errors.As(err, &me) {
				return fmt.Errorf("trace: partition %d: %w", m.Partition, err)
			}
			d.Reject(err)
		}
	}
	return nil
}

// Tick runs every FlushInterval: sampled mode writes the samples whose interval is over, and every
// writer hands its buffered lines to its flusher.
func (c *Consumer) Tick(ctx context.Context, _ time.Time) error {
	if c.failed != nil {
		return c.failed
	}
	c.retryLosses(ctx, false)
	c.own.Retry()
	c.unrepaired.retry()
	for p, w := range c.writers {
		if w.sampler != nil {
			if err := w.sampler.emitDue(w, c.set.Clock()); err != nil {
				return fmt.Errorf("trace: partition %d: %w", p, err)
			}
		}
		if err := w.flush(); err != nil {
			return fmt.Errorf("trace: partition %d: %w", p, err)
		}
	}
	return nil
}

// Release hands partition p on gracefully: its pending samples are written, its lines flushed and
// fsynced, its messages done, its files closed, within ctx (the release deadline). A write still
// failing at the deadline is given up: its messages stay unacknowledged for the next owner, and the
// error is returned.
func (c *Consumer) Release(ctx context.Context, p int) error {
	w := c.writers[p]
	if w == nil {
		return nil
	}
	delete(c.writers, p)
	if err := w.finish(ctx.Done()); err != nil {
		return fmt.Errorf("trace: partition %d: %w", p, err)
	}
	return nil
}

// Lost forgets partition p at once: nothing more is written (a write in progress completes first) and
// nothing more is done; another instance may own p already.
func (c *Consumer) Lost(p int) {
	if w := c.writers[p]; w != nil {
		w.abort()
		delete(c.writers, p)
	}
}

// Close runs after every partition was released or lost: nothing is left to write. Loss events the
// server has not stored yet get one more try within ctx.
func (c *Consumer) Close(ctx context.Context) error {
	for p, w := range c.writers {
		w.abort()
		delete(c.writers, p)
	}
	c.retryLosses(ctx, true)
	c.dropUnstoredLosses()
	return nil
}
