package producer

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	tests := map[string]struct {
		cfg  Config
		want string // substring of the error; "" for valid
	}{
		"zero value is valid":             {cfg: Config{}},
		"every rank on the bind-all host": {cfg: Config{Host: "*", DPSize: 4}},
		"ipv6 loopback":                   {cfg: Config{Host: "::1"}},
		"endpoint given as host":          {cfg: Config{Host: "tcp://127.0.0.1"}, want: "not an endpoint"},
		"negative dp size":                {cfg: Config{DPSize: -1}, want: "dp size -1"},
		"port out of range":               {cfg: Config{BasePort: 70000}, want: "base port 70000"},
		"last rank beyond 65535":          {cfg: Config{BasePort: 65535, DPSize: 2}, want: "exceeds 65535"},
		"NaN rate":                        {cfg: Config{Rate: math.NaN()}, want: "rate NaN"},
		"negative count":                  {cfg: Config{Count: -1}, want: "count -1"},
		"idle after count without count":  {cfg: Config{IdleAfterCount: true}, want: "needs a count"},
		"negative heartbeat":              {cfg: Config{HeartbeatInterval: -time.Second}, want: "heartbeat interval"},
		"negative queue size":             {cfg: Config{QueueSize: -5}, want: "queue size -5"},
		"negative hwm":                    {cfg: Config{SendHWM: -1}, want: "send hwm -1"},
		"negative start delay":            {cfg: Config{StartDelay: -1}, want: "start delay"},
		"invalid utf-8 worker id":         {cfg: Config{WorkerID: "\xff"}, want: "not valid UTF-8"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig containing %q", err, tc.want)
			}
		})
	}
}

func TestConfigDefaultsAndEndpoint(t *testing.T) {
	c := Config{}.withDefaults()
	if c.Host != "127.0.0.1" || c.BasePort != 20380 || c.DPSize != 1 || c.QueueSize != 10_000 ||
		c.HeartbeatInterval != time.Second || c.SendHWM != 1000 || c.Linger != time.Second || c.Logger == nil {
		t.Fatalf("defaults = %+v", c)
	}
	if got := (Config{Linger: -1}).withDefaults().Linger; got != 0 {
		t.Errorf("negative Linger became %v, want 0", got)
	}
	for _, tc := range []struct {
		cfg  Config
		rank int
		want string
	}{
		{Config{}, 1, "tcp://127.0.0.1:20381"},
		{Config{Host: "*", BasePort: 30000}, 2, "tcp://*:30002"},
		{Config{Host: "::1", BasePort: 30000}, 0, "tcp://[::1]:30000"},
	} {
		if got := tc.cfg.Endpoint(tc.rank); got != tc.want {
			t.Errorf("%+v.Endpoint(%d) = %q, want %q", tc.cfg, tc.rank, got, tc.want)
		}
	}
}
