package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/consumers/partition"
	"github.com/fpmbus/fpmbus/consumers/trace"
	"github.com/fpmbus/fpmbus/internal/envflag"
	"github.com/fpmbus/fpmbus/internal/flaghelp"
	"github.com/fpmbus/fpmbus/internal/flagprefix"
	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/observe"
	"github.com/fpmbus/fpmbus/internal/rungroup"
	"github.com/fpmbus/fpmbus/internal/upstack"
	"github.com/fpmbus/fpmbus/producer"
	"github.com/fpmbus/fpmbus/replay"
	"github.com/fpmbus/fpmbus/streams"
)

func init() {
	register(command{
		name:    "up",
		summary: "run everything in one process on an embedded JetStream server (--demo adds synthetic ranks)",
		run:     runUp,
	})
}

// Defaults of `fpmbus up --demo`.
const (
	demoDPSize = 4  // ranks unless --dp-size says otherwise
	demoRate   = 20 // forward passes per second per rank
	demoWorker = "demo-worker"
	demoSeed   = 1
	// demoStartDelay lets the bridge's SUB sockets connect before the first FPM (ZMQ's slow joiner).
	demoStartDelay = 300 * time.Millisecond
	// upMarkerSpool is the bridge's marker spool in the data directory, unless --marker-spool says
	// otherwise: the drop markers it could not store before a stop, published by the next `up`.
	upMarkerSpool = "bridge-drop-markers.jsonl"
)

// upOptions are the flags of `fpmbus up`: its own, the restart policy, and every component's
// (flagprefix.go states the naming rule).
type upOptions struct {
	fs            *flag.FlagSet
	listen        string
	dataDir       string
	server        *natsserver.Flags
	creds         *connOptions // the components' credentials on the embedded server
	sync          natsserver.SyncPolicy
	demo          bool
	demoTrace     string
	metricsAddr   *string
	restartLimit  int
	restartWindow time.Duration
	restartDelay  time.Duration
	faultSignal   bool
	scfg          *streams.Config
	shardsEnv     *envflag.Defaults // --fpm-shards's variable
	bridge        *bridgeOptions
	trace         *traceOptions
	gaps          *gapsOptions
	merge         *mergeOptions
	seal          *sealOptions
	predict       *predictOptions
	demoFlags     *producer.Flags
}

func upFlags(fs *flag.FlagSet) *upOptions {
	o := &upOptions{fs: fs}
	flaghelp.Group(fs, "embedded server")
	fs.StringVar(&o.listen, "listen", natsserver.DefaultListen, "client address of the embedded JetStream server (loopback by default; beyond loopback only with authentication, or --insecure); overrides --server-config's")
	fs.StringVar(&o.dataDir, "data-dir", ".fpmbus", "where the embedded server keeps its store (<data-dir>/jetstream)")
	o.server = natsserver.RegisterFlags(fs)
	flaghelp.InGroup(fs, "credentials the components present to the embedded server", func() { o.creds = credentialFlags(fs, "up") })
	o.sync = natsserver.DefaultSync
	fs.Var(&o.sync, "sync", "when the embedded server fsyncs: always (before every ack) or a DURATION (background, e.g. 2m: a power cut loses what was acked since; the sealed datasets too)")
	flaghelp.Group(fs, "demo publishers (--demo)")
	fs.BoolVar(&o.demo, "demo", false, "also run synthetic Dynamo publishers (one ZMQ PUB per DP rank; --dp-size defaults to 4)")
	fs.StringVar(&o.demoTrace, "demo-trace", "", "with --demo: replay these trace segments instead of synthetic load (comma-separated files, directories, globs or output prefixes; looped until stopped, counter ids renumbered; --dp-size defaults to the ranks they hold)")
	flaghelp.Group(fs, "supervision and health")
	o.metricsAddr = metricsAddrFlag(fs, "127.0.0.1:9464")
	d := rungroup.DefaultPolicy()
	fs.IntVar(&o.restartLimit, "restart-limit", d.MaxRestarts, "restarts a failing component may take within --restart-window; one more failure stops everything and exits 1")
	fs.DurationVar(&o.restartWindow, "restart-window", d.Window, "the sliding window --restart-limit counts in")
	fs.DurationVar(&o.restartDelay, "restart-backoff", d.InitialBackoff, "wait before restarting a failed component; doubles with each further failure, up to 30s")
	fs.BoolVar(&o.faultSignal, "fault-sigusr1", false, "fault injection for tests and drills: SIGUSR1 closes the components' NATS connection for good, as a broker-side failure would; supervision replaces it")
	o.scfg = streamFlags(fs)
	flaghelp.InGroup(fs, "streams (declared at start)", func() { o.shardsEnv = fpmShardsFlag(fs, o.scfg) })
	// The bridge first: its unprefixed names (--producer-id, --stop-timeout) are its own, not aliases
	// of the trace writer's.
	flaghelp.Group(fs, "bridge (ZMQ to JetStream)")
	o.bridge = bridgeFlags(fs)
	flaghelp.Group(fs, "trace writer")
	o.trace = traceFlags(fs, flagprefix.Trace)
	flaghelp.Group(fs, "gap detector")
	o.gaps = gapsFlags(fs, flagprefix.Gaps)
	flaghelp.Group(fs, "benchmark merger")
	o.merge = mergeFlags(fs, flagprefix.Merge)
	flaghelp.Group(fs, "dataset sealer")
	o.seal = sealFlags(fs, flagprefix.Seal)
	flaghelp.Group(fs, "predict service")
	o.predict = predictFlags(fs, predictPrefix)
	flaghelp.Group(fs, "demo publishers (--demo)")
	demo := &producer.Config{Rate: demoRate, WorkerID: demoWorker, Seed: demoSeed}
	o.demoFlags = demo.RegisterLoadFlags(fs, "demo-")
	return o
}

// planUpServer checks the embedded server's flags and the components' credentials on it.
func planUpServer(o *natsserver.Flags, listen, storeDir string, creds *connOptions) (*upstack.Server, error) {
	s := &upstack.Server{}
	p, err := o.Plan(listen, storeDir, creds.GivenCredentials(), func() (err error) {
		s.Conn, err = creds.credentials()
		return err
	})
	if err != nil {
		return nil, flagUsage(err)
	}
	s.Config, s.Listen, s.From, s.Auth, s.Plan = p.Server, p.Listen, p.From, p.Auth, p
	if p.Token != "" {
		s.Conn = natsconn.ConnConfig{Name: "fpmbus-up", Logger: slog.Default(), Token: p.Token}
	}
	return s, nil
}

// writeUpToken creates the missing --auth-token-file (natsserver.Plan.WriteToken).
func writeUpToken(s *upstack.Server) error { return flagUsage(s.Plan.WriteToken()) }

// plan checks every setting and returns the run; a bad one is a usage error naming its flag or
// variable. An invalid trace setting or an unwritable trace output disables only the trace writer, as
// Dynamo does; the run group lists it disabled with the reason (logged as an error, /healthz degraded).
func (o *upOptions) plan() (*upstack.Run, error) {
	_, port, err := net.SplitHostPort(o.listen)
	if p, perr := strconv.Atoi(port); err != nil || perr != nil || p < 0 || p > 65535 {
		return nil, fmt.Errorf("%w: --listen %q: want HOST:PORT (port 0: any free port)", errUsage, o.listen)
	}
	srv, err := planUpServer(o.server, o.listen, filepath.Join(o.dataDir, "jetstream"), o.creds)
	if err != nil {
		return nil, err
	}
	switch {
	case o.restartLimit < 0:
		return nil, fmt.Errorf("%w: --restart-limit %d: want 0 or more", errUsage, o.restartLimit)
	case o.restartWindow <= 0:
		return nil, fmt.Errorf("%w: --restart-window %v: want a positive duration", errUsage, o.restartWindow)
	case o.restartDelay <= 0:
		return nil, fmt.Errorf("%w: --restart-backoff %v: want a positive duration", errUsage, o.restartDelay)
	}
	if err := o.shardsEnv.Err(); err != nil {
		return nil, err
	}
	if err := o.scfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	demoTrace, err := o.demoTracePlan()
	if err != nil {
		return nil, err
	}
	if flagprefix.Given(o.fs, "sync") {
		srv.Config.Sync = o.sync // else the --server-config file's sync_interval, or the default
	}
	if !o.sync.Always && flagprefix.Given(o.fs, "sync") {
		slog.Warn("--sync is not always: a power cut or OS crash loses what the server acknowledged since its last fsync, sealed dataset cells included", "sync", o.sync.String())
	}
	if o.demo && !flagprefix.Given(o.fs, "dp-size") && !flagprefix.Given(o.fs, "zmq-endpoint") {
		o.bridge.cfg.DPSize = demoDPSize
		if demoTrace != nil {
			o.bridge.cfg.DPSize = demoTrace.Width
		}
	}
	if flagprefix.Given(o.fs, "stop-timeout") && !flagprefix.Given(o.fs, "trace-stop-timeout") {
		slog.Warn("--stop-timeout bounds only the bridge's stop in fpmbus up; the trace writer's is --trace-stop-timeout")
	}
	bc, err := o.bridge.config()
	if err != nil {
		return nil, err
	}
	bc.Streams, bc.Logger = *o.scfg, slog.Default()
	if !flagprefix.Given(o.fs, "marker-spool") {
		bc.MarkerSpool = filepath.Join(o.dataDir, upMarkerSpool)
	}
	memberID := partition.StableMemberID("up-", o.dataDir)
	if bc.BridgeID == "" {
		// The bridge is named like the consumer group members, the same across restarts: the gap
		// detector then reads a restarted `up` as a restarted bridge (a new epoch of the same bridge),
		// not as a second, redundant bridge on the same publishers.
		bc.BridgeID = memberID
	}
	r := &upstack.Run{
		MemberID: memberID,
		Listen:   srv.Listen,
		StoreDir: srv.Config.StoreDir,
		Server:   srv,
		Streams:  *o.scfg,
		Bridge:   bc,
		Policy: rungroup.Policy{InitialBackoff: o.restartDelay, MaxBackoff: rungroup.DefaultMaxBackoff,
			MaxRestarts: o.restartLimit, Window: o.restartWindow},
	}
	if r.Gaps, err = o.gaps.config(); err != nil {
		return nil, err
	}
	if r.Merge, err = o.merge.config(); err != nil {
		return nil, err
	}
	r.Merge.Streams, r.MergeOptions = o.scfg, o.merge.options()
	if r.Seal, err = o.seal.consumerConfig(*o.scfg); err != nil {
		return nil, err
	}
	r.SealOptions = o.seal.consumerOptions()
	if r.Predict, err = o.predict.config(); err != nil {
		return nil, err
	}
	tcfg, err := o.trace.config()
	if err == nil {
		// A full disk passes: the writer waits for space when it starts. A path that cannot be written
		// at all disables it.
		if err = trace.ProbeOutput(tcfg.OutputPath); fsutil.DiskFull(err) {
			err = nil
		}
	}
	if err != nil {
		// The run group lists it disabled (an error-level log, /healthz degraded with the reason).
		r.TraceDisabled = strings.TrimPrefix(err.Error(), errUsage.Error()+": ") + "; the bridge and the other consumers run on without it"
	} else {
		r.Trace = &tcfg
	}
	if o.demo {
		if r.Bridge.BasePort == 0 {
			return nil, fmt.Errorf("%w: --demo binds its own ports; use --fpm-port/--dp-size, not --zmq-endpoint", errUsage)
		}
		if demoTrace != nil {
			// Every socket waits for the bridge's subscription: what libzmq sends before it joins is lost.
			demoTrace.ZMQ = replay.ZMQConfig{Host: o.bridge.flags.ZMQHost(), BasePort: r.Bridge.BasePort, StartDelay: demoStartDelay,
				WaitSubscribers: 1}
			r.DemoTrace = demoTrace
			return r, nil
		}
		pc, err := o.demoFlags.Config()
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		// The synthetic ranks bind where the bridge subscribes.
		pc.Host, pc.BasePort, pc.DPSize = o.bridge.flags.ZMQHost(), r.Bridge.BasePort, r.Bridge.DPSize
		pc.StartDelay, pc.Logger = demoStartDelay, slog.Default()
		if err := pc.Validate(); err != nil {
			return nil, fmt.Errorf("%w: --demo: %v", errUsage, err)
		}
		r.Demo = &pc
	}
	return r, nil
}

// demoTracePlan loads --demo-trace (nil without it): the recording, its plan (looped, counter ids
// renumbered so the pipeline sees a live publisher's sequence) and the ports it spans from --fpm-port.
func (o *upOptions) demoTracePlan() (*upstack.DemoTrace, error) {
	if o.demoTrace == "" {
		return nil, nil
	}
	if !o.demo {
		return nil, fmt.Errorf("%w: --demo-trace replays a recording as the demo's load: it needs --demo", errUsage)
	}
	for _, n := range []string{"demo-rate", "demo-seed", "demo-worker-id"} {
		if flagprefix.Given(o.fs, n) {
			return nil, fmt.Errorf("%w: --%s shapes the synthetic load, which --demo-trace replaces", errUsage, n)
		}
	}
	plan, width, err := replay.LoopPlan(strings.Split(o.demoTrace, ","), o.bridge.cfg.BasePort)
	if err != nil {
		return nil, flagUsage(err)
	}
	return &upstack.DemoTrace{Plan: plan, Width: width}, nil
}

// runUp runs the embedded server, the connection, the consumers, the bridge and (with --demo) the
// synthetic publishers as one supervised group (upstack.Stages, internal/rungroup) until ctx ends, then stops
// them in reverse order. A component that cannot recover stops the others and makes runUp fail.
func runUp(ctx context.Context, args []string) error {
	fs := newFlagSet("up", "up [--demo] [--listen HOST:PORT] [--data-dir DIR] [--server-config FILE | --auth-token-file FILE] [--server-tls-cert FILE --server-tls-key FILE] [--metrics-addr ADDR] [bridge, stream, --trace-…, --gaps-…, --merge-…, --seal-… and --predict-… flags]")
	o := upFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	r, err := o.plan()
	if err != nil {
		return err
	}
	// Before anything starts or is written: the data directory, the descriptors and every address
	// (upstack.Run.Prepare).
	release, err := r.Prepare(o.dataDir, *o.metricsAddr)
	defer release()
	if err != nil {
		return err
	}
	// Once every setting is checked and the directory is ours: a missing --auth-token-file is written now.
	if err := writeUpToken(r.Server); err != nil {
		return err
	}
	if err := fsutil.EnsureDir(r.StoreDir, 0o755); err != nil {
		return fmt.Errorf("%w: --data-dir: %v", errUsage, err)
	}
	reg := observe.NewProcessRegistry()
	r.Registry = reg
	g, err := rungroup.New(r.Components(), rungroup.WithLogger(slog.Default()))
	if err != nil {
		return err
	}
	// The status page reads the gap detector's state only while someone looks (gaps.PublisherWatch).
	watch := gaps.NewPublisherWatch(func() jetstream.JetStream { _, js := r.Link(); return js }, r.Gaps)
	defer watch.Close()
	so := r.StatusOptions(reg, g)
	so.Publishers = gapsPublishers{watch}
	stop, err := serveStatus(*o.metricsAddr, so)
	if err != nil {
		return err
	}
	defer stop()
	if o.faultSignal {
		stop := natsconn.CloseOnSIGUSR1(func() *nats.Conn { nc, _ := r.Link(); return nc })
		defer stop()
	}
	slog.Info("fpmbus up: watch with `nats sub 'fpm.>'` or `nats stream info FPM`; Ctrl-C stops", "listen", r.Listen, "auth", r.Server.Auth, "metrics", *o.metricsAddr)
	ctx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	r.Abort = abort
	err = g.Run(ctx)
	if cause := context.Cause(ctx); errors.Is(cause, natsserver.ErrStoreLost) {
		return fmt.Errorf("stopped: %w", cause)
	}
	if errors.Is(err, rungroup.ErrGaveUp) {
		return fmt.Errorf("stopped: %w", err)
	}
	return err
}
