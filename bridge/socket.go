package bridge

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// Socket settings. The receive high-water mark is Config.MaxBuffer (100000 by default), large so a
// burst is held by ZMQ rather than dropped before the bridge can count it, and bounded by the same flag
// as the bridge's own buffer; the largest frame libzmq reads is Config.MaxPayload (ZMQ_MAXMSGSIZE, see
// monitor.go). The reconnect interval starts small so a restarted publisher is found quickly, and backs
// off to 5 s while it is gone.
const (
	socketReconnectIvl    = 100 * time.Millisecond
	socketReconnectIvlMax = 5 * time.Second
	// socketPoll is how long one receive waits before the reader checks whether it must stop.
	socketPoll = 100 * time.Millisecond
)

// DescriptorsPerEndpoint is what one endpoint's reader holds (for internal/fdbudget): the SUB
// socket's mailbox, its TCP connection, the duplicate of its ZMQ_FD the poller waits on, and its
// monitor's two mailboxes. Measured by TestEndpointDescriptorCost.
const DescriptorsPerEndpoint = 5

// reader reads one endpoint. Its goroutine creates, uses and closes the SUB socket: no other goroutine
// ever touches it (ZMQ sockets are not thread-safe). Stop with close(quit); <-done.
type reader struct {
	b       *Bridge
	slot    int
	watcher *sessionWatch // the socket's monitor; nil if it could not be set up
	quit    chan struct{}
	done    chan struct{}
}

// startReader starts the reader of endpoint slot on zctx and waits until its socket is connected
// (ZMQ connects in the background and reconnects by itself, also before the publisher has bound).
func (b *Bridge) startReader(zctx *zmq.Context, slot int) (*reader, error) {
	r := &reader{b: b, slot: slot, quit: make(chan struct{}), done: make(chan struct{})}
	setup := make(chan error, 1)
	go r.run(zctx, setup)
	if err := <-setup; err != nil {
		<-r.done
		return nil, err
	}
	return r, nil
}

func (r *reader) stop() {
	close(r.quit)
	<-r.done
}

// openSocket creates and connects the SUB socket of endpoint url, holding at most rcvhwm messages and
// reading no frame over maxMsg bytes.
func openSocket(zctx *zmq.Context, url string, rcvhwm, maxMsg int) (*zmq.Socket, error) {
	sock, err := zctx.NewSocket(zmq.SUB)
	if err != nil {
		return nil, fmt.Errorf("bridge: zmq socket for %s: %w", url, err)
	}
	for _, set := range []struct {
		name string
		err  error
	}{
		{"linger", sock.SetLinger(0)},
		{"rcvhwm", sock.SetRcvhwm(rcvhwm)},
		{"maxmsgsize", sock.SetMaxmsgsize(int64(maxMsg))},
		{"reconnect_ivl", sock.SetReconnectIvl(socketReconnectIvl)},
		{"reconnect_ivl_max", sock.SetReconnectIvlMax(socketReconnectIvlMax)},
		{"rcvtimeo", sock.SetRcvtimeo(socketPoll)},
		{"subscribe", sock.SetSubscribe("")},
	} {
		if set.err != nil {
			sock.Close()
			return nil, fmt.Errorf("bridge: zmq %s on %s: %w", set.name, url, set.err)
		}
	}
	if err := sock.Connect(url); err != nil {
		sock.Close()
		return nil, fmt.Errorf("bridge: zmq connect %s: %w", url, err)
	}
	return sock, nil
}

// run is the reader goroutine. The loop never waits on the broker: it receives, stamps the receive
// time, parses and decodes, and enqueues without blocking.
func (r *reader) run(zctx *zmq.Context, setup chan<- error) {
	defer close(r.done)
	url := r.b.endpoints[r.slot].URL
	sock, err := openSocket(zctx, url, r.b.cfg.MaxBuffer, r.b.cfg.MaxPayload)
	if err == nil {
		// Without the monitor a lost session would go unnoticed for good: refuse to run blind.
		if r.watcher, err = watchSession(zctx, sock, r.slot); err != nil {
			sock.Close()
			err = fmt.Errorf("bridge: zmq %s: %w", url, err)
		}
	}
	setup <- err
	if err != nil {
		return
	}
	defer func() {
		sock.Close()
		r.watcher.close()
	}()
	st := &readState{frames: make([][]byte, 0, 4), batch: make([]*item, 0, recvBatch)}
	if f, rc, err := pollFile(sock); err == nil {
		defer f.Close()
		r.pollLoop(sock, f, rc, st)
		return
	} else {
		r.b.log.Debug("zmq socket fd not pollable; reading with a receive timeout", "endpoint", url, "error", err)
	}
	r.blockingLoop(sock, st)
}

// readState is the reader goroutine's reusable scratch space.
type readState struct {
	frames     [][]byte
	batch      []*item
	batchBytes int64 // the sizes of batch's items
	rejected   []*item
}

// pollFile wraps the socket's ZMQ_FD (duplicated; libzmq keeps its own) in an os.File registered
// with Go's network poller, so the reader can wait for input without a blocking cgo call.
func pollFile(sock *zmq.Socket) (*os.File, syscall.RawConn, error) {
	fd, err := sock.GetFd()
	if err != nil {
		return nil, nil, err
	}
	dup, err := syscall.Dup(fd)
	if err != nil {
		return nil, nil, err
	}
	syscall.CloseOnExec(dup)
	f := os.NewFile(uintptr(dup), "zmq-fd")
	if err := f.SetReadDeadline(time.Time{}); err != nil { // fails unless the poller took the fd
		f.Close()
		return nil, nil, err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, rc, nil
}

// pollLoop reads with non-blocking receives and parks in Go's poller while the socket is idle.
//
// ZMQ_FD only signals that ZMQ_EVENTS may have changed, and Go's poller forgets a readiness it saw
// before a wait starts (RawConn.Read resets it). So ZMQ_EVENTS is checked inside the Read callback,
// after that reset: input that arrived earlier is seen by the check, input that arrives later wakes
// the wait. Every wait also ends after socketPoll, so the loop notices quit.
func (r *reader) pollLoop(sock *zmq.Socket, f *os.File, rc syscall.RawConn, st *readState) {
	url := r.b.endpoints[r.slot].URL
	for !r.stopped() {
		var ready bool
		var evErr error
		_ = f.SetReadDeadline(time.Now().Add(socketPoll))
		err := rc.Read(func(uintptr) bool {
			ev, err := sock.GetEvents()
			if err != nil {
				evErr = err
				return true
			}
			ready = ev&zmq.POLLIN != 0
			return ready
		})
		r.watch(sock, st, false)
		switch {
		case evErr != nil:
			if zmq.AsErrno(evErr) == zmq.ETERM {
				return
			}
			r.b.log.Error("zmq events failed", "endpoint", url, "error", evErr)
			r.pause()
		case ready:
			r.drain(sock, st)
		case err != nil && !errors.Is(err, os.ErrDeadlineExceeded):
			r.b.log.Error("waiting for zmq input failed; reading with a receive timeout", "endpoint", url, "error", err)
			r.blockingLoop(sock, st)
			return
		}
	}
}

// drain receives every multipart already queued (up to recvBatch at a time) and enqueues them.
func (r *reader) drain(sock *zmq.Socket, st *readState) {
	for {
		var err error
		for len(st.batch) < recvBatch && st.batchBytes < recvBatchBytes {
			if st.frames, err = recvMultipart(sock, zmq.DONTWAIT, st.frames); err != nil {
				break
			}
			st.add(r.b.receive(r.slot, st.frames))
		}
		if len(st.batch) == 0 {
			return
		}
		st.rejected = r.b.enqueue(r.slot, st.batch, st.rejected[:0])
		clear(st.batch)
		st.batch, st.batchBytes = st.batch[:0], 0
		if err != nil {
			return
		}
	}
}

// stopped reports whether the reader was told to stop (quit closed).
func (r *reader) stopped() bool {
	select {
	case <-r.quit:
		return true
	default:
		return false
	}
}

func (r *reader) pause() {
	select {
	case <-r.quit:
	case <-time.After(socketPoll):
	}
}

// blockingLoop reads with blocking receives that time out every socketPoll (the fallback when the
// socket's fd cannot be polled).
func (r *reader) blockingLoop(sock *zmq.Socket, st *readState) {
	url := r.b.endpoints[r.slot].URL
	for !r.stopped() {
		r.watch(sock, st, false)
		var err error
		st.frames, err = recvMultipart(sock, 0, st.frames)
		if err != nil {
			switch zmq.AsErrno(err) {
			case zmq.Errno(syscall.EAGAIN), zmq.Errno(syscall.EINTR):
				continue
			case zmq.ETERM:
				return
			}
			r.b.log.Error("zmq receive failed", "endpoint", url, "error", err)
			r.pause()
			continue
		}
		st.add(r.b.receive(r.slot, st.frames))
		r.drain(sock, st)
	}
}

// recvBatch is the most multiparts a reader decodes before it enqueues them, and recvBatchBytes the
// most bytes (so a batch of large messages does not sit in memory beside the buffer).
const (
	recvBatch      = 64
	recvBatchBytes = 1 << 20
)

func (st *readState) add(it *item) {
	st.batch = append(st.batch, it)
	st.batchBytes += it.size
}

// recvMultipart receives one multipart into frames (reusing its array). Frames after the first are
// always already there: ZMQ delivers a multipart atomically.
func recvMultipart(sock *zmq.Socket, flags zmq.Flag, frames [][]byte) ([][]byte, error) {
	clear(frames)
	frames = frames[:0]
	for {
		b, err := sock.RecvBytes(flags)
		if err != nil {
			return frames[:0], err
		}
		frames = append(frames, b)
		more, err := sock.GetRcvmore()
		if err != nil {
			return frames[:0], err
		}
		if !more {
			return frames, nil
		}
	}
}
