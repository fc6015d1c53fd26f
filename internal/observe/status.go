package observe

import (
	"time"

	"github.com/fpmbus/fpmbus/internal/rungroup"
)

// schema names the version of /status.json. A field is added without changing it; a field removed or
// changed in meaning changes it.
const schema = "fpmbus.status.v1"

// Status is /status.json: everything one process knows about itself. Sections a process does not have
// (a standalone trace writer has no bridge) are omitted. Counters are since the component's start
// (a restarted component counts from zero); rates are over the sampler's window.
type Status struct {
	Schema  string    `json:"schema"`
	Process string    `json:"process"`
	Time    time.Time `json:"time"`
	Started time.Time `json:"started"`
	// WindowSeconds is the span the rates and quantiles are computed over (at most Options.Window;
	// shorter right after the start).
	WindowSeconds float64 `json:"window_seconds"`
	// Health is the top-level status of /healthz: ok, degraded or unavailable.
	Health     string            `json:"health"`
	Components []rungroup.Status `json:"components"`
	Durability *durability       `json:"durability,omitempty"`
	Store      *store            `json:"store,omitempty"`
	Bridge     *bridge           `json:"bridge,omitempty"`
	Consumers  []consumer        `json:"consumers,omitempty"`
	// JetStream is JetStream's own view of the durable consumers on fpmbus's streams.
	JetStream  *JetStream  `json:"jetstream,omitempty"`
	Merge      *merge      `json:"merge,omitempty"`
	Seal       *seal       `json:"seal,omitempty"`
	Predict    *predict    `json:"predict,omitempty"`
	Publishers *publishers `json:"publishers,omitempty"`
}

// durability is the durability policy in force.
type durability struct {
	// Sync is the embedded server's fsync policy: "always" (before every ack) or the background
	// interval ("2m0s"); empty where the process does not run the server (it is the server's
	// sync_interval).
	Sync    string         `json:"sync,omitempty"`
	Streams []streamPolicy `json:"streams,omitempty"`
	// Error says why the streams could not be read (permissions, server away).
	Error string `json:"error,omitempty"`
}

// streamPolicy is one stream's storage and limits, as the server has them.
type streamPolicy struct {
	Name              string  `json:"name"`
	Storage           string  `json:"storage"` // file or memory
	Replicas          int     `json:"replicas"`
	MaxBytes          int64   `json:"max_bytes"` // -1: unlimited
	MaxAgeSeconds     float64 `json:"max_age_seconds"`
	Discard           string  `json:"discard"` // old or new
	DuplicatesSeconds float64 `json:"duplicates_seconds"`
	Messages          uint64  `json:"messages"`
	Bytes             uint64  `json:"bytes"`
}

// store is the embedded server's JetStream store (fpmbus up).
type store struct {
	OK         bool              `json:"ok"`
	FreeBytes  float64           `json:"free_bytes"`
	Recoveries float64           `json:"recoveries"`
	Faults     map[string]uint64 `json:"faults"` // by state: disk_full, write_error, lost
}

// bridge is the bridge's part: what it received and stored, its buffer and its losses.
type bridge struct {
	Component string `json:"component"`
	// Ranks counts the ZMQ endpoints it reads.
	Ranks         int     `json:"ranks"`
	Received      uint64  `json:"received"`
	Published     uint64  `json:"published"`
	ReceivedRate  float64 `json:"received_per_second"`
	PublishedRate float64 `json:"published_per_second"`
	Duplicates    uint64  `json:"duplicates"`
	SeqMismatch   uint64  `json:"seq_mismatch"`
	// Invalid counts multiparts that are not a valid FPM, by stage; Dropped valid FPMs dropped, by
	// reason (each in a drop marker).
	Invalid         map[string]uint64 `json:"invalid"`
	Dropped         map[string]uint64 `json:"dropped"`
	DeadLetters     uint64            `json:"dead_letters"`
	DeadLettersLost uint64            `json:"dead_letters_lost"`
	DropMarkers     uint64            `json:"drop_markers"`
	LostAfterAck    uint64            `json:"lost_after_ack"`
	Buffered        float64           `json:"buffered"`
	BufferedHigh    float64           `json:"buffered_high"`
	// MaxBuffer and MaxInFlight are its limits (0: not known to this process).
	MaxBuffer   int     `json:"max_buffer,omitempty"`
	InFlight    float64 `json:"in_flight"`
	MaxInFlight int     `json:"max_in_flight,omitempty"`
	// PublishLatency is receive-to-ack time over the window (all time when nothing was acked in it).
	PublishLatency latencyQuantiles `json:"publish_latency_seconds"`
	Batches        uint64           `json:"batches"`
	BatchesFailed  uint64           `json:"batches_failed"`
	// LossyRanks are the ranks with a drop, an invalid multipart or a dead letter, most first (at most
	// 100).
	LossyRanks []bridgeRank `json:"lossy_ranks"`
}

// latencyQuantiles are the quantiles of a latency, in seconds (bucket upper bounds: an estimate at most one bucket high).
type latencyQuantiles struct {
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Count uint64  `json:"count"`
}

// bridgeRank is one rank's losses at the bridge.
type bridgeRank struct {
	Rank        string `json:"rank"`
	Received    uint64 `json:"received"`
	Published   uint64 `json:"published"`
	Dropped     uint64 `json:"dropped"`
	Invalid     uint64 `json:"invalid"`
	DeadLetters uint64 `json:"dead_letters"`
}

// consumer is one durable consumer's runner (fpmbus_consumer_*{consumer}).
type consumer struct {
	Name      string `json:"name"`
	Component string `json:"component,omitempty"`
	// Lag is what the server still holds for it (the partition last delivered from).
	Lag         float64 `json:"lag"`
	Delivered   uint64  `json:"delivered"`
	Acked       uint64  `json:"acked"`
	AckRate     float64 `json:"acked_per_second"`
	Redelivered uint64  `json:"redelivered"`
	// DeadLetters are messages it rejected or that went over the delivery limit.
	DeadLetters   uint64 `json:"dead_letters"`
	RetentionLost uint64 `json:"retention_lost"`
	// Restarts of its component in the run group (fpmbus up).
	Restarts int `json:"restarts"`
	// HandleP99 is the 99th percentile of one batch's handling time over the window, in seconds.
	HandleP99 float64 `json:"handle_p99_seconds"`
}

// JetStream lists the durable consumers of fpmbus's streams as the server sees them.
type JetStream struct {
	Consumers []jetStreamConsumer `json:"consumers"`
	Error     string              `json:"error,omitempty"`
	// Read is when the server answered.
	Read time.Time `json:"read"`
	// streams is the streams' policy, shown under Durability.
	streams []streamPolicy
}

// jetStreamConsumer is one durable consumer's ConsumerInfo.
type jetStreamConsumer struct {
	Stream    string `json:"stream"`
	Name      string `json:"name"`
	Component string `json:"component,omitempty"`
	// Pending is what it has not been delivered yet; AckPending what it holds unacknowledged, up to
	// MaxAckPending; Redelivered the messages delivered more than once and not yet acknowledged.
	Pending       uint64 `json:"pending"`
	AckPending    int    `json:"ack_pending"`
	MaxAckPending int    `json:"max_ack_pending"`
	Redelivered   int    `json:"redelivered"`
	Waiting       int    `json:"waiting"`
}

// merge is the benchmark merger's part.
type merge struct {
	// Runs counts the runs with an outcome, by outcome (bench_merged, bench_rejected,
	// bench_incomplete, bench_conflict).
	Runs map[string]uint64 `json:"runs"`
}

// seal is the dataset sealer's part.
type seal struct {
	// Runs counts merged artefacts with a final outcome (sealed, partial, rejected); Cells the cells
	// of their reports by state.
	Runs  map[string]uint64 `json:"runs"`
	Cells map[string]uint64 `json:"cells"`
	// From the sealer's last audit.
	CellsMissing  float64 `json:"cells_missing"`
	CellsReplaced float64 `json:"cells_replaced"`
	TamperedCells float64 `json:"tampered_cells"`
	Unprotected   bool    `json:"bucket_unprotected"`
}

// predict is the predict service's part.
type predict struct {
	// Answers counts the answers by status (measured, interpolated, composed, refused); Errors the
	// error replies by code.
	Answers    map[string]uint64 `json:"answers"`
	AnswerRate float64           `json:"answers_per_second"`
	Errors     map[string]uint64 `json:"errors"`
	Cells      float64           `json:"cells"`
	Revision   float64           `json:"revision"`
	Queued     float64           `json:"queued"`
}

// publishers is the gap detector's view of every publisher key, filtered, sorted and paged as the
// request asked (Query), grouped by worker.
type publishers struct {
	// Group is the detector group whose state is shown.
	Group string `json:"group"`
	// Error says why the state could not be read (no detector has run yet, permissions).
	Error   string           `json:"error,omitempty"`
	Summary publisherSummary `json:"summary"`
	Query   query            `json:"query"`
	// Matched counts the publishers the filter kept; Groups the worker groups they form; Shown the
	// groups on this page (query.Offset, query.Limit).
	Matched    int               `json:"matched"`
	GroupCount int               `json:"group_count"`
	Groups     []publisherGroup  `json:"groups"`
	Shown      int               `json:"shown"`
	Causes     []string          `json:"causes"`
	Totals     map[string]uint64 `json:"missing_by_cause"`
}

// publisherSummary counts every publisher (before the filter).
type publisherSummary struct {
	Total     int `json:"total"`
	Flowing   int `json:"flowing"`
	WithGaps  int `json:"with_gaps"`
	Stale     int `json:"stale"`
	Restarted int `json:"restarted"`
	// Missing is the FPMs reported missing, every cause.
	Missing uint64  `json:"missing"`
	Rate    float64 `json:"rate"`
}

// publisherGroup is one worker's ranks (namespace, component, worker_id).
type publisherGroup struct {
	Namespace string      `json:"namespace"`
	Component string      `json:"component"`
	WorkerID  string      `json:"worker_id"`
	Ranks     int         `json:"ranks"`
	Flowing   int         `json:"flowing"`
	WithGaps  int         `json:"with_gaps"`
	Stale     int         `json:"stale"`
	Missing   uint64      `json:"missing"`
	Rate      float64     `json:"rate"`
	Rows      []Publisher `json:"rows"`
}

// Publisher is one publisher key's state in the gap detector.
type Publisher struct {
	Namespace string `json:"namespace"`
	Component string `json:"component"`
	WorkerID  string `json:"worker_id"`
	DPRank    int    `json:"dp_rank"`
	// State is live, stale or restarted (the gap detector's condition).
	State string `json:"state"`
	// Flowing: live and heard from within the detector's stale period.
	Flowing bool `json:"flowing"`
	// Rate is FPMs per second (heartbeats included) over the last checkpoints seen.
	Rate     float64   `json:"rate"`
	LastSeen time.Time `json:"last_seen"`
	Messages uint64    `json:"messages"`
	// Gaps and Missing by cause (bridge_drop, zmq_drop, publisher_restart, stale, late_start).
	Gaps         map[string]uint64 `json:"gaps"`
	Missing      map[string]uint64 `json:"missing"`
	GapsTotal    uint64            `json:"gaps_total"`
	MissingTotal uint64            `json:"missing_total"`
	PendingGaps  int               `json:"pending_gaps"`
	Restarts     uint64            `json:"restarts"`
}
