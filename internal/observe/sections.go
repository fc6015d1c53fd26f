package observe

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/fpmbus/fpmbus/internal/rungroup"
)

// The sections of the status read from the registry. Each is present when its metrics are registered
// in the process, so a process shows what it runs. The metric names are those the components register
// (bridge/metrics.go, consumers/durable/metrics.go, …) and docs/reference.md lists.

func u(v float64) uint64 {
	if v <= 0 {
		return 0
	}
	return uint64(v + 0.5)
}

func uints(m map[string]float64) map[string]uint64 {
	out := make(map[string]uint64, len(m))
	for k, v := range m {
		out[k] = u(v)
	}
	return out
}

func storeOf(r rater) *store {
	if !r.now.has("fpmbus_store_ok") {
		return nil
	}
	return &store{OK: r.now.sum("fpmbus_store_ok", nil) == 1, FreeBytes: r.now.sum("fpmbus_store_free_bytes", nil),
		Recoveries: r.now.sum("fpmbus_store_recoveries_total", nil), Faults: uints(r.now.by("fpmbus_store_faults_total", "state", nil))}
}

func bridgeOf(r rater, ref *BridgeRef) *bridge {
	if !r.now.has("fpmbus_bridge_received_total") {
		return nil
	}
	n := r.now
	b := &bridge{
		Received: u(n.sum("fpmbus_bridge_received_total", nil)), Published: u(n.sum("fpmbus_bridge_published_total", nil)),
		ReceivedRate: r.rate("fpmbus_bridge_received_total", nil), PublishedRate: r.rate("fpmbus_bridge_published_total", nil),
		Duplicates: u(n.sum("fpmbus_bridge_duplicates_total", nil)), SeqMismatch: u(n.sum("fpmbus_bridge_seq_mismatch_total", nil)),
		Invalid: uints(n.by("fpmbus_bridge_invalid_total", "stage", nil)), Dropped: uints(n.by("fpmbus_bridge_dropped_total", "reason", nil)),
		DeadLetters: u(n.sum("fpmbus_bridge_dead_letters_total", nil)), DeadLettersLost: u(n.sum("fpmbus_bridge_dead_letters_lost_total", nil)),
		DropMarkers: u(n.sum("fpmbus_bridge_drop_markers_total", nil)), LostAfterAck: u(n.sum("fpmbus_bridge_lost_after_ack_total", nil)),
		Buffered: n.sum("fpmbus_bridge_buffered_messages", nil), BufferedHigh: n.sum("fpmbus_bridge_buffered_messages_high", nil),
		InFlight: n.sum("fpmbus_bridge_in_flight", nil), PublishLatency: r.latency("fpmbus_bridge_receive_to_ack_seconds", nil),
		Batches: u(n.sum("fpmbus_bridge_batches_total", nil)), BatchesFailed: u(n.sum("fpmbus_bridge_batches_failed_total", nil)),
		LossyRanks: []bridgeRank{},
	}
	if ref != nil {
		b.Component, b.Ranks, b.MaxBuffer, b.MaxInFlight = ref.Component, ref.Ranks, ref.MaxBuffer, ref.MaxInFlight
	}
	received := n.by("fpmbus_bridge_received_total", "rank", nil)
	if b.Ranks == 0 {
		b.Ranks = len(received)
	}
	published := n.by("fpmbus_bridge_published_total", "rank", nil)
	dropped := n.by("fpmbus_bridge_dropped_total", "rank", nil)
	invalid := n.by("fpmbus_bridge_invalid_total", "rank", nil)
	dead := n.by("fpmbus_bridge_dead_letters_total", "rank", nil)
	ranks := maps.Clone(received)
	for _, m := range []map[string]float64{published, dropped, invalid, dead} {
		maps.Copy(ranks, m)
	}
	for rank := range ranks {
		br := bridgeRank{Rank: rank, Received: u(received[rank]), Published: u(published[rank]), Dropped: u(dropped[rank]),
			Invalid: u(invalid[rank]), DeadLetters: u(dead[rank])}
		if br.Dropped+br.Invalid+br.DeadLetters > 0 {
			b.LossyRanks = append(b.LossyRanks, br)
		}
	}
	slices.SortFunc(b.LossyRanks, func(x, y bridgeRank) int {
		return cmp.Or(cmp.Compare(y.Dropped+y.Invalid+y.DeadLetters, x.Dropped+x.Invalid+x.DeadLetters), cmp.Compare(x.Rank, y.Rank))
	})
	if len(b.LossyRanks) > 100 {
		b.LossyRanks = b.LossyRanks[:100]
	}
	return b
}

func consumersOf(r rater, refs []ConsumerRef, comps []rungroup.Status) []consumer {
	n := r.now
	names := n.by("fpmbus_consumer_delivered_total", "consumer", nil)
	restarts := map[string]int{}
	for _, c := range comps {
		restarts[c.Name] = c.Restarts
	}
	var out []consumer
	for _, name := range slices.Sorted(maps.Keys(names)) {
		l := labels{"consumer": name}
		c := consumer{Name: name, Lag: n.sum("fpmbus_consumer_lag_messages", l),
			Delivered: u(n.sum("fpmbus_consumer_delivered_total", l)), Acked: u(n.sum("fpmbus_consumer_acked_total", l)),
			AckRate: r.rate("fpmbus_consumer_acked_total", l), Redelivered: u(n.sum("fpmbus_consumer_redelivered_total", l)),
			DeadLetters: u(n.sum("fpmbus_consumer_terminated_total", l)), RetentionLost: u(n.sum("fpmbus_consumer_retention_lost_total", l)),
			HandleP99: r.latency("fpmbus_consumer_handle_seconds", l).P99}
		for _, ref := range refs {
			if ref.Label == name {
				c.Component, c.Restarts = ref.Component, restarts[ref.Component]
			}
		}
		out = append(out, c)
	}
	return out
}

func mergeOf(r rater) *merge {
	if !r.now.has("fpmbus_merge_runs_total") {
		return nil
	}
	return &merge{Runs: uints(r.now.by("fpmbus_merge_runs_total", "outcome", nil))}
}

func sealOf(r rater) *seal {
	if !r.now.has("fpmbus_seal_runs_total") {
		return nil
	}
	n := r.now
	return &seal{Runs: uints(n.by("fpmbus_seal_runs_total", "outcome", nil)), Cells: uints(n.by("fpmbus_seal_cells_total", "state", nil)),
		CellsMissing: n.sum("fpmbus_seal_sealed_cells_missing", nil), CellsReplaced: n.sum("fpmbus_seal_sealed_cells_replaced", nil),
		TamperedCells: n.sum("fpmbus_seal_tampered_cells", nil), Unprotected: n.sum("fpmbus_seal_bucket_unprotected", nil) > 0}
}

func predictOf(r rater) *predict {
	if !r.now.has("fpmbus_predict_answers_total") {
		return nil
	}
	n := r.now
	return &predict{Answers: uints(n.by("fpmbus_predict_answers_total", "status", nil)), AnswerRate: r.rate("fpmbus_predict_answers_total", nil),
		Errors: uints(n.by("fpmbus_predict_errors_total", "code", nil)), Cells: n.sum("fpmbus_predict_cells", nil),
		Revision: n.sum("fpmbus_predict_revision", nil), Queued: n.sum("fpmbus_predict_queued", nil)}
}

// durability is the policy in force: the server's sync (where the process runs it) and the streams'.
func (s *Server) durability(_ context.Context, js *JetStream) *durability {
	if s.o.Sync == "" && js == nil {
		return nil
	}
	d := &durability{Sync: s.o.Sync}
	if js != nil {
		d.Streams, d.Error = js.streams, js.Error
	}
	return d
}

// limitFaults are the reasons, by component, that a ready component is behind one of its limits over
// r (the last HealthWindow).
func (s *Server) limitFaults(r rater, js *JetStream) map[string][]string {
	out := map[string][]string{}
	if r.now == nil {
		return out
	}
	win := fmt.Sprintf("%.0fs", max(r.seconds(), s.o.SampleInterval.Seconds()))
	if b := s.o.Bridge; b != nil {
		if n := u(r.increase("fpmbus_bridge_dropped_total", labels{"reason": "buffer_full"})); n > 0 {
			limit := ""
			if b.MaxBuffer > 0 {
				limit = fmt.Sprintf(" of %d", b.MaxBuffer)
			}
			out[b.Component] = append(out[b.Component], fmt.Sprintf("dropped %d FPMs in the last %s: its buffer%s was full (--max-buffer); each is in a drop marker, reported as bridge_drop", n, win, limit))
		}
		if n := u(r.increase("fpmbus_bridge_dead_letters_lost_total", nil)); n > 0 {
			out[b.Component] = append(out[b.Component], fmt.Sprintf("%d dead letters could not be stored in the last %s (fpmbus_bridge_dead_letters_lost_total)", n, win))
		}
	}
	for _, c := range s.o.Consumers {
		if n := u(r.increase("fpmbus_consumer_retention_lost_total", labels{"consumer": c.Label})); n > 0 {
			out[c.Component] = append(out[c.Component], fmt.Sprintf("the stream removed %d messages before %s read them in the last %s: it is behind the stream's limits (--max-bytes, --max-age)", n, c.Label, win))
		}
	}
	if js != nil {
		for _, c := range js.Consumers {
			if c.Component != "" && c.MaxAckPending > 0 && c.AckPending >= c.MaxAckPending {
				out[c.Component] = append(out[c.Component], fmt.Sprintf("consumer %s on %s holds %d unacknowledged messages, its max_ack_pending: the server delivers it nothing more until it acknowledges", c.Name, c.Stream, c.AckPending))
			}
		}
	}
	return out
}

func joinReasons(rs []string) string { return strings.Join(rs, "; ") }
