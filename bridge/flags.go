package bridge

import (
	"cmp"
	"flag"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/internal/zmqflags"
)

// defaultZMQHost is where the bridge looks for the workers' FPM PUB sockets unless told otherwise.
const defaultZMQHost = "127.0.0.1"

// Flags are the bridge's command-line flags, defined once here next to Config: every command that runs
// a bridge (`fpmbus bridge`, `fpmbus up`) registers them with Config.RegisterFlags and, after parsing,
// turns them into a Config with Flags.Config. The flags write into the Config they were registered on.
type Flags struct {
	cfg       *Config
	set       zmqflags.Set
	zmqHost   string
	endpoints []string
	// BasePortSource names where the default of --fpm-port came from when it is not the package
	// default (e.g. "DYN_FORWARDPASS_METRIC_PORT"); errors about the port blame it when the flag was not
	// given.
	BasePortSource string
}

// RegisterFlags defines the bridge's flags on fs, each named prefix+name (prefix "" in the commands
// that exist today), with c's values as defaults (a zero field shows the package default), and returns
// the Flags that make a Config of them once fs is parsed. Streams, Registerer and Logger have no flag:
// the caller sets them. Flags: --zmq-host, --fpm-port, --dp-size, --zmq-endpoint, --namespace,
// --component, --producer-id, --bridge-id, --max-buffer, --max-payload, --max-in-flight, --ack-timeout,
// --stop-timeout, --marker-spool.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) *Flags {
	f := &Flags{cfg: c, set: zmqflags.On(fs, prefix)}
	d := c.withDefaults()
	c.BasePort = cmp.Or(c.BasePort, DefaultFPMPort)
	c.DPSize = cmp.Or(c.DPSize, 1)
	n := func(name string) string { return prefix + name }
	fs.StringVar(&f.zmqHost, n("zmq-host"), defaultZMQHost, "host of the Dynamo workers' FPM PUB sockets")
	f.set.RegisterPorts(&c.BasePort, &c.DPSize, "publishes on")
	fs.Func(n("zmq-endpoint"), "explicit ZMQ endpoint(s) instead of --"+n("zmq-host")+"/--"+n("fpm-port")+"/--"+n("dp-size")+"; repeat or comma-separate; rank = position", func(v string) error {
		for _, ep := range strings.Split(v, ",") {
			if ep = strings.TrimSpace(ep); ep != "" {
				f.endpoints = append(f.endpoints, ep)
			}
		}
		return nil
	})
	fs.StringVar(&c.Namespace, n("namespace"), d.Namespace, "Dynamo namespace (first subject token)")
	fs.StringVar(&c.Component, n("component"), d.Component, "Dynamo component (second subject token)")
	fs.StringVar(&c.ProducerID, n("producer-id"), c.ProducerID, "Fpm-Producer of every FPM (default: each message's worker_id)")
	fs.StringVar(&c.BridgeID, n("bridge-id"), c.BridgeID, "name of this bridge in headers and drop markers (default hostname-pid)")
	fs.IntVar(&c.MaxBuffer, n("max-buffer"), d.MaxBuffer, "messages held while the broker is slow or away; beyond it new ones are dropped with a drop marker")
	fs.Int64Var(&c.MaxBufferBytes, n("max-buffer-bytes"), d.MaxBufferBytes, "bytes held in the buffer, besides --max-buffer messages")
	fs.IntVar(&c.MaxPayload, n("max-payload"), d.MaxPayload, "largest ZMQ frame in bytes; libzmq refuses a larger one unread and the bridge dead-letters it")
	fs.IntVar(&c.MaxControlLine, n("max-control-line"), d.MaxControlLine, "the NATS server's max_control_line; an FPM whose subject would exceed it is dead-lettered")
	fs.IntVar(&c.MaxInFlight, n("max-in-flight"), d.MaxInFlight, "asynchronous publishes awaiting an ack")
	fs.DurationVar(&c.AckTimeout, n("ack-timeout"), d.AckTimeout, "how long a publish waits for its ack before it is retried")
	fs.DurationVar(&c.StopTimeout, n("stop-timeout"), d.StopTimeout, "on interrupt, how long to keep publishing what is buffered")
	fs.StringVar(&c.MarkerSpool, n("marker-spool"), c.MarkerSpool, "file for the drop markers not stored when the bridge stops; the next run with it publishes them first (empty: none, they are only logged)")
	return f
}

// ZMQHost is the value of --zmq-host (meaningless with --zmq-endpoint).
func (f *Flags) ZMQHost() string { return f.zmqHost }

// Config returns the Config the parsed flags describe: the endpoints resolved from --zmq-endpoint, or
// from --zmq-host, --fpm-port and --dp-size (with BasePort and DPSize set), and validated. An error
// wraps ErrInvalidConfig and names the flag (or BasePortSource) and the value at fault.
func (f *Flags) Config() (Config, error) {
	c := *f.cfg
	name := f.set.Name
	bad := invalid.Reporter(ErrInvalidConfig)
	for _, p := range []struct {
		flag string
		v    int
	}{{"max-buffer", c.MaxBuffer}, {"max-payload", c.MaxPayload}, {"max-control-line", c.MaxControlLine}, {"max-in-flight", c.MaxInFlight}} {
		if p.v <= 0 {
			return c, bad("%s %d: want a positive number", name(p.flag), p.v)
		}
	}
	if c.MaxBufferBytes <= 0 {
		return c, bad("%s %d: want a positive number", name("max-buffer-bytes"), c.MaxBufferBytes)
	}
	for _, p := range []struct {
		flag string
		v    time.Duration
	}{{"ack-timeout", c.AckTimeout}, {"stop-timeout", c.StopTimeout}} {
		if p.v <= 0 {
			return c, bad("%s %v: want a positive duration", name(p.flag), p.v)
		}
	}
	if strings.TrimSpace(c.Namespace) == "" || strings.TrimSpace(c.Component) == "" {
		return c, bad("%s and %s must not be blank", name("namespace"), name("component"))
	}
	if len(f.endpoints) > 0 {
		for _, n := range []string{"zmq-host", "fpm-port", "dp-size"} {
			if f.set.Given(n) {
				return c, bad("%s and %s exclude each other", name("zmq-endpoint"), name(n))
			}
		}
		c.Endpoints, c.BasePort, c.DPSize = nil, 0, 0
		for rank, ep := range f.endpoints {
			if !strings.Contains(ep, "://") {
				if _, _, err := net.SplitHostPort(ep); err != nil {
					return c, bad("%s %q: want tcp://host:port or host:port", name("zmq-endpoint"), ep)
				}
				ep = "tcp://" + ep
			}
			c.Endpoints = append(c.Endpoints, Endpoint{URL: ep, DPRank: rank})
		}
	} else {
		if err := f.set.CheckPorts(c.BasePort, c.DPSize, f.BasePortSource); err != nil {
			return c, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		c.Endpoints = endpointsFor(f.zmqHost, c.BasePort, c.DPSize)
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c, nil
}
