package gaps

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"
)

// fetcher moves messages from a pull iterator (which blocks in Next) onto a channel, so that Run can
// select between two consumers, ticks and its context. It owns one goroutine; stop ends it and waits.
// The msgs channel is always closed when the goroutine ends.
type fetcher struct {
	name     string
	it       jetstream.MessagesContext
	msgs     chan jetstream.Msg
	quit     chan struct{}
	done     chan struct{}
	stopping atomic.Bool
	once     sync.Once
	err      error // why the iterator ended on its own; written before msgs is closed
}

func startFetcher(name string, it jetstream.MessagesContext, buffer int) *fetcher {
	f := &fetcher{name: name, it: it, msgs: make(chan jetstream.Msg, buffer), quit: make(chan struct{}), done: make(chan struct{})}
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
		select {
		case f.msgs <- m:
		case <-f.quit:
			return
		}
	}
}

// failure is the error to return when msgs closed without drain or stop.
func (f *fetcher) failure() error {
	<-f.done
	if f.err == nil || errors.Is(f.err, jetstream.ErrMsgIteratorClosed) && !errors.Is(f.err, jetstream.ErrConnectionClosed) {
		return fmt.Errorf("gaps: %s fetch ended unexpectedly: %w", f.name, jetstream.ErrMsgIteratorClosed)
	}
	return fmt.Errorf("gaps: %s fetch: %w", f.name, f.err)
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
