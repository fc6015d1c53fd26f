package partition

import (
	"testing"

	"go.uber.org/goleak"
)

// nats-server leaves a source-setup request, and the request that deletes a source's consumer when a
// sourcing stream lets it go, waiting for its answer or its own timeout, not for the server's shutdown:
// a cluster test that stops its servers while a partition stream sets up or drops a source (after a
// leader change) leaves it behind for that timeout. It is the server's, bounded, and not ours.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*stream).trySetupSourceConsumer.func3"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*stream).tryDeleteSourcingConsumer.func1"))
}
