// Package producertest helps tests talk to synthetic Dynamo FPM publishers over real libzmq: it finds a
// free block of consecutive ports for the ranks, receives Dynamo's three-frame messages on a SUB
// socket, and publishes scripted FPMs (Scripted) that know exactly which numbers libzmq refused.
// Everything it creates is closed by the test's Cleanup.
package producertest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pebbe/zmq4"

	"github.com/fpmbus/fpmbus/internal/freeport"
	"github.com/fpmbus/fpmbus/schemas"
)

// FreeBasePort returns a base port such that base..base+n-1 are all free on host (127.0.0.1 when ""):
// internal/freeport's Block, below the ephemeral range and never handed out twice in one process.
func FreeBasePort(tb testing.TB, host string, n int) int {
	tb.Helper()
	return freeport.Block(tb, host, n)
}

// connectEndpoint turns a bind endpoint into one a subscriber can connect to: tcp://*:P becomes
// tcp://127.0.0.1:P; anything else is returned unchanged.
func connectEndpoint(bind string) string {
	if rest, ok := strings.CutPrefix(bind, "tcp://*:"); ok {
		return "tcp://127.0.0.1:" + rest
	}
	return bind
}

// errTimeout is returned by Subscriber.Recv when nothing arrived in time.
var errTimeout = errors.New("producertest: receive timed out")

// message is one multipart message as received.
type message struct {
	Frames [][]byte
	// Seq is the big-endian sequence of frame 1; valid only when Wellformed.
	Seq uint64
	// Wellformed: exactly 3 frames, an empty topic and an 8-byte sequence.
	Wellformed bool
}

// Payload returns the last frame.
func (m message) Payload() []byte { return m.Frames[len(m.Frames)-1] }

// Subscriber is a SUB socket subscribed to everything (an empty filter, as Dynamo's consumers use). It
// is owned by the test goroutine that uses it.
type Subscriber struct {
	ctx  *zmq4.Context
	sock *zmq4.Socket
}

// NewSubscriber connects a SUB socket to endpoint (a bind endpoint is converted by connectEndpoint).
// rcvhwm sets ZMQ_RCVHWM when > 0. The socket is closed by tb's Cleanup.
func NewSubscriber(tb testing.TB, endpoint string, rcvhwm int) *Subscriber {
	tb.Helper()
	ctx, err := zmq4.NewContext()
	if err != nil {
		tb.Fatalf("producertest: zmq context: %v", err)
	}
	s := &Subscriber{ctx: ctx}
	tb.Cleanup(s.Close)
	if s.sock, err = ctx.NewSocket(zmq4.SUB); err != nil {
		tb.Fatalf("producertest: SUB socket: %v", err)
	}
	must := func(what string, err error) {
		if err != nil {
			tb.Fatalf("producertest: %s: %v", what, err)
		}
	}
	must("linger", s.sock.SetLinger(0))
	if rcvhwm > 0 {
		must("rcvhwm", s.sock.SetRcvhwm(rcvhwm))
	}
	must("subscribe", s.sock.SetSubscribe(""))
	must("connect "+endpoint, s.sock.Connect(connectEndpoint(endpoint)))
	return s
}

// Recv waits up to timeout for the next message; errTimeout if none came.
func (s *Subscriber) Recv(timeout time.Duration) (message, error) {
	if err := s.sock.SetRcvtimeo(timeout); err != nil {
		return message{}, err
	}
	frames, err := s.sock.RecvMessageBytes(0)
	if err != nil {
		if zmq4.AsErrno(err) == zmq4.Errno(syscall.EAGAIN) {
			return message{}, errTimeout
		}
		return message{}, err
	}
	m := message{Frames: frames}
	if len(frames) == 3 && len(frames[0]) == 0 && len(frames[1]) == 8 {
		m.Wellformed = true
		m.Seq = binary.BigEndian.Uint64(frames[1])
	}
	return m, nil
}

// RecvFPM receives the next message, checks Dynamo's frame layout and decodes the payload with
// schemas.DecodeFPM. Any problem fails the test.
func (s *Subscriber) RecvFPM(tb testing.TB, timeout time.Duration) (uint64, *schemas.FPM) {
	tb.Helper()
	m, err := s.Recv(timeout)
	if err != nil {
		tb.Fatalf("producertest: receive: %v", err)
	}
	if !m.Wellformed {
		tb.Fatalf("producertest: malformed message: %s", describe(m.Frames))
	}
	f, err := schemas.DecodeFPM(m.Payload())
	if err != nil {
		tb.Fatalf("producertest: seq %d: decode payload: %v", m.Seq, err)
	}
	return m.Seq, f
}

// Close closes the socket and its context; safe to call twice.
func (s *Subscriber) Close() {
	if s.sock != nil {
		s.sock.Close()
		s.sock = nil
	}
	if s.ctx != nil {
		s.ctx.Term()
		s.ctx = nil
	}
}

func describe(frames [][]byte) string {
	lens := make([]string, len(frames))
	for i, f := range frames {
		lens[i] = strconv.Itoa(len(f))
	}
	return fmt.Sprintf("%d frames of %s bytes", len(frames), strings.Join(lens, "/"))
}
