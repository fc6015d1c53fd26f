package producer

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestFlagsConfig(t *testing.T) {
	for name, tc := range map[string]struct {
		load    bool // RegisterLoadFlags only
		prefix  string
		args    []string
		check   func(c Config) bool
		wantErr string
	}{
		"defaults are the Config's": {args: nil, check: func(c Config) bool {
			return c.Host == DefaultHost && c.BasePort == DefaultBasePort && c.DPSize == 1 && c.Rate == 7 &&
				c.HeartbeatInterval == DefaultHeartbeatInterval && c.WaitTimeout == 30*time.Second
		}},
		"every flag": {args: []string{"--host", "*", "--fpm-port", "4000", "--dp-size", "3", "--worker-id", "w", "--rate", "0",
			"--count", "5", "--idle-after-count", "--heartbeat", "2s", "--queue-size", "9", "--send-hwm", "8", "--seed", "4",
			"--start-delay", "1s", "--wait-subscribers", "2", "--wait-timeout", "5s"},
			check: func(c Config) bool {
				return c.Host == "*" && c.BasePort == 4000 && c.DPSize == 3 && c.WorkerID == "w" && c.Rate == 0 && c.Count == 5 &&
					c.IdleAfterCount && c.HeartbeatInterval == 2*time.Second && c.QueueSize == 9 && c.SendHWM == 8 && c.Seed == 4 &&
					c.StartDelay == time.Second && c.WaitSubscribers == 2 && c.WaitTimeout == 5*time.Second
			}},
		"load flags with a prefix": {load: true, prefix: "demo-", args: []string{"--demo-rate", "3", "--demo-worker-id", "d", "--demo-seed", "9"},
			check: func(c Config) bool { return c.Rate == 3 && c.WorkerID == "d" && c.Seed == 9 }},
		"queue size zero":         {args: []string{"--queue-size", "0"}, wantErr: "--queue-size 0"},
		"idle needs count":        {args: []string{"--idle-after-count"}, wantErr: "--idle-after-count needs --count"},
		"prefix in messages":      {prefix: "p-", args: []string{"--p-heartbeat", "0s"}, wantErr: "--p-heartbeat 0s"},
		"dp-size given overflows": {args: []string{"--dp-size", "100000"}, wantErr: "--dp-size 100000: the last rank's port 120379 exceeds 65535 (base port 20380, the default)"},
		"port out of range":       {args: []string{"--fpm-port", "70000"}, wantErr: "--fpm-port 70000: want a port"},
	} {
		t.Run(name, func(t *testing.T) {
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			c := Config{Rate: 7}
			var f *Flags
			if tc.load {
				f = c.RegisterLoadFlags(fs, tc.prefix)
			} else {
				f = c.RegisterFlags(fs, tc.prefix)
			}
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
