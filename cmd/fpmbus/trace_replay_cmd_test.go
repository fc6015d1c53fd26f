package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// `fpmbus trace replay` refuses a bad setting before it reads or binds anything, exit 2, naming the
// flag at fault.
func TestTraceReplayRefusesBadSettingsNamingThem(t *testing.T) {
	t.Setenv(envFPMPort, "")
	some := filepath.Join(t.TempDir(), "fpm")
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"no source":                         {nil, "name trace segments"},
		"speed zero":                        {[]string{some, "--speed", "0"}, "--speed 0"},
		"a negative rate cap":               {[]string{some, "--max-rate", "-1"}, "--max-rate -1"},
		"a negative loop count":             {[]string{some, "--loop", "-2"}, "--loop -2"},
		"an unknown target":                 {[]string{some, "--to", "kafka"}, `--to "kafka"`},
		"an unknown counter mode":           {[]string{some, "--counter-ids", "shuffle"}, `--counter-ids "shuffle"`},
		"a start that is no time":           {[]string{some, "--start-at", "yesterday"}, `--start-at "yesterday"`},
		"a worker map without =":            {[]string{some, "--map-worker", "a"}, "-map-worker"},
		"a port map without a port":         {[]string{some, "--port-map", "w/0"}, `port map "w/0"`},
		"wait on full without no-drop":      {[]string{some, "--on-full", "wait"}, "--on-full wait needs --no-drop"},
		"a stream flag with --to zmq":       {[]string{some, "--namespace", "x"}, "--namespace applies to --to stream only"},
		"a zmq flag with --to stream":       {[]string{some, "--to", "stream", "--fpm-port", "1"}, "--fpm-port applies to --to zmq only"},
		"a stream range without the stream": {[]string{some, "--since", "0"}, "--since selects a range of the stream"},
		"files with --from-stream":          {[]string{"--from-stream", some}, "--from-stream reads the stream"},
		"info and dry-run":                  {[]string{some, "--info", "--dry-run"}, "--info and --dry-run exclude each other"},
		"a prefix naming nothing":           {[]string{some, "--dry-run"}, "no trace segments found"},
	} {
		t.Run(name, func(t *testing.T) {
			code, out := run(t, append([]string{"trace", "replay"}, tc.args...)...)
			want := 2
			if name == "a prefix naming nothing" {
				want = 1 // not a usage error: the files are not there
			}
			if code != want || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want %d naming %q:\n%s", code, want, tc.want, out)
			}
		})
	}
}

// `fpmbus up --demo-trace` needs --demo and replaces the synthetic load's flags.
func TestUpDemoTraceNeedsDemo(t *testing.T) {
	t.Setenv(envFPMPort, "")
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"without --demo":   {[]string{"--demo-trace", "x"}, "--demo-trace replays a recording as the demo's load: it needs --demo"},
		"with --demo-rate": {[]string{"--demo", "--demo-trace", "x", "--demo-rate", "5"}, "--demo-rate shapes the synthetic load"},
	} {
		t.Run(name, func(t *testing.T) {
			code, out := run(t, append([]string{"up", "--data-dir", t.TempDir()}, tc.args...)...)
			if code != 2 || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want 2 naming %q:\n%s", code, tc.want, out)
			}
		})
	}
}
