package trace

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Flushing: the consumer loop hands batches of buffered lines to the flusher goroutine, which
// compresses each producer's batch into gzip members, writes and fsyncs them (producers in parallel),
// while the loop goes on receiving and buffering. When a flush completes, the loop acks the messages
// whose lines it made durable. At most one flush is in flight: a second one waits for the first,
// which bounds memory and unacked messages.
//
// A failed write does not end the run: the flusher cuts the segment back to its last fsynced member,
// waits (exponential backoff), and writes the batch again into a new segment, until the disk takes it
// (see SegmentWriter.writeBatchRetry). Meanwhile the flush stays in flight: the loop acks nothing more,
// blocks at its next flush, and the server stops delivering at MaxAckPending, keeping the messages.
// Only the stop deadline (or a failure elsewhere) gives a retrying flush up.

// flusher runs writeBatchRetry off the consumer loop. It owns one goroutine; stop ends it.
type flusher struct {
	reqs     chan []flushJob
	done     chan flushResult // the result of the flush in flight
	exited   chan struct{}
	giveUp   chan struct{} // closed: retrying writes return their error
	once     sync.Once
	retry    func() backoff.BackOff
	report   func(sw *SegmentWriter, err error, wait time.Duration)
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

// startFlusher starts the flusher; retry (nil: no retry) makes the backoff of a failed write, report
// is told of every retry.
func startFlusher(retry func() backoff.BackOff, report func(sw *SegmentWriter, err error, wait time.Duration)) *flusher {
	fl := &flusher{
		reqs:   make(chan []flushJob),
		done:   make(chan flushResult, 1),
		exited: make(chan struct{}),
		giveUp: make(chan struct{}),
		retry:  retry,
		report: report,
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

// submit hands ps's buffered lines to the flusher, after waiting for the flush in flight, if any. If
// the loop's context ends while that flush is blocked (a write retrying), the lines stay buffered for
// the graceful stop.
func (w *Writer) submit(ps []*producer) error {
	if err := w.awaitFlush(); err != nil {
		if errors.Is(err, errStopping) {
			return nil
		}
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

// awaitFlush waits for the flush in flight, if any, and completes it. When w.interrupt closes first,
// it returns errStopping during the loop; while stopping, it gives the flush up and completes it.
func (w *Writer) awaitFlush() error {
	if !w.fl.inflight {
		return nil
	}
	select {
	case res := <-w.fl.done:
		return w.completeFlush(res)
	case <-w.interrupt:
	}
	if !w.stopping {
		return errStopping
	}
	w.fl.abandon()
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
	w.linesWritten += uint64(written)
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
		n, err := p.ackDurable(w.seqs)
		w.waiting -= n
		if err != nil {
			w.logger.Warn("trace writer: ack failed; the message will be redelivered (and skipped: its line is written)", "err", err)
		}
	}
}
