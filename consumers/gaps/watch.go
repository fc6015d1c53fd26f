package gaps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
)

// PublisherWatch follows a detector group's state bucket for a status page: the newest checkpoint of
// every publisher, as `gaps report` reads it, kept up to date by a KV watch. It reads only while it is
// asked: the watch starts at the first Publishers call and stops once no call came for its idle time,
// so a process nobody looks at pays nothing for it. It never writes. Its methods may be called from
// any goroutine.
type PublisherWatch struct {
	js         func() jetstream.JetStream
	bucket     string
	group      string
	staleAfter time.Duration
	idle       time.Duration
	now        func() time.Time

	mu      sync.Mutex
	on      jetstream.JetStream // the connection the running watch reads from; nil: none runs
	stop    context.CancelFunc
	synced  chan struct{} // closed once the watch delivered the initial states
	pubs    map[streams.Key]*watched
	lastAsk time.Time
	err     error
	retryAt time.Time
	wg      sync.WaitGroup
}

// watched is one publisher's newest state and the counts of its last checkpoints, for its rate.
type watched struct {
	st      state
	samples []rateSample
}

type rateSample struct {
	t        time.Time
	messages uint64
}

// rateWindow is how far back a publisher's rate looks.
const rateWindow = 15 * time.Second

// defaultWatchIdle is how long a PublisherWatch keeps reading after its last Publishers call.
const defaultWatchIdle = 2 * time.Minute

// publisherStatus is one publisher as the watch last saw it.
type publisherStatus struct {
	Key streams.Key
	// State is live, stale or restarted, as in `gaps report`.
	State string
	// Flowing: live and heard from within the detector's stale period.
	Flowing bool
	// Rate is FPMs per second (heartbeats included) between its checkpoints of the last 15 s.
	Rate        float64
	LastSeen    time.Time
	Messages    uint64
	Gaps        CauseCounts
	Missing     CauseCounts
	PendingGaps int
	Restarts    uint64
}

// NewPublisherWatch returns a watch of cfg's group (Group, StateBucket, StaleAfter) on the connection
// js returns (nil while there is none; a new one restarts the watch on it).
func NewPublisherWatch(js func() jetstream.JetStream, cfg Config) *PublisherWatch {
	return &PublisherWatch{js: js, bucket: cfg.StateBucket, group: cfg.Group, staleAfter: cfg.StaleAfter,
		idle: defaultWatchIdle, now: time.Now, pubs: map[streams.Key]*watched{}}
}

// Group names the detector group watched.
func (w *PublisherWatch) Group() string { return w.group }

// Publishers returns every publisher of the group, starting the watch when none runs (waiting, at
// most until ctx ends, for its first states).
func (w *PublisherWatch) Publishers(ctx context.Context) ([]publisherStatus, error) {
	synced, err := w.ensure(ctx)
	if err != nil {
		return nil, err
	}
	select {
	case <-synced:
	case <-ctx.Done():
		return nil, fmt.Errorf("gaps: reading state bucket %s: %w", w.bucket, ctx.Err())
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	out := make([]publisherStatus, 0, len(w.pubs))
	for k, p := range w.pubs {
		st := &p.st
		ps := publisherStatus{Key: k, State: condition(st), Messages: st.Counters.Messages, Gaps: st.Counters.Gaps,
			Missing: st.Counters.Missing, PendingGaps: len(st.Pending), Restarts: st.Counters.Restarts}
		if st.LastSeenMs > 0 {
			ps.LastSeen = time.UnixMilli(st.LastSeenMs)
		}
		ps.Flowing = ps.State == conditionLive && now.Sub(ps.LastSeen) <= w.staleAfter
		ps.Rate = p.rate(now)
		out = append(out, ps)
	}
	return out, nil
}

// condition is a publisher's state in reports: stale while silent, restarted in a run that began by a
// restart, else live.
func condition(st *state) string {
	switch {
	case st.Stale != nil:
		return conditionStale
	case st.Run.ByRestart:
		return conditionRestarted
	}
	return conditionLive
}

// ensure starts the watch when none runs on the current connection and returns its synced channel.
func (w *PublisherWatch) ensure(ctx context.Context) (<-chan struct{}, error) {
	js := w.js()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lastAsk = w.now()
	if js == nil {
		return nil, errors.New("gaps: no connection to the server now")
	}
	if w.on == js && w.stop != nil {
		return w.synced, nil
	}
	if w.stop != nil {
		w.stop() // a watch on a previous connection
		w.stop, w.on = nil, nil
	}
	if w.err != nil && w.now().Before(w.retryAt) {
		return nil, w.err
	}
	kv, err := js.KeyValue(ctx, w.bucket)
	if err != nil {
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			err = fmt.Errorf("gaps: state bucket %s does not exist yet: no gap detector of any group has started", w.bucket)
		} else {
			err = fmt.Errorf("gaps: state bucket %s: %w", w.bucket, err)
		}
		w.err, w.retryAt = err, w.now().Add(5*time.Second)
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.Background())
	kw, err := kv.Watch(wctx, w.group+".>")
	if err != nil {
		cancel()
		w.err, w.retryAt = fmt.Errorf("gaps: watching state bucket %s: %w", w.bucket, err), w.now().Add(5*time.Second)
		return nil, w.err
	}
	w.err = nil
	w.on, w.stop, w.synced = js, cancel, make(chan struct{})
	w.pubs = map[streams.Key]*watched{}
	w.wg.Add(1)
	go w.follow(wctx, kw, w.synced)
	return w.synced, nil
}

// follow applies the watch's entries until it ends (stopped, idle, or its connection closed).
func (w *PublisherWatch) follow(ctx context.Context, kw jetstream.KeyWatcher, synced chan struct{}) {
	defer w.wg.Done()
	defer func() { _ = kw.Stop() }()
	tick := time.NewTicker(w.idle / 4)
	defer tick.Stop()
	once := sync.OnceFunc(func() { close(synced) })
	defer once()
	prefix := w.group + "."
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			w.mu.Lock()
			idle := w.now().Sub(w.lastAsk) > w.idle
			if idle && w.synced == synced {
				w.stop()
				w.stop, w.on = nil, nil
			}
			w.mu.Unlock()
			if idle {
				return
			}
		case e, ok := <-kw.Updates():
			if !ok {
				w.mu.Lock()
				if w.synced == synced {
					w.stop()
					w.stop, w.on = nil, nil
				}
				w.mu.Unlock()
				return
			}
			if e == nil {
				once()
				continue
			}
			k, err := streams.ParseKVKeyTokens(strings.TrimPrefix(e.Key(), prefix))
			if err != nil {
				continue
			}
			w.apply(k, e)
		}
	}
}

func (w *PublisherWatch) apply(k streams.Key, e jetstream.KeyValueEntry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(w.pubs, k)
		return
	}
	var st state
	if json.Unmarshal(e.Value(), &st) != nil || st.V != stateVersion {
		return // `gaps report` and the detector name an unreadable state; the page shows the last good one
	}
	p := w.pubs[k]
	if p == nil {
		p = &watched{}
		w.pubs[k] = p
	}
	p.st = st
	t := e.Created()
	p.samples = append(p.samples, rateSample{t: t, messages: st.Counters.Messages})
	// Keep the newest sample older than the window as the rate's base.
	cut := 0
	for cut < len(p.samples)-2 && t.Sub(p.samples[cut+1].t) > rateWindow {
		cut++
	}
	p.samples = p.samples[cut:]
}

// rate is the FPMs per second from its oldest kept checkpoint to now: a publisher that went silent
// (no checkpoint since) decays towards 0 instead of showing its last burst.
func (p *watched) rate(now time.Time) float64 {
	if len(p.samples) < 2 {
		return 0
	}
	a, b := p.samples[0], p.samples[len(p.samples)-1]
	sec := now.Sub(a.t).Seconds()
	if sec <= 0 || b.messages < a.messages {
		return 0
	}
	return float64(b.messages-a.messages) / max(sec, b.t.Sub(a.t).Seconds())
}

// Close stops the watch.
func (w *PublisherWatch) Close() {
	w.mu.Lock()
	if w.stop != nil {
		w.stop()
		w.stop, w.on = nil, nil
	}
	w.mu.Unlock()
	w.wg.Wait()
}
