package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/consumers/trace"
	"github.com/fpmbus/fpmbus/internal/upstack"
)

// run runs fpmbus in-process and returns its exit status and what it printed on stderr and as help.
func run(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	helpOutput = &out
	t.Cleanup(func() { helpOutput = discardHelp })
	code := runMain(context.Background(), args, &out, &out)
	return code, out.String()
}

// Every variable fpmbus reads, through every command that reads it: a value its check refuses exits 2
// naming the variable and the value; a text variable becomes its flag's default. Commands are chosen
// (or given a bad flag) so that they stop before touching the network.
func TestEnvironmentEveryVariable(t *testing.T) {
	type use struct {
		args []string
		// want is in the output: for a refused value, the variable and the value; for text, the value
		// as the flag's default.
		want string
	}
	cases := map[string]struct {
		value string
		uses  []use
	}{
		envFPMPort: {"abc", []use{
			{[]string{"bridge"}, envFPMPort + `="abc"`},
			{[]string{"publish"}, envFPMPort + `="abc"`},
			{[]string{"up"}, envFPMPort + `="abc"`},
			{[]string{"trace", "replay"}, envFPMPort + `="abc"`},
		}},
		"DYN_FPM_WORKER_ID":           {"w-from-env", []use{{[]string{"publish", "-h"}, `(default "w-from-env")`}}},
		envFPMHeartbeat:               {"300001", []use{{[]string{"publish"}, envFPMHeartbeat + `="300001"`}}},
		"DYN_FPM_MODE":                {"bogus", []use{{[]string{"trace"}, `DYN_FPM_MODE="bogus"`}, {[]string{"trace", "backfill"}, `DYN_FPM_MODE="bogus"`}}},
		"DYN_FPM_OUTPUT_PATH":         {"  ", []use{{[]string{"trace"}, `DYN_FPM_OUTPUT_PATH="  "`}, {[]string{"trace", "backfill"}, `DYN_FPM_OUTPUT_PATH="  "`}}},
		"DYN_FPM_SAMPLE_INTERVAL_MS":  {"5s", []use{{[]string{"trace"}, `DYN_FPM_SAMPLE_INTERVAL_MS="5s"`}, {[]string{"trace", "backfill"}, `DYN_FPM_SAMPLE_INTERVAL_MS="5s"`}}},
		"DYN_FPM_JSONL_GZ_ROLL_BYTES": {"0", []use{{[]string{"trace"}, `DYN_FPM_JSONL_GZ_ROLL_BYTES="0"`}, {[]string{"trace", "backfill"}, `DYN_FPM_JSONL_GZ_ROLL_BYTES="0"`}}},
		"DYN_FPM_MAX_SEGMENTS":        {"-1", []use{{[]string{"trace"}, `DYN_FPM_MAX_SEGMENTS="-1"`}, {[]string{"trace", "backfill"}, `DYN_FPM_MAX_SEGMENTS="-1"`}}},
		"NATS_URL":                    {"nats://env-host:4999", []use{{[]string{"gaps", "-h"}, `(default nats://env-host:4999)`}}},
		"NATS_CREDS":                  {"/env/user.creds", []use{{[]string{"merge", "-h"}, `(default "/env/user.creds")`}}},
		"NATS_USER":                   {"env-user", []use{{[]string{"seal", "-h"}, `(default "env-user")`}}},
		"NATS_NKEY":                   {"/env/user.nk", []use{{[]string{"gaps", "-h"}, `(default "/env/user.nk")`}, {[]string{"up", "-h"}, `(default "/env/user.nk")`}}},
		"NATS_PASSWORD":               {"env-pass", []use{{[]string{"trace", "-h"}, `(default: set from NATS_PASSWORD)`}, {[]string{"up", "-h"}, `(default: set from NATS_PASSWORD)`}}},
		"NATS_TOKEN":                  {"env-token", []use{{[]string{"bridge", "-h"}, `(default: set from NATS_TOKEN)`}}},
		"NATS_CONTEXT":                {"env-ctx", []use{{[]string{"streams", "apply", "-h"}, `(default "env-ctx")`}}},
		"NATS_CA":                     {"/env/ca.pem", []use{{[]string{"gaps", "report", "-h"}, `(default "/env/ca.pem")`}}},
		"NATS_CERT":                   {"/env/cert.pem", []use{{[]string{"datasets", "ls", "-h"}, `(default "/env/cert.pem")`}}},
		"NATS_KEY":                    {"/env/key.pem", []use{{[]string{"trace", "backfill", "-h"}, `(default "/env/key.pem")`}}},
		"FPMBUS_BENCH_OUTPUT":         {"/env/{run_id}.json", []use{{[]string{"merge", "-h"}, `(default "/env/{run_id}.json")`}, {[]string{"up", "-h"}, `(default "/env/{run_id}.json")`}}},
		"FPMBUS_GAPS_GROUP":           {"env-group", []use{{[]string{"gaps", "-h"}, `(default "env-group")`}, {[]string{"gaps", "report", "-h"}, `(default "env-group")`}}},
		"FPMBUS_GAPS_PARTITIONS": {"abc", []use{
			{[]string{"gaps"}, `FPMBUS_GAPS_PARTITIONS="abc"`},
			{[]string{"up"}, `FPMBUS_GAPS_PARTITIONS="abc"`},
		}},
		"FPMBUS_FPM_SHARDS": {"abc", []use{
			{[]string{"streams", "show"}, `FPMBUS_FPM_SHARDS="abc"`},
			{[]string{"streams", "apply"}, `FPMBUS_FPM_SHARDS="abc"`},
			{[]string{"up"}, `FPMBUS_FPM_SHARDS="abc"`},
		}},
		"FPMBUS_LOG_LEVEL": {"bogus", []use{{[]string{"publish"}, `FPMBUS_LOG_LEVEL="bogus"`}, {[]string{"streams", "show"}, `FPMBUS_LOG_LEVEL="bogus"`}}},
	}
	for _, v := range environment {
		if _, ok := cases[v.Name]; !ok {
			t.Errorf("variable %s is declared in environment but not tested here", v.Name)
		}
	}
	for name, tc := range cases {
		checked := environment.Lookup(name).Check != nil
		for _, u := range tc.uses {
			t.Run(name+"/"+strings.Join(u.args, " "), func(t *testing.T) {
				t.Setenv(name, tc.value)
				code, out := run(t, u.args...)
				if !strings.Contains(out, u.want) {
					t.Fatalf("exit %d, output does not contain %q:\n%s", code, u.want, out)
				}
				if checked && code != 2 {
					t.Fatalf("exit %d, want 2:\n%s", code, out)
				}
			})
		}
	}
}

// A flag overrides its variable: a bad variable is not reported when its flag was given.
func TestEnvironmentFlagOverridesABadVariable(t *testing.T) {
	for name, tc := range map[string]struct {
		env, value string
		args       []string
		want       string // the error that is reported instead
	}{
		"port, publish": {envFPMPort, "abc", []string{"publish", "--fpm-port", "3000", "--dp-size", "0"}, "--dp-size 0"},
		"port, up":      {envFPMPort, "abc", []string{"up", "--fpm-port", "3000", "--max-buffer", "0"}, "--max-buffer 0"},
		"partitions":    {"FPMBUS_GAPS_PARTITIONS", "abc", []string{"gaps", "--gaps-partitions", "1", "--gaps-pinned-ttl", "1ms"}, "--gaps-pinned-ttl 1ms"},
		"trace mode":    {"DYN_FPM_MODE", "bogus", []string{"trace", "--trace-mode", "full", "--roll-bytes", "x"}, `--roll-bytes "x"`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(tc.env, tc.value)
			code, out := run(t, tc.args...)
			if code != 2 || strings.Contains(out, tc.env+"=") || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want 2 naming %q and not %s:\n%s", code, tc.want, tc.env, out)
			}
		})
	}
}

// Dynamo parses a DYN_FPM_* trace variable whenever it is set, and the empty string is no valid value,
// so a variable set but empty disables its trace writer: `trace` and `trace backfill` refuse it (exit 2
// naming it), and `up` runs on without the trace writer, as for any other invalid trace setting.
func TestEnvironmentDynamoTraceVariableSetButEmpty(t *testing.T) {
	for _, name := range []string{"DYN_FPM_MODE", "DYN_FPM_OUTPUT_PATH", "DYN_FPM_SAMPLE_INTERVAL_MS",
		"DYN_FPM_JSONL_GZ_ROLL_BYTES", "DYN_FPM_MAX_SEGMENTS"} {
		// --max-deliveries -1 is refused too, after the variables: a command that took the empty
		// variable for unset stops there, before the network, without naming the variable.
		for _, args := range [][]string{{"trace", "--trace-max-deliveries", "-1"}, {"trace", "backfill", "--since", "x"}} {
			t.Run(name+"/"+strings.Join(args[:len(args)-2], " "), func(t *testing.T) {
				t.Setenv(name, "")
				code, out := run(t, args...)
				if code != 2 || !strings.Contains(out, name+`=""`) {
					t.Fatalf("exit %d, want 2 naming %s=\"\":\n%s", code, name, out)
				}
			})
		}
		t.Run(name+"/up", func(t *testing.T) {
			t.Setenv(name, "")
			plan := planUp
			if name == "DYN_FPM_OUTPUT_PATH" {
				plan = planUpWithoutTraceOutput // planUp's --trace-output would override the variable
			}
			r, err := plan(t)
			if err != nil {
				t.Fatal(err)
			}
			if r.Trace != nil {
				t.Fatalf("up plans a trace writer with %s set but empty: %+v", name, *r.Trace)
			}
			if !strings.Contains(r.TraceDisabled, name) {
				t.Fatalf("the trace writer is disabled for %q, which does not name %s", r.TraceDisabled, name)
			}
		})
	}
}

// planUpWithoutTraceOutput plans up as planUp does, but leaves --trace-output to its variable.
func planUpWithoutTraceOutput(t *testing.T, args ...string) (*upstack.Run, error) {
	t.Helper()
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := upFlags(fs)
	if err := fs.Parse(append([]string{"--data-dir", filepath.Join(t.TempDir(), "data")}, args...)); err != nil {
		t.Fatal(err)
	}
	return o.plan()
}

// Dynamo reads its numeric trace variables with Rust's unsigned parse after trimming: an optional '+',
// digits, nothing else. The variable and the flag it is the default of accept the same text, in
// `trace` and in `up`.
func TestDynamoTraceNumbersFlagAndVariableAgree(t *testing.T) {
	type setting struct {
		env, flag, upFlag string
		got               func(trace.Config) int64
	}
	settings := []setting{
		{trace.EnvSampleInterval, "sample-interval", "trace-sample-interval", func(c trace.Config) int64 { return c.SampleInterval.Milliseconds() }},
		{trace.EnvRollBytes, "roll-bytes", "trace-roll-bytes", func(c trace.Config) int64 { return c.RollBytes }},
		{trace.EnvMaxSegments, "max-segments", "trace-max-segments", func(c trace.Config) int64 { return int64(c.MaxSegments) }},
	}
	values := map[string]int64{ // 0: refused
		"7": 7, "+7": 7, " +7 ": 7, "007": 7,
		"-7": 0, "": 0, "   ": 0, "+": 0, "+ 7": 0, "7 7": 0, "++7": 0, "+-7": 0, "0": 0, "+0": 0, "7.0": 0,
	}
	for _, s := range settings {
		for value, want := range values {
			name := s.env + "=" + strconv.Quote(value)
			t.Run(name+"/trace", func(t *testing.T) {
				fromFlag, flagErr := traceConfigFrom(t, "--"+s.flag, value)
				t.Setenv(s.env, value)
				fromEnv, envErr := traceConfigFrom(t)
				for how, c := range map[string]struct {
					cfg trace.Config
					err error
				}{"--" + s.flag: {fromFlag, flagErr}, s.env: {fromEnv, envErr}} {
					if want == 0 && c.err == nil {
						t.Errorf("%s %q accepted (%d), want refused", how, value, s.got(c.cfg))
					}
					if want != 0 && (c.err != nil || s.got(c.cfg) != want) {
						t.Errorf("%s %q: %d, %v; want %d", how, value, s.got(c.cfg), c.err, want)
					}
				}
			})
			t.Run(name+"/up", func(t *testing.T) {
				viaFlag, err := planUp(t, "--"+s.upFlag+"="+value)
				if err != nil {
					t.Fatal(err)
				}
				t.Setenv(s.env, value)
				viaEnv, err := planUp(t)
				if err != nil {
					t.Fatal(err)
				}
				for how, r := range map[string]*upstack.Run{"--" + s.upFlag: viaFlag, s.env: viaEnv} {
					switch {
					case want == 0 && r.Trace != nil:
						t.Errorf("%s %q: up plans a trace writer, want it disabled", how, value)
					case want != 0 && r.Trace == nil:
						t.Errorf("%s %q: up disables the trace writer: %s", how, value, r.TraceDisabled)
					case want != 0 && s.got(*r.Trace) != want:
						t.Errorf("%s %q: %d, want %d", how, value, s.got(*r.Trace), want)
					}
				}
			})
		}
	}
}

// traceConfigFrom is the trace writer's configuration from the environment and args.
func traceConfigFrom(t *testing.T, args ...string) (trace.Config, error) {
	t.Helper()
	fs := flag.NewFlagSet("trace", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := traceFlags(fs, "")
	if err := fs.Parse(append([]string{"--trace-output", filepath.Join(t.TempDir(), "fpm")}, args...)); err != nil {
		t.Fatal(err)
	}
	return o.config()
}

// DYN_FPM_HEARTBEAT_INTERVAL_MS, the Rust publisher's idle heartbeat override, is the default of
// publish's --heartbeat: whole milliseconds from 1 to 300000, Dynamo's bound; zero, empty, a unit or
// anything above is refused naming it.
func TestEnvironmentHeartbeatInterval(t *testing.T) {
	for value, want := range map[string]string{"250": "(default 250ms)", " 300000 ": "(default 5m0s)"} {
		t.Setenv(envFPMHeartbeat, value)
		if code, out := run(t, "publish", "-h"); !strings.Contains(out, want) {
			t.Fatalf("%s=%q: exit %d, no %q in:\n%s", envFPMHeartbeat, value, code, want, out)
		}
	}
	for _, value := range []string{"0", "", "1s", "-5", "300001"} {
		t.Setenv(envFPMHeartbeat, value)
		if code, out := run(t, "publish"); code != 2 || !strings.Contains(out, envFPMHeartbeat+"="+strconv.Quote(value)) {
			t.Fatalf("%s=%q: exit %d, want 2 naming it:\n%s", envFPMHeartbeat, value, code, out)
		}
	}
	t.Setenv(envFPMHeartbeat, "0")
	if code, out := run(t, "publish", "--heartbeat", "2s", "--dp-size", "0"); code != 2 || strings.Contains(out, envFPMHeartbeat) {
		t.Fatalf("--heartbeat overrides the variable: exit %d:\n%s", code, out)
	}
}
