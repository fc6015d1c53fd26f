package bridge

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/streams"
)

// Defaults of Config. A zero field takes its default.
const (
	defaultNamespace      = "dynamo"
	defaultComponent      = "backend"
	defaultMaxBuffer      = 100000
	defaultMaxBufferBytes = 256 << 20
	defaultMaxPayload     = 1 << 20
	defaultMaxInFlight    = 4096
	defaultAckTimeout     = 5 * time.Second
	defaultStopTimeout    = 10 * time.Second
	// defaultMaxControlLine is nats-server's default max_control_line: the longest protocol line
	// (PUB/HPUB with subject, reply subject and sizes) the server accepts before it closes the
	// connection. Servers do not announce it, so the bridge assumes the default unless told otherwise.
	defaultMaxControlLine = 4096
	// DefaultFPMPort is Dynamo's default DYN_FORWARDPASS_METRIC_PORT: rank r binds DefaultFPMPort + r.
	DefaultFPMPort = 20380
)

// ErrInvalidConfig is wrapped by every error Config.Validate returns.
var ErrInvalidConfig = errors.New("bridge: invalid config")

// Endpoint is one ZMQ PUB socket of one data-parallel rank.
type Endpoint struct {
	// URL is a ZMQ endpoint, for example tcp://127.0.0.1:20380.
	URL string
	// DPRank is the rank the endpoint belongs to; statistics and metrics are kept per DPRank, and dead
	// letters (whose payload names no rank) are filed under it.
	DPRank int
}

// endpointsFor returns Dynamo's endpoints for dpSize ranks on host: rank r is tcp://host:basePort+r.
// A dpSize below 1 is taken as 1.
func endpointsFor(host string, basePort, dpSize int) []Endpoint {
	if dpSize < 1 {
		dpSize = 1
	}
	eps := make([]Endpoint, dpSize)
	for r := range eps {
		eps[r] = Endpoint{URL: "tcp://" + net.JoinHostPort(host, strconv.Itoa(basePort+r)), DPRank: r}
	}
	return eps
}

// Config configures a Bridge. It is a plain struct: a zero field takes the default named in its comment.
type Config struct {
	// Endpoints to subscribe to; at least one, with distinct URLs and distinct ranks.
	Endpoints []Endpoint
	// BasePort and DPSize record that Endpoints came from endpointsFor(host, BasePort, DPSize). When
	// BasePort is set, Run checks once that the ports Dynamo binds (BasePort..BasePort+DPSize, see
	// checkEphemeralPorts) lie outside this host's ephemeral port range and logs a warning if not.
	BasePort int
	DPSize   int
	// Namespace and Component name the Dynamo component (defaults "dynamo" and "backend"); they are
	// the first two tokens of every subject.
	Namespace string
	Component string
	// ProducerID is the Fpm-Producer header of every FPM; empty means each message's worker_id.
	ProducerID string
	// BridgeID names this bridge instance in headers and drop markers (default hostname-pid).
	BridgeID string
	// MaxBuffer bounds the messages waiting for the broker (default 100000); a message arriving at a
	// full buffer is dropped and recorded in a drop marker.
	MaxBuffer int
	// MaxBufferBytes bounds the bytes of those messages (default 256 MiB), each charged its encoded
	// headers and body plus its bookkeeping (charge in limits.go); the publisher holds at most as many
	// again (in flight or awaiting a retry). MaxBuffer is also libzmq's receive queue (ZMQ_RCVHWM) per
	// socket. The README's bridge section gives the resulting memory bound.
	MaxBufferBytes int64
	// MaxPayload bounds one ZMQ frame in bytes (default 1 MiB). It is libzmq's ZMQ_MAXMSGSIZE on every
	// SUB socket, so a larger frame is refused before it is read into memory (see limits.go); each
	// refusal is counted and dead-lettered.
	MaxPayload int
	// MaxControlLine is the NATS server's max_control_line in bytes (default defaultMaxControlLine).
	// A message whose subject would make a longer protocol line is dead-lettered instead of published:
	// the server would close the connection on it.
	MaxControlLine int
	// MaxInFlight bounds the asynchronous publishes awaiting an ack (default 4096).
	MaxInFlight int
	// MarkerSpool is a file for the drop markers not stored when the bridge stops; the next run with
	// the same file publishes them first (markerspool.go). Empty: none, such markers are only logged.
	MarkerSpool string
	// AckTimeout is how long one publish may wait for its ack before it is retried (default 5s).
	AckTimeout time.Duration
	// StopTimeout bounds the graceful stop: publishing what is buffered and waiting for acks (default 10s).
	StopTimeout time.Duration
	// Streams creates missing streams at start (streams.Ensure); the zero value means streams.DefaultConfig().
	Streams streams.Config
	// Registerer receives the bridge's Prometheus metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Logger receives the bridge's logs; nil means slog.Default().
	Logger *slog.Logger
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.Namespace == "" {
		c.Namespace = defaultNamespace
	}
	if c.Component == "" {
		c.Component = defaultComponent
	}
	if c.BridgeID == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "bridge"
		}
		c.BridgeID = host + "-" + strconv.Itoa(os.Getpid())
	}
	c.MaxBuffer = cmp.Or(c.MaxBuffer, defaultMaxBuffer)
	c.MaxBufferBytes = cmp.Or(c.MaxBufferBytes, defaultMaxBufferBytes)
	c.MaxPayload = cmp.Or(c.MaxPayload, defaultMaxPayload)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, defaultMaxInFlight)
	c.MaxControlLine = cmp.Or(c.MaxControlLine, defaultMaxControlLine)
	c.AckTimeout = cmp.Or(c.AckTimeout, defaultAckTimeout)
	c.StopTimeout = cmp.Or(c.StopTimeout, defaultStopTimeout)
	if c.DPSize == 0 && c.BasePort != 0 {
		c.DPSize = len(c.Endpoints)
	}
	if c.Streams == (streams.Config{}) {
		c.Streams = streams.DefaultConfig()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first setting that cannot work, wrapped in ErrInvalidConfig. Zero fields are
// valid: they take their defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := invalid.Reporter(ErrInvalidConfig)
	if len(c.Endpoints) == 0 {
		return bad("no ZMQ endpoints")
	}
	urls := make(map[string]bool, len(c.Endpoints))
	ranks := make(map[int]bool, len(c.Endpoints))
	for i, ep := range c.Endpoints {
		scheme, rest, ok := strings.Cut(ep.URL, "://")
		if !ok || scheme == "" || rest == "" {
			return bad("endpoint %d: %q is not a ZMQ endpoint (want tcp://host:port)", i, ep.URL)
		}
		if ep.DPRank < 0 {
			return bad("endpoint %s: dp rank %d is negative", ep.URL, ep.DPRank)
		}
		if urls[ep.URL] {
			return bad("endpoint %s listed twice", ep.URL)
		}
		if ranks[ep.DPRank] {
			return bad("dp rank %d has two endpoints", ep.DPRank)
		}
		urls[ep.URL], ranks[ep.DPRank] = true, true
	}
	switch {
	case c.BasePort < 0 || c.BasePort > 65535:
		return bad("base port %d: want 1 to 65535", c.BasePort)
	case c.DPSize < 0:
		return bad("dp size %d is negative", c.DPSize)
	}
	for _, bound := range []struct {
		name, unit string
		v          int64
	}{
		{"max buffer", " message", int64(c.MaxBuffer)}, {"max buffer bytes", "", c.MaxBufferBytes},
		{"max payload", " byte", int64(c.MaxPayload)}, {"max in flight", "", int64(c.MaxInFlight)},
	} {
		if bound.v < 1 {
			return bad("%s %d: want at least 1%s", bound.name, bound.v, bound.unit)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ack timeout", c.AckTimeout}, {"stop timeout", c.StopTimeout}} {
		if d.v < 0 {
			return bad("%s %v is negative", d.name, d.v)
		}
	}
	if c.MaxControlLine < minControlLine {
		return bad("max control line %d: want at least %d bytes", c.MaxControlLine, minControlLine)
	}
	if err := c.subjectsFit(); err != nil {
		return bad("%v", err)
	}
	if err := c.Streams.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// option changes how a Bridge runs; options exist for tests (a clock, a proc file), not for settings
// an operator chooses, which live in Config.
type option func(*options)

type options struct {
	now      func() time.Time
	procPath string
	onAck    func(it *item, at time.Time) // called by the publisher goroutine for each acked FPM; at = ack time
	hold     <-chan struct{}              // the publisher takes nothing from the buffer until it is closed
	singles  bool                         // no group commit: every FPM published on its own (benchmarks)
	// readerHold is called by each reader at the top of every loop (tests: a reader stalled, as a
	// stopped process's is).
	readerHold func(slot int)
	// runsBucket wraps the agreed runs bucket once opened (tests: a bucket that does not answer).
	runsBucket func(jetstream.KeyValue) jetstream.KeyValue
	// runsOpen is called before each opening of the agreed runs bucket; an error it returns is the
	// opening's (tests: a bucket that does not answer when the bridge starts).
	runsOpen func() error
}

// withRunsBucket wraps the agreed runs bucket in wrap once it is opened (tests: faults injected into
// the bucket alone, the FPM stream untouched).
func withRunsBucket(wrap func(jetstream.KeyValue) jetstream.KeyValue) option {
	return func(o *options) { o.runsBucket = wrap }
}

// withRunsOpen calls fail before each opening of the agreed runs bucket; its error is the opening's.
func withRunsOpen(fail func() error) option {
	return func(o *options) { o.runsOpen = fail }
}

// withClock replaces time.Now for receive timestamps and epochs.
func withClock(now func() time.Time) option {
	return func(o *options) {
		if now != nil {
			o.now = now
		}
	}
}

// withProcPath reads the ephemeral port range from path instead of /proc/sys/net/ipv4/ip_local_port_range.
func withProcPath(path string) option {
	return func(o *options) { o.procPath = path }
}

// withHold keeps the publisher from taking anything from the buffer until hold is closed (tests: a
// bridge that lags behind its redundant peer).
func withHold(hold <-chan struct{}) option {
	return func(o *options) { o.hold = hold }
}

// withoutGroupCommit publishes every FPM on its own (benchmarks: the one-by-one baseline).
func withoutGroupCommit() option {
	return func(o *options) { o.singles = true }
}

// withReaderHold calls hold from every reader at the top of each loop, with its endpoint's slot.
func withReaderHold(hold func(slot int)) option {
	return func(o *options) { o.readerHold = hold }
}

// withAckHook calls f on the publisher goroutine for every acked FPM (tests and benchmarks).
func withAckHook(f func(it *item, at time.Time)) option {
	return func(o *options) { o.onAck = f }
}
