package producer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pebbe/zmq4"
)

// Who receives what a PUB socket sends. libzmq drops a message silently when no subscriber matches it,
// so a sender that wants to know whether a message reached anyone must count its subscribers itself.
// A socket made WithSubscriberCount is an XPUB (the same on the wire): it reports every subscription
// and unsubscription (ZMQ_XPUB_VERBOSER), those libzmq makes for a subscriber that disconnects
// included, and a monitor reports every connection accepted and lost. The count of subscribers that
// receive an FPM is the subscriptions to the empty topic (FPMs are sent under it; a subscriber to any
// other topic receives none) less their unsubscriptions, bounded by the connections open: a subscriber
// that subscribed twice is unsubscribed once when it goes, and its connection's end tells. Both are
// read, without blocking, before each answer: the count is what libzmq had told the socket at that
// moment, which is what its next send is distributed by.

// Descriptors a Sender holds (for internal/fdbudget): its socket's mailbox and its listener, plus one
// per subscriber connected; WithSubscriberCount adds the monitor's two mailboxes. Measured by
// TestSenderDescriptorCost.
const (
	DescriptorsPerSocket        = 2
	DescriptorsPerSocketCounted = 4
)

// ErrNoSubscribers is returned by AwaitSubscribers and WaitSubscribers when too few subscribers joined
// in time.
var ErrNoSubscribers = errors.New("producer: subscribers did not join in time")

// watchEvents are the monitor events that open and close a subscriber's connection.
const watchEvents = zmq4.EVENT_ACCEPTED | zmq4.EVENT_DISCONNECTED

// monitorSeq names each watch's inproc endpoint uniquely in the process.
var monitorSeq atomic.Uint64

// subscriberWatch is a Sender's count of its subscribers; it belongs to the goroutine owning the Sender.
type subscriberWatch struct {
	mon    *zmq4.Socket // PAIR connected to the socket's monitor
	subs   int          // subscriptions to the empty topic less unsubscriptions
	conns  int          // connections accepted less disconnected
	joined int          // subscriptions to the empty topic read, ever
}

func watchSubscribers(zctx *zmq4.Context, sock *zmq4.Socket) (*subscriberWatch, error) {
	addr := fmt.Sprintf("inproc://fpmbus-sender-monitor-%d", monitorSeq.Add(1))
	if err := sock.Monitor(addr, watchEvents); err != nil {
		return nil, fmt.Errorf("producer: monitor: %w", err)
	}
	mon, err := zctx.NewSocket(zmq4.PAIR)
	if err != nil {
		return nil, fmt.Errorf("producer: monitor socket: %w", err)
	}
	if err := mon.SetLinger(0); err != nil {
		mon.Close()
		return nil, fmt.Errorf("producer: monitor linger: %w", err)
	}
	if err := mon.Connect(addr); err != nil {
		mon.Close()
		return nil, fmt.Errorf("producer: monitor connect: %w", err)
	}
	return &subscriberWatch{mon: mon}, nil
}

func (w *subscriberWatch) close() { w.mon.Close() }

// Subscribers returns how many subscribers receive what the socket sends now (see the comment above),
// after reading every report pending. The socket must be made WithSubscriberCount.
func (s *Sender) Subscribers() (int, error) {
	if s.sock == nil {
		return 0, ErrClosed
	}
	w := s.subs
	if w == nil {
		return 0, fmt.Errorf("producer: %s does not count its subscribers (WithSubscriberCount)", s.endpoint)
	}
	for pending(w.mon) {
		ev, _, _, err := w.mon.RecvEvent(zmq4.DONTWAIT)
		if err != nil {
			break // EAGAIN: nothing more pending
		}
		switch ev {
		case zmq4.EVENT_ACCEPTED:
			w.conns++
		case zmq4.EVENT_DISCONNECTED:
			w.conns = max(w.conns-1, 0)
		}
	}
	for pending(s.sock) {
		msg, err := s.sock.RecvBytes(zmq4.DONTWAIT)
		if err != nil {
			if zmq4.AsErrno(err) == zmq4.Errno(syscall.EAGAIN) {
				break
			}
			return 0, fmt.Errorf("producer: subscriptions of %s: %w", s.endpoint, err)
		}
		if len(msg) != 1 { // 1 = subscribe, 0 = unsubscribe, then the topic: only the empty one matters
			continue
		}
		if msg[0] == 1 {
			w.subs++
			w.joined++
		} else {
			w.subs = max(w.subs-1, 0)
		}
	}
	return min(w.subs, w.conns), nil
}

// pending reports whether sock has a message to read (ZMQ_EVENTS: far cheaper than a receive that
// finds nothing, which is what almost every check before a send finds).
func pending(sock *zmq4.Socket) bool {
	ev, err := sock.GetEvents()
	return err != nil || ev&zmq4.POLLIN != 0 // an error: let the receive report it
}

// WaitSubscribers waits until n subscriptions arrive (those read during the call, the ones pending in
// the socket when it is called included) or timeout passes (ErrNoSubscribers): a subscriber's first
// subscription, or the one it sends again when it reconnects. The socket must be made
// WithSubscriberCount; it must be called by the goroutine that owns the socket. To wait until a
// socket has n subscribers, whenever they joined, use AwaitSubscribers.
func (s *Sender) WaitSubscribers(n int, timeout time.Duration) error {
	if s.subs == nil {
		return fmt.Errorf("producer: %s does not count its subscribers (WithSubscriberCount)", s.endpoint)
	}
	start := s.subs.joined
	deadline := time.Now().Add(timeout)
	for {
		if _, err := s.Subscribers(); err != nil {
			return err
		}
		if got := s.subs.joined - start; got >= n {
			return nil
		} else if !time.Now().Before(deadline) {
			return fmt.Errorf("%w: %s has %d of %d after %v", ErrNoSubscribers, s.endpoint, got, n, timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// AwaitSubscribers waits until every sender has at least n subscribers (Subscribers), or timeout passes
// for all of them together, or ctx ends. Each sender must be made WithSubscriberCount and owned by the
// calling goroutine. labels, when given, name the senders in the error (default: their endpoints),
// which lists the ones short of n: ErrNoSubscribers.
func AwaitSubscribers(ctx context.Context, senders []*Sender, labels []string, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	pending := make([]int, 0, len(senders))
	for i := range senders {
		pending = append(pending, i)
	}
	got := make([]int, len(senders))
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		left := pending[:0]
		for _, i := range pending {
			c, err := senders[i].Subscribers()
			if err != nil {
				return err
			}
			if got[i] = c; c < n {
				left = append(left, i)
			}
		}
		pending = left
		if len(pending) == 0 {
			return nil
		}
		if !time.Now().Before(deadline) {
			return shortOfSubscribers(senders, labels, pending, got, n, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// shortOfSubscribers is AwaitSubscribers' error: which senders have fewer than n subscribers.
func shortOfSubscribers(senders []*Sender, labels []string, short, got []int, n int, timeout time.Duration) error {
	const named = 10
	var b strings.Builder
	for k, i := range short {
		if k == named {
			fmt.Fprintf(&b, " and %d more", len(short)-named)
			break
		}
		if k > 0 {
			b.WriteString(", ")
		}
		label := senders[i].endpoint
		if labels != nil {
			label = labels[i] + " (" + label + ")"
		}
		fmt.Fprintf(&b, "%s has %d", label, got[i])
	}
	return fmt.Errorf("%w: %d of %d sockets have fewer than %d subscribers after %v: %s", ErrNoSubscribers, len(short), len(senders), n, timeout, b.String())
}
