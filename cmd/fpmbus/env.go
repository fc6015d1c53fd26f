package main

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/consumers/trace"
	"github.com/fpmbus/fpmbus/internal/envflag"
)

// The environment fpmbus reads. Every variable is declared once, in environment, with the commands that
// read it, its meaning (README's Environment table is checked against this list) and how a value is
// checked; it is read only through environment (internal/envflag). A malformed value is a usage error
// (exit status 2) naming the variable and the value. A variable set to the empty string is unset, except
// where Dynamo's rule says otherwise: Dynamo parses every DYN_FPM_* trace variable that is set, and the
// empty string parses as nothing valid (DYN_FPM_OUTPUT_PATH="" is a blank output path, DYN_FPM_MODE=""
// no mode, the numbers no number), which disables its trace writer; here it is an invalid value.

// envFPMPort is Dynamo's base port variable: rank r publishes on port+r.
const envFPMPort = "DYN_FORWARDPASS_METRIC_PORT"

// envFPMHeartbeat is the idle heartbeat override of Dynamo's Rust FPM publisher (fpm_publisher.rs), in
// milliseconds; maxHeartbeatMs is its bound (5 minutes: beyond it a heartbeat no longer says the
// publisher is alive).
const (
	envFPMHeartbeat = "DYN_FPM_HEARTBEAT_INTERVAL_MS"
	maxHeartbeatMs  = 300_000
)

// envFPMShards is the default of --fpm-shards.
const envFPMShards = "FPMBUS_FPM_SHARDS"

// environment is every variable fpmbus reads, in the README's order.
var environment = envflag.Set{
	{Name: envFPMPort, UsedBy: "bridge, publish, up, trace replay", Meaning: "base FPM port (Dynamo's), default of `--fpm-port`: rank r uses port+r", Check: checkPort},
	{Name: "DYN_FPM_WORKER_ID", UsedBy: "publish", Meaning: "default `--worker-id`"},
	{Name: envFPMHeartbeat, UsedBy: "publish", Meaning: "default `--heartbeat`, in milliseconds: 1 to 300000 (Dynamo's Rust publisher's bound; it ignores a bad value with a warning, fpmbus refuses it)", Check: checkPositive(maxHeartbeatMs), EmptyIsSet: true},
	{Name: trace.EnvMode, UsedBy: "trace, trace backfill, up", Meaning: "default `--trace-mode`: `sampled` or `full` (set but empty is an error, as in Dynamo)", Check: checkTraceMode, EmptyIsSet: true},
	{Name: trace.EnvOutputPath, UsedBy: "trace, trace backfill, up", Meaning: "default `--trace-output` (blank, even empty, is an error)", Check: checkNotBlank, EmptyIsSet: true},
	{Name: trace.EnvSampleInterval, UsedBy: "trace, trace backfill, up", Meaning: "default `--sample-interval` (`up`: `--trace-sample-interval`), milliseconds (set but empty is an error)", Check: checkPositive(math.MaxInt64 / int64(time.Millisecond)), EmptyIsSet: true},
	{Name: trace.EnvRollBytes, UsedBy: "trace, trace backfill, up", Meaning: "default `--roll-bytes` (`up`: `--trace-roll-bytes`) (set but empty is an error)", Check: checkPositive(math.MaxInt64), EmptyIsSet: true},
	{Name: trace.EnvMaxSegments, UsedBy: "trace, trace backfill, up", Meaning: "default `--max-segments` (`up`: `--trace-max-segments`) (set but empty is an error)", Check: checkPositive(math.MaxInt32), EmptyIsSet: true},
	{Name: "NATS_URL", UsedBy: "every command that connects", Meaning: "default `--server`"},
	{Name: "NATS_CREDS", UsedBy: "every command that connects, up", Meaning: "default `--creds`"},
	{Name: "NATS_NKEY", UsedBy: "every command that connects, up", Meaning: "default `--nkey`"},
	{Name: "NATS_USER", UsedBy: "every command that connects, up", Meaning: "default `--user`"},
	{Name: "NATS_PASSWORD", UsedBy: "every command that connects, up", Meaning: "default `--password` (never shown by `-h`)"},
	{Name: "NATS_TOKEN", UsedBy: "every command that connects, up", Meaning: "default `--token` (never shown by `-h`)"},
	{Name: "NATS_CA", UsedBy: "every command that connects", Meaning: "default `--tls-ca`"},
	{Name: "NATS_CERT", UsedBy: "every command that connects", Meaning: "default `--tls-cert`"},
	{Name: "NATS_KEY", UsedBy: "every command that connects", Meaning: "default `--tls-key`"},
	{Name: "NATS_CONTEXT", UsedBy: "every command that connects", Meaning: "default `--context`: the nats CLI context to read the connection settings from"},
	{Name: "FPMBUS_BENCH_OUTPUT", UsedBy: "merge, bench merge, up", Meaning: "default `--bench-output` (`up`: `--merge-bench-output`)"},
	{Name: "FPMBUS_GAPS_GROUP", UsedBy: "gaps, gaps report, up", Meaning: "default `--gaps-group`"},
	{Name: "FPMBUS_GAPS_PARTITIONS", UsedBy: "gaps, up", Meaning: "default `--gaps-partitions`, a positive integer", Check: checkPositive(math.MaxInt32)},
	{Name: envFPMShards, UsedBy: "streams show, streams apply, up", Meaning: "default `--fpm-shards`: FPM shard streams to create, 1 to 64", Check: checkPositive(64)},
	{Name: "FPMBUS_LOG_LEVEL", UsedBy: "every command", Meaning: "log level: `debug`, `info` (default), `warn` or `error`", Check: checkLogLevel},
}

// logLevel is the level FPMBUS_LOG_LEVEL names (default info).
func logLevel() (slog.Level, error) {
	v, ok, err := environment.Value("FPMBUS_LOG_LEVEL")
	if err != nil || !ok {
		return slog.LevelInfo, err
	}
	var l slog.Level
	return l, l.UnmarshalText([]byte(v))
}

func checkPort(raw string) (string, error) {
	n, err := strconv.Atoi(strings.TrimSpace(raw))
	if err != nil || n < 1 || n > 65535 {
		return "", errors.New("want a port number, 1 to 65535")
	}
	return strconv.Itoa(n), nil
}

// checkPositive admits integers from 1 to limit, written as Dynamo's config reads its numbers
// (trace.ParsePositive, with an optional '+'). The trace writer's flags parse with the same function,
// so a DYN_FPM_* variable and its flag accept the same text.
func checkPositive(limit int64) func(string) (string, error) {
	return func(raw string) (string, error) {
		n, err := trace.ParsePositive(raw)
		if err != nil || n > limit {
			return "", fmt.Errorf("want a positive integer (at most %d)", limit)
		}
		return strconv.FormatInt(n, 10), nil
	}
}

func checkNotBlank(raw string) (string, error) {
	s := strings.TrimSpace(raw)
	if s == "" {
		return "", errors.New("blank")
	}
	return s, nil
}

func checkTraceMode(raw string) (string, error) {
	m, err := trace.ParseMode(raw)
	if err != nil {
		return "", errors.New("want sampled or full")
	}
	return string(m), nil
}

func checkLogLevel(raw string) (string, error) {
	switch s := strings.ToLower(strings.TrimSpace(raw)); s {
	case "debug", "info", "warn", "error":
		return s, nil
	}
	return "", errors.New("want debug, info, warn or error")
}
