package natsconn

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LastMsgFromLeader reads the newest message on subject of stream from the stream's leader
// ($JS.API.STREAM.MSG.GET), never from a replica. fpmbus's streams and KV buckets allow direct gets,
// which any replica answers, and a watch's consumer may sit on any replica: right after nodes of a
// cluster restart, a replica still catching up answers from an older state (a cluster whose bucket
// leader and one more node were killed showed watches that saw no keys at all). Checks that conclude
// "lost" from an absence (the bridge's lost_after_ack check, the sealer's audit) must not read a
// replica's past. It returns jetstream.ErrMsgNotFound when the subject holds nothing.
func LastMsgFromLeader(ctx context.Context, js jetstream.JetStream, stream, subject string) (*jetstream.RawStreamMsg, error) {
	return leaderGet(ctx, js, stream, subject, struct {
		LastFor string `json:"last_by_subj"`
	}{subject})
}

// NextMsgFromLeader reads the first message on subject of stream at or after sequence from, from the
// stream's leader (see LastMsgFromLeader); from 0 or 1 is the subject's first message. It returns
// jetstream.ErrMsgNotFound when there is none.
func NextMsgFromLeader(ctx context.Context, js jetstream.JetStream, stream, subject string, from uint64) (*jetstream.RawStreamMsg, error) {
	return leaderGet(ctx, js, stream, subject, struct {
		Seq     uint64 `json:"seq,omitempty"`
		NextFor string `json:"next_by_subj"`
	}{from, subject})
}

// NextMsgFromLeaderAt reads the first message on subject of stream stored at or after time at (the
// server's clock), from the stream's leader (see LastMsgFromLeader). It returns
// jetstream.ErrMsgNotFound when there is none.
func NextMsgFromLeaderAt(ctx context.Context, js jetstream.JetStream, stream, subject string, at time.Time) (*jetstream.RawStreamMsg, error) {
	return leaderGet(ctx, js, stream, subject, struct {
		StartTime time.Time `json:"start_time"`
		NextFor   string    `json:"next_by_subj"`
	}{at.UTC(), subject})
}

// leaderGet sends the message get request req for subject to stream's leader.
func leaderGet(ctx context.Context, js jetstream.JetStream, stream, subject string, request any) (*jetstream.RawStreamMsg, error) {
	prefix := js.Options().APIPrefix
	if prefix == "" {
		prefix = jetstream.DefaultAPIPrefix
	}
	if !strings.HasSuffix(prefix, ".") {
		prefix += "."
	}
	req, _ := json.Marshal(request)
	reply, err := js.Conn().RequestWithContext(ctx, prefix+"STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, fmt.Errorf("streams: leader get %s on %s: %w", subject, stream, err)
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error,omitempty"`
		Message *struct {
			Subject  string    `json:"subject"`
			Sequence uint64    `json:"seq"`
			Header   []byte    `json:"hdrs,omitempty"`
			Data     []byte    `json:"data,omitempty"`
			Time     time.Time `json:"time"`
		} `json:"message,omitempty"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return nil, fmt.Errorf("streams: leader get %s on %s: %w", subject, stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return nil, fmt.Errorf("streams: leader get %s on %s: %w", subject, stream, resp.Error)
	case resp.Message == nil:
		return nil, fmt.Errorf("streams: leader get %s on %s: %w", subject, stream, jetstream.ErrInvalidJetStreamResponse)
	}
	m := resp.Message
	var hdr nats.Header
	if len(m.Header) > 0 {
		if hdr, err = nats.DecodeHeadersMsg(m.Header); err != nil {
			return nil, fmt.Errorf("streams: leader get %s on %s: headers: %w", subject, stream, err)
		}
	}
	return &jetstream.RawStreamMsg{Subject: m.Subject, Sequence: m.Sequence, Header: hdr, Data: m.Data, Time: m.Time}, nil
}
