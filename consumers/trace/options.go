package trace

import (
	"cmp"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/tracefile"
)

// Write retry defaults (see Config.RetryInitial).
const (
	defaultRetryInitial = 100 * time.Millisecond
	defaultRetryMax     = 30 * time.Second
)

// settings are what a writer runs with: the options every durable stage takes (member id, clock) and
// what Config says of the logger, the gzip level, the write retry and the shared segments.
type settings struct {
	durable.Settings
	Logger *slog.Logger
	level  int
	retry  func() backoff.BackOff
	open   func(path string) (file, error) // tests inject faults
	segs   *processSegments
}

// newSettings applies opts to the defaults: slog.Default(), tracefile.DefaultCompressionLevel, the
// default write retry.
func newSettings(opts []durable.Option) (settings, error) {
	ds, err := durable.ApplyOptions(ErrInvalidConfig, opts)
	return settings{
		Settings: ds,
		Logger:   slog.Default(),
		level:    tracefile.DefaultCompressionLevel,
		retry:    retryPolicy(defaultRetryInitial, defaultRetryMax),
		open:     createFile,
	}, err
}

// configured is s with cfg's logger, gzip level, write retry and shared segments where cfg sets them.
func (s settings) configured(cfg Config) settings {
	if cfg.Logger != nil {
		s.Logger = cfg.Logger
	}
	s.level = cmp.Or(cfg.CompressionLevel, s.level)
	if cfg.RetryInitial != 0 || cfg.RetryMax != 0 {
		s.retry = retryPolicy(cfg.retryBounds())
	}
	s.segs = cfg.Segments
	return s
}

// prepare checks what New and Backfill both take, in this order: cfg, js and the options, and returns
// the settings.
func prepare(cfg Config, js jetstream.JetStream, opts []durable.Option) (settings, error) {
	if _, err := durable.CheckStage(cfg.Validate, js, ErrInvalidConfig, opts); err != nil {
		return settings{}, err
	}
	s, err := newSettings(opts)
	return s.configured(cfg), err
}

// retryBounds are the write retry's first and longest wait, defaults filled.
func (c Config) retryBounds() (initial, maxWait time.Duration) {
	return cmp.Or(c.RetryInitial, defaultRetryInitial), cmp.Or(c.RetryMax, defaultRetryMax)
}

func retryPolicy(initial, maxWait time.Duration) func() backoff.BackOff {
	return func() backoff.BackOff {
		b := backoff.NewExponentialBackOff()
		b.InitialInterval = initial
		b.MaxInterval = maxWait
		b.MaxElapsedTime = 0 // until the disk takes the data again, or the partition is released
		b.Reset()
		return b
	}
}
