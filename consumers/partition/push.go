package partition

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The owner's subscription to its session subject, and the messages it hands on.
//
// The server delivers a partition's push consumer with flow control: past half of its window it sends
// a flow-control request and delivers no more once the window is full, until that request is
// answered. An owner that dies, or unsubscribes, with a request in flight leaves the consumer stalled:
// moving its subject and resetting it do not clear the stall, and the server tells the next subscriber
// only through a header of its idle heartbeats (Nats-Consumer-Stalled, naming the subject to answer).
// nats.go's push consumer answers requests but not that header, so a partition would stay stalled for
// every later owner. The subscription here is therefore the member's own: it answers both, watches the
// heartbeats (two missed end the session, as a lost owner) and hands data messages on as
// jetstream.Msg values whose acks are the JetStream ack protocol on the message's reply subject.

// Status headers of the server's control messages on a push consumer's subject.
const (
	headerStatus      = "Status"
	headerDescription = "Description"
	headerStalled     = "Nats-Consumer-Stalled"

	statusControl  = "100" // idle heartbeat or flow-control request
	statusConflict = "409" // the consumer was deleted, or its leader changed
)

// pushSub is a session's subscription; it reports the end of deliveries to the session (onEnd).
type pushSub struct {
	nc    *nats.Conn
	sub   *nats.Subscription
	onMsg func(*pushMsg)
	onEnd func(err error) // deliveries are lost: the session ends abruptly; err, if any, is fatal for the member
	hb    time.Duration

	// The delivery path only stores when it last heard from the server; the monitor, a timer re-armed
	// for what is left of two heartbeat intervals, compares. (Resetting a timer under a lock for every
	// message would put that work on the hot path.)
	lastHeard atomic.Int64 // Unix ns
	stopped   atomic.Bool
	mu        sync.Mutex // guards monitor against stop
	monitor   *time.Timer
}

// subscribe subscribes to subj and delivers its data messages to onMsg, on the subscription's
// goroutine, in order; control messages are answered here. onEnd is called at most once.
func subscribe(nc *nats.Conn, subj string, hb time.Duration, onMsg func(*pushMsg), onEnd func(err error)) (*pushSub, error) {
	s := &pushSub{nc: nc, onMsg: onMsg, onEnd: onEnd, hb: hb}
	s.lastHeard.Store(time.Now().UnixNano())
	sub, err := nc.Subscribe(subj, s.deliver)
	if err != nil {
		return nil, err
	}
	// The session's channel bounds what it holds, not the subscription: never let the client drop
	// deliveries as a slow consumer while the handler catches up.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sub = sub
	if hb > 0 { // a consumer declared without heartbeats (not by fpmbus) is not watched, as nats.go does
		s.monitor = time.AfterFunc(2*hb, s.checkHeard)
	}
	return s, nil
}

func (s *pushSub) deliver(msg *nats.Msg) {
	if s.stopped.Load() {
		return
	}
	s.lastHeard.Store(time.Now().UnixNano())
	switch msg.Header.Get(headerStatus) {
	case "":
		s.onMsg(&pushMsg{msg: msg, nc: s.nc})
	case statusControl:
		if msg.Reply != "" { // a flow-control request: its reply subject is the answer
			_ = s.nc.Publish(msg.Reply, nil)
		}
		if stalled := msg.Header.Get(headerStalled); stalled != "" { // a request nobody answered
			_ = s.nc.Publish(stalled, nil)
		}
	case statusConflict:
		if strings.EqualFold(msg.Header.Get(headerDescription), "Consumer Deleted") {
			s.end(jetstream.ErrConsumerDeleted)
			return
		}
		s.end(nil) // a new consumer leader: resync from the ack floor
	}
}

// checkHeard runs when two heartbeat intervals may have passed without any message. If something was
// heard meanwhile, or the connection is reconnecting (the server cannot reach this member; its record
// refreshes say whether it still owns the partition), it looks again later; otherwise the owner has
// lost its deliveries.
func (s *pushSub) checkHeard() {
	left := 2*s.hb - time.Since(time.Unix(0, s.lastHeard.Load()))
	switch {
	case s.nc.IsClosed():
		s.end(nil)
	case left > 0:
		s.rearm(left)
	case !s.nc.IsConnected():
		s.rearm(2 * s.hb)
	default:
		s.end(nil)
	}
}

func (s *pushSub) rearm(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stopped.Load() {
		s.monitor.Reset(d)
	}
}

func (s *pushSub) end(err error) {
	if !s.stopped.Load() {
		s.onEnd(err)
	}
}

// stop unsubscribes: nothing is delivered or answered afterwards (a request in flight is answered by
// the next owner, through the stall header).
func (s *pushSub) stop() {
	if s.stopped.Swap(true) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.monitor != nil {
		s.monitor.Stop()
	}
	_ = s.sub.Unsubscribe()
}

// JetStream ack bodies (the reply subject of a delivered message takes them).
var (
	ackAck      = []byte("+ACK")
	ackNak      = []byte("-NAK")
	ackProgress = []byte("+WPI")
	ackTerm     = []byte("+TERM")
)

// pushMsg is a delivered message as a jetstream.Msg. Its metadata is parsed once, from the reply
// subject; acks are published on the reply subject. After one Ack, Nak or Term, further ones return
// jetstream.ErrMsgAlreadyAckd, as nats.go's messages do; InProgress may be sent any number of times.
type pushMsg struct {
	msg *nats.Msg
	nc  *nats.Conn

	mu   sync.Mutex
	ackd bool
}

func (m *pushMsg) Metadata() (*jetstream.MsgMetadata, error) {
	md, err := m.msg.Metadata()
	if err != nil {
		return nil, err
	}
	return &jetstream.MsgMetadata{
		Sequence:     jetstream.SequencePair{Consumer: md.Sequence.Consumer, Stream: md.Sequence.Stream},
		NumDelivered: md.NumDelivered,
		NumPending:   md.NumPending,
		Timestamp:    md.Timestamp,
		Stream:       md.Stream,
		Consumer:     md.Consumer,
		Domain:       md.Domain,
	}, nil
}

func (m *pushMsg) Data() []byte         { return m.msg.Data }
func (m *pushMsg) Headers() nats.Header { return m.msg.Header }
func (m *pushMsg) Subject() string      { return m.msg.Subject }
func (m *pushMsg) Reply() string        { return m.msg.Reply }
func (m *pushMsg) Ack() error           { return m.ack(context.Background(), ackAck, false) }
func (m *pushMsg) Nak() error           { return m.ack(context.Background(), ackNak, false) }
func (m *pushMsg) InProgress() error    { return m.ack(context.Background(), ackProgress, false) }
func (m *pushMsg) Term() error          { return m.ack(context.Background(), ackTerm, false) }
func (m *pushMsg) DoubleAck(ctx context.Context) error {
	return m.ack(ctx, ackAck, true)
}

func (m *pushMsg) NakWithDelay(d time.Duration) error {
	return m.ack(context.Background(), fmt.Appendf(nil, "%s {\"delay\": %d}", ackNak, d.Nanoseconds()), false)
}

func (m *pushMsg) TermWithReason(reason string) error {
	return m.ack(context.Background(), fmt.Appendf(nil, "%s %s", ackTerm, reason), false)
}

func (m *pushMsg) ack(ctx context.Context, body []byte, sync bool) error {
	if m.msg.Reply == "" {
		return jetstream.ErrMsgNoReply
	}
	progress := string(body) == string(ackProgress)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ackd {
		return jetstream.ErrMsgAlreadyAckd
	}
	var err error
	if sync {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, apiTimeout)
			defer cancel()
		}
		_, err = m.nc.RequestWithContext(ctx, m.msg.Reply, body)
	} else {
		err = m.nc.Publish(m.msg.Reply, body)
	}
	if err == nil && !progress {
		m.ackd = true
	}
	return err
}
