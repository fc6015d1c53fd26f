package durable

import (
	"cmp"
	"fmt"
	"time"
)

// Defaults of HoldingConfig.
const (
	// DefaultHoldingPartitions: one active instance, the others hot standbys.
	DefaultHoldingPartitions = 1
	// DefaultHoldingAckWait is the ack wait of a holding stage's partition consumers. Held messages
	// are kept alive with in-progress acks, so it bounds only how long a message a crashed instance
	// held waits before it is delivered again.
	DefaultHoldingAckWait = 2 * time.Minute
)

// HoldingConfig is the partition group of a stage that holds FPM_BENCH messages until something else
// arrives (the merger holds a run's ranks until every rank is there, the sealer a merged artefact
// until its run's collection profile is): the settings both stages take the same way, embedded in
// their configurations. A run is the key: every message of one run goes to one partition and one
// owner. Zero values take the defaults noted.
type HoldingConfig struct {
	// MaxDeliveries bounds how often one message is delivered, and how often its partition is taken
	// over after a crash without progress, before it is dead-lettered [holdingMaxDeliveries].
	MaxDeliveries int
	// Durable names the stage's group [the stage's DefaultDurable]: every instance with the same name
	// shares the runs. With Partitions 1 it is the durable consumer on FPM_BENCH; with N > 1 the
	// consumers are <Durable>-<p> on the partition stream FPM_BENCH_PART_<Durable>.
	Durable string
	// Partitions of the runs, keyed by the run [DefaultHoldingPartitions]: 1 = one active instance,
	// the other instances hot standbys; N > 1 = the runs spread over the instances. Fixed for the
	// group's life.
	Partitions int
	// PinnedTTL is how long a crashed instance keeps its partitions before another one takes them
	// over [DefaultPinnedTTL]; MinPinnedTTL to MaxPinnedTTL.
	PinnedTTL time.Duration
	// AckWait of the partition consumers [DefaultHoldingAckWait]; the runner keeps held messages alive
	// with in-progress acks.
	AckWait time.Duration
	// StopTimeout bounds a graceful stop [DefaultStopTimeout].
	StopTimeout time.Duration
}

// Fill sets the settings left zero to their defaults (group, the stage's default group name) and
// reports the first that cannot work, wrapped in sentinel (the stage's errInvalidConfig). The pinned
// TTL is checked with the group, when the stage's Runner is built.
func (h *HoldingConfig) Fill(group string, sentinel error) error {
	h.Durable = cmp.Or(h.Durable, group)
	h.Partitions = cmp.Or(h.Partitions, DefaultHoldingPartitions)
	h.PinnedTTL = cmp.Or(h.PinnedTTL, DefaultPinnedTTL)
	h.AckWait = cmp.Or(h.AckWait, DefaultHoldingAckWait)
	h.StopTimeout = cmp.Or(h.StopTimeout, DefaultStopTimeout)
	switch {
	case h.Partitions < 1 || h.Partitions > MaxPartitions:
		return fmt.Errorf("%w: partitions %d: want 1 to %d", sentinel, h.Partitions, MaxPartitions)
	case h.AckWait < time.Second:
		return fmt.Errorf("%w: ack wait %v must be at least 1s", sentinel, h.AckWait)
	case h.StopTimeout < 0:
		return fmt.Errorf("%w: stop timeout %v must be positive", sentinel, h.StopTimeout)
	}
	return nil
}

// Group is the stage's partition group: FPM_BENCH's subjects keyed by the run (benchGroup), with
// these settings and the stage's bound on held and in-flight messages per partition (maxAckPending)
// and pull size (batch).
func (h HoldingConfig) Group(maxAckPending, batch int, subjects ...string) GroupConfig {
	g := benchGroup(h.Durable, subjects...)
	g.Partitions, g.AckWait, g.PinnedTTL, g.ReleaseTimeout = h.Partitions, h.AckWait, h.PinnedTTL, h.StopTimeout
	g.MaxAckPending, g.Batch = maxAckPending, batch
	return g
}

// RunnerConfig is the Config of the stage's Runner: named name, in group, ticking every tick, its
// crash-loop bound MaxDeliveries or holdingMaxDeliveries.
func (h HoldingConfig) RunnerConfig(name string, group GroupConfig, tick time.Duration) Config {
	return Config{Name: name, Group: group, TickInterval: tick,
		MaxDeliveries: cmp.Or(h.MaxDeliveries, holdingMaxDeliveries), StopTimeout: h.StopTimeout}
}
