package edgenode_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/edgenode"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

func TestEdgeConfigValidate(t *testing.T) {
	good := edgenode.EdgeConfig{Node: "gpu-01", StoreDir: "/var/lib/fpmbus/edge", Remotes: "nats-leaf://central:7422"}
	for name, tc := range map[string]struct {
		mutate func(*edgenode.EdgeConfig)
		ok     bool
	}{
		"complete":                      {func(*edgenode.EdgeConfig) {}, true},
		"two remotes":                   {func(c *edgenode.EdgeConfig) { c.Remotes = "nats-leaf://a:7422, tls://b:7422" }, true},
		"no node":                       {func(c *edgenode.EdgeConfig) { c.Node = "" }, false},
		"node with a dot":               {func(c *edgenode.EdgeConfig) { c.Node = "gpu.01" }, false},
		"no store":                      {func(c *edgenode.EdgeConfig) { c.StoreDir = "" }, false},
		"no remote":                     {func(c *edgenode.EdgeConfig) { c.Remotes = " , " }, false},
		"remote of another scheme":      {func(c *edgenode.EdgeConfig) { c.Remotes = "http://central:7422" }, false},
		"remote without host":           {func(c *edgenode.EdgeConfig) { c.Remotes = "central" }, false},
		"edge domain is central domain": {func(c *edgenode.EdgeConfig) { c.Node, c.CentralDomain = "x", "edge-x" }, false},
	} {
		t.Run(name, func(t *testing.T) {
			c := good
			tc.mutate(&c)
			err := c.Validate()
			if tc.ok && err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if !tc.ok && !errors.Is(err, edgenode.ErrBadEdge) {
				t.Fatalf("Validate: %v, want ErrBadEdge", err)
			}
		})
	}
}

// The shipped central configuration loads with nats-server's own loader and has what the edges need:
// a JetStream domain equal to the bridge's default central domain and a leafnode listener.
func TestCentralLeafConfLoads(t *testing.T) {
	o, err := natsserver.LoadServerConfig("../../ops/nats/central-leaf.conf")
	if err != nil {
		t.Fatal(err)
	}
	if o.JetStreamDomain != edgenode.DefaultCentralDomain || o.LeafNode.Port != 7422 || !o.SyncAlways {
		t.Fatalf("central-leaf.conf: domain %q, leafnode port %d, sync always %v; want %q, 7422, true",
			o.JetStreamDomain, o.LeafNode.Port, o.SyncAlways, edgenode.DefaultCentralDomain)
	}
}

// An edge adds itself as a durable source of the central FPM and FPM_EVENTS streams once, however often
// it asks; a second edge's source is added beside it; an edge that the central streams already source
// without the durable consumer is reported and not sourced a second time; and what an edge stores
// arrives centrally once, while the leafnode carries none of fpmbus's subjects directly.
func TestAddEdgeSourcesIdempotent(t *testing.T) {
	t.Cleanup(func() { natsservertest.WaitSourceSetups(t, 40*time.Second) }) // runs after the servers stopped
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leafPort := natsservertest.FreePort(t)
	central, err := natsserver.StartServer(natsserver.ServerConfig{Listen: "127.0.0.1:0", StoreDir: t.TempDir(), Name: "central",
		Base: &server.Options{JetStreamDomain: edgenode.DefaultCentralDomain, LeafNode: server.LeafNodeOpts{Host: "127.0.0.1", Port: leafPort}},
		Sync: natsserver.SyncPolicy{Interval: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = central.Shutdown(context.Background()) })
	cnc, err := nats.Connect(central.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cnc.Close)
	cjs, _ := jetstream.New(cnc)
	if err := streams.Apply(ctx, cjs, streams.DefaultConfig()); err != nil {
		t.Fatal(err)
	}

	var edgeJS []jetstream.JetStream
	var central1 jetstream.JetStream
	for _, node := range []string{"a", "b", "c"} {
		ec := edgenode.EdgeConfig{Node: node, StoreDir: t.TempDir(), Remotes: "nats-leaf://127.0.0.1:" + strconv.Itoa(leafPort),
			Listen: "127.0.0.1:0", Sync: natsserver.SyncPolicy{Interval: time.Second}}
		sc, err := ec.ServerConfig()
		if err != nil {
			t.Fatal(err)
		}
		edge, err := natsserver.StartServer(sc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = edge.Shutdown(context.Background()) })
		enc, err := nats.Connect(edge.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(enc.Close)
		ejs, _ := jetstream.New(enc)
		if err := streams.Apply(ctx, ejs, streams.DefaultConfig()); err != nil {
			t.Fatal(err)
		}
		if err := edgenode.EnsureEdgeSourceConsumers(ctx, ejs, ec.Domain()); err != nil {
			t.Fatal(err)
		}
		if err := edgenode.EnsureEdgeSourceConsumers(ctx, ejs, ec.Domain()); err != nil {
			t.Fatalf("edge %s: second EnsureEdgeSourceConsumers: %v", node, err)
		}
		edgeJS = append(edgeJS, ejs)
		viaLeaf, _ := jetstream.NewWithDomain(enc, edgenode.DefaultCentralDomain)
		if node == "a" {
			central1 = viaLeaf
		}
		// The leaf connects in the background: the first attempts may find no central API.
		deadline := time.Now().Add(20 * time.Second)
		if node == "c" {
			// Sourced as an earlier fpmbus did: through an ephemeral consumer.
			for err = addEphemeralSources(ctx, viaLeaf, ec.Domain()); err != nil; err = addEphemeralSources(ctx, viaLeaf, ec.Domain()) {
				if time.Now().After(deadline) {
					t.Fatalf("edge %s: %v", node, err)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		var res edgenode.EdgeSourcing
		for res, err = edgenode.AddEdgeSources(ctx, viaLeaf, ec.Domain()); err != nil; res, err = edgenode.AddEdgeSources(ctx, viaLeaf, ec.Domain()) {
			if time.Now().After(deadline) {
				t.Fatalf("edge %s: %v", node, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		want := edgenode.EdgeSourcing{Added: edgenode.EdgeSourcedStreams}
		if node == "c" {
			want = edgenode.EdgeSourcing{NotDurable: edgenode.EdgeSourcedStreams}
		}
		if !slices.Equal(res.Added, want.Added) || !slices.Equal(res.NotDurable, want.NotDurable) {
			t.Fatalf("edge %s: first AddEdgeSources: %+v, want %+v", node, res, want)
		}
	}
	res, err := edgenode.AddEdgeSources(ctx, central1, "edge-a")
	if err != nil || len(res.Added) != 0 || len(res.NotDurable) != 0 {
		t.Fatalf("second AddEdgeSources for edge-a: %+v, err %v; want nothing changed", res, err)
	}
	for _, name := range edgenode.EdgeSourcedStreams {
		s, err := cjs.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		var sources []string
		for _, src := range s.CachedInfo().Config.Sources {
			via := "ephemeral"
			if src.Consumer != nil {
				via = src.Consumer.Name + " " + src.Consumer.DeliverSubject
			}
			sources = append(sources, src.Name+" "+src.External.APIPrefix+" "+via)
		}
		want := []string{name + " $JS.edge-a.API fpmbus-central fpmsource.edge-a." + name,
			name + " $JS.edge-b.API fpmbus-central fpmsource.edge-b." + name,
			name + " $JS.edge-c.API ephemeral"}
		if !slices.Equal(sources, want) {
			t.Fatalf("central %s sources %v, want %v", name, sources, want)
		}
	}

	// Two FPMs stored at edge a (one with a message id, one without, which the central duplicate window
	// could not hide if the leafnode also delivered it directly) reach the central stream once each.
	h := nats.Header{}
	h.Set(streams.HeaderMsgID, "edge-test-1")
	for _, m := range []*nats.Msg{{Subject: "fpm.dynamo.backend.w.0", Header: h, Data: []byte(`{"n":1}`)},
		{Subject: "fpm.dynamo.backend.w.0", Data: []byte(`{"n":2}`)}} {
		if _, err := edgeJS[0].PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := cjs.Stream(ctx, streams.StreamFPM)
		if err != nil {
			t.Fatal(err)
		}
		if s.CachedInfo().State.Msgs >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the edge's FPMs did not reach the central stream in 20s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // a direct delivery over the leafnode would have arrived by now
	s, _ := cjs.Stream(ctx, streams.StreamFPM)
	if st := s.CachedInfo().State; st.Msgs != 2 {
		t.Fatalf("central FPM holds %d messages for two stored at the edge", st.Msgs)
	}
	first, err := s.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if first.Subject != "fpm.dynamo.backend.w.0" || first.Header.Get(streams.HeaderMsgID) != "edge-test-1" || string(first.Data) != `{"n":1}` {
		t.Fatalf("central FPM #1: %s id %q body %s", first.Subject, first.Header.Get(streams.HeaderMsgID), first.Data)
	}
}

// addEphemeralSources makes the central streams source the edge of domain through an ephemeral
// consumer, as fpmbus did before the durable source consumer.
func addEphemeralSources(ctx context.Context, central jetstream.JetStream, domain string) error {
	for _, name := range edgenode.EdgeSourcedStreams {
		s, err := central.Stream(ctx, name)
		if err != nil {
			return err
		}
		sc := s.CachedInfo().Config
		sc.Sources = append(sc.Sources, &jetstream.StreamSource{Name: name, External: &jetstream.ExternalStream{APIPrefix: "$JS." + domain + ".API"}})
		if _, err := central.UpdateStream(ctx, sc); err != nil {
			return err
		}
	}
	return nil
}
