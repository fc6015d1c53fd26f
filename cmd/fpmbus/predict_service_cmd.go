package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/fpmbus/fpmbus/consumers/seal"
	"github.com/fpmbus/fpmbus/internal/flagprefix"
	"github.com/fpmbus/fpmbus/internal/observe"
	"github.com/fpmbus/fpmbus/predict/service"
)

func init() {
	register(command{
		name:    "predict-service",
		summary: "NATS micro service fpm-predict: whole-forward latency predictions on fpmpredict.predict from KV FPM_DATASETS",
		run:     runPredictService,
	})
}

// predictPrefix is the prefix of the predict service's flags in `fpmbus up`.
const predictPrefix = "predict-"

// predictOptions holds the flags of `fpmbus predict-service`, shared with `fpmbus up` (there with the
// prefix "predict-"). Both are new in `up`, so no unprefixed alias is registered.
type predictOptions struct {
	prefix                              string
	queueGroup                          string
	requireComplete                     bool
	workers, queueSize, maxRequestBytes int
}

func predictFlags(fs *flag.FlagSet, prefix string) *predictOptions {
	o := &predictOptions{prefix: prefix}
	fs.StringVar(&o.queueGroup, flagprefix.Name(prefix, "queue-group"), service.DefaultQueueGroup,
		"queue group of the service's endpoints: every instance in it shares the requests")
	fs.BoolVar(&o.requireComplete, flagprefix.Name(prefix, "require-complete"), false,
		"refuse cells whose campaign is not complete (every frozen cell sealed); a query can also ask for it")
	fs.IntVar(&o.workers, flagprefix.Name(prefix, "workers"), service.DefaultWorkers(),
		"requests answered at once (default: the CPUs the process may use)")
	fs.IntVar(&o.queueSize, flagprefix.Name(prefix, "queue-size"), service.DefaultQueueSize,
		"requests waiting for a worker; one that finds the queue full is answered at once with a busy error (503)")
	fs.IntVar(&o.maxRequestBytes, flagprefix.Name(prefix, "max-request-bytes"), service.DefaultMaxRequestBytes,
		"largest request body; a larger one is refused unread (413)")
	return o
}

func (o *predictOptions) config() (service.Config, error) {
	c := service.Config{QueueGroup: o.queueGroup, RequireComplete: o.requireComplete, Workers: o.workers,
		QueueSize: o.queueSize, MaxRequestBytes: o.maxRequestBytes}
	for _, f := range []struct {
		name string
		v    int
	}{{"workers", o.workers}, {"queue-size", o.queueSize}, {"max-request-bytes", o.maxRequestBytes}} {
		if f.v < 1 {
			return c, fmt.Errorf("%w: --%s %d: want at least 1", errUsage, flagprefix.Name(o.prefix, f.name), f.v)
		}
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("%w: %v", errUsage, err)
	}
	return c, nil
}

func runPredictService(ctx context.Context, args []string) error {
	fs := newFlagSet("predict-service", "predict-service [--server URL] [--queue-group NAME] [--require-complete] [--workers N] [--queue-size N] [--max-request-bytes N]")
	conn := connFlags(fs, "predict-service")
	scfg := streamFlags(fs)
	o := predictFlags(fs, "")
	metricsAddr := metricsAddrFlag(fs, "127.0.0.1:9469")
	cfg, err := parseStage(fs, args, scfg, o.config)
	if err != nil {
		return err
	}
	nc, js, err := connectAndApply(ctx, conn, nil)
	if err != nil {
		return err
	}
	defer nc.Close()
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The sealer's bucket, created with the sealer's definition when no sealer has run yet.
	kv, err := seal.OpenBucket(octx, js, *scfg)
	if err != nil {
		return err
	}
	reg := observe.NewProcessRegistry()
	s, err := service.New(cfg, nc, kv, service.WithRegisterer(reg))
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	done := make(chan struct{})
	defer close(done)
	// The predict user may read FPM_DATASETS only: no JetStream view.
	stop, err := serveStatus(*metricsAddr, observe.Standalone("predict-service", "predict service", reg, nc, s.Ready(), done, nil, false))
	if err != nil {
		return err
	}
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	select {
	case <-s.Ready():
		slog.Info("predict service ready: try `nats micro info "+service.Name+"` and `nats req "+service.SubjectPredict+" '{…}'`",
			"subject", service.SubjectPredict, "queue_group", o.queueGroup, "cells", len(s.Snapshot().Cells()), "revision", s.Snapshot().Revision())
	case err := <-errc:
		return err
	}
	return <-errc
}
