package bridge

import (
	"fmt"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// What libzmq does with a frame over ZMQ_MAXMSGSIZE (measured with libzmq 4.3, and what its ZMTP
// decoder and stream engine do): the decoder reads the frame's length from its header and, when it is
// over the limit, fails with EMSGSIZE before allocating or reading the frame. The engine treats that as
// a protocol error: it drops the half-received multipart, closes the TCP connection, emits
// ZMQ_EVENT_DISCONNECTED and terminates the connection's session. Unlike a connection the peer closed
// (after which libzmq emits ZMQ_EVENT_CONNECT_RETRIED and reconnects by itself), a session ended by a
// protocol error is never reconnected: a SUB socket would never hear from that publisher again. The
// receiving application sees no error and no message, only the monitor events, and the frame's size
// is not reported.
//
// So each reader watches its socket's monitor events. It also owns reconnecting (socket.go: libzmq's
// own reconnect interval is out of reach): a connection that ended is followed at once by libzmq
// scheduling its own (distant) reconnect, ZMQ_EVENT_CONNECT_RETRIED, and the reader then drains what
// the connection delivered and connects again itself. A disconnect not followed within
// sessionLostGrace by that event means libzmq gave the session up: the reader drains and reconnects
// too, and when the connection had completed its handshake (a peer that speaks ZMTP, so the protocol
// error was in its messages: with ZMQ_MAXMSGSIZE set, a frame over the limit) it counts an oversized
// frame and dead-letters it (refusedFrame). What the publisher had queued behind that frame on the
// connection is lost with it; gap detection sees those sequence numbers as missing. A connect attempt
// that fails is tried again after socketReconnectIvl.

// monitorEvents are the events a reader needs to follow its connections.
const monitorEvents = zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECT_RETRIED |
	zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED

// sessionWatch reads one SUB socket's monitor events. It belongs to the reader goroutine of that socket.
type sessionWatch struct {
	mon                *zmq.Socket // PAIR connected to the socket's monitor
	handshaken         bool        // the current connection completed its ZMTP handshake
	lostAt             time.Time   // when a disconnect was seen that libzmq has not yet followed with scheduling a reconnect
	lostAfterHandshake bool
	retryAt            time.Time // when the reader connects again (no connection and no attempt under way); zero: not due
	attemptAt          time.Time // when the reader last called connect
	received           bool      // a message arrived since then (the connection is up, whatever the events said)
	checked            time.Time
}

// sessionAction is what the reader must do about its connection.
type sessionAction uint8

const (
	sessionOK      sessionAction = iota // nothing
	sessionEnded                        // a connection that completed its handshake ended: drain, connect again at once
	sessionRetry                        // no connection: connect again
	sessionGivenUp                      // libzmq gave the session up (a protocol error): drain, connect again
)

// watchSession starts monitoring sock (endpoint slot) on zctx and returns the watch; close it with
// close after sock.
func watchSession(zctx *zmq.Context, sock *zmq.Socket, slot int) (*sessionWatch, error) {
	addr := fmt.Sprintf("inproc://fpmbus-bridge-monitor-%d", slot)
	if err := sock.Monitor(addr, monitorEvents); err != nil {
		return nil, fmt.Errorf("monitor: %w", err)
	}
	mon, err := zctx.NewSocket(zmq.PAIR)
	if err != nil {
		return nil, fmt.Errorf("monitor socket: %w", err)
	}
	if err := mon.SetLinger(0); err != nil {
		mon.Close()
		return nil, fmt.Errorf("monitor linger: %w", err)
	}
	if err := mon.Connect(addr); err != nil {
		mon.Close()
		return nil, fmt.Errorf("monitor connect: %w", err)
	}
	return &sessionWatch{mon: mon}, nil
}

func (w *sessionWatch) close() { w.mon.Close() }

// poll reads the pending monitor events without blocking and returns what the reader must do;
// afterHandshake (sessionGivenUp) tells whether the lost connection had completed its handshake.
func (w *sessionWatch) poll(now time.Time) (act sessionAction, afterHandshake bool) {
	w.checked = now
	for {
		ev, _, _, err := w.mon.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			break // EAGAIN: no more events (ETERM: the context is ending; the loop notices)
		}
		switch ev {
		case zmq.EVENT_HANDSHAKE_SUCCEEDED:
			w.handshaken = true
			w.lostAt, w.retryAt = time.Time{}, time.Time{}
		case zmq.EVENT_DISCONNECTED:
			w.lostAt, w.lostAfterHandshake = now, w.handshaken
			w.handshaken = false
		case zmq.EVENT_CONNECT_RETRIED:
			// libzmq scheduled its own reconnect: after a connection that ended, or after a failed
			// attempt. The reader reconnects instead. (One while a connection is up can only be of an
			// attempt the reader already replaced.)
			switch {
			case w.handshaken && w.lostAt.IsZero():
			case !w.lostAt.IsZero() && w.lostAfterHandshake:
				act = sessionEnded
			default:
				w.retryAt = now.Add(socketReconnectIvl)
			}
			w.lostAt, w.lostAfterHandshake = time.Time{}, false
		}
	}
	switch {
	case act == sessionEnded:
		w.retryAt = time.Time{}
		return act, false
	case !w.lostAt.IsZero() && now.Sub(w.lostAt) >= sessionLostGrace:
		afterHandshake = w.lostAfterHandshake
		w.lostAt, w.lostAfterHandshake = time.Time{}, false
		return sessionGivenUp, afterHandshake
	case !w.retryAt.IsZero() && !now.Before(w.retryAt):
		w.retryAt = time.Time{}
		return sessionRetry, false
	case !w.handshaken && !w.received && w.lostAt.IsZero() && w.retryAt.IsZero() && now.Sub(w.attemptAt) >= socketConnectStuck:
		return sessionRetry, false // an attempt nothing was heard of
	}
	return sessionOK, false
}

// watch checks the monitor (at most every monitorEvery unless force) and follows the connection: it
// reconnects when one ended or an attempt failed and, when libzmq gave up a connection that had
// completed its handshake, counts and dead-letters the oversized frame that ended it.
func (r *reader) watch(sock *zmq.Socket, st *readState, force bool) {
	if r.watcher == nil {
		return
	}
	now := time.Now()
	if !force && now.Sub(r.watcher.checked) < monitorEvery {
		return
	}
	act, oversized := r.watcher.poll(now)
	if act == sessionOK {
		return
	}
	url := r.b.endpoints[r.slot].URL
	r.reconnect(sock, st) // a failed connect call is tried again after socketReconnectIvl
	switch {
	case act != sessionGivenUp:
	case !oversized:
		r.b.log.Warn("libzmq gave up a connection before its handshake completed; reconnecting", "endpoint", url)
	default:
		r.b.log.Error("a ZMQ frame over --max-payload was refused unread and libzmq closed the connection; reconnecting",
			"endpoint", url, "max_payload", r.b.cfg.MaxPayload)
		st.rejected = r.b.enqueue(r.slot, []*item{r.b.refused(r.slot)}, st.rejected[:0])
	}
}

// reconnect connects the endpoint again, on a new session: it first receives everything libzmq still
// holds from the connection that ended (nothing more can arrive on the endpoint meanwhile: libzmq does
// not reconnect by itself), so those messages are the old session's and every later one is the new
// one's. A connect call that fails is tried again after socketReconnectIvl.
func (r *reader) reconnect(sock *zmq.Socket, st *readState) {
	url := r.b.endpoints[r.slot].URL
	r.drain(sock, st)
	if err := sock.Disconnect(url); err != nil && zmq.AsErrno(err) != zmq.Errno(syscall.ENOENT) {
		r.b.log.Warn("zmq disconnect of an ended connection", "endpoint", url, "error", err)
	}
	r.newConnection()
	r.watcher.attemptAt, r.watcher.received = time.Now(), false
	if err := sock.Connect(url); err != nil {
		r.b.log.Error("zmq reconnect failed; retrying", "endpoint", url, "error", err)
		r.watcher.retryAt = time.Now().Add(socketReconnectIvl)
	}
}

// refused counts one frame libzmq refused for its size on endpoint slot and returns its dead letter.
func (b *Bridge) refused(slot int) *item {
	mono := time.Now()
	recv := mono
	if b.opts.now != nil {
		recv = b.opts.now()
	}
	rc := b.ranks[slot]
	rc.countReceived()
	rc.countOversized()
	return b.refusedFrame(slot, recv, mono)
}
