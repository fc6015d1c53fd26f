package trace

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/tracefile"
)

func TestDefaultConfigIsDynamos(t *testing.T) {
	t.Parallel()
	c := DefaultConfig()
	if c.Mode != "sampled" || c.OutputPath != "/tmp/dynamo-fpm" || c.SampleInterval != 5*time.Second ||
		c.RollBytes != 268435456 || c.MaxSegments != 4 || c.Group != "fpm-trace" || c.FilterSubject != "fpm.>" ||
		c.FlushInterval != time.Second || c.BufferSize != 1<<20 || c.Partitions != 0 || c.PinnedTTL != 10*time.Second {
		t.Fatalf("defaults: %+v", c)
	}
}

// The values of Dynamo's variables parse as Dynamo parses them: trimmed, the mode case-insensitive,
// numbers positive decimal integers with an optional '+', as Rust parses an unsigned integer (the
// empty string is none of them).
func TestParseDynamoValues(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]Mode{" FULL ": "full", "Sampled": "sampled", "": "", "everything": "", "ful": ""} {
		got, err := ParseMode(in)
		if got != want || (want == "") != errors.Is(err, ErrInvalidConfig) {
			t.Errorf("ParseMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for in, want := range map[string]int64{"250": 250, " 9 ": 9, "9223372036854775807": 1<<63 - 1,
		"+5": 5, " +5\t": 5, "007": 7, "+007": 7,
		"": 0, "   ": 0, "\t\n": 0, "0": 0, "+0": 0, "-0": 0, "-5": 0, "+": 0, "++5": 0, "+-5": 0, "-+5": 0,
		"+ 5": 0, "5 5": 0, "1_000": 0, "0x10": 0, "1.5": 0, "5s": 0, "four": 0, "9223372036854775808": 0} {
		got, err := ParsePositive(in)
		if got != want || (want == 0) != errors.Is(err, ErrInvalidConfig) {
			t.Errorf("ParsePositive(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
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
		"output name too long": {func(c *Config) {
			c.OutputPath = "/tmp/" + strings.Repeat("n", tracefile.MaxOutputBaseName+1) + ".jsonl.gz"
		}, "--trace-output"},
		"filter outside FPM":      {func(c *Config) { c.FilterSubject = "fpmevents.>" }, "--filter"},
		"flush interval":          {func(c *Config) { c.FlushInterval = 0 }, "flush interval"},
		"buffer size":             {func(c *Config) { c.BufferSize = 0 }, "buffer size"},
		"stop timeout":            {func(c *Config) { c.StopTimeout = 0 }, "stop timeout"},
		"max ack pending":         {func(c *Config) { c.MaxAckPending = 1 }, "max ack pending"},
		"ack wait below interval": {func(c *Config) { c.AckWait = 5 * time.Second }, "ack wait"},
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
