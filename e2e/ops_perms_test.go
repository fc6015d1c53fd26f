package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/predict"
	"github.com/fpmbus/fpmbus/producer"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// Least privilege through the real binary: the server runs ops/nats/single.conf with permissions.conf
// (nats-server's own loader and server, embedded in the test), and every component runs as a separate
// process logged in as its own user. The pipeline works end to end, the server refuses nothing along the
// way (its log records every refusal), and what a role must not do is refused.

// goldenRanks are the rank artefacts of the merger's golden 4-rank run.
func goldenRanks(t *testing.T) []string {
	t.Helper()
	ranks, err := filepath.Glob("../consumers/merge/testdata/golden/protocol_4rank/benchmark_results*.json")
	if err != nil || len(ranks) != 4 {
		t.Fatalf("rank fixtures: %v %v", ranks, err)
	}
	return ranks
}

// Every component as its own user: bridge, trace writer, gap detector, merger, sealer and predict
// service run as processes against the server; the operator applies the streams and publishes a
// benchmark run; the reader backfills a trace, reads the stream for a replay and asks for a prediction;
// the gap detector's user reports. FPMs are stored, the trace holds every one, a gap is reported, the
// run is merged (its body through the object store) and sealed, the prediction is answered, every
// component stops cleanly (handing its partitions on, leaving its group), and the server logged no
// permission violation at all.
func TestOpsPermissionsEveryComponentAsItsOwnUser(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	srv := startOpsSingle(t)
	dir := t.TempDir()
	srv.run(t, "operator", "streams", "apply")

	// Ranks 0 and 1 publish FPMs, rank 2 one payload that does not decode (a dead letter).
	base := producertest.FreeBasePort(t, "", 3)
	// Each serves its status (--metrics-addr), read below: what it reads for it is within its user's rights.
	status := map[string]string{}
	for _, c := range []string{"bridge", "trace", "gaps", "merge", "seal", "predict-service"} {
		status[c] = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	}
	bridge := srv.start(t, "bridge", "bridge", "bridge", "--fpm-port", strconv.Itoa(base), "--dp-size", "3", "--metrics-addr", status["bridge"])
	traceOut := filepath.Join(dir, "trace", "fpm")
	components := []*proc{
		bridge,
		srv.start(t, "trace", "trace", "trace", "--trace-mode", "full", "--trace-output", traceOut, "--metrics-addr", status["trace"]),
		srv.start(t, "gaps", "gaps", "gaps", "--stale-after", "1h", "--marker-grace", "1s", "--metrics-addr", status["gaps"]),
		// --inline-max 1 KiB: the merged artefact goes through the object store FPM_BENCH_OBJECTS.
		srv.start(t, "merge", "merge", "merge", "--bench-output", filepath.Join(dir, "merged_{run_id}.json"), "--inline-max", "1024", "--metrics-addr", status["merge"]),
		srv.start(t, "seal", "seal", "seal", "--metrics-addr", status["seal"]),
		srv.start(t, "predict", "predict", "predict-service", "--metrics-addr", status["predict-service"]),
	}
	bridge.waitOutput("bridge ready", 30*time.Second)
	for _, p := range components[1:] {
		if strings.HasPrefix(p.name, "predict") {
			p.waitOutput("predict service ready", 30*time.Second)
		} else {
			p.waitOutput("consumer running", 30*time.Second)
		}
	}

	// Two ranks of 20 FPMs; rank 0 never sends its number 5 (a gap for the detector).
	const perRank = 20
	var pubs []*producertest.Scripted
	for r := range 2 {
		p := producertest.NewScripted(t, fmt.Sprintf("tcp://127.0.0.1:%d", base+r), 0, false, "perm-w", r)
		p.WaitSubscribed()
		pubs = append(pubs, p)
	}
	for i := range perRank {
		for r, p := range pubs {
			if r == 0 && i == 5 {
				p.Skip()
			}
			p.Send(false)
		}
		time.Sleep(5 * time.Millisecond)
	}
	garbage, err := producer.NewSender(nil, fmt.Sprintf("tcp://127.0.0.1:%d", base+2), -1, producer.WithSubscriberCount(), producer.WithLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer garbage.Close()
	if err := garbage.WaitSubscribers(1, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := garbage.Send(0, []byte("not msgpack")); err != nil {
		t.Fatal(err)
	}
	op := srv.client(t, "operator")
	waitStreamCount(t, op.js, streams.StreamFPM, 2*perRank, 30*time.Second)
	waitSubjectCount(t, op.js, streams.StreamEvents, streams.DeadLetterSubject("dynamo", "backend", 2), 1)
	// A message on an FPM subject without the bridge's headers, which the trace writer and the gap
	// detector can never use: each dead-letters it (on its own subject, as its own user).
	if _, err := op.js.Publish(t.Context(), "fpm.dynamo.backend.forged.0", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"trace", "gaps"} {
		waitSubjectCount(t, op.js, streams.StreamEvents, streams.ConsumerDeadLetterSubject(c), 1)
	}

	// A benchmark run: ranks and profile, bodies above 1 KiB through the object store.
	profile := filepath.Join(dir, "profile.json")
	if err := os.WriteFile(profile, []byte(`{"schema_version":1,"name":"e2e-perms","version":"1","hardware":"H200-SXM"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	srv.run(t, "operator", append([]string{"bench", "publish", "--inline-max", "1024", "--profile", profile}, goldenRanks(t)...)...)

	// The gap, as `gaps report` (gap detector's user) tells it, and its event.
	eventually(t, 30*time.Second, func() error {
		var rep gaps.Report
		out := srv.run(t, "gaps", "gaps", "report", "--json")
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			return fmt.Errorf("gaps report --json: %v\n%s", err, out)
		}
		got := map[int][2]uint64{}
		for _, p := range rep.Publishers {
			if p.Key.WorkerID == "perm-w" {
				got[p.Key.DPRank] = [2]uint64{p.GapsTotal, p.MissingTotal}
			}
		}
		if got[0] != [2]uint64{1, 1} || got[1] != [2]uint64{0, 0} || len(got) != 2 {
			return fmt.Errorf("gaps, missing by rank: %v, want rank 0 one gap of one message, rank 1 none", got)
		}
		return nil
	})
	if n := len(streamsMessages(t, op.js, streams.StreamEvents, streams.GapEventWildcard)); n != 1 {
		t.Fatalf("%d gap events, want 1", n)
	}
	// Every status, read as the component's own user: healthy, its consumer and streams' policy read,
	// and the gap detector's page shows the gap from its state bucket.
	for name, addr := range status {
		eventually(t, 30*time.Second, func() error {
			st, err := getStatus(addr, "")
			switch {
			case err != nil:
				return err
			case st.Health != "ok":
				return fmt.Errorf("%s: health %s: %+v", name, st.Health, st.Components)
			case st.JetStream != nil && (st.JetStream.Error != "" || len(st.Durability.Streams) != 3):
				return fmt.Errorf("%s: JetStream %+v, streams %+v", name, st.JetStream, st.Durability)
			case name != "bridge" && name != "predict-service" && (st.JetStream == nil || len(st.JetStream.Consumers) != 1):
				return fmt.Errorf("%s: its consumer is not read: %+v", name, st.JetStream)
			case name == "gaps" && (st.Publishers == nil || st.Publishers.Error != "" || st.Publishers.Summary.WithGaps != 1 || st.Publishers.Totals["zmq_drop"] != 1):
				return fmt.Errorf("gaps: publishers %+v", st.Publishers)
			}
			return nil
		})
	}
	// Counted from the streams instead of the state: the same gap.
	var since gaps.Report
	if err := json.Unmarshal([]byte(srv.run(t, "gaps", "gaps", "report", "--json", "--since", "1h")), &since); err != nil {
		t.Fatal(err)
	}
	for _, p := range since.Publishers {
		if p.Key.WorkerID == "perm-w" && p.Key.DPRank == 0 && (p.GapsTotal != 1 || p.Messages != perRank) {
			t.Fatalf("gaps report --since 1h: rank 0 has %d gaps in %d messages, want 1 in %d", p.GapsTotal, p.Messages, perRank)
		}
	}

	// Merged (a merged message whose body is an object), then sealed.
	var runID string
	eventually(t, 60*time.Second, func() error {
		msgs := streamsMessages(t, op.js, streams.StreamBench, streams.BenchMergedWildcard)
		if len(msgs) != 1 {
			return fmt.Errorf("%d merged artefacts", len(msgs))
		}
		if msgs[0].Headers().Get(streams.HeaderBenchObject) == "" {
			t.Fatalf("the merged artefact (%s bytes) was published inline, not through the object store", msgs[0].Headers().Get(streams.HeaderBenchSize))
		}
		runID = msgs[0].Headers().Get(streams.HeaderBenchRun)
		return nil
	})
	if m, _ := filepath.Glob(filepath.Join(dir, "merged_*.json")); len(m) < 1 {
		t.Fatalf("no merged artefact on disk in %s", dir)
	}
	kv, err := op.js.KeyValue(t.Context(), streams.BucketDatasets)
	if err != nil {
		t.Fatal(err)
	}
	var cell schemas.SealedCell
	eventually(t, 60*time.Second, func() error {
		keys, err := kv.Keys(t.Context())
		if err != nil {
			return err
		}
		for _, k := range keys {
			if strings.HasPrefix(k, schemas.CellKeyPrefix) {
				e, err := kv.Get(t.Context(), k)
				if err != nil {
					return err
				}
				return json.Unmarshal(e.Value(), &cell)
			}
		}
		return errors.New("no sealed cell yet")
	})
	if cell.Provenance.RunID != runID || len(cell.Rows) == 0 {
		t.Fatalf("sealed cell of run %q with %d rows, want run %q", cell.Provenance.RunID, len(cell.Rows), runID)
	}

	// A prediction, asked by the reader with the real nats CLI: a measured row comes back as measured.
	row := cell.Rows[0]
	step, _ := json.Marshal(row)
	var stepMap map[string]any
	_ = json.Unmarshal(step, &stepMap)
	delete(stepMap, "latency_ms")
	query, _ := json.Marshal(map[string]any{"key": cell.Key, "step": stepMap})
	eventually(t, 20*time.Second, func() error {
		var a predict.Answer
		out := srv.nats(t, "reader", "req", "--raw", "fpmpredict.predict", string(query))
		if err := json.Unmarshal([]byte(out), &a); err != nil {
			return fmt.Errorf("answer %q: %v", out, err)
		}
		if a.Status != predict.StatusMeasured || a.LatencyMS == nil || *a.LatencyMS != row.LatencyMS {
			return fmt.Errorf("answer %s, want measured %v ms", out, row.LatencyMS)
		}
		return nil
	})

	// The reader: the sealed cells, the service, one stored FPM.
	if out := srv.run(t, "reader", "datasets", "ls"); !strings.Contains(out, cell.Key) {
		t.Fatalf("datasets ls as reader does not list %s:\n%s", cell.Key, out)
	}
	if out := srv.run(t, "reader", "datasets", "get", cell.Key); !strings.Contains(out, cell.Provenance.DatasetDigest) {
		t.Fatalf("datasets get as reader:\n%s", out)
	}
	if out := srv.run(t, "reader", "streams", "show"); !strings.Contains(out, streams.StreamFPM) {
		t.Fatalf("streams show as reader:\n%s", out)
	}
	if out := srv.nats(t, "reader", "micro", "ls"); !strings.Contains(out, "fpm-predict") {
		t.Fatalf("nats micro ls as reader:\n%s", out)
	}
	if out := srv.nats(t, "reader", "stream", "get", streams.StreamFPM, "1"); !strings.Contains(out, "perm-w") {
		t.Fatalf("nats stream get as reader:\n%s", out)
	}

	// The reader: a backfilled trace of the whole stream; the stream's shape for a replay.
	back := filepath.Join(dir, "backfill", "fpm")
	srv.run(t, "reader", "trace", "backfill", "--start-seq", "1", "--trace-mode", "full", "--trace-output", back, "--progress", "none")
	if n := len(traceLines(t, back+".*.jsonl.gz")); n != 2*perRank {
		t.Fatalf("backfill wrote %d lines, want %d", n, 2*perRank)
	}
	if out := srv.run(t, "reader", "trace", "replay", "--from-stream", "--info", "--json"); !strings.Contains(out, fmt.Sprintf(`"records": %d`, 2*perRank)) &&
		!strings.Contains(out, fmt.Sprintf(`"records":%d`, 2*perRank)) {
		t.Fatalf("trace replay --from-stream --info as reader:\n%s", out)
	}

	// Every component stops cleanly: graceful handover (acks settled, owner record released), leaving the group (KV delete),
	// stopping its watches.
	for _, p := range slices.Backward(components) {
		if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
			t.Fatalf("%s: %v\n%s", p.name, err, p.Output())
		}
	}
	if n := len(traceLines(t, traceOut+".*.jsonl.gz")); n != 2*perRank {
		t.Fatalf("the trace writer wrote %d lines, want %d", n, 2*perRank)
	}
	if v := srv.violations(); len(v) > 0 {
		t.Fatalf("the server refused the components %d times:\n%s", len(v), strings.Join(v, "\n"))
	}
}

// waitSubjectCount waits until stream holds exactly want messages on subject (filter).
func waitSubjectCount(t *testing.T, js jetstream.JetStream, stream, subject string, want int) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		if n := len(streamsMessages(t, js, stream, subject)); n != want {
			return fmt.Errorf("%s holds %d messages on %s, want %d", stream, n, subject, want)
		}
		return nil
	})
}

// streamsMessages reads every message of stream on filter (">" for all) with an ordered consumer.
func streamsMessages(t *testing.T, js jetstream.JetStream, stream, filter string) []jetstream.Msg {
	t.Helper()
	s, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs == 0 {
		return nil
	}
	c, err := s.OrderedConsumer(t.Context(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for {
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			out = append(out, m)
			n++
		}
		if n == 0 {
			return out
		}
	}
}

// What each role must not do, each refused by the server: the client's error names the refused
// subject ("Permissions Violation for Publish to …", as nats.go reports it), the server logs the
// refusal for that user, and nothing changed. The operator, who may, is the control.
func TestOpsPermissionsRefuseWhatARoleMustNotDo(t *testing.T) {
	t.Parallel()
	srv := startOpsSingle(t)
	srv.run(t, "operator", "streams", "apply")
	op := srv.client(t, "operator")
	ctx := context.Background()
	// `streams apply` made FPM_DATASETS (protected).
	if _, err := op.js.KeyValue(ctx, streams.BucketDatasets); err != nil {
		t.Fatal(err)
	}
	if _, err := op.js.Publish(ctx, "fpm.perm.backend.w.0", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}

	// request calls a JetStream API; a refused one has no answer, so its deadline is short.
	request := func(js jetstream.JetStream, f func(context.Context, jetstream.JetStream) error) error {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return f(rctx, js)
	}
	for name, tc := range map[string]struct {
		user    string
		subject string // the subject the server refuses
		do      func(c *opsClient) error
		check   func(t *testing.T) // what must not have changed
	}{
		"bridge cannot read FPM_DATASETS": {user: "bridge", subject: "$JS.API.STREAM.INFO.KV_FPM_DATASETS",
			do: func(c *opsClient) error {
				return request(c.js, func(ctx context.Context, js jetstream.JetStream) error {
					_, err := js.KeyValue(ctx, streams.BucketDatasets)
					return err
				})
			}},
		"trace writer cannot publish FPMs": {user: "trace", subject: "fpm.perm.backend.w.0",
			do: func(c *opsClient) error { return c.nc.Publish("fpm.perm.backend.w.0", []byte(`{}`)) },
			check: func(t *testing.T) {
				if n := len(streamsMessages(t, op.js, streams.StreamFPM, ">")); n != 1 {
					t.Fatalf("FPM holds %d messages, want the operator's 1", n)
				}
			}},
		"gap detector cannot pull from the trace writer's consumer": {user: "gaps", subject: "$JS.API.CONSUMER.MSG.NEXT.FPM.fpm-trace",
			do: func(c *opsClient) error {
				return c.nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.FPM.fpm-trace", c.nc.NewRespInbox(), []byte(`{"batch":1}`))
			}},
		"merger cannot seal cells": {user: "merge", subject: "$KV.FPM_DATASETS.cell.forged",
			do: func(c *opsClient) error { return c.nc.Publish("$KV.FPM_DATASETS.cell.forged", []byte(`{}`)) },
			check: func(t *testing.T) {
				kv, _ := op.js.KeyValue(ctx, streams.BucketDatasets)
				if _, err := kv.Get(ctx, "cell.forged"); !errors.Is(err, jetstream.ErrKeyNotFound) {
					t.Fatalf("cell.forged: %v, want not found", err)
				}
			}},
		"sealer cannot delete the FPM stream": {user: "seal", subject: "$JS.API.STREAM.DELETE.FPM",
			do: func(c *opsClient) error {
				return request(c.js, func(ctx context.Context, js jetstream.JetStream) error {
					return js.DeleteStream(ctx, streams.StreamFPM)
				})
			},
			check: func(t *testing.T) {
				if _, err := op.js.Stream(ctx, streams.StreamFPM); err != nil {
					t.Fatalf("FPM after the sealer's delete: %v", err)
				}
			}},
		"predict service cannot write benchmark artefacts": {user: "predict", subject: "fpmbench.merged.forged",
			do: func(c *opsClient) error { return c.nc.Publish("fpmbench.merged.forged", []byte(`{}`)) },
			check: func(t *testing.T) {
				if n := len(streamsMessages(t, op.js, streams.StreamBench, ">")); n != 0 {
					t.Fatalf("FPM_BENCH holds %d messages", n)
				}
			}},
		"reader cannot purge FPM": {user: "reader", subject: "$JS.API.STREAM.PURGE.FPM",
			do: func(c *opsClient) error {
				return request(c.js, func(ctx context.Context, js jetstream.JetStream) error {
					s, err := js.Stream(ctx, streams.StreamFPM)
					if err != nil {
						return err
					}
					return s.Purge(ctx)
				})
			},
			check: func(t *testing.T) {
				if n := len(streamsMessages(t, op.js, streams.StreamFPM, ">")); n != 1 {
					t.Fatalf("FPM holds %d messages after the reader's purge, want 1", n)
				}
			}},
		"reader cannot delete the gap detector's consumer": {user: "reader", subject: "$JS.API.CONSUMER.DELETE.FPM.fpm-gaps",
			do: func(c *opsClient) error {
				return request(c.js, func(ctx context.Context, js jetstream.JetStream) error {
					return js.DeleteConsumer(ctx, streams.StreamFPM, "fpm-gaps")
				})
			}},
	} {
		t.Run(name, func(t *testing.T) {
			c := srv.client(t, tc.user)
			err := tc.do(c)
			msg, ok := c.refused(tc.subject, 5*time.Second)
			if !ok {
				t.Fatalf("%s was not refused %s (call returned %v)", tc.user, tc.subject, err)
			}
			if !srv.log.has(tc.user, tc.subject) {
				t.Fatalf("the server did not log refusing %s to %s:\n%s", tc.subject, tc.user, strings.Join(srv.log.all(), "\n"))
			}
			t.Logf("%s: %s", tc.user, msg)
			if tc.check != nil {
				tc.check(t)
			}
		})
	}

	// The control: the operator may purge (and so the refusals above are the permissions, not the API).
	s, err := op.js.Stream(ctx, streams.StreamFPM)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(ctx); err != nil {
		t.Fatalf("operator purge: %v", err)
	}
	if _, ok := op.refused("$JS.API.STREAM.PURGE.FPM", 0); ok {
		t.Fatal("the operator was refused a purge")
	}

	// Flow control is allowed where it is needed: the merger reads a 32 MiB artefact body from the
	// object store, which the server sends with flow-control requests the reader must answer.
	obs, err := op.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: streams.BenchObjectBucket})
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("fpmbench"), 4<<20)
	if _, err := obs.Put(ctx, jetstream.ObjectMeta{Name: "large"}, bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	mc := srv.client(t, "merge")
	mobs, err := mc.js.ObjectStore(ctx, streams.BenchObjectBucket)
	if err != nil {
		t.Fatal(err)
	}
	res, err := mobs.Get(ctx, "large")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(res)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("the merger read %d of %d bytes: %v", len(got), len(body), err)
	}
	for _, v := range srv.violations() {
		if strings.Contains(v, `/user:merge"`) && !strings.Contains(v, "$KV.FPM_DATASETS.cell.forged") {
			t.Fatalf("the merger was refused reading an object: %s", v)
		}
	}

	// A component run as the wrong user: the bridge logged in as the trace writer is refused every
	// FPM, and its log names the subject the server refused.
	basePort := producertest.FreeBasePort(t, "", 1)
	b := srv.start(t, "trace", "bridge", "bridge", "--fpm-port", strconv.Itoa(basePort), "--dp-size", "1")
	b.waitOutput("bridge ready", 30*time.Second)
	pub := producertest.NewScripted(t, fmt.Sprintf("tcp://127.0.0.1:%d", basePort), 0, false, "wrong-user", 0)
	pub.WaitSubscribed()
	pub.SendN(3, 0)
	b.waitOutput(`Permissions Violation for Publish to \"fpm.dynamo.backend.wrong-user.0\"`, 20*time.Second)
	if !strings.Contains(b.Output(), `level=ERROR msg="the NATS server refused this user a subject its permissions do not allow`) {
		t.Fatalf("the bridge does not log the refusal as an error:\n%s", b.Output())
	}
	if n := len(streamsMessages(t, op.js, streams.StreamFPM, "fpm.*.*.wrong-user.>")); n != 0 {
		t.Fatalf("FPM holds %d messages the server refused", n)
	}
	_ = b.signal(syscall.SIGKILL, 10*time.Second)
}
