package trace

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/fpmbus/fpmbus/tracefile"
)

// Flushing: the writer hands batches of buffered lines to the flusher goroutine, which compresses each
// producer's batch into gzip members, writes and fsyncs them (producers in parallel), while the
// writer's goroutine goes on receiving and buffering. When a flush completes (collect, or awaitFlush),
// the messages whose lines it made durable are done. At most one flush is in flight: a flush asked for
// meanwhile starts when it completes, and the lines wait in the buffer; the writer's goroutine never
// blocks on the disk. The buffer is bounded by MaxAckPending: the server delivers no more messages
// while that many wait to be done.
//
// A failed write does not end the writer: the flusher cuts the segment back to its last fsynced
// member, waits (exponential backoff), and writes the batch again into that segment, until the disk
// takes it (see SegmentWriter.writeBatchRetry). Meanwhile the flush stays in flight: nothing more is
// done, and the server stops delivering at MaxAckPending, keeping the messages (the runner keeps the
// held ones from being redelivered with in-progress acks). Only finish's stop (the release deadline)
// or abort gives a retrying flush up. A file name the file system refuses concerns one producer: its
// messages are rejected (writer.dropProducer).

// flusher runs writeBatchRetry off the writer's goroutine. It owns one goroutine; stop ends it.
type flusher struct {
	reqs     chan []flushJob
	done     chan flushResult // the result of the flush in flight
	exited   chan struct{}
	giveUp   chan struct{} // closed: retrying writes return their error
	once     sync.Once
	stopOnce sync.Once
	retry    func() backoff.BackOff
	report   func(sw *SegmentWriter, err error, wait time.Duration)
	notify   func()
	inflight bool // owned by the writer's goroutine
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

// startFlusher starts the flusher; retry (nil: no retry) makes the backoff of a failed write, report
// is told of every retry, notify (nil: none) of every completed flush, after its result is on done.
func startFlusher(retry func() backoff.BackOff, report func(sw *SegmentWriter, err error, wait time.Duration), notify func()) *flusher {
	fl := &flusher{
		reqs:   make(chan []flushJob),
		done:   make(chan flushResult, 1),
		exited: make(chan struct{}),
		giveUp: make(chan struct{}),
		retry:  retry,
		report: report,
		notify: notify,
	}
	go fl.run()
	return fl
}

func (fl *flusher) write(j *flushJob) {
	var bo backoff.BackOff
	if fl.retry != nil {
		bo = fl.retry()
	}
	j.err = j.p.sw.writeBatchRetry(j.b, fl.giveUp, bo, fl.report)
}

// abandon gives up the writes still retrying.
func (fl *flusher) abandon() {
	fl.once.Do(func() { close(fl.giveUp) })
}

func (fl *flusher) run() {
	defer close(fl.exited)
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for jobs := range fl.reqs {
		t0 := time.Now()
		if len(jobs) == 1 {
			fl.write(&jobs[0])
		} else {
			var wg sync.WaitGroup
			for i := range jobs {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					fl.write(&jobs[i])
					<-sem
				}()
			}
			wg.Wait()
		}
		fl.done <- flushResult{jobs: jobs, took: time.Since(t0)}
		if fl.notify != nil {
			fl.notify()
		}
	}
}

// stop ends the goroutine; no flush may be in flight. A second stop does nothing.
func (fl *flusher) stop() {
	fl.stopOnce.Do(func() { close(fl.reqs) })
	<-fl.exited
}

// flush hands every dirty producer's lines to the flusher.
func (w *writer) flush() error {
	return w.submit(w.dirty)
}

// submit hands ps's buffered lines to the flusher, unless a flush is in flight: then the lines stay
// buffered and every dirty producer is flushed when that one completes.
func (w *writer) submit(ps []*producer) error {
	if w.fl.inflight {
		w.again = true
		return nil
	}
	w.again = false
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
		w.markDone() // messages that need no line of their own may be waiting
		return nil
	}
	w.fl.reqs <- jobs
	w.fl.inflight = true
	return nil
}

// collect completes the flush in flight if it has finished; it never waits.
func (w *writer) collect() error {
	if !w.fl.inflight {
		return nil
	}
	select {
	case res := <-w.fl.done:
		return w.completeFlush(res)
	default:
		return nil
	}
}

// awaitFlush waits for the flush in flight, if any, and completes it. When stop closes first, a
// write still retrying is given up: its error is returned.
func (w *writer) awaitFlush(stop <-chan struct{}) error {
	if !w.fl.inflight {
		return nil
	}
	select {
	case res := <-w.fl.done:
		return w.completeFlush(res)
	case <-stop:
	}
	w.fl.abandon()
	return w.completeFlush(<-w.fl.done)
}

// drain flushes until every buffered line is durable and every message that can be is done; see
// awaitFlush for stop.
func (w *writer) drain(stop <-chan struct{}) error {
	for {
		if err := w.awaitFlush(stop); err != nil {
			return err
		}
		if err := w.flush(); err != nil {
			return err
		}
		if !w.fl.inflight {
			return nil
		}
	}
}

// completeFlush records a finished flush: durable lines, metrics, done messages. A producer whose file
// name was refused is dropped (its messages rejected); any other failure is returned and ends the
// writer, its messages not done. A flush asked for meanwhile starts now.
func (w *writer) completeFlush(res flushResult) error {
	w.fl.inflight = false
	w.m.flush.Observe(res.took.Seconds())
	var failed error
	written := 0
	for _, j := range res.jobs {
		if j.err != nil && tracefile.NameRefused(j.err) && !j.p.sw.closed {
			w.dropProducer(j.p, j.err)
			continue
		}
		err := j.p.sw.complete(j.b, j.err)
		w.reportPruned(j.p.sw, j.p.sw.takePruned())
		if err != nil {
			failed = errors.Join(failed, err)
			continue
		}
		written += j.lines
	}
	w.m.writtenMode.Add(float64(written))
	w.linesWritten += uint64(written)
	w.markDone()
	if failed != nil {
		return fmt.Errorf("trace: flush: %w", failed)
	}
	if w.again {
		return w.flush()
	}
	return nil
}
