package bridge

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/fpmbus/fpmbus/streams"
)

// buffer is the bounded FIFO between the reader goroutines (producers) and the publisher goroutine
// (the one consumer). It never blocks a producer: push either queues the item or, when the buffer
// holds MaxBuffer items or MaxBufferBytes bytes, drops it.
//
// Dropped FPMs are tracked per publisher key as contiguous ranges of sequence numbers (same epoch,
// same reason, next sequence). A range closes when a drop of its key is not contiguous, when the key's
// next message is accepted, when it has seen no drop for rangeIdle, or at shutdown. Closed ranges wait
// in markers until the publisher takes them; they are never dropped. Only drops create ranges, and every
// range but the open one per key is separated from the next by an accepted message, so the markers stay
// few next to the MaxBuffer items they stand for.
//
// All fields below mu are guarded by mu; mu is never held while taking another lock.
type buffer struct {
	max      int
	maxBytes int64
	notify   chan struct{} // capacity 1; signalled after every push and every closed range

	mu      sync.Mutex
	ring    []*item // circular; grows by doubling up to max
	head    int
	n       int
	bytes   int64
	order   uint64 // next enqueue order
	open    map[streams.Key]*dropRange
	markers []*dropRange

	length atomic.Int64 // == n, readable without mu
	high   atomic.Int64 // the most items ever held at once; never above max
	nOpen  atomic.Int64 // == len(open), so push skips the map when nothing is open
}

// rangeIdle closes an open drop range that has not grown for this long.
const rangeIdle = time.Second

// dropRange is a contiguous run of dropped sequences of one key.
type dropRange struct {
	key         streams.Key
	epoch       int64 // the run's local epoch; the agreed one once its marker is built (runs.go)
	run         *run
	first, last uint64
	count       uint64
	reason      string
	firstRecvMs int64
	lastRecvMs  int64
	lastDrop    time.Time // monotonic time of the last drop, for rangeIdle
}

func newBuffer(max int, maxBytes int64) *buffer {
	return &buffer{
		max:      max,
		maxBytes: maxBytes,
		notify:   make(chan struct{}, 1),
		ring:     make([]*item, min(max, 1024)),
		open:     make(map[streams.Key]*dropRange),
	}
}

func (b *buffer) signal() {
	select {
	case b.notify <- struct{}{}:
	default:
	}
}

// push queues it, or drops it when the buffer is full. A dropped FPM is recorded in its key's drop
// range with reason buffer_full; the caller counts the drop.
func (b *buffer) push(it *item) (accepted bool) {
	return len(b.pushBatch([]*item{it}, nil)) == 0
}

// pushBatch pushes every item of its in order under one lock (see push) and appends the dropped ones
// to rejected.
func (b *buffer) pushBatch(its []*item, rejected []*item) []*item {
	var now time.Time
	queued := false
	b.mu.Lock()
	for _, it := range its {
		if b.n >= b.max || (b.n > 0 && b.bytes+it.size > b.maxBytes) {
			if it.kind == kindFPM {
				if now.IsZero() {
					now = time.Now()
				}
				b.recordDropLocked(it, reasonBufferFull, now)
			}
			rejected = append(rejected, it)
			continue
		}
		if it.kind == kindFPM && b.nOpen.Load() > 0 {
			if r := b.open[it.key]; r != nil {
				b.closeLocked(it.key, r) // the key's drops have ended: its next message got in
			}
		}
		if b.n == len(b.ring) {
			b.growLocked()
		}
		it.order = b.order
		b.order++
		b.ring[(b.head+b.n)%len(b.ring)] = it
		b.n++
		b.bytes += it.size
		queued = true
	}
	b.length.Store(int64(b.n))
	if int64(b.n) > b.high.Load() {
		b.high.Store(int64(b.n))
	}
	b.mu.Unlock()
	if queued {
		b.signal()
	}
	return rejected
}

func (b *buffer) growLocked() {
	ring := make([]*item, min(2*len(b.ring), b.max))
	for i := 0; i < b.n; i++ {
		ring[i] = b.ring[(b.head+i)%len(b.ring)]
	}
	b.ring, b.head = ring, 0
}

// pop appends up to max queued items, oldest first, to dst.
func (b *buffer) pop(dst []*item, max int) []*item {
	return b.popBytes(dst, max, -1)
}

// popBytes is pop that also stops once the items taken add up to budget bytes (the item that reaches
// the budget is taken; a negative budget is no limit, 0 takes nothing).
func (b *buffer) popBytes(dst []*item, n int, budget int64) []*item {
	b.mu.Lock()
	for ; n > 0 && b.n > 0 && budget != 0; n-- {
		it := b.ring[b.head]
		b.ring[b.head] = nil
		b.head = (b.head + 1) % len(b.ring)
		b.n--
		b.bytes -= it.size
		dst = append(dst, it)
		if budget > 0 {
			budget = max(budget-it.size, 0)
		}
	}
	b.length.Store(int64(b.n))
	b.mu.Unlock()
	return dst
}

// recordDrop records a dropped FPM (reason shutdown or rejected) in its key's drop range.
func (b *buffer) recordDrop(it *item, reason string) {
	b.mu.Lock()
	b.recordDropLocked(it, reason, time.Now())
	b.mu.Unlock()
}

func (b *buffer) recordDropLocked(it *item, reason string, now time.Time) {
	r := b.open[it.key]
	if r != nil && (r.epoch != it.epoch || r.reason != reason || it.seq != r.last+1) {
		b.closeLocked(it.key, r)
		r = nil
	}
	if r == nil {
		r = &dropRange{key: it.key, epoch: it.epoch, run: it.run, first: it.seq, reason: reason, firstRecvMs: it.recvMs}
		b.open[it.key] = r
		b.nOpen.Store(int64(len(b.open)))
	}
	r.last = it.seq
	r.count++
	r.lastRecvMs = it.recvMs
	r.lastDrop = now
}

func (b *buffer) closeLocked(k streams.Key, r *dropRange) {
	delete(b.open, k)
	b.nOpen.Store(int64(len(b.open)))
	b.markers = append(b.markers, r)
	b.signal()
}

// closeIdle closes every open range without a drop since before now-rangeIdle; all closes every one.
func (b *buffer) closeIdle(now time.Time, all bool) {
	if b.nOpen.Load() == 0 {
		return
	}
	b.mu.Lock()
	for k, r := range b.open {
		if all || now.Sub(r.lastDrop) >= rangeIdle {
			b.closeLocked(k, r)
		}
	}
	b.mu.Unlock()
}

// takeMarkers returns the closed ranges and forgets them; the caller publishes them.
func (b *buffer) takeMarkers() []*dropRange {
	b.mu.Lock()
	m := b.markers
	b.markers = nil
	b.mu.Unlock()
	return m
}

// pendingMarkers reports whether closed ranges wait to be taken.
func (b *buffer) pendingMarkers() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.markers) > 0
}

// len returns the number of queued items.
func (b *buffer) len() int { return int(b.length.Load()) }
