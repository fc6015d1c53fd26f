package gaps

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/fpmbus/fpmbus/internal/golden"
	"github.com/fpmbus/fpmbus/streams"
)

var update = flag.Bool("update", false, "rewrite testdata/events.golden.jsonl")

// goldenEvents are the gap events of testdata/events.golden.jsonl, one per line in this order: the
// detector's kinds and the bridge's lost_after_ack, with every optional field both set and absent.
func goldenEvents() []struct {
	name string
	ev   any
} {
	k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "4192", DPRank: 1}
	const epoch, oldEpoch = int64(1_782_777_600_000), int64(1_782_770_000_000)
	before := &point{Seq: 99, ObservedAtMs: epoch + 1240, Epoch: epoch, Bridge: "host-42"}
	after := &point{Seq: 200, ObservedAtMs: epoch + 4410, Epoch: epoch, Bridge: "host-43"}
	return []struct {
		name string
		ev   any
	}{
		{"every detector field", &Event{GapEventFields: streams.GapEventFields{Schema: EventSchema, Type: TypeGap,
			ID: streams.RestartMsgID(k, epoch), Key: k, EventSeq: 7, Cause: CausePublisherRestart, Epoch: epoch,
			FirstMissing: u64p(0), LastMissing: u64p(9), Missing: 8, MissingRanges: [][2]uint64{{0, 3}, {6, 9}}, Before: before},
			After: after, StaleAfterMs: 5000, StaleAtMs: epoch + 6240,
			Restarted: boolp(true),
			Evidence: evidence{Summary: "every field", Markers: []citedMarker{{FirstSeq: 4, LastSeq: 5, Count: 2, Reason: "buffer_full",
				Bridge: "host-43", Epoch: epoch, FirstReceivedAtMs: epoch + 10, LastReceivedAtMs: epoch + 20}},
				MarkerGraceMs: 10_000, EpochChanged: true, BridgeChanged: true, AfterStale: true,
				OldRun: &runSummary{FirstSeq: 0, LastSeq: 99, FirstEpoch: oldEpoch, LastEpoch: oldEpoch, Messages: 100,
					StartedAtMs: oldEpoch + 5, LastAtMs: oldEpoch + 9900, ByRestart: true},
				NewRunFirstSeq: u64p(10), SilentMs: 3170, FirstSeenSeq: u64p(10), SubscribedByMs: epoch}}},
		{"bridge_drop", &Event{GapEventFields: streams.GapEventFields{Schema: EventSchema, Type: TypeGap,
			ID: streams.GapMsgID(k, epoch, 100, 199), Key: k, EventSeq: 3, Cause: CauseBridgeDrop, Epoch: epoch,
			FirstMissing: u64p(100), LastMissing: u64p(199), Missing: 100, Before: before},
			After: after,
			Evidence: evidence{Summary: "the bridge dropped 100 message(s) itself (buffer_full)", Markers: []citedMarker{{FirstSeq: 100,
				LastSeq: 199, Count: 100, Reason: "buffer_full", Bridge: "host-42", Epoch: epoch}}, BridgeChanged: true}}},
		{"publisher_restart, nothing missing", &Event{GapEventFields: streams.GapEventFields{Schema: EventSchema, Type: TypeGap,
			ID: streams.RestartMsgID(k, epoch), Key: k, EventSeq: 4, Cause: CausePublisherRestart, Epoch: epoch, Before: before},
			After: after,
			Evidence: evidence{Summary: "restart", OldRun: &runSummary{LastSeq: 99, FirstEpoch: oldEpoch, LastEpoch: oldEpoch, Messages: 100},
				NewRunFirstSeq: u64p(0), EpochChanged: true}}},
		{"late_start", &Event{GapEventFields: streams.GapEventFields{Schema: EventSchema, Type: TypeGap,
			ID: streams.GapMsgID(k, epoch, 0, 9), Key: k, EventSeq: 1, Cause: CauseLateStart, Epoch: epoch,
			FirstMissing: u64p(0), LastMissing: u64p(9), Missing: 10},
			After:    after,
			Evidence: evidence{Summary: "late", MarkerGraceMs: 10_000, FirstSeenSeq: u64p(10), SubscribedByMs: epoch}}},
		{"stale", &Event{GapEventFields: streams.GapEventFields{Schema: EventSchema, Type: typeStale,
			ID: streams.StaleMsgID(k, epoch, 99), Key: k, EventSeq: 5, Cause: CauseStale, Epoch: epoch, Before: before},
			StaleAfterMs: 5000, StaleAtMs: epoch + 6240,
			Evidence: evidence{Summary: "nothing heard"}}},
		{"resumed", &Event{GapEventFields: streams.GapEventFields{Schema: EventSchema, Type: typeResumed,
			ID: streams.ResumedMsgID(k, epoch, 99), Key: k, EventSeq: 6, Cause: CauseStale, Epoch: epoch, Before: before},
			After: after, StaleAfterMs: 5000, Restarted: boolp(false),
			Evidence: evidence{Summary: "heard again", SilentMs: 3170, AfterStale: true}}},
		{"zero event", &Event{}},
		{"lost_after_ack, every field", &streams.LostAfterAck{GapEventFields: streams.GapEventFields{Schema: streams.GapEventSchema,
			Type: streams.GapEventType, ID: streams.LostAfterAckMsgID(k, epoch, 100, 199), Key: k, Cause: streams.GapCauseLostAfterAck,
			Epoch: epoch, FirstMissing: u64p(100), LastMissing: u64p(199), Missing: 98,
			MissingRanges: [][2]uint64{{100, 150}, {153, 199}}, Before: before},
			Evidence: streams.LostAfterAckEvidence{Summary: "98 FPM(s) lost", Bridge: "host-43", AckedBy: "host-42",
				AckedFirstStreamSeq: 1001, AckedLastStreamSeq: 1100, StoredLastStreamSeq: 1000, StreamFirstSeq: 1,
				StreamLastSeq: 1000, RecordedAtMs: epoch + 5000, CheckedAtMs: epoch + 9000, Trigger: "reconnect", CountExact: true}}},
		{"lost_after_ack, whole run", &streams.LostAfterAck{GapEventFields: streams.GapEventFields{Schema: streams.GapEventSchema,
			Type: streams.GapEventType, ID: streams.LostAfterAckMsgID(k, epoch, 0, 9), Key: k, Cause: streams.GapCauseLostAfterAck,
			Epoch: epoch, FirstMissing: u64p(0), LastMissing: u64p(9), Missing: 10},
			Evidence: streams.LostAfterAckEvidence{Summary: "10 FPM(s) lost", Bridge: "host-42", AckedBy: "host-42",
				AckedFirstStreamSeq: 1, AckedLastStreamSeq: 10, Trigger: "start"}}},
	}
}

// TestEventJSON: the gap events' JSON is fixed (keys, order, omitted fields) byte for byte, each
// reads back as the value it was written from, and each reads as an Event (as `gaps report` reads
// every event on the gap subjects) with the same common fields.
func TestEventJSON(t *testing.T) {
	t.Parallel()
	cases := goldenEvents()
	var got bytes.Buffer
	for _, tc := range cases {
		b, err := json.Marshal(tc.ev)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got.Write(b)
		got.WriteByte('\n')
	}
	golden.Check(t, filepath.Join("testdata", "events.golden.jsonl"), got.Bytes(), *update) // line i+1 is cases[i]
	lines := bytes.Split(got.Bytes(), []byte("\n"))                                         // the golden file's, now that they are equal
	for i, tc := range cases {
		back := reflect.New(reflect.TypeOf(tc.ev).Elem())
		if err := json.Unmarshal(lines[i], back.Interface()); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		equal(t, tc.ev, back.Interface(), tc.name, ": read back")
		var asEvent Event
		if err := json.Unmarshal(lines[i], &asEvent); err != nil {
			t.Fatalf("%s as an Event: %v", tc.name, err)
		}
		equal(t, commonFields(tc.ev), asEvent.GapEventFields, tc.name, ": read as an Event")
	}
}

// commonFields are the fields ev, a gap event of either publisher, carries like every gap event.
func commonFields(ev any) streams.GapEventFields {
	switch e := ev.(type) {
	case *Event:
		return e.GapEventFields
	case *streams.LostAfterAck:
		return e.GapEventFields
	}
	panic(fmt.Sprintf("not a gap event: %T", ev))
}
