package trace

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	c, err := ConfigFromEnv(env())
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != "sampled" || c.OutputPath != "/tmp/dynamo-fpm" || c.SampleInterval != 5*time.Second ||
		c.RollBytes != 268435456 || c.MaxSegments != 4 || c.Group != "fpm-trace" || c.FilterSubject != "fpm.>" ||
		c.FlushInterval != time.Second || c.BufferSize != 1<<20 || c.Partitions != 0 || c.PinnedTTL != 10*time.Second {
		t.Fatalf("defaults: %+v", c)
	}

	for name, tc := range map[string]struct {
		env   []string
		check func(Config) bool
	}{
		"mode is case-insensitive and trimmed": {[]string{EnvMode, " FULL "}, func(c Config) bool { return c.Mode == "full" }},
		"output path":                          {[]string{EnvOutputPath, "/data/t.jsonl.gz"}, func(c Config) bool { return c.OutputPath == "/data/t.jsonl.gz" }},
		"sample interval in ms":                {[]string{EnvSampleInterval, "250"}, func(c Config) bool { return c.SampleInterval == 250*time.Millisecond }},
		"roll bytes":                           {[]string{EnvRollBytes, "1024"}, func(c Config) bool { return c.RollBytes == 1024 }},
		"max segments":                         {[]string{EnvMaxSegments, " 9 "}, func(c Config) bool { return c.MaxSegments == 9 }},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := ConfigFromEnv(env(tc.env...))
			if err != nil || !tc.check(c) {
				t.Fatalf("%+v, %v", c, err)
			}
		})
	}

	for name, tc := range map[string]struct{ name, value string }{
		"unknown mode":                    {EnvMode, "everything"},
		"blank output path":               {EnvOutputPath, "   "},
		"zero interval":                   {EnvSampleInterval, "0"},
		"negative interval":               {EnvSampleInterval, "-5"},
		"fractional interval":             {EnvSampleInterval, "1.5"},
		"interval with unit":              {EnvSampleInterval, "5s"},
		"interval overflowing a duration": {EnvSampleInterval, "99999999999999999"},
		"zero roll bytes":                 {EnvRollBytes, "0"},
		"roll bytes overflowing int64":    {EnvRollBytes, "9223372036854775808"},
		"max segments zero":               {EnvMaxSegments, "0"},
		"max segments not a number":       {EnvMaxSegments, "four"},
		"interval validated in full mode": {EnvSampleInterval, "x"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ConfigFromEnv(env(EnvMode, modeFor(tc.name, tc.value), tc.name, tc.value))
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tc.name) || !strings.Contains(err.Error(), tc.value) {
				t.Fatalf("error %q does not name %s and %q", err, tc.name, tc.value)
			}
		})
	}
}

// modeFor returns the mode to set next to an invalid variable: full, to show the interval is
// validated in both modes, unless the mode itself is under test.
func modeFor(name, value string) string {
	if name == EnvMode {
		return value
	}
	return "full"
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		mutate func(*Config)
		want   string
	}{
		"mode":                     {func(c *Config) { c.Mode = "Full" }, "--trace-mode"},
		"blank output":             {func(c *Config) { c.OutputPath = " " }, "--trace-output"},
		"sub-millisecond interval": {func(c *Config) { c.SampleInterval = 1500 * time.Microsecond }, "--sample-interval"},
		"roll bytes":               {func(c *Config) { c.RollBytes = 0 }, "--roll-bytes"},
		"max segments":             {func(c *Config) { c.MaxSegments = -1 }, "--max-segments"},
		"group with a dot":         {func(c *Config) { c.Group = "a.b" }, "--group"},
		"negative partitions":      {func(c *Config) { c.Partitions = -1 }, "--partitions"},
		"pinned TTL below 3s":      {func(c *Config) { c.PinnedTTL = time.Second }, "--pinned-ttl"},
		"ack wait below 1s": {func(c *Config) {
			c.AckWait = 500 * time.Millisecond
			c.Mode = "full"
			c.FlushInterval = 100 * time.Millisecond
		}, "ack wait"},
		"producer id, 2 partitions": {func(c *Config) { c.ProducerID = "p"; c.Partitions = 2 }, "--producer-id"},
		"output name too long":      {func(c *Config) { c.OutputPath = "/tmp/" + strings.Repeat("n", maxOutputBaseName+1) + ".jsonl.gz" }, "--trace-output"},
		"filter outside FPM":        {func(c *Config) { c.FilterSubject = "fpmevents.>" }, "--filter"},
		"flush interval":            {func(c *Config) { c.FlushInterval = 0 }, "flush interval"},
		"buffer size":               {func(c *Config) { c.BufferSize = 0 }, "buffer size"},
		"stop timeout":              {func(c *Config) { c.StopTimeout = 0 }, "stop timeout"},
		"max ack pending":           {func(c *Config) { c.MaxAckPending = 1 }, "max ack pending"},
		"ack wait below interval":   {func(c *Config) { c.AckWait = 5 * time.Second }, "ack wait"},
	} {
		t.Run(name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mutate(&c)
			err := c.Validate()
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error naming %s", err, tc.want)
			}
		})
	}
	c := DefaultConfig()
	c.SampleInterval = 10 * time.Minute
	if err := c.Validate(); err != nil {
		t.Fatalf("long interval with automatic ack wait: %v", err)
	}
	if got := c.ackWait(); got < 20*time.Minute {
		t.Fatalf("automatic ack wait %v does not cover two sample intervals", got)
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}
