package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/fpmbus/fpmbus/internal/fsutil"
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
	env := newEnvDefaults(fs)
	pcfg := &producer.Config{
		BasePort: env.int("fpm-port", envFPMPort, producer.DefaultBasePort),
		WorkerID: env.text("worker-id", "DYN_FPM_WORKER_ID", ""),
		Rate:     publishRate,
		HeartbeatInterval: time.Duration(env.int("heartbeat", envFPMHeartbeat,
			int(producer.DefaultHeartbeatInterval/time.Millisecond))) * time.Millisecond,
	}
	pf := pcfg.RegisterFlags(fs, "")
	sentLogPath := fs.String("sent-log", "", "append one JSON line per message sent (rank, seq, heartbeat, time, payload) to this file")
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
	if *sentLogPath != "" {
		sl, lerr := openSentLog(*sentLogPath)
		if lerr != nil {
			return lerr
		}
		defer sl.close()
		cfg.OnSent = sl.record
		defer func() {
			if sl.err != nil && err == nil {
				err = fmt.Errorf("--sent-log %s: %w (it lists only what was sent before)", *sentLogPath, sl.err)
			}
		}()
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

// sentLog is `fpmbus publish --sent-log`: one JSON line per message libzmq accepted, written as it is
// sent, so that what a run sent can be compared from the outside with what the pipeline stored:
//
//	{"dp_rank":0,"seq":12,"heartbeat":false,"sent_at_unix_ms":1782777601250,"payload":"<base64 msgpack>"}
//
// Each line is one write(2) to a file opened for appending, so a publisher killed with SIGKILL leaves
// every line of the messages it sent but the one in hand, and never a torn line in the middle. Ranks
// write concurrently; the lock keeps lines whole, and per rank they are in sequence order.
type sentLog struct {
	mu   sync.Mutex
	f    *os.File
	line []byte
	err  error
}

// openSentLog opens the log for appending, creating it if missing. It is often a file in a shared
// directory (/tmp), so a symbolic link or named pipe under its name is refused, never written through:
// the flag's value is then unusable, as a bad value of any flag is (exit 2).
func openSentLog(path string) (*sentLog, error) {
	f, err := fsutil.AppendRegular(path, os.O_CREATE, 0o644)
	if errors.Is(err, fsutil.ErrNotRegular) {
		return nil, fmt.Errorf("%w: --sent-log: %v", errUsage, err)
	}
	if err != nil {
		return nil, fmt.Errorf("--sent-log: %w", err)
	}
	return &sentLog{f: f}, nil
}

func (l *sentLog) record(rank int, seq uint64, heartbeat bool, payload []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	b := append(l.line[:0], `{"dp_rank":`...)
	b = strconv.AppendInt(b, int64(rank), 10)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"heartbeat":`...)
	b = strconv.AppendBool(b, heartbeat)
	b = append(b, `,"sent_at_unix_ms":`...)
	b = strconv.AppendInt(b, time.Now().UnixMilli(), 10)
	b = append(b, `,"payload":"`...)
	b = base64.StdEncoding.AppendEncode(b, payload)
	b = append(b, "\"}\n"...)
	l.line = b
	if _, err := l.f.Write(b); err != nil {
		// The log is the publisher's testimony: a gap in it would read as FPMs never sent. Say so once
		// and stop writing rather than leave a log that looks complete.
		l.err = err
		slog.Error("--sent-log: write failed; the log stops here and no longer lists what was sent", "path", l.f.Name(), "seq", seq, "dp_rank", rank, "err", err)
	}
}

func (l *sentLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.f.Close(); err != nil && l.err == nil {
		slog.Error("--sent-log: close", "path", l.f.Name(), "err", err)
	}
}
