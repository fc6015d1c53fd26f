package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/streams"
)

// Sharded ingest with the least-privilege users, on the real nats-server running single.conf with
// permissions.conf: the operator applies three FPM shards, and the bridge, the trace writer (shard p
// as its partition p), the gap detector (likewise), the merger and the sealer run as their own users,
// with no flag about the shards. Three publishers, one worker in each shard, one FPM skipped: every
// shard stores its worker's FPMs, the trace writer writes each once, `gaps report` (its state, and `--since` from the shards)
// reports the one gap, the reader's `nats sub 'fpm.>'` sees every FPM the shards republish, its
// `trace backfill --since` writes the same lines from the three shards and `trace replay --from-stream
// --info` counts them; what a role must not do on the shards (pull from or delete another group's
// durable, purge a shard, declare one) is refused; every component stops cleanly and the server
// refused nothing else.
func TestOpsShardedIngestOnTheRealNatsServer(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	const shards, perWorker = 3, 30
	conf, url, passwords := opsSingleConf(t, t.TempDir())
	srv := startNatsServers(t, []string{conf}, []string{url}, passwords)
	srv.run(t, "operator", "streams", "apply", "--fpm-shards", strconv.Itoa(shards))
	since := time.Now().Add(-time.Second)

	workers := shardWorkers(shards) // worker i in shard i, publishing as rank i
	sub := start(t, "nats sub as reader", natsBin, "--server", url, "--user", "reader", "--password", passwords["reader"],
		"sub", "fpm.>", "--count", strconv.Itoa(shards*perWorker))
	sub.waitOutput("Subscribing on", 15*time.Second)

	dir := t.TempDir()
	base := producertest.FreeBasePort(t, "", shards)
	bridge := srv.start(t, "bridge", "bridge", "bridge", "--fpm-port", strconv.Itoa(base), "--dp-size", strconv.Itoa(shards))
	traceOut := filepath.Join(dir, "trace", "fpm")
	components := []*proc{
		bridge,
		srv.start(t, "trace", "trace", "trace", "--trace-mode", "full", "--trace-output", traceOut),
		srv.start(t, "gaps", "gaps", "gaps", "--stale-after", "1h", "--marker-grace", "1s"),
		// The merger and the sealer never read FPMs, but look every stream up when they start.
		srv.start(t, "merge", "merge", "merge", "--bench-output", filepath.Join(dir, "merged_{run_id}.json")),
		srv.start(t, "seal", "seal", "seal"),
	}
	bridge.waitOutput("bridge ready", 30*time.Second)
	for _, p := range components[1:] {
		p.waitOutput("consumer running", 30*time.Second)
	}
	op := srv.client(t, "operator")
	refused := refuseOnShards(t, srv, op)

	var pubs []*producertest.Scripted
	for r, w := range workers {
		p := producertest.NewScripted(t, fmt.Sprintf("tcp://127.0.0.1:%d", base+r), 0, false, w, r)
		p.WaitSubscribed()
		pubs = append(pubs, p)
	}
	for i := range perWorker {
		for r, p := range pubs {
			if r == 1 && i == 10 { // worker 1 (shard 1) skips its number 10 (sends 11 next): one gap of one FPM
				p.Skip()
			}
			p.Send(false)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := op.js.Stream(t.Context(), streams.StreamFPM); err == nil {
		t.Fatalf("stream %s exists next to the shards", streams.StreamFPM)
	}
	for i := range shards {
		waitStreamCount(t, op.js, streams.ShardStreamName(i), perWorker, 30*time.Second)
		for _, m := range streamsMessages(t, op.js, streams.ShardStreamName(i), ">") {
			if k, err := streams.ParseFPMSubject(m.Subject()); err != nil || k.WorkerID != workers[i] {
				t.Fatalf("%s holds %s (%v), want only worker %s", streams.ShardStreamName(i), m.Subject(), err, workers[i])
			}
		}
	}
	stored := shards * perWorker

	// The gap, from the detector's state and counted from the shards (gap detector's user).
	wantGaps := map[string][2]uint64{workers[0]: {0, 0}, workers[1]: {1, 1}, workers[2]: {0, 0}}
	eventually(t, 30*time.Second, func() error {
		var rep gaps.Report
		out := srv.run(t, "gaps", "gaps", "report", "--json")
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			return fmt.Errorf("gaps report --json: %v\n%s", err, out)
		}
		got := map[string][2]uint64{}
		for _, p := range rep.Publishers {
			got[p.Key.WorkerID] = [2]uint64{p.GapsTotal, p.MissingTotal}
		}
		if !maps.Equal(got, wantGaps) {
			return fmt.Errorf("gaps, missing by worker: %v, want %v", got, wantGaps)
		}
		return nil
	})
	var rep gaps.Report
	if err := json.Unmarshal([]byte(srv.run(t, "gaps", "gaps", "report", "--json", "--since", "1h")), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Publishers) != shards {
		t.Fatalf("gaps report --since 1h has %d publishers, want %d", len(rep.Publishers), shards)
	}
	for _, p := range rep.Publishers {
		if g := wantGaps[p.Key.WorkerID]; p.Messages != perWorker || p.GapsTotal != g[0] || p.MissingTotal != g[1] {
			t.Fatalf("gaps report --since 1h for %s: %d messages, %d gaps, %d missing; want %d, %d, %d",
				p.Key, p.Messages, p.GapsTotal, p.MissingTotal, perWorker, g[0], g[1])
		}
	}

	// A restarted bridge checks its ack records against each key's shard (its newest FPM from the
	// shard's leader) before it is ready; a refusal would be in the server's log.
	if err := bridge.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("bridge: %v\n%s", err, bridge.Output())
	}
	bridge = srv.start(t, "bridge", "bridge again", "bridge", "--fpm-port", strconv.Itoa(base), "--dp-size", strconv.Itoa(shards))
	bridge.waitOutput("bridge ready", 30*time.Second)
	components[0] = bridge

	// The reader: every stored FPM live, then the time range backfilled from the three shards, and the
	// shards' contents as a replay source.
	if err := sub.wait(30 * time.Second); err != nil {
		t.Fatalf("nats sub as reader: %v\n%s", err, sub.Output())
	}
	perWorkerSeen := map[string]int{}
	for _, m := range receivedOn.FindAllStringSubmatch(sub.Output(), -1) {
		k, err := streams.ParseFPMSubject(m[1])
		if err != nil {
			t.Fatalf("nats sub 'fpm.>' received on %s: %v", m[1], err)
		}
		perWorkerSeen[k.WorkerID]++
	}
	if want := map[string]int{workers[0]: perWorker, workers[1]: perWorker, workers[2]: perWorker}; !maps.Equal(perWorkerSeen, want) {
		t.Fatalf("nats sub 'fpm.>' as reader received %v, want %v", perWorkerSeen, want)
	}
	for i, w := range workers { // `nats stream get` and `nats stream subjects` on a shard
		if out := srv.nats(t, "reader", "stream", "get", streams.ShardStreamName(i), "1"); !strings.Contains(out, w) {
			t.Fatalf("nats stream get %s 1 as reader, want worker %s:\n%s", streams.ShardStreamName(i), w, out)
		}
		key := "fpm.dynamo.backend." + w + "." + strconv.Itoa(i)
		if out := srv.nats(t, "reader", "stream", "get", streams.ShardStreamName(i), "--last-for", key); !strings.Contains(out, fmt.Sprintf("%s#%d ", streams.ShardStreamName(i), perWorker)) {
			t.Fatalf("nats stream get %s --last-for %s as reader, want its message %d:\n%s", streams.ShardStreamName(i), key, perWorker, out)
		}
		if out := srv.nats(t, "reader", "stream", "subjects", streams.ShardStreamName(i)); !strings.Contains(out, key) {
			t.Fatalf("nats stream subjects %s as reader, want worker %s's rank %d:\n%s", streams.ShardStreamName(i), w, i, out)
		}
	}
	back := filepath.Join(dir, "backfill", "fpm")
	srv.run(t, "reader", "trace", "backfill", "--since", since.UTC().Format(time.RFC3339Nano), "--trace-mode", "full",
		"--trace-output", back, "--progress", "none")
	backLines := traceLines(t, back+".*.jsonl.gz")
	if len(backLines) != stored {
		t.Fatalf("backfill as reader wrote %d lines, want %d", len(backLines), stored)
	}
	if out := srv.run(t, "reader", "trace", "replay", "--from-stream", "--since", since.UTC().Format(time.RFC3339Nano), "--info", "--json"); !strings.Contains(out, fmt.Sprintf(`"records": %d`, stored)) &&
		!strings.Contains(out, fmt.Sprintf(`"records":%d`, stored)) {
		t.Fatalf("trace replay --from-stream --info as reader, want %d records:\n%s", stored, out)
	}

	for _, p := range components {
		if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
			t.Fatalf("%s: %v\n%s", p.name, err, p.Output())
		}
	}
	// The live trace writer and the backfill hold the same FPMs, each once.
	live := map[string]int{}
	liveLines := traceLines(t, traceOut+".*.jsonl.gz")
	for _, l := range liveLines {
		live[string(l.Event.FPM)]++
	}
	if len(liveLines) != stored || len(live) != stored {
		t.Fatalf("the trace writer wrote %d lines of %d distinct FPMs, want %d of %d", len(liveLines), len(live), stored, stored)
	}
	for _, l := range backLines {
		if live[string(l.Event.FPM)] != 1 {
			t.Fatalf("backfilled FPM written %d times by the trace writer: %s", live[string(l.Event.FPM)], l.Event.FPM)
		}
	}
	for _, name := range []string{"FPM_PART_fpm-trace", "FPM_PART_fpm-gaps"} {
		if _, err := op.js.Stream(t.Context(), name); err == nil {
			t.Fatalf("partition stream %s exists: a group copies the shards instead of reading them", name)
		}
	}
	for i := range shards { // each group's durables on the shards, as their users declared them
		for _, group := range []string{"fpm-trace", "fpm-gaps"} {
			name := group + "-" + strconv.Itoa(i)
			if _, err := op.js.PushConsumer(t.Context(), streams.ShardStreamName(i), name); err != nil {
				t.Fatalf("consumer %s on %s: %v", name, streams.ShardStreamName(i), err)
			}
		}
	}
	for _, line := range srv.violations() {
		if !slices.ContainsFunc(refused, func(r [2]string) bool {
			return strings.Contains(line, `"FPMBUS/user:`+r[0]+`"`) && strings.Contains(line, fmt.Sprintf("Subject %q", r[1]))
		}) {
			t.Fatalf("the server refused something besides the refusals tried on purpose: %s", line)
		}
	}
}

// refuseOnShards tries what a role must not do on the shards, with the trace writer's and the gap
// detector's durables in place: each attempt is refused (the client's error names the subject, the
// server logs it for that user) and changes nothing. It returns the refusals as (user, subject).
func refuseOnShards(t *testing.T, srv *opsServer, op *opsClient) [][2]string {
	t.Helper()
	pull := func(subject string) func(c *opsClient) error {
		return func(c *opsClient) error {
			return c.nc.PublishRequest(subject, c.nc.NewRespInbox(), []byte(`{"batch":1}`))
		}
	}
	consumerKept := func(stream, consumer string) func(t *testing.T) {
		return func(t *testing.T) {
			if _, err := op.js.PushConsumer(t.Context(), stream, consumer); err != nil {
				t.Fatalf("consumer %s on %s: %v", consumer, stream, err)
			}
		}
	}
	var out [][2]string
	for name, tc := range map[string]struct {
		user, subject string
		do            func(c *opsClient) error
		check         func(t *testing.T)
	}{
		"reader cannot pull from the trace writer's durable on a shard": {user: "reader",
			subject: "$JS.API.CONSUMER.MSG.NEXT.FPM_1.fpm-trace-1", do: pull("$JS.API.CONSUMER.MSG.NEXT.FPM_1.fpm-trace-1")},
		"reader cannot delete the gap detector's durable on a shard": {user: "reader",
			subject: "$JS.API.CONSUMER.DELETE.FPM_2.fpm-gaps-2",
			do: func(c *opsClient) error {
				return c.nc.PublishRequest("$JS.API.CONSUMER.DELETE.FPM_2.fpm-gaps-2", c.nc.NewRespInbox(), nil)
			},
			check: consumerKept("FPM_2", "fpm-gaps-2")},
		"gap detector cannot pull from the trace writer's durable on a shard": {user: "gaps",
			subject: "$JS.API.CONSUMER.MSG.NEXT.FPM_0.fpm-trace-0", do: pull("$JS.API.CONSUMER.MSG.NEXT.FPM_0.fpm-trace-0")},
		"trace writer cannot pull from the gap detector's durable on a shard": {user: "trace",
			subject: "$JS.API.CONSUMER.MSG.NEXT.FPM_1.fpm-gaps-1", do: pull("$JS.API.CONSUMER.MSG.NEXT.FPM_1.fpm-gaps-1")},
		"reader cannot purge a shard": {user: "reader", subject: "$JS.API.STREAM.PURGE.FPM_1",
			do: func(c *opsClient) error {
				return c.nc.PublishRequest("$JS.API.STREAM.PURGE.FPM_1", c.nc.NewRespInbox(), nil)
			}},
		"bridge cannot declare a shard": {user: "bridge", subject: "$JS.API.STREAM.CREATE.FPM_3",
			do: func(c *opsClient) error {
				return c.nc.PublishRequest("$JS.API.STREAM.CREATE.FPM_3", c.nc.NewRespInbox(), []byte(`{"name":"FPM_3","subjects":["fpmin.3.>"]}`))
			},
			check: func(t *testing.T) {
				if _, err := op.js.Stream(t.Context(), "FPM_3"); err == nil {
					t.Fatal("stream FPM_3 exists after the bridge's create")
				}
			}},
	} {
		t.Run(name, func(t *testing.T) {
			c := srv.client(t, tc.user)
			err := tc.do(c)
			if msg, ok := c.refused(tc.subject, 5*time.Second); !ok {
				t.Fatalf("%s was not refused %s (call returned %v)", tc.user, tc.subject, err)
			} else {
				t.Logf("%s: %s", tc.user, msg)
			}
			eventually(t, 5*time.Second, func() error {
				for _, line := range srv.violations() {
					if strings.Contains(line, `"FPMBUS/user:`+tc.user+`"`) && strings.Contains(line, fmt.Sprintf("Subject %q", tc.subject)) {
						return nil
					}
				}
				return fmt.Errorf("the server did not log refusing %s to %s", tc.subject, tc.user)
			})
			if tc.check != nil {
				tc.check(t)
			}
		})
		out = append(out, [2]string{tc.user, tc.subject})
	}
	return out
}
