package streams

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/nats-io/nats.go"
)

// DropMarkerEvent is the Fpm-Event header value and "type" field of a drop marker.
const DropMarkerEvent = "drop_marker"

// errBadDropMarker is wrapped by every error of ParseDropMarker.
var errBadDropMarker = errors.New("streams: bad drop marker")

// DropMarker is the bridge's statement that it dropped the contiguous sequences FirstSeq..LastSeq
// (Count of them) of one publisher run (Epoch) for Reason (buffer_full, shutdown, rejected). The bridge
// publishes it (Msg) on DropMarkerSubject(Key), possibly after the FPMs that follow the dropped ones;
// gap detectors read it (ParseDropMarker) to tell a bridge drop from an upstream one.
type DropMarker struct {
	Type              string `json:"type"` // always DropMarkerEvent
	Key               Key    `json:"key"`
	Epoch             int64  `json:"epoch"`
	FirstSeq          uint64 `json:"first_seq"`
	LastSeq           uint64 `json:"last_seq"`
	Count             uint64 `json:"count"`
	Reason            string `json:"reason"`
	Bridge            string `json:"bridge"`
	FirstReceivedAtMs int64  `json:"first_received_at_ms"`
	LastReceivedAtMs  int64  `json:"last_received_at_ms"`
	// RunStart is how the run (Epoch) began, as Fpm-Run-Start says on its FPMs (RunStartRestart,
	// RunStartReconnect; "" for a bridge's first run of the publisher, which it cannot tell from the
	// run going on). It matters where a marker is all that is stored of a run.
	RunStart string `json:"run_start,omitempty"`
}

// Msg is the marker's message: subject DropMarkerSubject(m.Key), the marker as JSON, Nats-Msg-Id
// dropMarkerMsgID (derived from the range, so publishing a marker twice stores it once), Fpm-Event,
// Fpm-Bridge and Fpm-Epoch.
func (m *DropMarker) Msg() *nats.Msg {
	return bridgeEventMsg(DropMarkerSubject(m.Key), dropMarkerMsgID(m.Key, m.Epoch, m.FirstSeq, m.LastSeq, m.Reason),
		DropMarkerEvent, m.Bridge, m.Epoch, m)
}

// rawDropMarker has pointers so that a missing field is told from a zero one.
type rawDropMarker struct {
	Type *string `json:"type"`
	Key  *struct {
		Namespace *string `json:"namespace"`
		Component *string `json:"component"`
		WorkerID  *string `json:"worker_id"`
		DPRank    *int64  `json:"dp_rank"`
	} `json:"key"`
	Epoch             *int64  `json:"epoch"`
	FirstSeq          *uint64 `json:"first_seq"`
	LastSeq           *uint64 `json:"last_seq"`
	Count             *uint64 `json:"count"`
	Reason            *string `json:"reason"`
	Bridge            *string `json:"bridge"`
	FirstReceivedAtMs *int64  `json:"first_received_at_ms"`
	LastReceivedAtMs  *int64  `json:"last_received_at_ms"`
	RunStart          *string `json:"run_start"`
}

// ParseDropMarker decodes and checks one drop marker body. Unknown fields are ignored (a newer bridge
// may add some); a missing or inconsistent required field is an error wrapping errBadDropMarker that
// names it. The bridge id and the receive times are optional.
func ParseDropMarker(data []byte) (DropMarker, error) {
	var r rawDropMarker
	if err := json.Unmarshal(data, &r); err != nil {
		return DropMarker{}, fmt.Errorf("%w: %v", errBadDropMarker, err)
	}
	bad := func(format string, args ...any) (DropMarker, error) {
		return DropMarker{}, fmt.Errorf("%w: "+format, append([]any{errBadDropMarker}, args...)...)
	}
	switch {
	case r.Type == nil:
		return bad("missing type")
	case *r.Type != DropMarkerEvent:
		return bad("type %q, want %q", *r.Type, DropMarkerEvent)
	case r.Key == nil:
		return bad("missing key")
	case r.Key.Namespace == nil || r.Key.Component == nil || r.Key.WorkerID == nil || r.Key.DPRank == nil:
		return bad("key needs namespace, component, worker_id and dp_rank")
	case *r.Key.DPRank < 0 || *r.Key.DPRank > math.MaxInt32:
		return bad("key dp_rank %d out of range", *r.Key.DPRank)
	case r.Epoch == nil:
		return bad("missing epoch")
	case *r.Epoch < 0:
		return bad("epoch %d is negative", *r.Epoch)
	case r.FirstSeq == nil || r.LastSeq == nil:
		return bad("missing first_seq or last_seq")
	case *r.FirstSeq > *r.LastSeq:
		return bad("first_seq %d > last_seq %d", *r.FirstSeq, *r.LastSeq)
	case *r.LastSeq-*r.FirstSeq == math.MaxUint64:
		return bad("range %d..%d is too large to count", *r.FirstSeq, *r.LastSeq)
	case r.Count != nil && *r.Count != *r.LastSeq-*r.FirstSeq+1:
		return bad("count %d does not match first_seq %d..last_seq %d", *r.Count, *r.FirstSeq, *r.LastSeq)
	case r.Reason == nil || *r.Reason == "":
		return bad("missing reason")
	case r.RunStart != nil && *r.RunStart != "" && *r.RunStart != RunStartRestart && *r.RunStart != RunStartReconnect:
		return bad("run_start %q, want %q, %q or none", *r.RunStart, RunStartRestart, RunStartReconnect)
	}
	m := DropMarker{
		Type:     *r.Type,
		Key:      Key{Namespace: *r.Key.Namespace, Component: *r.Key.Component, WorkerID: *r.Key.WorkerID, DPRank: int(*r.Key.DPRank)},
		Epoch:    *r.Epoch,
		FirstSeq: *r.FirstSeq,
		LastSeq:  *r.LastSeq,
		Count:    *r.LastSeq - *r.FirstSeq + 1,
		Reason:   *r.Reason,
	}
	if r.Bridge != nil {
		m.Bridge = *r.Bridge
	}
	if r.FirstReceivedAtMs != nil {
		m.FirstReceivedAtMs = *r.FirstReceivedAtMs
	}
	if r.LastReceivedAtMs != nil {
		m.LastReceivedAtMs = *r.LastReceivedAtMs
	}
	if r.RunStart != nil {
		m.RunStart = *r.RunStart
	}
	return m, nil
}
