package bridge

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Group commit: when FPMs queue up, the publisher sends them to their stream as JetStream atomic
// batches, so that a server syncing every write (sync_interval: always) syncs a whole batch once.
//
// Why: on a single-replica stream nats-server writes and fsyncs every message on its own; an atomic
// batch is staged and, at its commit, written with one sync and acknowledged with one PubAck, sent
// only after that sync (nats-server server/stream.go, processJetStreamAtomicBatchMsg: the commit switches
// the file store to sync-on-flush, stores every message, FlushAllPending, then responds). A batch has
// a fixed cost of its own (the server stages it in a file store of its own: about three fsyncs and
// forty file operations), so batches pay only when many FPMs wait: below minBatch queued FPMs of one
// stream, or with the queue short, the publisher sends one by one as before.
//
// Adaptive size: at most maxSingles single publishes are in flight; FPMs arriving faster than those
// are acknowledged queue in the buffer, and the next fill takes the whole queue (up to maxBatch per
// stream, MaxInFlight in all) and sends each stream's share as one batch. While a batch is in flight,
// what arrives waits for the next one instead of going one by one. The batch size is thus the backlog:
// one by one at low rates, up to maxBatch under a burst or a slow disk; up to maxBatchesInFlight
// batches per stream are in flight at once, and once none is, short queues go one by one again.
//
// Exactly once, unchanged:
//
//   - Every FPM of a batch keeps its Nats-Msg-Id, and the server applies the duplicate window to a
//     batch as to single publishes. But a batch containing any id already stored is refused whole
//     (JSAtomicPublishContainsDuplicateMessageErr), so only a batch's first publication is a batch:
//     a batch refused for a stored id (a redundant bridge stored some of its FPMs first; a batch of
//     this bridge committed whose ack was lost and then retried) is republished one FPM at a time, which
//     the duplicate window answers per FPM (a duplicate ack for the stored ones, a store for the rest),
//     and the publisher sends one by one for batchCooldown afterwards, so that a redundant pair does
//     not keep staging batches only to have them refused.
//   - A batch refused because the server has too many batches in flight (its limits, 50 per stream
//     and 1,000 per server, are shared by every bridge on the stream) is republished one by one too,
//     with the same cooldown: nothing of it was staged.
//   - A batch that failed otherwise (ack timeout, the connection lost, 503, the batch incomplete
//     because the server lost its staged part) is retried whole, after the same backoff as any failed
//     publish: a batch commits all or nothing (a server killed while writing a committed batch
//     finishes it from the staged copy when it restarts), so either none of it was stored (retried as
//     a batch, it commits) or all of it was (retried, it is refused for its stored ids and
//     republished one by one as above).
//   - Any other refusal of a batch (an answer naming a setting or a message) is republished one by one,
//     where the per-message rules (maxRejects, dead letters) find the message at fault.
//   - An FPM is acknowledged to the ledger only with its batch's ack: the commit's PubAck carries the
//     stream sequence of the batch's last message and the batch's count, and a batch is stored
//     contiguously, so the i-th FPM of a batch of count n was stored at seq-n+1+i.
//
// Only FPMs are batched (drop markers and dead letters are rare and go one by one), only to streams
// whose atomic publish is on (Ensure turns it on at start; a stream on which an operator turned it off
// again answers JSAtomicPublishDisabledErr, and the publisher stops batching to it), and only FPMs
// whose message still fits the server's max_payload with the batch headers added.

const (
	// maxBatch is the most FPMs in one batch: the server's limit (streamMaxAtomicBatchSize).
	maxBatch = 1000
	// minBatch is the fewest queued FPMs of one stream sent as a batch; fewer go one by one. Measured
	// on the 2-core virtio development machine under sync_interval always, four batches in flight:
	// batches of 10 stored 575 msg/s, single publishes 1,819, batches of 50 3,809, of 1,000 13,396.
	minBatch = 64
	// maxSingles bounds single FPM publishes in flight, so that FPMs arriving faster than they are
	// acknowledged queue up and become a batch. Small, because of what a disk stall does: under
	// sync_interval always every single publish is one fsync, so the backlog of a stall sent as
	// singles drains at the disk's fsync rate (256 of them, about 70 ms on the development machine,
	// the p99 of everything received meanwhile), while beyond maxSingles it goes as one batch. At
	// steady rates only one or two singles are in flight, so nothing else changes.
	maxSingles = 32
	// maxBatchesInFlight bounds the batches in flight per stream (the server allows 50 per stream).
	maxBatchesInFlight = 4
	// batchCooldown is how long the publisher sends one by one after a batch was refused for a stored
	// message id.
	batchCooldown = time.Second
	// batchHeaderRoom is what the batch headers add to a message.
	batchHeaderRoom = 128
)

// Atomic batch headers (nats-server JSBatchId, JSBatchSeq, JSBatchCommit).
const (
	headerBatchID     = "Nats-Batch-Id"
	headerBatchSeq    = "Nats-Batch-Sequence"
	headerBatchCommit = "Nats-Batch-Commit"
)

// Error codes of atomic batch publishing (nats-server errors.json); nats.go exports none of them.
const (
	errCodeAtomicDisabled    jetstream.ErrorCode = 10174 // JSAtomicPublishDisabledErr
	errCodeBatchIncomplete   jetstream.ErrorCode = 10176 // JSAtomicPublishIncompleteBatchErr
	errCodeBatchDuplicate    jetstream.ErrorCode = 10201 // JSAtomicPublishContainsDuplicateMessageErr
	errCodeBatchesInFlight   jetstream.ErrorCode = 10210 // JSAtomicPublishTooManyInflight
	errCodeBatchStreamAbsent jetstream.ErrorCode = 10059 // JSStreamNotFoundErr
)

// errBatchTimeout: a batch's ack did not come within AckTimeout.
var errBatchTimeout = errors.New("bridge: atomic batch: no ack before the ack timeout")

// batch is one atomic batch in flight: its FPMs in batch order, all bound for stream.
type batch struct {
	id     string
	stream string
	reply  string
	items  []*item
	sent   uint64    // the publisher's number of the commit (item.sent of every FPM)
	at     time.Time // when its ack timeout started: its commit, or the ack of the batch before it
}

// batchAck is the server's answer to a batch commit: a PubAck with the batch id and count, or an
// error.
type batchAck struct {
	Stream string              `json:"stream"`
	Seq    uint64              `json:"seq"`
	Batch  string              `json:"batch"`
	Count  int                 `json:"count"`
	Error  *jetstream.APIError `json:"error,omitempty"`
}

// startBatches subscribes to the commits' replies and enables batches to the streams in atomic (the
// FPM streams whose atomic publish is on). Run calls it before the publisher starts; without the
// subscription the publisher sends one by one, and says so.
func (p *publisher) startBatches(atomic []string) {
	if len(atomic) == 0 || p.b.opts.singles {
		return
	}
	inbox := p.b.nc.NewInbox()
	sub, err := p.b.nc.Subscribe(inbox+".*", func(m *nats.Msg) {
		p.pushEvent(ackEvent{reply: m.Subject, data: m.Data, hdr: m.Header, at: time.Now()})
	})
	if err != nil {
		p.b.log.Error("atomic batches unavailable: publishing FPMs one by one (one fsync each under sync_interval: always)",
			"error", err)
		return
	}
	p.batchSub, p.batchInbox = sub, inbox
	p.batchBase = inbox[strings.LastIndexByte(inbox, '.')+1:]
	p.atomic = make(map[string]bool, len(atomic))
	for _, s := range atomic {
		p.atomic[s] = true
	}
	p.batches = make(map[string]*batch)
	p.batchesPer = make(map[string]int, len(atomic))
}

// stopBatches ends the reply subscription (Run, after the publisher has exited).
func (p *publisher) stopBatches() {
	if p.batchSub != nil {
		_ = p.batchSub.Unsubscribe()
	}
}

// pending is what the window holds: single publishes and FPMs in batches awaiting an ack.
func (p *publisher) pending() int { return len(p.window) + p.inBatches }

// storeInFlight publishes the window's size for Stats, the in-flight gauge and tests.
func (p *publisher) storeInFlight() {
	p.inFlight.Store(int64(p.pending()))
	p.inBatchesN.Store(int64(p.inBatches))
}

// canBatch reports whether FPMs of stream may go as a batch now.
func (p *publisher) canBatch(stream string, now time.Time) bool {
	return p.atomic[stream] && now.After(p.singlesUntil) && p.batchesPer[stream] < maxBatchesInFlight
}

// batchingNow reports whether some FPM stream takes a batch now.
func (p *publisher) batchingNow(now time.Time) bool {
	for s := range p.atomic {
		if p.canBatch(s, now) {
			return true
		}
	}
	return false
}

// batchable reports whether FPM it may be part of a batch: it was never refused in one, and with the
// batch headers its message still fits the server's max_payload.
func (p *publisher) batchable(it *item) bool {
	if it.kind != kindFPM || it.single {
		return false
	}
	max := p.serverMax.Load()
	return max <= 0 || int64(encodedSize(it.msg))+batchHeaderRoom <= max
}

// sendGrouped sends items (in enqueue order) as batches where at least minBatch of them are batchable
// FPMs bound for one stream that takes batches now, and one by one otherwise. A stream's FPMs keep
// their order; FPMs of different streams are independent. It returns the items not sent (in order)
// and the error that stopped it: a failure that may pass (the caller retries the rest), never a
// refusal for good (those are rejected here).
func (p *publisher) sendGrouped(items []*item) ([]*item, error) {
	if p.atomic == nil || len(items) < minBatch {
		i, err := p.sendInOrder(items)
		return items[i:], err
	}
	now := time.Now()
	groups := map[string][]*item{}
	var order []string
	var singles []*item
	for _, it := range items {
		if !p.batchable(it) {
			singles = append(singles, it)
			continue
		}
		s := p.b.fpmStreamOf(it.key)
		if groups[s] == nil {
			order = append(order, s)
		}
		groups[s] = append(groups[s], it)
	}
	var rest []*item
	var firstErr error
	for _, s := range order {
		g := groups[s]
		if len(g) < minBatch || !p.canBatch(s, now) || firstErr != nil {
			singles = append(singles, g...)
			continue
		}
		for len(g) > 0 && firstErr == nil {
			if len(g) < minBatch || p.batchesPer[s] >= maxBatchesInFlight {
				singles = append(singles, g...)
				g = nil
				break
			}
			n := min(len(g), maxBatch)
			left, err := p.sendBatch(s, g[:n])
			if err != nil {
				firstErr = err
				rest = append(rest, left...)
				rest = append(rest, g[n:]...)
				g = nil
				break
			}
			g = g[n:]
		}
	}
	if firstErr != nil {
		rest = append(rest, singles...)
		return rest, firstErr
	}
	slices.SortFunc(singles, byOrder)
	i, err := p.sendInOrder(singles)
	return singles[i:], err
}

// sendBatch stamps items and publishes them as one atomic batch to stream: every message but the last
// without a reply (the server answers only the commit), the last with the commit header and the
// batch's reply subject. An FPM that can never be published is rejected and left out. On a failure
// that may pass it returns the items not in a sent batch (in order) and the error; a batch of which
// some messages went out without its commit is abandoned by the server (its staged part is dropped at
// the batch timeout) and its FPMs are among those returned.
func (p *publisher) sendBatch(stream string, items []*item) ([]*item, error) {
	ready := items[:0:0]
	for i, it := range items {
		err := p.b.stamp(it)
		if err == nil {
			err = p.b.checkLine(it.msg)
		}
		if err == nil {
			ready = append(ready, it)
			continue
		}
		if !permanent(err) {
			if len(ready) > 0 {
				if _, serr := p.sendBatch(stream, ready); serr != nil {
					return append(ready, items[i:]...), serr
				}
			}
			return items[i:], err
		}
		p.reject(it, err)
	}
	if len(ready) == 0 {
		return nil, nil
	}
	if len(ready) < minBatch {
		i, err := p.sendInOrder(ready)
		return ready[i:], err
	}
	p.batchN++
	b := &batch{id: p.batchBase + "-" + strconv.FormatUint(p.batchN, 36), stream: stream, items: ready}
	b.reply = p.batchInbox + "." + b.id
	last := len(ready) - 1
	for i, it := range ready {
		h := it.m.Header
		h[headerBatchID] = []string{b.id}
		h[headerBatchSeq] = []string{strconv.Itoa(i + 1)}
		m := it.msg
		if i == last {
			h[headerBatchCommit] = []string{"1"}
			c := *it.msg
			c.Reply = b.reply
			m = &c
		}
		if err := p.b.nc.PublishMsg(m); err != nil {
			for _, it := range ready {
				clearBatchHeaders(it)
			}
			return ready, err
		}
	}
	p.sendN++
	b.sent, b.at = p.sendN, time.Now()
	for _, it := range ready {
		it.sent = p.sendN
	}
	p.batches[b.reply] = b
	p.batchesPer[stream]++
	p.inBatches += len(ready)
	p.storeInFlight()
	p.b.metrics.batches.Inc()
	p.b.metrics.batchSize.Observe(float64(len(ready)))
	return nil, nil
}

// clearBatchHeaders removes the batch headers from an FPM about to be republished on its own: a
// message with a batch id is taken by the server for part of a batch.
func clearBatchHeaders(it *item) {
	delete(it.m.Header, headerBatchID)
	delete(it.m.Header, headerBatchSeq)
	delete(it.m.Header, headerBatchCommit)
}

// batchEvent applies the server's answer to a batch commit.
func (p *publisher) batchEvent(ev ackEvent) {
	b := p.batches[ev.reply]
	if b == nil {
		return // resolved earlier (timed out, or reported dropped at stop)
	}
	p.resolveBatch(b)
	var a batchAck
	var err error
	switch {
	case ev.hdr.Get("Status") == "503":
		err = nats.ErrNoResponders
	case json.Unmarshal(ev.data, &a) != nil:
		err = fmt.Errorf("bridge: atomic batch: undecodable answer %q", boundHeader(string(ev.data)))
	case a.Error != nil:
		err = a.Error
	case a.Count != len(b.items) || a.Seq < uint64(a.Count):
		err = fmt.Errorf("bridge: atomic batch %s: the server acknowledged %d messages at %d, %d were sent",
			b.id, a.Count, a.Seq, len(b.items))
	}
	if err != nil {
		p.batchFailed(b, err, ev.at)
		return
	}
	p.restartTimeouts(b, ev.at)
	first := a.Seq - uint64(a.Count) + 1
	for i, it := range b.items {
		p.acked(it, first+uint64(i), false, ev.at)
	}
}

// resolveBatch takes b out of the window.
func (p *publisher) resolveBatch(b *batch) {
	delete(p.batches, b.reply)
	p.batchesPer[b.stream]--
	p.inBatches -= len(b.items)
	p.storeInFlight()
}

// restartTimeouts starts the ack timeout of the batches sent to b's stream after b anew at b's ack
// (at): the stream commits its batches one after the other, so a batch that waited behind b is not
// late yet. A failed batch restarts nothing: those behind it most likely failed with it.
func (p *publisher) restartTimeouts(b *batch, at time.Time) {
	for _, o := range p.batches {
		if o.stream == b.stream && o.sent > b.sent && o.at.Before(at) {
			o.at = at
		}
	}
}

// expireBatches fails the batches whose ack is overdue (nats.go times out single publishes; batches are
// the bridge's own).
func (p *publisher) expireBatches(now time.Time) {
	for _, b := range p.batches {
		if now.Sub(b.at) >= p.b.cfg.AckTimeout {
			p.resolveBatch(b)
			p.batchFailed(b, errBatchTimeout, now)
		}
	}
}

// batchFailed handles a batch the server did not acknowledge (see the file comment): retried whole
// after an outage-like failure, republished one by one after a refusal.
func (p *publisher) batchFailed(b *batch, err error, now time.Time) {
	p.b.metrics.batchesFailed.Inc()
	for _, it := range b.items {
		clearBatchHeaders(it)
	}
	if p.final {
		for _, it := range b.items {
			p.lost(it, err)
		}
		return
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.Code == 503 || undecided(apiErr) ||
		apiErr.ErrorCode == errCodeBatchIncomplete || apiErr.ErrorCode == errCodeBatchStreamAbsent {
		p.retry = append(p.retry, b.items...)
		p.enterRecovery(err)
		return
	}
	switch apiErr.ErrorCode {
	case errCodeBatchDuplicate:
		p.singlesUntil = now.Add(batchCooldown)
		p.b.log.Debug("atomic batch refused for a stored message id; republishing its FPMs one by one",
			"stream", b.stream, "batch", b.id, "fpms", len(b.items))
	case errCodeBatchesInFlight:
		// The server's limit of batches in flight (50 per stream, 1,000 per server) is shared by every
		// bridge on the stream: this batch was not staged, nothing of it is stored.
		p.singlesUntil = now.Add(batchCooldown)
		p.b.log.Debug("atomic batch refused: too many batches in flight on the server; republishing its FPMs one by one",
			"stream", b.stream, "batch", b.id, "fpms", len(b.items))
	case errCodeAtomicDisabled:
		p.atomic[b.stream] = false
		p.b.log.Warn("atomic publish is off on the stream: publishing its FPMs one by one (one fsync each under "+
			"sync_interval: always); `fpmbus streams apply` turns it on", "stream", b.stream)
	default:
		p.b.log.Warn("atomic batch refused; republishing its FPMs one by one", "stream", b.stream, "batch", b.id,
			"fpms", len(b.items), "error", err)
	}
	for _, it := range b.items {
		it.single = true
	}
	p.resend = append(p.resend, b.items...)
}
