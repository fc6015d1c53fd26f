package producer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/pebbe/zmq4"
)

// ErrDropped is returned by Sender.Send and Sender.SendFrames when libzmq refused the message without
// blocking (EAGAIN), as Dynamo's `except zmq.Again: pass` does. On a PUB socket this only happens with
// XPUB_NODROP (WithNoDrop): without it libzmq drops messages for a slow subscriber silently.
var ErrDropped = errors.New("producer: message dropped (EAGAIN)")

// ErrClosed is returned by a Sender or Publisher used after Close, and by a second call to Publisher.Run.
var ErrClosed = errors.New("producer: closed")

// BindError reports a PUB socket that could not bind its endpoint. Its message names the endpoint and,
// from a Publisher, the rank: "bind tcp://127.0.0.1:20381 (dp_rank 1): address already in use". Err is
// a syscall.Errno when libzmq reported a system error, so errors.Is(err, syscall.EADDRINUSE) works.
type BindError struct {
	Endpoint string
	// Rank is the DP rank, or -1 for a Sender created directly.
	Rank int
	Err  error
}

func (e *BindError) Error() string {
	if e.Rank >= 0 {
		return fmt.Sprintf("bind %s (dp_rank %d): %v", e.Endpoint, e.Rank, e.Err)
	}
	return fmt.Sprintf("bind %s: %v", e.Endpoint, e.Err)
}

func (e *BindError) Unwrap() error { return e.Err }

// SenderOption changes how NewSender sets up its socket.
type SenderOption func(*senderOptions) error

type senderOptions struct {
	linger time.Duration
	noDrop bool
	xpub   bool
}

// WithSubscriberCount makes the socket an XPUB, which looks exactly like a PUB on the wire but reports
// every subscription and unsubscription (ZMQ_XPUB_VERBOSER, a subscriber's disconnect included), and
// watches its connections (a socket monitor): Subscribers then says how many subscribers receive what
// is sent, WaitSubscribers waits for them instead of sleeping through ZMQ's slow-joiner window. It
// costs DescriptorsPerSocketCounted descriptors instead of DescriptorsPerSocket.
func WithSubscriberCount() SenderOption {
	return func(o *senderOptions) error {
		o.xpub = true
		return nil
	}
}

// WithLinger sets ZMQ_LINGER (default DefaultLinger): how long closing waits for frames still queued for
// connected subscribers. 0 discards them at once, as Dynamo's close(linger=0) does.
func WithLinger(d time.Duration) SenderOption {
	return func(o *senderOptions) error {
		if d < 0 {
			return fmt.Errorf("%w: linger %v: want >= 0", ErrInvalidConfig, d)
		}
		o.linger = d
		return nil
	}
}

// WithNoDrop sets ZMQ_XPUB_NODROP, so a send to a subscriber at its high-water mark fails with ErrDropped
// instead of being dropped silently by libzmq (see Config.NoDrop).
func WithNoDrop(on bool) SenderOption {
	return func(o *senderOptions) error {
		o.noDrop = on
		return nil
	}
}

// Sender is one bound ZMQ PUB socket that sends Dynamo's FPM frames. It is not safe for concurrent use:
// one goroutine owns it (a socket may move to another goroutine only with a happens-before edge, such as
// starting that goroutine).
type Sender struct {
	sock     *zmq4.Socket
	ctx      *zmq4.Context // non-nil only when NewSender created the context, which Close then terminates
	endpoint string
	seq      [8]byte
	subs     *subscriberWatch // WithSubscriberCount only
}

// NewSender creates a PUB socket in zctx (nil: a private context that Close terminates), sets ZMQ_SNDHWM
// to sndhwm (0: libzmq's default of 1000 messages, negative: unlimited) and ZMQ_LINGER, and binds
// endpoint. A bind failure is a *BindError with Rank -1.
func NewSender(zctx *zmq4.Context, endpoint string, sndhwm int, opts ...SenderOption) (*Sender, error) {
	o := senderOptions{linger: DefaultLinger}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	switch {
	case sndhwm == 0:
		sndhwm = DefaultSendHWM
	case sndhwm < 0:
		sndhwm = 0 // libzmq: no limit
	}
	s := &Sender{endpoint: endpoint}
	if zctx == nil {
		c, err := zmq4.NewContext()
		if err != nil {
			return nil, fmt.Errorf("producer: new zmq context: %w", err)
		}
		s.ctx, zctx = c, c
	}
	kind := zmq4.PUB
	if o.xpub {
		kind = zmq4.XPUB
	}
	sock, err := zctx.NewSocket(kind)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("producer: new %v socket: %w", kind, err)
	}
	s.sock = sock
	if o.xpub {
		// Before binding, so that no connection goes unseen.
		if s.subs, err = watchSubscribers(zctx, sock); err != nil {
			s.Close()
			return nil, err
		}
	}
	if err := s.setup(endpoint, sndhwm, o); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Sender) setup(endpoint string, sndhwm int, o senderOptions) error {
	// Options first: SNDHWM applies to pipes created after it is set.
	if err := s.sock.SetLinger(o.linger); err != nil {
		return fmt.Errorf("producer: set ZMQ_LINGER: %w", err)
	}
	if err := s.sock.SetSndhwm(sndhwm); err != nil {
		return fmt.Errorf("producer: set ZMQ_SNDHWM: %w", err)
	}
	if o.xpub {
		// Verboser: every subscriber's (identical, empty) subscription is reported, not just the first,
		// and so is every unsubscription, the ones libzmq makes for a subscriber that disconnected included.
		if err := s.sock.SetXpubVerboser(1); err != nil {
			return fmt.Errorf("producer: set ZMQ_XPUB_VERBOSER: %w", err)
		}
	}
	if o.noDrop {
		if err := s.sock.SetXpubNodrop(true); err != nil {
			return fmt.Errorf("producer: set ZMQ_XPUB_NODROP: %w", err)
		}
	}
	if strings.Contains(strings.TrimPrefix(endpoint, "tcp://"), "[") {
		if err := s.sock.SetIpv6(true); err != nil {
			return fmt.Errorf("producer: set ZMQ_IPV6: %w", err)
		}
	}
	if err := s.sock.Bind(endpoint); err != nil {
		return &BindError{Endpoint: endpoint, Rank: -1, Err: sysErr(err)}
	}
	if strings.HasSuffix(endpoint, ":*") { // a wildcard port: Endpoint reports the one libzmq chose
		last, err := s.sock.GetLastEndpoint()
		if err != nil {
			return fmt.Errorf("producer: bound endpoint of %s: %w", endpoint, err)
		}
		s.endpoint = last
	}
	return nil
}

// Endpoint returns the endpoint the socket is bound to.
func (s *Sender) Endpoint() string { return s.endpoint }

// Send sends one FPM message exactly as Dynamo's publisher does: send_multipart((b"",
// seq.to_bytes(8, "big"), payload), NOBLOCK). It never blocks; libzmq's EAGAIN is returned as
// ErrDropped. payload is copied by libzmq and may be reused when Send returns.
func (s *Sender) Send(seq uint64, payload []byte) error {
	binary.BigEndian.PutUint64(s.seq[:], seq)
	return s.SendFrames(nil, s.seq[:], payload)
}

// SendFrames sends frames as one multipart message without blocking, whatever they contain (for
// malformed-input tests: wrong frame counts, short sequence frames, garbage payloads). EAGAIN on the first
// frame is ErrDropped; libzmq sends the parts of a multipart message atomically, so a later part is not
// refused once the first is accepted.
func (s *Sender) SendFrames(frames ...[]byte) error {
	if s.sock == nil {
		return ErrClosed
	}
	if len(frames) == 0 {
		return fmt.Errorf("producer: send: no frames")
	}
	last := len(frames) - 1
	for i, f := range frames {
		flags := zmq4.DONTWAIT
		if i < last {
			flags |= zmq4.SNDMORE
		}
		if _, err := s.sock.SendBytes(f, flags); err != nil {
			if zmq4.AsErrno(err) == zmq4.Errno(syscall.EAGAIN) && i == 0 {
				return ErrDropped
			}
			return fmt.Errorf("producer: send frame %d of %d: %w", i, len(frames), sysErr(err))
		}
	}
	return nil
}

// Close closes the socket, then terminates the context if NewSender created it (which waits at most the
// linger time for frames still queued for connected subscribers). Close is idempotent.
func (s *Sender) Close() error {
	var err error
	if s.sock != nil {
		err = s.sock.Close()
		s.sock = nil
	}
	if s.subs != nil {
		s.subs.close()
		s.subs = nil
	}
	if s.ctx != nil {
		if e := s.ctx.Term(); err == nil {
			err = e
		}
		s.ctx = nil
	}
	return err
}

// zmqHausnumero is ZMQ_HAUSNUMERO: libzmq's own error numbers start here; smaller ones are system errnos.
const zmqHausnumero = 156384712

// sysErr turns a libzmq error carrying a system errno into the syscall.Errno, so errors.Is matches
// syscall.EADDRINUSE and friends and the message reads "address already in use".
func sysErr(err error) error {
	if e := zmq4.AsErrno(err); e != 0 && e < zmqHausnumero {
		return syscall.Errno(e)
	}
	return err
}
