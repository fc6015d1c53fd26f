package upstack

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

// Stage is one component of `fpmbus up`. Stages lists them in start order; they stop in reverse
// order. The README's order table is generated from the same list (OrderTable) and a test compares
// the two.
type Stage struct {
	Name  string
	Ready string   // when it counts as ready (README)
	Stop  string   // what stopping it does (README)
	Needs []string // components it is built on: their restart restarts it
	// build returns the component for this run (Disabled: the trace writer with an invalid setting), or
	// nil when the run does not include it (the demo publishers without --demo).
	build func(r *Run) *rungroup.Component
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

// Stages is `fpmbus up`, in start order. The consumers start before the bridge so that their durable
// consumers exist when the first FPM is stored; the demo publishers start last, once the bridge's SUB
// sockets are connecting. Stopping runs backwards: nothing new enters (publishers, then the bridge
// publishes what it buffered), the consumers finish what they received, the connection drains, the
// server flushes.
var Stages = []Stage{
	{Name: stageServer, Ready: "accepts clients on `--listen` (or `--server-config`'s), authenticating them as configured; store in `<data-dir>/jetstream`",
		Stop: "shuts down: JetStream flushes its store to disk", build: (*Run).serverComponent},
	{Name: stageConn, Ready: "connected in-process with the components' credentials, streams applied", Needs: []string{stageServer},
		Stop: "drained: every ack and publish in flight completes", build: (*Run).connComponent},
	{Name: stageTrace, Ready: "output repaired, durable declared, fetching", Needs: []string{stageConn},
		Stop: "writes what it received, fsyncs, acks (`--trace-stop-timeout`)", build: (*Run).traceComponent},
	{Name: stageGaps, Ready: "joined its group, reading", Needs: []string{stageConn},
		Stop: "checkpoints its publishers, publishes their events, acks (`--gaps-stop-timeout`)", build: (*Run).gapsComponent},
	{Name: stageMerge, Ready: "joined its group, taking partitions", Needs: []string{stageConn},
		Stop: "hands its partitions on: the ranks of unfinished runs go, unacked, to the next owner", build: (*Run).mergeComponent},
	{Name: stageSeal, Ready: "bucket `FPM_DATASETS` open, joined its group, taking partitions", Needs: []string{stageConn},
		Stop: "hands its partitions on: a held or unsettled artefact goes, unacked, to the next owner", build: (*Run).sealComponent},
	{Name: stagePredict, Ready: "bucket `FPM_DATASETS` loaded, endpoints on `fpmpredict.>` subscribed", Needs: []string{stageConn},
		Stop: "stops answering: its subscriptions drain, requests in hand are answered", build: (*Run).predictComponent},
	{Name: stageBridge, Ready: "ZMQ sockets connecting, streams applied", Needs: []string{stageConn},
		Stop: "stops reading ZMQ, publishes what it buffered (`--stop-timeout`); the rest is counted as dropped", build: (*Run).bridgeComponent},
	{Name: stagePublish, Ready: "`--demo` only: sockets bound, start delay over",
		Stop: "stops generating, flushes its queues, closes the sockets", build: (*Run).publishComponent},
}

// OrderTable renders Stages as the README's order table.
func OrderTable() string {
	var b strings.Builder
	b.WriteString("| start | stop | component | needs | ready when | on stop |\n|---|---|---|---|---|---|\n")
	for i, s := range Stages {
		fmt.Fprintf(&b, "| %d | %d | %s | %s | %s | %s |\n", i+1, len(Stages)-i, s.Name, strings.Join(s.Needs, ", "), s.Ready, s.Stop)
	}
	return b.String()
}

// Run is one run of `fpmbus up`: the validated settings and what the components share.
type Run struct {
	// MemberID names this `fpmbus up` in its consumer groups, the same across restarts (partition.StableMemberID).
	MemberID string
	Listen   string
	StoreDir string
	Server   *Server
	Streams  streams.Config
	Registry prometheus.Registerer
	Policy   rungroup.Policy
	Trace    *trace.Config // nil: the trace writer is disabled, for TraceDisabled
	// TraceDisabled is why the trace writer does not run (an invalid setting, an unwritable output).
	TraceDisabled string
	Gaps          gaps.Config
	Merge         merge.Config
	// MergeOptions are the merger's options from the flags (member id).
	MergeOptions []durable.Option
	Seal         seal.Config
	// SealOptions are the sealer's options from the flags (member id).
	SealOptions []durable.Option
	Predict     service.Config
	Bridge      bridge.Config
	Demo        *producer.Config // nil: no --demo, or --demo-trace
	// DemoTrace replays a recording as the demo's load (--demo --demo-trace).
	DemoTrace *DemoTrace

	// Abort stops the whole run with a cause no restart can fix (the store lost); the caller returns it.
	Abort context.CancelCauseFunc

	mu        sync.Mutex // guards srv, the link and connected: replaced by their components' restarts
	srv       *natsserver.Server
	nc        *nats.Conn
	js        jetstream.JetStream
	connected bool // the components have connected once: their credentials were accepted
}

// Components builds the run's list from Stages.
func (r *Run) Components() []rungroup.Component {
	var cs []rungroup.Component
	for _, s := range Stages {
		c := s.build(r)
		if c == nil {
			continue
		}
		c.Name, c.Needs, c.Restart = s.Name, s.Needs, r.Policy
		cs = append(cs, *c)
	}
	return cs
}

// StatusOptions is what `up`'s --metrics-addr serves: the whole process's registry, the run group's
// health and JetStream's view, through the current connection; the caller adds the gap detector's
// publishers (observe.Options.Publishers).
func (r *Run) StatusOptions(reg prometheus.Gatherer, g *rungroup.Group) observe.Options {
	o := observe.Options{Process: "up", Gatherer: reg, Components: g.Status,
		JetStream: func() jetstream.JetStream { _, js := r.Link(); return js }, ListJetStream: true,
		Sync:   r.Server.Config.EffectiveSync().String(),
		Bridge: &observe.BridgeRef{Component: stageBridge, Ranks: len(r.Bridge.Endpoints), MaxBuffer: r.Bridge.MaxBuffer, MaxInFlight: r.Bridge.MaxInFlight},
		Consumers: []observe.ConsumerRef{
			{Label: gaps.ConsumerName, Component: stageGaps, Group: r.Gaps.Group},
			{Label: merge.ConsumerName, Component: stageMerge, Group: r.Merge.Durable},
			{Label: seal.ConsumerName, Component: stageSeal, Group: r.Seal.Durable},
		}}
	if r.Trace != nil {
		o.Consumers = append(o.Consumers, observe.ConsumerRef{Label: trace.ConsumerName, Component: stageTrace, Group: r.Trace.Group})
	}
	return o
}

// Link returns the connection current components are built on.
func (r *Run) Link() (*nats.Conn, jetstream.JetStream) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nc, r.js
}

func (r *Run) serverComponent() *rungroup.Component {
	natsserver.RegisterStoreMetrics(r.Registry, r.storeStatus)
	return &rungroup.Component{
		StopTimeout: 35 * time.Second,
		Start: func(context.Context) (rungroup.Instance, error) {
			srv, err := natsserver.StartServer(r.Server.Config)
			if err != nil {
				if errors.Is(err, natsserver.ErrListen) {
					// Restarting would find the address as taken as now: stop, naming it.
					return rungroup.Instance{}, rungroup.Permanent(fmt.Errorf("%w: %v", ErrUsage, err))
				}
				return rungroup.Instance{}, err
			}
			r.mu.Lock()
			r.srv = srv
			r.mu.Unlock()
			return rungroup.Instance{
				LogAttrs: []any{"url", srv.ClientURL(), "store", r.StoreDir, "auth", r.Server.Auth, "sync", r.Server.Config.EffectiveSync().String()},
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
							r.Abort(err)
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

func (r *Run) connComponent() *rungroup.Component {
	return &rungroup.Component{
		StopTimeout: 15 * time.Second,
		Start: func(ctx context.Context) (rungroup.Instance, error) {
			r.mu.Lock()
			cfg := r.Server.Conn
			cfg.InProcess, cfg.Name, cfg.ConnectTimeout = r.srv, "fpmbus-up", 10*time.Second
			connectedOnce := r.connected
			r.mu.Unlock()
			nc, js, err := natsconn.ConnectAndEnsure(ctx, cfg, &r.Streams, CredentialFlags)
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

func (r *Run) traceComponent() *rungroup.Component {
	if r.Trace == nil {
		return &rungroup.Component{Disabled: r.TraceDisabled}
	}
	creg := observe.NewComponentRegistry(r.Registry)
	segs := trace.NewProcessSegments() // a restarted incarnation continues its producers' segments
	return &rungroup.Component{
		StopTimeout: r.Trace.StopTimeout + 10*time.Second,
		Start: func(context.Context) (rungroup.Instance, error) {
			_, js := r.Link()
			cfg := *r.Trace
			cfg.Registerer, cfg.Segments = creg.Renew(), segs
			w, err := trace.New(cfg, js, durable.WithMemberID(r.MemberID))
			if err != nil {
				return rungroup.Instance{}, err
			}
			return rungroup.Instance{Run: w.Run, Ready: w.Ready(),
				LogAttrs: []any{"mode", cfg.Mode, "output", cfg.OutputPath, "group", cfg.Group, "member", r.MemberID}}, nil
		},
	}
}

func (r *Run) gapsComponent() *rungroup.Component {
	creg := observe.NewComponentRegistry(r.Registry)
	return &rungroup.Component{
		StopTimeout: r.Gaps.StopTimeout + 10*time.Second,
		Start: func(context.Context) (rungroup.Instance, error) {
			_, js := r.Link()
			cfg := r.Gaps
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

func (r *Run) mergeComponent() *rungroup.Component {
	creg := observe.NewComponentRegistry(r.Registry)
	stop := r.Merge.StopTimeout
	if stop == 0 {
		stop = durable.DefaultStopTimeout
	}
	return &rungroup.Component{
		StopTimeout: stop + 10*time.Second,
		Start: func(context.Context) (rungroup.Instance, error) {
			_, js := r.Link()
			cfg := r.Merge
			cfg.Registerer = creg.Renew()
			m, err := merge.New(cfg, js, r.MergeOptions...)
			if err != nil {
				return rungroup.Instance{}, rungroup.Permanent(fmt.Errorf("%w: %v", ErrUsage, err))
			}
			return rungroup.Instance{Run: m.Run, Ready: m.Ready(),
				LogAttrs: []any{"output", r.Merge.Output, "rank_timeout", r.Merge.RankTimeout, "partitions", r.Merge.Partitions}}, nil
		},
	}
}

func (r *Run) sealComponent() *rungroup.Component {
	creg := observe.NewComponentRegistry(r.Registry)
	stop := r.Seal.StopTimeout
	if stop == 0 {
		stop = durable.DefaultStopTimeout
	}
	return &rungroup.Component{
		StopTimeout: stop + 10*time.Second,
		Start: func(ctx context.Context) (rungroup.Instance, error) {
			_, js := r.Link()
			kv, err := seal.OpenBucket(ctx, js, r.Streams)
			if err != nil {
				return rungroup.Instance{}, err
			}
			s, err := seal.NewSealer(kv, seal.WithSource("fpmbus up"))
			if err != nil {
				return rungroup.Instance{}, err
			}
			opts := r.SealOptions
			cfg := r.Seal
			cfg.Sealer, cfg.Registerer = s, creg.Renew()
			c, err := seal.New(cfg, js, opts...)
			if err != nil {
				return rungroup.Instance{}, rungroup.Permanent(fmt.Errorf("%w: %v", ErrUsage, err))
			}
			return rungroup.Instance{Run: c.Run, Ready: c.Ready(), LogAttrs: []any{"bucket", streams.BucketDatasets, "partitions", r.Seal.Partitions}}, nil
		},
	}
}

func (r *Run) predictComponent() *rungroup.Component {
	creg := observe.NewComponentRegistry(r.Registry)
	return &rungroup.Component{
		StopTimeout: 15 * time.Second,
		Start: func(ctx context.Context) (rungroup.Instance, error) {
			nc, js := r.Link()
			kv, err := seal.OpenBucket(ctx, js, r.Streams)
			if err != nil {
				return rungroup.Instance{}, err
			}
			s, err := service.New(r.Predict, nc, kv, service.WithRegisterer(creg.Renew()))
			if err != nil {
				return rungroup.Instance{}, rungroup.Permanent(fmt.Errorf("%w: %v", ErrUsage, err))
			}
			return rungroup.Instance{Run: s.Run, Ready: s.Ready(),
				LogAttrs: []any{"service", service.Name, "subject", service.SubjectPredict, "queue_group", r.Predict.QueueGroup, "bucket", streams.BucketDatasets}}, nil
		},
	}
}

func (r *Run) bridgeComponent() *rungroup.Component {
	creg := observe.NewComponentRegistry(r.Registry)
	return &rungroup.Component{
		StopTimeout: r.Bridge.StopTimeout + 10*time.Second,
		Start: func(context.Context) (rungroup.Instance, error) {
			nc, _ := r.Link()
			cfg := r.Bridge
			cfg.Registerer = creg.Renew()
			b, err := bridge.New(cfg, nc)
			if err != nil {
				return rungroup.Instance{}, err
			}
			return rungroup.Instance{Run: permanentBudget(b.Run), Ready: b.Ready(), LogAttrs: []any{"endpoints", cfg.EndpointURLs()}}, nil
		},
	}
}

// DemoTrace is --demo-trace: the plan, where its sockets bind, and how many ports they span.
type DemoTrace struct {
	Plan  *replay.Plan
	ZMQ   replay.ZMQConfig
	Width int
}

func (r *Run) publishComponent() *rungroup.Component {
	if t := r.DemoTrace; t != nil {
		return &rungroup.Component{
			StopTimeout: 10 * time.Second,
			Start: func(context.Context) (rungroup.Instance, error) {
				rp, err := replay.New(t.Plan, replay.Config{ZMQ: t.ZMQ}, replay.WithLogger(slog.Default()))
				if err != nil {
					return rungroup.Instance{}, rungroup.Permanent(err)
				}
				run := permanentBudget(func(ctx context.Context) error { _, err := rp.Run(ctx); return err })
				return rungroup.Instance{Run: run, Ready: rp.Ready(), LogAttrs: []any{"replay", len(t.Plan.Steps), "ranks", len(t.Plan.Sockets)}}, nil
			},
		}
	}
	if r.Demo == nil {
		return nil
	}
	return &rungroup.Component{
		StopTimeout: 10 * time.Second,
		Start: func(context.Context) (rungroup.Instance, error) {
			p, err := producer.New(*r.Demo)
			if be, ok := errors.AsType[*producer.BindError](err); ok {
				// A port another process holds stays held through any number of restarts.
				return rungroup.Instance{}, rungroup.Permanent(fmt.Errorf("%w: --demo: %v", ErrUsage, be))
			}
			if errors.Is(err, fdbudget.ErrExceeded) {
				return rungroup.Instance{}, rungroup.Permanent(err)
			}
			if err != nil {
				return rungroup.Instance{}, err
			}
			return rungroup.Instance{Run: p.Run, Ready: p.Ready(),
				LogAttrs: []any{"ranks", r.Demo.DPSize, "rate", r.Demo.Rate, "worker_id", r.Demo.WorkerID}}, nil
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

// CheckSockets checks, before anything starts, that the descriptor limit leaves room for every ZMQ
// socket of the run: the bridge's, and the demo's (the components check again when they open them,
// counting what the server and the consumers hold by then).
func (r *Run) CheckSockets() error {
	subs := len(r.Bridge.Endpoints)
	need, what := subs*bridge.DescriptorsPerEndpoint, fmt.Sprintf("%d SUB sockets of the bridge", subs)
	switch {
	case r.DemoTrace != nil:
		pubs := 0
		for i := range r.DemoTrace.Plan.Sockets {
			if r.DemoTrace.Plan.Sockets[i].Active() {
				pubs++
			}
		}
		need += pubs * (producer.DescriptorsPerSocketCounted + 1)
		what += fmt.Sprintf(" and %d PUB sockets of --demo-trace", pubs)
	case r.Demo != nil:
		need += r.Demo.DPSize * (producer.DescriptorsPerSocket + 1)
		what += fmt.Sprintf(" and %d PUB sockets of --demo", r.Demo.DPSize)
	}
	if err := fdbudget.Check(what, need); err != nil {
		return fmt.Errorf("%w (--dp-size)", err)
	}
	return nil
}
