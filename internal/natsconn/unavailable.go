package natsconn

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
)

// Server error codes nats.go names only in its legacy API.
const (
	// ErrCodeJetStreamUnavailable is "JetStream system temporarily unavailable" (HTTP-like code 503):
	// the meta leader, or the stream's leader, is being elected.
	ErrCodeJetStreamUnavailable jetstream.ErrorCode = 10008
	// errCodeInsufficientResources is "insufficient resources", e.g. a peer of an R3 stream is down.
	errCodeInsufficientResources jetstream.ErrorCode = 10023
)

// Unavailable reports errors after which the same server call can succeed later: the cluster is
// electing a leader for a stream, a bucket or JetStream itself (an R3 stream whose leader stopped
// answers again once the others have elected one, within the server's longest election timeout of
// 9 s), cannot place replicas yet, or a request went unanswered on the way. JetStream disabled for
// the account is not: it does not change by waiting.
func Unavailable(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return true
	case errors.As(err, &apiErr):
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeJetStreamNotEnabled, jetstream.JSErrCodeJetStreamNotEnabledForAccount:
			return false
		case ErrCodeJetStreamUnavailable, errCodeInsufficientResources, streams.ErrCodeNoPeers:
			return true
		}
		return apiErr.Code == 503
	}
	return false
}
