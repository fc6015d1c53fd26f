package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/fpmbus/fpmbus/bridge"
	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/consumers/merge"
	"github.com/fpmbus/fpmbus/consumers/seal"
	"github.com/fpmbus/fpmbus/consumers/trace"
	"github.com/fpmbus/fpmbus/producer"
	"github.com/fpmbus/fpmbus/streams"
)

func init() {
	register(command{
		name:    "up",
		summary: "run everything in one process on an embedded JetStream server (--demo adds synthetic ranks)",
		run:     runUp,
	})
}

// demoDPSize is the number of synthetic ranks `up --demo` runs unless --dp-size says otherwise.
const demoDPSize = 4

// stage is one running component of `up`. Stages stop in reverse start order, each with its own
// context, so a later stage (the bridge) is drained before an earlier one's consumers stop.
type stage struct {
	name   string
	cancel context.CancelFunc
	done   chan error
}

// runUp runs the embedded server, the bridge and the consumers until ctx ends, then stops them in the
// order: demo publishers, bridge (publishes what it buffered), dataset sealer, benchmark merger, gap detector (checkpoints), trace writer
// (flushes, fsyncs, acks), NATS connection (drained), server (JetStream flushed to disk).
func runUp(ctx context.Context, args []string) error {
	fs := newFlagSet("up", "up [--demo] [--listen HOST:PORT] [--data-dir DIR] [bridge, trace, gaps, merge and seal flags]")
	listen := fs.String("listen", streams.DefaultListen, "client address of the embedded JetStream server (loopback by default)")
	dataDir := fs.String("data-dir", ".fpmbus", "where the embedded server keeps its store (<data-dir>/jetstream)")
	demo := fs.Bool("demo", false, "also run synthetic Dynamo publishers (one ZMQ PUB per DP rank; --dp-size defaults to 4)")
	demoRate := fs.Float64("demo-rate", 20, "with --demo: forward passes per second per rank")
	demoWorker := fs.String("demo-worker-id", "demo-worker", "with --demo: worker_id of the synthetic publishers")
	demoSeed := fs.Int64("demo-seed", 1, "with --demo: seed of the synthetic load")
	scfg := streamFlags(fs)
	topts := traceFlags(fs)
	gopts := gapsFlags(fs)
	mopts := mergeFlags(fs)
	sopts := sealFlags(fs)
	bopts := bridgeFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *demo && !flagGiven(fs, "dp-size") && len(bopts.endpoints) == 0 {
		if err := fs.Set("dp-size", fmt.Sprint(demoDPSize)); err != nil {
			return err
		}
	}
	bcfg, err := bopts.config()
	if err != nil {
		return err
	}
	if err := scfg.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	gcfg, err := gopts.config()
	if err != nil {
		return err
	}
	mcfg, err := mopts.config()
	if err != nil {
		return err
	}
	// An invalid trace setting disables only the trace writer, with one warning, as Dynamo does.
	tcfg, traceErr := topts.config()
	if traceErr == nil {
		traceErr = trace.ProbeOutput(tcfg.OutputPath)
	}
	if traceErr != nil {
		slog.Warn("trace writer disabled; the bridge and other consumers run on", "reason", traceErr)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if bopts.metricsAddr != "" {
		stop, err := serveMetrics(bopts.metricsAddr, reg)
		if err != nil {
			return fmt.Errorf("%w: --metrics-addr %q: %v", errUsage, bopts.metricsAddr, err)
		}
		defer stop()
	}

	storeDir := filepath.Join(*dataDir, "jetstream")
	if err := os.MkdirAll(storeDir, 0o755); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	srv, err := streams.StartServer(streams.ServerConfig{Listen: *listen, StoreDir: storeDir})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			slog.Error("server shutdown", "error", err)
		}
	}()
	slog.Info("jetstream ready", "url", srv.ClientURL(), "store", storeDir)

	nc, err := nats.Connect(srv.ClientURL(), nats.Name("fpmbus-up"), nats.MaxReconnects(-1), nats.ReconnectBufSize(-1))
	if err != nil {
		return err
	}
	defer func() {
		// Drain: every ack and publish still in flight completes before the connection closes.
		closed := make(chan struct{})
		nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
		if err := nc.Drain(); err != nil {
			nc.Close()
			return
		}
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			nc.Close()
		}
	}()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = streams.Apply(actx, js, *scfg)
	cancel()
	if err != nil {
		return err
	}

	var stages []*stage
	startStage := func(name string, ready <-chan struct{}, run func(context.Context) error, attrs ...any) error {
		sctx, cancel := context.WithCancel(context.Background())
		st := &stage{name: name, cancel: cancel, done: make(chan error, 1)}
		go func() { st.done <- run(sctx) }()
		select {
		case <-ready:
			slog.Info(name+" ready", attrs...)
			stages = append(stages, st)
			return nil
		case err := <-st.done:
			cancel()
			return fmt.Errorf("%s: %w", name, err)
		case <-ctx.Done():
			stages = append(stages, st)
			return ctx.Err()
		}
	}
	stopAll := func() error {
		var errs []error
		for i := len(stages) - 1; i >= 0; i-- {
			st := stages[i]
			st.cancel()
			if err := <-st.done; err != nil && !errors.Is(err, context.Canceled) {
				errs = append(errs, fmt.Errorf("%s: %w", st.name, err))
			}
			slog.Info(st.name + " stopped")
		}
		return errors.Join(errs...)
	}

	err = func() error {
		if traceErr == nil {
			tcfg.Registerer = reg
			w, err := trace.New(tcfg, js, trace.WithLogger(slog.Default()), trace.WithMemberID(upMemberID(*dataDir)))
			if err != nil {
				slog.Warn("trace writer disabled; the bridge and other consumers run on", "reason", err)
			} else if err := startStage("trace writer", w.Ready(), w.Run, "mode", tcfg.Mode, "output", tcfg.OutputPath, "group", tcfg.Group); err != nil {
				return err
			}
		}
		gcfg.Registerer = reg
		d, err := gaps.New(gcfg, js, gaps.WithLogger(slog.Default()))
		if err != nil {
			return err
		}
		if err := startStage("gap detector", d.Ready(), d.Run, "group", gcfg.Group, "stale_after", gcfg.StaleAfter); err != nil {
			return err
		}
		mcfg.Streams = scfg
		mcfg.Logger = slog.Default()
		m, err := merge.New(js, mcfg)
		if err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		mergeReady := make(chan struct{})
		close(mergeReady) // the merger has no warm-up: it is ready once its durable exists, inside Run
		if err := startStage("benchmark merger", mergeReady, m.Run, "output", mcfg.Output, "rank_timeout", mcfg.RankTimeout); err != nil {
			return err
		}
		octx, ocancel := context.WithTimeout(ctx, 30*time.Second)
		kv, err := seal.OpenBucket(octx, js, *scfg)
		ocancel()
		if err != nil {
			return err
		}
		sealer, err := seal.New(kv, seal.WithSource("fpmbus up"))
		if err != nil {
			return err
		}
		sc, err := seal.NewConsumer(js, sealer, seal.ConsumerConfig{Durable: sopts.durable, AllowPartial: sopts.allowPartial,
			ProfileWait: sopts.profileWait, AckWait: sopts.ackWait, Streams: *scfg})
		if err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		if err := startStage("dataset sealer", mergeReady, sc.Run, "bucket", streams.BucketDatasets); err != nil {
			return err
		}
		bcfg.Streams = *scfg
		bcfg.Registerer = reg
		bcfg.Logger = slog.Default()
		b, err := bridge.New(bcfg, nc)
		if err != nil {
			return err
		}
		urls := make([]string, len(bcfg.Endpoints))
		for i, ep := range bcfg.Endpoints {
			urls[i] = ep.URL
		}
		if err := startStage("bridge", b.Ready(), b.Run, "endpoints", strings.Join(urls, ","), "metrics", bopts.metricsAddr); err != nil {
			return err
		}
		if *demo {
			pcfg := producer.Config{
				Host:       bopts.zmqHost,
				BasePort:   bcfg.BasePort,
				DPSize:     len(bcfg.Endpoints),
				WorkerID:   *demoWorker,
				Rate:       *demoRate,
				Seed:       *demoSeed,
				StartDelay: 300 * time.Millisecond, // the bridge's SUBs are connecting: ZMQ's slow joiner
			}
			if bcfg.BasePort == 0 {
				return fmt.Errorf("%w: --demo binds its own ports; use --fpm-port/--dp-size, not --zmq-endpoint", errUsage)
			}
			p, err := producer.New(pcfg)
			if err != nil {
				return err
			}
			if err := startStage("demo publishers", p.Ready(), p.Run, "ranks", pcfg.DPSize, "rate", pcfg.Rate, "worker_id", pcfg.WorkerID); err != nil {
				return err
			}
		}
		slog.Info("fpmbus up: watch with `nats sub 'fpm.>'` or `nats stream info FPM`; Ctrl-C stops", "server", srv.ClientURL())
		<-ctx.Done()
		return nil
	}()
	slog.Info("stopping")
	if stopErr := stopAll(); stopErr != nil && err == nil {
		err = stopErr
	}
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// upMemberID names this `fpmbus up` in its consumer groups: "up-<host>-<hash of the absolute data
// directory>". Only one process can hold a data directory (its embedded server locks the store), so
// the id names the same instance across restarts, and a restart after a crash takes the partitions of
// its previous incarnation back at once (consumers/partition, WithMemberID).
func upMemberID(dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	host, _ := os.Hostname()
	var b strings.Builder
	b.WriteString("up-")
	for i := 0; i < len(host) && i < 32; i++ {
		if c := host[i]; c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	sum := sha256.Sum256([]byte(abs))
	b.WriteString("-" + hex.EncodeToString(sum[:6]))
	return b.String()
}
