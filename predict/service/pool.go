package service

import (
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/micro"
)

// Admission and the worker pool. micro delivers an endpoint's requests one at a time, on the
// subscription's goroutine: handled there, one slow or hostile request would hold up every other. So
// the delivery goroutine only admits a request, and a fixed pool of Config.Workers goroutines answers
// it:
//
//   - A request over Config.MaxRequestBytes is refused unread (413) on the delivery goroutine: its
//     size is known before a byte of it is parsed, and it never takes a worker or a place in the queue.
//   - An admitted request waits in a queue of Config.QueueSize; a request that finds the queue full is
//     answered at once with a busy error (503): no goroutine is started per request, and a flood costs
//     at most the queue's requests in memory (QueueSize × MaxRequestBytes) and the workers' CPU.
//   - Stopping closes the queue: the workers answer what it holds, then exit; a request delivered
//     after that, while micro drains the subscriptions, is answered on the delivery goroutine.

// request is what a worker needs of a micro request: the endpoint's subject, where the reply goes and
// the body. A worker never touches the micro.Request, which micro reads again once its handler returns.
type request struct {
	endpoint string
	reply    string
	data     []byte
}

// pool is the queue and its workers.
type pool struct {
	mu      sync.RWMutex // stopped and closing jobs, against submit
	stopped bool
	jobs    chan func()
	wg      sync.WaitGroup
}

func startPool(workers, queue int) *pool {
	p := &pool{jobs: make(chan func(), queue)}
	p.wg.Add(workers)
	for range workers {
		go func() {
			defer p.wg.Done()
			for f := range p.jobs {
				f()
			}
		}()
	}
	return p
}

type admission int

const (
	admitted admission = iota
	queueFull
	poolStopped
)

// submit queues f without waiting.
func (p *pool) submit(f func()) admission {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.stopped {
		return poolStopped
	}
	select {
	case p.jobs <- f:
		return admitted
	default:
		return queueFull
	}
}

// stop lets the workers answer what is queued and waits for them.
func (p *pool) stop() {
	p.mu.Lock()
	if !p.stopped {
		p.stopped = true
		close(p.jobs)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// queued is how many requests wait for a worker.
func (p *pool) queued() int {
	if p == nil {
		return 0
	}
	return len(p.jobs)
}

// admit is the micro handler of an endpoint answered by h: the size check, then the queue.
func (s *Service) admit(h func(*request)) micro.HandlerFunc {
	return func(mr micro.Request) {
		r := &request{endpoint: mr.Subject(), reply: mr.Reply(), data: mr.Data()}
		if n := len(r.data); n > s.cfg.MaxRequestBytes {
			s.replyErrorBody(r, codeTooLarge, &ErrorReply{Code: 413, RequestBytes: n, MaxRequestBytes: s.cfg.MaxRequestBytes,
				Error: fmt.Sprintf("request of %d bytes, over the service's %d-byte limit (--max-request-bytes): refused unread; split it into smaller arrays", n, s.cfg.MaxRequestBytes)})
			return
		}
		switch s.pool.submit(func() { h(r) }) {
		case admitted:
		case queueFull:
			s.replyErrorBody(r, codeBusy, &ErrorReply{Code: 503, Workers: s.cfg.Workers, QueueSize: s.cfg.QueueSize,
				Error: fmt.Sprintf("busy: %d requests wait for %d workers; retry later, or run more instances in queue group %s", s.cfg.QueueSize, s.cfg.Workers, s.cfg.QueueGroup)})
		case poolStopped:
			h(r)
		}
	}
}
