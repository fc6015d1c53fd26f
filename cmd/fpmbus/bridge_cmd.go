package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"

	"github.com/fpmbus/fpmbus/bridge"
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
	env   *envDefaults
}

func bridgeFlags(fs *flag.FlagSet) *bridgeOptions {
	o := &bridgeOptions{env: newEnvDefaults(fs)}
	o.cfg = &bridge.Config{BasePort: o.env.int("fpm-port", envFPMPort, bridge.DefaultFPMPort)}
	o.flags = o.cfg.RegisterFlags(fs, "")
	if _, set, _ := envValue(envFPMPort); set {
		o.flags.BasePortSource = envFPMPort
	}
	return o
}

// config returns the bridge's Config once the flags are parsed; a bad value is a usage error naming the
// flag or the variable.
func (o *bridgeOptions) config() (bridge.Config, error) {
	if err := o.env.err(); err != nil {
		return bridge.Config{}, err
	}
	c, err := o.flags.Config()
	if errors.Is(err, bridge.ErrInvalidConfig) {
		return c, fmt.Errorf("%w: %v", errUsage, err)
	}
	return c, err
}

// endpointURLs lists the bridge's endpoints for its ready log line.
func endpointURLs(cfg bridge.Config) string {
	urls := make([]string, len(cfg.Endpoints))
	for i, ep := range cfg.Endpoints {
		urls[i] = ep.URL
	}
	return strings.Join(urls, ",")
}

func runBridge(ctx context.Context, args []string) error {
	fs := newFlagSet("bridge", "bridge [--server URL] [--zmq-host H --fpm-port P --dp-size N | --zmq-endpoint URL,…] [--metrics-addr ADDR] …")
	conn := connFlags(fs, "bridge")
	scfg := streamFlags(fs)
	bopts := bridgeFlags(fs)
	metricsAddr := metricsAddrFlag(fs, "127.0.0.1:9464")
	cfg, err := parseStage(fs, args, scfg, bopts.config)
	if err != nil {
		return err
	}
	cfg.Streams = *scfg
	cfg.Logger = slog.Default()
	reg := newProcessRegistry()
	cfg.Registerer = reg

	// The bridge applies the streams itself, retrying while the broker is away: connect only.
	nc, _, err := connectAndApply(ctx, conn, nil)
	if err != nil {
		return err
	}
	defer nc.Close() // after Run: the bridge has published or accounted for everything
	b, err := bridge.New(cfg, nc)
	if err != nil {
		return err
	}
	stop, err := serveMetrics(*metricsAddr, reg, nil)
	if err != nil {
		return err
	}
	defer stop()
	rctx, finish := watchConn(ctx, nc)
	runErr := make(chan error, 1)
	go func() { runErr <- b.Run(rctx) }()
	select {
	case <-b.Ready():
		slog.Info("bridge ready", "endpoints", endpointURLs(cfg), "server", streams.RedactURL(nc.ConnectedUrl()),
			"subjects", streams.FPMRoot+"."+streams.EncodeToken(cfg.Namespace)+"."+streams.EncodeToken(cfg.Component)+".>",
			"metrics", *metricsAddr)
	case err := <-runErr:
		return finish(err)
	}
	return finish(<-runErr)
}
