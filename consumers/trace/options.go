package trace

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// Write retry defaults (see WithWriteRetry).
const (
	DefaultRetryInitial = 100 * time.Millisecond
	DefaultRetryMax     = 30 * time.Second
)

// Option configures a Consumer (New) or a Backfill beyond Config. Every option checks its value.
// WithLogger, WithClock and WithMemberID are the options every durable stage takes (consumers/durable's).
type Option func(*settings) error

// settings are what the options set; defaultSettings holds every default. The registerer is
// Config.Registerer.
type settings struct {
	durable.Settings
	level int
	retry func() backoff.BackOff
	open  func(path string) (file, error) // tests inject faults
	segs  *ProcessSegments
}

func defaultSettings() settings {
	return settings{
		Settings: durable.DefaultSettings(),
		level:    tracefile.DefaultCompressionLevel,
		retry:    retryPolicy(DefaultRetryInitial, DefaultRetryMax),
		open:     createFile,
	}
}

// prepare checks what New and Backfill both take, in this order: cfg, js and the options, and returns
// the settings.
func prepare(cfg Config, js jetstream.JetStream, opts []Option) (settings, error) {
	s := defaultSettings()
	err := durable.CheckStage(cfg.Validate, js, &s, ErrInvalidConfig, opts)
	return s, err
}

// shared makes one of the options every durable stage takes a trace writer's option.
func shared(o durable.Option) Option { return func(s *settings) error { return o(&s.Settings) } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return shared(durable.WithLogger(l)) }

// WithClock sets the clock of the lines' writer-relative "timestamp" and of the sampled mode's
// wall-clock fallback (tests pin it).
func WithClock(now func() time.Time) Option { return shared(durable.WithClock(now)) }

// WithCompressionLevel sets the gzip level of new members (1 fastest … 9 smallest; default
// tracefile.DefaultCompressionLevel).
func WithCompressionLevel(level int) Option {
	return func(s *settings) error {
		if err := tracefile.CheckCompressionLevel(level); err != nil {
			return err
		}
		s.level = level
		return nil
	}
}

// WithWriteRetry sets the backoff of a failed segment write (disk full, I/O error, unwritable
// directory): exponential from initial to at most maxWait, with jitter, retried until it succeeds or
// the partition is released (defaults DefaultRetryInitial, DefaultRetryMax).
func WithWriteRetry(initial, maxWait time.Duration) Option {
	return func(s *settings) error {
		if initial <= 0 || maxWait < initial {
			return fmt.Errorf("write retry %v..%v: want 0 < initial <= max", initial, maxWait)
		}
		s.retry = retryPolicy(initial, maxWait)
		return nil
	}
}

// WithMemberID names this instance in its group (default <host>-<pid>-<random>). The id is stable:
// it says a restarted process is the same instance, so that its previous incarnation's partitions are
// taken back at once instead of after PinnedTTL (consumers/partition). Give each running instance its
// own id (`fpmbus up` derives one from the host and its data directory). Letters, digits, '-' and '_',
// at most 64. A Backfill has no group and ignores it.
func WithMemberID(id string) Option {
	if !streams.ValidName(id, durable.MaxGroupNameLen) {
		return func(*settings) error {
			return fmt.Errorf("member id %q (--member-id): want 1-64 letters, digits, '-' and '_'", id)
		}
	}
	return shared(durable.WithMemberID(id))
}

// WithProcessSegments shares ps among the Consumers that succeed one another in this process on one
// output (the incarnations of a component its supervisor restarts): a producer's segment is then
// continued across them as within one Consumer (see ProcessSegments), instead of each incarnation
// starting a new segment. Default: a ProcessSegments of the Consumer's own. A Backfill ignores it.
func WithProcessSegments(ps *ProcessSegments) Option {
	return func(s *settings) error {
		if ps == nil {
			return fmt.Errorf("process segments: nil")
		}
		s.segs = ps
		return nil
	}
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
