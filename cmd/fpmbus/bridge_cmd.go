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

// bridgeFlags registers the bridge's flags (bridge/flags.go, unprefixed in every command) on fs, with
// --fpm-port defaulting to DYN_FORWARDPASS_METRIC_PORT. After parsing, config returns the bridge's Config.
func bridgeFlags(fs *flag.FlagSet) (cfg *bridge.Config, config func() (bridge.Config, error)) {
	env := newEnvDefaults(fs)
	cfg = &bridge.Config{BasePort: env.int("fpm-port", envFPMPort, bridge.DefaultFPMPort)}
	f := cfg.RegisterFlags(fs, "")
	if _, set, _ := envValue(envFPMPort); set {
		f.BasePortSource = envFPMPort
	}
	return cfg, func() (bridge.Config, error) {
		if err := env.err(); err != nil {
			return bridge.Config{}, err
		}
		c, err := f.Config()
		if errors.Is(err, bridge.ErrInvalidConfig) {
			return c, fmt.Errorf("%w: %v", errUsage, err)
		}
		return c, err
	}
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
	_, bridgeConfig := bridgeFlags(fs)
	metricsAddr := metricsAddrFlag(fs, "127.0.0.1:9464")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := bridgeConfig()
	if err != nil {
		return err
	}
	if err := scfg.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
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
	if *metricsAddr != "" {
		stop, err := serveMetrics(*metricsAddr, reg, nil)
		if err != nil {
			return err
		}
		defer stop()
	}
	runErr := make(chan error, 1)
	go func() { runErr <- b.Run(ctx) }()
	select {
	case <-b.Ready():
		slog.Info("bridge ready", "endpoints", endpointURLs(cfg), "server", conn.URL,
			"subjects", streams.FPMRoot+"."+streams.EncodeToken(cfg.Namespace)+"."+streams.EncodeToken(cfg.Component)+".>",
			"metrics", *metricsAddr)
	case err := <-runErr:
		return err
	}
	return <-runErr
}
