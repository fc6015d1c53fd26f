package producer

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fpmbus/fpmbus/internal/invalid"
)

// Defaults, each the value Dynamo or libzmq uses.
const (
	// DefaultHost is where the synthetic ranks bind unless told otherwise: loopback only. (Dynamo binds
	// tcp://*; pass Host "*" for that.)
	DefaultHost = "127.0.0.1"
	// DefaultBasePort is Dynamo's default DYN_FORWARDPASS_METRIC_PORT.
	DefaultBasePort = 20380
	// defaultQueueSize is _FpmPublisherThread's max_queue_size.
	defaultQueueSize = 10_000
	// DefaultHeartbeatInterval is _FpmPublisherThread.HEARTBEAT_INTERVAL.
	DefaultHeartbeatInterval = time.Second
	// DefaultSendHWM is libzmq's default ZMQ_SNDHWM (Dynamo does not change it).
	DefaultSendHWM = 1000
	// DefaultLinger bounds how long closing a publisher waits for queued frames to reach subscribers.
	DefaultLinger = time.Second
)

// ErrInvalidConfig is wrapped by every error Config.Validate returns.
var ErrInvalidConfig = errors.New("producer: invalid config")

// Config configures a Publisher. The zero value is valid: one rank on 127.0.0.1:20380, worker_id "",
// publishing as fast as possible forever.
type Config struct {
	// Host is the interface to bind: an IP address, a host name, or "*" for every interface. Default
	// 127.0.0.1. Bind loopback in tests and demos; "*" only when asked to.
	Host string
	// BasePort is DYN_FORWARDPASS_METRIC_PORT: rank r binds BasePort+r. Default 20380.
	BasePort int
	// DPSize is the number of data-parallel ranks, one PUB socket each. Default 1.
	DPSize int
	// WorkerID is stamped into every FPM's worker_id (Dynamo: DYN_FPM_WORKER_ID, default "").
	WorkerID string
	// Rate is the number of forward passes each rank's engine simulates per second, paced by a ticker.
	// Rate <= 0 runs the engine as fast as it can (the queue then overflows and drops, as Dynamo's would).
	// An empty batch takes a tick but publishes nothing.
	Rate float64
	// Count stops each rank after it has produced Count FPMs (heartbeats and empty batches excluded; FPMs
	// dropped by a full queue included). 0 means no limit.
	Count int
	// IdleAfterCount keeps a rank alive after Count: its engine goes idle, the sender keeps emitting
	// heartbeats, and Run returns only when its context is done.
	IdleAfterCount bool
	// HeartbeatInterval is how long a sender waits without a successful publish before it sends a
	// heartbeat. Default 1 s.
	HeartbeatInterval time.Duration
	// QueueSize is the capacity of each rank's queue between engine and sender. Default 10,000.
	QueueSize int
	// SendHWM is ZMQ_SNDHWM of each PUB socket, in messages. Default 1000 (libzmq's default).
	SendHWM int
	// NoDrop sets ZMQ_XPUB_NODROP on each PUB socket, so a subscriber whose pipe is at its high-water mark
	// makes the send fail with EAGAIN (counted in SendDrops) instead of libzmq dropping the message
	// silently. Dynamo does not set it: its `except zmq.Again` branch is only reachable with it. For tests.
	NoDrop bool
	// Linger is ZMQ_LINGER of each socket: how long closing waits for frames still queued for connected
	// subscribers. 0 means DefaultLinger (1 s); a negative value means 0, Dynamo's close(linger=0).
	Linger time.Duration
	// StartDelay is how long Run waits after the sockets are bound before the first FPM or heartbeat, so
	// that subscribers that connect meanwhile do not lose the first messages (see the package comment on
	// slow joiners).
	StartDelay time.Duration
	// WaitSubscribers, when > 0, makes each rank's socket an XPUB (identical to a PUB on the wire) and
	// makes Run wait, before StartDelay, until that many subscribers joined every rank (at most
	// WaitTimeout): the deterministic cure for ZMQ's slow joiner.
	WaitSubscribers int
	// WaitTimeout bounds WaitSubscribers (default 30s); Run fails with ErrNoSubscribers after it.
	WaitTimeout time.Duration
	// Seed seeds each rank's engine simulation (mixed with the rank). The same Seed gives the same FPMs.
	Seed int64
	// OnSent, when set, is called by each rank's sender goroutine for every message libzmq accepted,
	// heartbeats included, right after the send and in sequence order per rank: the rank, the sequence
	// number, whether it was a heartbeat, and the payload as sent (valid only during the call). Ranks
	// call it concurrently, and a slow OnSent slows its rank's sends. A message libzmq refused
	// (SendDrops, SendErrors) is not reported: it was never sent. `fpmbus publish --sent-log` records
	// what a run sent with it, so a test can tell from the outside what the pipeline was given.
	OnSent func(rank int, seq uint64, heartbeat bool, payload []byte)
	// Logger receives the publisher's logs. Nil discards them.
	Logger *slog.Logger
}

// withDefaults returns c with every unset field given its default.
func (c Config) withDefaults() Config {
	if c.Host == "" {
		c.Host = DefaultHost
	}
	c.BasePort = cmp.Or(c.BasePort, DefaultBasePort)
	c.DPSize = cmp.Or(c.DPSize, 1)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval)
	c.QueueSize = cmp.Or(c.QueueSize, defaultQueueSize)
	c.SendHWM = cmp.Or(c.SendHWM, DefaultSendHWM)
	if c.Linger == 0 {
		c.Linger = DefaultLinger
	} else if c.Linger < 0 {
		c.Linger = 0
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports whether c, with its defaults applied, can be used by New. Errors wrap ErrInvalidConfig
// and name the field.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := invalid.Reporter(ErrInvalidConfig)
	switch {
	case strings.Contains(c.Host, "://"):
		return bad("host %q: give a host name or address, not an endpoint", c.Host)
	case strings.ContainsAny(c.Host, "/ \t[]"):
		return bad("host %q: not a host name or address", c.Host)
	case c.DPSize < 1:
		return bad("dp size %d: want at least 1", c.DPSize)
	case c.BasePort < 1 || c.BasePort > math.MaxUint16:
		return bad("base port %d: want 1..65535", c.BasePort)
	case c.BasePort+c.DPSize-1 > math.MaxUint16:
		return bad("base port %d + dp size %d: the last rank's port %d exceeds 65535",
			c.BasePort, c.DPSize, c.BasePort+c.DPSize-1)
	case !utf8.ValidString(c.WorkerID):
		return bad("worker id %q: not valid UTF-8", c.WorkerID)
	case math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0):
		return bad("rate %v: want a finite number (<= 0: as fast as possible)", c.Rate)
	case c.Count < 0:
		return bad("count %d: want >= 0 (0: no limit)", c.Count)
	case c.IdleAfterCount && c.Count == 0:
		return bad("idle after count needs a count")
	case c.HeartbeatInterval < 0:
		return bad("heartbeat interval %v: want > 0", c.HeartbeatInterval)
	case c.QueueSize < 1:
		return bad("queue size %d: want >= 1", c.QueueSize)
	case c.SendHWM < 0:
		return bad("send hwm %d: want >= 0", c.SendHWM)
	}
	if err := CheckStartWait(c.StartDelay, c.WaitSubscribers, c.WaitTimeout); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// CheckStartWait checks how a set of PUB sockets starts sending (Config's StartDelay, WaitSubscribers
// and WaitTimeout; a replay's ZMQ target has the same three): none may be negative. The error names
// the setting and its value.
func CheckStartWait(startDelay time.Duration, waitSubscribers int, waitTimeout time.Duration) error {
	switch {
	case startDelay < 0:
		return fmt.Errorf("start delay %v: want >= 0", startDelay)
	case waitSubscribers < 0:
		return fmt.Errorf("wait subscribers %d: want >= 0", waitSubscribers)
	case waitTimeout < 0:
		return fmt.Errorf("wait timeout %v: want >= 0", waitTimeout)
	}
	return nil
}

// Endpoint returns the endpoint rank binds, tcp://<host>:<base port + rank>, with defaults applied. With
// Host "*" it is a bind endpoint only; subscribers connect to a real address.
func (c Config) Endpoint(rank int) string {
	c = c.withDefaults()
	return endpoint(c.Host, c.BasePort+rank)
}

func endpoint(host string, port int) string {
	if host != "*" && strings.Contains(host, ":") { // IPv6 literal
		return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port))
	}
	return "tcp://" + host + ":" + strconv.Itoa(port)
}
