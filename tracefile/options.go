package tracefile

import (
	"errors"
	"fmt"
	"log/slog"
)

// DefaultCompressionLevel is the gzip level of new members: klauspost's level 1 (BestSpeed). Dynamo
// uses flate2's default (6); on trace lines, which repeat their keys, level 1 costs about 15-20% more
// disk (~20 instead of ~17 bytes per 700-byte line) and compresses about twice as fast, which keeps the
// writer close to the consumer's ack-only rate. The writer's and Verify's WithCompressionLevel
// choose another.
const DefaultCompressionLevel = 1

// CheckCompressionLevel accepts a gzip level of new members: 1 fastest … 9 smallest.
func CheckCompressionLevel(level int) error {
	if level < 1 || level > 9 {
		return fmt.Errorf("gzip level %d: want 1 to 9", level)
	}
	return nil
}

// Option configures Verify beyond VerifyConfig. Every option checks its value; Verify wraps
// ErrInvalidConfig around a refusal.
type Option func(*settings) error

// settings are what the options set.
type settings struct {
	logger *slog.Logger
	level  int
}

func newSettings(opts []Option) (settings, error) {
	s := settings{logger: slog.Default(), level: DefaultCompressionLevel}
	for _, o := range opts {
		if err := o(&s); err != nil {
			return s, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	return s, nil
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(s *settings) error {
		if l == nil {
			return errors.New("nil logger")
		}
		s.logger = l
		return nil
	}
}

// WithCompressionLevel sets the gzip level of the members a repair writes (CheckCompressionLevel;
// default DefaultCompressionLevel).
func WithCompressionLevel(level int) Option {
	return func(s *settings) error {
		if err := CheckCompressionLevel(level); err != nil {
			return err
		}
		s.level = level
		return nil
	}
}
