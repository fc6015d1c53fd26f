package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// lostEvents returns the lost_after_ack events stored on FPM_EVENTS.
func lostEvents(t testing.TB, js jetstream.JetStream) []streams.LostAfterAck {
	t.Helper()
	var out []streams.LostAfterAck
	for _, m := range messages(t, js, streams.StreamEvents, streams.GapEventWildcard) {
		var ev streams.LostAfterAck
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatalf("gap event %s: %v", m.Data(), err)
		}
		if m.Subject() != streams.GapEventSubject(ev.Key) || m.Headers().Get(streams.HeaderMsgID) != ev.ID ||
			m.Headers().Get(streams.HeaderEventType) != streams.GapEventType {
			t.Fatalf("gap event on %s with headers %v: %s", m.Subject(), m.Headers(), m.Data())
		}
		if ev.Cause == streams.GapCauseLostAfterAck {
			out = append(out, ev)
		}
	}
	return out
}

// ackRecordOf reads k's ack record from the bucket.
func ackRecordOf(t testing.TB, js jetstream.JetStream, k streams.Key) ackRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, streams.BucketBridgeAcks)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, streams.BridgeAckKey(k))
	if err != nil {
		t.Fatalf("ack record of %s: %v", k, err)
	}
	var rec ackRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// deleteNewest deletes the newest n FPMs of k from the stream, behind the bridge's back (a lost
// window), and returns their Fpm-Seq values.
func deleteNewest(t testing.TB, js jetstream.JetStream, k streams.Key, n int) []uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, streams.StreamFPM)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for range n {
		m, err := s.GetLastMsgForSubject(ctx, streams.FPMSubject(k))
		if err != nil {
			t.Fatalf("newest FPM of %s: %v", k, err)
		}
		if err := s.DeleteMsg(ctx, m.Sequence); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, hdrUint(t, storedMsg{m}, streams.HeaderSeq))
	}
	slices.Reverse(seqs)
	return seqs
}

// sendAcked sends seqs of worker over a fresh bridge on env and waits until every one is acknowledged;
// the bridge keeps running. It returns the harness and the run's epoch.
func sendAcked(t *testing.T, env *natsservertest.Env, worker, bridgeID string, seqs []uint64) *harness {
	t.Helper()
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	h := startBridge(t, env, []Endpoint{{URL: pub.URL}}, func(c *Config) { c.BridgeID = bridgeID })
	pub.waitSubscribed()
	for _, seq := range seqs {
		pub.send(seq, payload(worker, 0, seq))
	}
	h.waitStats(15*time.Second, "every FPM acknowledged", func(s stats) bool { return s.Ranks[0].Published == uint64(len(seqs)) })
	return h
}

func seqRange(first, last uint64) []uint64 {
	var out []uint64
	for s := first; s <= last; s++ {
		out = append(out, s)
	}
	return out
}

// TestLostAfterAckReportedAtStart: a bridge acknowledged FPMs and stopped; the stream then lost some
// of them behind its back. The next bridge, at start, reports exactly the acknowledged FPMs that are
// gone as one lost_after_ack gap event, cuts its record back, and a third start reports nothing again.
func TestLostAfterAckReportedAtStart(t *testing.T) {
	t.Parallel()
	type want struct {
		first, last, missing uint64
		ranges               [][2]uint64
		before               *uint64
	}
	u := func(v uint64) *uint64 { return &v }
	cases := map[string]struct {
		sent   []uint64
		tamper func(t *testing.T, js jetstream.JetStream, k streams.Key)
		want   *want // nil: no event
	}{
		"newest 30 of 100 deleted": {
			sent:   seqRange(0, 99),
			tamper: func(t *testing.T, js jetstream.JetStream, k streams.Key) { deleteNewest(t, js, k, 30) },
			want:   &want{first: 70, last: 99, missing: 30, before: u(69)},
		},
		"every FPM of the publisher purged": {
			sent: seqRange(0, 99),
			tamper: func(t *testing.T, js jetstream.JetStream, k streams.Key) {
				s, err := js.Stream(context.Background(), streams.StreamFPM)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Purge(context.Background(), jetstream.WithPurgeSubject(streams.FPMSubject(k))); err != nil {
					t.Fatal(err)
				}
			},
			want: &want{first: 0, last: 99, missing: 100},
		},
		"numbers never stored inside the lost window are not counted": {
			// 50..59 never reached the bridge (a ZMQ loss the gap detector reports as zmq_drop).
			sent:   append(seqRange(0, 49), seqRange(60, 99)...),
			tamper: func(t *testing.T, js jetstream.JetStream, k streams.Key) { deleteNewest(t, js, k, 45) },
			want:   &want{first: 45, last: 99, missing: 45, ranges: [][2]uint64{{45, 49}, {60, 99}}, before: u(44)},
		},
		"nothing lost": {
			sent:   seqRange(0, 99),
			tamper: func(*testing.T, jetstream.JetStream, streams.Key) {},
		},
		"removed by the stream's limits is not a loss": {
			sent: seqRange(0, 99),
			tamper: func(t *testing.T, js jetstream.JetStream, k streams.Key) {
				s, err := js.Stream(context.Background(), streams.StreamFPM)
				if err != nil {
					t.Fatal(err)
				}
				// As retention does: the oldest messages go, the stream's first sequence moves past them.
				last := s.CachedInfo().State.LastSeq
				if err := s.Purge(context.Background(), jetstream.WithPurgeSequence(last+1)); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			env := natsservertest.Start(t)
			k := fpmKey("w", 0)
			// Another publisher's FPM first: the stream's head is not this publisher's.
			if _, err := env.JS.Publish(context.Background(), streams.FPMSubject(fpmKey("other", 0)), []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			h := sendAcked(t, env, "w", "bridge-1", tc.sent)
			if err := h.stop(); err != nil {
				t.Fatal(err)
			}
			rec := ackRecordOf(t, env.JS, k)
			if len(rec.Runs) != 1 || rec.Runs[0].Acked != uint64(len(tc.sent)) || rec.Bridge != "bridge-1" {
				t.Fatalf("ack record after the stop: %+v", rec)
			}
			epoch := rec.Runs[0].Epoch
			tc.tamper(t, env.JS, k)

			h2 := startBridge(t, env, []Endpoint{{URL: "tcp://127.0.0.1:1"}}, func(c *Config) { c.BridgeID = "bridge-2" })
			evs := lostEvents(t, env.JS)
			if tc.want == nil {
				if len(evs) != 0 {
					t.Fatalf("lost_after_ack events %+v, want none", evs)
				}
				if got := counterValue(h2.b.metrics.lostAfterAck); got != 0 {
					t.Fatalf("fpmbus_bridge_lost_after_ack_total %v, want 0", got)
				}
				return
			}
			if len(evs) != 1 {
				t.Fatalf("%d lost_after_ack events, want 1: %+v", len(evs), evs)
			}
			ev, w := evs[0], tc.want
			if ev.Schema != streams.GapEventSchema || ev.Type != streams.GapEventType || ev.Key != k || ev.Epoch != epoch ||
				ev.FirstMissing == nil || *ev.FirstMissing != w.first || ev.LastMissing == nil || *ev.LastMissing != w.last ||
				ev.Missing != w.missing || !slices.Equal(ev.MissingRanges, w.ranges) || !ev.Evidence.CountExact ||
				ev.Evidence.Bridge != "bridge-2" || ev.Evidence.AckedBy != "bridge-1" || ev.Evidence.Trigger != "start" ||
				ev.ID != streams.LostAfterAckMsgID(k, epoch, w.first, w.last) {
				t.Fatalf("event %+v, want %+v (epoch %d)", ev, *w, epoch)
			}
			if (ev.Before == nil) != (w.before == nil) || (w.before != nil && (ev.Before.Seq != *w.before || ev.Before.Epoch != epoch)) {
				t.Fatalf("event before %+v, want seq %v", ev.Before, w.before)
			}
			if got := counterValue(h2.b.metrics.lostAfterAck); got != float64(w.missing) {
				t.Fatalf("fpmbus_bridge_lost_after_ack_total %v, want %d", got, w.missing)
			}
			// The record is cut back to what the stream holds: a later start reports nothing more.
			if err := h2.stop(); err != nil {
				t.Fatal(err)
			}
			rec = ackRecordOf(t, env.JS, k)
			if w.before == nil && len(rec.Runs) != 0 || w.before != nil && (len(rec.Runs) != 1 || rec.Runs[0].LastSeq != *w.before) {
				t.Fatalf("ack record after the report: %+v", rec)
			}
			startBridge(t, env, []Endpoint{{URL: "tcp://127.0.0.1:1"}}, func(c *Config) { c.BridgeID = "bridge-3" })
			if evs := lostEvents(t, env.JS); len(evs) != 1 {
				t.Fatalf("%d lost_after_ack events after a third start, want still 1: %+v", len(evs), evs)
			}
		})
	}
}

// TestLostAfterAckReportedAfterReconnect: the server loses the newest acknowledged FPMs while the
// bridge runs (deleted, then the server restarts under it); the bridge checks after reconnecting,
// before it publishes again, and reports them; FPMs sent afterwards are stored as usual.
func TestLostAfterAckReportedAfterReconnect(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	addr, store := listenAddr(t, env.Server), env.StoreDir
	k := fpmKey("w", 0)
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	h := startBridge(t, env, []Endpoint{{URL: pub.URL}}, func(c *Config) { c.BridgeID = "bridge-r" })
	pub.waitSubscribed()
	for seq := range uint64(50) {
		pub.send(seq, payload("w", 0, seq))
	}
	h.waitStats(15*time.Second, "50 acknowledged", func(s stats) bool { return s.Ranks[0].Published == 50 })
	lost := deleteNewest(t, env.JS, k, 20)
	if !slices.Equal(lost, seqRange(30, 49)) {
		t.Fatalf("deleted %v", lost)
	}
	env.Stop()
	env2 := natsservertest.StartAt(t, addr, store)

	var evs []streams.LostAfterAck
	checkFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		if evs = lostEvents(t, env2.JS); len(evs) == 0 {
			return fmt.Errorf("no lost_after_ack event yet")
		}
		return nil
	})
	ev := evs[0]
	if len(evs) != 1 || *ev.FirstMissing != 30 || *ev.LastMissing != 49 || ev.Missing != 20 || ev.Evidence.Trigger != "reconnect" ||
		ev.Before == nil || ev.Before.Seq != 29 {
		t.Fatalf("events %+v", evs)
	}
	for seq := uint64(50); seq < 60; seq++ {
		pub.send(seq, payload("w", 0, seq))
	}
	h.waitStats(15*time.Second, "60 acknowledged", func(s stats) bool { return s.Ranks[0].Published == 60 })
	if got := len(messages(t, env2.JS, streams.StreamFPM, streams.FPMSubject(k))); got != 40 {
		t.Fatalf("%d FPMs stored, want 30 kept + 10 new", got)
	}
	if evs := lostEvents(t, env2.JS); len(evs) != 1 {
		t.Fatalf("%d lost_after_ack events, want 1", len(evs))
	}
}

func TestAckRunCountsHolesAndLateAcks(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		acks       []uint64
		from       uint64
		wantRanges [][2]uint64
		wantN      uint64
		wantAcked  uint64
	}{
		"contiguous":              {acks: seqRange(0, 9), from: 5, wantRanges: [][2]uint64{{5, 9}}, wantN: 5, wantAcked: 10},
		"a hole":                  {acks: []uint64{0, 1, 2, 6, 7}, from: 1, wantRanges: [][2]uint64{{1, 2}, {6, 7}}, wantN: 4, wantAcked: 5},
		"a retry fills its hole":  {acks: []uint64{0, 1, 3, 4, 2}, from: 0, wantRanges: [][2]uint64{{0, 4}}, wantN: 5, wantAcked: 5},
		"a duplicate ack":         {acks: []uint64{0, 1, 1, 2}, from: 0, wantRanges: [][2]uint64{{0, 2}}, wantN: 3, wantAcked: 3},
		"from inside a hole":      {acks: []uint64{0, 5, 6}, from: 2, wantRanges: [][2]uint64{{5, 6}}, wantN: 2, wantAcked: 3},
		"an ack before the first": {acks: []uint64{5, 6, 2}, from: 0, wantRanges: [][2]uint64{{2, 2}, {5, 6}}, wantN: 3, wantAcked: 3},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := newLedger()
			k := fpmKey("w", 0)
			for i, seq := range tc.acks {
				l.acked(k, 7, seq, uint64(100+i))
			}
			run := l.recs[k].Runs[0]
			ranges, n, exact := run.acknowledgedIn(tc.from)
			if !slices.Equal(ranges, tc.wantRanges) || n != tc.wantN || !exact || run.Acked != tc.wantAcked {
				t.Fatalf("ranges %v n %d exact %v acked %d; want %v %d true %d (run %+v)", ranges, n, exact, run.Acked, tc.wantRanges, tc.wantN, tc.wantAcked, run)
			}
		})
	}
}
