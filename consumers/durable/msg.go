package durable

import (
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Msg is one delivered message as a stage sees it. The stage reads it and says when it is done; the
// runner alone acknowledges, terminates or gives it back. Done and Reject may be called from any
// goroutine, once; later calls are ignored.
type Msg struct {
	raw jetstream.Msg
	// Partition is the partition the message belongs to (0 when the group has one).
	Partition int
	// StreamSeq is the message's sequence in the group's stream (the source stream also when the
	// group reads a partition copy). It grows with every message of a key: a stage keeps, durably with
	// its output, the last one written per key and skips a redelivered message at or below it.
	StreamSeq uint64
	// Delivered is how many times the server has delivered the message (1 the first time).
	Delivered uint64
	// Stored is when the stream stored the message.
	Stored time.Time

	ownSeq   uint64 // sequence in the stream the partition consumer reads
	sess     *session
	idx      uint64
	received time.Time
}

// Subject is the message's original subject (without a partition stream's prefix).
func (m *Msg) Subject() string { return m.raw.Subject() }

// Data is the message body. It must not be modified.
func (m *Msg) Data() []byte { return m.raw.Data() }

// Headers are the message headers. They must not be modified.
func (m *Msg) Headers() nats.Header { return m.raw.Headers() }

// Done says the message's effect is durable (or that it has none): the runner may acknowledge it.
func (m *Msg) Done() { m.sess.done(m.idx) }

// Reject says the message can never succeed: the runner publishes it as a dead letter naming reason,
// then acknowledges it as terminated. It is never delivered again.
func (m *Msg) Reject(reason error) { m.sess.reject(m, reason) }
