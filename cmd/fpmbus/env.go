package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/consumers/trace"
	"github.com/fpmbus/fpmbus/internal/flagprefix"
)

// The environment fpmbus reads. Every variable is declared once, in environment, with the commands that
// read it, its meaning (README's Environment table is checked against this list) and how a value is
// checked; it is read only through envValue, envOr or an envDefaults. A malformed value is a usage error
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

// envVar declares one environment variable.
type envVar struct {
	name    string
	usedBy  string // commands that read it, for the README
	meaning string // for the README
	// check validates a set value and returns it normalized, or says what is wrong with it (the caller
	// names the variable and the value). Nil: any text, trimmed; blank is unset.
	check func(raw string) (string, error)
	// emptyIsSet makes an empty value a value (checked), not an unset variable.
	emptyIsSet bool
}

// environment is every variable fpmbus reads, in the README's order.
var environment = []envVar{
	{name: envFPMPort, usedBy: "bridge, publish, up, trace replay", meaning: "base FPM port (Dynamo's), default of `--fpm-port`: rank r uses port+r", check: checkPort},
	{name: "DYN_FPM_WORKER_ID", usedBy: "publish", meaning: "default `--worker-id`"},
	{name: envFPMHeartbeat, usedBy: "publish", meaning: "default `--heartbeat`, in milliseconds: 1 to 300000 (Dynamo's Rust publisher's bound; it ignores a bad value with a warning, fpmbus refuses it)", check: checkPositive(maxHeartbeatMs), emptyIsSet: true},
	{name: trace.EnvMode, usedBy: "trace, trace backfill, up", meaning: "default `--trace-mode`: `sampled` or `full` (set but empty is an error, as in Dynamo)", check: checkTraceMode, emptyIsSet: true},
	{name: trace.EnvOutputPath, usedBy: "trace, trace backfill, up", meaning: "default `--trace-output` (blank, even empty, is an error)", check: checkNotBlank, emptyIsSet: true},
	{name: trace.EnvSampleInterval, usedBy: "trace, trace backfill, up", meaning: "default `--sample-interval` (`up`: `--trace-sample-interval`), milliseconds (set but empty is an error)", check: checkPositive(math.MaxInt64 / int64(time.Millisecond)), emptyIsSet: true},
	{name: trace.EnvRollBytes, usedBy: "trace, trace backfill, up", meaning: "default `--roll-bytes` (`up`: `--trace-roll-bytes`) (set but empty is an error)", check: checkPositive(math.MaxInt64), emptyIsSet: true},
	{name: trace.EnvMaxSegments, usedBy: "trace, trace backfill, up", meaning: "default `--max-segments` (`up`: `--trace-max-segments`) (set but empty is an error)", check: checkPositive(math.MaxInt32), emptyIsSet: true},
	{name: "NATS_URL", usedBy: "every command that connects", meaning: "default `--server`"},
	{name: "NATS_CREDS", usedBy: "every command that connects, up", meaning: "default `--creds`"},
	{name: "NATS_NKEY", usedBy: "every command that connects, up", meaning: "default `--nkey`"},
	{name: "NATS_USER", usedBy: "every command that connects, up", meaning: "default `--user`"},
	{name: "NATS_PASSWORD", usedBy: "every command that connects, up", meaning: "default `--password` (never shown by `-h`)"},
	{name: "NATS_TOKEN", usedBy: "every command that connects, up", meaning: "default `--token` (never shown by `-h`)"},
	{name: "NATS_CA", usedBy: "every command that connects", meaning: "default `--tls-ca`"},
	{name: "NATS_CERT", usedBy: "every command that connects", meaning: "default `--tls-cert`"},
	{name: "NATS_KEY", usedBy: "every command that connects", meaning: "default `--tls-key`"},
	{name: "NATS_CONTEXT", usedBy: "every command that connects", meaning: "default `--context`: the nats CLI context to read the connection settings from"},
	{name: "FPMBUS_BENCH_OUTPUT", usedBy: "merge, bench merge, up", meaning: "default `--bench-output` (`up`: `--merge-bench-output`)"},
	{name: "FPMBUS_GAPS_GROUP", usedBy: "gaps, gaps report, up", meaning: "default `--gaps-group`"},
	{name: "FPMBUS_GAPS_PARTITIONS", usedBy: "gaps, up", meaning: "default `--gaps-partitions`, a positive integer", check: checkPositive(math.MaxInt32)},
	{name: envFPMShards, usedBy: "streams show, streams apply, up", meaning: "default `--fpm-shards`: FPM shard streams to create, 1 to 64", check: checkPositive(64)},
	{name: "FPMBUS_LOG_LEVEL", usedBy: "every command", meaning: "log level: `debug`, `info` (default), `warn` or `error`", check: checkLogLevel},
}

// environmentTable renders environment as the README's Environment table.
func environmentTable() string {
	var b strings.Builder
	b.WriteString("| variable | used by | meaning |\n|---|---|---|\n")
	for _, v := range environment {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", v.name, v.usedBy, v.meaning)
	}
	return b.String()
}

// lookupEnvVar returns the declaration of name. Reading an undeclared variable is a programming error.
func lookupEnvVar(name string) envVar {
	for _, v := range environment {
		if v.name == name {
			return v
		}
	}
	panic("fpmbus: environment variable " + name + " is read but not declared in environment")
}

// lookupenv reads the process environment (tests set variables with t.Setenv).
var lookupenv = os.LookupEnv

// envValue returns the checked value of variable name and whether it is set (not empty). A value its
// check refuses is a usage error naming the variable and the value.
func envValue(name string) (string, bool, error) {
	v := lookupEnvVar(name)
	raw, set := lookupenv(name)
	if !set || raw == "" && !v.emptyIsSet {
		return "", false, nil
	}
	if v.check == nil {
		s := strings.TrimSpace(raw)
		return s, s != "", nil
	}
	s, err := v.check(raw)
	if err != nil {
		return "", true, fmt.Errorf("%w: %s=%q: %v", errUsage, name, raw, err)
	}
	return s, true, nil
}

// envOr returns the value of the text variable name, or def when it is unset or blank. Only for
// variables without a check: a checked one is read with envValue or an envDefaults, which report a bad
// value instead of ignoring it.
func envOr(name, def string) string {
	if lookupEnvVar(name).check != nil {
		panic("fpmbus: envOr(" + name + "): a checked variable must be read with envValue or envDefaults")
	}
	if v, ok, _ := envValue(name); ok {
		return v
	}
	return def
}

// envDefaults gives flags their defaults from the environment. A flag overrides its variable, so a
// malformed value is reported (by err) only when its flag was not given on the command line; until then
// the flag shows its built-in default.
type envDefaults struct {
	fs  *flag.FlagSet
	bad []envDefaultErr
}

type envDefaultErr struct {
	flag string
	err  error
}

func newEnvDefaults(fs *flag.FlagSet) *envDefaults { return &envDefaults{fs: fs} }

// text returns the value of variable name as the default of flag flagName, else def.
func (d *envDefaults) text(flagName, name, def string) string {
	v, ok, err := envValue(name)
	if err != nil {
		d.bad = append(d.bad, envDefaultErr{flagName, err})
		return def
	}
	if !ok {
		return def
	}
	return v
}

// int returns the integer value of variable name as the default of flag flagName, else def.
func (d *envDefaults) int(flagName, name string, def int) int {
	s := d.text(flagName, name, "")
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil { // the variable's check admits only integers
		d.bad = append(d.bad, envDefaultErr{flagName, fmt.Errorf("%w: %s=%q: not an integer", errUsage, name, s)})
		return def
	}
	return n
}

// err reports the first malformed variable whose flag was not given; call it after parsing.
func (d *envDefaults) err() error {
	for _, b := range d.bad {
		if !flagprefix.Given(d.fs, b.flag) {
			return b.err
		}
	}
	return nil
}

// logLevel is the level FPMBUS_LOG_LEVEL names (default info).
func logLevel() (slog.Level, error) {
	v, ok, err := envValue("FPMBUS_LOG_LEVEL")
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
