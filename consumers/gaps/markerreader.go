package gaps

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
)

// markerBuffer bounds the drop markers pulled and not yet applied by the loop.
const markerBuffer = 256

// markerReader reads the bridge's drop markers for the loop. It is not a durable consumer: every
// instance reads every marker with an ordered consumer on FPM_EVENTS from the moment it starts
// (markers stored before are read by direct get when a publisher is loaded) and applies those of the
// publishers it owns; nothing is acked. (A partition group on the markers would pin its partitions
// independently of the FPM ones, so a marker could reach a member that does not own its publisher.)
//
// Its goroutine pulls markers into msgs and asks the loop, through wake (Runner.Do), to apply them;
// at most one such request is pending at a time, so it never fills the runner's queue. msgs is closed
// when the goroutine ends.
type markerReader struct {
	cons      jetstream.Consumer
	it        jetstream.MessagesContext
	msgs      chan jetstream.Msg
	wake      func()
	scheduled atomic.Bool // a wake is pending: the loop has not started draining msgs yet
	quit      chan struct{}
	finished  chan struct{}
	stopping  atomic.Bool
	once      sync.Once
	err       error // why the iterator ended on its own; written before msgs is closed
}

// startMarkerReader reads the markers matching filter stored from FPM_EVENTS sequence from on.
func startMarkerReader(ctx context.Context, events jetstream.Stream, filter string, from uint64, wake func()) (*markerReader, error) {
	cons, err := events.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    from,
	})
	if err != nil {
		return nil, fmt.Errorf("gaps: read drop markers on %s: %w", streams.StreamEvents, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(markerBuffer))
	if err != nil {
		return nil, fmt.Errorf("gaps: read drop markers on %s: %w", streams.StreamEvents, err)
	}
	r := &markerReader{cons: cons, it: it, msgs: make(chan jetstream.Msg, markerBuffer), wake: wake,
		quit: make(chan struct{}), finished: make(chan struct{})}
	go r.run()
	return r, nil
}

func (r *markerReader) run() {
	defer close(r.finished)
	defer r.request()
	defer close(r.msgs)
	for {
		m, err := r.it.Next()
		if err != nil {
			if !r.stopping.Load() {
				r.err = err
			}
			return
		}
		select {
		case r.msgs <- m:
		case <-r.quit:
			return
		}
		r.request()
	}
}

// request asks the loop to drain msgs unless a request is pending already.
func (r *markerReader) request() {
	if r.scheduled.CompareAndSwap(false, true) {
		r.wake()
	}
}

// take returns, on the loop, the markers waiting (at most markerBuffer) and whether the reader has
// ended on its own (msgs closed without stop).
func (r *markerReader) take(buf []jetstream.Msg) ([]jetstream.Msg, bool) {
	r.scheduled.Store(false) // a marker queued from now on requests another drain
	for range markerBuffer {
		select {
		case m, ok := <-r.msgs:
			if !ok {
				return buf, !r.stopping.Load()
			}
			buf = append(buf, m)
		default:
			return buf, false
		}
	}
	return buf, false
}

// idle reports whether no pulled marker waits for the loop.
func (r *markerReader) idle() bool { return len(r.msgs) == 0 }

// failure is the error to report when the reader ended without stop.
func (r *markerReader) failure() error {
	<-r.finished
	if r.err == nil || errors.Is(r.err, jetstream.ErrMsgIteratorClosed) && !errors.Is(r.err, jetstream.ErrConnectionClosed) {
		return fmt.Errorf("gaps: drop marker reader ended unexpectedly: %w", jetstream.ErrMsgIteratorClosed)
	}
	return fmt.Errorf("gaps: drop marker reader: %w", r.err)
}

// caughtUpAt reports whether every marker stored for the reader has reached the loop, and the server's
// time when that was true: nothing is pending and the server delivered nothing after the last marker
// that reached the loop (delivery sequence delivered of consumer from).
//
// Delivery sequences, not stream sequences: the reader is filtered, and the server moves its stream
// position past the messages it does not match (the detector's own gap events on FPM_EVENTS) whenever
// it looks for the next one (every pull), so a stream position beyond the last marker delivered does
// not mean a marker is on its way.
func (r *markerReader) caughtUpAt(js jetstream.JetStream, from string, delivered uint64, timeout time.Duration) (time.Time, bool) {
	if len(r.msgs) > 0 {
		return time.Time{}, false
	}
	if nc := js.Conn(); nc != nil && !nc.IsConnected() {
		return time.Time{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	info, err := r.cons.Info(ctx)
	if err != nil {
		return time.Time{}, false
	}
	if info.NumPending > 0 {
		return time.Time{}, false
	}
	if info.Name != from {
		delivered = 0 // nothing reached the loop from this consumer yet (a new one after a reset)
	}
	if info.Delivered.Consumer > delivered {
		return time.Time{}, false
	}
	return info.TimeStamp, true
}

// stop stops pulling, discards what is buffered and waits for the goroutine. It may be called more
// than once.
func (r *markerReader) stop() {
	r.stopping.Store(true)
	r.once.Do(func() {
		r.it.Stop()
		close(r.quit)
	})
	<-r.finished
}
