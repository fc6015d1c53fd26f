package streams

import (
	"slices"

	"github.com/nats-io/nats.go/jetstream"
)

// Publisher runs agreed between redundant bridges. Every bridge subscribed to a publisher tags the
// publisher's current run with an epoch (header Fpm-Epoch, and part of every FPM's message id). So
// that two bridges on the same publisher tag a run alike, the epoch is not chosen by each bridge alone:
// the first bridge to see a run adds it to the publisher's record in KV bucket BucketBridgeRuns with a
// compare-and-set (create, or update at the revision it read), and every other bridge that can show
// the run is its own adopts it (bridge/runs.go states the rule and its limits).

// BucketBridgeRuns is the KV bucket of the publisher runs the bridges agreed on: one key per publisher
// key (BridgeRunKey), a JSON RunRecord of its recent runs.
const BucketBridgeRuns = "FPM_BRIDGE_RUNS"

// maxRecordedRuns is how many of a publisher's most recent runs its RunRecord keeps: enough for a
// bridge that lags the others by several publisher restarts to find the runs it is behind on (within
// the FPM stream's duplicate window, beyond which redundant bridges no longer share one copy anyway).
const maxRecordedRuns = 16

// Run start kinds (RunEntry.Start and header Fpm-Run-Start): how the bridge that recorded a run saw it
// begin. A bridge's first run of a publisher since it started has none: it cannot know whether the
// publisher restarted while it was not running, and takes the run for the one before it going on.
const (
	// RunStartRestart: the sequence went back (the publisher restarted: a new run for certain).
	RunStartRestart = "restart"
	// RunStartReconnect: the bridge's connection to the publisher ended and a new one began, and the
	// sequence went on forward: the publisher may have restarted while the bridge was disconnected
	// (its new run's first numbers never reached the bridge), or only the connection broke.
	RunStartReconnect = "reconnect"
)

// RunEntry is one publisher run as the bridge that recorded it first saw it.
type RunEntry struct {
	// Epoch is the run's epoch (Unix ms): the recording bridge's receive time of its first message of
	// the run, raised above the epochs of the runs before it (and kept below those after it) when
	// needed, so that a publisher's epochs increase with its runs.
	Epoch int64 `json:"epoch"`
	// FirstSeq, FirstDigest (streams.PayloadDigest) and FirstReceivedAtMs identify the first message of
	// the run that bridge received: another bridge that received the same bytes at that number at about
	// that time knows the run is its own.
	FirstSeq          uint64 `json:"first_seq"`
	FirstDigest       string `json:"first_digest,omitempty"`
	FirstReceivedAtMs int64  `json:"first_received_at_ms,omitempty"`
	// Start is how the run began as that bridge saw it (RunStart*), "" for the bridge's first run of
	// the publisher since it started.
	Start string `json:"start,omitempty"`
	// Bridge is the bridge that recorded the run.
	Bridge string `json:"bridge"`
}

// RunRecord is the value of BridgeRunKey(Key) in BucketBridgeRuns: the publisher's most recent runs.
type RunRecord struct {
	Key Key `json:"key"`
	// Epoch, FirstSeq, Restart and Bridge describe the newest run (Runs' last), as records written
	// before Runs existed did.
	Epoch    int64  `json:"epoch"`
	FirstSeq uint64 `json:"first_seq"`
	Restart  bool   `json:"restart,omitempty"`
	Bridge   string `json:"bridge"`
	// Runs are the most recent runs (at most maxRecordedRuns), oldest first, epochs strictly
	// increasing.
	Runs []RunEntry `json:"runs,omitempty"`
}

// Entries returns r's runs, oldest first: Runs, or for a record written before Runs existed its one
// run.
func (r *RunRecord) Entries() []RunEntry {
	if len(r.Runs) > 0 || r.Epoch == 0 {
		return r.Runs
	}
	e := RunEntry{Epoch: r.Epoch, FirstSeq: r.FirstSeq, Bridge: r.Bridge}
	if r.Restart {
		e.Start = RunStartRestart
	}
	return []RunEntry{e}
}

// Add inserts run e in epoch order (its epoch must differ from every recorded one), keeps the newest
// maxRecordedRuns and sets the newest run's fields.
func (r *RunRecord) Add(e RunEntry) {
	runs := slices.Clone(r.Entries())
	i, _ := slices.BinarySearchFunc(runs, e.Epoch, func(x RunEntry, epoch int64) int {
		switch {
		case x.Epoch < epoch:
			return -1
		case x.Epoch > epoch:
			return 1
		}
		return 0
	})
	runs = slices.Insert(runs, i, e)
	if over := len(runs) - maxRecordedRuns; over > 0 {
		runs = runs[over:]
	}
	r.Runs = runs
	last := runs[len(runs)-1]
	r.Epoch, r.FirstSeq, r.Restart, r.Bridge = last.Epoch, last.FirstSeq, last.Start == RunStartRestart, last.Bridge
}

// BridgeRunsBucket is the definition of BucketBridgeRuns (see bridgeBucket).
func (c Config) BridgeRunsBucket() jetstream.KeyValueConfig {
	return c.bridgeBucket(BucketBridgeRuns,
		"fpmbus bridge: per publisher key, the publisher run (epoch) the redundant bridges agreed on")
}

// BridgeRunKey is k's key in BucketBridgeRuns (see KVKeyTokens).
func BridgeRunKey(k Key) string { return KVKeyTokens(k) }
