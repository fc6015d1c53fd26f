package trace

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Write retry defaults (see WithWriteRetry).
const (
	DefaultRetryInitial = 100 * time.Millisecond
	DefaultRetryMax     = 30 * time.Second
)

// Option configures a Consumer (New) or a Backfill beyond Config. Every option checks its value.
type Option func(*settings) error

// settings are what the options set; defaultSettings holds every default.
type settings struct {
	logger   *slog.Logger
	now      func() time.Time
	level    int
	retry    func() backoff.BackOff
	open     func(path string) (file, error) // tests inject faults
	memberID string
}

func defaultSettings() settings {
	return settings{
		logger: slog.Default(),
		now:    time.Now,
		level:  DefaultCompressionLevel,
		retry:  retryPolicy(DefaultRetryInitial, DefaultRetryMax),
		open:   createFile,
	}
}

func newSettings(opts []Option) (settings, error) {
	s := defaultSettings()
	for _, o := range opts {
		if err := o(&s); err != nil {
			return s, err
		}
	}
	return s, nil
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(s *settings) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidConfig)
		}
		s.logger = l
		return nil
	}
}

// WithClock sets the clock of the lines' writer-relative "timestamp" and of the sampled mode's
// wall-clock fallback (tests pin it).
func WithClock(now func() time.Time) Option {
	return func(s *settings) error {
		if now == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalidConfig)
		}
		s.now = now
		return nil
	}
}

// WithCompressionLevel sets the gzip level of new members (1 fastest … 9 smallest; default
// DefaultCompressionLevel).
func WithCompressionLevel(level int) Option {
	return func(s *settings) error {
		if level < 1 || level > 9 {
			return fmt.Errorf("%w: gzip level %d: want 1 to 9", ErrInvalidConfig, level)
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
			return fmt.Errorf("%w: write retry %v..%v: want 0 < initial <= max", ErrInvalidConfig, initial, maxWait)
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
	return func(s *settings) error {
		if !validMemberID(id) {
			return fmt.Errorf("%w: member id %q (--member-id): want 1-64 letters, digits, '-' and '_'", ErrInvalidConfig, id)
		}
		s.memberID = id
		return nil
	}
}

func validMemberID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if !producerByte(id[i]) {
			return false
		}
	}
	return true
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
