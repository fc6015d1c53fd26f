package partition

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// headerStreamSource is the header the server adds to a sourced message:
// "<stream> <sequence> <filter> <transform> <original subject>".
const headerStreamSource = "Nats-Stream-Source"

// partMsg is a message of a partition stream shown as the original: its subject without the
// "<partition>." prefix. Everything else (data, headers, Ack/Term, metadata of the partition stream)
// is the underlying message's.
type partMsg struct {
	jetstream.Msg
	subject string
}

func (m *partMsg) Subject() string { return m.subject }

func wrap(m jetstream.Msg) jetstream.Msg {
	s := m.Subject()
	if i := strings.IndexByte(s, '.'); i >= 0 {
		s = s[i+1:]
	}
	return &partMsg{Msg: m, subject: s}
}

// StreamSequence is the sequence of a handed message in the group's own stream (Config.Stream), also
// when the group reads a partition stream (P > 1: read from the Nats-Stream-Source header the server
// adds while sourcing). It grows with every message of a key, so an output can store the last one it
// made durable per key and recognise a redelivered message it already wrote (see the package comment).
func StreamSequence(m jetstream.Msg) (uint64, error) {
	if pm, ok := m.(*partMsg); ok {
		h := pm.Headers().Get(headerStreamSource)
		f := strings.Fields(h)
		if len(f) < 2 {
			return 0, fmt.Errorf("partition: %s header %q: no sequence", headerStreamSource, h)
		}
		seq, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("partition: %s header %q: %w", headerStreamSource, h, err)
		}
		return seq, nil
	}
	md, err := m.Metadata()
	if err != nil {
		return 0, fmt.Errorf("partition: message metadata: %w", err)
	}
	return md.Sequence.Stream, nil
}
