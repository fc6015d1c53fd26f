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
// monitor.go).
//
// Connections. A PUB/SUB subscriber cannot see a publisher restart except by the sequence going back,
// and it goes back only when the old run sent more numbers than the new one had sent by the time the
// subscriber was connected again. What the subscriber does see is its TCP connection to the PUB ending
// and a new one beginning: a restarted publisher is a new process with a new socket, so every restart
// is such a reconnect (a connection can also break without a restart). So the reader owns its
// connections, and numbers them (Bridge.sessions): libzmq's own reconnection is pushed out of reach
// (ZMQ_RECONNECT_IVL zmqReconnectIvl, no backoff), and the reader reconnects itself (monitor.go): after
// a connection ended it first drains everything libzmq received on it, then connects again under a
// new session number, so every message is attributed to the connection it came on, exactly, whatever
// the timing (libzmq receives nothing on the endpoint between the two). It connects again at once after
// a connection that completed its handshake ends, and every socketReconnectIvl while attempts fail: a
// restarted publisher is found within about that, so the new run's first numbers lost before the
// bridge was subscribed again are few (libzmq's default backoff, which grew to 5 s, lost its first
// seconds), and whatever is lost is named: epochs start a new run on a reconnect (epoch.go). The reader
// also notices when it was not running for readerStall (its process stopped, or starved): a new session
// on the same connection, after which its runs re-agree their epochs (runs.go).
const (
	// socketReconnectIvl is how long the reader waits before it tries to connect again after an attempt
	// failed (or a connection ended before its handshake).
	socketReconnectIvl = 100 * time.Millisecond
	// zmqReconnectIvl is libzmq's own reconnect interval: so long that only the reader reconnects.
	zmqReconnectIvl = time.Hour
	// socketPoll is how long one receive waits before the reader checks whether it must stop.
	socketPoll = 100 * time.Millisecond
	// socketConnectStuck is how long an attempt to connect may go without an answer (neither
	// connected nor failed) before the reader makes a new one: the safety net should a monitor event
	// be lost.
	socketConnectStuck = 5 * time.Second
	// readerStall is how long the reader may go without running before it takes itself for stalled
	// (see resumeSession): half of liveProbe, so a stall long enough for a starting bridge to give up
	// waiting for this one's FPMs is always noticed.
	readerStall = liveProbe / 2
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
	// conn and sess number the reader's connections and its sessions on them (a stall starts a new
	// session on the same connection); Bridge.sessions holds both for epochs.
	conn, sess uint32
	lastTick   time.Time
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

// newConnection numbers the connection the reader is about to make: every message received from now
// on came on it (or on a later one).
func (r *reader) newConnection() {
	r.conn++
	r.sess++
	r.b.sessions[r.slot].Store(uint64(r.conn)<<32 | uint64(r.sess))
}

// resumeSession notes that the reader was stalled (the process stopped, or starved) on a connection
// that goes on: the publisher did not restart, but another bridge may have started meanwhile and,
// seeing nothing of this one, recorded the run under an epoch of its own; epochs then start a run
// that re-agrees its epoch (runResume), taking the other bridge's if its FPMs show it.
func (r *reader) resumeSession() {
	r.sess++
	r.b.sessions[r.slot].Store(uint64(r.conn)<<32 | uint64(r.sess))
}

// tick marks that the reader is running; a gap since the last tick longer than readerStall means it
// was not (resumeSession). The loops tick after every wait and before every receive, so the gap
// between two ticks is at most socketPoll while the reader runs.
func (r *reader) tick() {
	now := time.Now()
	if !r.lastTick.IsZero() && now.Sub(r.lastTick) > readerStall {
		r.resumeSession()
	}
	r.lastTick = now
}

func (r *reader) stop() {
	close(r.quit)
	<-r.done
}

// newSubSocket creates the SUB socket of endpoint url, not connected yet, holding at most rcvhwm
// messages and reading no frame over maxMsg bytes.
func newSubSocket(zctx *zmq.Context, url string, rcvhwm, maxMsg int) (*zmq.Socket, error) {
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
		{"reconnect_ivl", sock.SetReconnectIvl(zmqReconnectIvl)},
		{"reconnect_ivl_max", sock.SetReconnectIvlMax(0)},
		{"rcvtimeo", sock.SetRcvtimeo(socketPoll)},
		{"subscribe", sock.SetSubscribe("")},
	} {
		if set.err != nil {
			sock.Close()
			return nil, fmt.Errorf("bridge: zmq %s on %s: %w", set.name, url, set.err)
		}
	}
	return sock, nil
}

// run is the reader goroutine. The loop never waits on the broker: it receives, stamps the receive
// time, parses and decodes, and enqueues without blocking.
func (r *reader) run(zctx *zmq.Context, setup chan<- error) {
	defer close(r.done)
	url := r.b.endpoints[r.slot].URL
	sock, err := newSubSocket(zctx, url, r.b.cfg.MaxBuffer, r.b.cfg.MaxPayload)
	if err == nil {
		// Without the monitor a lost session would go unnoticed for good, and no failed attempt would
		// be tried again: refuse to run blind. It is watching before the first attempt is made.
		if r.watcher, err = watchSession(zctx, sock, r.slot); err != nil {
			sock.Close()
			err = fmt.Errorf("bridge: zmq %s: %w", url, err)
		}
	}
	if err == nil {
		r.newConnection()
		r.watcher.attemptAt = time.Now()
		if err = sock.Connect(url); err != nil {
			sock.Close()
			r.watcher.close()
			err = fmt.Errorf("bridge: zmq connect %s: %w", url, err)
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
		if r.b.opts.readerHold != nil {
			r.b.opts.readerHold(r.slot)
		}
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
		r.tick()
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
			r.tick()
			if st.frames, err = recvMultipart(sock, zmq.DONTWAIT, st.frames); err != nil {
				break
			}
			if r.watcher != nil {
				r.watcher.received = true
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
		if r.b.opts.readerHold != nil {
			r.b.opts.readerHold(r.slot)
		}
		r.watch(sock, st, false)
		var err error
		st.frames, err = recvMultipart(sock, 0, st.frames)
		r.tick()
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
		if r.watcher != nil {
			r.watcher.received = true
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
