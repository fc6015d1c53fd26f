package gaps

import (
	"flag"
	"fmt"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/flagprefix"
)

// Environment variables naming the defaults of the detector's flags (the binary reads them).
const (
	EnvGroup      = "FPMBUS_GAPS_GROUP"
	EnvPartitions = "FPMBUS_GAPS_PARTITIONS"
)

// Flags are the gap detector's command-line flags, defined once here next to Config: `fpmbus gaps`
// registers them with prefix "", `fpmbus up` with flagprefix.Gaps (the prefix rule of
// internal/flagprefix names them and adds the deprecated aliases). After parsing, Flags.Config makes a
// Config of them. The flags write into the Config they were registered on.
type Flags struct {
	cfg *Config
	cf  *flagprefix.Component
}

// RegisterFlags defines the detector's flags on fs with c's values as defaults (start from
// DefaultConfig; the caller sets Group and Partitions from EnvGroup and EnvPartitions when they are
// set). Logger, Registerer and the settings without a flag keep c's values.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) *Flags {
	f := &Flags{cfg: c, cf: flagprefix.On(fs, prefix)}
	cf := f.cf
	fs.StringVar(&c.Group, cf.Name("gaps-group"), c.Group, "gap detector group: durable consumer names and state keys; instances of one group share state (env "+EnvGroup+")")
	fs.StringVar(&c.FilterSubject, cf.Name("gaps-filter"), c.FilterSubject, "FPM subjects to watch, e.g. fpm.dynamo.>")
	fs.DurationVar(&c.StaleAfter, cf.Name("stale-after"), c.StaleAfter, "a publisher silent this long (not even a heartbeat) is stale: 5 x the 1 s heartbeat by default")
	fs.DurationVar(&c.MarkerGrace, cf.Name("marker-grace"), c.MarkerGrace, "how long a gap waits for a bridge drop marker before it is classified zmq_drop (stream time)")
	fs.IntVar(&c.Partitions, cf.Name("gaps-partitions"), c.Partitions, "partitions of the publishers shared by the instances of "+cf.Flag("gaps-group")+" (fixed for the group's life; 1: one active detector, the other instances hot standbys; with FPM shards: one per shard) (env "+EnvPartitions+")")
	fs.StringVar(&c.StateBucket, cf.Name("state-bucket"), c.StateBucket, "KV bucket holding each publisher's detector state")
	fs.DurationVar(&c.StopTimeout, cf.Name("gaps-stop-timeout"), c.StopTimeout, "on interrupt, how long to keep checkpointing what was already received")
	fs.IntVar(&c.MaxDeliveries, cf.Name("gaps-max-deliveries"), c.MaxDeliveries, "a message delivered this often, or whose partition was taken over this often after crashes without progress, is dead-lettered (0: 5)")
	fs.DurationVar(&c.PinnedTTL, cf.Name("gaps-pinned-ttl"), c.PinnedTTL, fmt.Sprintf("how long a crashed instance keeps its partitions before another instance of %s takes them over (%v to %v)", cf.Flag("gaps-group"), durable.MinPinnedTTL, durable.MaxPinnedTTL))
	cf.Done()
	return f
}

// Config returns the validated Config the parsed flags describe. An error wraps ErrInvalidConfig and
// names the flag (with its prefix) and the value at fault.
func (f *Flags) Config() (Config, error) {
	c := *f.cfg
	switch {
	case c.PinnedTTL < durable.MinPinnedTTL || c.PinnedTTL > durable.MaxPinnedTTL:
		return c, flagprefix.Invalid(ErrInvalidConfig, "%s %v: want %v to %v", f.cf.Flag("gaps-pinned-ttl"), c.PinnedTTL, durable.MinPinnedTTL, durable.MaxPinnedTTL)
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	if err := c.PartitionConfig().Validate(); err != nil {
		return c, flagprefix.Invalid(ErrInvalidConfig, "%v", err)
	}
	if c.MaxDeliveries < 0 {
		return c, flagprefix.Invalid(ErrInvalidConfig, "%s %d: want 0 (the default) or more", f.cf.Flag("gaps-max-deliveries"), c.MaxDeliveries)
	}
	return c, nil
}
