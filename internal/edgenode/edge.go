package edgenode

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/streams"
)

// The edge topology: a bridge publishes to a JetStream server on its own node (an edge), which stores
// to local disk in a JetStream domain of its own and is a NATS leaf node of the central server. The
// central FPM and FPM_EVENTS streams source the edge's streams of the same names over the leafnode
// connection, each through a durable consumer at the edge (EdgeSourceConsumer). While the central server
// or the link is away the edge keeps storing; when the link is back, each source resumes after the last
// edge sequence the central stream holds, so an outage costs the edge's disk, not data.
//
// Invariants:
//   - The edge's streams are fpmbus's own (Config.All, created by the bridge's Ensure on the edge), so
//     a sourced message is the message the bridge published: same subject, same headers (Nats-Msg-Id,
//     Fpm-*), same body. The central server adds only Nats-Stream-Source, drops the Nats-Batch-*
//     headers of the atomic batch the edge stored it in (sourcing never batches), and applies its
//     duplicate window to the sourced Nats-Msg-Id exactly as to a direct publish.
//   - Nothing reaches the central streams twice: the leafnode remote neither exports nor imports
//     fpmbus's subjects (edgeDeniedSubjects), so an FPM published at the edge is not also delivered to
//     the central stream's subject listener, and a central publisher's FPM is not stored at the edge
//     (and sourced back).
//   - The source consumer's position at the edge never passes what the central server stored: the
//     central server acknowledges by its flow-control replies, which it sends once the messages before
//     them are stored (on a cluster, replicated). After a reset to that position it drops what it
//     already holds, so a resumed source neither skips nor repeats — as long as the central server
//     keeps what it acknowledged (sync_interval: always, ops/nats/central-leaf.conf).
//   - The central server must run JetStream in a domain (DefaultCentralDomain unless told): a leaf
//     with a domain of its own reaches the central JetStream API only as $JS.<domain>.API.

// Defaults of the edge topology.
const (
	// DefaultCentralDomain is the JetStream domain of the central server (ops/nats/central-leaf.conf).
	DefaultCentralDomain = "central"
	// edgeDomainPrefix starts every edge's JetStream domain: edge-<node>.
	edgeDomainPrefix = "edge-"
	// DefaultEdgeListen is the edge server's client address: loopback, next to the standard port, so
	// the `nats` CLI reaches it with --server nats://127.0.0.1:4223 on the node.
	DefaultEdgeListen = "127.0.0.1:4223"
)

// EdgeSourcedStreams are the central streams that source the edge streams of the same name: the FPMs
// and the bridge's events (drop markers and dead letters), which the gap detector and the operators
// read centrally.
var EdgeSourcedStreams = []string{streams.StreamFPM, streams.StreamEvents}

// edgeDeniedSubjects are the subjects the leafnode remote of an edge neither exports nor imports (see
// the package invariants): fpmbus's streams and its KV and object buckets, which exist at both ends.
var edgeDeniedSubjects = []string{streams.FPMWildcard, streams.EventsWildcard, streams.BenchWildcard, "$KV.>", "$O.>"}

// ErrBadEdge is wrapped by every error EdgeConfig.Validate returns.
var ErrBadEdge = errors.New("streams: bad edge configuration")

// EdgeConfig configures the node-local JetStream server of the edge topology.
type EdgeConfig struct {
	// Node names this edge; its JetStream domain is edgeDomainPrefix+Node. Required: a letter, digit,
	// '-' or '_' only (a domain is a subject token).
	Node string
	// StoreDir is the edge's JetStream store on local disk. Required.
	StoreDir string
	// Remotes are the central server's leafnode URLs (nats-leaf://host:7422, comma-separated; user
	// info in them authenticates the leaf). Required.
	Remotes string
	// Credentials is a .creds file the leaf presents to the central server; empty: none.
	Credentials string
	// Listen is the edge server's client address (default DefaultEdgeListen; port 0 picks one).
	Listen string
	// CentralDomain is the central server's JetStream domain (default DefaultCentralDomain).
	CentralDomain string
	// Sync is the edge server's fsync policy (zero: DefaultSync).
	Sync natsserver.SyncPolicy
	// Logging routes the edge server's log lines to stderr.
	Logging bool
}

// Domain is the edge's JetStream domain.
func (c EdgeConfig) Domain() string { return edgeDomainPrefix + c.Node }

// CentralDomainOrDefault is the central server's JetStream domain, defaulted.
func (c EdgeConfig) CentralDomainOrDefault() string {
	if c.CentralDomain == "" {
		return DefaultCentralDomain
	}
	return c.CentralDomain
}

// Validate reports the first setting that cannot work, wrapped in ErrBadEdge.
func (c EdgeConfig) Validate() error {
	bad := invalid.Reporter(ErrBadEdge)
	switch {
	case c.Node == "":
		return bad("no node name (it names the edge's JetStream domain %s<node>)", edgeDomainPrefix)
	case !domainToken(c.Node):
		return bad("node name %q: want letters, digits, '-' and '_' only", c.Node)
	case !domainToken(c.CentralDomainOrDefault()):
		return bad("central domain %q: want letters, digits, '-' and '_' only", c.CentralDomainOrDefault())
	case c.Domain() == c.CentralDomainOrDefault():
		return bad("edge domain %q is the central domain", c.Domain())
	case c.StoreDir == "":
		return bad("no store directory for the edge's JetStream")
	}
	if _, err := c.remoteURLs(); err != nil {
		return bad("%v", err)
	}
	return nil
}

// domainToken reports whether s can be a JetStream domain, which is a subject token.
func domainToken(s string) bool { return streams.ValidName(s, math.MaxInt) }

func (c EdgeConfig) remoteURLs() ([]*url.URL, error) {
	var out []*url.URL
	for _, raw := range strings.Split(c.Remotes, ",") {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("leafnode remote %q is not a URL (want nats-leaf://host:7422)", natsconn.RedactURL(raw))
		}
		switch u.Scheme {
		case "nats-leaf", "nats", "tls", "ws", "wss":
		default:
			return nil, fmt.Errorf("leafnode remote %q: scheme %q (want nats-leaf, nats, tls, ws or wss)", natsconn.RedactURL(raw), u.Scheme)
		}
		out = append(out, u)
	}
	if len(out) == 0 {
		return nil, errors.New("no leafnode remote (the central server's nats-leaf://host:7422)")
	}
	return out, nil
}

// ServerConfig is the embedded server of the edge: JetStream in the edge's domain on StoreDir, a
// leafnode remote to the central server that denies fpmbus's subjects both ways.
func (c EdgeConfig) ServerConfig() (natsserver.ServerConfig, error) {
	if err := c.Validate(); err != nil {
		return natsserver.ServerConfig{}, err
	}
	urls, _ := c.remoteURLs()
	listen := c.Listen
	if listen == "" {
		listen = DefaultEdgeListen
	}
	base := &server.Options{
		JetStreamDomain: c.Domain(),
		LeafNode: server.LeafNodeOpts{
			// Reconnect quickly once the central server is back: the backlog grows meanwhile.
			ReconnectInterval: time.Second,
			Remotes: []*server.RemoteLeafOpts{{
				URLs:        urls,
				Credentials: c.Credentials,
				DenyExports: slices.Clone(edgeDeniedSubjects),
				DenyImports: slices.Clone(edgeDeniedSubjects),
			}},
		},
	}
	return natsserver.ServerConfig{Listen: listen, StoreDir: c.StoreDir, Name: c.Domain(), Base: base, Sync: c.Sync,
		Logging: c.Logging}, nil
}

// EdgeSourceConsumer is the durable consumer through which the central server sources each edge stream
// of EdgeSourcedStreams. It lives at the edge, on the edge's stream, and keeps the central server's
// position there (its ack floor advances with each flow-control reply, which the central server sends
// once it has stored what came before). Sourcing through it rather than through an ephemeral consumer
// is what makes catching up after an outage start within seconds of the link's return: the central
// server asks an ephemeral source again only 30 s (plus a backoff) after a request that went
// unanswered — the leaf reconnects a moment after the central server restarts, so its first request
// usually is — while a durable source waits 5 s for the answer and then asks again as soon as the
// consumer's heartbeat arrives over the restored link.
const EdgeSourceConsumer = "fpmbus-central"

// edgeDeliverRoot starts the subject an edge's source consumer delivers to:
// fpmsource.<edge domain>.<stream>, one per edge and stream, since every edge delivers to the same
// central server.
const edgeDeliverRoot = "fpmsource"

// edgeSourceMaxAckPending is how many messages the source consumer sends ahead of the central server's
// flow-control reply, which acknowledges everything before it. It must be set (nats-server refuses a
// flow-control-acknowledged consumer without it). It does not pace a catch-up: on one host, windows of
// 1,000, 5,000 and 20,000 drained a backlog of 150,000 equally fast within the noise (the central
// store is the bottleneck). After a reset the central server drops what it already holds, so a window
// sent again costs transfer, not duplicates.
const edgeSourceMaxAckPending = 20000

// edgeDeliverSubject is the subject the source consumer of stream at the edge of domain delivers to.
func edgeDeliverSubject(domain, stream string) string {
	return edgeDeliverRoot + "." + domain + "." + stream
}

// edgeSourceConsumerConfig is the source consumer of stream at the edge of domain: durable, push to
// edgeDeliverSubject, acknowledged by flow control (the only acknowledgement a sourcing server sends),
// from the stream's first message.
func edgeSourceConsumerConfig(domain, stream string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        EdgeSourceConsumer,
		Description:    "the central " + stream + " stream sources this edge's " + stream + " through it",
		DeliverSubject: edgeDeliverSubject(domain, stream),
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckFlowControlPolicy,
		FlowControl:    true,
		// nats-server requires exactly 1 s for a consumer acknowledged by flow control.
		IdleHeartbeat: time.Second,
		MaxAckPending: edgeSourceMaxAckPending,
	}
}

// EnsureEdgeSourceConsumers creates (or brings back to edgeSourceConsumerConfig) the source consumer
// of every stream of EdgeSourcedStreams at the edge of domain, through edge (the edge's own
// JetStream). The streams must exist. It is idempotent: an unchanged consumer keeps its position.
func EnsureEdgeSourceConsumers(ctx context.Context, edge jetstream.JetStream, domain string) error {
	for _, name := range EdgeSourcedStreams {
		if _, err := edge.CreateOrUpdatePushConsumer(ctx, name, edgeSourceConsumerConfig(domain, name)); err != nil {
			return fmt.Errorf("streams: edge %s: source consumer %s on %s: %w", domain, EdgeSourceConsumer, name, err)
		}
	}
	return nil
}

// edgeSource is how a central stream sources the edge stream of the same name in domain: through the
// edge's API prefix and its durable source consumer (EnsureEdgeSourceConsumers creates it).
func edgeSource(stream, domain string) *jetstream.StreamSource {
	return &jetstream.StreamSource{Name: stream,
		External: &jetstream.ExternalStream{APIPrefix: "$JS." + domain + ".API"},
		Consumer: &jetstream.StreamConsumerSource{Name: EdgeSourceConsumer, DeliverSubject: edgeDeliverSubject(domain, stream)}}
}

// edgeSourceOf returns sc's source of want's stream through want's API prefix (durable or not), or nil.
func edgeSourceOf(sc jetstream.StreamConfig, want *jetstream.StreamSource) *jetstream.StreamSource {
	for _, s := range sc.Sources {
		if s != nil && s.Name == want.Name && s.External != nil && s.External.APIPrefix == want.External.APIPrefix {
			return s
		}
	}
	return nil
}

// EdgeSourcing is what AddEdgeSources found and did.
type EdgeSourcing struct {
	// Added are the central streams that source the edge now and did not before.
	Added []string
	// NotDurable are the central streams that already source the edge without its durable source
	// consumer (a source declared by hand or by an earlier fpmbus). They are left alone: the central
	// server keeps a source's position per source definition, so a durable source put in its place would
	// start over at the edge's first message and store it all a second time. Such a source loses nothing,
	// but catching up after an outage can wait 30 s and more (see EdgeSourceConsumer).
	NotDurable []string
}

// AddEdgeSources makes every central stream of EdgeSourcedStreams source its namesake in the edge
// domain, through central (the central server's JetStream, for example jetstream.NewWithDomain over
// the edge's own connection), with the durable source consumer (EnsureEdgeSourceConsumers first). It is
// idempotent: a source of the edge already there is left alone (EdgeSourcing says which are not
// durable). The stream's other settings (and other edges' sources) are sent back as they are. Two
// edges adding themselves at the same moment can overwrite each other's update, so each update is read
// back and repeated until the source is there.
func AddEdgeSources(ctx context.Context, central jetstream.JetStream, domain string) (EdgeSourcing, error) {
	var out EdgeSourcing
	for _, name := range EdgeSourcedStreams {
		want := edgeSource(name, domain)
		for attempt := 0; ; attempt++ {
			s, err := central.Stream(ctx, name)
			if err != nil {
				return out, fmt.Errorf("streams: central stream %s (to source %s from %s): %w", name, name, domain, err)
			}
			sc := s.CachedInfo().Config
			if have := edgeSourceOf(sc, want); have != nil {
				if attempt == 0 && (have.Consumer == nil || *have.Consumer != *want.Consumer) {
					out.NotDurable = append(out.NotDurable, name)
				}
				break
			}
			if attempt == 5 {
				return out, fmt.Errorf("streams: central stream %s: the source %s from %s did not stay after %d updates", name, name, domain, attempt)
			}
			sc.Sources = append(sc.Sources, want)
			if _, err := central.UpdateStream(ctx, sc); err != nil {
				return out, fmt.Errorf("streams: central stream %s: add source %s from %s: %w", name, name, domain, err)
			}
			if attempt == 0 {
				out.Added = append(out.Added, name)
			}
		}
	}
	return out, nil
}
