package natsserver

import (
	"net"
	"sync"
	"time"
)

// inProcessCloseWait bounds how long closing an in-process connection waits for what it still has to
// write (a drain's last acks) to reach the server.
const inProcessCloseWait = 5 * time.Second

// InProcessConn hands nats.go an in-process connection to the server (Server is a
// nats.InProcessConnProvider: natsconn.ConnConfig.InProcess) whose writes never block the writer. The
// server's in-process connection is a net.Pipe, where a write waits for the other side to read: nats.go
// writes CONNECT and PING as two writes, and a server that refuses the CONNECT writes its -ERR before
// reading the PING, so both sides would wait on each other until the server's write deadline, and the
// client would see a closed pipe instead of the authorization violation.
func (s *Server) InProcessConn() (net.Conn, error) {
	c, err := s.ns.InProcessConn()
	if err != nil {
		return nil, err
	}
	return newQueuedWriteConn(c), nil
}

// queuedWriteConn queues writes and writes them to the connection from one goroutine, in order. A
// write error is returned by the next Write. Close writes what is queued (within inProcessCloseWait)
// before closing.
type queuedWriteConn struct {
	net.Conn
	mu      sync.Mutex
	ready   *sync.Cond // signalled when buf grows or closing is set
	buf     []byte
	err     error
	closing bool
	done    chan struct{} // closed when the writer goroutine returns
}

func newQueuedWriteConn(c net.Conn) *queuedWriteConn {
	q := &queuedWriteConn{Conn: c, done: make(chan struct{})}
	q.ready = sync.NewCond(&q.mu)
	go q.writeLoop()
	return q
}

func (q *queuedWriteConn) Write(b []byte) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.err != nil:
		return 0, q.err
	case q.closing:
		return 0, net.ErrClosed
	}
	q.buf = append(q.buf, b...)
	q.ready.Signal()
	return len(b), nil
}

func (q *queuedWriteConn) writeLoop() {
	defer close(q.done)
	for {
		q.mu.Lock()
		for len(q.buf) == 0 && !q.closing && q.err == nil {
			q.ready.Wait()
		}
		if len(q.buf) == 0 || q.err != nil {
			q.mu.Unlock()
			return
		}
		data := q.buf
		q.buf = nil
		q.mu.Unlock()
		if _, err := q.Conn.Write(data); err != nil {
			q.mu.Lock()
			q.err = err
			q.mu.Unlock()
			return
		}
	}
}

func (q *queuedWriteConn) Close() error {
	q.mu.Lock()
	q.closing = true
	q.ready.Signal()
	q.mu.Unlock()
	select {
	case <-q.done:
	case <-time.After(inProcessCloseWait):
	}
	err := q.Conn.Close() // unblocks a write the server never read
	<-q.done
	return err
}
