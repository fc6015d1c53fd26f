package service

import (
	"encoding/json"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/fpmbus/fpmbus/predict"
)

// Every request gets a reply that fits. The server refuses a message over its max_payload (headers
// included), and a reply it refuses never reaches the requester, who only times out. So a reply's body
// is held to room(): the connection's max payload less replyHeadroom, which the error headers (a
// bounded description and a code) never exceed. An answer or array of answers beyond it becomes a 413
// error naming how to split the request; error descriptions are bounded (predict.Bounded). The replies
// follow micro's conventions (the Nats-Service-Error and Nats-Service-Error-Code headers) but are
// published by the service itself: a worker answers after micro's handler has returned.

// replyHeadroom is what room() keeps free of the max payload for headers.
const replyHeadroom = 1024

// room is the largest reply body that fits the connection's max payload.
func (s *Service) room() int { return int(s.nc.MaxPayload()) - replyHeadroom }

// ErrorReply is the body of a 413, 503 or 500 reply (a 400 reply's body is the invalid_query answer).
type ErrorReply struct {
	Code  int    `json:"code"`
	Error string `json:"error"`
	// A request refused unread: its size and the limit.
	RequestBytes    int `json:"request_bytes,omitempty"`
	MaxRequestBytes int `json:"max_request_bytes,omitempty"`
	// A reply that would not fit: its size (for an array, as far as it had grown when it outgrew the
	// room), the room, the queries asked and how many of them the room holds the answers of.
	ReplyBytes    int  `json:"reply_bytes,omitempty"`
	MaxReplyBytes int  `json:"max_reply_bytes,omitempty"`
	Queries       int  `json:"queries,omitempty"`
	FitQueries    *int `json:"fit_queries,omitempty"`
	// Busy: the pool.
	Workers   int `json:"workers,omitempty"`
	QueueSize int `json:"queue_size,omitempty"`
}

// reply sends body (with headers hdr) to r's reply subject; a request without one gets nothing.
func (s *Service) reply(r *request, body []byte, hdr nats.Header) {
	if r.reply == "" {
		return
	}
	if err := s.nc.PublishMsg(&nats.Msg{Subject: r.reply, Header: hdr, Data: body}); err != nil {
		s.log.Warn("predict service could not reply", "endpoint", r.endpoint, "bytes", len(body), "error", err)
	}
}

// replyError sends an error reply of code with the (bounded) description and body, and counts it.
func (s *Service) replyError(r *request, code, description string, body []byte) {
	s.counts.fail(r.endpoint, code)
	s.reply(r, body, nats.Header{micro.ErrorHeader: []string{predict.Bounded(description)}, micro.ErrorCodeHeader: []string{code}})
}

// replyErrorBody sends e as an error reply of code.
func (s *Service) replyErrorBody(r *request, code string, e *ErrorReply) {
	e.Error = predict.Bounded(e.Error)
	body, _ := json.Marshal(e) // bounded: numbers and a bounded text
	s.replyError(r, code, e.Error, body)
}

// replyTooLarge refuses a reply that would not fit (413).
func (s *Service) replyTooLarge(r *request, e *ErrorReply) {
	e.Code = 413
	s.replyErrorBody(r, codeTooLarge, e)
}

// replyInvalid answers input that is not a query (400), with the invalid_query answer as body.
func (s *Service) replyInvalid(r *request, err error) {
	a := predict.InvalidQuery(err)
	s.counts.count(&a)
	body, _ := json.Marshal(a) // small: the detail is bounded and nothing of the input is echoed
	s.replyError(r, codeInvalid, "invalid query: "+a.Refusal.Detail, body)
}
