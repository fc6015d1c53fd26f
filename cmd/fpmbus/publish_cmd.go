package main

import (
	"context"
	"errors"
	"fmt"
	"io"
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

func runPublish(ctx context.Context, args []string) error {
	fs := newFlagSet("publish", "publish [--dp-size N] [--rate R] [--fpm-port P] [--worker-id W] [--count N] …")
	// Defaults follow Dynamo's environment: DYN_FORWARDPASS_METRIC_PORT (else 20380), DYN_FPM_WORKER_ID
	// and the Rust publisher's DYN_FPM_HEARTBEAT_INTERVAL_MS (else 1 s).
	env := newEnvDefaults(fs)
	pcfg := &producer.Config{
		BasePort: env.int("fpm-port", envFPMPort, producer.DefaultBasePort),
		WorkerID: env.text("worker-id", "DYN_FPM_WORKER_ID", ""),
		Rate:     publishRate,
		HeartbeatInterval: time.Duration(env.int("heartbeat", envFPMHeartbeat,
			int(producer.DefaultHeartbeatInterval/time.Millisecond))) * time.Millisecond,
	}
	pf := pcfg.RegisterFlags(fs, "")
	if _, set, _ := envValue(envFPMPort); set {
		pf.BasePortSource = envFPMPort
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := env.err(); err != nil {
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
	p, err := producer.New(cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	err = p.Run(ctx)
	printPublishStats(os.Stdout, p.Stats())
	return err
}

// printPublishStats writes one summary line per rank.
func printPublishStats(w io.Writer, stats []producer.RankStats) {
	for _, st := range stats {
		fmt.Fprintf(w, "rank %d %s: sent %d (heartbeats %d), queue drops %d, send drops %d, send errors %d, last seq %d\n",
			st.Rank, st.Endpoint, st.Sent, st.Heartbeats, st.QueueDrops, st.SendDrops, st.SendErrors, st.LastSeq)
	}
}
