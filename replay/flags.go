package replay

import (
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/producer"
)

// Flags are the replay's command-line flags for the pacing and the targets, defined once here next to
// PlanConfig and Config (the source is SourceFlags'; the connection and the report's outputs are the
// command's). After parsing, PlanConfig and Config make validated configurations of them; errors name
// the flag.
type Flags struct {
	fs                             *flag.FlagSet
	to                             string
	speed, maxRate                 float64
	loop                           int
	startAt                        string
	duration                       time.Duration
	counterIDs, heartbeats         string
	heartbeatInterval              time.Duration
	mapWorker                      map[string]string
	onFull                         string
	portMap                        map[string]int
	namespace, component, bridgeID string
	maxInFlight                    int
	ackTimeout                     time.Duration
	startDelay                     time.Duration
	waitSubscribers                int
	waitTimeout                    time.Duration
	sendHWM                        int
	noDrop                         bool
	zmqHost                        string
	basePort                       int
	basePortSource                 string
}

// defaultWaitSubscribers is --wait-subscribers: a replay to ZMQ sends nothing until every socket has a
// subscriber, since libzmq drops silently what a socket sends with none.
const defaultWaitSubscribers = 1

// defaultStartDelay is how long the ZMQ target waits after binding before the first record, so that
// subscribers connecting meanwhile (ZMQ's slow joiner) miss nothing.
const defaultStartDelay = 500 * time.Millisecond

// RegisterFlags defines the flags on fs: --to, --speed, --max-rate, --loop, --start-at, --duration,
// --counter-ids, --map-worker, --heartbeats, --heartbeat-interval; for --to zmq --zmq-host,
// --fpm-port (default basePort, whose source basePortSource names in errors when it is not the
// package default), --port-map, --send-hwm, --no-drop, --on-full, --start-delay, --wait-subscribers,
// --wait-timeout; for --to stream --namespace, --component, --bridge-id, --max-in-flight,
// --ack-timeout.
func RegisterFlags(fs *flag.FlagSet, basePort int, basePortSource string) *Flags {
	f := &Flags{fs: fs, mapWorker: map[string]string{}, portMap: map[string]int{}, basePortSource: basePortSource}
	fs.StringVar(&f.to, "to", targetZMQ, "where to replay: zmq (one PUB socket per producer and rank, as Dynamo publishes) or stream (straight onto stream FPM under --namespace; with FPM shards to each key's shard, as the bridge publishes)")
	fs.Float64Var(&f.speed, "speed", 1, "pace factor: 2 plays twice as fast, 0.5 at half speed")
	fs.Float64Var(&f.maxRate, "max-rate", 0, "cap on records per second over all ranks; later records wait (0: none)")
	fs.IntVar(&f.loop, "loop", 1, "play the schedule N times (0: until interrupted)")
	fs.StringVar(&f.startAt, "start-at", "", "start the window here: an offset after the first record (90s) or an observed time (RFC 3339 or Unix ms)")
	fs.DurationVar(&f.duration, "duration", 0, "length of the window in recorded time (0: to the end)")
	fs.StringVar(&f.counterIDs, "counter-ids", string(counterKeep), "keep (the recorded counter_id) or renumber (the socket's sequence, as Dynamo's publisher stamps it)")
	fs.Func("map-worker", "replace a recorded worker_id: OLD=NEW (repeatable)", func(v string) error {
		old, nw, ok := strings.Cut(v, "=")
		if !ok {
			return fmt.Errorf("want OLD=NEW")
		}
		if _, dup := f.mapWorker[old]; dup {
			return fmt.Errorf("worker %q is mapped twice", old)
		}
		f.mapWorker[old] = nw
		return nil
	})
	fs.StringVar(&f.heartbeats, "heartbeats", string(heartbeatsAuto), "send Dynamo's idle heartbeats: auto (on sockets of sampled records only; a full trace holds its own), on or off")
	fs.DurationVar(&f.heartbeatInterval, "heartbeat-interval", defaultHeartbeatInterval, "a heartbeat after this long without a send on a socket")

	fs.StringVar(&f.zmqHost, "zmq-host", producer.DefaultHost, `--to zmq: interface to bind ("*": all, as Dynamo binds)`)
	fs.IntVar(&f.basePort, "fpm-port", basePort, "--to zmq: base port (Dynamo's DYN_FORWARDPASS_METRIC_PORT): rank r of a single producer binds port+r; several producers take consecutive blocks in name order")
	fs.Func("port-map", "--to zmq: bind PRODUCER's ranks from PORT (PRODUCER=PORT) or one rank on PORT (PRODUCER/RANK=PORT) (repeatable)", func(v string) error {
		return parsePortMapEntry(f.portMap, v)
	})
	fs.IntVar(&f.sendHWM, "send-hwm", producer.DefaultSendHWM, "--to zmq: ZMQ_SNDHWM of each socket, in messages (0: unlimited)")
	fs.BoolVar(&f.noDrop, "no-drop", false, "--to zmq: set ZMQ_XPUB_NODROP, so a subscriber at its high-water mark refuses sends (see --on-full) instead of libzmq dropping them silently")
	fs.StringVar(&f.onFull, "on-full", string(onFullDrop), "--to zmq with --no-drop: drop a refused send (Dynamo's behaviour, counted as failed) or wait until the subscriber takes it (lateness grows)")
	fs.DurationVar(&f.startDelay, "start-delay", defaultStartDelay, "--to zmq: wait this long after binding before the first record (lets subscribers connect)")
	fs.IntVar(&f.waitSubscribers, "wait-subscribers", defaultWaitSubscribers, "--to zmq: before the first record, wait until every socket has this many subscribers (0: send at once; what a socket sends while it has no subscriber is reported undelivered)")
	fs.DurationVar(&f.waitTimeout, "wait-timeout", 30*time.Second, "--to zmq: give up --wait-subscribers after this long, having sent nothing (exit 1, naming the sockets without subscribers)")

	fs.StringVar(&f.namespace, "namespace", defaultNamespace, "--to stream: namespace of the replayed subjects, fpm.<namespace>.<component>.<worker_id>.<dp_rank>")
	fs.StringVar(&f.component, "component", "", "--to stream: component of the replayed subjects (default: the recorded one)")
	fs.StringVar(&f.bridgeID, "bridge-id", "", "--to stream: Fpm-Bridge header of the replayed messages (default replay-<host>-<pid>)")
	fs.IntVar(&f.maxInFlight, "max-in-flight", defaultMaxInFlight, "--to stream: publishes awaiting an ack; at the bound the replay waits")
	fs.DurationVar(&f.ackTimeout, "ack-timeout", 10*time.Second, "--to stream: a publish without an ack after this long fails")
	return f
}

// given reports whether flag name was set on the command line.
func (f *Flags) given(name string) bool {
	given := false
	f.fs.Visit(func(fl *flag.Flag) { given = given || fl.Name == name })
	return given
}

// parseStartAt parses --start-at: a Go duration is an offset after the first record; an integer is
// Unix milliseconds; anything else must be RFC 3339.
func parseStartAt(v string) (offset time.Duration, at time.Time, err error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return 0, time.Time{}, fmt.Errorf("offset %v is negative", d)
		}
		return d, time.Time{}, nil
	}
	if msv, err := strconv.ParseInt(v, 10, 64); err == nil && msv >= 0 {
		return 0, time.UnixMilli(msv), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("want an offset (90s), RFC 3339 (2026-06-30T12:00:00Z) or Unix milliseconds")
	}
	return 0, t, nil
}

// PlanConfig returns the validated PlanConfig of the parsed flags; an error names the flag and wraps
// ErrInvalidPlan.
func (f *Flags) PlanConfig() (PlanConfig, error) {
	bad := func(flagName, format string, args ...any) error {
		return fmt.Errorf("%w: --%s %s", ErrInvalidPlan, flagName, fmt.Sprintf(format, args...))
	}
	c := PlanConfig{Speed: f.speed, MaxRate: f.maxRate, Duration: f.duration, CounterIDs: counterMode(f.counterIDs),
		Heartbeats: heartbeatMode(f.heartbeats), HeartbeatInterval: f.heartbeatInterval}
	switch {
	case !(f.speed > 0) || math.IsInf(f.speed, 0):
		return c, bad("speed", "%v: want a positive factor (0.5 half speed, 10 ten times faster)", f.speed)
	case f.maxRate < 0 || math.IsNaN(f.maxRate) || math.IsInf(f.maxRate, 0):
		return c, bad("max-rate", "%v: want a positive rate in records per second, or 0 for none", f.maxRate)
	case f.loop < 0:
		return c, bad("loop", "%d: want 1 or more passes, or 0 to loop until interrupted", f.loop)
	case f.duration < 0:
		return c, bad("duration", "%v: want a positive length (0: to the end)", f.duration)
	case c.CounterIDs != counterKeep && c.CounterIDs != CounterRenumber:
		return c, bad("counter-ids", "%q: want keep or renumber", f.counterIDs)
	case c.Heartbeats != heartbeatsAuto && c.Heartbeats != heartbeatsOn && c.Heartbeats != heartbeatsOff:
		return c, bad("heartbeats", "%q: want auto, on or off", f.heartbeats)
	case f.heartbeatInterval <= 0:
		return c, bad("heartbeat-interval", "%v: want a positive duration", f.heartbeatInterval)
	}
	c.Loops = f.loop
	if f.loop == 0 {
		c.Loops = -1
	}
	var err error
	if c.StartAt, c.StartTime, err = parseStartAt(f.startAt); err != nil {
		return c, bad("start-at", "%q: %v", f.startAt, err)
	}
	if len(f.mapWorker) > 0 {
		c.MapWorker = f.mapWorker
	}
	return c, c.Validate()
}

// Config returns the validated target Config of the parsed flags (the stream target's connection is
// the caller's to set); an error names the flag and wraps errInvalidConfig. Flags of the other target
// are refused, so a mistyped command does not silently ignore them.
func (f *Flags) Config() (Config, error) {
	bad := func(flagName, format string, args ...any) error {
		return fmt.Errorf("%w: --%s %s", errInvalidConfig, flagName, fmt.Sprintf(format, args...))
	}
	c := Config{Target: f.to}
	zmqFlags := []string{"zmq-host", "fpm-port", "port-map", "send-hwm", "no-drop", "on-full", "start-delay", "wait-subscribers", "wait-timeout"}
	streamFlags := []string{"namespace", "component", "bridge-id", "max-in-flight", "ack-timeout"}
	other := streamFlags
	switch f.to {
	case targetZMQ:
	case TargetStream:
		other = zmqFlags
	default:
		return c, bad("to", "%q: want zmq or stream", f.to)
	}
	for _, n := range other {
		if f.given(n) {
			return c, bad(n, "applies to --to %s only", map[bool]string{true: TargetStream, false: targetZMQ}[f.to == targetZMQ])
		}
	}
	if f.to == TargetStream {
		switch {
		case strings.TrimSpace(f.namespace) == "":
			return c, bad("namespace", "must not be blank")
		case f.maxInFlight < 1:
			return c, bad("max-in-flight", "%d: want at least 1", f.maxInFlight)
		case f.ackTimeout <= 0:
			return c, bad("ack-timeout", "%v: want a positive duration", f.ackTimeout)
		}
		c.Stream = streamConfig{Namespace: f.namespace, Component: f.component, BridgeID: f.bridgeID, MaxInFlight: f.maxInFlight, AckTimeout: f.ackTimeout}
		return c, nil
	}
	portName := "--fpm-port"
	if !f.given("fpm-port") && f.basePortSource != "" {
		portName = f.basePortSource
	}
	switch {
	case f.basePort < 1 || f.basePort > math.MaxUint16:
		return c, fmt.Errorf("%w: %s %d: want a port in 1..65535", errInvalidConfig, portName, f.basePort)
	case f.onFull != string(onFullDrop) && f.onFull != string(onFullWait):
		return c, bad("on-full", "%q: want drop or wait", f.onFull)
	case f.onFull == string(onFullWait) && !f.noDrop:
		return c, bad("on-full", "wait needs --no-drop: without it libzmq never refuses a send, it drops for a slow subscriber silently")
	case f.sendHWM < 0:
		return c, bad("send-hwm", "%d: want >= 0 (0: unlimited)", f.sendHWM)
	case f.startDelay < 0:
		return c, bad("start-delay", "%v: want >= 0", f.startDelay)
	case f.waitSubscribers < 0:
		return c, bad("wait-subscribers", "%d: want >= 0", f.waitSubscribers)
	case f.waitTimeout <= 0:
		return c, bad("wait-timeout", "%v: want a positive duration", f.waitTimeout)
	}
	hwm := f.sendHWM
	if hwm == 0 {
		hwm = -1 // the flag's 0 means unlimited; ZMQConfig's 0 means libzmq's default
	}
	c.ZMQ = ZMQConfig{Host: f.zmqHost, BasePort: f.basePort, SendHWM: hwm, NoDrop: f.noDrop, OnFull: onFull(f.onFull),
		StartDelay: f.startDelay, WaitSubscribers: f.waitSubscribers, WaitTimeout: f.waitTimeout}
	if len(f.portMap) > 0 {
		c.ZMQ.PortMap = f.portMap
	}
	return c, c.ZMQ.withDefaults().validate()
}
