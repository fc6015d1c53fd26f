package gaps

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// DropMarkerEvent is the Fpm-Event header value and "type" field of the bridge's drop markers.
const DropMarkerEvent = "drop_marker"

// ErrBadMarker is wrapped by every error of ParseDropMarker.
var ErrBadMarker = errors.New("gaps: bad drop marker")

// DropMarker is the bridge's statement that it dropped the contiguous sequences FirstSeq..LastSeq
// (Count of them) of one publisher run (Epoch) for Reason (buffer_full, shutdown, rejected). It is
// published on streams.DropMarkerSubject(key), possibly after the FPMs that follow the dropped ones.
type DropMarker struct {
	Type              string  `json:"type"`
	Key               KeyJSON `json:"key"`
	Epoch             int64   `json:"epoch"`
	FirstSeq          uint64  `json:"first_seq"`
	LastSeq           uint64  `json:"last_seq"`
	Count             uint64  `json:"count"`
	Reason            string  `json:"reason"`
	Bridge            string  `json:"bridge"`
	FirstReceivedAtMs int64   `json:"first_received_at_ms"`
	LastReceivedAtMs  int64   `json:"last_received_at_ms"`
}

// rawMarker has pointers so that a missing field is told from a zero one.
type rawMarker struct {
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
}

// ParseDropMarker decodes and checks one drop marker body. Unknown fields are ignored (a newer bridge
// may add some); a missing or inconsistent required field is an error wrapping ErrBadMarker that
// names it. The bridge id and the receive times are optional.
func ParseDropMarker(data []byte) (DropMarker, error) {
	var r rawMarker
	if err := json.Unmarshal(data, &r); err != nil {
		return DropMarker{}, fmt.Errorf("%w: %v", ErrBadMarker, err)
	}
	bad := func(format string, args ...any) (DropMarker, error) {
		return DropMarker{}, fmt.Errorf("%w: "+format, append([]any{ErrBadMarker}, args...)...)
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
	}
	m := DropMarker{
		Type:     *r.Type,
		Key:      KeyJSON{*r.Key.Namespace, *r.Key.Component, *r.Key.WorkerID, int(*r.Key.DPRank)},
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
	return m, nil
}

func (m *DropMarker) ref() MarkerRef {
	return MarkerRef{FirstSeq: m.FirstSeq, LastSeq: m.LastSeq, Count: m.Count, Reason: m.Reason, Bridge: m.Bridge,
		Epoch: m.Epoch, FirstReceivedAtMs: m.FirstReceivedAtMs, LastReceivedAtMs: m.LastReceivedAtMs}
}
