package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/bridge"
	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/consumers/merge"
	"github.com/fpmbus/fpmbus/consumers/seal"
	"github.com/fpmbus/fpmbus/consumers/trace"
	"github.com/fpmbus/fpmbus/internal/fdbudget"
	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/observe"
	"github.com/fpmbus/fpmbus/internal/rungroup"
	"github.com/fpmbus/fpmbus/predict/service"
	"github.com/fpmbus/fpmbus/producer"
	"github.com/fpmbus/fpmbus/replay"
	"github.com/fpmbus/fpmbus/streams"
)

// upStage is one component of `fpmbus up`. upStages lists them in start order; they stop in reverse
// order. The README's order table is generated from the same list (upOrderTable) and a test compares
// the two.
type upStage struct {
	name  string
	ready string   // when it counts as ready (README)
	stop  string   // what stopping it does (README)
	needs []string // components it is built on: their restart restarts it
	// build returns the component for this run (Disabled: the trace writer with an invalid setting), or
	// nil when the run does not include it (the demo publishers without --demo).
	build func(r *upRun) *rungroup.Component
}

// Names of the components of `fpmbus up`.
const (
	stageServer  = "embedded server"
	stageConn    = "nats connection"
	stageTrace   = "trace writer"
	stageGaps    = "gap detector"
	stageMerge   = "benchmark merger"
	stageSeal    = "dataset sealer"
	stagePredict = "predict service"
	stageBridge  = "bridge"
	stagePublish = "demo publishers"
)

// upStages is `fpmbus up`, in start order. The consumers start before the bridge so that their durable
// consumers exist when the first FPM is stored; the demo publishers start last, once the bridge's SUB
// sockets are connecting. Stopping runs backwards: nothing new enters (publishers, then the bridge
// publishes what it buffered), the consumers finish what they received, the connection drains, the
// server flushes.
var upStages = []upStage{
	{name: stageServer, ready: "accepts clients on `--listen` (or `--server-config`'s), authenticating them as configured; store in `<data-dir>/jetstream`",
		stop: "shuts down: JetStream flushes its store to disk", build: (*upRun).serverComponent},
	{name: stageConn, ready: "connected in-process with the components' credentials, streams applied", needs: []string{stageServer},
		stop: "drained: every ack and publish in flight completes", build: (*upRun).connComponent},
	{name: stageTrace, ready: "output repaired, durable declared, fetching", needs: []string{stageConn},
		stop: "writes what it received, fsyncs, acks (`--trace-stop-timeout`)", build: (*upRun).traceComponent},
	{name: stageGaps, ready: "joined its group, reading", needs: []string{stageConn},
		stop: "checkpoints its publishers, publishes their events, acks (`--gaps-stop-timeout`)", build: (*upRun).gapsComponent},
	{name: stageMerge, ready: "joined its group, taking partitions", needs: []string{stageConn},
		stop: "hands its partitions on: the ranks of unfinished runs go, unacked, to the next owner", build: (*upRun).mergeComponent},
	{name: stageSeal, ready: "bucket `FPM_DATASETS` open, joined its group, taking partitions", needs: []string{stageConn},
		stop: "hands its partitions on: a held or unsettled artefact goes, unacked, to the next owner", build: (*upRun).sealComponent},
	{name: stagePredict, ready: "bucket `FPM_DATASETS` loaded, endpoints on `fpmpredict.>` subscribed", needs: []string{stageConn},
		stop: "stops answering: its subscriptions drain, requests in hand are answered", build: (*upRun).predictComponent},
	{name: stageBridge, ready: "ZMQ sockets connecting, streams applied", needs: []string{stageConn},
		stop: "stops reading ZMQ, publishes what it buffered (`--stop-timeout`); the rest is counted as dropped", build: (*upRun).bridgeComponent},
	{name: stagePublish, ready: "`--demo` only: sockets bound, start delay over",
		stop: "stops generating, flushes its queues, closes the sockets", build: (*upRun).publishComponent},
}

// upOrderTable renders upStages as the README's order table.
func upOrderTable() string {
	var b strings.Builder
	b.WriteString("| start | stop | component | needs | ready when | on stop |\n|---|---|---|---|---|---|\n")
	for i, s := range upStages {
		fmt.Fprintf(&b, "| %d | %d | %s | %s | %s | %s |\n", i+1, len(upStages)-i, s.name, strings.Join(s.needs, ", "), s.ready, s.stop)
	}
	return b.String()
}

// upRun is one run of `fpmbus up`: the validated settings and what the components share.
type upRun struct {
	// memberID names this `fpmbus up` in its consumer groups, the same across restarts (partition.StableMemberID).
	memberID string
	listen   string
	storeDir string
	server   *upServer
	scfg     streams.Config
	reg      prometheus.Registerer
	policy   rungroup.Policy
	trace    *trace.Config // nil: the trace writer is disabled, for traceDisabled
	// traceDisabled is why the trace writer does not run (an invalid setting, an unwritable output).
	traceDisabled string
	gaps          gaps.Config
	merge         merge.Config
	// mergeOpts are the merger's options from the flags (member id).
	mergeOpts []durable.Option
	seal      seal.Config
	// sealOpts are the sealer's flags (member id).
	sealOpts *sealOptions
	predict  service.Config
	bridge   bridge.Config
	demo     *producer.Config // nil: no --demo, or --demo-trace
	// demoTrace replays a recording as the demo's load (--demo --demo-trace).
	demoTrace *upDemoTrace

	// abort stops the whole run with a cause no restart can fix (the store lost); runUp returns it.
	abort context.CancelCauseFunc

	mu        sync.Mutex // guards srv, the link and connected: replaced by their components' restarts
	srv       *natsserver.Server
	nc        *nats.Conn
	js        jetstream.JetStream
	connected bool // the components have connected once: their credentials were accepted
}

// components builds the run's list from upStages.
func (r *upRun) components() []rungroup.Component {
	var cs []rungroup.Component
	for _, s := range upStages {
		c := s.build(r)
		if c == nil {
			continue
		}
		c.Name, c.Needs, c.Restart = s.name, s.needs, r.policy
		cs = append(cs, *c)
	}
	return cs
}

// statusOptions is what `up`'s --metrics-addr serves: the whole process's registry, the run group's
// health, JetStream's view and the gap detector's publishers, through the current connection.
func (r *upRun) statusOptions(reg prometheus.Gatherer, g *rungroup.Group, watch *gaps.PublisherWatch) observe.Options {
	o := observe.Options{Process: "up", Gatherer: reg, Components: g.Status, Publishers: gapsPublishers{watch},
		JetStream: func() jetstream.JetStream { _, js := r.link(); return js }, ListJetStream: true,
		Sync:   r.server.server.EffectiveSync().String(),
		Bridge: &observe.BridgeRef{Component: stageBridge, Ranks: len(r.bridge.Endpoints), MaxBuffer: r.bridge.MaxBuffer, MaxInFlight: r.bridge.MaxInFlight},
		Consumers: []observe.ConsumerRef{
			{Label: gaps.ConsumerName, Component: stageGaps, Group: r.gaps.Group},
			{Label: merge.ConsumerName, Component: stageMerge, Group: r.merge.Durable},
			{Label: seal.ConsumerName, Component: stageSeal, Group: r.seal.Durable},
		}}
	if r.trace != nil {
		o.Consumers = append(o.Consumers, observe.ConsumerRef{Label: trace.ConsumerName, Component: stageTrace, Group: r.trace.Group})
	}
	return o
}

// link returns the connection current components are built on.
func (r *upRun) link() (*nats.Conn, jetstream.JetStream) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nc, r.js
}

func (r *upRun) serverComponent() *rungroup.Component {
	natsserver.RegisterStoreMetrics(r.reg, r.storeStatus)
	return &rungroup.Component{
		StopTimeout: 35 * time.Second,
		Start: func(context.Context) (rungroup.Instance, error) {
			srv, err := natsserver.StartServer(r.server.server)
			if err != nil {
				if errors.Is(err, natsserver.ErrListen) {
					// Restarting would find the address as taken as now: stop, naming it.
					return rungroup.Instance{}, rungroup.Permanent(fmt.Errorf("%w: %v", errUsage, err))
				}
				return rungroup.Instance{}, err
			}
			r.mu.Lock()
			r.srv = srv
			r.mu.Unlock()
			return rungroup.Instance{
				LogAttrs: []any{"url", srv.ClientURL(), "store", r.storeDir, "auth", r.server.auth, "sync", r.server.server.EffectiveSync().String()},
				// A full disk degrades the server, it does not fail it: restarting would not free space,
				// and the store watch restarts JetStream itself once there is room.
				Health: func() error { return srv.StoreStatus().Err() },
				Run: func(ctx context.Context) error {
					down := make(chan struct{})
					go func() { srv.NATS().WaitForShutdown(); close(down) }()
					wctx, stopWatch := context.WithCancel(ctx)
					watched := make(chan error, 1)
					go func() { watched <- srv.WatchStore(wctx, natsserver.StoreWatchConfig{Logger: slog.Default()}) }()
					select {
					case <-down:
						stopWatch()
						<-watched
						return errors.New("embedded server shut down")
					case err := <-watched:
						if err != nil {
							// The store is lost and JetStream already shut down: nothing in this process
							// brings it back. `up` stops, everything in order while the server still
							// answers (publishers see JetStream unavailable and count their drops), and
							// exits 1; its restart begins a new store.
							r.abort(err)
						}
						<-ctx.Done()
					case <-ctx.Done():
						stopWatch()
						<-watched
					}
					stopWatch()
					sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					err := srv.Shutdown(sctx)
					<-down
					return err
				},
			}, nil
		},
	}
}

func (r *upRun) connComponent() *rungroup.Component {
	return &rungroup.Component{
		StopTimeout: 15 * time.Second,
		Start: func(ctx context.Context) (rungroup.Instance, error) {
			r.mu.Lock()
			cfg := r.server.conn
			cfg.InProcess, cfg.Name, cfg.ConnectTimeout = r.srv, "fpmbus-up", 10*time.Second
			connectedOnce := r.connected
			r.mu.Unlock()
			nc, js, err := natsconn.ConnectAndEnsure(ctx, cfg, &r.scfg, upCredentialFlags)
			if err != nil {
				// Credentials refused at the first start will be refused at every restart: stop now,
				// saying which. Refused later (expired), they follow the restart policy.
				if !connectedOnce && errors.Is(err, natsconn.ErrAuth) {
					return rungroup.Instance{}, rungroup.Permanent(err)
				}
				return rungroup.Instance{}, r.storeTooSmall(err)
			}
			closed := make(chan error, 1)
			natsconn.OnClosed(nc, func(cause error) { closed <- cause })
			r.mu.Lock()
			r.nc, r.js, r.connected = nc, js, true
			r.mu.Unlock()
			return rungroup.Instance{
				LogAttrs: []any{"server", "in-process"},
				Run: func(ctx context.Context) error {
					select {
					case cause := <-closed:
						if cause != nil {
							return fmt.Errorf("%w: %w", natsconn.ErrConnClosed, cause)
						}
						return natsconn.ErrConnClosed
					case <-ctx.Done():
					}
					// Drain: every ack and publish still in flight completes before the connection closes.
					if err := nc.Drain(); err != nil {
						nc.Close()
						return nil
					}
					select {
					case <-closed:
					case <-time.After(10 * time.Second):
						nc.Close()
					}
					return nil
				},
			}, nil
		},
	}
}

func (r *upRun) traceComponent() *rungroup.Component {
	if r.trace == nil {
		return &rungroup.Component{Disabled: r.traceDisabled}
	}
	creg := observe.NewComponentRegistry(r.reg)
	segs := trace.NewProcessSegments() // a restarted incarnation continues its producers' segments
	return &rungroup.Component{
		StopTimeout: r.trace.StopTimeout + 10*time.Second,
		Start: func(context.Context) (rungroup.Instance, error) {
			_, js := r.link()
			cfg := *r.trace
			cfg.Registerer, cfg.Segments = creg.Renew(), segs
			w, err := trace.New(cfg, js, durable.WithMemberID(r.memberID))
			if err != nil {
				return rungroup.Instance{}, err
			}
			return rungroup.Instance{Run: w.Run, Ready: w.Ready(),
				LogAttrs: []any{"mode", cfg.Mode, "output", cfg.OutputPath, "group", cfg.Group, "member", r.memberID}}, nil
		},
	}
}

func (r *upRun) gapsComponent() *rungroup.Component {
	creg := observe.NewComponentRegistry(r.reg)
	return &rungroup.Component{
		StopTimeout: r.gaps.StopTimeout + 10*time.Second,
		Start: func(context.Context) (rungroup.Instance, error) {
			_, js := r.link()
			cfg := r.gaps
			cfg.Registerer = creg.Renew()
			d, err := gaps.New(cfg, js)
			if err != nil {
				return rungroup.Instance{}, err
			}
			return rungroup.Instance{Run: d.Run, Ready: d.Ready(),
				LogAttrs: []any{"group", cfg.Group, "stale_after", cfg.StaleAfter}}, nil
		},
	}
}

func (r *upRun) mergeComponent() *rungroup.Component {
	creg := observe.NewComponentRegistry(r.reg)
	stop := r.merge.StopTimeout
	if stop == 0 {
		stop = durable.DefaultStopTimeout
	}
	return &rungroup.Component{
		StopTimeout: stop + 10*time.Second,
		Start: func(context.Context) (rungroup.Instance, error) {
			_, js := r.link()
			cfg := r.merge
			cfg.Registerer = creg.Renew()
			m, err := merge.New(cfg, js, r.mergeOpts...)
			if err != nil {
				return rungroup.Instance{}, rungroup.Permanent(fmt.Errorf("%w: %v", errUsage, err))
			}
			return rungroup.Instance{Run: m.Run, Ready: m.Ready(),
				LogAttrs: []any{"output", r.merge.Output, "rank_timeout", r.merge.RankTimeout, "partitions", r.merge.Partitions}}, nil
		},
	}
}

func (r *upRun) sealComponent() *rungroup.Component {
	creg := observe.NewComponentRegistry(r.reg)
	stop := r.seal.StopTimeout
	if stop == 0 {
		stop = durable.DefaultStopTimeout
	}
	return &rungroup.Component{
		StopTimeout: stop + 10*time.Second,
		Start: func(ctx context.Context) (rungroup.Instance, error) {
			_, js := r.link()
			kv, err := seal.OpenBucket(ctx, js, r.scfg)
			if err != nil {
				return rungroup.Instance{}, err
			}
			s, err := seal.NewSealer(kv, seal.WithSource("fpmbus up"))
			if err != nil {
				return rungroup.Instance{}, err
			}
			var opts []durable.Option
			if r.sealOpts != nil {
				opts = r.sealOpts.consumerOptions()
			}
			cfg := r.seal
			cfg.Sealer, cfg.Registerer = s, creg.Renew()
			c, err := seal.New(cfg, js, opts...)
			if err != nil {
				return rungroup.Instance{}, rungroup.Permanent(fmt.Errorf("%w: %v", errUsage, err))
			}
			return rungroup.Instance{Run: c.Run, Ready: c.Ready(), LogAttrs: []any{"bucket", streams.BucketDatasets, "partitions", r.seal.Partitions}}, nil
		},
	}
}

func (r *upRun) bridgeComponent() *rungroup.Component {
	creg := observe.NewComponentRegistry(r.reg)
	return &rungroup.Component{
		StopTimeout: r.bridge.StopTimeout + 10*time.Second,
		Start: func(context.Context) (rungroup.Instance, error) {
			nc, _ := r.link()
			cfg := r.bridge
			cfg.Registerer = creg.Renew()
			b, err := bridge.New(cfg, nc)
			if err != nil {
				return rungroup.Instance{}, err
			}
			return rungroup.Instance{Run: permanentBudget(b.Run), Ready: b.Ready(), LogAttrs: []any{"endpoints", endpointURLs(cfg)}}, nil
		},
	}
}

// upDemoTrace is --demo-trace: the plan, where its sockets bind, and how many ports they span.
type upDemoTrace struct {
	plan  *replay.Plan
	zmq   replay.ZMQConfig
	width int
}

func (r *upRun) publishComponent() *rungroup.Component {
	if t := r.demoTrace; t != nil {
		return &rungroup.Component{
			StopTimeout: 10 * time.Second,
			Start: func(context.Context) (rungroup.Instance, error) {
				rp, err := replay.New(t.plan, replay.Config{ZMQ: t.zmq}, replay.WithLogger(slog.Default()))
				if err != nil {
					return rungroup.Instance{}, rungroup.Permanent(err)
				}
				run := permanentBudget(func(ctx context.Context) error { _, err := rp.Run(ctx); return err })
				return rungroup.Instance{Run: run, Ready: rp.Ready(), LogAttrs: []any{"replay", len(t.plan.Steps), "ranks", len(t.plan.Sockets)}}, nil
			},
		}
	}
	if r.demo == nil {
		return nil
	}
	return &rungroup.Component{
		StopTimeout: 10 * time.Second,
		Start: func(context.Context) (rungroup.Instance, error) {
			p, err := producer.New(*r.demo)
			if be, ok := errors.AsType[*producer.BindError](err); ok {
				// A port another process holds stays held through any number of restarts.
				return rungroup.Instance{}, rungroup.Permanent(fmt.Errorf("%w: --demo: %v", errUsage, be))
			}
			if errors.Is(err, fdbudget.ErrExceeded) {
				return rungroup.Instance{}, rungroup.Permanent(err)
			}
			if err != nil {
				return rungroup.Instance{}, err
			}
			return rungroup.Instance{Run: p.Run, Ready: p.Ready(),
				LogAttrs: []any{"ranks", r.demo.DPSize, "rate", r.demo.Rate, "worker_id", r.demo.WorkerID}}, nil
		},
	}
}

// permanentBudget makes a component that cannot open its sockets for want of file descriptors give up
// at once: no restart raises the limit.
func permanentBudget(run func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		err := run(ctx)
		if errors.Is(err, fdbudget.ErrExceeded) {
			return rungroup.Permanent(err)
		}
		return err
	}
}

// checkSockets checks, before anything starts, that the descriptor limit leaves room for every ZMQ
// socket of the run: the bridge's, and the demo's (the components check again when they open them,
// counting what the server and the consumers hold by then).
func (r *upRun) checkSockets() error {
	subs := len(r.bridge.Endpoints)
	need, what := subs*bridge.DescriptorsPerEndpoint, fmt.Sprintf("%d SUB sockets of the bridge", subs)
	switch {
	case r.demoTrace != nil:
		pubs := 0
		for i := range r.demoTrace.plan.Sockets {
			if r.demoTrace.plan.Sockets[i].Active() {
				pubs++
			}
		}
		need += pubs * (producer.DescriptorsPerSocketCounted + 1)
		what += fmt.Sprintf(" and %d PUB sockets of --demo-trace", pubs)
	case r.demo != nil:
		need += r.demo.DPSize * (producer.DescriptorsPerSocket + 1)
		what += fmt.Sprintf(" and %d PUB sockets of --demo", r.demo.DPSize)
	}
	if err := fdbudget.Check(what, need); err != nil {
		return fmt.Errorf("%w (--dp-size)", err)
	}
	return nil
}
