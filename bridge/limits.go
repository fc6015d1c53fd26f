package bridge

import (
	"errors"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/streams"
)

// Limits a message must fit before the bridge publishes it. A message that breaks one is never handed
// to nats.go, because the server answers an over-long protocol line by closing the connection, which
// nats.go then closes for good: one FPM would stop every component sharing that connection. So:
//
//   - the subject, with the reply subject and sizes nats.go adds, must fit the server's
//     max_control_line (Config.MaxControlLine; servers do not announce it). The bridge checks the
//     longest subject it derives from a key (the drop marker's), so every FPM it accepts can also have
//     its drop marker published;
//   - headers plus body must fit the server's max_payload (nc.MaxPayload(), refreshed while connected);
//   - each ZMQ frame must fit Config.MaxPayload, enforced by libzmq itself (ZMQ_MAXMSGSIZE), so a
//     larger frame is never read into memory (see refusal below).
//
// A message that does not fit becomes a dead letter of stage size naming what was too large, its size
// (Fpm-Error-Size) and the limit (Fpm-Error-Limit). A dead letter's own subject carries only the
// namespace, component and rank (Config.Validate checks they fit) and every header value copied from
// input is cut to maxHeaderValue bytes, saying so, so a dead letter always fits.

// errSubjectTooLong is what send returns for a message whose protocol line would exceed the server's
// max_control_line; like nats.ErrMaxPayload it is permanent for that message.
var errSubjectTooLong = errors.New("bridge: subject exceeds the server's max_control_line")

const (
	// minControlLine is the smallest Config.MaxControlLine accepted: room for fpmbus's fixed subjects.
	minControlLine = 256
	// protoNumbersReserve covers the spaces and the two decimal sizes of an HPUB line.
	protoNumbersReserve = 3 + 2*20
	// replyTokensReserve covers what nats.go's JetStream appends to the inbox prefix for an async
	// publish's reply subject (today a dot and two 6-character tokens), with room for longer tokens.
	replyTokensReserve = 64
	// maxHeaderValue bounds every header value a dead letter copies from input (an error message that
	// quotes the payload, the frame sizes of a multipart with many frames, a worker_id).
	maxHeaderValue = 1024
	// deadLetterSlack is left free of a dead letter's body for the headers added after it is built
	// (Fpm-Error-Size, Fpm-Error-Limit, Fpm-Original-Size).
	deadLetterSlack = 256
	// itemOverhead is what one queued message costs in memory beyond its encoded headers and body: the
	// item, the header map and its slices (measured: TestChargedSizeCoversItemMemory).
	itemOverhead = 1280
	// sessionLostGrace is how long a reader waits, after libzmq reported a disconnect, for libzmq to
	// schedule its own reconnect before concluding it never will (see refusal).
	sessionLostGrace = 300 * time.Millisecond
	// monitorEvery is how often a busy reader looks at its socket's monitor events.
	monitorEvery = 20 * time.Millisecond
)

// lineReserve is what an HPUB line holds besides the subject: the reply subject of an async JetStream
// publish (the connection's inbox prefix plus tokens) and the sizes.
func lineReserve(nc *nats.Conn) int {
	prefix := nats.InboxPrefix
	if nc != nil && nc.Opts.InboxPrefix != "" {
		prefix = nc.Opts.InboxPrefix + "."
	}
	return len(prefix) + replyTokensReserve + protoNumbersReserve
}

// maxSubject is the longest subject whose protocol line fits the server's max_control_line.
func (b *Bridge) maxSubject() int { return b.cfg.MaxControlLine - b.lineReserve }

// keyRoomFor is the length of k's drop marker subject without its worker_id token, with the dp_rank
// token counted at its widest (19 digits): keySubjectLen's fast bound.
func keyRoomFor(namespace, component string) int {
	return len(streams.DropMarkerSubject(streams.Key{Namespace: namespace, Component: component})) - len("%") - len("0") + 19
}

// subjectsFit reports whether the subjects the bridge builds from its configuration alone (dead
// letters, and the fixed part of FPM and drop marker subjects) leave room within MaxControlLine.
func (c Config) subjectsFit() error {
	maxRank := 0
	for _, ep := range c.Endpoints {
		maxRank = max(maxRank, ep.DPRank)
	}
	room := c.MaxControlLine - lineReserve(nil)
	if n := len(streams.DeadLetterSubject(c.Namespace, c.Component, maxRank)); n > room {
		return errors.New("namespace and component make " + strconv.Itoa(n) + "-byte dead-letter subjects; max control line " +
			strconv.Itoa(c.MaxControlLine) + " leaves room for " + strconv.Itoa(room))
	}
	if n := len(streams.DropMarkerSubject(streams.Key{Namespace: c.Namespace, Component: c.Component, DPRank: maxRank})); n > room {
		return errors.New("namespace and component make " + strconv.Itoa(n) + "-byte subjects before any worker_id; max control line " +
			strconv.Itoa(c.MaxControlLine) + " leaves room for " + strconv.Itoa(room))
	}
	return nil
}

// keySubjectLen returns the length of the longest subject the bridge derives from k (its drop marker
// subject, longer than its FPM subject), computing it only when k's worker_id could make it too long.
func (b *Bridge) keySubjectLen(k streams.Key) int {
	// A percent-encoded byte takes at most 3 bytes, and a rank at most 19 digits.
	if upper := b.keyRoom + 3*len(k.WorkerID); upper <= b.maxSubject() {
		return upper
	}
	return len(streams.DropMarkerSubject(k))
}

// charge is the memory a message of encoded bytes (headers plus body) is charged with in the buffer
// and the publisher: the bytes, the allocator's rounding up to its size classes (at most 1/8), and the
// item's fixed overhead.
func charge(encoded int) int64 { return int64(encoded) + int64(encoded)/8 + itemOverhead }

// encodedSize is the size nats.go puts on the wire for m's headers plus body: what the server's
// max_payload bounds.
func encodedSize(m *nats.Msg) int { return m.Size() - len(m.Subject) - len(m.Reply) }

// serverMaxPayload is the server's max_payload as last seen, or defaultMaxPayload (nats-server's own
// default) before the first connect.
func (b *Bridge) serverMaxPayload() int64 {
	if m := b.pub.serverMax.Load(); m > 0 {
		return m
	}
	return defaultMaxPayload
}

// oversizedKey is the dead letter of an FPM whose worker_id makes its subjects too long to publish.
func (b *Bridge) oversizedKey(slot int, frames [][]byte, k streams.Key, n int, seq uint64, recv, mono time.Time) *item {
	reason := "worker_id of " + strconv.Itoa(len(k.WorkerID)) + " bytes makes a " + strconv.Itoa(n) +
		"-byte subject; the server's max control line of " + strconv.Itoa(b.cfg.MaxControlLine) +
		" bytes leaves room for " + strconv.Itoa(b.maxSubject())
	it := b.deadLetter(slot, frames, streams.StageSize, reason, seq, true, recv, mono)
	setSizeHeaders(it.msg.Header, int64(n), int64(b.maxSubject()))
	return it
}

// fitFPM returns it unchanged when its headers plus body fit the server's max_payload, or else its dead
// letter (stage size). It also charges it with its exact encoded size. Before the first connect the
// server's limit is unknown: the FPM is kept, and nats.go refuses it at publish if it is too large
// (ErrMaxPayload), which dead-letters it then.
func (b *Bridge) fitFPM(slot int, frames [][]byte, it *item, recv, mono time.Time) *item {
	size := int64(encodedSize(it.msg))
	it.size = charge(int(size))
	if max := b.pub.serverMax.Load(); max > 0 && size > max {
		reason := "FPM of " + strconv.FormatInt(size, 10) + " bytes (canonical JSON " + strconv.Itoa(len(it.msg.Data)) +
			" bytes plus headers) exceeds the server's " + strconv.FormatInt(max, 10) + "-byte max_payload"
		dl := b.deadLetter(slot, frames, streams.StageSize, reason, it.seq, true, recv, mono)
		setSizeHeaders(dl.msg.Header, size, max)
		return dl
	}
	return it
}

// setSizeHeaders sets Fpm-Error-Size (when size is known, >= 0) and Fpm-Error-Limit on a dead letter.
func setSizeHeaders(h nats.Header, size, limit int64) {
	if size >= 0 {
		h[streams.HeaderErrorSize] = []string{strconv.FormatInt(size, 10)}
	}
	h[streams.HeaderErrorLimit] = []string{strconv.FormatInt(limit, 10)}
}

// boundHeader cuts v to at most maxHeaderValue bytes (on a UTF-8 boundary) and says so at its end.
func boundHeader(v string) string {
	if len(v) <= maxHeaderValue {
		return v
	}
	note := "...[truncated from " + strconv.Itoa(len(v)) + " bytes]"
	cut := maxHeaderValue - len(note)
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return v[:cut] + note
}

// frameSizesHeader is Fpm-Frame-Sizes: the comma-separated frame sizes, bounded like any copied value.
func frameSizesHeader(frames [][]byte) string {
	sizes := make([]string, len(frames))
	for i, f := range frames {
		sizes[i] = strconv.Itoa(len(f))
	}
	return boundHeader(strings.Join(sizes, ","))
}

// checkLine reports whether m's protocol line fits the server's max_control_line; send calls it before
// every publish, so that no message can make the server close the connection.
func (b *Bridge) checkLine(m *nats.Msg) error {
	if len(m.Subject) > b.maxSubject() {
		return errSubjectTooLong
	}
	return nil
}

// refusedFrame is the dead letter of a frame libzmq refused because it was larger than
// Config.MaxPayload (ZMQ_MAXMSGSIZE). libzmq reads the frame's length before its bytes, so the frame is
// never in memory, but it reports nothing but a disconnect: its size is unknown and the dead letter
// names the limit. The multipart it belonged to, and whatever the publisher had queued behind it on
// that connection, are lost with the connection.
func (b *Bridge) refusedFrame(slot int, recv, mono time.Time) *item {
	reason := "a ZMQ frame larger than the " + strconv.Itoa(b.cfg.MaxPayload) +
		"-byte limit (--max-payload, ZMQ_MAXMSGSIZE) was refused unread; libzmq closed the connection, " +
		"the bridge reconnected; messages queued behind it on that connection are lost"
	it := b.deadLetter(slot, nil, streams.StageSize, reason, 0, false, recv, mono)
	delete(it.msg.Header, streams.HeaderFrameSizes)
	setSizeHeaders(it.msg.Header, -1, int64(b.cfg.MaxPayload))
	return it
}

// publishDeadLetter turns an FPM the publisher had to give up (the client or the server refused it for
// good) into its dead letter, on the publisher goroutine: body the FPM's canonical JSON (cut to fit),
// headers saying why, and the FPM's identity (seq, epoch, worker_id, rank). The dead letter takes over
// the FPM's charge to the buffer.
func (b *Bridge) publishDeadLetter(fpm *item, stage string, cause error) *item {
	b.ranks[fpm.slot].countInvalid(stage)
	ep := &b.endpoints[fpm.slot]
	reason := "publish refused: " + cause.Error()
	hb := newHeaders(12)
	hb.set(streams.HeaderMsgID, "deadletter:"+b.cfg.BridgeID+":"+strconv.Itoa(ep.DPRank)+":"+
		strconv.FormatInt(time.Now().UnixNano(), 10)+":"+strconv.FormatUint(b.deadLetterN.Add(1), 10))
	hb.set(streams.HeaderError, boundHeader(streams.ErrorHeaderValue(reason)))
	hb.set(streams.HeaderErrorStage, stage)
	hb.set(streams.HeaderEndpoint, ep.URL)
	hb.set(streams.HeaderDPRank, strconv.Itoa(fpm.key.DPRank))
	hb.set(streams.HeaderReceivedAt, strconv.FormatInt(fpm.recvMs, 10))
	hb.set(streams.HeaderBridge, b.cfg.BridgeID)
	hb.set(streams.HeaderSeq, strconv.FormatUint(fpm.seq, 10))
	epoch := fpm.epoch
	if fpm.agreed != 0 {
		epoch = fpm.agreed
	}
	hb.set(streams.HeaderEpoch, strconv.FormatInt(epoch, 10))
	hb.set(streams.HeaderWorkerID, boundHeader(fpm.key.WorkerID))
	msg := &nats.Msg{Subject: streams.DeadLetterSubject(b.cfg.Namespace, b.cfg.Component, ep.DPRank), Header: hb.h}
	room := b.serverMaxPayload() - int64(encodedSize(msg)) - deadLetterSlack
	body := fpm.msg.Data
	if int64(len(body)) > room {
		body = body[:max(room, 0)]
		hb.set(streams.HeaderOriginalSize, strconv.Itoa(len(fpm.msg.Data)))
	}
	msg.Data = body
	if errors.Is(cause, nats.ErrMaxPayload) {
		setSizeHeaders(msg.Header, int64(encodedSize(fpm.msg)), b.serverMaxPayload())
	} else if errors.Is(cause, errSubjectTooLong) {
		setSizeHeaders(msg.Header, int64(len(fpm.msg.Subject)), int64(b.maxSubject()))
	}
	return &item{msg: msg, kind: kindDeadLetter, slot: fpm.slot, seq: fpm.seq, recvMs: fpm.recvMs, recv: fpm.recv, size: fpm.size, order: fpm.order}
}
