package streams

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Apply creates or updates every fpmbus stream. It is idempotent: calling it again with the same
// Config changes nothing, and every component calls it at start.
func Apply(ctx context.Context, js jetstream.JetStream, c Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	for _, sc := range c.All() {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("streams: apply %s: %w", sc.Name, err)
		}
	}
	return nil
}
