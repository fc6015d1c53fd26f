package bridge

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// dg is the payload digest of the message named s in these tests.
func dg(s string) string { return streams.PayloadDigest([]byte(s)) }

// runMsg is a message of TestAgreeRun's run under test as every bridge received it (digest d<i>).
type runMsg struct {
	seq    uint64
	digest string
	recvMs int64
}

// storedCopy is another bridge's copy of a message in the stream.
type storedCopy struct {
	runMsg
	epoch  int64
	start  string // its Fpm-Run-Start
	bridge string // the bridge that stored it; "" for the other bridge
}

// backlog is n copies another bridge retries late: numbers below 7 (the first of TestAgreeRun's run
// under test) under epoch, with bytes of their own, received 10 ms apart from recvMs on.
func backlog(epoch int64, n int, recvMs int64) []storedCopy {
	s := make([]storedCopy, n)
	for i := range s {
		s[i] = storedCopy{runMsg{uint64(i % 7), "old" + strconv.Itoa(i), recvMs + 10*int64(i)}, epoch, "", ""}
	}
	return s
}

// The agreement rule of runs.go against a real bucket and a real stream, one interleaving of two
// bridges per case: this bridge resolves one run while "the other bridge" (the test, writing what
// that bridge would) has recorded runs and stored FPMs before this bridge read the record, or does so
// between this bridge's read and its decision. The other bridge's evidence is a message both bridges
// received: the same number and bytes at about the same time.
func TestAgreeRun(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	h := startBridge(t, env, []Endpoint{{URL: "tcp://127.0.0.1:1", DPRank: 0}}, nil)
	b := h.b
	if b.runsKV == nil {
		t.Fatal("runs bucket not open")
	}
	// t0 is the time of this bridge's run under test; a lagging case moves it into the past.
	now := time.Now().UnixMilli()
	const (
		pEpoch = 1_000_000 // the previous run, agreed by both bridges long ago
		other  = "other-bridge"
	)
	// recordedFrom is the record of the previous run and another bridge's of this one, which it
	// received from first at atMs (its epoch).
	recordedFrom := func(first uint64, atMs int64) []streams.RunEntry {
		return []streams.RunEntry{{Epoch: pEpoch, Bridge: other},
			{Epoch: atMs, FirstSeq: first, FirstDigest: dg("x" + strconv.FormatUint(first, 10)), FirstReceivedAtMs: atMs, Bridge: other}}
	}
	type want struct {
		epoch   int64  // 0: the epoch this bridge wrote (checked against the record)
		start   string // Fpm-Run-Start of the agreed run
		written bool   // this bridge added a run to the record
		reads   int    // record reads: 1 means it decided without waiting (0: not checked)
		below   int64  // a written epoch must lie below this (0: no bound)
	}
	for name, tc := range map[string]struct {
		kind    runKind // of the run under test (a first run has no previous one)
		t0      int64   // this bridge's receive time of the run's first message
		ended   bool    // a later run began on this bridge (it resolves an old run)
		more    uint64  // messages this bridge received after the first three, 1 ms apart
		runs    []streams.RunEntry
		earlier []storedCopy // stored before stored, which is the newest
		stored  *storedCopy
		between func(k streams.Key, first runMsg) ([]streams.RunEntry, *storedCopy) // the other bridge, between read and decision
		drain   []storedCopy                                                        // the other bridge's copies, one after each read of the record from the second on
		late    []storedCopy                                                        // the other bridge's copies, stored together after the read that follows drain
		// fromStart: t0, stored, drain and late are offsets from the subtest's start, not from now (a case
		// whose waits count from the run's first message, however late its subtest starts)
		fromStart bool
		held      bool // the run waited for the bucket, which answers again as this bridge first reads it
		// outage: the run was first agreed as publishing recovered from an outage (queued behind a
		// held run), which ends as this bridge first reads the bucket; resumed: received during an
		// outage that ended a moment ago, first agreed since. Both on a bridge of their own: the time
		// an outage's first run was agreed is the bridge's
		outage, resumed bool
		// own: stored is this bridge's copy, stored by its instance before this one (received before
		// it started, a second before t0), and late the other bridge's copy of the run's first; t0 past
		// the live probe
		own bool
		// early: the run's first message came 2.5 s before the bridge was ready (received while it
		// started: applying streams, opening buckets); stored is the other bridge's copy of a number
		// below it, received just before it, and late its copy of the run's first
		early bool
		// every: the run's messages here come this many ms apart (0: 20 ms for the first three, then
		// 1 ms), so that its own pace can be measured
		every int64
		want  want
	}{
		"first bridge ever": {
			kind: runStart, t0: now,
			want: want{written: true, reads: 1},
		},
		"starting alone: nothing of the run stored": {
			kind: runStart, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, FirstSeq: 0, Bridge: other}},
			stored: &storedCopy{runMsg{900, "old", pEpoch + 5000}, pEpoch, "", ""},
			want:   want{written: true},
		},
		"starting while another bridge is live": {
			kind: runStart, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}},
			stored: &storedCopy{runMsg{7, "d7", now + 20}, pEpoch, "", ""},
			want:   want{epoch: pEpoch, reads: 1},
		},
		// The N1 race: a bridge started while the publisher was down reads the previous run's record; the
		// live bridge records the restart and stores its first FPMs before the starting bridge decides.
		"starting while the publisher was down: the restart recorded during the probe": {
			kind: runStart, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}},
			stored: &storedCopy{runMsg{900, "old", pEpoch + 5000}, pEpoch, "", ""},
			between: func(k streams.Key, first runMsg) ([]streams.RunEntry, *storedCopy) {
				return []streams.RunEntry{{Epoch: pEpoch, Bridge: other},
						{Epoch: now - 3, FirstSeq: first.seq, FirstDigest: dg(first.digest), FirstReceivedAtMs: first.recvMs - 3, Start: "restart", Bridge: other}},
					&storedCopy{runMsg{first.seq + 1, "d8", first.recvMs + 41}, now - 3, "restart", ""}
			},
			want: want{epoch: now - 3, start: "restart"},
		},
		// The other bridge buffered through a broker restart and stores the run late: its newest copy is
		// a number below this run's first, and its copy of this run's first comes after the live probe
		// (the run's first message is past it here, so only the catch-up look reads the record again).
		"starting while another bridge catches up: its copies come after the probe": {
			kind: runStart, t0: -600, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}},
			stored:    &storedCopy{runMsg{4, "d4", -750}, pEpoch, "", ""},
			late:      []storedCopy{{runMsg{7, "d7", -599}, pEpoch, "", ""}},
			fromStart: true,
			want:      want{epoch: pEpoch},
		},
		// The other bridge drains retries after a full disk: its newest copies are numbers below this
		// run's first that it received long ago (too long for catching up by receive time), yet each
		// look finds a newer one stored, and its copy of this run's first comes after the probe. A
		// reconnect, not a bridge's first run: that one waits from when the bridge was ready, which the
		// shared test bridge just was, and would find the copy without the signal under test (so the
		// held case below).
		"reconnecting while another bridge drains retries received long before: its copies come after the probe": {
			kind: runReconnect, t0: -600, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}},
			stored: &storedCopy{runMsg{2, "d2", -9000}, pEpoch, "", ""},
			drain: []storedCopy{{runMsg{3, "d3", -8950}, pEpoch, "", ""}, {runMsg{4, "d4", -8900}, pEpoch, "", ""},
				{runMsg{5, "d5", -8850}, pEpoch, "", ""}, {runMsg{6, "d6", -8800}, pEpoch, "", ""}},
			late:      []storedCopy{{runMsg{7, "d7", -599}, pEpoch, "", ""}},
			fromStart: true,
			want:      want{epoch: pEpoch},
		},
		// The other bridge, stalled, stored at once its retried backlog (more than the scan from this
		// run's first message reads), this run's first messages, and ones this bridge did not receive
		// (its reader stopped): its newest copy is no evidence, the ones after its backlog are.
		"starting after another bridge went past this run's first at once, after its backlog": {
			kind: runStart, t0: -600, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}},
			earlier:   append(backlog(pEpoch, 2*evidenceScan, -8990), storedCopy{runMsg{7, "d7", -599}, pEpoch, "", ""}, storedCopy{runMsg{8, "d8", -579}, pEpoch, "", ""}),
			stored:    &storedCopy{runMsg{12, "x12", -300}, pEpoch, "", ""},
			fromStart: true,
			want:      want{epoch: pEpoch, reads: 1},
		},
		"reconnecting after another bridge stored copies below this run's first long before: nothing more comes": {
			kind: runReconnect, t0: -600, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}},
			stored: &storedCopy{runMsg{2, "d2", -9000}, pEpoch, "", ""}, fromStart: true,
			want: want{written: true, start: "reconnect"},
		},
		// A full disk held the run here for seconds, and the other bridge with it: its newest copy is a
		// number below this run's first and its copy of the run's first comes after the bucket
		// answered again, though long after the run's first message.
		"held while the bucket did not answer: the other bridge's copies come after it answers": {
			kind: runReconnect, t0: -4000, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}},
			stored:    &storedCopy{runMsg{4, "d4", -4100}, pEpoch, "", ""},
			late:      []storedCopy{{runMsg{7, "d7", -3999}, pEpoch, "", ""}},
			fromStart: true, held: true,
			want: want{epoch: pEpoch},
		},
		// The same run queued behind another held run: its own agreement was first tried as publishing
		// recovered, seconds after its first message, when the other bridge had not stored its copies
		// yet.
		"queued behind a held run: the other bridge's copies come after the outage": {
			kind: runReconnect, t0: -4000, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}},
			stored:    &storedCopy{runMsg{4, "d4", -4100}, pEpoch, "", ""},
			late:      []storedCopy{{runMsg{7, "d7", -3999}, pEpoch, "", ""}},
			fromStart: true, outage: true,
			want: want{epoch: pEpoch},
		},
		// The same run received during the outage and first tried just after publishing resumed (the
		// FPMs the outage held went first; its own waited in the buffer).
		"received during an outage, agreed after publishing resumed: the other bridge's copies come after it": {
			kind: runReconnect, t0: -4000, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}},
			stored:    &storedCopy{runMsg{4, "d4", -4100}, pEpoch, "", ""},
			late:      []storedCopy{{runMsg{7, "d7", -3999}, pEpoch, "", ""}},
			fromStart: true, resumed: true,
			want: want{epoch: pEpoch},
		},
		// Another bridge recorded the run, which this bridge joined late (here on a new connection; as
		// well a bridge just started), 500 ms before this bridge's first message of it, and stores its
		// copies late (held up by its backlog): after the live probe, within the catch-up one. (Not a
		// first run: that one waits from when the bridge was ready, which the shared test bridge just
		// was.)
		"joining a run another bridge recorded from lower numbers: its copies come after the probe": {
			kind: runReconnect, t0: -600, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other},
				{Epoch: -1100, FirstSeq: 1, FirstDigest: dg("d1"), FirstReceivedAtMs: -1100, Start: "restart", Bridge: other}},
			late:      []storedCopy{{runMsg{7, "d7", -599}, -1100, "restart", ""}},
			fromStart: true,
			want:      want{epoch: -1100, start: "restart"},
		},
		// `fpmbus up` restarted with its embedded server: this bridge's previous instance stored the run
		// up to a number below this one's first, and the other bridge, reconnecting to the restarted
		// server, stores its buffered copies after the live probe. No run is recorded (a bridge that
		// took the other's epoch records none), so only that copy holds this bridge.
		"restarted while the run was live here: the other bridge's copies come after the probe": {
			kind:   runStart,
			stored: &storedCopy{runMsg: runMsg{seq: 4, digest: "d4"}, epoch: pEpoch},
			late:   []storedCopy{{runMsg: runMsg{seq: 7, digest: "d7"}, epoch: pEpoch}},
			own:    true,
			want:   want{epoch: pEpoch},
		},
		// `fpmbus up` restarted: its bridge received the run while its server recovered the store, and
		// the other bridge, reconnecting, stores its copies after this one is ready.
		"received while starting: the other bridge's copies come after it is ready": {
			kind: runStart, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}},
			stored: &storedCopy{runMsg: runMsg{seq: 4, digest: "d4"}, epoch: pEpoch},
			late:   []storedCopy{{runMsg: runMsg{seq: 7, digest: "d7"}, epoch: pEpoch}},
			early:  true,
			want:   want{epoch: pEpoch},
		},
		"starting after another bridge stopped below this run's first: nothing comes": {
			kind: runStart, t0: -600, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}},
			stored: &storedCopy{runMsg{4, "d4", -750}, pEpoch, "", ""}, fromStart: true,
			want: want{written: true},
		},
		"the restart recorded first by the other bridge": {
			kind: runRestart, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other},
				{Epoch: now + 2, FirstSeq: 7, FirstDigest: dg("d7"), FirstReceivedAtMs: now + 2, Start: "restart", Bridge: other}},
			want: want{epoch: now + 2, start: "restart", reads: 1},
		},
		"the restart seen first": {
			kind: runRestart, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: "test-bridge"}},
			want: want{written: true, start: "restart", reads: 1},
		},
		// Both read the same record and write: this bridge's write conflicts, and the run the other
		// wrote began with a message this bridge received.
		"both saw the restart at once": {
			kind: runRestart, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}},
			between: func(k streams.Key, first runMsg) ([]streams.RunEntry, *storedCopy) {
				return []streams.RunEntry{{Epoch: pEpoch, Bridge: other},
					{Epoch: now + 1, FirstSeq: first.seq, FirstDigest: dg(first.digest), FirstReceivedAtMs: first.recvMs + 1, Start: "reconnect", Bridge: other}}, nil
			},
			want: want{epoch: now + 1, start: "restart"},
		},
		"the restart recorded by a bridge that connected earlier: its FPMs show it": {
			kind: runRestart, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other},
				{Epoch: now - 80, FirstSeq: 1, FirstDigest: dg("d1"), FirstReceivedAtMs: now - 80, Start: "restart", Bridge: other}},
			stored: &storedCopy{runMsg{8, "d8", now + 40}, now - 80, "restart", ""},
			want:   want{epoch: now - 80, start: "restart", reads: 1},
		},
		// The N1 persistence: a bridge lagging behind resolves a restart after the other bridge recorded
		// it and the next one; it must take its own run, not the newest.
		"lagging: the run and the next one recorded": {
			kind: runRestart, t0: now - 20_000, ended: true, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other},
				{Epoch: now - 20_000, FirstSeq: 7, FirstDigest: dg("d7"), FirstReceivedAtMs: now - 20_000, Start: "restart", Bridge: other},
				{Epoch: now - 5_000, FirstSeq: 0, FirstDigest: dg("d0"), FirstReceivedAtMs: now - 5_000, Start: "restart", Bridge: other}},
			stored: &storedCopy{runMsg{30, "n30", now - 3_500}, now - 5_000, "restart", ""},
			want:   want{epoch: now - 20_000, start: "restart", reads: 1},
		},
		// Lagging, with only the next run recorded (it began after this run ended here): a new run between.
		"lagging: only the next run recorded": {
			kind: runRestart, t0: now - 20_000, ended: true, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other},
				{Epoch: now - 5_000, FirstSeq: 0, FirstDigest: dg("d0"), FirstReceivedAtMs: now - 5_000, Start: "restart", Bridge: other}},
			want: want{written: true, start: "restart", reads: 1, below: now - 5_000},
		},
		"a reconnect the other bridge saw no restart in": {
			kind: runReconnect, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}},
			stored: &storedCopy{runMsg{8, "d8", now + 30}, pEpoch, "", ""},
			want:   want{epoch: pEpoch, start: "", reads: 1},
		},
		"a reconnect alone": {
			kind: runReconnect, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: "test-bridge"}},
			stored: &storedCopy{runMsg{900, "old", pEpoch + 5000}, pEpoch, "", ""},
			want:   want{written: true, start: "reconnect"},
		},
		"a reconnect the other bridge recorded as a restart": {
			kind: runReconnect, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other},
				{Epoch: now - 100, FirstSeq: 2, FirstDigest: dg("d2"), FirstReceivedAtMs: now - 100, Start: "restart", Bridge: other}},
			stored: &storedCopy{runMsg{7, "d7", now + 10}, now - 100, "restart", ""},
			want:   want{epoch: now - 100, start: "restart", reads: 1},
		},
		// This bridge was stopped (SIGSTOP) while the other started and, seeing none of its FPMs,
		// recorded the run anew: once running again it takes the other's epoch from its FPMs.
		"a resume after another bridge recorded the run anew": {
			kind: runResume, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: "test-bridge"},
				{Epoch: now - 2000, FirstSeq: 3, FirstDigest: dg("x3"), FirstReceivedAtMs: now - 2000, Bridge: other}},
			stored: &storedCopy{runMsg{8, "d8", now + 25}, now - 2000, "", ""},
			want:   want{epoch: now - 2000, start: "", reads: 1},
		},
		"a resume alone: the run goes on": {
			kind: runResume, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: "test-bridge"}},
			want: want{epoch: pEpoch, start: "", reads: 1},
		},
		// The newest FPM is of a later run; the other bridge's copies of this run's first messages, stored
		// earlier, show it (this bridge lags, or its run ended after a few messages).
		"the other bridge's copies of the run's first messages, behind newer ones": {
			kind: runStart, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}, {Epoch: now - 40, Bridge: other}},
			earlier: []storedCopy{{runMsg{900, "old", now - 5000}, pEpoch, "", ""}, {runMsg{8, "d8", now + 15}, now - 40, "", ""}, {runMsg{9, "d9", now + 35}, now - 40, "", ""}},
			stored:  &storedCopy{runMsg{0, "next", now + 900}, now + 880, "restart", ""},
			want:    want{epoch: now - 40, reads: 1},
		},
		// This bridge resolves its first run late (its publisher started after its reader had received
		// 600 messages), and the other bridge's publishing lags its own reader: the newest FPM stored is
		// one this bridge received 400 messages ago.
		"resolved late, the other bridge lagging behind this one's reader": {
			kind: runStart, t0: now - 2000, more: 600, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}},
			stored: &storedCopy{runMsg{210, "d210", now - 2000 + 60 + 200}, pEpoch, "", ""},
			want:   want{epoch: pEpoch, reads: 1},
		},
		// This bridge was stopped while the publisher restarted and the other bridge stored the new run's
		// first numbers, then stopped; this one joins the run at the next number: they share no message.
		"a restart the other bridge stored up to the number before this bridge's first": {
			kind: runRestart, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other},
				{Epoch: now - 1500, FirstSeq: 0, FirstDigest: dg("x0"), FirstReceivedAtMs: now - 1500, Start: "restart", Bridge: other}},
			stored: &storedCopy{runMsg{2, "x2", now - 1400}, now - 1500, "restart", ""},
			want:   want{epoch: now - 1500, start: "restart", reads: 1},
		},
		// The same, but the other bridge stopped a few numbers before this bridge's first, which came on a
		// new connection: its copies went from the run's first (0, 1.4 s ago) to 4 (0.6 s ago), a number
		// every 200 ms, which reaches 7 now. The numbers between were stored by neither bridge.
		"a restart the other bridge stored up to a number the run's pace carries to this bridge's first": {
			kind: runReconnect, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other},
				{Epoch: now - 1400, FirstSeq: 0, FirstDigest: dg("x0"), FirstReceivedAtMs: now - 1400, Start: "restart", Bridge: other}},
			stored: &storedCopy{runMsg{4, "x4", now - 600}, now - 1400, "restart", ""},
			want:   want{epoch: now - 1400, start: "restart", reads: 1},
		},
		// The same for this bridge's first run after it started: the other bridge's copies went from the
		// run's first (0, 1.4 s ago) to 4 (0.6 s ago) and its copies of the numbers both received are
		// held up (its process stopped, its broker away), to be stored after this bridge's.
		"starting while the other bridge's copies of the run stop a few numbers before at its pace": {
			kind: runStart, t0: now, runs: recordedFrom(0, now-1400),
			stored: &storedCopy{runMsg{4, "x4", now - 600}, now - 1400, "", ""},
			want:   want{epoch: now - 1400, start: "", reads: 1},
		},
		// `fpmbus up` restarted into a run both bridges were storing: their copies interleave, and the
		// newest is this bridge's previous instance's (5), the other's further copies held up. The
		// other's copy just before it (4), at the run's pace, reaches this run's first: the run goes on.
		"restarted into a run whose newest copy is this bridge's previous instance's, the other's just before it": {
			kind: runStart, t0: now, runs: recordedFrom(0, now-1400),
			earlier: []storedCopy{{runMsg{4, "x4", now - 600}, now - 1400, "", ""}},
			stored:  &storedCopy{runMsg{5, "x5", now - 60_000}, now - 1400, "", "test-bridge"},
			want:    want{epoch: now - 1400, start: "", reads: 1},
		},
		// A lone bridge restarted: only its previous instance's copies are stored, and it begins a new
		// epoch, as a lone bridge always has.
		"restarted into a run only this bridge's previous instance stored": {
			kind: runStart, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other},
				{Epoch: now - 1400, FirstSeq: 0, FirstDigest: dg("x0"), FirstReceivedAtMs: now - 1400, Bridge: "test-bridge"}},
			earlier: []storedCopy{{runMsg{4, "x4", now - 60_100}, now - 1400, "", "test-bridge"}},
			stored:  &storedCopy{runMsg{5, "x5", now - 60_000}, now - 1400, "", "test-bridge"},
			want:    want{written: true},
		},
		// Nothing of the other bridge's is stored: its copies are held up (its process stopped, its
		// broker away), but it recorded the run from 2, received 250 ms before this bridge's first, 7:
		// where this run's own pace (a number every 50 ms, 7 to 14) puts it then.
		"starting while the other bridge's copies are held up, its record where this run's pace was": {
			kind: runStart, t0: now, every: 50, more: 5, runs: recordedFrom(2, now-250),
			want: want{epoch: now - 250, start: "", reads: 1},
		},
		// This bridge was stopped a tenth of a second into the run (7 to 11, a number every 25 ms) and
		// agrees it at its stop: its own pace, over those few numbers, carries 7 back to 4 at the other
		// bridge's record.
		"a run this bridge received for a tenth of a second, the other's record where its pace was": {
			kind: runStart, t0: now, every: 25, more: 2, runs: recordedFrom(4, now-75),
			want: want{epoch: now - 75, start: "", reads: 1},
		},
		"a run this bridge received for a tenth of a second, the other's record before its pace reaches back": {
			kind: runStart, t0: now, every: 25, more: 2, runs: recordedFrom(4, now-200),
			want: want{written: true},
		},
		// The other bridge joined this run further on and recorded it from 12, received 250 ms after
		// this bridge's first, 7 (this bridge's own record of it failed: a bucket outage): where this
		// run's own pace (a number every 50 ms, 7 to 14) was then.
		"a run another bridge recorded from further on, where this run's pace was when it received it": {
			kind: runStart, t0: now, every: 50, more: 5, runs: recordedFrom(12, now+250),
			want: want{epoch: now + 250, start: "", reads: 1},
		},
		"a run another bridge recorded from further on, where this run's pace was not": {
			kind: runStart, t0: now, every: 50, more: 5, runs: recordedFrom(30, now+250),
			want: want{written: true},
		},
		// A number a second here (7 to 14): the other bridge recorded the run from 1, 6 s before this
		// bridge's first (it was held up by a full disk meanwhile, storing nothing).
		"starting while the other bridge's copies are held up, its record seconds before where this run's pace was": {
			kind: runStart, t0: now, every: 1000, more: 5, runs: recordedFrom(1, now-6000),
			want: want{epoch: now - 6000, start: "", reads: 1},
		},
		// The same record 300 ms earlier: this run's pace carries 7 back to below 0 then, not to 2: this
		// run may have begun after that one's first message (a restart), so it is recorded anew.
		"starting after another bridge's record the run's pace does not reach back to": {
			kind: runStart, t0: now, every: 50, more: 5, runs: recordedFrom(2, now-550),
			want: want{written: true},
		},
		// At that pace the run the other bridge stored (0 at 2.4 s ago, 4 at 1.6 s ago) would be at 12
		// now: this bridge's 7 may be a restart after it, at about the same pace.
		"a restart after the run the other bridge stored, at its pace, is a run of its own": {
			kind: runReconnect, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other},
				{Epoch: now - 2400, FirstSeq: 0, FirstDigest: dg("x0"), FirstReceivedAtMs: now - 2400, Start: "restart", Bridge: other}},
			stored: &storedCopy{runMsg{4, "x4", now - 1600}, now - 2400, "restart", ""},
			want:   want{written: true, start: "reconnect"},
		},
		// The other bridge recorded the restart from the number just before this bridge's first message
		// (this one connected a moment later), and none of its FPMs is stored yet.
		"a restart the other bridge recorded from the number before this bridge's first": {
			kind: runRestart, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other},
				{Epoch: now - 50, FirstSeq: 2, FirstDigest: dg("x2"), FirstReceivedAtMs: now - 50, Start: "restart", Bridge: other}},
			want: want{epoch: now - 50, start: "restart", reads: 1},
		},
		// The number just before, but received a minute before: another run's.
		"the number before this bridge's first, received long before, is no evidence": {
			kind: runRestart, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other},
				{Epoch: now - 61_000, FirstSeq: 0, FirstDigest: dg("x0"), FirstReceivedAtMs: now - 61_000, Start: "restart", Bridge: other}},
			stored: &storedCopy{runMsg{2, "x2", now - 60_000}, now - 61_000, "restart", ""},
			want:   want{written: true, start: "restart"},
		},
		// A deterministic publisher rerun at once: the run before (one message, identical bytes) and
		// this run both stored their 7 within evidenceTolerance of this bridge's 7, each under its own
		// epoch; the other bridge's newest copy is one this bridge did not receive. The copy received
		// nearest to this bridge's is this run's.
		"a rerun of identical bytes within the tolerance: the nearer copy is the run's": {
			kind: runStart, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}},
			earlier: []storedCopy{{runMsg{7, "d7", now - 150}, now - 150, "", ""}, {runMsg{7, "d7", now + 2}, now + 2, "restart", ""}},
			stored:  &storedCopy{runMsg{12, "x12", now + 300}, now + 2, "restart", ""},
			want:    want{epoch: now + 2, start: "restart", reads: 1},
		},
		// Both runs recorded, this bridge lagging: the run it received and the rerun that began 150 ms
		// later with the same bytes.
		"a rerun of identical bytes within the tolerance, both recorded: the nearer run is this one": {
			kind: runStart, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other},
				{Epoch: now - 3, FirstSeq: 7, FirstDigest: dg("d7"), FirstReceivedAtMs: now - 3, Start: "restart", Bridge: other},
				{Epoch: now + 150, FirstSeq: 7, FirstDigest: dg("d7"), FirstReceivedAtMs: now + 150, Start: "restart", Bridge: other}},
			want: want{epoch: now - 3, start: "restart", reads: 1},
		},
		// Same bytes at the same number, but received long before: an earlier run's heartbeat.
		"the same bytes an earlier run stored are no evidence": {
			kind: runStart, t0: now, runs: []streams.RunEntry{{Epoch: pEpoch, Bridge: other}},
			stored: &storedCopy{runMsg{7, "d7", now - 3000}, pEpoch, "", ""},
			want:   want{written: true},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if tc.fromStart {
				start := time.Now().UnixMilli()
				tc.t0 += start
				// Negative epochs and receive times of recorded runs and copies are offsets too.
				rel := func(v *int64) {
					if *v < 0 {
						*v += start
					}
				}
				runs := slices.Clone(tc.runs)
				for i := range runs {
					rel(&runs[i].Epoch)
					rel(&runs[i].FirstReceivedAtMs)
				}
				tc.runs = runs
				rel(&tc.want.epoch)
				if tc.stored != nil {
					c := *tc.stored
					c.recvMs += start
					tc.stored = &c
				}
				for _, l := range []*[]storedCopy{&tc.earlier, &tc.drain, &tc.late} {
					moved := make([]storedCopy, len(*l))
					for i, s := range *l {
						rel(&s.epoch)
						s.recvMs += start
						moved[i] = s
					}
					*l = moved
				}
			}
			b := b
			if tc.early {
				b = startBridge(t, env, []Endpoint{{URL: "tcp://127.0.0.1:1", DPRank: 0}}, nil).b
				tc.t0 = b.readyMs - 2500
				c := *tc.stored
				c.recvMs = tc.t0 - 100
				tc.stored = &c
				tc.late = []storedCopy{tc.late[0]}
				tc.late[0].recvMs = tc.t0 + 1
			}
			if tc.outage || tc.resumed {
				b = startBridge(t, env, []Endpoint{{URL: "tcp://127.0.0.1:1", DPRank: 0}}, nil).b
			}
			if tc.resumed {
				// The outage is the publisher's (set before any FPM reaches it).
				b.pub.outageSince, b.pub.resumedAt = time.Now().Add(-5*time.Second), time.Now().Add(-10*time.Millisecond)
			}
			if tc.own {
				// A bridge of its own, started just now: this instance, the one before it stored the copy.
				b = startBridge(t, env, []Endpoint{{URL: "tcp://127.0.0.1:1", DPRank: 0}}, nil).b
				tc.t0 = time.Now().UnixMilli() - 600
				at := min(tc.t0-1000, b.startMs-100) // before this instance started, before the run's first here
				c := *tc.stored
				c.recvMs, c.bridge = at, b.cfg.BridgeID
				tc.stored = &c
				tc.late = []storedCopy{tc.late[0]}
				tc.late[0].recvMs = tc.t0 + 1
			}
			ctx := context.Background()
			k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: name, DPRank: 0}
			put := func(runs []streams.RunEntry) {
				if runs == nil {
					return
				}
				rec := streams.RunRecord{Key: k}
				for _, e := range runs {
					rec.Add(e)
				}
				body, _ := json.Marshal(rec)
				if _, err := b.runsKV.Put(ctx, streams.BridgeRunKey(k), body); err != nil {
					t.Fatal(err)
				}
			}
			store := func(s *storedCopy) {
				if s == nil {
					return
				}
				m := nats.NewMsg(streams.FPMSubject(k))
				m.Header.Set(streams.HeaderMsgID, streams.FPMMsgID(k, s.seq, dg(s.digest), s.epoch))
				m.Header.Set(streams.HeaderSeq, strconv.FormatUint(s.seq, 10))
				m.Header.Set(streams.HeaderEpoch, strconv.FormatInt(s.epoch, 10))
				m.Header.Set(streams.HeaderReceivedAt, strconv.FormatInt(s.recvMs, 10))
				m.Header.Set(streams.HeaderBridge, cmp.Or(s.bridge, other))
				if s.start != "" {
					m.Header.Set(streams.HeaderRunStart, s.start)
				}
				m.Data = []byte(`{}`)
				if _, err := env.JS.PublishMsg(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			put(tc.runs)
			for _, s := range tc.earlier {
				store(&s)
			}
			store(tc.stored)

			// The run under test, as this bridge's reader saw it: messages 7, 8, 9 (digests d7, d8, d9),
			// 20 ms apart, after a previous run of the key (a restart goes back, a reconnect comes on a new
			// connection); ended: a later run began.
			e := b.epochs
			var prev *run
			if tc.kind != runStart {
				prev, _ = e.observe(k, 5, tc.t0-1000, dg("p5"), 0, 1<<32|1)
				prev.agreed, prev.agreedStr = pEpoch, strconv.FormatInt(pEpoch, 10)
			}
			first := runMsg{7, "d7", tc.t0}
			session, firstSeq := uint64(2<<32|2), uint64(7) // a new connection
			if tc.kind == runResume {
				session = 1<<32 | 2 // the same connection, a new session
			}
			if tc.kind == runRestart {
				first, firstSeq = runMsg{3, "d3", tc.t0}, 3 // below the previous run's 5
			}
			r, _ := e.observe(k, firstSeq, tc.t0, dg(first.digest), 0, session)
			step := cmp.Or(tc.every, 20)
			for i, q := range []uint64{firstSeq + 1, firstSeq + 2} {
				e.observe(k, q, tc.t0+step*int64(i+1), dg("d"+strconv.FormatUint(q, 10)), 0, session)
			}
			if tc.kind == runRestart {
				// The other bridge's messages 7, 8 are this run's too.
				for i, q := range []uint64{7, 8} {
					e.observe(k, q, tc.t0+40+int64(i), dg("d"+strconv.FormatUint(q, 10)), 0, session)
				}
			}
			for i := range tc.more {
				q := firstSeq + 3 + i
				at := tc.t0 + 60 + int64(i)
				if tc.every > 0 {
					at = tc.t0 + tc.every*int64(3+i)
				}
				e.observe(k, q, at, dg("d"+strconv.FormatUint(q, 10)), 0, session)
			}
			if tc.ended {
				e.observe(k, 0, tc.t0+9000, dg("next0"), 0, 3<<32|3)
			}
			if r.kind != tc.kind {
				t.Fatalf("run kind %v, want %v", r.kind, tc.kind)
			}
			reads := 0
			hook := func(rr *run) {
				if rr != r {
					return
				}
				reads++
				if reads == 1 && tc.between != nil {
					runs, s := tc.between(k, first)
					put(runs)
					store(s)
				}
				if i := reads - 2; i >= 0 && i < len(tc.drain) {
					store(&tc.drain[i])
				}
				if reads == 2+len(tc.drain) {
					for _, s := range tc.late {
						store(&s)
					}
				}
			}
			prevEpoch, prevStart := int64(0), runStart
			if prev != nil {
				prevEpoch = pEpoch
			}
			if tc.held {
				r.heldSince = time.Now().Add(-3 * time.Second)
			}
			if tc.outage {
				r.outage = time.Now().Add(-3 * time.Second)
			}
			b.noteOutage(r)
			got, start, err := b.agreeRunWith(r, prevEpoch, prevStart, hook)
			if err != nil {
				t.Fatal(err)
			}
			var rec streams.RunRecord // none: nobody recorded the publisher, this bridge neither
			switch entry, err := b.runsKV.Get(ctx, streams.BridgeRunKey(k)); {
			case errors.Is(err, jetstream.ErrKeyNotFound) && tc.runs == nil:
			case err != nil:
				t.Fatal(err)
			default:
				if err := json.Unmarshal(entry.Value(), &rec); err != nil {
					t.Fatal(err)
				}
			}
			var mine *streams.RunEntry
			for i, re := range rec.Entries() {
				if re.Bridge == "test-bridge" && re.Epoch == got && re.FirstReceivedAtMs != 0 {
					mine = &rec.Entries()[i]
				}
				if i > 0 && re.Epoch <= rec.Entries()[i-1].Epoch {
					t.Fatalf("record epochs do not increase: %+v", rec)
				}
			}
			switch {
			case tc.want.written && (mine == nil || mine.FirstSeq != firstSeq || mine.FirstDigest != dg(first.digest) || mine.FirstReceivedAtMs != tc.t0 || mine.Start != tc.kind.String()):
				t.Fatalf("epoch %d: this bridge's run is not recorded as it saw it: %+v", got, rec)
			case !tc.want.written && got != tc.want.epoch:
				t.Fatalf("epoch %d, want %d (record %+v)", got, tc.want.epoch, rec)
			case !tc.want.written && mine != nil:
				t.Fatalf("adopted %d but recorded a run of its own: %+v", got, rec)
			case tc.want.written && tc.want.below != 0 && (got >= tc.want.below || got <= pEpoch):
				t.Fatalf("epoch %d: want it between the previous run's %d and the next one's %d", got, pEpoch, tc.want.below)
			}
			if start.String() != tc.want.start {
				t.Fatalf("agreed run start %q, want %q", start, tc.want.start)
			}
			t.Logf("epoch %d start %q after %d reads", got, start, reads)
			if tc.want.reads != 0 && reads != tc.want.reads {
				t.Fatalf("%d record reads, want %d", reads, tc.want.reads)
			}
		})
	}
}

// A redundant bridge that started while this bridge's publishing stalled (a full disk) found none of
// the run's FPMs and recorded it anew from a message both received. After the stall this bridge takes
// that epoch from that message on for what it has not stamped yet, so the two store one copy; what it
// stamped before keeps its id, and a record that is its own, of a message it did not receive, or of a
// number already stamped changes nothing.
func TestRunRecordedAnewWhileThePublisherStalled(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	h := startBridge(t, env, []Endpoint{{URL: "tcp://127.0.0.1:1", DPRank: 0}}, nil)
	b := h.b
	const pEpoch = 1_000_000
	t0 := time.Now().UnixMilli() - 2_000
	for name, tc := range map[string]struct {
		entry     streams.RunEntry
		next      uint64
		wantSplit bool
	}{
		"recorded by the other bridge from a message both received": {
			entry: streams.RunEntry{FirstSeq: 12, FirstDigest: dg("d12"), Bridge: "other-bridge"}, next: 10, wantSplit: true},
		"the message is already stamped": {
			entry: streams.RunEntry{FirstSeq: 12, FirstDigest: dg("d12"), Bridge: "other-bridge"}, next: 13},
		"a message this bridge did not receive": {
			entry: streams.RunEntry{FirstSeq: 12, FirstDigest: dg("x12"), Bridge: "other-bridge"}, next: 10},
		"its own record": {
			entry: streams.RunEntry{FirstSeq: 12, FirstDigest: dg("d12"), Bridge: "test-bridge"}, next: 10},
	} {
		t.Run(name, func(t *testing.T) {
			k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "stall-" + name, DPRank: 0}
			var r *run
			for q := uint64(7); q <= 20; q++ {
				rr, _ := b.epochs.observe(k, q, t0+20*int64(q), dg("d"+strconv.FormatUint(q, 10)), 0, 1<<32|1)
				if r == nil {
					r = rr
				}
			}
			r.agreed, r.agreedStr = pEpoch, strconv.FormatInt(pEpoch, 10)
			e2 := t0 + 20*12 + 3
			entry := tc.entry
			entry.Epoch, entry.FirstReceivedAtMs = e2, t0+20*12+3
			rec := streams.RunRecord{Key: k}
			rec.Add(streams.RunEntry{Epoch: pEpoch, FirstSeq: 7, Bridge: "test-bridge"})
			rec.Add(entry)
			body, _ := json.Marshal(rec)
			if _, err := b.runsKV.Put(context.Background(), streams.BridgeRunKey(k), body); err != nil {
				t.Fatal(err)
			}
			if err := b.afterStall(r, tc.next); err != nil {
				t.Fatal(err)
			}
			for q, want := range map[uint64]int64{11: pEpoch, 12: e2, 20: e2} {
				if !tc.wantSplit {
					want = pEpoch
				}
				if got, _, _ := r.epochFor(q); got != want {
					t.Fatalf("seq %d: epoch %d, want %d", q, got, want)
				}
			}
		})
	}
}

// A run agreed at the bridge's stop is over here at its last message, as one a later run followed is:
// runs the other bridge recorded as beginning after it bound its epoch from above (a bridge stopped a
// moment into a run, the publisher killed, restarted and recorded by the other bridge meanwhile).
// While the readers read, such a run may go on past its last message, and those runs bound it only
// from below.
func TestPlaceEpochOfARunAgreedAtTheStop(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		stopped bool
		below   bool // placed below the runs recorded after its last message
	}{
		"agreed at the stop":       {stopped: true, below: true},
		"agreed while reading yet": {stopped: false, below: false},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := &Bridge{cfg: Config{BridgeID: "test-bridge"}, log: testLogger(), epochs: newEpochs()}
			k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "w", DPRank: 0}
			const t0, prev = 1_800_000_000_000, 1_799_999_000_000
			var r *run
			for q := uint64(554); q <= 557; q++ {
				rr, _ := b.epochs.observe(k, q, t0+50*int64(q-554), dg("d"), 0, 1<<32|1)
				if r == nil {
					r = rr
				}
			}
			if tc.stopped {
				b.epochs.stopReading()
			}
			entries := []streams.RunEntry{
				{Epoch: prev, FirstSeq: 0, FirstReceivedAtMs: prev, Bridge: "other"},
				{Epoch: t0 + 300, FirstSeq: 0, FirstReceivedAtMs: t0 + 300, Start: "restart", Bridge: "other"},
				{Epoch: t0 + 6000, FirstSeq: 0, FirstReceivedAtMs: t0 + 6000, Start: "restart", Bridge: "other"},
			}
			got := b.placeEpoch(r, entries, prev)
			if below := got < t0+300; below != tc.below || got <= prev {
				t.Fatalf("epoch %d (first message here %d, runs recorded from %d and %d): below them %v, want %v", got, int64(t0), int64(t0+300), int64(t0+6000), below, tc.below)
			}
		})
	}
}
