package benchstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/internal/benchstore"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

var testProfile, _ = json.Marshal(schemas.CollectionProfile{SchemaVersion: schemas.DatasetSchemaVersion, Name: "default",
	Version: "1", Hardware: "H200-SXM"})

// PublishBench stores the profile, then the probe replies, then the ranks, each with its subject,
// headers and id; a rank file that changed after it was validated stops the publication there.
func TestPublishBenchOrderHeadersAndIds(t *testing.T) {
	env := natsservertest.Start(t).JS
	ctx := context.Background()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rank0 := write("r.json", "rank zero bytes")
	rank1 := write("r_dp1.json", strings.Repeat("rank one bytes ", 100)) // above the inline limit below
	probe := write("probe.json", "probe bytes")
	store := benchstore.NewBenchStore(env, 64, streams.DefaultConfig())
	pub := benchstore.BenchPublication{
		Profile: testProfile,
		Probes:  []benchstore.BenchProbe{{Path: probe, File: "/abs/probe.json"}},
		ProbeRun: func(file string, data []byte) (string, error) {
			if file != "/abs/probe.json" || string(data) != "probe bytes" {
				t.Errorf("ProbeRun(%q, %q)", file, data)
			}
			return "run-1", nil
		},
		Ranks: []benchstore.BenchRank{
			{BenchRankArtefact: benchstore.BenchRankArtefact{RunID: "run-1", Rank: 0, DPSize: 2, File: "/abs/r.json"}, Path: rank0, Digest: schemas.SHA256Hex([]byte("rank zero bytes"))},
			{BenchRankArtefact: benchstore.BenchRankArtefact{RunID: "run-1", Rank: 1, DPSize: 2, File: "/abs/r_dp1.json"}, Path: rank1, Digest: schemas.SHA256Hex([]byte(strings.Repeat("rank one bytes ", 100)))},
		},
	}
	var got []string
	err := store.PublishBench(ctx, pub, func(p benchstore.BenchPublished) {
		got = append(got, p.Subject)
		if p.Ack == nil || p.Ack.Duplicate {
			t.Errorf("%s: ack %+v", p.Subject, p.Ack)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"fpmbench.profile.run-1", "fpmbench.probe.run-1", "fpmbench.rank.run-1.0", "fpmbench.rank.run-1.1"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
	bench, err := env.Stream(ctx, streams.StreamBench)
	if err != nil {
		t.Fatal(err)
	}
	for seq, w := range map[uint64]map[string]string{
		1: {streams.HeaderBenchRun: "run-1", streams.HeaderMsgID: streams.BenchProfileMsgID("run-1", schemas.SHA256Hex(testProfile))},
		2: {streams.HeaderBenchKind: "probe", streams.HeaderBenchRun: "run-1", streams.HeaderBenchFile: "/abs/probe.json", streams.HeaderBenchSize: "11",
			streams.HeaderMsgID: "fpmbench:probe:run-1:" + schemas.SHA256Hex([]byte("probe bytes")), streams.HeaderBenchObject: ""},
		3: {streams.HeaderBenchKind: "rank", streams.HeaderBenchRank: "0", streams.HeaderBenchDPSize: "2", streams.HeaderBenchFile: "/abs/r.json",
			streams.HeaderBenchSHA256: pub.Ranks[0].Digest, streams.HeaderMsgID: "fpmbench:rank:run-1:0:" + pub.Ranks[0].Digest, streams.HeaderBenchObject: ""},
		4: {streams.HeaderBenchKind: "rank", streams.HeaderBenchRank: "1", streams.HeaderBenchSize: "1500",
			streams.HeaderBenchObject: "rank/run-1/1/" + pub.Ranks[1].Digest},
	} {
		m, err := bench.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		for h, v := range w {
			if m.Header.Get(h) != v {
				t.Errorf("seq %d (%s): %s = %q, want %q", seq, m.Subject, h, m.Header.Get(h), v)
			}
		}
		body, err := store.Fetch(ctx, m.Header, m.Data)
		if seq > 1 && (err != nil || len(body) == 0) {
			t.Errorf("seq %d: body %q, %v", seq, body, err)
		}
	}

	// Publishing again stores nothing new (every id is a duplicate)...
	if err := store.PublishBench(ctx, pub, func(p benchstore.BenchPublished) {
		if !p.Ack.Duplicate {
			t.Errorf("%s stored twice", p.Subject)
		}
	}); err != nil {
		t.Fatal(err)
	}
	// ...and a rank that changed after validation stops the publication before it.
	if err := os.WriteFile(rank0, []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	pub.Profile, pub.Probes = nil, nil
	err = store.PublishBench(ctx, pub, func(p benchstore.BenchPublished) { t.Errorf("published %s", p.Subject) })
	if err == nil || !strings.Contains(err.Error(), "changed while it was being published") {
		t.Fatalf("err %v", err)
	}
}

func TestFetchRefusesABodyThatDoesNotMatchItsDigest(t *testing.T) {
	env := natsservertest.Start(t).JS
	ctx := context.Background()
	store := benchstore.NewBenchStore(env, 0, streams.DefaultConfig())
	ack, err := store.PublishProbe(ctx, "r", "/p.json", []byte("replies"))
	if err != nil {
		t.Fatal(err)
	}
	bench, _ := env.Stream(ctx, streams.StreamBench)
	m, err := bench.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Fetch(ctx, m.Header, []byte("other")); !errors.Is(err, benchstore.ErrDigestMismatch) {
		t.Fatalf("err %v, want benchstore.ErrDigestMismatch", err)
	}
}

// A profile that does not decode is refused before anything of the run is published.
func TestPublishBenchRefusesABadProfileFirst(t *testing.T) {
	env := natsservertest.Start(t)
	ctx := context.Background()
	rank := filepath.Join(t.TempDir(), "r.json")
	if err := os.WriteFile(rank, []byte("rank"), 0o644); err != nil {
		t.Fatal(err)
	}
	store := benchstore.NewBenchStore(env.JS, 0, streams.DefaultConfig())
	err := store.PublishBench(ctx, benchstore.BenchPublication{
		Profile: []byte(`{"name":"no schema version"}`),
		Ranks: []benchstore.BenchRank{{BenchRankArtefact: benchstore.BenchRankArtefact{RunID: "r", DPSize: 1},
			Path: rank, Digest: schemas.SHA256Hex([]byte("rank"))}},
	}, nil)
	if err == nil || !strings.Contains(err.Error(), "profile: schema_version 0") {
		t.Fatalf("err %v, want the profile's error", err)
	}
	if n := len(natsservertest.Messages(t, env.JS, streams.StreamBench, streams.BenchWildcard)); n != 0 {
		t.Fatalf("%d messages published after a bad profile", n)
	}
}
