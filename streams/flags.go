package streams

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// RegisterFlags defines the stream settings' flags on fs with c's values as defaults: --replicas,
// --max-age, --max-bytes, --events-max-age, --events-max-bytes, --bench-max-age, --duplicate-window
// (--storage is the command's: its refusal is a usage error of its own).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.Replicas, "replicas", c.Replicas, "stream replicas (1 for one node, 3 for a cluster)")
	fs.DurationVar(&c.MaxAge, "max-age", c.MaxAge, "how long the FPM stream keeps messages")
	fs.Var((*maxBytesValue)(&c.MaxBytes), "max-bytes", "size limit of the FPM stream in bytes (-1: none)")
	fs.DurationVar(&c.EventsMaxAge, "events-max-age", c.EventsMaxAge, "how long FPM_EVENTS keeps events")
	fs.Int64Var(&c.EventsMaxBytes, "events-max-bytes", c.EventsMaxBytes, "size limit of FPM_EVENTS in bytes, oldest events dropped first (-1: none)")
	fs.DurationVar(&c.BenchMaxAge, "bench-max-age", c.BenchMaxAge, "how long FPM_BENCH keeps artefacts")
	fs.DurationVar(&c.DuplicateWindow, "duplicate-window", c.DuplicateWindow, "JetStream duplicate window (covers the bridge's retries only; ids are held in server memory)")
}

// maxBytesValue is --max-bytes: a positive size, or -1 for no limit.
type maxBytesValue int64

func (v *maxBytesValue) String() string {
	if v == nil {
		return "0"
	}
	return strconv.FormatInt(int64(*v), 10)
}

func (v *maxBytesValue) Set(s string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 1 && n != -1 {
		return fmt.Errorf("want a positive size in bytes, or -1 for no limit")
	}
	*v = maxBytesValue(n)
	return nil
}
