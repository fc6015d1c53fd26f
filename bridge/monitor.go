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
// So each reader watches its socket's monitor events. A disconnect not followed within
// sessionLostGrace by libzmq scheduling a reconnect means the session is gone: the reader reconnects
// the endpoint itself, and when the connection had completed its handshake (a peer that speaks ZMTP,
// so the protocol error was in its messages: with ZMQ_MAXMSGSIZE set, a frame over the limit) it counts
// an oversized frame and dead-letters it (refusedFrame). What the publisher had queued behind that
// frame on the connection is lost with it; gap detection sees those sequence numbers as missing.

// monitorEvents are the events a reader needs to tell a lost session from a reconnecting one.
const monitorEvents = zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECT_RETRIED |
	zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED

// sessionWatch reads one SUB socket's monitor events. It belongs to the reader goroutine of that socket.
type sessionWatch struct {
	mon                *zmq.Socket // PAIR connected to the socket's monitor
	handshaken         bool        // the current connection completed its ZMTP handshake
	lostAt             time.Time   // when a disconnect was seen that libzmq has not yet followed with a reconnect
	lostAfterHandshake bool
	checked            time.Time
}

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

// poll reads the pending monitor events without blocking and reports whether the session is lost:
// a disconnect that libzmq has not followed with a reconnect for sessionLostGrace. afterHandshake tells
// whether the lost connection had completed its handshake.
func (w *sessionWatch) poll(now time.Time) (lost, afterHandshake bool) {
	w.checked = now
	for {
		ev, _, _, err := w.mon.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			break // EAGAIN: no more events (ETERM: the context is ending; the loop notices)
		}
		switch ev {
		case zmq.EVENT_HANDSHAKE_SUCCEEDED:
			w.handshaken = true
			w.lostAt = time.Time{}
		case zmq.EVENT_DISCONNECTED:
			w.lostAt, w.lostAfterHandshake = now, w.handshaken
			w.handshaken = false
		case zmq.EVENT_CONNECT_RETRIED, zmq.EVENT_CONNECT_DELAYED, zmq.EVENT_CONNECTED:
			w.lostAt = time.Time{} // libzmq is reconnecting by itself
		}
	}
	if w.lostAt.IsZero() || now.Sub(w.lostAt) < sessionLostGrace {
		return false, false
	}
	lost, afterHandshake = true, w.lostAfterHandshake
	w.lostAt, w.lostAfterHandshake = time.Time{}, false
	return lost, afterHandshake
}

// watch checks the monitor (at most every monitorEvery unless force) and handles a lost session:
// it reconnects the endpoint and, when the connection had completed its handshake, counts and
// dead-letters the oversized frame that ended it.
func (r *reader) watch(sock *zmq.Socket, st *readState, force bool) {
	if r.watcher == nil {
		return
	}
	now := time.Now()
	if !force && now.Sub(r.watcher.checked) < monitorEvery {
		return
	}
	lost, oversized := r.watcher.poll(now)
	if !lost {
		return
	}
	url := r.b.endpoints[r.slot].URL
	if err := sock.Disconnect(url); err != nil && zmq.AsErrno(err) != zmq.Errno(syscall.ENOENT) {
		r.b.log.Warn("zmq disconnect of a lost session", "endpoint", url, "error", err)
	}
	if err := sock.Connect(url); err != nil {
		r.b.log.Error("zmq reconnect after a lost session failed; retrying", "endpoint", url, "error", err)
		r.watcher.lostAt, r.watcher.lostAfterHandshake = now, oversized // try again after the grace
		return
	}
	if !oversized {
		r.b.log.Warn("libzmq gave up a connection before its handshake completed; reconnected", "endpoint", url)
		return
	}
	r.b.log.Error("a ZMQ frame over --max-payload was refused unread and libzmq closed the connection; reconnected",
		"endpoint", url, "max_payload", r.b.cfg.MaxPayload)
	st.rejected = r.b.enqueue(r.slot, []*item{r.b.refused(r.slot)}, st.rejected[:0])
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
