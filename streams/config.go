package streams

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream and bucket names.
const (
	StreamFPM      = "FPM"
	StreamEvents   = "FPM_EVENTS"
	StreamBench    = "FPM_BENCH"
	BucketDatasets = "FPM_DATASETS"
)

// defaultDuplicateWindow covers the bridge's own publish retries (ack timeout plus backoff), not more.
// The server keeps every message id inside the window in memory: at 100 ranks x 100 FPM/s a 2-minute
// window holds 1.2M ids (~gigabytes with per-id overhead across a fleet), 30 s holds a quarter of that.
const defaultDuplicateWindow = 30 * time.Second

// Config holds the server-side settings of fpmbus's streams. The zero value is not valid; start from
// DefaultConfig, whose values suit one embedded node.
type Config struct {
	Replicas     int           `json:"replicas"`
	MaxAge       time.Duration `json:"max_age"`
	MaxBytes     int64         `json:"max_bytes"`
	EventsMaxAge time.Duration `json:"events_max_age"`
	// EventsMaxBytes bounds FPM_EVENTS in bytes (-1: no limit); the oldest events go first. Dead letters
	// carry up to max_payload of raw input each, so without a bound a flood of bad input fills the disk
	// for EventsMaxAge.
	EventsMaxBytes  int64         `json:"events_max_bytes"`
	BenchMaxAge     time.Duration `json:"bench_max_age"`
	DuplicateWindow time.Duration `json:"duplicate_window"`
	// MaxMsgSize bounds one message on FPM_BENCH (benchmark artefacts are large). -1 = server limit.
	BenchMaxMsgSize int32 `json:"bench_max_msg_size"`
	Storage         jetstream.StorageType
	// FPMShards is how many streams FPMs are spread over (shards.go): 1 is the single stream FPM,
	// n > 1 the streams FPM_0 … FPM_<n-1>. 0 means "what the server has" (Ensure and NewPlan discover
	// it; 1 where no FPM stream exists yet): components that only use the streams leave it 0, and only
	// `fpmbus streams apply --fpm-shards` and `fpmbus up --fpm-shards` declare it.
	FPMShards int `json:"fpm_shards,omitempty"`
}

// DefaultEventsMaxBytes bounds FPM_EVENTS: dead letters, drop markers and gap events, oldest first.
const DefaultEventsMaxBytes = 1 << 30

// DefaultConfig: one replica, file storage, FPM kept 7 days or 10 GiB, events 30 days or 1 GiB,
// artefacts 90 days.
func DefaultConfig() Config {
	return Config{
		Replicas:        1,
		MaxAge:          7 * 24 * time.Hour,
		MaxBytes:        10 << 30,
		EventsMaxAge:    30 * 24 * time.Hour,
		EventsMaxBytes:  DefaultEventsMaxBytes,
		BenchMaxAge:     90 * 24 * time.Hour,
		DuplicateWindow: defaultDuplicateWindow,
		BenchMaxMsgSize: -1,
		Storage:         jetstream.FileStorage,
	}
}

// Validate reports the first setting that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Replicas < 1 || c.Replicas > 5:
		return fmt.Errorf("streams: replicas %d: want 1 to 5", c.Replicas)
	case c.MaxAge < 0 || c.EventsMaxAge < 0 || c.BenchMaxAge < 0:
		return fmt.Errorf("streams: max age must not be negative")
	case c.EventsMaxBytes == 0 || c.EventsMaxBytes < -1:
		return fmt.Errorf("streams: events max bytes %d: want a positive size or -1 (no limit)", c.EventsMaxBytes)
	case c.DuplicateWindow <= 0:
		return fmt.Errorf("streams: duplicate window %v must be positive", c.DuplicateWindow)
	case c.MaxAge > 0 && c.DuplicateWindow > c.MaxAge:
		return fmt.Errorf("streams: duplicate window %v exceeds max age %v", c.DuplicateWindow, c.MaxAge)
	case c.FPMShards < 0 || c.FPMShards > MaxFPMShards:
		return fmt.Errorf("streams: FPM shards %d: want 1 to %d (0: what the server has)", c.FPMShards, MaxFPMShards)
	}
	return nil
}

// stream is the definition every fpmbus stream shares: limits retention, discard old, direct gets on,
// the duplicate window, storage and replicas from c.
func (c Config) stream(name, description, subject string, maxAge time.Duration, maxBytes int64) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:         name,
		Description:  description,
		Subjects:     []string{subject},
		Retention:    jetstream.LimitsPolicy,
		Discard:      jetstream.DiscardOld,
		MaxAge:       maxAge,
		MaxBytes:     maxBytes,
		MaxMsgs:      -1,
		MaxConsumers: -1,
		Storage:      c.Storage,
		Replicas:     c.Replicas,
		Duplicates:   c.DuplicateWindow,
		AllowDirect:  true,
	}
}

// FPMStream is the definition of the FPM stream. Atomic batch publish is on: the bridge commits queued
// FPMs in groups (one fsync per batch under sync_interval: always; see bridge/batch.go).
func (c Config) FPMStream() jetstream.StreamConfig {
	sc := c.stream(StreamFPM, "Dynamo forward-pass metrics, one canonical JSON FPM per message, bridged from ZMQ",
		FPMWildcard, c.MaxAge, c.MaxBytes)
	sc.AllowAtomicPublish = true
	return sc
}

// EventsStream is the definition of FPM_EVENTS (dead letters, drop markers, gap events).
func (c Config) EventsStream() jetstream.StreamConfig {
	return c.stream(StreamEvents, "fpmbus events: dead letters, bridge drop markers, gap events",
		EventsWildcard, c.EventsMaxAge, c.EventsMaxBytes)
}

// BenchStream is the definition of FPM_BENCH (rank and merged benchmark artefacts).
func (c Config) BenchStream() jetstream.StreamConfig {
	sc := c.stream(StreamBench, "fpmbus benchmark artefacts: per-rank self-benchmark files and merged artefacts",
		BenchWildcard, c.BenchMaxAge, -1)
	sc.MaxMsgSize = c.BenchMaxMsgSize
	return sc
}

// All returns every stream definition, in the order Apply creates them: the FPM stream, or its
// c.FPMShards shards (one stream FPM when FPMShards is 0 or 1), then FPM_EVENTS and FPM_BENCH.
func (c Config) All() []jetstream.StreamConfig {
	return append(c.FPMStreams(max(c.FPMShards, 1)), c.EventsStream(), c.BenchStream())
}
