package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/bridge"
	"github.com/fpmbus/fpmbus/internal/edgenode"
	"github.com/fpmbus/fpmbus/internal/envflag"
	"github.com/fpmbus/fpmbus/internal/flagprefix"
	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/observe"
	"github.com/fpmbus/fpmbus/streams"
)

func init() {
	register(command{
		name:    "bridge",
		summary: "move FPMs from Dynamo's ZMQ PUB sockets onto the FPM stream (JetStream)",
		run:     runBridge,
	})
}

// bridgeOptions are the bridge's flags (defined in bridge/flags.go, unprefixed in every command), with
// --fpm-port defaulting to DYN_FORWARDPASS_METRIC_PORT.
type bridgeOptions struct {
	cfg   *bridge.Config // the flags write here; `up --demo` sets its default rank count
	flags *bridge.Flags
	env   *envflag.Defaults
}

func bridgeFlags(fs *flag.FlagSet) *bridgeOptions {
	o := &bridgeOptions{env: environment.Defaults(fs)}
	o.cfg = &bridge.Config{BasePort: o.env.Int("fpm-port", envFPMPort, bridge.DefaultFPMPort)}
	o.flags = o.cfg.RegisterFlags(fs, "")
	if _, set, _ := environment.Value(envFPMPort); set {
		o.flags.BasePortSource = envFPMPort
	}
	return o
}

// config returns the bridge's Config once the flags are parsed; a bad value is a usage error naming the
// flag or the variable.
func (o *bridgeOptions) config() (bridge.Config, error) {
	if err := o.env.Err(); err != nil {
		return bridge.Config{}, err
	}
	c, err := o.flags.Config()
	return c, usageError(err, bridge.ErrInvalidConfig)
}

func runBridge(ctx context.Context, args []string) error {
	fs := newFlagSet("bridge", "bridge [--server URL] [--zmq-host H --fpm-port P --dp-size N | --zmq-endpoint URL,…] [--metrics-addr ADDR] …")
	conn := connFlags(fs, "bridge")
	scfg := streamFlags(fs)
	bopts := bridgeFlags(fs)
	edgeFlags := bridge.RegisterEdgeFlags(fs)
	metricsAddr := metricsAddrFlag(fs, "127.0.0.1:9464")
	cfg, err := parseStage(fs, args, scfg, bopts.config)
	if err != nil {
		return err
	}
	cfg.Streams = *scfg
	cfg.Logger = slog.Default()
	reg := observe.NewProcessRegistry()
	cfg.Registerer = reg

	ecfg, err := edgeFlags.Config()
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	nc, closeConn, edge, err := bridgeConn(ctx, fs, conn, ecfg, *scfg)
	if err != nil {
		return err
	}
	defer closeConn() // after Run: the bridge has published or accounted for everything
	b, err := bridge.New(cfg, nc)
	if err != nil {
		return err
	}
	var edgeFailed <-chan error // nil without an edge: never
	var checks []func() error
	if edge != nil {
		// The edge's own disk is the bridge's store, as the embedded server's is `up`'s: a full one
		// degrades the bridge (the store watch restarts JetStream once there is room; restarting the
		// bridge would not free it), and its state is in fpmbus_store_* and the status's store.
		edgeFailed = edge.Failed()
		store := edge.Server().StoreStatus
		natsserver.RegisterStoreMetrics(reg, store)
		checks = append(checks, func() error { return store().Err() })
	}
	done := make(chan struct{})
	defer close(done)
	so := observe.Standalone("bridge", "bridge", reg, nc, b.Ready(), done, nil, true, checks...)
	so.Bridge = &observe.BridgeRef{Component: "bridge", Ranks: len(cfg.Endpoints), MaxBuffer: cfg.MaxBuffer, MaxInFlight: cfg.MaxInFlight}
	stop, err := serveStatus(*metricsAddr, so)
	if err != nil {
		return err
	}
	defer stop()
	rctx, finishConn := natsconn.Watch(ctx, nc)
	// An edge the central server can never source (central FPM shards), or whose store was deleted, stops
	// the bridge with its reason.
	rctx, refuse := context.WithCancelCause(rctx)
	defer refuse(nil)
	go func() {
		select {
		case err := <-edgeFailed:
			refuse(err)
		case <-rctx.Done():
		}
	}()
	finish := func(err error) error {
		if cause := context.Cause(rctx); errors.Is(cause, bridge.ErrEdgeShards) || errors.Is(cause, natsserver.ErrStoreLost) {
			return cause
		}
		return finishConn(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- b.Run(rctx) }()
	select {
	case <-b.Ready():
		slog.Info("bridge ready", "endpoints", cfg.EndpointURLs(), "server", natsconn.RedactURL(nc.ConnectedUrl()),
			"subjects", streams.FPMRoot+"."+streams.EncodeToken(cfg.Namespace)+"."+streams.EncodeToken(cfg.Component)+".>",
			"metrics", *metricsAddr)
	case err := <-runErr:
		return finish(err)
	}
	return finish(<-runErr)
}

// bridgeConn connects the bridge: to --server, or with --edge-dir to its node-local edge server (see
// bridge.Edge), which it starts. The bridge applies the streams itself, retrying while the broker is
// away: connect only. closeConn closes the connection (and shuts the edge server down). edge is the
// edge server (nil without --edge-dir).
func bridgeConn(ctx context.Context, fs *flag.FlagSet, conn *connOptions, ecfg edgenode.EdgeConfig, scfg streams.Config) (*nats.Conn, func(), *bridge.Edge, error) {
	if ecfg.StoreDir == "" {
		nc, _, err := connectAndApply(ctx, conn, nil)
		if err != nil {
			return nil, nil, nil, err
		}
		return nc, nc.Close, nil, nil
	}
	if flagprefix.Given(fs, "server") {
		return nil, nil, nil, fmt.Errorf("%w: --server and --edge-dir: the edge bridge publishes to its own server, a leaf node of --edge-remote", errUsage)
	}
	edge, err := bridge.StartEdge(ecfg, scfg, slog.Default())
	if err != nil {
		return nil, nil, nil, err
	}
	slog.Info("edge server ready", "domain", ecfg.Domain(), "store", ecfg.StoreDir, "client_url", edge.Server().ClientURL(),
		"central_domain", ecfg.CentralDomainOrDefault())
	return edge.Conn(), func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := edge.Close(sctx); err != nil {
			slog.Warn("edge server shutdown", "err", err)
		}
	}, edge, nil
}
