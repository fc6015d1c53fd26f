package tracefile

import (
	"cmp"
	"fmt"
	"log/slog"
)

// DefaultCompressionLevel is the gzip level of new members: klauspost's level 1 (BestSpeed). Dynamo
// uses flate2's default (6); on trace lines, which repeat their keys, level 1 costs about 15-20% more
// disk (~20 instead of ~17 bytes per 700-byte line) and compresses about twice as fast, which keeps the
// writer close to the consumer's ack-only rate. The writer's Config.CompressionLevel and
// VerifyConfig.CompressionLevel choose another.
const DefaultCompressionLevel = 1

// checkCompressionLevel accepts a gzip level of new members: 1 fastest … 9 smallest.
func checkCompressionLevel(level int) error {
	if level < 1 || level > 9 {
		return fmt.Errorf("gzip level %d: want 1 to 9", level)
	}
	return nil
}

// settings are what Verify runs with: VerifyConfig's logger and gzip level, defaults filled.
type settings struct {
	logger *slog.Logger
	level  int
}

// newSettings fills cfg's logger (slog.Default()) and gzip level (DefaultCompressionLevel) and checks
// the level; a refusal wraps ErrInvalidConfig.
func newSettings(cfg VerifyConfig) (settings, error) {
	s := settings{logger: cmp.Or(cfg.Logger, slog.Default()), level: cmp.Or(cfg.CompressionLevel, DefaultCompressionLevel)}
	if err := checkCompressionLevel(s.level); err != nil {
		return s, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return s, nil
}
