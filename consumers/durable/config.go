package durable

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/streams"
)

// Defaults of Config.
const (
	// defaultMaxDeliveries bounds how often one message may be delivered before it is dead-lettered.
	// A message that crashed or stalled this many instances in a row will crash the next one too.
	defaultMaxDeliveries = 5
	// DefaultStopTimeout bounds a graceful stop: release every partition, then Close.
	DefaultStopTimeout = 30 * time.Second
	// DefaultBatch is the most messages of one partition handed to Handle at once.
	DefaultBatch = 256
	// holdingMaxDeliveries is the crash-loop bound of a stage that holds messages until something else
	// arrives (the merger a run's other ranks, the sealer a run's collection profile). A held message
	// keeps its partition's ack floor where it is, so every takeover of the partition meanwhile (a
	// rebalance, a stop) counts as a session without progress; the bound leaves room for several.
	holdingMaxDeliveries = 10
)

// errInvalidConfig wraps every configuration error.
var errInvalidConfig = errors.New("durable: invalid configuration")

// errAlreadyRunning is returned by a second Run of the same Runner.
var errAlreadyRunning = errors.New("durable: runner already running")

// Config is what a runner needs beyond its Consumer.
type Config struct {
	// Name names the consumer in metrics (label consumer), dead letters and loss events, e.g.
	// "trace". Letters, digits, '-' and '_'.
	Name string
	// Group is the partition group the runner is a member of: stream, group name, partitions,
	// filters and the consumer settings of every partition (AckWait, CumulativeAcks, ...). Partitions
	// 0: one per shard of the stream, resolved by New.
	Group GroupConfig
	// TickInterval is how often Consumer.Tick runs (0: never).
	TickInterval time.Duration
	// MaxDeliveries: a message delivered more often is dead-lettered instead of handled
	// [defaultMaxDeliveries]. At least 1.
	MaxDeliveries int
	// StopTimeout bounds the graceful stop [DefaultStopTimeout].
	StopTimeout time.Duration
	// Batch is the most messages handed to Handle at once [DefaultBatch].
	Batch int
	// DetectRetentionLoss makes the runner report messages the stream removed before they were read.
	// It needs a group that reads every subject of its stream itself (Partitions 1, filters covering
	// the stream; or one partition per shard reading its shard directly, each partition then checked
	// against its shard): only then is every skipped stream sequence a lost message. Either ack policy works:
	// a session starts with a reset to the ack floor, after which the server delivers every stored
	// message above it in order, acknowledged out of order before or not.
	DetectRetentionLoss bool
	// Logger receives the runner's logs, labelled consumer=Name [slog.Default()].
	Logger *slog.Logger
	// Registerer receives the runner's metrics (fpmbus_consumer_*{consumer=Name}) [nil: none].
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() Config {
	c.MaxDeliveries = cmp.Or(c.MaxDeliveries, defaultMaxDeliveries)
	c.StopTimeout = cmp.Or(c.StopTimeout, DefaultStopTimeout)
	c.Batch = cmp.Or(c.Batch, DefaultBatch)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first setting that cannot work.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := invalid.Reporter(errInvalidConfig)
	if !streams.ValidName(c.Name, maxGroupNameLen) {
		return bad("name %q: want 1-64 letters, digits, '-' and '_'", c.Name)
	}
	if err := c.Group.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errInvalidConfig, err)
	}
	switch {
	case c.TickInterval < 0:
		return bad("tick interval %v: want >= 0", c.TickInterval)
	case c.MaxDeliveries < 1:
		return bad("max deliveries %d: want at least 1", c.MaxDeliveries)
	case c.StopTimeout <= 0:
		return bad("stop timeout %v: want > 0", c.StopTimeout)
	case c.Batch < 1:
		return bad("batch %d: want at least 1", c.Batch)
	case c.DetectRetentionLoss && c.Group.Partitions > 1 && !c.Group.ReadsShardsDirectly():
		return bad("retention-loss detection needs one partition, or one partition per shard reading it directly (partitions %d): a partition reads a share of the stream",
			c.Group.Partitions)
	}
	return nil
}
