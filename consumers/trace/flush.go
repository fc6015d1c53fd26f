package trace

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"
)

// Flushing: the consumer loop hands batches of buffered lines to the flusher goroutine, which
// compresses each producer's batch into gzip members, writes and fsyncs them (producers in parallel),
// while the loop goes on receiving and buffering. When a flush completes, the loop acks the messages
// whose lines it made durable. At most one flush is in flight: a second one waits for the first,
// which bounds memory and unacked messages.

// flusher runs writeBatch off the consumer loop. It owns one goroutine; stop ends it.
type flusher struct {
	reqs     chan []flushJob
	done     chan flushResult // the result of the flush in flight
	exited   chan struct{}
	inflight bool // owned by the consumer loop
}

// flushJob is one producer's batch and, once written, its error.
type flushJob struct {
	p     *producer
	b     batch
	lines int // lines in b (metrics)
	err   error
}

type flushResult struct {
	jobs []flushJob
	took time.Duration
}

func startFlusher() *flusher {
	fl := &flusher{
		reqs:   make(chan []flushJob),
		done:   make(chan flushResult, 1),
		exited: make(chan struct{}),
	}
	go fl.run()
	return fl
}

func (fl *flusher) run() {
	defer close(fl.exited)
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for jobs := range fl.reqs {
		t0 := time.Now()
		if len(jobs) == 1 {
			jobs[0].err = jobs[0].p.sw.writeBatch(jobs[0].b)
		} else {
			var wg sync.WaitGroup
			for i := range jobs {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					jobs[i].err = jobs[i].p.sw.writeBatch(jobs[i].b)
					<-sem
				}()
			}
			wg.Wait()
		}
		fl.done <- flushResult{jobs: jobs, took: time.Since(t0)}
	}
}

// stop ends the goroutine; no flush may be in flight.
func (fl *flusher) stop() {
	close(fl.reqs)
	<-fl.exited
}

// flush hands every dirty producer's lines to the flusher.
func (w *Writer) flush() error {
	return w.submit(w.dirty)
}

// submit hands ps's buffered lines to the flusher, after waiting for the flush in flight, if any.
func (w *Writer) submit(ps []*producer) error {
	if err := w.awaitFlush(); err != nil {
		return err
	}
	var jobs []flushJob
	for _, p := range ps {
		if !p.dirty {
			continue
		}
		jobs = append(jobs, flushJob{p: p, b: p.sw.detach(), lines: p.lines})
		p.lines, p.dirty = 0, false
	}
	w.dirty = slices.DeleteFunc(w.dirty, func(p *producer) bool { return !p.dirty })
	w.unflushed = 0
	if len(jobs) == 0 {
		w.ackAll() // messages that need no line of their own may be waiting
		return nil
	}
	w.fl.reqs <- jobs
	w.fl.inflight = true
	return nil
}

// awaitFlush waits for the flush in flight, if any, and completes it.
func (w *Writer) awaitFlush() error {
	if !w.fl.inflight {
		return nil
	}
	return w.completeFlush(<-w.fl.done)
}

// completeFlush records a finished flush: durable lines, metrics, acks. A failed producer's messages
// stay unacked (redelivered); its error ends Run.
func (w *Writer) completeFlush(res flushResult) error {
	w.fl.inflight = false
	w.metrics.flush.Observe(res.took.Seconds())
	var failed error
	written := 0
	for _, j := range res.jobs {
		if err := j.p.sw.complete(j.b, j.err); err != nil {
			failed = errors.Join(failed, err)
			continue
		}
		written += j.lines
	}
	w.metrics.writtenMode.Add(float64(written))
	w.ackAll()
	if failed != nil {
		return fmt.Errorf("trace: flush: %w", failed)
	}
	return nil
}

// ackAll acks, for every producer, the messages whose lines are durable.
func (w *Writer) ackAll() {
	if w.waiting == 0 {
		return
	}
	for _, p := range w.bySegment {
		if len(p.pending) == 0 {
			continue
		}
		n, err := p.ackDurable()
		w.waiting -= n
		if err != nil {
			w.logger.Warn("trace writer: ack failed; the message will be redelivered and written again", "err", err)
		}
	}
}
