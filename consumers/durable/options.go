package durable

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
)

// Settings are what a Runner, and every stage built on one, takes beyond its configuration, set with
// Options: who the instance is and what clock it keeps. They are the same for every stage: a stage's
// constructor takes ...durable.Option and hands the same options to its Runner. What an operator
// configures (and the logger and Prometheus registerer, as for every component) is in Config.
type Settings struct {
	// MemberID names the instance in its partition group ["": <host>-<pid>-<random>].
	MemberID string
	// Clock [time.Now]: a stage's own timing (tests pin it). A Runner's ticks and in-progress acks keep
	// to the wall clock that the server's AckWait runs on.
	Clock func() time.Time
}

// defaultSettings are the settings before any option.
func defaultSettings() Settings { return Settings{Clock: time.Now} }

// Option sets one of Settings and checks its value. Its error names the bad value only: whoever
// applies it (New, a stage's constructor, with CheckStage) wraps its own errInvalidConfig around it.
type Option func(*Settings) error

// WithMemberID names this instance in its group (default <host>-<pid>-<random>). The id is stable: it
// says a restarted process is the same instance, so that its previous incarnation's partitions are
// taken back at once instead of after PinnedTTL. Give each running instance its own id (`fpmbus up`
// derives one from the host and its data directory). Letters, digits, '-' and '_', at most
// maxGroupNameLen.
func WithMemberID(id string) Option {
	return setting(streams.ValidName(id, maxGroupNameLen),
		fmt.Sprintf("member id %q: want 1-64 letters, digits, '-' and '_'", id),
		func(s *Settings) { s.MemberID = id })
}

// WithClock sets the clock of a stage's own timing (default time.Now).
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

// ApplyOptions applies opts to the default settings in order and stops at the first error, which it
// returns wrapped in sentinel (the applier's errInvalidConfig), so that errors.Is finds the sentinel of
// the package whose constructor was called.
func ApplyOptions(sentinel error, opts []Option) (Settings, error) {
	s := defaultSettings()
	for _, o := range opts {
		if err := o(&s); err != nil {
			return s, fmt.Errorf("%w: %w", sentinel, err)
		}
	}
	return s, nil
}

// CheckStage is what every stage's constructor does first, in this order: check (and, where the stage
// fills defaults, complete) the stage's configuration with check, whose errors wrap sentinel already;
// refuse a nil js; apply the options (ApplyOptions). Nothing is asked of the server.
func CheckStage(check func() error, js jetstream.JetStream, sentinel error, opts []Option) (Settings, error) {
	if err := check(); err != nil {
		return Settings{}, err
	}
	if js == nil {
		return Settings{}, fmt.Errorf("%w: nil JetStream", sentinel)
	}
	return ApplyOptions(sentinel, opts)
}
