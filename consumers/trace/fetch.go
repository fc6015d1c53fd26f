package trace

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"
)

// msgSource is where the writer's messages come from: the seam between the consumer loop and the
// consumer. Run uses the durable pull consumer's iterator (jetstream.MessagesContext), a backfill an
// ordered consumer's, bounded to its range; a partitioned group (consumers/partition) can hand a
// partition's messages through the same three calls. Next blocks until a message arrives or the
// source ends (then it returns an error; jetstream.ErrMsgIteratorClosed after Drain or Stop). Drain
// stops pulling but lets Next return what was already received; Stop ends at once.
type msgSource interface {
	Next(...jetstream.NextOpt) (jetstream.Msg, error)
	Drain()
	Stop()
}

// fetcher moves messages from a msgSource (which blocks in Next) onto a channel, so that the loop can
// select between messages, flush ticks and its context. It also parses them (parseRecord), so that
// checking the next messages overlaps with writing the previous ones. It owns one goroutine; stop ends
// it and waits. The msgs channel is always closed when the goroutine ends.
type fetcher struct {
	it       msgSource
	producer string // Config.ProducerID
	meta     metaOf
	msgs     chan fetched
	quit     chan struct{}
	done     chan struct{}
	stopping atomic.Bool
	once     sync.Once
	err      error // why the iterator ended on its own; written before msgs is closed
}

// fetched is one message and the result of parsing it.
type fetched struct {
	rec record // rec.msg is always set
	err error  // the message can never be written
}

func startFetcher(it msgSource, buffer int, producerOverride string, meta metaOf) *fetcher {
	f := &fetcher{
		it:       it,
		producer: producerOverride,
		meta:     meta,
		msgs:     make(chan fetched, buffer),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	go f.run()
	return f
}

func (f *fetcher) run() {
	defer close(f.done)
	defer close(f.msgs)
	for {
		m, err := f.it.Next()
		if err != nil {
			if !f.stopping.Load() {
				f.err = err
			}
			return
		}
		r, err := parseRecord(m, f.producer, f.meta)
		select {
		case f.msgs <- fetched{rec: r, err: err}:
		case <-f.quit:
			return
		}
	}
}

// errEndOfRange ends a bounded source (a backfill's range): the loop then stops gracefully.
var errEndOfRange = errors.New("trace: end of range")

// ended reports whether the source ended because its range is complete.
func (f *fetcher) ended() bool {
	<-f.done
	return errors.Is(f.err, errEndOfRange)
}

// failure is the error to return when msgs closed without drain or stop.
func (f *fetcher) failure() error {
	<-f.done
	if f.err == nil || errors.Is(f.err, jetstream.ErrMsgIteratorClosed) && !errors.Is(f.err, jetstream.ErrConnectionClosed) {
		return fmt.Errorf("trace: fetch ended unexpectedly: %w", jetstream.ErrMsgIteratorClosed)
	}
	return fmt.Errorf("trace: fetch: %w", f.err)
}

// drain stops pulling; the messages the client already holds still arrive on msgs, then it closes.
func (f *fetcher) drain() {
	f.stopping.Store(true)
	f.it.Drain()
}

// stop stops pulling, discards what is buffered (unacked: redelivered) and waits for the goroutine.
func (f *fetcher) stop() {
	f.stopping.Store(true)
	f.once.Do(func() {
		f.it.Stop()
		close(f.quit)
	})
	<-f.done
}
