package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

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

// envFPMPort is Dynamo's base port variable: rank r publishes on port+r.
const envFPMPort = "DYN_FORWARDPASS_METRIC_PORT"

// bridgeOptions holds the bridge's flags, shared with `fpmbus up`. A flag that another component
// already registered on the same FlagSet (--fpm-port and --dp-size by publish, --producer-id and
// --stop-timeout by trace) is not registered twice: the bridge reads that flag, whose meaning is the
// same.
type bridgeOptions struct {
	fs          *flag.FlagSet
	portEnvErr  error // a malformed DYN_FORWARDPASS_METRIC_PORT, reported unless --fpm-port is given
	zmqHost     string
	fpmPort     func() int
	dpSize      func() int
	endpoints   []string
	namespace   string
	component   string
	producerID  func() string
	bridgeID    string
	maxBuffer   int
	maxBufBytes int64
	maxPayload  int
	maxCtlLine  int
	maxInFlight int
	ackTimeout  time.Duration
	stopTimeout func() time.Duration
	metricsAddr string
}

// bridgeFlags registers the bridge's flags on fs.
func bridgeFlags(fs *flag.FlagSet) *bridgeOptions {
	o := &bridgeOptions{fs: fs}
	port, err := envInt(envFPMPort, bridge.DefaultFPMPort)
	if err != nil {
		o.portEnvErr = err
		port = bridge.DefaultFPMPort
	}
	fs.StringVar(&o.zmqHost, "zmq-host", "127.0.0.1", "host of the Dynamo workers' FPM PUB sockets")
	o.fpmPort = sharedInt(fs, "fpm-port", port, "base port: rank r publishes on port+r (env "+envFPMPort+")")
	o.dpSize = sharedInt(fs, "dp-size", 1, "number of data-parallel ranks, one PUB socket each")
	fs.Func("zmq-endpoint", "explicit ZMQ endpoint(s) instead of --zmq-host/--fpm-port/--dp-size; repeat or comma-separate; rank = position", func(v string) error {
		for _, ep := range strings.Split(v, ",") {
			if ep = strings.TrimSpace(ep); ep != "" {
				o.endpoints = append(o.endpoints, ep)
			}
		}
		return nil
	})
	fs.StringVar(&o.namespace, "namespace", bridge.DefaultNamespace, "Dynamo namespace (first subject token)")
	fs.StringVar(&o.component, "component", bridge.DefaultComponent, "Dynamo component (second subject token)")
	o.producerID = sharedString(fs, "producer-id", "", "Fpm-Producer of every FPM (default: each message's worker_id)")
	fs.StringVar(&o.bridgeID, "bridge-id", "", "name of this bridge in headers and drop markers (default hostname-pid)")
	fs.IntVar(&o.maxBuffer, "max-buffer", bridge.DefaultMaxBuffer, "messages held while the broker is slow or away; beyond it new ones are dropped with a drop marker")
	fs.Int64Var(&o.maxBufBytes, "max-buffer-bytes", bridge.DefaultMaxBufferBytes, "bytes held in the buffer, besides --max-buffer messages")
	fs.IntVar(&o.maxPayload, "max-payload", bridge.DefaultMaxPayload, "largest ZMQ frame in bytes; libzmq refuses a larger one unread and the bridge dead-letters it")
	fs.IntVar(&o.maxCtlLine, "max-control-line", bridge.DefaultMaxControlLine, "the NATS server's max_control_line; an FPM whose subject would exceed it is dead-lettered")
	fs.IntVar(&o.maxInFlight, "max-in-flight", bridge.DefaultMaxInFlight, "asynchronous publishes awaiting an ack")
	fs.DurationVar(&o.ackTimeout, "ack-timeout", bridge.DefaultAckTimeout, "how long a publish waits for its ack before it is retried")
	o.stopTimeout = sharedDuration(fs, "stop-timeout", bridge.DefaultStopTimeout, "on interrupt, how long to keep publishing what is buffered")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus /metrics on this address, e.g. 127.0.0.1:9464 (empty: off)")
	return o
}

// sharedInt registers an int flag, or reads the one fs already has under name.
func sharedInt(fs *flag.FlagSet, name string, def int, usage string) func() int {
	if f := fs.Lookup(name); f != nil {
		return func() int { v, _ := f.Value.(flag.Getter).Get().(int); return v }
	}
	p := fs.Int(name, def, usage)
	return func() int { return *p }
}

func sharedString(fs *flag.FlagSet, name, def, usage string) func() string {
	if f := fs.Lookup(name); f != nil {
		return f.Value.String
	}
	p := fs.String(name, def, usage)
	return func() string { return *p }
}

func sharedDuration(fs *flag.FlagSet, name string, def time.Duration, usage string) func() time.Duration {
	if f := fs.Lookup(name); f != nil {
		return func() time.Duration { v, _ := f.Value.(flag.Getter).Get().(time.Duration); return v }
	}
	p := fs.Duration(name, def, usage)
	return func() time.Duration { return *p }
}

// config turns the parsed flags into a validated bridge.Config; problems are usage errors naming the
// flag or variable. Streams is left at its zero value (streams.DefaultConfig()); the caller sets it from
// streamFlags, and sets Registerer and Logger.
func (o *bridgeOptions) config() (bridge.Config, error) {
	cfg := bridge.Config{
		Namespace:      o.namespace,
		Component:      o.component,
		ProducerID:     o.producerID(),
		BridgeID:       o.bridgeID,
		MaxBuffer:      o.maxBuffer,
		MaxBufferBytes: o.maxBufBytes,
		MaxPayload:     o.maxPayload,
		MaxControlLine: o.maxCtlLine,
		MaxInFlight:    o.maxInFlight,
		AckTimeout:     o.ackTimeout,
		StopTimeout:    o.stopTimeout(),
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"max-buffer", int64(o.maxBuffer)}, {"max-buffer-bytes", o.maxBufBytes}, {"max-payload", int64(o.maxPayload)},
		{"max-control-line", int64(o.maxCtlLine)}, {"max-in-flight", int64(o.maxInFlight)},
		{"ack-timeout", int64(o.ackTimeout)}, {"stop-timeout", int64(cfg.StopTimeout)}} {
		if f.v <= 0 {
			return cfg, fmt.Errorf("%w: --%s must be positive", errUsage, f.name)
		}
	}
	if strings.TrimSpace(o.namespace) == "" || strings.TrimSpace(o.component) == "" {
		return cfg, fmt.Errorf("%w: --namespace and --component must not be blank", errUsage)
	}
	if len(o.endpoints) > 0 {
		for _, name := range []string{"zmq-host", "fpm-port", "dp-size"} {
			if flagGiven(o.fs, name) {
				return cfg, fmt.Errorf("%w: --zmq-endpoint and --%s exclude each other", errUsage, name)
			}
		}
		for rank, ep := range o.endpoints {
			if !strings.Contains(ep, "://") {
				if _, _, err := net.SplitHostPort(ep); err != nil {
					return cfg, fmt.Errorf("%w: --zmq-endpoint %q: want tcp://host:port or host:port", errUsage, ep)
				}
				ep = "tcp://" + ep
			}
			cfg.Endpoints = append(cfg.Endpoints, bridge.Endpoint{URL: ep, DPRank: rank})
		}
	} else {
		if o.portEnvErr != nil && !flagGiven(o.fs, "fpm-port") {
			return cfg, o.portEnvErr
		}
		port, dp := o.fpmPort(), o.dpSize()
		if dp < 1 {
			return cfg, fmt.Errorf("%w: --dp-size %d: want at least 1", errUsage, dp)
		}
		if port < 1 || port+dp-1 > 65535 {
			src := "--fpm-port"
			if !flagGiven(o.fs, "fpm-port") {
				src = envFPMPort
			}
			return cfg, fmt.Errorf("%w: %s %d with --dp-size %d: ports must stay within 1..65535", errUsage, src, port, dp)
		}
		cfg.Endpoints = bridge.EndpointsFor(o.zmqHost, port, dp)
		cfg.BasePort, cfg.DPSize = port, dp
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("%w: %v", errUsage, err)
	}
	return cfg, nil
}

// serveMetrics serves g on addr at /metrics until stop is called. It returns once the listener is open,
// so a bad address is reported at start.
func serveMetrics(addr string, g prometheus.Gatherer) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("metrics server", "error", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

func runBridge(ctx context.Context, args []string) error {
	fs := newFlagSet("bridge", "bridge [--server URL] [--zmq-host H --fpm-port P --dp-size N | --zmq-endpoint URL,…] [--metrics-addr ADDR] …")
	conn := connFlags(fs, "bridge")
	scfg := streamFlags(fs)
	bopts := bridgeFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := bopts.config()
	if err != nil {
		return err
	}
	if err := scfg.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	cfg.Streams = *scfg
	cfg.Logger = slog.Default()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Registerer = reg

	nc, err := streams.Connect(*conn)
	if err != nil {
		return err
	}
	defer nc.Close() // after Run: the bridge has published or accounted for everything
	b, err := bridge.New(cfg, nc)
	if err != nil {
		return err
	}
	if bopts.metricsAddr != "" {
		stop, err := serveMetrics(bopts.metricsAddr, reg)
		if err != nil {
			return fmt.Errorf("%w: --metrics-addr %q: %v", errUsage, bopts.metricsAddr, err)
		}
		defer stop()
	}
	runErr := make(chan error, 1)
	go func() { runErr <- b.Run(ctx) }()
	select {
	case <-b.Ready():
		urls := make([]string, len(cfg.Endpoints))
		for i, ep := range cfg.Endpoints {
			urls[i] = ep.URL
		}
		slog.Info("bridge ready", "endpoints", strings.Join(urls, ","), "server", conn.URL,
			"subjects", streams.FPMRoot+"."+streams.EncodeToken(cfg.Namespace)+"."+streams.EncodeToken(cfg.Component)+".>",
			"metrics", bopts.metricsAddr)
	case err := <-runErr:
		return err
	}
	return <-runErr
}
