package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/fpmbus/fpmbus/producer"
)

func init() {
	register(command{
		name:    "publish",
		summary: "run synthetic Dynamo FPM publishers (one ZMQ PUB per DP rank)",
		run:     runPublish,
	})
}

// publishRate is the default --rate of `fpmbus publish` (producer.Config's zero Rate means as fast as
// possible).
const publishRate = 10

func runPublish(ctx context.Context, args []string) (err error) {
	fs := newFlagSet("publish", "publish [--dp-size N] [--rate R] [--fpm-port P] [--worker-id W] [--count N] …")
	// Defaults follow Dynamo's environment: DYN_FORWARDPASS_METRIC_PORT (else 20380), DYN_FPM_WORKER_ID
	// and the Rust publisher's DYN_FPM_HEARTBEAT_INTERVAL_MS (else 1 s).
	env := environment.Defaults(fs)
	pcfg := &producer.Config{
		BasePort: env.Int("fpm-port", envFPMPort, producer.DefaultBasePort),
		WorkerID: env.Text("worker-id", "DYN_FPM_WORKER_ID", ""),
		Rate:     publishRate,
		HeartbeatInterval: time.Duration(env.Int("heartbeat", envFPMHeartbeat,
			int(producer.DefaultHeartbeatInterval/time.Millisecond))) * time.Millisecond,
	}
	pf := pcfg.RegisterFlags(fs, "")
	sentLogPath := fs.String("sent-log", "", "append one JSON line per message sent (rank, seq, heartbeat, time, payload) to this file")
	if _, set, _ := environment.Value(envFPMPort); set {
		pf.BasePortSource = envFPMPort
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := env.Err(); err != nil {
		return err
	}
	cfg, err := pf.Config()
	if err != nil {
		if errors.Is(err, producer.ErrInvalidConfig) {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		return err
	}
	cfg.Logger = slog.Default()
	if *sentLogPath != "" {
		sl, lerr := producer.OpenSentLog(*sentLogPath)
		if lerr != nil {
			return flagUsage(lerr)
		}
		defer sl.Close()
		cfg.OnSent = sl.Record
		defer func() {
			if serr := sl.Err(); serr != nil && err == nil {
				err = fmt.Errorf("--sent-log %s: %w (it lists only what was sent before)", *sentLogPath, serr)
			}
		}()
	}
	p, err := producer.New(cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	err = p.Run(ctx)
	producer.WriteStats(os.Stdout, p.Stats())
	return err
}
