package durable

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Settings are what a Runner takes beyond Config, set with Options. Every stage built on a Runner
// takes the same settings: it keeps a Settings of its own, offers these options as its own (each
// stage's WithLogger, WithMemberID, ... wraps the one here, so a value is checked once, in one place)
// and hands them to its Runner with Inherit.
type Settings struct {
	// Logger [slog.Default()].
	Logger *slog.Logger
	// Registerer receives the metrics [nil: not registered].
	Registerer prometheus.Registerer
	// MemberID names the instance in its partition group ["": <host>-<pid>-<random>; see partition].
	MemberID string
	// Clock [time.Now]: a Runner's ticks and in-progress acks, a stage's own timing.
	Clock func() time.Time
}

// DefaultSettings are the settings before any option.
func DefaultSettings() Settings {
	return Settings{Logger: slog.Default(), Clock: time.Now}
}

// Option sets one of Settings and checks its value. Its error names the bad value only: whoever
// applies it (New, a stage's constructor) wraps its own ErrInvalidConfig around it with ApplyOptions.
type Option func(*Settings) error

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return setting(l != nil, "nil logger", func(s *Settings) { s.Logger = l })
}

// WithRegisterer registers the metrics with reg (default: not registered).
func WithRegisterer(reg prometheus.Registerer) Option {
	return setting(reg != nil, "nil registerer", func(s *Settings) { s.Registerer = reg })
}

// WithMemberID names this instance in its group (default <host>-<pid>-<random>; see partition).
func WithMemberID(id string) Option {
	return setting(id != "", "empty member id", func(s *Settings) { s.MemberID = id })
}

// WithClock sets the clock (default time.Now): a Runner's ticks and in-progress acks.
func WithClock(now func() time.Time) Option {
	return setting(now != nil, "nil clock", func(s *Settings) { s.Clock = now })
}

// setting is an Option that sets a value with set when it is usable (ok), and is refused with why
// otherwise.
func setting(ok bool, why string, set func(*Settings)) Option {
	return func(s *Settings) error {
		if !ok {
			return errors.New(why)
		}
		set(s)
		return nil
	}
}

// Inherit hands a stage's logger, registerer and member id (those it set) to the stage's Runner.
// The stage's clock stays with the stage: it paces the stage's own decisions (tests pin it), while
// the runner's ticks and in-progress acks keep to the wall clock that the server's AckWait runs on.
func Inherit(stage Settings) Option {
	return func(s *Settings) error {
		if stage.Logger != nil {
			s.Logger = stage.Logger
		}
		if stage.Registerer != nil {
			s.Registerer = stage.Registerer
		}
		if stage.MemberID != "" {
			s.MemberID = stage.MemberID
		}
		return nil
	}
}

// NewStageRunner is New for a stage that takes the shared Settings: what the stage set (stage) goes to
// the runner with Inherit, the runner's log lines are labelled component=cfg.Name like the stage's own,
// and a cfg the runner refuses is an error wrapping sentinel (the stage's ErrInvalidConfig), since cfg
// is built from the stage's configuration.
func NewStageRunner(cfg Config, js jetstream.JetStream, c Consumer, stage Settings, sentinel error) (*Runner, error) {
	r, err := New(cfg, js, c, Inherit(stage), WithLogger(stage.Logger.With("component", cfg.Name)))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", sentinel, err)
	}
	return r, nil
}

// ApplyOptions applies opts to dst in order and stops at the first error, which it returns wrapped in
// sentinel (the applier's ErrInvalidConfig), so that errors.Is finds the sentinel of the package whose
// constructor was called. A stage applies its own option type, whose shared options wrap the ones
// above, with it too.
func ApplyOptions[T any, O ~func(*T) error](dst *T, sentinel error, opts []O) error {
	for _, o := range opts {
		if err := o(dst); err != nil {
			return fmt.Errorf("%w: %w", sentinel, err)
		}
	}
	return nil
}

// CheckStage is what every stage's constructor does first, in this order: check (and, where the stage
// fills defaults, complete) the stage's configuration with check, whose errors wrap sentinel already;
// refuse a nil js; apply the stage's options to dst (ApplyOptions). Nothing is asked of the server.
func CheckStage[T any, O ~func(*T) error](check func() error, js jetstream.JetStream, dst *T, sentinel error, opts []O) error {
	if err := check(); err != nil {
		return err
	}
	if js == nil {
		return fmt.Errorf("%w: nil JetStream", sentinel)
	}
	return ApplyOptions(dst, sentinel, opts)
}
