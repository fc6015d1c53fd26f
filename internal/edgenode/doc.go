// Package edgenode is the edge topology: a bridge publishes to a JetStream server on its own node,
// which stores to local disk in a JetStream domain of its own and is a leaf node of the central server,
// whose FPM and FPM_EVENTS streams source the edge's streams of the same names through a durable
// consumer at the edge. It holds the edge server's configuration (EdgeConfig, an
// internal/natsserver.ServerConfig with a leafnode remote), the source consumers at the edge
// (EnsureEdgeSourceConsumers) and the central streams' sources (AddEdgeSources); the invariants are
// in edge.go. The streams, subjects and headers that travel are streams/'s: a sourced message is the
// message the bridge published.
package edgenode
