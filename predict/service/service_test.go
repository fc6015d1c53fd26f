package service

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/predict"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// nats-server and nats.go leave short-lived goroutines finishing after Shutdown/Close.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).Shutdown"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("time.Sleep"),
	)
}

// fixtureEntry is a line of the estimator's fixture bucket (../testdata/fpm_datasets.jsonl).
type fixtureEntry struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
}

func readLines(t testing.TB, path string) [][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if l := bytes.TrimSpace(sc.Bytes()); len(l) > 0 {
			out = append(out, append([]byte(nil), l...))
		}
	}
	return out
}

func fixtureEntries(t testing.TB) []fixtureEntry {
	var es []fixtureEntry
	for _, l := range readLines(t, "../testdata/fpm_datasets.jsonl") {
		var e fixtureEntry
		if err := json.Unmarshal(l, &e); err != nil {
			t.Fatal(err)
		}
		es = append(es, e)
	}
	return es
}

// bucket creates FPM_DATASETS on env's server holding the fixture entries.
func bucket(t testing.TB, env *natsservertest.Env) jetstream.KeyValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := env.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: streams.BucketDatasets, History: 64, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range fixtureEntries(t) {
		if _, err := kv.Put(ctx, e.Key, e.Value); err != nil { // a campaign record's revisions in order
			t.Fatal(err)
		}
	}
	return kv
}

// serve runs a Service on its own connection until the test ends.
func serve(t testing.TB, env *natsservertest.Env, kv jetstream.KeyValue, cfg Config, opts ...option) *Service {
	t.Helper()
	nc, err := nats.Connect(env.Server.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, nc, kv, append([]option{withLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("service run: %v", err)
		}
		nc.Close()
	})
	select {
	case <-s.Ready():
	case err := <-done:
		t.Fatalf("service stopped before ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("service not ready")
	}
	return s
}

func ask(t testing.TB, nc *nats.Conn, subject string, body []byte) *nats.Msg {
	t.Helper()
	m, err := nc.Request(subject, body, 5*time.Second)
	if err != nil {
		t.Fatalf("request %s: %v", subject, err)
	}
	return m
}

func decodeAnswer(t testing.TB, b []byte) predict.Answer {
	t.Helper()
	var a predict.Answer
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("answer %s: %v", b, err)
	}
	return a
}

// The service's answers are the estimator's, byte for byte: each golden query asked alone, and all of
// them in one array request.
func TestServiceAnswersAsTheEstimator(t *testing.T) {
	env := natsservertest.Start(t)
	kv := bucket(t, env)
	serve(t, env, kv, Config{})
	local, err := Load(context.Background(), kv)
	if err != nil {
		t.Fatal(err)
	}
	queries := readLines(t, "../testdata/queries.jsonl")
	var want [][]byte
	for _, line := range queries {
		q, err := predict.DecodeQuery(line)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(local.Predict(q, predict.Options{}))
		want = append(want, b)
		if got := ask(t, env.NC, SubjectPredict, line).Data; !bytes.Equal(got, b) {
			t.Fatalf("service answered\n%s\nthe estimator\n%s", got, b)
		}
	}
	m := ask(t, env.NC, SubjectPredict, append(append([]byte("["), bytes.Join(queries, []byte(","))...), ']'))
	var batch []json.RawMessage
	if err := json.Unmarshal(m.Data, &batch); err != nil || len(batch) != len(want) {
		t.Fatalf("batch reply: %v %s", err, m.Data)
	}
	for i := range batch {
		if !bytes.Equal(batch[i], want[i]) {
			t.Fatalf("batch answer %d:\n%s\nwant\n%s", i, batch[i], want[i])
		}
	}
	// The fixture campaigns: with RequireComplete, the partial campaign's cell is refused.
	strict := serve(t, env, kv, Config{QueueGroup: "strict", RequireComplete: true})
	q := predict.Query{Key: local.Cells()[0].Key, Step: predict.Step{NumPrefillRequests: 1, SumPrefillTokens: 128}}
	for _, c := range local.Cells() {
		if c.Valid() && c.Value.CampaignID == "camp-partial" {
			q.Key = c.Key
		}
	}
	if a := strict.Snapshot().Predict(q, predict.Options{RequireComplete: true}); a.Refusal == nil || a.Refusal.Reason != predict.ReasonIncompleteCampaign {
		t.Fatalf("%+v", a)
	}
}

// A cell sealed while the service runs is answered without a restart. What is written to its key
// afterwards (a delete marker, another value) is tampering: the service applies it and still answers
// from the sealed value, the key's first revision.
func TestServicePicksUpNewSealsWithoutRestart(t *testing.T) {
	env := natsservertest.Start(t)
	kv := bucket(t, env)
	s := serve(t, env, kv, Config{})
	id := schemas.CellIdentity{SchemaVersion: 1, Model: "late/model", Hardware: "B200", Backend: "vllm", BackendVersion: "0.29.0",
		Quantization: "fp8", KVCacheDType: "auto", Parallelism: schemas.Parallelism{TP: 8, PP: 1, DP: 1, MoETP: 8, MoEEP: 1, CP: 1},
		BackendSelections: map[string]string{}, ProfileName: "p", ProfileVersion: "1", SettingsDigest: strings.Repeat("ab", 32)}
	cell := schemas.Cell{Identity: id, Provenance: schemas.Provenance{RunID: "late", ArtefactDigest: strings.Repeat("cd", 32)},
		Rows: []schemas.Row{{Phase: "decode", NumDecodeRequests: 4, SumDecodeKVTokens: 4096, LatencyMS: 7.5}}}
	cell.Finish()
	body, _ := json.Marshal(schemas.SealedCell{SchemaVersion: 1, Key: cell.Key, Identity: id, Provenance: cell.Provenance, Rows: cell.Rows, AttemptID: "a", Source: "test"})
	q, _ := json.Marshal(predict.Query{Identity: &id, Step: predict.Step{NumDecodeRequests: 4, SumDecodeKVTokens: 4096}})
	ask := func() predict.Answer { return decodeAnswer(t, ask(t, env.NC, SubjectPredict, q).Data) }
	if a := ask(); a.Refusal == nil || a.Refusal.Reason != predict.ReasonUnknownIdentity {
		t.Fatalf("before the seal: %+v", a)
	}
	rev, err := kv.Create(context.Background(), cell.Key, body)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() error {
		a := ask()
		if a.Status != predict.StatusMeasured || *a.LatencyMS != 7.5 || a.Cell.Revision != rev {
			return errors.New(a.Status)
		}
		return nil
	})
	if err := kv.Delete(context.Background(), cell.Key); err != nil {
		t.Fatal(err)
	}
	bad := bytes.Replace(body, []byte(`"latency_ms":7.5`), []byte(`"latency_ms":8`), 1)
	badRev, err := kv.Put(context.Background(), cell.Key, bad)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() error {
		if got := s.Snapshot().Revision(); got < badRev {
			return fmt.Errorf("revision %d applied, want %d", got, badRev)
		}
		return nil
	})
	if a := ask(); a.Status != predict.StatusMeasured || *a.LatencyMS != 7.5 || a.Cell.Revision != rev {
		t.Fatalf("after a delete marker and an overwrite: %+v, want the sealed value of revision %d", a, rev)
	}
	if c := s.Snapshot().Cell(cell.Key); c == nil || !c.Valid() || c.Revision != rev {
		t.Fatalf("snapshot cell %+v", c)
	}
}

func waitFor(t testing.TB, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("not within 10s: %v", err)
}

// The service's subjects are outside every stream on the server (fpmbus's streams and the KV
// bucket's): requests are never stored, and no consumer of FPM ever sees one. The contrast shows why:
// a request on fpm.predict is stored in FPM and answered by JetStream's publish acknowledgement.
func TestServiceSubjectsAreOutsideEveryStream(t *testing.T) {
	env := natsservertest.Start(t)
	kv := bucket(t, env)
	serve(t, env, kv, Config{})
	ctx := context.Background()
	counts := func() map[string]uint64 {
		m := map[string]uint64{}
		for info := range env.JS.ListStreams(ctx).Info() {
			m[info.Config.Name] = info.State.Msgs
		}
		return m
	}
	var names []string
	for info := range env.JS.ListStreams(ctx).Info() {
		names = append(names, info.Config.Name)
		for _, subj := range info.Config.Subjects {
			for _, ours := range []string{subjectWildcard, SubjectPredict, SubjectCells} {
				if server.SubjectsCollide(subj, ours) {
					t.Fatalf("stream %s subject %s overlaps the service subject %s", info.Config.Name, subj, ours)
				}
			}
		}
	}
	if len(names) < 4 { // FPM, FPM_EVENTS, FPM_BENCH and the bucket's
		t.Fatalf("streams %v", names)
	}
	for _, subj := range []string{subjectWildcard, SubjectPredict, SubjectCells} {
		if name, err := env.JS.StreamNameBySubject(ctx, subj); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("%s is captured by stream %q (%v)", subj, name, err)
		}
	}
	before := counts()
	for range 20 {
		a := decodeAnswer(t, ask(t, env.NC, SubjectPredict, []byte(`{"key":"cell.00","step":{"num_decode_requests":1,"sum_decode_kv_tokens":1}}`)).Data)
		if a.Status != predict.StatusRefused || a.Source != predict.Source {
			t.Fatalf("%+v", a)
		}
		ask(t, env.NC, SubjectCells, nil)
	}
	if after := counts(); !equalCounts(before, after) {
		t.Fatalf("a stream stored requests: before %v, after %v", before, after)
	}
	// Under fpm.> a "request" is an FPM publish: stored, and acknowledged by the stream.
	m := ask(t, env.NC, streams.FPMRoot+".predict", []byte(`{}`))
	var ack jetstream.PubAck
	if err := json.Unmarshal(m.Data, &ack); err != nil || ack.Stream != streams.StreamFPM {
		t.Fatalf("fpm.predict reply %s", m.Data)
	}
	if after := counts(); after[streams.StreamFPM] != before[streams.StreamFPM]+1 {
		t.Fatalf("FPM holds %d messages", after[streams.StreamFPM])
	}
}

func equalCounts(a, b map[string]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Two instances in one queue group share the requests; discovery ($SRV.INFO) sees both, and each
// endpoint's stats count its own requests.
func TestServiceQueueGroupScaleOut(t *testing.T) {
	env := natsservertest.Start(t)
	kv := bucket(t, env)
	a, b := serve(t, env, kv, Config{}), serve(t, env, kv, Config{})
	const n = 200
	q := []byte(`{"key":"cell.dd6313e84d8da0d10727b99d29115107816b35076f2fdb26d0e3215ed337bb06","step":{"num_decode_requests":8,"sum_decode_kv_tokens":20480}}`)
	for range n {
		if a := decodeAnswer(t, ask(t, env.NC, SubjectPredict, q).Data); a.Status != predict.StatusInterpolated || *a.LatencyMS != 9.5 {
			t.Fatalf("%+v", a)
		}
	}
	stats := func(s *Service) micro.EndpointStats {
		for _, e := range s.Micro().Stats().Endpoints {
			if e.Subject == SubjectPredict {
				return *e
			}
		}
		t.Fatal("no predict endpoint")
		return micro.EndpointStats{}
	}
	sa, sb := stats(a), stats(b)
	if sa.NumRequests == 0 || sb.NumRequests == 0 || sa.NumRequests+sb.NumRequests != n || sa.QueueGroup != DefaultQueueGroup {
		t.Fatalf("requests %d + %d, queue group %q", sa.NumRequests, sb.NumRequests, sa.QueueGroup)
	}
	var d EndpointData
	if err := json.Unmarshal(sa.Data, &d); err != nil || d.Answers[predict.StatusInterpolated] != int64(sa.NumRequests) || d.Cells != 4 || d.CorruptCells != 1 {
		t.Fatalf("endpoint data %s: %v", sa.Data, err)
	}
	// Discovery reaches every instance, not one of the queue group.
	inbox := nats.NewInbox()
	var mu sync.Mutex
	var infos []micro.Info
	sub, err := env.NC.Subscribe(inbox, func(m *nats.Msg) {
		var i micro.Info
		if json.Unmarshal(m.Data, &i) == nil {
			mu.Lock()
			infos = append(infos, i)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	subj, _ := micro.ControlSubject(micro.InfoVerb, Name, "")
	if err := env.NC.PublishRequest(subj, inbox, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(infos) != 2 {
			return errors.New("waiting for both instances")
		}
		for _, i := range infos {
			if i.Name != Name || len(i.Endpoints) != 2 || i.Endpoints[0].Subject != SubjectPredict || i.Metadata["bucket"] != streams.BucketDatasets {
				return errors.New("bad info")
			}
		}
		return nil
	})
}

// Input that is not a query is a service error (400) whose body is the refused answer; a refusal of a
// well-formed query is an answer, not an error.
func TestServiceInvalidRequestIsAServiceError(t *testing.T) {
	env := natsservertest.Start(t)
	kv := bucket(t, env)
	reg := prometheus.NewRegistry()
	s := serve(t, env, kv, Config{}, WithRegisterer(reg))
	for _, body := range []string{`{"key":`, `{"key":"cell.x","step":{},"extra":1}`, `[{"key":1}`} {
		m := ask(t, env.NC, SubjectPredict, []byte(body))
		a := decodeAnswer(t, m.Data)
		if m.Header.Get(micro.ErrorCodeHeader) != "400" || a.Refusal == nil || a.Refusal.Reason != predict.ReasonInvalidQuery || a.LatencyMS != nil {
			t.Fatalf("%s: header %v answer %+v", body, m.Header, a)
		}
	}
	m := ask(t, env.NC, SubjectPredict, []byte(`{"key":"cell.x","step":{"num_decode_requests":1,"sum_decode_kv_tokens":1}}`))
	if m.Header.Get(micro.ErrorCodeHeader) != "" {
		t.Fatalf("a refusal was sent as an error: %v", m.Header)
	}
	for _, e := range s.Micro().Stats().Endpoints {
		var d EndpointData
		if err := json.Unmarshal(e.Data, &d); err != nil {
			t.Fatal(err)
		}
		if e.Subject == SubjectPredict && (d.Errors[codeInvalid] != 3 || len(d.Errors) != 1 || e.NumRequests != 4) {
			t.Fatalf("stats %+v, data %+v", e, d)
		}
	}
	// /metrics counts the same: 3 errors 400 (each with its refused answer), 4 refusals by reason, the
	// bucket's cells (labels in name order: code before endpoint).
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "/" + l.GetValue()
			}
			got[name] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	if got["fpmbus_predict_errors_total/400/"+SubjectPredict] != 3 || got["fpmbus_predict_errors_total/503/"+SubjectPredict] != 0 ||
		got["fpmbus_predict_answers_total/"+predict.StatusRefused] != 4 || got["fpmbus_predict_refusals_total/"+string(predict.ReasonInvalidQuery)] != 3 || got["fpmbus_predict_cells"] != 4 || got["fpmbus_predict_corrupt_cells"] != 1 ||
		got["fpmbus_predict_revision"] != 8 {
		t.Fatalf("metrics %v", got)
	}
	// The cells endpoint lists the loaded cells.
	var cr cellsReply
	if err := json.Unmarshal(ask(t, env.NC, SubjectCells, nil).Data, &cr); err != nil || len(cr.Cells) != 4 || cr.Revision != 8 {
		t.Fatalf("cells reply %+v: %v", cr, err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	env := natsservertest.Start(t)
	kv := bucket(t, env)
	for name, mk := range map[string]func() (*Service, error){
		"queue group with a space": func() (*Service, error) { return New(Config{QueueGroup: "a b"}, env.NC, kv) },
		"no connection":            func() (*Service, error) { return New(Config{}, nil, kv) },
		"nil logger":               func() (*Service, error) { return New(Config{}, env.NC, kv, withLogger(nil)) },
	} {
		if _, err := mk(); !errors.Is(err, errInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}
