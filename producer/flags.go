package producer

import (
	"cmp"
	"flag"
	"fmt"
	"time"

	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/internal/zmqflags"
)

// Flags are the synthetic publisher's command-line flags, defined once here next to Config: `fpmbus
// publish` registers all of them with Config.RegisterFlags, `fpmbus up --demo` only those shaping the
// load with Config.RegisterLoadFlags (its ranks bind where its bridge listens). After parsing,
// Flags.Config makes a Config of them. The flags write into the Config they were registered on.
type Flags struct {
	cfg      *Config
	set      zmqflags.Set
	topology bool // --host, --fpm-port and --dp-size are registered
	// BasePortSource names where the default of --fpm-port came from when it is not the package
	// default (e.g. "DYN_FORWARDPASS_METRIC_PORT"); errors about the port blame it when the flag was not
	// given.
	BasePortSource string
}

// RegisterFlags defines every flag of the publisher on fs, each named prefix+name, with c's values as
// defaults (a zero field shows the package default; Rate 0 means as fast as possible, so a caller that
// wants a paced default sets it first): --host, --fpm-port, --dp-size, --worker-id, --rate, --seed,
// --count, --idle-after-count, --heartbeat, --queue-size, --send-hwm, --start-delay,
// --wait-subscribers, --wait-timeout.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) *Flags {
	d := c.withDefaults()
	n := func(name string) string { return prefix + name }
	c.Host, c.BasePort, c.DPSize = d.Host, d.BasePort, d.DPSize
	fs.StringVar(&c.Host, n("host"), c.Host, `interface the PUB sockets bind ("*": all interfaces, as Dynamo does)`)
	zmqflags.On(fs, prefix).RegisterPorts(&c.BasePort, &c.DPSize, "binds")
	f := c.RegisterLoadFlags(fs, prefix)
	f.topology = true
	c.WaitTimeout = cmp.Or(c.WaitTimeout, defaultWaitTimeout)
	fs.IntVar(&c.Count, n("count"), c.Count, "stop each rank after N FPMs, heartbeats excluded (0: run until interrupted)")
	fs.BoolVar(&c.IdleAfterCount, n("idle-after-count"), c.IdleAfterCount, "after --"+n("count")+", keep sending heartbeats until interrupted")
	fs.DurationVar(&c.HeartbeatInterval, n("heartbeat"), d.HeartbeatInterval, "heartbeat after this long without a publish")
	fs.IntVar(&c.QueueSize, n("queue-size"), d.QueueSize, "per-rank queue between engine and sender (full: drop)")
	fs.IntVar(&c.SendHWM, n("send-hwm"), d.SendHWM, "ZMQ_SNDHWM of each PUB socket, in messages")
	fs.DurationVar(&c.StartDelay, n("start-delay"), c.StartDelay, "wait this long after binding before the first message (lets subscribers join)")
	fs.IntVar(&c.WaitSubscribers, n("wait-subscribers"), c.WaitSubscribers, "before the first message, wait until this many subscribers joined every rank (XPUB; same wire format)")
	fs.DurationVar(&c.WaitTimeout, n("wait-timeout"), c.WaitTimeout, "give up --"+n("wait-subscribers")+" after this long (exit 1)")
	return f
}

// RegisterLoadFlags defines only the flags that shape the synthetic load, each named prefix+name, with
// c's values as defaults: --worker-id, --rate, --seed. The caller sets where the ranks bind (Host,
// BasePort, DPSize) and every other field itself.
func (c *Config) RegisterLoadFlags(fs *flag.FlagSet, prefix string) *Flags {
	n := func(name string) string { return prefix + name }
	fs.StringVar(&c.WorkerID, n("worker-id"), c.WorkerID, "worker_id stamped into every FPM (Dynamo's DYN_FPM_WORKER_ID)")
	fs.Float64Var(&c.Rate, n("rate"), c.Rate, "simulated forward passes per second per rank (<= 0: as fast as possible)")
	fs.Int64Var(&c.Seed, n("seed"), c.Seed, "seed of the load simulation (same seed: same FPMs)")
	return &Flags{cfg: c, set: zmqflags.On(fs, prefix)}
}

// defaultWaitTimeout is what Run waits for WaitSubscribers when WaitTimeout is 0.
const defaultWaitTimeout = 30 * time.Second

// Config returns the validated Config the parsed flags describe. An error wraps ErrInvalidConfig and
// names the flag (or BasePortSource) and the value at fault.
func (f *Flags) Config() (Config, error) {
	c := *f.cfg
	name := f.set.Name
	bad := invalid.Reporter(ErrInvalidConfig)
	if f.topology {
		// In this order, the first that fails is reported: the flag, its value, what it wants.
		for _, r := range []struct {
			broken bool
			flag   string
			value  any
			want   string
		}{
			{c.HeartbeatInterval <= 0, "heartbeat", c.HeartbeatInterval, "want > 0"},
			{c.QueueSize < 1, "queue-size", c.QueueSize, "want >= 1"},
			{c.SendHWM < 1, "send-hwm", c.SendHWM, "want >= 1"},
			{c.Count < 0, "count", c.Count, "want >= 0 (0: no limit)"},
			{c.IdleAfterCount && c.Count == 0, "idle-after-count", nil, "needs " + name("count")},
			{c.WaitSubscribers < 0, "wait-subscribers", c.WaitSubscribers, "want >= 0"},
			{c.WaitTimeout < 0, "wait-timeout", c.WaitTimeout, "want >= 0"},
			{c.StartDelay < 0, "start-delay", c.StartDelay, "want >= 0"},
		} {
			switch {
			case r.broken && r.value == nil:
				return c, bad("%s %s", name(r.flag), r.want)
			case r.broken:
				return c, bad("%s %v: %s", name(r.flag), r.value, r.want)
			}
		}
		if err := f.set.CheckPorts(c.BasePort, c.DPSize, f.BasePortSource); err != nil {
			return c, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c, nil
}
