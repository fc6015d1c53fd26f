package streams

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrDestructive: a plan holds changes that can delete stored messages (see Change.Destructive) and
// was not forced. Nothing was changed.
var ErrDestructive = errors.New("streams: refused changes that can delete stored messages")

// plan is what `fpmbus streams apply` does on one server: create the streams that are missing and
// change the settings of existing ones that differ from the Config. It is the only path that changes
// an existing stream; components use Ensure.
type plan struct {
	Steps []step
	// FPMShards is the shard count the plan keeps or creates (1: the single stream FPM).
	FPMShards int
}

// step is one stream of a Plan: created (Create), changed (Changes), or left as it is (neither).
type step struct {
	Stream  string
	Create  bool
	Changes []Change
	// send is the configuration sent to the server: the definition for a new stream; for an existing
	// one its current configuration with the changed settings replaced, so that settings fpmbus does
	// not define (description, compression, placement, metadata) stay as the operator set them.
	send jetstream.StreamConfig
}

// NewPlan reads the current configuration of every fpmbus stream and compares it with c. The FPM
// streams are c.FPMShards shards, or the server's count when it is 0; a count other than the server's
// is an ErrShardMismatch error naming both (no plan changes the shard count).
func NewPlan(ctx context.Context, js jetstream.JetStream, c Config) (*plan, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	n, err := resolveShards(ctx, js, c)
	if err != nil {
		return nil, err
	}
	c.FPMShards = n
	p := &plan{FPMShards: n}
	for _, want := range c.All() {
		s, err := js.Stream(ctx, want.Name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			p.Steps = append(p.Steps, step{Stream: want.Name, Create: true, send: want})
		case err != nil:
			return nil, fmt.Errorf("streams: plan %s: %w", want.Name, err)
		default:
			current := s.CachedInfo().Config
			p.Steps = append(p.Steps, step{Stream: want.Name, Changes: Diff(current, want), send: withSettings(current, want)})
		}
	}
	return p, nil
}

// Destructive returns the plan's changes that can delete stored messages.
func (p *plan) Destructive() []Change {
	var out []Change
	for _, st := range p.Steps {
		for _, ch := range st.Changes {
			if ch.Destructive {
				out = append(out, ch)
			}
		}
	}
	return out
}

// Lines is the plan as text, one line per stream created or left as it is and one per changed
// setting: "FPM max_bytes 2097152 -> 100000 (can delete stored messages)".
func (p *plan) Lines() []string {
	var out []string
	for _, st := range p.Steps {
		switch {
		case st.Create:
			out = append(out, st.Stream+" does not exist: create")
		case len(st.Changes) == 0:
			out = append(out, st.Stream+" unchanged")
		}
		for _, ch := range st.Changes {
			line := ch.String()
			if ch.Destructive {
				line += " (can delete stored messages)"
			}
			out = append(out, line)
		}
	}
	return out
}

// Execute carries the plan out. Unless force is set, a plan with a destructive change is refused as a
// whole before anything is sent (ErrDestructive, naming each refused change): no stream is created or
// changed. A stream that changed on the server since NewPlan is overwritten with the planned settings.
func (p *plan) Execute(ctx context.Context, js jetstream.JetStream, force bool) error {
	if refused := p.Destructive(); len(refused) > 0 && !force {
		names := make([]string, len(refused))
		for i, ch := range refused {
			names[i] = ch.String()
		}
		return fmt.Errorf("%w: %s", ErrDestructive, strings.Join(names, "; "))
	}
	for _, st := range p.Steps {
		var err error
		switch {
		case st.Create:
			_, err = placed(ctx, "stream "+st.Stream, st.send.Replicas, func(ctx context.Context) (jetstream.Stream, error) {
				return js.CreateStream(ctx, st.send)
			})
		case len(st.Changes) > 0:
			_, err = placed(ctx, "stream "+st.Stream, st.send.Replicas, func(ctx context.Context) (jetstream.Stream, error) {
				return js.UpdateStream(ctx, st.send)
			})
		}
		if err != nil {
			return fmt.Errorf("streams: apply %s: %w", st.Stream, err)
		}
	}
	return nil
}

// Apply creates or updates every fpmbus stream to c, destructive changes included: it is
// `fpmbus streams apply --force` (NewPlan, then Execute with force). Calling it again with the same
// Config changes nothing. Components never call it: they use Ensure.
func Apply(ctx context.Context, js jetstream.JetStream, c Config) error {
	p, err := NewPlan(ctx, js, c)
	if err != nil {
		return err
	}
	return p.Execute(ctx, js, true)
}

// PrintAndApply is `fpmbus streams apply`: it prints the plan, FPM_DATASETS's protection included
// (one line per changed setting), to stdout and carries it out (not with dryRun), refusing as a whole
// a plan with a change that can delete stored messages unless force is set.
func PrintAndApply(ctx context.Context, js jetstream.JetStream, cfg Config, dryRun, force bool, stdout io.Writer) error {
	plan, err := NewPlan(ctx, js, cfg)
	if err != nil {
		return err
	}
	// FPM_DATASETS: created protected, or given the protection it lacks (every such change keeps what
	// the bucket holds).
	if err := plan.AddDatasets(ctx, js, cfg); err != nil {
		return err
	}
	for _, line := range plan.Lines() {
		fmt.Fprintln(stdout, line)
	}
	if dryRun {
		fmt.Fprintln(stdout, "dry run: nothing changed")
		return nil
	}
	if refused := plan.Destructive(); len(refused) > 0 && !force {
		names := make([]string, len(refused))
		for i, ch := range refused {
			names[i] = ch.String()
		}
		return fmt.Errorf("refused changes that can delete stored messages: %s; nothing was changed (rerun with --force to apply them)",
			strings.Join(names, "; "))
	}
	return plan.Execute(ctx, js, force)
}
