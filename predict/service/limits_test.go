package service

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/predict"
	"github.com/fpmbus/fpmbus/schemas"
)

// startWithMaxPayload runs an embedded server whose max_payload is maxPayload, with a client on it.
func startWithMaxPayload(t testing.TB, maxPayload int32) *natsservertest.Env {
	t.Helper()
	srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: "127.0.0.1:0", StoreDir: t.TempDir(), MaxPayload: maxPayload,
		Sync: natsserver.SyncPolicy{Interval: natsserver.ServerDefaultSyncInterval}})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		_ = srv.Shutdown(context.Background())
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	env := &natsservertest.Env{Server: srv, NC: nc, JS: js}
	t.Cleanup(env.Stop)
	return env
}

// array is n copies of query as a JSON array.
func array(query []byte, n int) []byte {
	return append(append([]byte("["), bytes.Repeat(append(append([]byte(nil), query...), ','), n)[:n*(len(query)+1)-1]...), ']')
}

// bigIdentityQuery asks for an unknown deployment whose model is n bytes long: its answer echoes the
// model in the query and in every closest identity's differences, about four times.
func bigIdentityQuery(n int) []byte {
	return []byte(`{"identity":{"schema_version":1,"model":"` + strings.Repeat("m", n) + `","hardware":"H200-SXM","backend":"vllm","backend_version":"0.29.0","quantization":"fp8","kv_cache_dtype":"auto","parallelism":{"tp":4,"pp":1,"dp":1,"moe_tp":4,"moe_ep":1,"cp":1},"backend_selections":{},"profile_name":"fixture","profile_version":"1","settings_digest":"` + strings.Repeat("5e", 32) + `"},"step":{"num_decode_requests":8,"sum_decode_kv_tokens":20480}}`)
}

// reply is what a test reads of a reply: the error code ("" for an answer), the description, the body.
type reply struct {
	code, desc string
	body       []byte
	size       int // headers and body, as the server counts them against max_payload
}

func askFor(t testing.TB, nc *nats.Conn, subject string, body []byte) reply {
	t.Helper()
	m, err := nc.Request(subject, body, 10*time.Second)
	if err != nil {
		t.Fatalf("request of %d bytes on %s: %v", len(body), subject, err)
	}
	r := reply{body: m.Data, size: len(m.Data)}
	if m.Header != nil {
		r.code, r.desc = m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader)
		for k, vs := range m.Header {
			for _, v := range vs {
				r.size += len(k) + len(v) + 4
			}
		}
	}
	return r
}

func errorReply(t testing.TB, r reply) ErrorReply {
	t.Helper()
	var e ErrorReply
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("error reply body %.300s: %v", r.body, err)
	}
	return e
}

// Every request gets a reply that fits the connection's max payload, and error texts are bounded: an
// array whose answers would not fit is refused (413) naming how many of its queries fit — exactly: that
// many are answered in one reply, one more is refused again; a single answer that would not fit (a
// query whose fields its answer echoes four times) is refused the same way; a request over the
// service's limit is refused unread; a 50,000-digit number gets a 400 whose description and body are
// bounded. Before, none of these got a reply: the server refused it and the client timed out.
func TestEveryRequestGetsAReplyThatFits(t *testing.T) {
	t.Parallel()
	const maxPayload = 64 << 10
	env := startWithMaxPayload(t, maxPayload)
	kv := bucket(t, env)
	s := serve(t, env, kv, Config{MaxRequestBytes: 48 << 10})
	room := maxPayload - replyHeadroom

	r := askFor(t, env.NC, SubjectPredict, array(benchQuery, 100))
	e := errorReply(t, r)
	if r.code != codeTooLarge || e.FitQueries == nil || *e.FitQueries < 1 || *e.FitQueries >= 100 || e.Queries != 100 || e.MaxReplyBytes != room ||
		!strings.Contains(r.desc, fmt.Sprintf("send at most %d queries per request", *e.FitQueries)) {
		t.Fatalf("100 queries: code %q %q, body %+v", r.code, r.desc, e)
	}
	fit := *e.FitQueries
	r = askFor(t, env.NC, SubjectPredict, array(benchQuery, fit))
	var answers []predict.Answer
	if err := json.Unmarshal(r.body, &answers); r.code != "" || err != nil || len(answers) != fit || answers[fit-1].Status != predict.StatusInterpolated || r.size > maxPayload {
		t.Fatalf("%d queries, the number said to fit: code %q %q, %d answers (%v), %d bytes", fit, r.code, r.desc, len(answers), err, r.size)
	}
	if r := askFor(t, env.NC, SubjectPredict, array(benchQuery, fit+1)); r.code != codeTooLarge || *errorReply(t, r).FitQueries != fit {
		t.Fatalf("%d queries, one more than fit: code %q %q", fit+1, r.code, r.desc)
	}

	big := bigIdentityQuery(20 << 10)
	r = askFor(t, env.NC, SubjectPredict, big)
	if e := errorReply(t, r); r.code != codeTooLarge || e.Queries != 1 || e.ReplyBytes <= room || !strings.Contains(r.desc, "shorten what it echoes") {
		t.Fatalf("an answer four times its query: code %q %q, body %+v", r.code, r.desc, e)
	}
	if r := askFor(t, env.NC, SubjectPredict, array(big, 1)); r.code != codeTooLarge || !strings.Contains(r.desc, "the answer to the first of 1 queries alone") {
		t.Fatalf("the same in an array: code %q %q", r.code, r.desc)
	}

	over := array(benchQuery, 400) // 56 KiB, over the 48 KiB limit
	r = askFor(t, env.NC, SubjectPredict, over)
	if e := errorReply(t, r); r.code != codeTooLarge || e.RequestBytes != len(over) || e.MaxRequestBytes != 48<<10 || !strings.Contains(r.desc, "refused unread") {
		t.Fatalf("a request over the limit: code %q %q, body %+v", r.code, r.desc, e)
	}

	digits := []byte(`{"key":"cell.x","step":{"num_decode_requests":` + strings.Repeat("5", 45_000) + `}}`)
	r = askFor(t, env.NC, SubjectPredict, digits)
	a := decodeAnswer(t, r.body)
	if r.code != codeInvalid || len(r.desc) > len("invalid query: ")+predict.MaxDetail || len(r.body) > 2*predict.MaxDetail+512 ||
		a.Refusal == nil || a.Refusal.Reason != predict.ReasonInvalidQuery || !strings.Contains(r.desc, "bytes cut") {
		t.Fatalf("a 45,000-digit number: code %q, description of %d bytes %.100q, body of %d bytes", r.code, len(r.desc), r.desc, len(r.body))
	}
	for _, ep := range s.Micro().Stats().Endpoints {
		var d EndpointData
		if err := json.Unmarshal(ep.Data, &d); err != nil {
			t.Fatal(err)
		}
		if ep.Subject == SubjectPredict && (d.Errors[codeTooLarge] != 5 || d.Errors[codeInvalid] != 1 || ep.NumRequests != 7) {
			t.Fatalf("stats %+v, data %+v", ep, d)
		}
	}
}

// On fpmbus's own 8 MiB max payload: a 10,000-query array (the most an array may hold) and a
// 5,000,000-digit number each get a reply that fits, with a bounded description, whether the request is
// refused unread (the default 1 MiB limit: 413) or parsed (a limit raised to 8 MiB: the array's answers
// do not fit one reply, 413; the number is not a query, 400).
func TestTheLargestRequestsGetReplies(t *testing.T) {
	t.Parallel()
	batch := array(benchQuery, MaxBatch)
	digits := []byte(`{"key":"cell.x","step":{"num_decode_requests":` + strings.Repeat("5", 5_000_000) + `}}`)
	for name, tc := range map[string]struct {
		limit             int
		batchCode, digits string
	}{
		"the default limit": {0, codeTooLarge, codeTooLarge},
		"a raised limit":    {8 << 20, codeTooLarge, codeInvalid},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := natsservertest.Start(t)
			serve(t, env, bucket(t, env), Config{MaxRequestBytes: tc.limit})
			for what, c := range map[string]struct {
				body []byte
				code string
			}{"10,000 queries": {batch, tc.batchCode}, "5,000,000 digits": {digits, tc.digits}} {
				r := askFor(t, env.NC, SubjectPredict, c.body)
				if r.code != c.code || r.size > int(env.NC.MaxPayload()) || len(r.desc) > len("invalid query: ")+predict.MaxDetail {
					t.Fatalf("%s: code %q (want %s), description of %d bytes %.200q, reply of %d bytes", what, r.code, c.code, len(r.desc), r.desc, r.size)
				}
			}
		})
	}
}

// A bounded pool answers: requests beyond what the workers and the queue hold are told the service is
// busy (503) at once, never left waiting and never given a goroutine each; a request over the size
// limit is refused unread (413) even then, without taking a place in the queue; every request gets a
// reply.
func TestBusyServiceRepliesAtOnce(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	kv := bucket(t, env)
	s := serve(t, env, kv, Config{Workers: 1, QueueSize: 1, MaxRequestBytes: 4 << 20})
	heavy := array(benchQuery, 5000) // some milliseconds of work each
	const n = 20
	inbox := nats.NewInbox()
	replies := make(chan *nats.Msg, n+1)
	sub, err := env.NC.ChanSubscribe(inbox, replies)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	for range n {
		if err := env.NC.PublishRequest(SubjectPredict, inbox, heavy); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.NC.PublishRequest(SubjectPredict, inbox, make([]byte, 4<<20+1)); err != nil {
		t.Fatal(err)
	}
	codes := map[string]int{}
	for range n + 1 {
		select {
		case m := <-replies:
			code := m.Header.Get(micro.ErrorCodeHeader)
			codes[code]++
			if code == codeBusy {
				var e ErrorReply
				if err := json.Unmarshal(m.Data, &e); err != nil || e.Workers != 1 || e.QueueSize != 1 || !strings.Contains(e.Error, "busy") {
					t.Fatalf("busy reply %s: %v", m.Data, err)
				}
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("replies so far %v: not every request got one", codes)
		}
	}
	if codes[codeBusy] < 1 || codes[codeTooLarge] != 1 || codes[""]+codes[codeBusy] != n {
		t.Fatalf("replies by code %v", codes)
	}
	for _, ep := range s.Micro().Stats().Endpoints {
		var d EndpointData
		if err := json.Unmarshal(ep.Data, &d); err != nil {
			t.Fatal(err)
		}
		if ep.Subject == SubjectPredict && (d.Errors[codeBusy] != int64(codes[codeBusy]) || d.Workers != 1 || d.QueueSize != 1) {
			t.Fatalf("stats data %+v, replies %v", d, codes)
		}
	}
	t.Logf("replies by code %v", codes)
}

// sealCell stores a valid sealed cell of model in kv.
func sealCell(t testing.TB, kv jetstream.KeyValue, model string) {
	t.Helper()
	id := schemas.CellIdentity{SchemaVersion: 1, Model: model, Hardware: "B200", Backend: "vllm", BackendVersion: "0.29.0",
		Quantization: "fp8", KVCacheDType: "auto", Parallelism: schemas.Parallelism{TP: 8, PP: 1, DP: 1, MoETP: 8, MoEEP: 1, CP: 1},
		BackendSelections: map[string]string{}, ProfileName: "p", ProfileVersion: "1", SettingsDigest: strings.Repeat("ab", 32)}
	cell := schemas.Cell{Identity: id, Provenance: schemas.Provenance{RunID: "r-" + model, ArtefactDigest: strings.Repeat("cd", 32)},
		Rows: []schemas.Row{{Phase: "decode", NumDecodeRequests: 4, SumDecodeKVTokens: 4096, LatencyMS: 7.5}}}
	cell.Finish()
	body, _ := json.Marshal(schemas.SealedCell{SchemaVersion: 1, Key: cell.Key, Identity: id, Provenance: cell.Provenance, Rows: cell.Rows, AttemptID: "a", Source: "test"})
	if _, err := kv.Create(context.Background(), cell.Key, body); err != nil {
		t.Fatal(err)
	}
}

// The cells endpoint lists as many cells as one reply holds and says where to continue: following
// "next" lists every cell once, in key order, each page within the max payload. A request that is not
// {"after": KEY} is refused (400).
func TestCellsArePagedToFitAReply(t *testing.T) {
	t.Parallel()
	const maxPayload = 16 << 10
	env := startWithMaxPayload(t, maxPayload)
	kv := bucket(t, env)
	for i := range 60 {
		sealCell(t, kv, fmt.Sprintf("paged/model-%02d", i))
	}
	s := serve(t, env, kv, Config{})
	want := s.Snapshot().Summaries()
	var got []predict.CellSummary
	var after []byte
	pages := 0
	for {
		r := askFor(t, env.NC, SubjectCells, after)
		var cr cellsReply
		if err := json.Unmarshal(r.body, &cr); r.code != "" || err != nil || r.size > maxPayload || len(cr.Cells) == 0 {
			t.Fatalf("page %d: code %q %q, %d bytes: %v", pages, r.code, r.desc, r.size, err)
		}
		pages++
		got = append(got, cr.Cells...)
		if cr.Next == "" {
			break
		}
		if cr.Next != cr.Cells[len(cr.Cells)-1].Key {
			t.Fatalf("next %q is not the page's last key", cr.Next)
		}
		after, _ = json.Marshal(cellsRequest{After: cr.Next})
	}
	if pages < 3 || len(got) != len(want) {
		t.Fatalf("%d pages listed %d cells of %d", pages, len(got), len(want))
	}
	for i := range want {
		if got[i].Key != want[i].Key {
			t.Fatalf("cell %d: %s, want %s", i, got[i].Key, want[i].Key)
		}
	}
	if r := askFor(t, env.NC, SubjectCells, []byte(`{"afer":"cell.x"}`)); r.code != codeInvalid || !strings.Contains(r.desc, `{"after": KEY}`) {
		t.Fatalf("a misspelt cells request: code %q %q", r.code, r.desc)
	}
}
