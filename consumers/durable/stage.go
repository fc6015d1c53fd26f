package durable

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// Stage is the Runner of a stage as the stage's exported type shows it (merge.Consumer,
// seal.Consumer): the type embeds a Stage, so the runner's readiness and partition ownership are its
// own, and its own Run, which first prepares what the stage needs (streams, buckets), ends with
// Stage.Run. The stage's Consumer stays unexported; only what every stage offers is shown.
type Stage struct{ runner *Runner }

// NewStage builds a stage's Runner as NewStageRunner does (the stage's settings inherited, a refused
// cfg wrapped in sentinel) and wraps it in a Stage.
func NewStage(cfg Config, js jetstream.JetStream, c Consumer, set Settings, sentinel error) (Stage, error) {
	r, err := NewStageRunner(cfg, js, c, set, sentinel)
	if err != nil {
		return Stage{}, err
	}
	return Stage{runner: r}, nil
}

// Ready is closed once Run has prepared what the stage needs, joined the group and is taking
// partitions. It is never closed if Run fails before that; wait for Run's result as well.
func (s Stage) Ready() <-chan struct{} { return s.runner.Ready() }

// Owned lists the partitions this instance owns now.
func (s Stage) Owned() []int { return s.runner.Owned() }

// Run joins the group and runs the stage until ctx ends (Runner.Run). A stage's own Run calls it
// last, once what the stage needs exists.
func (s Stage) Run(ctx context.Context) error { return s.runner.Run(ctx) }
