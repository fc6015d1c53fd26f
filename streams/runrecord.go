package streams

import (
	"github.com/nats-io/nats.go/jetstream"
)

// Publisher runs agreed between redundant bridges. Every bridge subscribed to a publisher tags the
// publisher's current run with an epoch (header Fpm-Epoch, and part of a heartbeat's message id). So
// that two bridges on the same publisher tag a run alike, the epoch is not chosen by each bridge alone:
// the first bridge to see a run writes it to KV bucket BucketBridgeRuns with a compare-and-set
// (create, or update at the revision it read), and every other bridge adopts what is written there
// (bridge/runs.go states when).

// BucketBridgeRuns is the KV bucket of the publisher runs the bridges agreed on: one key per publisher
// key (BridgeRunKey), a JSON RunRecord of its newest run.
const BucketBridgeRuns = "FPM_BRIDGE_RUNS"

// RunRecord is the value of BridgeRunKey(Key) in BucketBridgeRuns: the newest run of a publisher as
// the bridge that saw it first recorded it.
type RunRecord struct {
	Key Key `json:"key"`
	// Epoch is the run's epoch (Unix ms): the receive time of the run's first message at the bridge
	// that created the record, raised above the previous record's epoch when needed, so a publisher's
	// epochs strictly increase.
	Epoch int64 `json:"epoch"`
	// FirstSeq is the sequence of the first message of the run that bridge received.
	FirstSeq uint64 `json:"first_seq"`
	// Restart: that bridge saw the sequence go back (the publisher restarted). Otherwise the record is
	// a bridge's first run of the publisher with no other bridge live: a run that may continue the
	// previous record's, which bridges that saw no restart keep their epoch for.
	Restart bool `json:"restart,omitempty"`
	// Bridge is the bridge that created the record.
	Bridge string `json:"bridge"`
}

// BridgeRunsBucket is the definition of BucketBridgeRuns (see bridgeBucket).
func (c Config) BridgeRunsBucket() jetstream.KeyValueConfig {
	return c.bridgeBucket(BucketBridgeRuns,
		"fpmbus bridge: per publisher key, the publisher run (epoch) the redundant bridges agreed on")
}

// BridgeRunKey is k's key in BucketBridgeRuns (see KVKeyTokens).
func BridgeRunKey(k Key) string { return KVKeyTokens(k) }
