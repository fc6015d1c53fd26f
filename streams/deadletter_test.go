package streams

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestDeadLetterMsg(t *testing.T) {
	recv := time.UnixMilli(1700000000123)
	frames := [][]byte{{}, {0, 0, 0, 0, 0, 0, 0, 7}, []byte("not msgpack")}
	tests := map[string]struct {
		dl          DeadLetter
		subject     string
		headers     map[string]string // "" = must be absent
		body        []byte
		cutFromSize int // Fpm-Original-Size when the body is cut, else 0
	}{
		"a bridge's invalid payload": {
			dl: DeadLetter{Stage: StageDecode, Reason: "schemas: msgpack at byte 0:\nwant a map", Frames: frames, ReceivedAt: recv,
				MaxPayload: 1 << 20, Source: &socketSource{Namespace: "dynamo", Component: "backend", DPRank: 2,
					Endpoint: "tcp://127.0.0.1:5557", Bridge: "b1", Seq: 7, HasSeq: true, Count: 4}},
			subject: "fpmevents.deadletter.dynamo.backend.2",
			headers: map[string]string{
				HeaderMsgID:      "deadletter:b1:2:" + "1700000000123000000" + ":4",
				HeaderError:      `schemas: msgpack at byte 0:\nwant a map`,
				HeaderErrorStage: "decode", HeaderFrameSizes: "0,8,11", HeaderReceivedAt: "1700000000123",
				HeaderEndpoint: "tcp://127.0.0.1:5557", HeaderDPRank: "2", HeaderBridge: "b1", HeaderSeq: "7",
				HeaderOriginalSize: "", HeaderConsumer: "", HeaderStream: "", HeaderStreamSeq: "", HeaderSubject: "",
			},
			body: []byte("\x00\x00\x00\x00\x00\x00\x00\x07not msgpack"),
		},
		"a bridge's frames without a sequence, cut to the server's max_payload": {
			dl: DeadLetter{Stage: StageFrames, Reason: "got 1 frames, want 3", Frames: [][]byte{bytes.Repeat([]byte("x"), deadLetterHeadroom+100)},
				ReceivedAt: recv, MaxPayload: deadLetterHeadroom + 10, Source: &socketSource{Namespace: "a.b", Component: "c", DPRank: 0, Bridge: "b1"}},
			subject:     "fpmevents.deadletter.a%2Eb.c.0",
			headers:     map[string]string{HeaderErrorStage: "frames", HeaderFrameSizes: "8292", HeaderSeq: "", HeaderDPRank: "0"},
			body:        bytes.Repeat([]byte("x"), 10),
			cutFromSize: deadLetterHeadroom + 100,
		},
		"a message a consumer can never process": {
			dl: DeadLetter{Stage: "decode", Reason: "trace: not an FPM", Frames: [][]byte{[]byte(`{"x":1}`)}, ReceivedAt: recv,
				Source: &MessageSource{Consumer: "fpmbus-trace", Stream: StreamFPM, StreamSeq: 42, Subject: "fpm.dynamo.backend.w.0"}},
			subject: "fpmevents.deadletter.consumer.fpmbus-trace",
			headers: map[string]string{
				HeaderMsgID: "consumer-deadletter:fpmbus-trace:FPM:42", HeaderError: "trace: not an FPM", HeaderErrorStage: "decode",
				HeaderFrameSizes: "7", HeaderReceivedAt: "1700000000123", HeaderConsumer: "fpmbus-trace", HeaderStream: "FPM",
				HeaderStreamSeq: "42", HeaderSubject: "fpm.dynamo.backend.w.0",
				HeaderBridge: "", HeaderEndpoint: "", HeaderDPRank: "", HeaderSeq: "", HeaderOriginalSize: "",
			},
			body: []byte(`{"x":1}`),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			msg := tc.dl.Msg()
			if msg.Subject != tc.subject {
				t.Fatalf("subject %q, want %q", msg.Subject, tc.subject)
			}
			if !strings.HasPrefix(msg.Subject, DeadLetterWildcard[:len(DeadLetterWildcard)-1]) {
				t.Fatalf("subject %q is not under %s", msg.Subject, DeadLetterWildcard)
			}
			for h, want := range tc.headers {
				if got := msg.Header.Get(h); got != want {
					t.Fatalf("%s = %q, want %q", h, got, want)
				}
			}
			if !bytes.Equal(msg.Data, tc.body) {
				t.Fatalf("body %q, want %q", msg.Data, tc.body)
			}
			if tc.cutFromSize > 0 && msg.Header.Get(HeaderOriginalSize) != strconv.Itoa(tc.cutFromSize) {
				t.Fatalf("Fpm-Original-Size %q, want %d", msg.Header.Get(HeaderOriginalSize), tc.cutFromSize)
			}
		})
	}
}

func TestConsumerDeadLetterSubjectNeverTakesABridgeOne(t *testing.T) {
	// A bridge whose namespace is "consumer" still has one token more than a consumer's dead letter.
	bridge := DeadLetterSubject("consumer", "backend", 0)
	consumer := ConsumerDeadLetterSubject("backend")
	if strings.Count(bridge, ".") == strings.Count(consumer, ".") {
		t.Fatalf("%s and %s have as many tokens", bridge, consumer)
	}
	if got := ConsumerDeadLetterSubject("merge.p0"); got != "fpmevents.deadletter.consumer.merge%2Ep0" {
		t.Fatalf("consumer name not one token: %s", got)
	}
}
