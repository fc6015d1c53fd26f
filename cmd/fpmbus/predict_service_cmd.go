package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/fpmbus/fpmbus/consumers/seal"
	"github.com/fpmbus/fpmbus/internal/rungroup"
	"github.com/fpmbus/fpmbus/predict/service"
	"github.com/fpmbus/fpmbus/streams"
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
	queueGroup      string
	requireComplete bool
}

func predictFlags(fs *flag.FlagSet, prefix string) *predictOptions {
	o := &predictOptions{}
	fs.StringVar(&o.queueGroup, prefixedName(prefix, "queue-group"), service.DefaultQueueGroup,
		"queue group of the service's endpoints: every instance in it shares the requests")
	fs.BoolVar(&o.requireComplete, prefixedName(prefix, "require-complete"), false,
		"refuse cells whose campaign is not complete (every frozen cell sealed); a query can also ask for it")
	return o
}

func (o *predictOptions) config() service.Config {
	return service.Config{QueueGroup: o.queueGroup, RequireComplete: o.requireComplete}
}

func runPredictService(ctx context.Context, args []string) error {
	fs := newFlagSet("predict-service", "predict-service [--server URL] [--queue-group NAME] [--require-complete]")
	conn := connFlags(fs, "predict-service")
	scfg := streamFlags(fs)
	o := predictFlags(fs, "")
	cfg, err := parseStage(fs, args, scfg, func() (service.Config, error) { return o.config(), nil })
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
	s, err := service.New(cfg, nc, kv)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
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

func (r *upRun) predictComponent() *rungroup.Component {
	return &rungroup.Component{
		StopTimeout: 15 * time.Second,
		Start: func(ctx context.Context) (rungroup.Instance, error) {
			nc, js := r.link()
			kv, err := seal.OpenBucket(ctx, js, r.scfg)
			if err != nil {
				return rungroup.Instance{}, err
			}
			s, err := service.New(r.predict, nc, kv)
			if err != nil {
				return rungroup.Instance{}, rungroup.Permanent(fmt.Errorf("%w: %v", errUsage, err))
			}
			return rungroup.Instance{Run: s.Run, Ready: s.Ready(),
				LogAttrs: []any{"service", service.Name, "subject", service.SubjectPredict, "queue_group", r.predict.QueueGroup, "bucket", streams.BucketDatasets}}, nil
		},
	}
}
