package bridge

import (
	"errors"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestFlagsConfig(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		prefix     string
		portSource string
		args       []string
		check      func(c Config) bool
		wantErr    string // the error names this; "" expects success
	}{
		"defaults": {args: nil, check: func(c Config) bool {
			return slices.Equal(c.Endpoints, []Endpoint{{URL: "tcp://127.0.0.1:20380", DPRank: 0}}) &&
				c.BasePort == DefaultFPMPort && c.DPSize == 1 && c.StopTimeout == defaultStopTimeout && c.MaxBuffer == defaultMaxBuffer
		}},
		"host, port and ranks": {args: []string{"--zmq-host", "10.0.0.7", "--fpm-port", "30000", "--dp-size", "2", "--stop-timeout", "3s"},
			check: func(c Config) bool {
				return slices.Equal(c.Endpoints, []Endpoint{{URL: "tcp://10.0.0.7:30000"}, {URL: "tcp://10.0.0.7:30001", DPRank: 1}}) &&
					c.StopTimeout == 3*time.Second
			}},
		"explicit endpoints, rank by position": {args: []string{"--zmq-endpoint", "h1:1,tcp://h2:2", "--zmq-endpoint", "h3:3"},
			check: func(c Config) bool {
				return slices.Equal(c.Endpoints, []Endpoint{{URL: "tcp://h1:1"}, {URL: "tcp://h2:2", DPRank: 1}, {URL: "tcp://h3:3", DPRank: 2}}) &&
					c.BasePort == 0 && c.DPSize == 0
			}},
		"prefixed names":                 {prefix: "b-", args: []string{"--b-fpm-port", "1000", "--b-dp-size", "3"}, check: func(c Config) bool { return len(c.Endpoints) == 3 && c.BasePort == 1000 }},
		"endpoint excludes dp-size":      {args: []string{"--zmq-endpoint", "h:1", "--dp-size", "2"}, wantErr: "--zmq-endpoint and --dp-size exclude each other"},
		"prefix in messages":             {prefix: "b-", args: []string{"--b-max-buffer", "0"}, wantErr: "--b-max-buffer 0"},
		"bad endpoint":                   {args: []string{"--zmq-endpoint", "nohostport"}, wantErr: `--zmq-endpoint "nohostport"`},
		"zero stop timeout":              {args: []string{"--stop-timeout", "0s"}, wantErr: "--stop-timeout 0s"},
		"blank namespace":                {args: []string{"--namespace", " "}, wantErr: "--namespace and --component must not be blank"},
		"dp-size given overflows":        {args: []string{"--dp-size", "100000"}, wantErr: "--dp-size 100000: the last rank's port 120379 exceeds 65535 (base port 20380, the default)"},
		"port given overflows":           {args: []string{"--fpm-port", "65535", "--dp-size", "2"}, wantErr: "--dp-size 2: the last rank's port 65536 exceeds 65535 (base port 65535, from --fpm-port)"},
		"given port out of range":        {portSource: "DYN_FORWARDPASS_METRIC_PORT", args: []string{"--dp-size", "2", "--fpm-port", "0"}, wantErr: "--fpm-port 0: want a port"},
		"environment's port, no dp flag": {portSource: "DYN_FORWARDPASS_METRIC_PORT", args: []string{"--max-buffer", "1"}, check: func(c Config) bool { return c.MaxBuffer == 1 }},
	} {
		t.Run(name, func(t *testing.T) {
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var c Config
			f := c.RegisterFlags(fs, tc.prefix)
			f.BasePortSource = tc.portSource
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			got, err := f.Config()
			if tc.wantErr != "" {
				if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Config: %v, want ErrInvalidConfig naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.check(got) {
				t.Fatalf("Config: %+v, %v", got, err)
			}
		})
	}
}

// A base port taken from the environment is blamed by its variable's name when the flag was not given.
func TestFlagsBlameTheBasePortSource(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c := Config{BasePort: 65535, DPSize: 2}
	f := c.RegisterFlags(fs, "")
	f.BasePortSource = "DYN_FORWARDPASS_METRIC_PORT"
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	_, err := f.Config()
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "DYN_FORWARDPASS_METRIC_PORT 65535 with 2 ranks") {
		t.Fatalf("Config: %v", err)
	}
}
