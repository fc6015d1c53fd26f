package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/pebbe/zmq4"

	"github.com/fpmbus/fpmbus/internal/fdbudget"
	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/producer"
)

// The ZMQ target: one PUB socket per (producer, rank), exactly Dynamo's publisher on the wire
// (producer.Sender: three frames, empty topic, 8-byte big-endian sequence, msgpack payload, sent
// without blocking), bound where an unmodified Dynamo consumer or `fpmbus bridge` expects a worker.
//
// libzmq drops a message silently when no subscriber is connected, so each socket counts its
// subscribers (an XPUB with a monitor, producer.WithSubscriberCount: the same on the wire) and every
// send made while a socket had none is reported undelivered, not replayed. Before the first record the
// target waits until every socket has WaitSubscribers subscribers, under one deadline for all; the
// command waits for one by default. The descriptors the sockets need are checked against the
// process's limit before the first is opened (internal/fdbudget): libzmq aborts the process when it
// runs out while binding.

// onFull says what a send refused by libzmq (EAGAIN) does. Without ZMQConfig.NoDrop a PUB socket never
// refuses: libzmq drops for a slow subscriber silently, as it does for Dynamo.
type onFull string

const (
	// onFullDrop drops the FPM, as Dynamo's `except zmq.Again` does; it counts as failed.
	onFullDrop onFull = "drop"
	// onFullWait retries until libzmq takes the FPM: a slow subscriber slows the replay down, and the
	// lateness report shows by how much.
	onFullWait onFull = "wait"
)

// ZMQConfig configures the ZMQ target. The zero value binds 127.0.0.1, Dynamo's base port 20380.
type ZMQConfig struct {
	// Host is the interface to bind ("*": every interface, as Dynamo binds). Default 127.0.0.1.
	Host string
	// BasePort is DYN_FORWARDPASS_METRIC_PORT: with one producer, rank r binds BasePort+r, as Dynamo's
	// ranks do. With several, producers (in name order) take consecutive blocks of ports, each as wide
	// as its highest rank + 1. Default 20380.
	BasePort int
	// PortMap overrides the layout: "<producer>" maps to the base port of that producer's ranks,
	// "<producer>/<rank>" to one rank's port.
	PortMap map[string]int
	// SendHWM is ZMQ_SNDHWM in messages (0: libzmq's 1000; negative: unlimited).
	SendHWM int
	// NoDrop sets ZMQ_XPUB_NODROP: a subscriber at its high-water mark makes sends fail, and onFull
	// says what happens then.
	NoDrop bool
	// onFull: onFullDrop (default) or onFullWait.
	OnFull onFull
	// Linger bounds how long closing waits for queued frames (0: producer.DefaultLinger; negative: 0).
	Linger time.Duration
	// StartDelay is waited after binding, before the first send, so subscribers that connect meanwhile
	// miss nothing (ZMQ's slow joiner).
	StartDelay time.Duration
	// WaitSubscribers, when > 0, waits until every socket has that many subscribers (at most
	// WaitTimeout for all of them, default 30 s; then the replay fails naming the sockets short of
	// them, having sent nothing) before StartDelay. 0 sends without waiting: records sent while a
	// socket has no subscriber are reported undelivered.
	WaitSubscribers int
	WaitTimeout     time.Duration
}

func (c ZMQConfig) withDefaults() ZMQConfig {
	if c.Host == "" {
		c.Host = producer.DefaultHost
	}
	c.BasePort = cmp.Or(c.BasePort, producer.DefaultBasePort)
	if c.OnFull == "" {
		c.OnFull = onFullDrop
	}
	if c.Linger == 0 {
		c.Linger = producer.DefaultLinger
	} else if c.Linger < 0 {
		c.Linger = 0
	}
	c.WaitTimeout = cmp.Or(c.WaitTimeout, 30*time.Second)
	return c
}

// errInvalidConfig is wrapped by every error a Config (target) check returns.
var errInvalidConfig = errors.New("replay: invalid config")

func (c ZMQConfig) validate() error {
	bad := invalid.Reporter(errInvalidConfig)
	switch {
	case strings.Contains(c.Host, "://") || strings.ContainsAny(c.Host, "/ \t[]"):
		return bad("zmq host %q: give a host name or address", c.Host)
	case c.BasePort < 1 || c.BasePort > math.MaxUint16:
		return bad("fpm port %d: want 1..65535", c.BasePort)
	case c.OnFull != onFullDrop && c.OnFull != onFullWait:
		return bad("on full %q: want drop or wait", c.OnFull)
	case c.OnFull == onFullWait && !c.NoDrop:
		return bad("on full wait needs no-drop: without ZMQ_XPUB_NODROP libzmq never refuses a send, it drops silently")
	}
	if err := producer.CheckStartWait(c.StartDelay, c.WaitSubscribers, c.WaitTimeout); err != nil {
		return fmt.Errorf("%w: %w", errInvalidConfig, err)
	}
	for k, port := range c.PortMap {
		if port < 1 || port > math.MaxUint16 {
			return bad("port map %s=%d: want a port in 1..65535", k, port)
		}
	}
	return nil
}

// parsePortMapEntry parses one "<producer>=<port>" or "<producer>/<rank>=<port>" entry into m.
func parsePortMapEntry(m map[string]int, entry string) error {
	key, v, ok := strings.Cut(entry, "=")
	port, err := strconv.Atoi(strings.TrimSpace(v))
	if !ok || key == "" || err != nil || port < 1 || port > math.MaxUint16 {
		return fmt.Errorf("%w: port map %q: want <producer>=<base port> or <producer>/<rank>=<port>", errInvalidConfig, entry)
	}
	if p, r, ok := strings.Cut(key, "/"); ok {
		if n, err := strconv.ParseInt(r, 10, 64); err != nil || n < 0 || p == "" {
			return fmt.Errorf("%w: port map %q: the rank after / must be a non-negative integer", errInvalidConfig, entry)
		}
	}
	m[key] = port
	return nil
}

// Ports returns the port of every socket of p (inactive ones included, so the layout does not depend
// on the window), per the layout described at ZMQConfig.BasePort and PortMap. Two sockets on one port,
// or a port beyond 65535, is an error naming both.
func (c ZMQConfig) Ports(p *Plan) ([]int, error) {
	c = c.withDefaults()
	ports := make([]int, len(p.Sockets))
	next := c.BasePort // the next producer block's start
	for i := 0; i < len(p.Sockets); {
		prod := p.Sockets[i].Producer
		j := i
		for j < len(p.Sockets) && p.Sockets[j].Producer == prod {
			j++
		}
		width := int(p.Sockets[j-1].DPRank) + 1 // sockets are sorted by rank within a producer
		base := next
		if b, ok := c.PortMap[prod]; ok {
			base = b
		} else {
			next += width
		}
		for k := i; k < j; k++ {
			ports[k] = base + int(p.Sockets[k].DPRank)
			if port, ok := c.PortMap[p.Sockets[k].Label()]; ok {
				ports[k] = port
			}
		}
		i = j
	}
	byPort := map[int]int{}
	for i, port := range ports {
		if port > math.MaxUint16 {
			return nil, fmt.Errorf("%w: %s would bind port %d, beyond 65535: lower --fpm-port or map it (--port-map)", errInvalidConfig, p.Sockets[i].Label(), port)
		}
		if j, dup := byPort[port]; dup {
			return nil, fmt.Errorf("%w: %s and %s would both bind port %d: map one elsewhere (--port-map)", errInvalidConfig, p.Sockets[j].Label(), p.Sockets[i].Label(), port)
		}
		byPort[port] = i
	}
	for k := range c.PortMap {
		found := false
		for i := range p.Sockets {
			found = found || p.Sockets[i].Producer == k || p.Sockets[i].Label() == k
		}
		if !found {
			return nil, fmt.Errorf("%w: port map names %q, which is no producer or producer/rank of the recording", errInvalidConfig, k)
		}
	}
	return ports, nil
}

// endpoint is the bind endpoint of port on host.
func zmqEndpoint(host string, port int) string {
	if host != "*" && strings.Contains(host, ":") {
		return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port))
	}
	return "tcp://" + host + ":" + strconv.Itoa(port)
}

// subscriberRecheck is how long a socket's count of subscribers, once above zero, is trusted before it is
// read again (reading it costs two libzmq calls, each a system call: read before every send it would
// cut the replay's highest rate by three quarters). libzmq itself applies what happened to its
// connections about once a millisecond while a socket sends, so a subscriber that left is noticed as
// soon as libzmq stops sending to it. A socket without subscribers is read before every send: the
// first send after a subscriber joined counts as delivered.
const subscriberRecheck = time.Millisecond

// zmqTarget owns one producer.Sender per active socket. Every method runs on the pacer's goroutine.
type zmqTarget struct {
	cfg       ZMQConfig
	endpoints []string
	zctx      *zmq4.Context
	senders   []*producer.Sender // nil for an inactive socket
	subs      []int              // each socket's subscribers, as last read
	readAt    []time.Time        // when
	rep       *reporter
}

func newZMQTarget(cfg ZMQConfig, p *Plan, rep *reporter) (*zmqTarget, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ports, err := cfg.Ports(p)
	if err != nil {
		return nil, err
	}
	t := &zmqTarget{cfg: cfg, rep: rep, endpoints: make([]string, len(ports))}
	for i, port := range ports {
		t.endpoints[i] = zmqEndpoint(cfg.Host, port)
	}
	return t, nil
}

func (t *zmqTarget) describe(s int) string { return t.endpoints[s] }

// open binds every active socket, waits for subscribers and the start delay.
func (t *zmqTarget) open(ctx context.Context, p *Plan) error {
	var active []int
	for i := range p.Sockets {
		if p.Sockets[i].Active() {
			active = append(active, i)
		}
	}
	per := producer.DescriptorsPerSocketCounted + max(t.cfg.WaitSubscribers, 1) // and its subscribers' connections
	if err := fdbudget.Check(fmt.Sprintf("%d PUB sockets (one per producer and rank of the recording, each with %d subscriber(s))",
		len(active), max(t.cfg.WaitSubscribers, 1)), len(active)*per); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	zctx, err := zmq4.NewContext()
	if err != nil {
		return fmt.Errorf("replay: new zmq context: %w", err)
	}
	t.zctx = zctx
	t.senders = make([]*producer.Sender, len(p.Sockets))
	t.subs, t.readAt = make([]int, len(p.Sockets)), make([]time.Time, len(p.Sockets))
	opts := []producer.SenderOption{producer.WithLinger(t.cfg.Linger), producer.WithNoDrop(t.cfg.NoDrop), producer.WithSubscriberCount()}
	for _, i := range active {
		s, err := producer.NewSender(zctx, t.endpoints[i], t.cfg.SendHWM, opts...)
		if err != nil {
			return fmt.Errorf("replay: %s: %w", p.Sockets[i].Label(), err)
		}
		t.senders[i] = s
	}
	if n := t.cfg.WaitSubscribers; n > 0 {
		senders, labels := make([]*producer.Sender, len(active)), make([]string, len(active))
		for k, i := range active {
			senders[k], labels[k] = t.senders[i], p.Sockets[i].Label()
		}
		if err := producer.AwaitSubscribers(ctx, senders, labels, n, t.cfg.WaitTimeout); err != nil {
			if errors.Is(err, producer.ErrNoSubscribers) {
				return fmt.Errorf("replay: nothing sent: %w (start the subscribers first, or --wait-subscribers 0 to send regardless: what no subscriber receives is reported undelivered)", err)
			}
			return err
		}
	}
	if d := t.cfg.StartDelay; d > 0 {
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tm.C:
		}
	}
	return nil
}

// send sends one record and reports it: replayed, undelivered (libzmq took it, but the socket had no
// subscriber) or failed; it returns whether libzmq took the message.
func (t *zmqTarget) send(ctx context.Context, ev *event, payload []byte) bool {
	ev.undelivered, ev.err = t.sendFrames(ctx, int(ev.socket), ev.seq, payload)
	t.rep.record(ev)
	return ev.err == nil
}

func (t *zmqTarget) heartbeat(ctx context.Context, s int, seq uint64, payload []byte) bool {
	undelivered, err := t.sendFrames(ctx, s, seq, payload)
	t.rep.heartbeat(s, undelivered, err)
	return err == nil
}

// sendFrames sends one message on socket s; undelivered says the socket had no subscriber when it was
// sent (as libzmq had reported its subscribers just before, see subscriberRecheck), so that libzmq
// dropped it.
func (t *zmqTarget) sendFrames(ctx context.Context, s int, seq uint64, payload []byte) (undelivered bool, err error) {
	snd := t.senders[s]
	if now := time.Now(); t.subs[s] == 0 || now.Sub(t.readAt[s]) >= subscriberRecheck {
		if t.subs[s], err = snd.Subscribers(); err != nil {
			return false, err
		}
		t.readAt[s] = now
	}
	return t.subs[s] == 0, t.sendOnce(ctx, snd, seq, payload)
}

func (t *zmqTarget) sendOnce(ctx context.Context, snd *producer.Sender, seq uint64, payload []byte) error {
	for spins := 0; ; spins++ {
		err := snd.Send(seq, payload)
		if !errors.Is(err, producer.ErrDropped) || t.cfg.OnFull != onFullWait {
			return err
		}
		// The subscriber is at its high-water mark: poll until it has read some.
		if spins&255 == 255 && ctx.Err() != nil {
			return ctx.Err()
		}
		fineSleep(50 * time.Microsecond)
	}
}

// close closes the sockets (each waits at most Linger for its queued frames) and the context.
func (t *zmqTarget) close() error {
	var err error
	for _, s := range t.senders {
		if s != nil {
			err = errors.Join(err, s.Close())
		}
	}
	if t.zctx != nil {
		err = errors.Join(err, t.zctx.Term())
	}
	return err
}
