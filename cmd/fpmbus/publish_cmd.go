package main

import (
	"context"
	"flag"
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

// publishOptions holds the flags of `fpmbus publish`, shared with `fpmbus up --demo`.
type publishOptions struct {
	fs             *flag.FlagSet
	host           string
	basePort       int
	portEnvErr     error // a malformed DYN_FORWARDPASS_METRIC_PORT, reported unless --fpm-port is given
	dpSize         int
	workerID       string
	rate           float64
	count          int
	idleAfterCount bool
	heartbeat      time.Duration
	queueSize      int
	sendHWM        int
	seed           int64
	startDelay     time.Duration
	waitSubs       int
	waitTimeout    time.Duration
}

// publishFlags registers the synthetic publisher's flags on fs. Defaults follow Dynamo's environment:
// DYN_FORWARDPASS_METRIC_PORT (else 20380) and DYN_FPM_WORKER_ID (else "").
func publishFlags(fs *flag.FlagSet) *publishOptions {
	o := &publishOptions{fs: fs}
	port, err := envInt("DYN_FORWARDPASS_METRIC_PORT", producer.DefaultBasePort)
	if err != nil {
		o.portEnvErr = err
		port = producer.DefaultBasePort
	}
	fs.StringVar(&o.host, "host", producer.DefaultHost, `interface the PUB sockets bind ("*": all interfaces, as Dynamo does)`)
	fs.IntVar(&o.basePort, "fpm-port", port, "base port: rank r binds port+r (env DYN_FORWARDPASS_METRIC_PORT)")
	fs.IntVar(&o.dpSize, "dp-size", 1, "number of data-parallel ranks, one PUB socket each")
	fs.StringVar(&o.workerID, "worker-id", envOr("DYN_FPM_WORKER_ID", ""), "worker_id stamped into every FPM (env DYN_FPM_WORKER_ID)")
	fs.Float64Var(&o.rate, "rate", 10, "simulated forward passes per second per rank (<= 0: as fast as possible)")
	fs.IntVar(&o.count, "count", 0, "stop each rank after N FPMs, heartbeats excluded (0: run until interrupted)")
	fs.BoolVar(&o.idleAfterCount, "idle-after-count", false, "after --count, keep sending heartbeats until interrupted")
	fs.DurationVar(&o.heartbeat, "heartbeat", producer.DefaultHeartbeatInterval, "heartbeat after this long without a publish")
	fs.IntVar(&o.queueSize, "queue-size", producer.DefaultQueueSize, "per-rank queue between engine and sender (full: drop)")
	fs.IntVar(&o.sendHWM, "send-hwm", producer.DefaultSendHWM, "ZMQ_SNDHWM of each PUB socket, in messages")
	fs.Int64Var(&o.seed, "seed", 0, "seed of the load simulation (same seed: same FPMs)")
	fs.DurationVar(&o.startDelay, "start-delay", 0, "wait this long after binding before the first message (lets subscribers join)")
	fs.IntVar(&o.waitSubs, "wait-subscribers", 0, "before the first message, wait until this many subscribers joined every rank (XPUB; same wire format)")
	fs.DurationVar(&o.waitTimeout, "wait-timeout", 30*time.Second, "give up --wait-subscribers after this long (exit 1)")
	return o
}

// config turns the parsed flags into a validated producer.Config; problems are usage errors.
func (o *publishOptions) config() (producer.Config, error) {
	if o.portEnvErr != nil && !flagGiven(o.fs, "fpm-port") {
		return producer.Config{}, o.portEnvErr
	}
	if o.dpSize < 1 {
		return producer.Config{}, fmt.Errorf("%w: --dp-size %d: want at least 1", errUsage, o.dpSize)
	}
	if o.heartbeat <= 0 {
		return producer.Config{}, fmt.Errorf("%w: --heartbeat %v: want > 0", errUsage, o.heartbeat)
	}
	if o.queueSize < 1 {
		return producer.Config{}, fmt.Errorf("%w: --queue-size %d: want >= 1", errUsage, o.queueSize)
	}
	if o.sendHWM < 1 {
		return producer.Config{}, fmt.Errorf("%w: --send-hwm %d: want >= 1", errUsage, o.sendHWM)
	}
	if o.basePort < 1 || o.basePort+o.dpSize-1 > 65535 {
		src := "--fpm-port"
		if !flagGiven(o.fs, "fpm-port") {
			src = "DYN_FORWARDPASS_METRIC_PORT"
		}
		return producer.Config{}, fmt.Errorf("%w: %s %d with --dp-size %d: ports must stay within 1..65535",
			errUsage, src, o.basePort, o.dpSize)
	}
	cfg := producer.Config{
		Host:              o.host,
		BasePort:          o.basePort,
		DPSize:            o.dpSize,
		WorkerID:          o.workerID,
		Rate:              o.rate,
		Count:             o.count,
		IdleAfterCount:    o.idleAfterCount,
		HeartbeatInterval: o.heartbeat,
		QueueSize:         o.queueSize,
		SendHWM:           o.sendHWM,
		Seed:              o.seed,
		StartDelay:        o.startDelay,
		WaitSubscribers:   o.waitSubs,
		WaitTimeout:       o.waitTimeout,
		Logger:            slog.Default(),
	}
	if err := cfg.Validate(); err != nil {
		return producer.Config{}, fmt.Errorf("%w: %v", errUsage, err)
	}
	return cfg, nil
}

// flagGiven reports whether the flag name was set on the command line.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			given = true
		}
	})
	return given
}

func runPublish(ctx context.Context, args []string) error {
	fs := newFlagSet("publish", "publish [--dp-size N] [--rate R] [--fpm-port P] [--worker-id W] [--count N] …")
	opts := publishFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := opts.config()
	if err != nil {
		return err
	}
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
