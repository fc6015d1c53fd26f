package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/merge"
	"github.com/fpmbus/fpmbus/consumers/seal"
	"github.com/fpmbus/fpmbus/predict"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// What a leaked or buggy service credential could destroy or forge, through the real nats-server
// binary with the shipped single.conf and permissions.conf, and the real nats CLI: sealed history
// outlives the sealer's own credential, an earlier deployment's bucket is protected keeping its
// cells, and every service user is refused what it must not destroy or forge (ops/README.md lists the
// answers; one case each).

// natsAs runs the real nats CLI as user to completion (it may fail).
func (s *opsServer) natsAs(t *testing.T, user string, args ...string) (string, error) {
	t.Helper()
	return run(t, 20*time.Second, natsBin, append([]string{"--server", s.url, "--user", user, "--password", s.passwords[user]}, args...)...)
}

// refusalLogged reports whether the server logged refusing user subject (the embedded server's log, or
// the real nats-server processes' output).
func (s *opsServer) refusalLogged(user, subject string) bool {
	for _, line := range s.violations() {
		if strings.Contains(line, `/user:`+user+`"`) && strings.Contains(line, fmt.Sprintf("Subject %q", subject)) {
			return true
		}
	}
	return false
}

// startRealSingle runs the real nats-server on single.conf with permissions.conf.
func startRealSingle(t *testing.T) *opsServer {
	t.Helper()
	conf, url, passwords := opsSingleConf(t, t.TempDir())
	return startNatsServers(t, []string{conf}, []string{url}, passwords)
}

// cellRevisions reads every revision of key in FPM_DATASETS (as the operator, from the stream).
func cellRevisions(t *testing.T, js jetstream.JetStream, key string) []jetstream.Msg {
	t.Helper()
	return streamsMessages(t, js, streams.DatasetsStream, "$KV."+streams.BucketDatasets+"."+key)
}

// As user seal, `nats kv put`, `kv del` and `kv purge` on a sealed cell, and a put over its campaign
// record: the purge is refused by the server (no rollups on the protected bucket), so is a purge or a
// removal of the bucket's stream (permissions); the overwrite and the delete marker are stored as later
// revisions and change nothing: `datasets get|ls` (reader) and the predict service answer from the
// cell's first revision, the campaign record keeps its seal, and the sealer's audit at its next start
// reports each later revision as tampering. The operator cannot purge the bucket either (the server
// refuses: deny purge); removing it is the operator's alone.
func TestOpsSealedHistoryOutlivesTheSealersCredentialOnTheRealNatsServer(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	srv := startRealSingle(t)
	dir := t.TempDir()
	srv.run(t, "operator", "streams", "apply")
	op := srv.client(t, "operator")
	merger := srv.start(t, "merge", "merge", "merge", "--bench-output", filepath.Join(dir, "merged_{run_id}.json"))
	sealer := srv.start(t, "seal", "seal", "seal", "--seal-member-id", "s1")
	merger.waitOutput("consumer running", 30*time.Second)
	sealer.waitOutput("consumer running", 30*time.Second)
	profile := filepath.Join(dir, "profile.json")
	if err := os.WriteFile(profile, []byte(`{"schema_version":1,"name":"e2e-tamper","version":"1","hardware":"H200-SXM"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	srv.run(t, "operator", append([]string{"bench", "publish", "--profile", profile}, goldenRanks(t)...)...)

	kv, err := op.js.KeyValue(t.Context(), streams.BucketDatasets)
	if err != nil {
		t.Fatal(err)
	}
	var cell, campaign string
	eventually(t, 60*time.Second, func() error {
		keys, err := kv.Keys(t.Context())
		if err != nil {
			return err
		}
		for _, k := range keys {
			switch {
			case strings.HasPrefix(k, schemas.CellKeyPrefix):
				cell = k
			case strings.HasPrefix(k, schemas.CampaignKeyPrefix):
				campaign = k
			}
		}
		if cell == "" || campaign == "" {
			return errors.New("no sealed cell and campaign yet")
		}
		return nil
	})
	sealed := cellRevisions(t, op.js, cell)
	if len(sealed) != 1 {
		t.Fatalf("%s has %d revisions after its seal", cell, len(sealed))
	}
	var orig schemas.SealedCell
	if err := json.Unmarshal(sealed[0].Data(), &orig); err != nil {
		t.Fatal(err)
	}
	if err := sealer.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	// The sealer's credential, with the real nats CLI.
	forged := orig
	forged.Provenance.RunID = "forged-run"
	forged.Rows = forged.Rows[:1]
	body, _ := json.Marshal(forged)
	if out, err := srv.natsAs(t, "seal", "kv", "put", streams.BucketDatasets, cell, string(body)); err != nil {
		t.Fatalf("kv put as seal: %v\n%s", err, out)
	}
	if out, err := srv.natsAs(t, "seal", "kv", "del", "-f", streams.BucketDatasets, cell); err != nil {
		t.Fatalf("kv del as seal: %v\n%s", err, out)
	}
	out, err := srv.natsAs(t, "seal", "kv", "purge", "-f", streams.BucketDatasets, cell)
	if err == nil || !strings.Contains(out, "rollup not permitted") {
		t.Fatalf("kv purge as seal: %v, want the server's refusal (rollup not permitted):\n%s", err, out)
	}
	if out, err := srv.natsAs(t, "seal", "kv", "put", streams.BucketDatasets, campaign, `{"campaign_id":"forged"}`); err != nil {
		t.Fatalf("kv put over the campaign record as seal: %v\n%s", err, out)
	}
	sc := srv.client(t, "seal")
	for subject, try := range map[string]func(ctx context.Context) error{
		"$JS.API.STREAM.PURGE." + streams.DatasetsStream: func(ctx context.Context) error {
			s, err := sc.js.Stream(ctx, streams.DatasetsStream)
			if err == nil {
				err = s.Purge(ctx)
			}
			return err
		},
		"$JS.API.STREAM.DELETE." + streams.DatasetsStream: func(ctx context.Context) error {
			return sc.js.DeleteKeyValue(ctx, streams.BucketDatasets)
		},
		"$JS.API.STREAM.UPDATE." + streams.DatasetsStream: func(ctx context.Context) error {
			s, err := sc.js.Stream(ctx, streams.DatasetsStream)
			if err == nil {
				cfg := s.CachedInfo().Config
				cfg.MaxMsgsPerSubject = 1
				_, err = sc.js.UpdateStream(ctx, cfg)
			}
			return err
		},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		err := try(ctx)
		cancel()
		if _, ok := sc.refused(subject, 5*time.Second); !ok || !srv.refusalLogged("seal", subject) {
			t.Fatalf("the sealer's credential was not refused %s (%v)", subject, err)
		}
	}

	// Stored: the seal, the overwrite and the delete marker, in that order; nothing removed.
	revs := cellRevisions(t, op.js, cell)
	if len(revs) != 3 || string(revs[0].Data()) != string(sealed[0].Data()) || revs[2].Headers().Get("KV-Operation") != "DEL" {
		t.Fatalf("%s holds %d revisions, want the seal, the overwrite and the delete marker", cell, len(revs))
	}

	// Every reader reads the seal.
	var got struct {
		Revision uint64             `json:"revision"`
		Value    schemas.SealedCell `json:"value"`
		Ignored  []json.RawMessage  `json:"ignored_revisions"`
	}
	if err := json.Unmarshal([]byte(srv.run(t, "reader", "datasets", "get", cell)), &got); err != nil {
		t.Fatal(err)
	}
	if got.Value.Provenance.RunID != orig.Provenance.RunID || len(got.Value.Rows) != len(orig.Rows) || len(got.Ignored) != 2 {
		t.Fatalf("datasets get: run %q with %d rows, %d ignored revisions; want run %q, %d rows, 2 ignored",
			got.Value.Provenance.RunID, len(got.Value.Rows), len(got.Ignored), orig.Provenance.RunID, len(orig.Rows))
	}
	var camp struct {
		Value   schemas.Campaign  `json:"value"`
		Ignored []json.RawMessage `json:"ignored_revisions"`
	}
	if err := json.Unmarshal([]byte(srv.run(t, "reader", "datasets", "get", campaign)), &camp); err != nil {
		t.Fatal(err)
	}
	if camp.Value.State != schemas.CampaignComplete || camp.Value.Cells[0].RunID != orig.Provenance.RunID || len(camp.Ignored) != 1 {
		t.Fatalf("datasets get %s: %+v, %d ignored", campaign, camp.Value, len(camp.Ignored))
	}
	if ls := srv.run(t, "reader", "datasets", "ls"); !strings.Contains(ls, orig.Provenance.RunID) || strings.Contains(ls, "forged-run") ||
		!strings.Contains(ls, "2 revision(s) ignored: tampering") {
		t.Fatalf("datasets ls:\n%s", ls)
	}
	if h := srv.run(t, "reader", "datasets", "history", cell); strings.Count(h, "ignored (tampering") != 2 || !strings.Contains(h, orig.AttemptID) {
		t.Fatalf("datasets history does not mark the two later revisions:\n%s", h)
	}
	row := orig.Rows[len(orig.Rows)-1]
	a, pred := predictSealedRow(t, srv, cell, row)
	meta, err := revs[0].Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != predict.StatusMeasured || a.LatencyMS == nil || *a.LatencyMS != row.LatencyMS || a.Cell == nil || a.Cell.Revision != meta.Sequence.Stream {
		t.Fatalf("prediction %+v, want the sealed row's %v ms from revision %d", a, row.LatencyMS, meta.Sequence.Stream)
	}

	// The sealer's audit at its next start reports each later revision.
	sealer2 := srv.start(t, "seal", "seal 2", "seal", "--seal-member-id", "s2")
	sealer2.waitOutput("recorded seals audited", 30*time.Second)
	var types []string
	eventually(t, 30*time.Second, func() error {
		types = types[:0]
		for _, m := range streamsMessages(t, op.js, streams.StreamEvents, streams.DatasetEventWildcard) {
			var ev streams.DatasetEvent
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				return err
			}
			if ev.DetectedBy == "s2" {
				types = append(types, ev.Type+" "+ev.Cell+" "+ev.TamperedOp)
			}
		}
		if len(types) != 3 {
			return fmt.Errorf("dataset events of the audit: %v", types)
		}
		return nil
	})
	for _, want := range []string{streams.DatasetCellTampered + " " + cell + " PUT", streams.DatasetCellTampered + " " + cell + " DEL",
		streams.DatasetCampaignTampered + " " + campaign + " PUT"} {
		if !strings.Contains(strings.Join(types, "\n"), want) {
			t.Fatalf("no %q among the audit's events %v", want, types)
		}
	}
	if !strings.Contains(sealer2.Output(), "tampering") {
		t.Fatalf("the sealer does not log the tampering:\n%s", sealer2.Output())
	}

	// The operator: the server refuses a purge of the bucket to everyone; removing it is possible.
	if out, err := srv.natsAs(t, "operator", "stream", "purge", "-f", streams.DatasetsStream); err == nil {
		t.Fatalf("the operator purged the protected bucket:\n%s", out)
	}
	if n := len(cellRevisions(t, op.js, cell)); n != 3 {
		t.Fatalf("%d revisions after the operator's refused purge", n)
	}
	for _, p := range []*proc{sealer2, pred, merger} {
		if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := srv.natsAs(t, "operator", "kv", "del", "-f", streams.BucketDatasets); err != nil {
		t.Fatalf("the operator removing the bucket: %v\n%s", err, out)
	}
	if _, err := op.js.KeyValue(t.Context(), streams.BucketDatasets); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("after the operator removed it: %v", err)
	}
}

// As user seal, before anyone sealed the run's cell: `nats kv del` (a delete marker) and `nats kv put`
// of junk on the cell's key, and junk on its campaign record's key. Neither is a seal or a frozen plan,
// so neither pre-empts the honest one: the sealer that then handles the merged run seals the cell and
// freezes its plan on top of them; `datasets get|ls|history` (reader) and the predict service read
// the honest seal, and the sealer's audit at its next start reports each junk revision as tampering.
func TestOpsJunkStoredBeforeTheSealCannotPreemptItOnTheRealNatsServer(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	srv := startRealSingle(t)
	dir := t.TempDir()
	srv.run(t, "operator", "streams", "apply")
	op := srv.client(t, "operator")
	merged := filepath.Join(dir, "merged_{run_id}.json")
	merger := srv.start(t, "merge", "merge", "merge", "--bench-output", merged)
	merger.waitOutput("consumer running", 30*time.Second)
	profileBody := []byte(`{"schema_version":1,"name":"e2e-poison","version":"1","hardware":"H200-SXM"}`)
	profile := filepath.Join(dir, "profile.json")
	if err := os.WriteFile(profile, profileBody, 0o644); err != nil {
		t.Fatal(err)
	}
	srv.run(t, "operator", append([]string{"bench", "publish", "--profile", profile}, goldenRanks(t)...)...)

	// The keys the sealer will write, from the merged artefact (as the sealer computes them).
	const runID = "3f6a0c1e9b2d4e7f8a5b6c7d8e9f0a1b"
	waitSubjectCount(t, op.js, streams.StreamBench, streams.BenchMergedSubject(runID), 1)
	body, err := os.ReadFile(strings.ReplaceAll(merged, "{run_id}", runID))
	if err != nil {
		t.Fatal(err)
	}
	prof, err := schemas.DecodeProfile(bytes.NewReader(profileBody))
	if err != nil {
		t.Fatal(err)
	}
	ds, err := seal.FromMerged(body, schemas.SHA256Hex(body), prof)
	if err != nil || len(ds.Cells) == 0 {
		t.Fatalf("the run's dataset: %v", err)
	}
	cell, campaign := ds.Cells[0].Key, seal.CampaignKey(seal.CampaignIDFor(ds))

	// The sealer's credential, with the real nats CLI, before the seal.
	if out, err := srv.natsAs(t, "seal", "kv", "del", "-f", streams.BucketDatasets, cell); err != nil {
		t.Fatalf("kv del as seal: %v\n%s", err, out)
	}
	if out, err := srv.natsAs(t, "seal", "kv", "put", streams.BucketDatasets, cell, `{"sealed":"by nobody"}`); err != nil {
		t.Fatalf("kv put as seal: %v\n%s", err, out)
	}
	if out, err := srv.natsAs(t, "seal", "kv", "put", streams.BucketDatasets, campaign, "junk"); err != nil {
		t.Fatalf("kv put over the campaign record as seal: %v\n%s", err, out)
	}
	if got := srv.run(t, "reader", "datasets", "ls"); !strings.Contains(got, "no record") {
		t.Fatalf("datasets ls before the seal does not list the poisoned keys as holding no record:\n%s", got)
	}

	sealer := srv.start(t, "seal", "seal", "seal", "--seal-member-id", "s1")
	sealer.waitOutput("consumer running", 30*time.Second)
	var revs []jetstream.Msg
	eventually(t, 60*time.Second, func() error {
		if revs = cellRevisions(t, op.js, cell); len(revs) != 3 {
			return fmt.Errorf("%s holds %d revisions, want the delete marker, the junk and the seal", cell, len(revs))
		}
		return nil
	})
	var orig schemas.SealedCell
	if err := json.Unmarshal(revs[2].Data(), &orig); err != nil || orig.Provenance.RunID != runID || revs[0].Headers().Get("KV-Operation") != "DEL" {
		t.Fatalf("the third revision of %s is %s (%v), want the seal of run %s after a delete marker", cell, revs[2].Data(), err, runID)
	}
	if err := sealer.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sealer.Output(), "can never be sealed") || strings.Contains(sealer.Output(), "conflict") {
		t.Fatalf("the sealer took the junk for a seal:\n%s", sealer.Output())
	}

	// Every reader reads the honest seal.
	var got struct {
		Revision uint64             `json:"revision"`
		Value    schemas.SealedCell `json:"value"`
		Ignored  []json.RawMessage  `json:"ignored_revisions"`
	}
	if err := json.Unmarshal([]byte(srv.run(t, "reader", "datasets", "get", cell)), &got); err != nil {
		t.Fatal(err)
	}
	meta, err := revs[2].Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if got.Value.AttemptID != orig.AttemptID || got.Revision != meta.Sequence.Stream || len(got.Ignored) != 2 {
		t.Fatalf("datasets get: attempt %q at revision %d, %d ignored; want %q at %d, 2 ignored",
			got.Value.AttemptID, got.Revision, len(got.Ignored), orig.AttemptID, meta.Sequence.Stream)
	}
	var camp struct {
		Value   schemas.Campaign  `json:"value"`
		Ignored []json.RawMessage `json:"ignored_revisions"`
	}
	if err := json.Unmarshal([]byte(srv.run(t, "reader", "datasets", "get", campaign)), &camp); err != nil {
		t.Fatal(err)
	}
	if camp.Value.State != schemas.CampaignComplete || camp.Value.Cells[0].RunID != runID || len(camp.Ignored) != 1 {
		t.Fatalf("datasets get %s: %+v, %d ignored", campaign, camp.Value, len(camp.Ignored))
	}
	if ls := srv.run(t, "reader", "datasets", "ls"); !strings.Contains(ls, runID) || strings.Contains(ls, "no record") ||
		!strings.Contains(ls, "2 revision(s) ignored: tampering") {
		t.Fatalf("datasets ls:\n%s", ls)
	}
	if h := srv.run(t, "reader", "datasets", "history", cell); strings.Count(h, "ignored (tampering") != 2 || !strings.Contains(h, orig.AttemptID) {
		t.Fatalf("datasets history does not mark the two revisions before the seal:\n%s", h)
	}
	row := orig.Rows[len(orig.Rows)-1]
	a, pred := predictSealedRow(t, srv, cell, row)
	if a.Status != predict.StatusMeasured || a.LatencyMS == nil || *a.LatencyMS != row.LatencyMS || a.Cell == nil || a.Cell.Revision != meta.Sequence.Stream {
		t.Fatalf("prediction %+v, want the sealed row's %v ms from revision %d", a, row.LatencyMS, meta.Sequence.Stream)
	}

	// The sealer's audit at its next start reports each junk revision as tampering (the first
	// sealer's audit may have reported those of the cell already: one event per revision).
	sealer2 := srv.start(t, "seal", "seal 2", "seal", "--seal-member-id", "s2")
	sealer2.waitOutput("recorded seals audited", 30*time.Second)
	if !strings.Contains(sealer2.Output(), "tampered_revisions=3") {
		t.Fatalf("the audit does not report the three junk revisions:\n%s", sealer2.Output())
	}
	var types []string
	eventually(t, 30*time.Second, func() error {
		types = types[:0]
		for _, m := range streamsMessages(t, op.js, streams.StreamEvents, streams.DatasetEventWildcard) {
			var ev streams.DatasetEvent
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				return err
			}
			types = append(types, ev.Type+" "+ev.Cell+" "+ev.TamperedOp)
		}
		if len(types) != 3 {
			return fmt.Errorf("dataset events of the audits: %v", types)
		}
		return nil
	})
	for _, want := range []string{streams.DatasetCellTampered + " " + cell + " DEL", streams.DatasetCellTampered + " " + cell + " PUT",
		streams.DatasetCampaignTampered + " " + campaign + " PUT"} {
		if !strings.Contains(strings.Join(types, "\n"), want) {
			t.Fatalf("no %q among the audit's events %v", want, types)
		}
	}
	for _, p := range []*proc{sealer2, pred, merger} {
		if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// An earlier deployment's FPM_DATASETS (as nats.go creates a bucket: rollups allowed, 64 revisions a
// key): the sealer, as its least-privileged user, may not change the stream, so it logs at start what
// the bucket lacks and the command that adds it, and seals on; `fpmbus streams apply` as the operator
// protects the bucket keeping every cell (its plan lists each change, none destructive); from then on
// the sealer's credential cannot purge a cell, and a sealer started with the operator's credential
// finds nothing to change.
func TestOpsStreamsApplyProtectsAnEarlierDatasetsBucketOnTheRealNatsServer(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	srv := startRealSingle(t)
	op := srv.client(t, "operator")
	if out, err := srv.natsAs(t, "operator", "kv", "add", streams.BucketDatasets, "--history", "64"); err != nil {
		t.Fatalf("nats kv add: %v\n%s", err, out)
	}
	if out, err := srv.natsAs(t, "operator", "kv", "put", streams.BucketDatasets, "cell.earlier", `{"sealed":"before the upgrade"}`); err != nil {
		t.Fatalf("nats kv put: %v\n%s", err, out)
	}
	sealer := srv.start(t, "seal", "seal", "seal")
	sealer.waitOutput("FPM_DATASETS is not protected", 30*time.Second)
	sealer.waitOutput("consumer running", 30*time.Second)
	if !strings.Contains(sealer.Output(), "fpmbus streams apply") || !strings.Contains(sealer.Output(), "deny_purge false -> true") {
		t.Fatalf("the sealer's log does not name what is missing and the fix:\n%s", sealer.Output())
	}

	out := srv.run(t, "operator", "streams", "apply")
	for _, want := range []string{"KV_FPM_DATASETS deny_purge false -> true", "KV_FPM_DATASETS allow_rollup_hdrs true -> false",
		"KV_FPM_DATASETS discard_new_per_subject false -> true", "KV_FPM_DATASETS max_msgs_per_subject 64 -> 65536"} {
		if !strings.Contains(out, want) {
			t.Fatalf("streams apply does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "can delete stored messages") {
		t.Fatalf("streams apply calls the protection destructive:\n%s", out)
	}
	revs := cellRevisions(t, op.js, "cell.earlier")
	if len(revs) != 1 || string(revs[0].Data()) != `{"sealed":"before the upgrade"}` {
		t.Fatalf("the earlier cell after apply: %d revisions", len(revs))
	}
	if out, err := srv.natsAs(t, "seal", "kv", "purge", "-f", streams.BucketDatasets, "cell.earlier"); err == nil || !strings.Contains(out, "rollup not permitted") {
		t.Fatalf("kv purge as seal after apply: %v\n%s", err, out)
	}
	if again := srv.run(t, "operator", "streams", "apply"); !strings.Contains(again, "KV_FPM_DATASETS unchanged") {
		t.Fatalf("a second apply:\n%s", again)
	}
	if err := sealer.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	asOperator := srv.start(t, "operator", "seal as operator", "seal", "--seal-member-id", "op")
	asOperator.waitOutput("consumer running", 30*time.Second)
	if strings.Contains(asOperator.Output(), "not protected") || strings.Contains(asOperator.Output(), "FPM_DATASETS protected") {
		t.Fatalf("a sealer on the protected bucket changed or reported something:\n%s", asOperator.Output())
	}
	_ = asOperator.signal(syscall.SIGTERM, 30*time.Second)
}

// The system account's user, asked "what could it destroy or forge?": it still answers what fpmbus's
// runbooks ask of it (`nats server list`, `nats server report jetstream`, a monitoring request), and
// the real nats-server refuses it every control and the servers' own traffic: kicking a client or
// sending it into lame duck mode (the client stays connected, never reconnects), reloading the
// configuration, profiling the server, publishing or listening on the Raft subjects that replicate
// every stream. Each refusal is logged by the server, naming the user and the subject.
func TestOpsSysUserMonitorsButControlsNothingOnTheRealNatsServer(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	srv := startRealSingle(t)
	for _, args := range [][]string{{"server", "list"}, {"server", "report", "jetstream"}} {
		if out, err := srv.natsAs(t, "sys", args...); err != nil || !strings.Contains(out, "fpmbus-single") {
			t.Fatalf("nats %s as sys: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	sys := srv.client(t, "sys")
	if m, err := sys.nc.Request("$SYS.REQ.SERVER.PING.VARZ", nil, 5*time.Second); err != nil || !strings.Contains(string(m.Data), "fpmbus-single") {
		t.Fatalf("a monitoring request as sys: %v", err)
	}
	victim := srv.client(t, "operator")
	cid, err := victim.nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	id := victim.nc.ConnectedServerId()
	client, _ := json.Marshal(map[string]uint64{"cid": cid})
	for name, tc := range map[string]struct {
		subject string
		body    []byte
	}{
		"kick a client":                 {"$SYS.REQ.SERVER." + id + ".KICK", client},
		"send a client into lame duck":  {"$SYS.REQ.SERVER." + id + ".LDM", client},
		"reload the configuration":      {"$SYS.REQ.SERVER." + id + ".RELOAD", nil},
		"profile the server":            {"$SYS.REQ.SERVER." + id + ".PROFILEZ", []byte(`{"name":"cpu","duration":2000000000}`)},
		"forge the replication traffic": {"$NRG.AE.forged", []byte("forged")},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := sys.nc.Request(tc.subject, tc.body, time.Second); err == nil {
				t.Fatalf("%s answered the sys user", tc.subject)
			}
			if _, ok := sys.refused(tc.subject, 5*time.Second); !ok {
				t.Fatalf("sys was not refused %s", tc.subject)
			}
			eventually(t, 5*time.Second, func() error {
				if !srv.refusalLogged("sys", tc.subject) {
					return fmt.Errorf("the server did not log refusing %s to sys", tc.subject)
				}
				return nil
			})
		})
	}
	if _, err := sys.nc.SubscribeSync("$NRG.>"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() error {
		sys.mu.Lock()
		defer sys.mu.Unlock()
		for _, err := range sys.errs {
			if strings.Contains(err.Error(), `Permissions Violation for Subscription to "$NRG.>"`) && srv.refusalLogged("sys", "$NRG.>") {
				return nil
			}
		}
		return errors.New("sys was not refused a subscription to the replication traffic ($NRG.>)")
	})
	if !victim.nc.IsConnected() || victim.nc.Stats().Reconnects != 0 {
		t.Fatalf("the operator's connection was kicked: connected %v, %d reconnects", victim.nc.IsConnected(), victim.nc.Stats().Reconnects)
	}
	if out := srv.nodes[0].Output(); strings.Contains(out, "Reloaded") {
		t.Fatalf("the server reloaded its configuration at the sys user's request:\n%s", out)
	}
}

// The merger's credential may write FPM_BENCH_OBJECTS's metadata (it puts merged bodies there), where
// object stores allow rollups: as user merge, a leaked or buggy copy can hide a rank's body (an object
// delete: its metadata marked deleted; the purge of its chunks is refused) or replace it with another
// body (a put under the same name). Neither run is merged with what is left: each is rejected once
// (malformed_json, naming the object gone or the sha256 its body no longer matches), nothing is
// published or written for it. A hidden worker-probe body costs the run its probe replies, never
// gives it another's: the merger skips the batch, merges the run and records in its sidecar that no
// replies came.
func TestOpsMergersCredentialHidingAnArtefactBodyRejectsTheRunOnTheRealNatsServer(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	srv := startRealSingle(t)
	dir := t.TempDir()
	srv.run(t, "operator", "streams", "apply")
	op := srv.client(t, "operator")
	const deleted, replaced, probeless = "3f6a0c1e9b2d4e7f8a5b6c7d8e9f0a1b", "hiddenreplaced", "hiddenprobe"
	// Bodies over 1 KiB go to the object store.
	srv.run(t, "operator", append([]string{"bench", "publish", "--inline-max", "1024"}, goldenRanks(t)...)...)
	srv.run(t, "operator", append([]string{"bench", "publish", "--inline-max", "1024"}, goldenRunAs(t, replaced)...)...)
	srv.run(t, "operator", append([]string{"bench", "publish", "--inline-max", "1024",
		"--probe", "../consumers/merge/testdata/golden/protocol_4rank/probe.json"}, goldenRunAs(t, probeless)...)...)
	object := func(subject string) string {
		t.Helper()
		msgs := streamsMessages(t, op.js, streams.StreamBench, subject)
		if len(msgs) != 1 || msgs[0].Headers().Get(streams.HeaderBenchObject) == "" {
			t.Fatalf("%s: %d messages, want one naming its body's object", subject, len(msgs))
		}
		return msgs[0].Headers().Get(streams.HeaderBenchObject)
	}
	gone, swapped, other, probe := object(streams.BenchRankSubject(deleted, 1)), object(streams.BenchRankSubject(replaced, 2)),
		object(streams.BenchRankSubject(replaced, 1)), object(streams.BenchProbeSubject(probeless))

	// The merger's credential, before any merger reads the runs.
	mc := srv.client(t, "merge")
	ctx := t.Context()
	obs, err := mc.js.ObjectStore(ctx, streams.BenchObjectBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{gone, probe} {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = obs.Delete(dctx, name) // the metadata is marked deleted; the purge of the chunks is refused
		cancel()
	}
	body, err := obs.GetBytes(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.PutBytes(ctx, swapped, body); err != nil {
		t.Fatalf("put over a rank's body as merge: %v", err)
	}
	if _, ok := mc.refused("$JS.API.STREAM.PURGE.OBJ_"+streams.BenchObjectBucket, 5*time.Second); !ok {
		t.Fatal("the merger's credential was not refused purging the bodies' chunks")
	}
	opObs, err := op.js.ObjectStore(ctx, streams.BenchObjectBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{gone, probe} {
		if _, err := opObs.GetInfo(ctx, name); !errors.Is(err, jetstream.ErrObjectNotFound) {
			t.Fatalf("%s after the merger's delete: %v, want it hidden", name, err)
		}
	}

	out := filepath.Join(dir, "merged_{run_id}.json")
	merger := srv.start(t, "merge", "merge", "merge", "--bench-output", out)
	merger.waitOutput("consumer running", 30*time.Second)
	outcome := func(run string) merge.Event {
		t.Helper()
		var ev merge.Event
		eventually(t, 60*time.Second, func() error {
			msgs := streamsMessages(t, op.js, streams.StreamEvents, streams.BenchOutcomeSubject(run))
			if len(msgs) == 0 {
				return fmt.Errorf("no outcome of run %s yet", run)
			}
			return json.Unmarshal(msgs[0].Data(), &ev)
		})
		return ev
	}
	for run, want := range map[string]string{deleted: "object not found", replaced: "does not match its sha256"} {
		ev := outcome(run)
		if ev.Event != merge.EventRejected || ev.Rule != merge.RuleMalformedJSON || !strings.Contains(ev.Detail, want) {
			t.Fatalf("run %s: %+v, want it rejected (malformed_json: %s)", run, ev, want)
		}
		if n := len(streamsMessages(t, op.js, streams.StreamBench, streams.BenchMergedSubject(run))); n != 0 {
			t.Fatalf("run %s: %d merged artefacts published", run, n)
		}
		if _, err := os.Stat(strings.ReplaceAll(out, "{run_id}", run)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("run %s: merged file: %v", run, err)
		}
	}
	ev := outcome(probeless)
	if ev.Event != merge.EventMerged || ev.SidecarPath == "" {
		t.Fatalf("run %s with its probe replies hidden: %+v, want it merged", probeless, ev)
	}
	sidecar, err := os.ReadFile(ev.SidecarPath)
	if err != nil || !strings.Contains(string(sidecar), merge.NoRepliesReason) {
		t.Fatalf("the sidecar of run %s does not record that no probe replies came (%v):\n%s", probeless, err, sidecar)
	}
	if !strings.Contains(merger.Output(), "skipping unreadable probe replies") {
		t.Fatalf("the merger does not say it skipped the hidden probe replies:\n%s", merger.Output())
	}
	if err := merger.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// Every service credential of permissions.conf, asked "what could it destroy or forge?": each answer
// that permissions close is refused here by the real nats-server, the client's error and the server's
// log name the refused subject, and nothing changed (ops/README.md lists every answer, these and the
// ones only the consumers' checks or the bucket's protection close).
func TestOpsEveryCredentialIsRefusedWhatItCouldDestroyOrForgeOnTheRealNatsServer(t *testing.T) {
	t.Parallel()
	srv := startRealSingle(t)
	srv.run(t, "operator", "streams", "apply")
	op := srv.client(t, "operator")
	ctx := t.Context()
	// pub publishes subject as the client; api calls a JetStream API (a refused one has no answer).
	pub := func(subject string) func(c *opsClient) error {
		return func(c *opsClient) error {
			if err := c.nc.Publish(subject, []byte(`{"forged":true}`)); err != nil {
				return err
			}
			return c.nc.Flush()
		}
	}
	api := func(f func(ctx context.Context, js jetstream.JetStream) error) func(c *opsClient) error {
		return func(c *opsClient) error {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			return f(rctx, c.js)
		}
	}
	nothingOn := func(stream, filter string) func(t *testing.T) {
		return func(t *testing.T) {
			if n := len(streamsMessages(t, op.js, stream, filter)); n != 0 {
				t.Fatalf("%s holds %d messages on %s", stream, n, filter)
			}
		}
	}
	stillThere := func(stream string) func(t *testing.T) {
		return func(t *testing.T) {
			if _, err := op.js.Stream(ctx, stream); err != nil {
				t.Fatalf("%s: %v", stream, err)
			}
		}
	}
	for name, tc := range map[string]struct {
		user, subject string
		do            func(c *opsClient) error
		check         func(t *testing.T)
	}{
		"the bridge cannot forge a consumer's dead letter": {user: "bridge", subject: "fpmevents.deadletter.consumer.trace",
			do: pub("fpmevents.deadletter.consumer.trace"), check: nothingOn(streams.StreamEvents, "fpmevents.deadletter.consumer.>")},
		"the bridge cannot forge a rank artefact": {user: "bridge", subject: "fpmbench.rank.forged.0",
			do: pub("fpmbench.rank.forged.0"), check: nothingOn(streams.StreamBench, ">")},
		"the trace writer cannot forge a gap event": {user: "trace", subject: "fpmevents.gap.dynamo.backend.forged.0",
			do: pub("fpmevents.gap.dynamo.backend.forged.0"), check: nothingOn(streams.StreamEvents, "fpmevents.gap.>")},
		"the trace writer cannot delete the gap detector's durable": {user: "trace", subject: "$JS.API.CONSUMER.DELETE.FPM.fpm-gaps",
			do: api(func(ctx context.Context, js jetstream.JetStream) error {
				return js.DeleteConsumer(ctx, streams.StreamFPM, "fpm-gaps")
			})},
		"the gap detector cannot forge a drop marker": {user: "gaps", subject: "fpmevents.drop.dynamo.backend.forged.0",
			do: pub("fpmevents.drop.dynamo.backend.forged.0"), check: nothingOn(streams.StreamEvents, "fpmevents.drop.>")},
		"the gap detector cannot delete the trace writer's durable": {user: "gaps", subject: "$JS.API.CONSUMER.DELETE.FPM.fpm-trace",
			do: api(func(ctx context.Context, js jetstream.JetStream) error {
				return js.DeleteConsumer(ctx, streams.StreamFPM, "fpm-trace")
			})},
		"the merger cannot seal a cell": {user: "merge", subject: "$KV.FPM_DATASETS.cell.forged",
			do: pub("$KV.FPM_DATASETS.cell.forged"), check: nothingOn(streams.DatasetsStream, ">")},
		"the merger cannot forge a rank artefact": {user: "merge", subject: "fpmbench.rank.forged.0",
			do: pub("fpmbench.rank.forged.0"), check: nothingOn(streams.StreamBench, ">")},
		"the merger cannot purge FPM_BENCH": {user: "merge", subject: "$JS.API.STREAM.PURGE.FPM_BENCH",
			do: api(func(ctx context.Context, js jetstream.JetStream) error {
				s, err := js.Stream(ctx, streams.StreamBench)
				if err == nil {
					err = s.Purge(ctx)
				}
				return err
			}), check: stillThere(streams.StreamBench)},
		"the sealer cannot forge a merged artefact": {user: "seal", subject: "fpmbench.merged.forged",
			do: pub("fpmbench.merged.forged"), check: nothingOn(streams.StreamBench, ">")},
		"the sealer cannot write an artefact body": {user: "seal", subject: "$O.FPM_BENCH_OBJECTS.M.Zm9yZ2Vk",
			do: pub("$O.FPM_BENCH_OBJECTS.M.Zm9yZ2Vk")},
		"the sealer cannot forge a run's outcome": {user: "seal", subject: "fpmevents.bench.forged.outcome",
			do: pub("fpmevents.bench.forged.outcome"), check: nothingOn(streams.StreamEvents, "fpmevents.bench.>")},
		"the predict service cannot seal a cell": {user: "predict", subject: "$KV.FPM_DATASETS.cell.forged",
			do: pub("$KV.FPM_DATASETS.cell.forged"), check: nothingOn(streams.DatasetsStream, ">")},
		"the predict service cannot forge a dataset event": {user: "predict", subject: "fpmevents.dataset.forged",
			do: pub("fpmevents.dataset.forged"), check: nothingOn(streams.StreamEvents, streams.DatasetEventWildcard)},
		"the reader cannot seal a cell": {user: "reader", subject: "$KV.FPM_DATASETS.cell.forged",
			do: pub("$KV.FPM_DATASETS.cell.forged"), check: nothingOn(streams.DatasetsStream, ">")},
		"the reader cannot delete the sealer's durable": {user: "reader", subject: "$JS.API.CONSUMER.DELETE.FPM_BENCH.fpmbus-seal",
			do: api(func(ctx context.Context, js jetstream.JetStream) error {
				return js.DeleteConsumer(ctx, streams.StreamBench, "fpmbus-seal")
			})},
		"the reader cannot remove FPM_DATASETS": {user: "reader", subject: "$JS.API.STREAM.DELETE.KV_FPM_DATASETS",
			do: api(func(ctx context.Context, js jetstream.JetStream) error {
				return js.DeleteKeyValue(ctx, streams.BucketDatasets)
			}),
			check: stillThere(streams.DatasetsStream)},
	} {
		t.Run(name, func(t *testing.T) {
			c := srv.client(t, tc.user)
			err := tc.do(c)
			if _, ok := c.refused(tc.subject, 5*time.Second); !ok {
				t.Fatalf("%s was not refused %s (call returned %v)", tc.user, tc.subject, err)
			}
			eventually(t, 5*time.Second, func() error {
				if !srv.refusalLogged(tc.user, tc.subject) {
					return fmt.Errorf("the server did not log refusing %s to %s", tc.subject, tc.user)
				}
				return nil
			})
			if tc.check != nil {
				tc.check(t)
			}
		})
	}
}

// predictSealedRow starts the predict service as its own user and asks it, as the reader, for the
// latency of row's step in cell (the row's own latency left out of the query); it returns the answer
// and the service's process.
func predictSealedRow(t *testing.T, srv *opsServer, cell string, row schemas.Row) (predict.Answer, *proc) {
	t.Helper()
	pred := srv.start(t, "predict", "predict", "predict-service")
	pred.waitOutput("predict service ready", 30*time.Second)
	step, _ := json.Marshal(row)
	var stepMap map[string]any
	_ = json.Unmarshal(step, &stepMap)
	delete(stepMap, "latency_ms")
	query, _ := json.Marshal(map[string]any{"key": cell, "step": stepMap})
	var a predict.Answer
	if err := json.Unmarshal([]byte(srv.nats(t, "reader", "req", "--raw", "fpmpredict.predict", string(query))), &a); err != nil {
		t.Fatal(err)
	}
	return a, pred
}
