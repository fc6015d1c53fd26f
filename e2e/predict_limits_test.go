package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/predict"
	"github.com/fpmbus/fpmbus/predict/service"
	"github.com/fpmbus/fpmbus/schemas"
)

// Through `fpmbus predict-service`: every request gets a reply that fits the server's max payload
// (8 MiB). The documented maximum of 10,000 queries, whose answers would not fit one reply, is refused
// (413) naming how many fit, and that many are answered; a 5,000,000-digit number gets a 400 whose
// description is bounded; with the default --max-request-bytes both are refused unread (413). Before,
// neither got any reply. A pool flag of 0 is refused (exit 2).
func TestPredictServiceRepliesToTheLargestRequests(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	nc, err := nats.Connect(env.Server.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// An answer echoes its query: with a 600-byte id, 10,000 answers are over 8 MiB.
	q := []byte(`{"id":"` + strings.Repeat("q", 600) + `","key":"cell.` + strings.Repeat("0", 64) + `","step":{"num_decode_requests":8,"sum_decode_kv_tokens":20480}}`)
	batch := func(n int) []byte {
		qs := make([][]byte, n)
		for i := range qs {
			qs[i] = q
		}
		return append(append([]byte("["), bytes.Join(qs, []byte(","))...), ']')
	}
	digits := []byte(`{"key":"cell.x","step":{"num_decode_requests":` + strings.Repeat("5", 5_000_000) + `}}`)
	ask := func(body []byte) *nats.Msg {
		t.Helper()
		m, err := nc.Request(service.SubjectPredict, body, 30*time.Second)
		if err != nil {
			t.Fatalf("request of %d bytes: %v", len(body), err)
		}
		return m
	}
	for name, c := range map[string]struct {
		args []string
		run  func(t *testing.T)
	}{
		"--max-request-bytes 8388608": {[]string{"--max-request-bytes", "8388608", "--queue-group", "raised"}, func(t *testing.T) {
			m := ask(batch(service.MaxBatch))
			var e service.ErrorReply
			if err := json.Unmarshal(m.Data, &e); err != nil || m.Header.Get(micro.ErrorCodeHeader) != "413" || e.FitQueries == nil || *e.FitQueries < 1 || *e.FitQueries >= service.MaxBatch {
				t.Fatalf("10,000 queries: %v %.300s (%v)", m.Header, m.Data, err)
			}
			fit := *e.FitQueries
			m = ask(batch(fit))
			var answers []predict.Answer
			if err := json.Unmarshal(m.Data, &answers); err != nil || m.Header.Get(micro.ErrorCodeHeader) != "" || len(answers) != fit {
				t.Fatalf("%d queries, as many as fit: %v, %d answers (%v)", fit, m.Header, len(answers), err)
			}
			m = ask(digits)
			if desc := m.Header.Get(micro.ErrorHeader); m.Header.Get(micro.ErrorCodeHeader) != "400" || len(desc) > len("invalid query: ")+predict.MaxDetail || len(m.Data) > 4096 {
				t.Fatalf("5,000,000 digits: code %q, description of %d bytes, body of %d", m.Header.Get(micro.ErrorCodeHeader), len(desc), len(m.Data))
			}
		}},
		"the defaults": {nil, func(t *testing.T) {
			for what, body := range map[string][]byte{"10,000 queries": batch(service.MaxBatch), "5,000,000 digits": digits} {
				m := ask(body)
				var e service.ErrorReply
				if err := json.Unmarshal(m.Data, &e); err != nil || m.Header.Get(micro.ErrorCodeHeader) != "413" || e.RequestBytes != len(body) || e.MaxRequestBytes != service.DefaultMaxRequestBytes {
					t.Fatalf("%s: %v %.300s (%v)", what, m.Header, m.Data, err)
				}
			}
		}},
	} {
		t.Run(name, func(t *testing.T) {
			// One instance at a time answers on the subject (the subtests do not run in parallel).
			p := fpmbus(t, "fpmbus predict-service", append([]string{"predict-service", "--server", env.Server.ClientURL()}, c.args...)...)
			p.waitOutput("predict service ready", 30*time.Second)
			c.run(t)
			if err := p.signal(syscall.SIGINT, 30*time.Second); err != nil {
				t.Fatalf("predict-service: %v", err)
			}
		})
	}
	for _, flag := range []string{"--workers", "--queue-size", "--max-request-bytes"} {
		out, err := run(t, 30*time.Second, fpmbusBin, "predict-service", "--server", env.Server.ClientURL(), flag, "0")
		if code := exitCode(err); code != 2 || !strings.Contains(out, flag+" 0: want at least 1") {
			t.Fatalf("%s 0: exit %d:\n%s", flag, code, out)
		}
	}
}

// Through `fpmbus predict-service` with a small pool (--workers 2 --queue-size 2) and a 64 KiB request
// limit: while several clients flood the service with 192 KiB requests, every one of which is refused
// unread (413, naming the limit), two clients asking well-formed queries get every answer, measured or
// interpolated, computed from the sealed rows. Oversized requests are refused on the delivery goroutine
// and never take a worker or a place in the queue, so they cannot crowd good queries out: with at most
// one request of its own in flight, each good client finds at most the other's request waiting, never
// a full queue, and a busy reply (503) to a good query can only mean that oversized requests were
// queued. The counts the service reports afterwards agree: one 413 per oversized request, no 503.
//
// Busy replies themselves are not provoked here: filling the pool with valid requests yields a 503 only
// if the admission outruns the workers, which depends on scheduling, not on the requests; the in-process
// TestBusyServiceRepliesAtOnce covers the busy reply.
func TestPredictServiceAnswersGoodQueriesThroughAFloodOfOversizedOnes(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	const maxRequestBytes = 64 << 10

	// One sealed cell, published through the binary: two decode rows at 512 KV tokens per request and
	// one prefill row.
	id := schemas.CellIdentity{SchemaVersion: 1, Model: "e2e/flood", Hardware: "H200-SXM", Backend: "vllm", BackendVersion: "0.29.0",
		Quantization: "fp8", KVCacheDType: "auto", Parallelism: schemas.Parallelism{TP: 8, PP: 1, DP: 1, MoETP: 8, MoEEP: 1, CP: 1},
		BackendSelections: map[string]string{}, ProfileName: "e2e", ProfileVersion: "1", SettingsDigest: strings.Repeat("ab", 32)}
	cell := schemas.Cell{Identity: id, Provenance: schemas.Provenance{RunID: "e2e-flood", GridDigest: "g", ArtefactDigest: strings.Repeat("cd", 32)},
		Rows: []schemas.Row{
			{Phase: schemas.PhaseDecode, NumDecodeRequests: 2, SumDecodeKVTokens: 1024, LatencyMS: 4},
			{Phase: schemas.PhaseDecode, NumDecodeRequests: 8, SumDecodeKVTokens: 4096, LatencyMS: 10},
			{Phase: schemas.PhasePrefill, NumPrefillRequests: 1, SumPrefillTokens: 512, LatencyMS: 20},
		}}
	cell.Finish()
	ds, err := json.Marshal(schemas.Dataset{SchemaVersion: schemas.DatasetSchemaVersion, Kind: schemas.DatasetKind, RunID: "e2e-flood", Cells: []schemas.Cell{cell}})
	if err != nil {
		t.Fatal(err)
	}
	dsPath := filepath.Join(t.TempDir(), "flood.json")
	if err := os.WriteFile(dsPath, ds, 0o644); err != nil {
		t.Fatal(err)
	}
	if o, err := run(t, 60*time.Second, fpmbusBin, "datasets", "publish", "--server", url, dsPath); err != nil {
		t.Fatalf("datasets publish: %v\n%s", err, o)
	}

	p := fpmbus(t, "fpmbus predict-service", "predict-service", "--server", url,
		"--workers", "2", "--queue-size", "2", "--max-request-bytes", strconv.Itoa(maxRequestBytes))
	p.waitOutput("predict service ready", 30*time.Second)

	// The good queries and what each must be answered: a measured row, and 4 decode requests reading
	// 2048 tokens, a third of the way from the 2-request row to the 8-request one.
	type good struct {
		query  string
		status string
		ms     float64
	}
	goods := []good{
		{fmt.Sprintf(`{"key":%q,"step":{"num_prefill_requests":1,"sum_prefill_tokens":512}}`, cell.Key), predict.StatusMeasured, 20},
		{fmt.Sprintf(`{"key":%q,"step":{"num_decode_requests":8,"sum_decode_kv_tokens":4096}}`, cell.Key), predict.StatusMeasured, 10},
		{fmt.Sprintf(`{"key":%q,"step":{"num_decode_requests":4,"sum_decode_kv_tokens":2048}}`, cell.Key), predict.StatusInterpolated, 4*2.0/3 + 10.0/3},
	}
	checkAnswer := func(a predict.Answer, g good) error {
		if a.Status != g.status || a.LatencyMS == nil || math.Abs(*a.LatencyMS-g.ms) > 1e-9 || a.Cell == nil || a.Cell.Key != cell.Key {
			return fmt.Errorf("want %s %v ms from %s, got %+v", g.status, g.ms, cell.Key, a)
		}
		return nil
	}
	batch := make([]string, len(goods))
	for i, g := range goods {
		batch[i] = g.query
	}
	batchQuery := "[" + strings.Join(batch, ",") + "]"
	// An array of valid queries, well-formed JSON, three times the limit: refused for its size alone.
	var oversized []byte
	{
		qs := make([]string, 0, 2000)
		for n := 2; n < 3*maxRequestBytes; {
			qs = append(qs, goods[len(qs)%len(goods)].query)
			n += len(qs[len(qs)-1]) + 1
		}
		oversized = []byte("[" + strings.Join(qs, ",") + "]")
	}

	connect := func() *nats.Conn {
		t.Helper()
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	const (
		floodClients    = 4
		floodRequests   = 50 // per flooding client
		goodClients     = 2  // one request each in flight: a new one finds at most the other's waiting, never a full queue
		goodRequests    = 60 // per good client, cycling through the single queries and the array
		requestDeadline = 30 * time.Second
	)
	// The answers the good clients must be given, by status: what the service counts afterwards.
	want := map[string]int64{}
	for c := range goodClients {
		for i := range goodRequests {
			if k := (i + c) % (len(goods) + 1); k < len(goods) {
				want[goods[k].status]++
			} else {
				for _, g := range goods {
					want[g.status]++
				}
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, floodClients+goodClients)
	for c := range floodClients {
		nc := connect()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range floodRequests {
				m, err := nc.Request(service.SubjectPredict, oversized, requestDeadline)
				if err != nil {
					errs <- fmt.Errorf("flooding client %d, request %d: %v", c, i, err)
					return
				}
				var e service.ErrorReply
				if err := json.Unmarshal(m.Data, &e); err != nil || m.Header.Get(micro.ErrorCodeHeader) != "413" ||
					!strings.Contains(m.Header.Get(micro.ErrorHeader), strconv.Itoa(maxRequestBytes)+"-byte limit") ||
					e.Code != 413 || e.RequestBytes != len(oversized) || e.MaxRequestBytes != maxRequestBytes {
					errs <- fmt.Errorf("flooding client %d, request %d of %d bytes: headers %v, body %.300s (%v)", c, i, len(oversized), m.Header, m.Data, err)
					return
				}
			}
		}()
	}
	for c := range goodClients {
		nc := connect()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range goodRequests {
				k := (i + c) % (len(goods) + 1) // the clients ask different things at the same moment
				q := batchQuery
				if k < len(goods) {
					q = goods[k].query
				}
				m, err := nc.Request(service.SubjectPredict, []byte(q), requestDeadline)
				if err != nil {
					errs <- fmt.Errorf("good client %d, request %d: %v", c, i, err)
					return
				}
				if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
					errs <- fmt.Errorf("good client %d, request %d: error %s %q: %.300s", c, i, code, m.Header.Get(micro.ErrorHeader), m.Data)
					return
				}
				if k < len(goods) {
					var a predict.Answer
					if err := json.Unmarshal(m.Data, &a); err != nil {
						errs <- fmt.Errorf("good client %d, request %d: %v: %.300s", c, i, err, m.Data)
						return
					}
					if err := checkAnswer(a, goods[k]); err != nil {
						errs <- fmt.Errorf("good client %d, request %d: %v", c, i, err)
						return
					}
					continue
				}
				var as []predict.Answer
				if err := json.Unmarshal(m.Data, &as); err != nil || len(as) != len(goods) {
					errs <- fmt.Errorf("good client %d, request %d (array): %d answers (%v): %.300s", c, i, len(as), err, m.Data)
					return
				}
				for j, a := range as {
					if err := checkAnswer(a, goods[j]); err != nil {
						errs <- fmt.Errorf("good client %d, request %d (array), answer %d: %v", c, i, j, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}

	// What the service counted agrees: every request received, every oversized one a 413, no busy
	// reply, nothing queued, and the good queries' answers by status (an array's counted one by one).
	m, err := env.NC.Request("$SRV.STATS."+service.Name, nil, requestDeadline)
	if err != nil {
		t.Fatal(err)
	}
	var stats micro.Stats
	if err := json.Unmarshal(m.Data, &stats); err != nil {
		t.Fatalf("stats %s: %v", m.Data, err)
	}
	var d service.EndpointData
	received := -1
	for _, ep := range stats.Endpoints {
		if ep.Subject != service.SubjectPredict {
			continue
		}
		received = ep.NumRequests
		if err := json.Unmarshal(ep.Data, &d); err != nil {
			t.Fatalf("endpoint data %s: %v", ep.Data, err)
		}
	}
	if received != floodClients*floodRequests+goodClients*goodRequests || len(d.Errors) != 1 || d.Errors["413"] != floodClients*floodRequests ||
		d.Queued != 0 || d.Workers != 2 || d.QueueSize != 2 || !maps.Equal(d.Answers, want) {
		t.Fatalf("predict endpoint after the flood: %d requests, %+v; want answers %v", received, d, want)
	}
	if err := p.signal(syscall.SIGINT, 30*time.Second); err != nil {
		t.Fatalf("predict-service: %v", err)
	}
}
