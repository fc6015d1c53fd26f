package natsconn

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
)

func TestUnavailable(t *testing.T) {
	t.Parallel()
	api := func(code int, ec jetstream.ErrorCode) error {
		return fmt.Errorf("streams: leader get: %w", &jetstream.APIError{Code: code, ErrorCode: ec})
	}
	tests := map[string]struct {
		err  error
		want bool
	}{
		"no responders":                     {nats.ErrNoResponders, true},
		"no stream response":                {jetstream.ErrNoStreamResponse, true},
		"request timed out":                 {nats.ErrTimeout, true},
		"call deadline":                     {context.DeadlineExceeded, true},
		"JetStream temporarily unavailable": {api(503, ErrCodeJetStreamUnavailable), true},
		"insufficient resources":            {api(500, errCodeInsufficientResources), true},
		"no peers for placement":            {api(500, streams.ErrCodeNoPeers), true},
		"another 503":                       {api(503, 10999), true},
		"JetStream not enabled":             {api(503, jetstream.JSErrCodeJetStreamNotEnabled), false},
		"JetStream not enabled, account":    {api(503, jetstream.JSErrCodeJetStreamNotEnabledForAccount), false},
		"stream not found":                  {api(404, jetstream.JSErrCodeStreamNotFound), false},
		"message not found":                 {jetstream.ErrMsgNotFound, false},
		"cancelled by the caller":           {context.Canceled, false},
		"an error that is not the server's": {errors.New("disk full"), false},
		"nil":                               {nil, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := Unavailable(tc.err); got != tc.want {
				t.Fatalf("Unavailable(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
