package streams

import (
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Stages of a bridge's dead letters (header Fpm-Error-Stage).
const (
	StageFrames   = "frames"   // not a (topic, 8-byte sequence, payload) multipart
	StageDecode   = "decode"   // the payload is not a msgpack map (schemas.errMalformed)
	StageValidate = "validate" // a well-formed payload breaks an FPM rule (schemas.ErrInvalid)
	StageSize     = "size"     // a frame, the message or its subject is larger than the limits allow
	StagePublish  = "publish"  // a valid FPM the server refused for good
)

// deadLetterHeadroom is what a dead letter leaves of the server's max_payload for its subject and
// headers: the body is cut to max_payload minus this.
const deadLetterHeadroom = 8 << 10

// DeadLetter is input that a stage of fpmbus can never process, kept on FPM_EVENTS with the reason
// instead of being dropped: the body is the input as received (cut to fit the server's max_payload, with
// Fpm-Original-Size), Fpm-Error and Fpm-Error-Stage say why, Fpm-Frame-Sizes how to split the body
// again, and the source says where the input came from, which decides the subject and the id:
//
//   - *socketSource: a multipart a bridge read from a ZMQ socket and could not frame, decode or
//     validate (subject DeadLetterSubject, the socket's namespace, component and DP rank);
//   - *MessageSource: a stored message a consumer can never process (subject
//     ConsumerDeadLetterSubject, the consumer's name; Fpm-Consumer, Fpm-Subject, Fpm-Stream and
//     Fpm-Stream-Seq locate the original).
//
// Msg builds the message.
type DeadLetter struct {
	// Stage is the step that refused the input (Fpm-Error-Stage): a Stage* constant for the bridge; a
	// consumer names its own step.
	Stage string
	// Reason says precisely why (Fpm-Error); line breaks are escaped so it stays one header line.
	Reason string
	// Frames are the input as received; the body is their concatenation. A consumer's dead letter has
	// one frame, the message data.
	Frames [][]byte
	// ReceivedAt is when the stage received the input (Fpm-Received-At-Ms).
	ReceivedAt time.Time
	// MaxPayload is the server's max_payload: the body is cut to MaxPayload - deadLetterHeadroom bytes
	// (none when that is not positive). 0 means no cut.
	MaxPayload int64
	// Source says where the input came from: a *socketSource or a *MessageSource. It must be set.
	Source deadLetterSource
}

// deadLetterSource is where a dead letter's input came from: *socketSource or *MessageSource.
type deadLetterSource interface {
	subject() string
	msgID(d *DeadLetter) string
	setHeaders(h nats.Header)
}

// socketSource is a bridge's ZMQ socket.
type socketSource struct {
	Namespace, Component string // the bridge's; with DPRank they make the subject
	DPRank               int    // the socket's DP rank (Fpm-Dp-Rank)
	Endpoint             string // the socket's endpoint (Fpm-Endpoint)
	Bridge               string // the bridge's id (Fpm-Bridge)
	// Seq is the sequence frame (Fpm-Seq), when HasSeq: the frames were readable that far.
	Seq    uint64
	HasSeq bool
	// Count is the bridge's running count of dead letters; it makes the id unique (socketDeadLetterMsgID).
	Count uint64
}

func (s *socketSource) subject() string { return DeadLetterSubject(s.Namespace, s.Component, s.DPRank) }

func (s *socketSource) msgID(d *DeadLetter) string {
	return socketDeadLetterMsgID(s.Bridge, s.DPRank, d.ReceivedAt.UnixNano(), s.Count)
}

func (s *socketSource) setHeaders(h nats.Header) {
	h.Set(HeaderEndpoint, s.Endpoint)
	h.Set(HeaderDPRank, strconv.Itoa(s.DPRank))
	h.Set(HeaderBridge, s.Bridge)
	if s.HasSeq {
		h.Set(HeaderSeq, strconv.FormatUint(s.Seq, 10))
	}
}

// MessageSource is a message stored on a stream that a consumer can never process.
type MessageSource struct {
	Consumer  string // the consumer's durable name (Fpm-Consumer); it makes the subject
	Stream    string // the message's stream (Fpm-Stream)
	StreamSeq uint64 // its sequence in Stream (Fpm-Stream-Seq)
	Subject   string // its subject (Fpm-Subject)
}

func (s *MessageSource) subject() string { return ConsumerDeadLetterSubject(s.Consumer) }

func (s *MessageSource) msgID(*DeadLetter) string {
	return consumerDeadLetterMsgID(s.Consumer, s.Stream, s.StreamSeq)
}

func (s *MessageSource) setHeaders(h nats.Header) {
	h.Set(HeaderConsumer, s.Consumer)
	h.Set(HeaderStream, s.Stream)
	h.Set(HeaderStreamSeq, strconv.FormatUint(s.StreamSeq, 10))
	h.Set(HeaderSubject, s.Subject)
}

// Msg builds the dead letter's message: the source's subject and id, the body, and the headers
// Fpm-Error, Fpm-Error-Stage, Fpm-Frame-Sizes, Fpm-Received-At-Ms, the source's own headers and, when
// the body was cut, Fpm-Original-Size. It panics when Source is nil: a dead letter that cannot say
// where its input came from is a programming error.
func (d *DeadLetter) Msg() *nats.Msg {
	if d.Source == nil {
		panic("streams: DeadLetter.Msg without a Source")
	}
	total := 0
	sizes := make([]string, len(d.Frames))
	for i, f := range d.Frames {
		total += len(f)
		sizes[i] = strconv.Itoa(len(f))
	}
	limit := int64(total)
	if d.MaxPayload > 0 {
		limit = max(min(limit, d.MaxPayload-deadLetterHeadroom), 0)
	}
	body := make([]byte, 0, limit)
	for _, f := range d.Frames {
		room := int(limit) - len(body)
		if room <= 0 {
			break
		}
		body = append(body, f[:min(len(f), room)]...)
	}
	h := make(nats.Header, 10)
	h.Set(HeaderMsgID, d.Source.msgID(d))
	h.Set(HeaderError, ErrorHeaderValue(d.Reason))
	h.Set(HeaderErrorStage, d.Stage)
	h.Set(HeaderFrameSizes, strings.Join(sizes, ","))
	h.Set(HeaderReceivedAt, strconv.FormatInt(d.ReceivedAt.UnixMilli(), 10))
	d.Source.setHeaders(h)
	if len(body) < total {
		h.Set(HeaderOriginalSize, strconv.Itoa(total))
	}
	return &nats.Msg{Subject: d.Source.subject(), Header: h, Data: body}
}

// ErrorHeaderValue is the Fpm-Error value for reason: line breaks are escaped so it stays one header
// line.
func ErrorHeaderValue(reason string) string {
	if !strings.ContainsAny(reason, "\r\n") {
		return reason
	}
	return strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(reason)
}
