package partition

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// headerStreamSource is the header the server adds to a sourced message:
// "<stream> <sequence> <filter> <transform> <original subject>".
const headerStreamSource = "Nats-Stream-Source"

// handedMsg is a message as a session hands it to the handler: its JetStream metadata, which the
// session parses from the reply subject to check the delivery sequence, kept for the handler (a
// handler reads it again for every message: parsing it twice was a fifth of the partition path's own
// cost per message), and, for a message of a partition stream, the original subject: without the
// "<partition>." prefix. Everything else (data, headers, Ack/Term) is the underlying message's.
type handedMsg struct {
	jetstream.Msg
	subject string
	md      *jetstream.MsgMetadata
	part    bool // a partition stream's copy: the group stream's sequence is in headerStreamSource
}

func (m *handedMsg) Subject() string { return m.subject }

// Metadata returns the metadata parsed when the message was handed; it must not be modified.
func (m *handedMsg) Metadata() (*jetstream.MsgMetadata, error) { return m.md, nil }

// hand wraps m, whose metadata is md, for the handler; part says it is a partition stream's copy.
func hand(m jetstream.Msg, md *jetstream.MsgMetadata, part bool) jetstream.Msg {
	s := m.Subject()
	if part {
		if i := strings.IndexByte(s, '.'); i >= 0 {
			s = s[i+1:]
		}
	}
	return &handedMsg{Msg: m, subject: s, md: md, part: part}
}

// StreamSequence is the sequence of a handed message in the group's own stream (Config.Stream), also
// when the group reads a partition stream (P > 1: read from the Nats-Stream-Source header the server
// adds while sourcing). It grows with every message of a key, so an output can store the last one it
// made durable per key and recognise a redelivered message it already wrote (see the package comment).
func StreamSequence(m jetstream.Msg) (uint64, error) {
	if hm, ok := m.(*handedMsg); ok && hm.part {
		h := hm.Headers().Get(headerStreamSource)
		seq, err := sourceSequence(h)
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

// errNoSourceSequence: a Nats-Stream-Source header without a second field.
var errNoSourceSequence = errors.New("no sequence")

// sourceSequence is the second blank-separated field of a Nats-Stream-Source value: the message's
// sequence in the sourced stream.
func sourceSequence(h string) (uint64, error) {
	f := strings.TrimLeft(h, " \t")
	i := strings.IndexAny(f, " \t")
	if i < 0 {
		return 0, errNoSourceSequence
	}
	f = strings.TrimLeft(f[i:], " \t")
	if j := strings.IndexAny(f, " \t"); j >= 0 {
		f = f[:j]
	}
	if f == "" {
		return 0, errNoSourceSequence
	}
	return strconv.ParseUint(f, 10, 64)
}
