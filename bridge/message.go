package bridge

import (
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// stages are the dead-letter stages (streams.Stage*) the bridge counts: label stage of
// fpmbus_bridge_invalid_total.
var stages = []string{streams.StageFrames, streams.StageDecode, streams.StageValidate, streams.StageSize, streams.StagePublish}

// Drop reasons (drop marker "reason", label reason of fpmbus_bridge_dropped_total).
const (
	reasonBufferFull = "buffer_full" // the buffer was full when the message arrived
	reasonShutdown   = "shutdown"    // not acknowledged when the graceful stop ran out of time
	reasonRejected   = "rejected"    // the server refused a dead letter repeatedly (a rejected FPM is dead-lettered)
)

var reasons = []string{reasonBufferFull, reasonShutdown, reasonRejected}

// itemKind is what an item carries.
type itemKind uint8

const (
	kindFPM        itemKind = iota // one FPM for stream FPM
	kindDeadLetter                 // invalid input for FPM_EVENTS
	kindMarker                     // a drop marker for FPM_EVENTS
)

// item is one message on its way to JetStream. It is created by a reader goroutine (or the publisher,
// for markers), owned by the buffer while queued and by the publisher goroutine afterwards; it is never
// shared by two goroutines at once.
type item struct {
	msg    *nats.Msg // points at m for FPMs (one allocation per message)
	m      nats.Msg
	kind   itemKind
	slot   int         // index of the endpoint in Config.Endpoints; -1 for markers
	key    streams.Key // kindFPM: the publisher key
	epoch  int64       // kindFPM: the run's local epoch (epoch.go)
	run    *run        // kindFPM: the publisher run it belongs to
	agreed int64       // kindFPM: the run's agreed epoch once stamped (runs.go); 0 before
	// digest is PayloadDigest of the payload: with the agreed epoch it makes the Nats-Msg-Id the
	// publisher stamps (streams.FPMMsgID).
	digest string
	seq    uint64
	recvMs int64
	recv   time.Time // monotonic receive time, for fpmbus_bridge_receive_to_ack_seconds
	size   int64     // bytes charged to the buffer
	order  uint64    // enqueue order (set by the buffer); retries are republished in this order
	errs   int       // failures of this message alone so far (see publisher.failed)
	sent   uint64    // the publisher's number of its latest publish attempt
	single bool      // kindFPM: refused in a batch; republished one by one from then on (batch.go)
	// streamSeq is the stream sequence of its ack (kindFPM; 0 before).
	streamSeq uint64
	marker    *dropRange // kindMarker: the range it reports
}

// headerOverhead approximates the encoded headers of one message when charging the buffer.
const headerOverhead = 512

// headers builds a nats.Header with one value per key using two allocations: the map and one backing
// array for every value slice.
type headers struct {
	h    nats.Header
	vals []string
}

func newHeaders(n int) headers {
	return headers{h: make(nats.Header, n), vals: make([]string, 0, n)}
}

func (hb *headers) set(k, v string) {
	i := len(hb.vals)
	hb.vals = append(hb.vals, v) // never reallocates: callers size n exactly
	hb.h[k] = hb.vals[i : i+1 : i+1]
}

// process turns one received multipart into the item to enqueue: an FPM, or a dead letter saying why
// the input is not one. It runs on the reader goroutine of endpoint slot and never blocks.
func (b *Bridge) process(slot int, frames [][]byte, recv, mono time.Time) *item {
	seq, payload, err := parseFrames(frames)
	if err != nil {
		return b.deadLetter(slot, frames, streams.StageFrames, err.Error(), 0, false, recv, mono)
	}
	if len(payload) > b.cfg.MaxPayload {
		reason := "payload of " + strconv.Itoa(len(payload)) + " bytes exceeds the " +
			strconv.Itoa(b.cfg.MaxPayload) + "-byte limit"
		return b.deadLetter(slot, frames, streams.StageSize, reason, seq, true, recv, mono)
	}
	var f schemas.FPM
	if err := b.decoders[slot].DecodeFPM(payload, &f); err != nil {
		stage := streams.StageDecode
		if errors.Is(err, schemas.ErrInvalid) {
			stage = streams.StageValidate
		}
		return b.deadLetter(slot, frames, stage, err.Error(), seq, true, recv, mono)
	}
	key := streams.Key{Namespace: b.cfg.Namespace, Component: b.cfg.Component, WorkerID: f.WorkerID, DPRank: int(f.DPRank)}
	if n := b.keySubjectLen(key); n > b.maxSubject() {
		return b.oversizedKey(slot, frames, key, n, seq, recv, mono)
	}
	return b.fitFPM(slot, frames, b.fpmItem(slot, &f, frames[0], payload, seq, recv, mono), recv, mono)
}

// fpmItem builds the FPM message: subject streams.FPMSubject(key), body f.JSON verbatim, and the Fpm-*
// headers. A counter_id that differs from the sequence frame is flagged (Fpm-Seq-Mismatch) and
// counted, never dropped.
func (b *Bridge) fpmItem(slot int, f *schemas.FPM, topic, payload []byte, seq uint64, recv, mono time.Time) *item {
	ep := &b.endpoints[slot]
	key := streams.Key{Namespace: b.cfg.Namespace, Component: b.cfg.Component, WorkerID: f.WorkerID, DPRank: int(f.DPRank)}
	recvMs := recv.UnixMilli()
	digest := streams.PayloadDigest(payload)
	run, _ := b.epochs.observe(key, seq, recvMs, digest, slot, b.sessions[slot].Load())
	seqStr := strconv.FormatUint(seq, 10)

	mismatch := f.CounterID < 0 || uint64(f.CounterID) != seq
	n := 11
	if mismatch {
		n++
		b.ranks[slot].countSeqMismatch()
	}
	if len(topic) > 0 {
		n++
	}
	producer := b.cfg.ProducerID
	if producer == "" {
		producer = f.WorkerID
	}
	hb := newHeaders(n)
	// The id and Fpm-Epoch carry the run's local epoch until the publisher stamps the agreed one
	// (runs.go), so that the size checked here is the size published.
	localStr := strconv.FormatInt(run.local, 10)
	hb.set(streams.HeaderMsgID, streams.FPMMsgID(key, seq, digest, run.local))
	hb.set(streams.HeaderSeq, seqStr)
	hb.set(streams.HeaderReceivedAt, strconv.FormatInt(recvMs, 10))
	hb.set(streams.HeaderNamespace, b.cfg.Namespace)
	hb.set(streams.HeaderComponent, b.cfg.Component)
	hb.set(streams.HeaderProducer, producer)
	hb.set(streams.HeaderWorkerID, f.WorkerID)
	hb.set(streams.HeaderDPRank, run.rankStr)
	hb.set(streams.HeaderEpoch, localStr)
	hb.set(streams.HeaderEndpoint, ep.URL)
	hb.set(streams.HeaderBridge, b.cfg.BridgeID)
	if mismatch {
		hb.set(streams.HeaderSeqMismatch, strconv.FormatInt(f.CounterID, 10))
	}
	if len(topic) > 0 {
		hb.set(streams.HeaderTopic, string(topic))
	}
	it := &item{
		m:      nats.Msg{Subject: run.subject, Header: hb.h, Data: f.JSON},
		kind:   kindFPM,
		slot:   slot,
		key:    key,
		epoch:  run.local,
		run:    run,
		seq:    seq,
		recvMs: recvMs,
		recv:   mono,
		size:   int64(len(f.JSON)) + headerOverhead,
		digest: digest,
	}
	it.msg = &it.m
	return it
}

// deadLetter counts invalid input of endpoint slot at stage and builds its dead letter
// (streams.DeadLetter from a streams.socketSource), its body cut to fit the server's max_payload.
func (b *Bridge) deadLetter(slot int, frames [][]byte, stage, reason string, seq uint64, hasSeq bool, recv, mono time.Time) *item {
	b.ranks[slot].countInvalid(stage)
	ep := &b.endpoints[slot]

	total := 0
	for _, f := range frames {
		total += len(f)
	}
	n := 9
	if hasSeq {
		n++
	}
	recvNs := recv.UnixNano()
	hb := newHeaders(n)
	hb.set(streams.HeaderMsgID, "deadletter:"+b.cfg.BridgeID+":"+strconv.Itoa(ep.DPRank)+":"+
		strconv.FormatInt(recvNs, 10)+":"+strconv.FormatUint(b.deadLetterN.Add(1), 10))
	hb.set(streams.HeaderError, boundHeader(streams.ErrorHeaderValue(reason)))
	hb.set(streams.HeaderErrorStage, stage)
	hb.set(streams.HeaderFrameSizes, frameSizesHeader(frames))
	hb.set(streams.HeaderEndpoint, ep.URL)
	hb.set(streams.HeaderDPRank, strconv.Itoa(ep.DPRank))
	hb.set(streams.HeaderReceivedAt, strconv.FormatInt(recv.UnixMilli(), 10))
	hb.set(streams.HeaderBridge, b.cfg.BridgeID)
	if hasSeq {
		hb.set(streams.HeaderSeq, strconv.FormatUint(seq, 10))
	}
	msg := &nats.Msg{Subject: streams.DeadLetterSubject(b.cfg.Namespace, b.cfg.Component, ep.DPRank), Header: hb.h}
	// The body gets what the server's max_payload leaves after the (bounded) headers.
	limit := max(b.serverMaxPayload()-int64(encodedSize(msg))-deadLetterSlack, 0)
	body := make([]byte, 0, min(int64(total), limit))
	for _, f := range frames {
		room := int(limit) - len(body)
		if room <= 0 {
			break
		}
		body = append(body, f[:min(len(f), room)]...)
	}
	if len(body) < total {
		hb.set(streams.HeaderOriginalSize, strconv.Itoa(total))
	}
	msg.Data = body
	b.log.Debug("dead letter", "endpoint", ep.URL, "stage", stage, "error", reason)
	return &item{
		msg:    msg,
		kind:   kindDeadLetter,
		slot:   slot,
		seq:    seq,
		recvMs: recv.UnixMilli(),
		recv:   mono,
		size:   charge(encodedSize(msg)),
	}
}

// markerItem builds the message of a closed drop range (streams.DropMarker.Msg).
func (b *Bridge) markerItem(r *dropRange) *item {
	epoch, start := b.dropRangeEpoch(r)
	m := streams.DropMarker{
		Type:              streams.DropMarkerEvent,
		Key:               r.key,
		Epoch:             epoch,
		RunStart:          start,
		FirstSeq:          r.first,
		LastSeq:           r.last,
		Count:             r.count,
		Reason:            r.reason,
		Bridge:            b.cfg.BridgeID,
		FirstReceivedAtMs: r.firstRecvMs,
		LastReceivedAtMs:  r.lastRecvMs,
	}
	return &item{
		msg:    m.Msg(),
		kind:   kindMarker,
		slot:   -1,
		key:    r.key,
		marker: r,
	}
}
