package bridge

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/streams"
)

// Agreeing on publisher runs with the other bridges subscribed to the same publishers.
//
// Redundant bridges each receive every message of a publisher (ZMQ PUB sends to every subscriber) and
// publish it; JetStream keeps the first copy of each message id. For the stream to read as if one
// bridge had published it, every bridge must tag a run with the same epoch. Each bridge notices runs
// on its own (epoch.go: its first message of a key, the sequence going back, a reconnect), and before
// it publishes anything of a run (its first FPM or a drop marker of it) the publisher goroutine
// resolves the run's epoch against streams.BucketBridgeRuns, which keeps per publisher its recent runs
// (streams.RunRecord: epoch, the first message the recording bridge received, how the run began).
//
// A run is identified by its messages, never by which record a bridge happened to read: a bridge
// adopts an epoch only with evidence that the run is its own, a message it received in this run (the
// same number, the same payload digest, received within evidenceTolerance of the other bridge's
// receive time). In order:
//
//  1. The stream: an FPM of the key (the newest, or one of the first stored since the run's first
//     message, more of them when another bridge's newest copy is past the run's first; read from the
//     stream's leader) is one this bridge received in the run: its epoch is
//     the run's. For a reconnect or a resume that epoch may be the previous run's: another bridge
//     kept its connection and goes on storing the run (the connection broke, the publisher did not
//     restart). For a restart it must be newer than the previous run's. Or the newest FPM is another
//     bridge's copy of the number just before this run's first, received shortly before it
//     (continuedIn: the other bridge stored the run up to where this one joined it).
//  2. The record: a recorded run newer than the previous one began with a message this bridge
//     received in the run (both bridges connected before it was sent), or with the number just before
//     this run's first, received just before it: that run is this one.
//  3. Otherwise another bridge may still show its evidence: its FPMs appear, or it records the run.
//     The bridge looks again every liveProbeEvery until liveProbe after it received the run's first
//     message (for a run held while the bucket did not answer, after the bucket answered again) when
//     the run is its first of the key (a live bridge's FPMs show), a reconnect (a bridge that kept its
//     connection records nothing: only its FPMs show the run goes on), or a restart or a resume while
//     another bridge has recorded a run newer than the previous one (perhaps this one, seen first by a
//     bridge that connected earlier, so this bridge never received its first message, or recorded
//     anew by a bridge that started while this one was stopped; its FPMs will show it). A restart
//     nobody else recorded is written at once.
//  4. Nothing shows: a resumed run is the previous one going on (its connection did: the publisher
//     did not restart). Any other run is new: the bridge adds it to the record with a compare-and-set
//     at the revision it read (a conflict means another bridge wrote meanwhile: it looks again). Its
//     epoch is its local epoch (its receive time of the run's first message), raised above the
//     previous run's and every recorded run that began before this one ended here, and kept below the
//     recorded runs that began after it ended (this bridge lags the others and resolves a run they have
//     gone past), so a publisher's epochs increase with its runs whatever order the bridges resolve
//     them in.
//
// Why every interleaving of two bridges ends on one epoch, while both see the run and the lag between
// them is within liveProbe: whichever resolves first finds no evidence and records the run (possibly
// after waiting); the other, whether it reads before, during or after that write, either received the
// recorded first message (2), or sees the first bridge's FPMs of messages it received too (1: the
// first bridge publishes right after recording), or loses the compare-and-set and looks again. It
// never adopts a record it read before waiting: the epoch it adopts is the one its evidence carries,
// read after the wait. A bridge that lags by several runs finds each of its runs by its own messages
// (the record keeps streams.maxRecordedRuns runs), never takes the newest run for an older one, and
// places a run nobody recorded between the runs around it. A bridge started while the publisher was
// down (its first run of the key is the others' restart) waits for the live bridge's evidence instead
// of keeping the previous run's record. A reconnect seen by one bridge only is resolved by the other
// bridge's FPMs: the run goes on under its epoch, stored once. A bridge that was stopped (SIGSTOP, or
// starved: its reader notices, epoch.go's runResume) while another started and recorded the run anew
// re-agrees when it runs again and takes that epoch from the other's FPMs, from that run's first
// message on (what it received before is the previous run's, as the bridges then stored it). A bridge
// whose publishing stalled (a full disk, a broker restart) while another recorded its run anew does
// the same after the stall, for the FPMs it had not yet stamped (afterStall).
//
// How the agreed run began (streams.RunStart*: restart, reconnect, or none for a bridge's first run)
// goes with its epoch as header Fpm-Run-Start on every FPM of the run, the strongest of what the
// recording bridge and this bridge saw (a reconnect the other saw as a restart is a restart), so the
// gap detector classifies a run's start alike whichever bridge's copy it reads first.
//
// Epochs of a publisher therefore increase with its runs in the bucket, and since the epoch is part of
// every FPM's message id (streams.FPMMsgID), two publisher runs are stored as two runs even when their
// bytes agree, while the bridges that agreed on a run store each of its FPMs once.
//
// A bridge's first run of a key after it starts never re-stores what it stored before it stopped: ZMQ
// PUB delivers a message only to the subscribers connected when it is sent, so a restarted bridge
// receives only FPMs sent after its subscription joined, which no earlier instance received; what the
// earlier instance had in flight when it died is lost with its memory (a gap), never republished.
// Whether it adopts the live bridge's epoch or writes a new one therefore changes only how the gap
// detector reads the restart, not what is stored.
//
// While the connection is down the run's FPMs wait like any publish. While the bucket does not answer
// (a request times out or finds no responder: the server restarting, its store refusing writes on a
// full disk, a leader election; natsconn.Unavailable), they wait too, up to runHold from the first
// failure: the FPM stream is nearly always on the same server and disk, so they could not be stored
// meanwhile either, and an epoch of its own would make each redundant bridge store its own copy of the
// run. When the bucket cannot be opened, refuses otherwise (no permission), or has not answered for
// runHold, the bridge uses its local epoch (its receive time of the run's first message, strictly
// increasing per key) and logs it at error level; after a hold that ran out, later runs do so at once
// until the bucket answers again, so that a bucket that stays away never holds every run start for
// runHold. A bucket that did not answer when the bridge started is opened again at the next run to
// agree, which waits for it the same way (openRunBucket). A lone bridge still stores every run once
// and tells runs apart, but redundant bridges each tag the run with their own epoch, so each stores
// its own copy of every FPM of that run (never fewer: nothing is lost), and the gap detector reads the
// interleaved epochs as bridge restarts.
//
// Limits of the rule, stated. Each ends in one run stored under two epochs (each bridge's copy, never
// fewer), not in a loss, except the last:
//
//   - A live bridge whose publishing lags more than liveProbe behind this one's first message of a run
//     while its reader runs (its broker connection slow or away) shows nothing in time, unless its
//     newest stored FPM is a number below the run's first received within continuationWindow before
//     it, or its copies below the run's first go on being stored, however old (it is catching up, or
//     draining retries: the bridge looks on up to catchUpProbe). Past that, a bridge starting or
//     reconnecting writes a new epoch, as a bridge that is alone must, and the lagging bridge, which
//     saw no new run, keeps its own. (A bridge lagging more than the stream's duplicate
//     window, 30 s, stores its own copies whatever the epochs.)
//   - Where the bridges share no message of a run (this one joined it after the other stopped storing
//     it, started while the other's copies were held up, or connected a moment after the other
//     recorded its first message), the numbers show it: the other's
//     newest FPM is the number just before this one's first, received at most continuationWindow
//     earlier, or a number the run's own pace carries on to this one's first (runPace), or its
//     recorded run began with the number just before within evidenceTolerance, or at the number this
//     run's own pace, carried back or on, was at when it was received (epochs.ownPace). Where the
//     newest FPM is this bridge's previous instance's, the other bridge's copy stored just before it
//     counts (othersBeside). A publisher that
//     restarted in between and whose new run this bridge joined at exactly that next number, or at the
//     number the old run's pace predicts (the new run going faster than the old, by the old run's
//     newest number over the time between), would be taken for the run going on (its restart unseen
//     by the gap detector).
//   - Evidence needs the same message at about the same time: bridges whose clocks differ by more than
//     evidenceTolerance never find it (new epochs), nor do two when one read the run late (its process
//     stopped: its receive times late by the stall) and the other received it only then, and two runs whose FPMs at one number are the same
//     bytes received within evidenceTolerance of each other (idle heartbeats or a deterministic
//     publisher, restarted and run again in less than that) can be taken for one where only the other
//     run's copy is there to see (where both are, the copy received nearest to this bridge's wins).
//   - A bridge that missed a whole run the other recorded (disconnected or stopped throughout it) and
//     whose evidence for its next run does not show in time records that run after the missed one,
//     under its own epoch.
//   - A bridge that lags so far that a whole run reaches the stream after the next run's first FPMs
//     has its run placed between them; the gap detector, which reads the stream in order, takes those
//     FPMs for late messages of the runs around them, and names the placed run's first numbers under
//     its epoch only when the run was received well after all of the epoch before it and begins at or
//     below what that epoch got to, or its bridge saw it begin (consumers/gaps, placedRunBegins).
//   - The agreed Fpm-Run-Start is the recording bridge's knowledge: when a bridge started (no run
//     start) records a run a lagging bridge saw as a restart, the detector may read the restart as the
//     run going on, and the new run's first numbers it never received are not named.

const (
	// runAgreeTimeout bounds one run's resolution.
	runAgreeTimeout = 3 * time.Second
	// liveProbe is how long after receiving a run's first message a bridge looks for another bridge's
	// evidence that the run is one it recorded or goes on storing.
	liveProbe = 500 * time.Millisecond
	// liveProbeEvery is the interval between two looks.
	liveProbeEvery = 25 * time.Millisecond
	// catchUpProbe is how long after receiving a run's first message a bridge goes on looking while
	// another bridge is catching up with it: that bridge's newest FPM of the key is a number below this
	// run's first, received shortly before it (catchingUp). A redundant bridge that buffered through
	// a broker restart or a full disk stores the run's numbers late; taking a new epoch before its
	// copies arrive would store the run twice, under two epochs. Within runAgreeTimeout. The same
	// while that bridge visibly goes on storing copies of the key below this run's first, however long
	// ago it received them (draining a backlog of retries: trailing). Counted from the run's first
	// message, so the runs a bridge meets at once share one wait, however many publishers it serves.
	catchUpProbe = 2 * time.Second
	// trailingQuiet is how many looks (at least liveProbeEvery apart: 250 ms or more) a bridge goes
	// on after the last sign that a trailing bridge is storing (its newest copy of the key changed, or
	// was first seen): a bridge that stopped storing shows nothing new for that long. Counted in looks,
	// so that a loaded bridge, whose looks come late, never gives up sooner.
	trailingQuiet = 10
	// runHold is how long a run's FPMs wait for the bucket to answer before the run takes its local
	// epoch: longer than a server restart or a short full-disk episode, below the stream's duplicate
	// window, and short enough that the bridge's buffer rides it out at a node's rate.
	runHold = 10 * time.Second
	// runCASAttempts bounds the compare-and-set loop (each failure means another bridge wrote).
	runCASAttempts = 5
	// continuationWindow is how long before this bridge's first message of a run another bridge's copy
	// of the number just before it may have been received for the run to be taken as the one that
	// bridge stored (continuedIn): a bridge stopped or reconnecting for a few seconds.
	continuationWindow = 5 * time.Second
	// ownPaceWindow is how far apart in time this bridge's first message of a run and another bridge's
	// recorded first message may be for this run's own pace to join them (recordedEvidence): longer
	// than continuationWindow, since the pace, not the time, tells a restart (numbering from 0 again)
	// from the run going on, and a bridge started while the other's copies were held up by a full disk
	// or a broker restart joins a run the other recorded seconds before.
	ownPaceWindow = 30 * time.Second
	// minPaceSpan and minPaceNumbers bound what a run's pace is measured on (runPace): the other
	// bridge's copies from the run's recorded first message to its newest span at least this long and
	// this many numbers, so that one late message does not make a pace.
	minPaceSpan    = 200 * time.Millisecond
	minPaceNumbers = 4
	// minOwnPaceSpan is minPaceSpan for this bridge's own run (epochs.ownPace): its receive times come
	// from one reader and one clock, with no broker or other bridge between, and a bridge stopped a
	// moment into a run (it agrees the run at its stop) has only that moment's numbers to go on.
	minOwnPaceSpan = 80 * time.Millisecond
	// evidenceTolerance is how far apart two bridges' receive times of one message may be for them to
	// take it for the same message (clock offset, scheduling). Two runs whose FPMs at one number are the
	// same bytes (idle heartbeats, a deterministic publisher restarted) that close together cannot be
	// told apart by it: that takes a run, with the restart after it, shorter than this.
	evidenceTolerance = 500 * time.Millisecond
)

// openRunBucket opens (creating when missing) the agreed runs bucket. Without it the bridge tags runs
// with its local epochs (see above) and says so. A bucket that does not answer yet (the server
// restarting, its store refusing writes on a full disk) is opened again at the next run to agree
// (reopenRunBucket): a redundant bridge started during such an episode would otherwise store its own
// copy of every run for the rest of its life. So is one that Run was stopped before opening (the stop
// publishes what the bridge received meanwhile: its runs are agreed like any others).
func (b *Bridge) openRunBucket(ctx context.Context) {
	if ctx.Err() != nil {
		b.runsReopen = true
		return
	}
	kv, err := b.openRunsKV(ctx)
	if err != nil && ctx.Err() != nil && !errors.Is(err, natsconn.ErrRefused) {
		b.runsReopen = true
		return
	}
	if err != nil {
		if !errors.Is(err, natsconn.ErrRefused) && natsconn.Unavailable(err) {
			b.runsReopen = true
			b.log.Warn("agreed runs bucket does not answer yet; it is opened again when a publisher run is to be agreed",
				"bucket", streams.BucketBridgeRuns, "error", err)
			return
		}
		b.logRunsUnavailable(err)
		return
	}
	b.setRunBucket(kv)
}

// logRunsUnavailable says that the agreed runs bucket cannot be used, and what that costs.
func (b *Bridge) logRunsUnavailable(err error) {
	b.log.Error("agreed runs unavailable: redundant bridges each store their own copy of every FPM and disagree on epochs",
		"bucket", streams.BucketBridgeRuns, "error", err)
}

// openRunsKV opens (creating when missing) the agreed runs bucket.
func (b *Bridge) openRunsKV(ctx context.Context) (jetstream.KeyValue, error) {
	if b.opts.runsOpen != nil {
		if err := b.opts.runsOpen(); err != nil {
			return nil, err
		}
	}
	return b.openBucket(ctx, b.cfg.Streams.BridgeRunsBucket())
}

// setRunBucket makes kv the agreed runs bucket.
func (b *Bridge) setRunBucket(kv jetstream.KeyValue) {
	if b.opts.runsBucket != nil {
		kv = b.opts.runsBucket(kv)
	}
	b.runsKV, b.runsReopen = kv, false
}

// reopenRunBucket opens the agreed runs bucket again after it did not answer at start (openRunBucket),
// within runAgreeTimeout. A failure is returned: one that says the bucket does not answer holds the
// run (holdRun) and the next run tries again; any other (no permission), or any at stop (the FPMs are
// stored now or never), ends the tries, as at start. Publisher goroutine.
func (b *Bridge) reopenRunBucket() error {
	ctx, cancel := context.WithTimeout(context.Background(), runAgreeTimeout)
	defer cancel()
	kv, err := b.openRunsKV(ctx)
	if err != nil {
		if errors.Is(err, natsconn.ErrRefused) || !natsconn.Unavailable(err) || b.pub != nil && b.pub.final {
			b.runsReopen = false
			b.logRunsUnavailable(err)
		}
		return fmt.Errorf("bridge: open bucket %s: %w", streams.BucketBridgeRuns, err)
	}
	b.setRunBucket(kv)
	b.log.Info("agreed runs bucket open", "bucket", streams.BucketBridgeRuns)
	return nil
}

// errRunNotAgreed: a run's epoch could not be agreed because the broker is away; the FPM waits for it
// like for any publish (the publisher's recovery retries it once the connection is back).
var errRunNotAgreed = errors.New("bridge: publisher run not agreed yet: not connected")

// errRunHeld: a run's epoch could not be agreed because the bucket does not answer; the FPM waits for
// it like for any publish, up to runHold.
var errRunHeld = errors.New("bridge: publisher run not agreed yet: bucket " + streams.BucketBridgeRuns + " does not answer")

// runEpoch returns r's agreed epoch, resolving it (and the runs before it) first. While the connection
// is down it returns errRunNotAgreed and resolves nothing; any other failure makes the bridge use its
// local epoch for the run, and say so. Publisher goroutine.
func (b *Bridge) runEpoch(r *run) (int64, error) {
	if r.agreed != 0 {
		return r.agreed, nil
	}
	var prev int64
	prevStart, prevHdr := runStart, []string(nil)
	if r.prev != nil {
		var err error
		if prev, err = b.runEpoch(r.prev); err != nil {
			return 0, err
		}
		prevStart, prevHdr = r.prev.start, r.prev.startHdr
	}
	b.noteOutage(r)
	e, start, err := b.agreeRun(r, prev, prevStart)
	if err == nil {
		b.runsUnanswered = false
	} else {
		if (b.runsKV != nil || b.runsReopen) && !b.nc.IsConnected() {
			return 0, errRunNotAgreed
		}
		if b.holdRun(r, err) {
			return 0, errRunHeld
		}
		var ok bool
		if e, start, ok = b.storedEvidenceOnly(r, prev, prevStart); !ok {
			e, start = max(r.local, prev+1), strongest(r.kind, runStart)
			if r.kind == runResume {
				e, start = prev, prevStart // the run goes on: its connection did
			}
			b.log.Error("publisher run not agreed with other bridges; using this bridge's epoch: a redundant bridge stores its own copy of the run",
				"key", r.key.String(),
				"epoch", e, "first_seq", r.firstSeq, "error", err)
		}
	}
	r.agreed, r.agreedStr, r.start, r.prev = e, strconv.FormatInt(e, 10), start, nil
	if b.pub != nil {
		r.stalls = b.pub.stalls // agreed now: only a later stall is a reason to look again
	}
	if start != runStart {
		r.startHdr = []string{start.String()}
	}
	if r.split > r.firstSeq {
		r.before, r.beforeStr, r.beforeHdr = prev, strconv.FormatInt(prev, 10), prevHdr
	} else {
		r.split = 0
	}
	return e, nil
}

// storedEvidenceOnly looks once for r's epoch in the FPM stream alone (storedEvidence) when the runs
// bucket cannot be used: another bridge that stored r already, under the epoch it agreed or its own,
// stored FPMs this bridge received in r, and r takes that epoch, so that each FPM is stored once
// whatever the bucket does. Only while connected: at a stop without a broker it would wait in vain.
func (b *Bridge) storedEvidenceOnly(r *run, prev int64, prevStart runKind) (int64, runKind, bool) {
	if b.nc == nil || !b.nc.IsConnected() {
		return 0, 0, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), runAgreeTimeout)
	defer cancel()
	e, start, ok, _, err := b.storedEvidence(ctx, r, prev, nil, &trailing{})
	if err != nil || !ok {
		return 0, 0, false
	}
	e, start = b.takeStored(r, e, start, prev, prevStart, nil, " (the runs bucket not used)", 0)
	return e, start, true
}

// takeStored is r's epoch and how it began when another bridge's stored FPMs of it, which this
// bridge received in r, are under epoch e, their run begun as start: the previous run going on when
// e is its epoch (a reconnect that was no restart, a resume), else e's run. note ends the log line.
func (b *Bridge) takeStored(r *run, e int64, start runKind, prev int64, prevStart runKind, entries []streams.RunEntry, note string, waits int) (int64, runKind) {
	if e == prev {
		b.logRun(r, e, "goes on: another bridge's FPMs of it are ones this bridge received"+note, waits)
		return e, prevStart
	}
	b.logRun(r, e, "another bridge's FPMs of it are ones this bridge received"+note, waits)
	b.splitResumed(r, e, entries)
	return e, strongest(start, r.kind)
}

// noteOutage records in r the publishing outage it is first agreed in or after: publishing is
// recovering from one, or r was received before publishing resumed from the last one (queued behind
// the runs and FPMs the outage held). Publisher goroutine.
func (b *Bridge) noteOutage(r *run) {
	if p := b.pub; r.outage.IsZero() && p != nil && (p.recovering || time.UnixMilli(r.firstRecvMs()).Before(p.resumedAt)) {
		r.outage = p.outageSince
	}
}

// holdRun reports whether r's FPMs wait for the bucket after err (see runHold), and says so once per
// run and when the hold runs out.
func (b *Bridge) holdRun(r *run, err error) bool {
	if b.runsKV == nil && !b.runsReopen || b.runsUnanswered || !natsconn.Unavailable(err) || b.pub != nil && b.pub.final {
		return false // at stop the FPMs are stored now or never: under the local epoch
	}
	now := b.now()
	if r.heldSince.IsZero() {
		r.heldSince = now
		b.log.Warn("publisher run not agreed yet: its FPMs wait for the bucket to answer",
			"bucket", streams.BucketBridgeRuns, "key", r.key.String(), "first_seq", r.firstSeq, "hold", runHold, "error", err)
		return true
	}
	if now.Sub(r.heldSince) < runHold {
		return true
	}
	b.runsUnanswered = true
	return false
}

// agreeRun resolves r's epoch, and how the agreed run began, through the bucket and the stream; prev
// is the previous run's agreed epoch (0 if none) and prevStart how it began.
func (b *Bridge) agreeRun(r *run, prev int64, prevStart runKind) (int64, runKind, error) {
	return b.agreeRunWith(r, prev, prevStart, nil)
}

// agreeRunWith is agreeRun calling afterRead, when set, after each read of the record (tests: another
// bridge acting between this bridge's read and its decision).
func (b *Bridge) agreeRunWith(r *run, prev int64, prevStart runKind, afterRead func(*run)) (int64, runKind, error) {
	if b.runsKV == nil && b.runsReopen {
		if err := b.reopenRunBucket(); err != nil {
			return 0, 0, err
		}
	}
	if b.runsKV == nil {
		return 0, 0, errors.New("bucket " + streams.BucketBridgeRuns + " not open")
	}
	ctx, cancel := context.WithTimeout(context.Background(), runAgreeTimeout)
	defer cancel()
	key := streams.BridgeRunKey(r.key)
	var deadline, catchUpDeadline time.Time
	var trail trailing
	waits := 0
	for conflicts := 0; conflicts < runCASAttempts; {
		rec, rev, err := b.readRun(ctx, key)
		if err != nil {
			return 0, 0, err
		}
		if deadline.IsZero() {
			// The wait ends liveProbe after the run's first message (the bridge's clock), so the
			// publishers a bridge meets at once share one wait and a lagging bridge does not wait at
			// all; for a bridge's first run of the key, received while it was starting, after it was
			// ready (readyMs: a restarted server recovers its store meanwhile, and the other bridges
			// reconnect to it); for a run held while the bucket did not answer, or first agreed while
			// publishing recovered from an outage (queued behind a held run, a full disk, a broker
			// away), after the first run of that outage was agreed (runsBackAt): the outage held the
			// other bridges too, and their evidence comes after it.
			anchor := time.UnixMilli(r.local)
			if r.kind == runStart {
				anchor = later(anchor, time.UnixMilli(b.readyMs))
			}
			if since := cmp.Or(r.heldSince, r.outage); !since.IsZero() {
				if !b.runsBackAt.After(since) {
					b.runsBackAt = b.now() // the first run of this outage agreed
				}
				anchor = later(anchor, b.runsBackAt)
			}
			since := b.now().Sub(anchor)
			deadline = time.Now().Add(min(max(liveProbe-since, 0), liveProbe))
			catchUpDeadline = time.Now().Add(min(max(catchUpProbe-since, 0), catchUpProbe))
		}
		if afterRead != nil {
			afterRead(r)
		}
		var entries []streams.RunEntry
		if rec != nil {
			entries = rec.Entries()
		}
		// 1. The newest FPM of the key in the stream is one this bridge received in r: its epoch is r's.
		e, start, ok, behind, err := b.storedEvidence(ctx, r, prev, entries, &trail)
		if err != nil {
			return 0, 0, err
		} else if ok {
			e, start := b.takeStored(r, e, start, prev, prevStart, entries, "", waits)
			return e, start, nil
		}
		// 2. A recorded run began with a message this bridge received in r: it is r.
		if e, ok := b.recordedEvidence(r, entries, prev); ok {
			b.logRun(r, e.Epoch, "recorded by "+e.Bridge+" with a first message this bridge received", waits)
			b.splitResumed(r, e.Epoch, entries)
			return e.Epoch, strongest(parseRunKind(e.Start), r.kind), nil
		}
		// 3. Another bridge may still show its evidence: wait for it, until the deadline (longer
		// while a bridge is catching up with this run).
		next := time.Now().Add(liveProbeEvery)
		if b.mayWait(r, entries, prev) && next.Before(deadline) ||
			(behind || trail.storing() || b.recordedAhead(r, entries, prev)) && next.Before(catchUpDeadline) {
			select {
			case <-ctx.Done():
				return 0, 0, ctx.Err()
			case <-time.After(liveProbeEvery):
			}
			waits++
			continue
		}
		// 4. A new run, placed among the recorded ones by when it began; a resumed run is the previous
		// one going on (its connection did), which no other bridge showed otherwise.
		if r.kind == runResume {
			b.logRun(r, prev, "goes on: no other bridge recorded it anew", waits)
			return prev, prevStart, nil
		}
		if rec == nil {
			rec = &streams.RunRecord{Key: r.key}
		}
		epoch := b.placeEpoch(r, entries, prev)
		rec.Key = r.key
		rec.Add(streams.RunEntry{Epoch: epoch, FirstSeq: r.firstSeq, FirstDigest: r.firstDigest, FirstReceivedAtMs: r.firstRecvMs(),
			Start: r.kind.String(), Bridge: b.cfg.BridgeID})
		body, _ := json.Marshal(rec)
		if rev == 0 {
			_, err = b.runsKV.Create(ctx, key, body)
		} else {
			_, err = b.runsKV.Update(ctx, key, body, rev)
		}
		if err == nil {
			b.logRun(r, epoch, "new: no other bridge showed it", waits)
			return epoch, r.kind, nil
		}
		if !casConflict(err) {
			return 0, 0, fmt.Errorf("bridge: write run of %s: %w", r.key, err)
		}
		conflicts++ // another bridge wrote meanwhile: look again
	}
	return 0, 0, fmt.Errorf("bridge: run of %s: %d compare-and-set conflicts", r.key, runCASAttempts)
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// splitResumed: a resumed run r (its connection went on: the publisher did not restart) that takes
// epoch, a run another bridge recorded while this one was stalled, takes it only from that run's first
// message on; what this bridge received before it is the previous run's, under its epoch, as the
// bridges that stored it then did.
func (b *Bridge) splitResumed(r *run, epoch int64, entries []streams.RunEntry) {
	if r.kind != runResume {
		return
	}
	for _, e := range entries {
		if e.Epoch == epoch && e.FirstSeq > r.firstSeq {
			r.split = e.FirstSeq
		}
	}
}

// logRun says how r's epoch was agreed (one line per publisher run: restarts, reconnects and a
// bridge's start are rare), with how long it waited for evidence.
func (b *Bridge) logRun(r *run, epoch int64, how string, waits int) {
	b.log.Info("publisher run agreed", "key", r.key.String(), "epoch", epoch, "first_seq", r.firstSeq,
		"seen_as", r.kind.describe(), "how", how, "waited", time.Duration(waits)*liveProbeEvery)
}

// firstRecvMs is when the bridge received r's first message.
func (r *run) firstRecvMs() int64 {
	if len(r.first) > 0 {
		return r.first[0].recvMs
	}
	return r.local
}

// sameMessage reports whether this bridge received message seq with payload digest in r at about
// recvMs (another bridge's receive time of it).
func (b *Bridge) sameMessage(r *run, seq uint64, digest string, recvMs int64) bool {
	_, ok := b.receivedApart(r, seq, digest, recvMs)
	return ok
}

// receivedApart reports how far apart (ms, at least 0) this bridge received message seq with digest
// in r and another bridge received it at recvMs, when that is within evidenceTolerance.
func (b *Bridge) receivedApart(r *run, seq uint64, digest string, recvMs int64) (int64, bool) {
	if digest == "" {
		return 0, false
	}
	at, ok := b.epochs.received(r, seq, digest)
	if !ok {
		return 0, false
	}
	d := max(at-recvMs, recvMs-at)
	return d, d <= evidenceTolerance.Milliseconds()
}

// storedEvidence looks in the stream for an FPM of r's key that this bridge received in r (same
// number, same bytes, received at about the same time by the bridge that stored it) and reports its
// epoch, with how its run began (its Fpm-Run-Start). It reads the newest FPM of the key (another bridge
// publishing live), then the FPMs stored from r's first message on, up to evidenceScan of them (another
// bridge that stored r's first messages, while this bridge resolves a run of which it received only a
// few before a later run began). Reads are from the stream's leader. A restart's run must be newer
// than the previous one; any other run may be the previous one going on. Without evidence, behind says
// whether the newest FPM shows another bridge catching up with r (catchingUp), and trail follows
// whether it shows another bridge storing copies below r's first (trailing).
func (b *Bridge) storedEvidence(ctx context.Context, r *run, prev int64, entries []streams.RunEntry, trail *trailing) (epoch int64, start runKind, ok, behind bool, err error) {
	stream := b.fpmStreamOf(r.key)
	m, err := natsconn.LastMsgFromLeader(ctx, b.js, stream, r.subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, 0, false, false, nil
	case err != nil:
		return 0, 0, false, false, err
	}
	if e, k, ok := b.evidenceIn(m, r, prev); ok {
		return e, k, true, false, nil
	}
	if e, k, ok := b.continuedIn(m, r, prev, entries); ok {
		return e, k, true, false, nil
	}
	newest := b.readNewest(m, prev)
	if o, err := b.othersBeside(ctx, stream, r, m, newest); err != nil {
		return 0, 0, false, false, err
	} else if o != nil {
		if e, k, ok := b.continuedIn(o, r, prev, entries); ok {
			return e, k, true, false, nil
		}
	}
	behind = b.catchingUp(newest, r)
	scan := evidenceScan
	if newest.overtook(r) {
		scan = trailScan
	}
	trail.saw(m, newest.trails(r))
	ev := b.epochs.evidence(r)
	last := m.Sequence
	m, err = natsconn.NextMsgFromLeaderAt(ctx, b.js, stream, r.subject, time.UnixMilli(r.firstRecvMs()).Add(-evidenceScanSkew))
	// Of several copies that are evidence, the one received nearest to when this bridge received it:
	// a rerun of identical bytes within evidenceTolerance stores the same number and bytes under its
	// own run's epoch too.
	found, bestApart := false, int64(0)
	for i := 0; i < scan && err == nil && m.Sequence < last; i++ {
		if e, k, apart, ok := b.evidenceApart(m, r, prev); ok && (!found || apart < bestApart) {
			found, bestApart, epoch, start = true, apart, e, k
		}
		if at, perr := strconv.ParseInt(m.Header.Get(streams.HeaderReceivedAt), 10, 64); perr == nil && at > ev.lastMs+evidenceTolerance.Milliseconds() {
			break // received after r's latest message here: nothing further can be r's yet
		}
		m, err = natsconn.NextMsgFromLeader(ctx, b.js, stream, r.subject, m.Sequence+1)
	}
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, 0, false, false, err
	}
	if found {
		return epoch, start, true, false, nil
	}
	return 0, 0, false, behind, nil
}

// othersBeside returns, when the key's newest FPM m (read as newest) is this bridge's previous
// instance's copy and r is this instance's first run of the key, the newest copy another bridge stored
// of the same run shortly before it (nil if none): redundant bridges storing one run interleave their
// copies, and the one that happens to be stored last says nothing of the other's, whose copies show
// the run going on (continuedIn) as they would had it been stored last. (`fpmbus up` restarted while a
// redundant bridge's further copies are held up: they are stored too late to be seen.) A lone bridge
// has no such copies: it begins a new epoch as before.
func (b *Bridge) othersBeside(ctx context.Context, stream string, r *run, m *jetstream.RawStreamMsg, newest newestCopy) (*jetstream.RawStreamMsg, error) {
	if !newest.current || newest.other || r.kind != runStart || newest.at >= b.startMs || newest.seq >= r.firstSeq {
		return nil, nil
	}
	epoch, _, _, _ := storedFPM(m)
	var found *jetstream.RawStreamMsg
	o, err := natsconn.NextMsgFromLeaderAt(ctx, b.js, stream, r.subject, time.UnixMilli(newest.at).Add(-besideScanBack))
	for i := 0; i < besideScan && err == nil && o.Sequence < m.Sequence; i++ {
		if e, _, _, ok := storedFPM(o); ok && e == epoch && o.Header.Get(streams.HeaderBridge) != b.cfg.BridgeID {
			found = o
		}
		o, err = natsconn.NextMsgFromLeader(ctx, b.js, stream, r.subject, o.Sequence+1)
	}
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, err
	}
	return found, nil
}

// besideScan bounds the FPMs othersBeside reads, from besideScanBack before the newest copy was
// received: enough for two bridges' interleaved copies of a publisher's last second.
const (
	besideScan     = 2 * runFirst
	besideScanBack = time.Second
)

// newestCopy is what the run evidence reads of the key's newest FPM when it is no evidence: its number
// and its bridge's receive time, whether it is under an epoch not older than the previous run's
// (current: of this run or the one before), and whether another bridge stored it.
type newestCopy struct {
	seq            uint64
	at             int64
	current, other bool
}

// readNewest reads m, the key's newest FPM, as a newestCopy (not current when its headers do not
// parse).
func (b *Bridge) readNewest(m *jetstream.RawStreamMsg, prev int64) newestCopy {
	epoch, seq, at, ok := storedFPM(m)
	return newestCopy{seq: seq, at: at, current: ok && epoch >= prev, other: m.Header.Get(streams.HeaderBridge) != b.cfg.BridgeID}
}

// trails reports whether c is another bridge's copy of a number below r's first: that bridge has
// not reached r yet.
func (c newestCopy) trails(r *run) bool { return c.current && c.other && c.seq < r.firstSeq }

// overtook reports whether c is another bridge's copy of r's first message or a later one: that
// bridge stored past r's first message, perhaps all at once after a stall, after a backlog of
// retries, and its copies of r's first messages, which this bridge received, may lie further back
// than evidenceScan reads.
func (c newestCopy) overtook(r *run) bool { return c.current && c.other && c.seq >= r.firstSeq }

// catchingUp reports whether c, the newest FPM of r's key, shows another bridge catching up with r:
// it trails r and was received at most continuationWindow before r's first message. Its copies of
// r's own messages may follow (the stream would then show a message both received), so the bridge
// looks for them up to catchUpProbe before writing an epoch of its own.
//
// The same for this bridge's own copy of a number below r's first stored by its previous instance
// (received before this one started), when r is its first run of the key: the run was live here a
// moment ago, and a redundant bridge that lost the same server (`fpmbus up` restarted with its
// embedded server) stores its buffered copies of it once it reconnects.
func (b *Bridge) catchingUp(c newestCopy, r *run) bool {
	ownEarlier := c.current && !c.other && r.kind == runStart && c.seq < r.firstSeq && c.at < b.startMs
	if !c.trails(r) && !ownEarlier {
		return false
	}
	d := r.firstRecvMs() - c.at
	return d >= 0 && d <= continuationWindow.Milliseconds()
}

// trailing follows, across one run's looks, whether another bridge is storing copies of the key
// below the run's first: the key's newest FPM trails (trails) and its stream sequence moves on. A
// bridge draining retries after a full disk or a broker restart stores numbers it received long ago,
// older than catchingUp accepts, yet its copies of the run's own messages come next; one that
// stopped storing shows the same newest copy look after look. Only the clock-free stream sequence
// counts, so servers and bridges need not agree on the time.
type trailing struct {
	lastSeq uint64 // stream sequence of the key's newest FPM if it trailed at the last look, else 0
	still   int    // looks since it was first seen or last moved on
}

// saw records the key's newest FPM m, which trails r or not.
func (t *trailing) saw(m *jetstream.RawStreamMsg, trails bool) {
	if !trails {
		t.lastSeq = 0
		return
	}
	t.still++
	if m.Sequence != t.lastSeq {
		t.lastSeq, t.still = m.Sequence, 0
	}
}

// trailScan bounds the FPMs storedEvidence reads from r's first message on once another bridge went
// past r's first (overtook): its retried backlog, then r's first messages.
const trailScan = 2 * runFirst

// storing reports whether the next look may still find the trailing bridge's copies of the run (up to
// the catch-up deadline, which the caller keeps).
func (t *trailing) storing() bool {
	return t.lastSeq != 0 && t.still < trailingQuiet
}

// evidenceScan bounds the FPMs storedEvidence reads from a run's first message on, and it begins
// evidenceScanSkew before this bridge received that message (another bridge stored its copy when it
// received it, or later).
const (
	evidenceScan     = 16
	evidenceScanSkew = 50 * time.Millisecond
)

// storedFPM reads what the run evidence needs from a stored FPM's headers: its epoch (positive), its
// sequence number and its bridge's receive time; ok is false when one is missing or malformed.
func storedFPM(m *jetstream.RawStreamMsg) (epoch int64, seq uint64, at int64, ok bool) {
	epoch, err1 := strconv.ParseInt(m.Header.Get(streams.HeaderEpoch), 10, 64)
	seq, err2 := strconv.ParseUint(m.Header.Get(streams.HeaderSeq), 10, 64)
	at, err3 := strconv.ParseInt(m.Header.Get(streams.HeaderReceivedAt), 10, 64)
	return epoch, seq, at, err1 == nil && err2 == nil && err3 == nil && epoch > 0
}

// evidenceIn reports m's epoch if m is an FPM this bridge received in r (see storedEvidence).
func (b *Bridge) evidenceIn(m *jetstream.RawStreamMsg, r *run, prev int64) (int64, runKind, bool) {
	epoch, start, _, ok := b.evidenceApart(m, r, prev)
	return epoch, start, ok
}

// evidenceApart is evidenceIn with how far apart the two bridges received the message (ms).
func (b *Bridge) evidenceApart(m *jetstream.RawStreamMsg, r *run, prev int64) (int64, runKind, int64, bool) {
	epoch, seq, at, ok := storedFPM(m)
	if !ok || epoch < prev || (r.kind == runRestart && epoch == prev) {
		return 0, 0, 0, false
	}
	apart, ok := b.receivedApart(r, seq, msgIDDigest(m.Header.Get(streams.HeaderMsgID)), at)
	if !ok {
		return 0, 0, 0, false
	}
	return epoch, parseRunKind(m.Header.Get(streams.HeaderRunStart)), apart, true
}

// continuedIn reports m's epoch if m, the newest FPM of r's key, is another bridge's copy of a number
// before r's first message, received before it and at most continuationWindow before, and the run
// reaches r's first number from it: the number just before, or the number the run's pace carries it to
// when r's first message was received (runPace, the run recorded in entries). That bridge stored the
// run up to where it stopped, and this one joined it further on (this bridge missed the run's first
// messages: it was stopped, or connected late, and the other stopped storing before this one began),
// so the two share no message to show it. A bridge's first run after it starts too: a redundant
// bridge started while the other's publishing was held up (its process stopped, its broker away)
// shares no message with what the other stored so far, and the other's copies of the numbers both
// received come only later; an epoch of its own would store them twice. A publisher restart between
// the two whose new run this bridge joined at exactly that number would be taken for the run going
// on: a coincidence of numbers within the window, which the limits above state.
func (b *Bridge) continuedIn(m *jetstream.RawStreamMsg, r *run, prev int64, entries []streams.RunEntry) (int64, runKind, bool) {
	epoch, seq, at, ok := storedFPM(m)
	if !ok || epoch < prev || (r.kind == runRestart && epoch == prev) ||
		m.Header.Get(streams.HeaderBridge) == b.cfg.BridgeID || seq >= r.firstSeq {
		return 0, 0, false
	}
	if d := r.firstRecvMs() - at; d < -evidenceTolerance.Milliseconds() || d > continuationWindow.Milliseconds() {
		return 0, 0, false
	}
	if seq+1 != r.firstSeq && !runPace(entries, epoch, seq, at).reaches(r.firstSeq, r.firstRecvMs()) {
		return 0, 0, false
	}
	return epoch, parseRunKind(m.Header.Get(streams.HeaderRunStart)), true
}

// pace is how fast a run's numbers went, anchored at one of them (number seq, received at atMs): a
// recorded run's from its recorded first message to another bridge's newest stored copy (runPace), or
// this bridge's run from its first message here to its latest (epochs.ownPace, anchored at the first).
// The zero pace reaches nothing.
type pace struct {
	seq   uint64
	atMs  int64
	perMs float64 // 0: no pace
}

// runPace is the pace of the run recorded under epoch whose newest stored copy is number last,
// received at lastMs, anchored there; zero when the run is not recorded or its copies span too little
// to measure it.
func runPace(entries []streams.RunEntry, epoch int64, last uint64, lastMs int64) pace {
	for _, e := range entries {
		if e.Epoch != epoch || e.FirstSeq >= last {
			continue
		}
		n, span := last-e.FirstSeq, lastMs-e.FirstReceivedAtMs
		if n < minPaceNumbers || span < minPaceSpan.Milliseconds() {
			return pace{}
		}
		return pace{seq: last, atMs: lastMs, perMs: float64(n) / float64(span)}
	}
	return pace{}
}

// reaches reports whether the run, going on at its pace from the anchor (the newest copy), was at
// number seq when seq was received at atMs: within a fifth of the numbers between (at least 2:
// scheduling, one forward pass more or less), and within half the anchor's number. A publisher that
// restarted after the newest copy numbers from 0 again: at the same pace it is behind the run going on
// by at least that newest number, so the bound keeps a restart at about the run's pace from being
// taken for it.
func (p pace) reaches(seq uint64, atMs int64) bool {
	if p.perMs == 0 || seq <= p.seq || atMs <= p.atMs {
		return false
	}
	predicted := float64(p.seq) + float64(atMs-p.atMs)*p.perMs
	tolerance := min(max(2, float64(seq-p.seq)/5), float64(p.seq)/2)
	return math.Abs(predicted-float64(seq)) <= tolerance
}

// reachedBack reports whether the run, at its pace, was at number seq at atMs, before the anchor (its
// first message here): within a fifth of the numbers between (at least 2) and within half of seq (at
// least 1). A run that began after atMs, a restart, numbers from 0 then: at the same pace it is carried
// back below 0 at atMs, and the bound keeps it from matching.
func (p pace) reachedBack(seq uint64, atMs int64) bool {
	if p.perMs == 0 || seq >= p.seq || atMs >= p.atMs {
		return false
	}
	predicted := float64(p.seq) - float64(p.atMs-atMs)*p.perMs
	tolerance := min(max(2, float64(p.seq-seq)/5), max(float64(seq)/2, 1))
	return math.Abs(predicted-float64(seq)) <= tolerance
}

// msgIDDigest is the payload digest in an FPM's message id (streams.FPMMsgID: <key>:<seq>:<digest>:e<epoch>),
// "" if the id is not of that form.
func msgIDDigest(id string) string {
	i := strings.LastIndexByte(id, ':')
	if i < 0 || !strings.HasPrefix(id[i:], ":e") {
		return ""
	}
	j := strings.LastIndexByte(id[:i], ':')
	if j < 0 {
		return ""
	}
	return id[j+1 : i]
}

// recordedEvidence returns the recorded run, newer than the previous one, whose first message (as the
// bridge that recorded it received it) this bridge received in r at about the same time; else one
// another bridge recorded from the number just before r's first, or from where r's own pace, carried
// back or on, was when that bridge received it.
func (b *Bridge) recordedEvidence(r *run, entries []streams.RunEntry, prev int64) (streams.RunEntry, bool) {
	// The nearest in time, should two recorded runs begin with the same bytes within evidenceTolerance
	// (a deterministic publisher rerun at once).
	var best streams.RunEntry
	found, bestApart := false, int64(0)
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		if e.Epoch <= prev {
			continue
		}
		if apart, ok := b.receivedApart(r, e.FirstSeq, e.FirstDigest, e.FirstReceivedAtMs); ok && (!found || apart < bestApart) {
			best, found, bestApart = e, true, apart
		}
	}
	if found {
		return best, true
	}
	// The recorded run began with the number just before this run's first, received just before it:
	// the recording bridge's first message is one this bridge missed (it connected a moment later).
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		if d := r.firstRecvMs() - e.FirstReceivedAtMs; e.Epoch > prev && e.Bridge != b.cfg.BridgeID &&
			e.FirstSeq+1 == r.firstSeq && d >= 0 && d <= evidenceTolerance.Milliseconds() {
			return e, true
		}
	}
	// The recorded run began at the number this run's own pace, carried back from its first message,
	// was at when the recording bridge received it: this bridge joined that run further on (started, or
	// connected, while the other's copies were held up, so that none is stored to show it).
	own := b.epochs.ownPace(r)
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		if d := r.firstRecvMs() - e.FirstReceivedAtMs; e.Epoch > prev && e.Bridge != b.cfg.BridgeID && e.FirstReceivedAtMs > 0 &&
			d > 0 && d <= ownPaceWindow.Milliseconds() && own.reachedBack(e.FirstSeq, e.FirstReceivedAtMs) {
			return e, true
		}
	}
	// Or it began at the number this run's own pace, carried on from its first message, was at when the
	// recording bridge received it: that bridge joined this run further on and recorded it before this
	// one could (its own write timed out: a bucket outage), and the recorded first message is one this
	// bridge received but no longer keeps (runFirst, runRecent).
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		if d := e.FirstReceivedAtMs - r.firstRecvMs(); e.Epoch > prev && e.Bridge != b.cfg.BridgeID &&
			d > 0 && d <= ownPaceWindow.Milliseconds() && own.reaches(e.FirstSeq, e.FirstReceivedAtMs) {
			return e, true
		}
	}
	return streams.RunEntry{}, false
}

// recordedAhead reports whether another bridge recorded a run, newer than the previous one, that began
// below r's first number and shortly before it (up to continuationWindow): r may be that run, which this
// bridge joined late (it started, or connected, after the run's first numbers), and the other bridge's
// copies of the messages both received, which show it, may be stored after the live probe (that bridge
// held up, storing its backlog). The bridge looks for them up to catchUpProbe.
func (b *Bridge) recordedAhead(r *run, entries []streams.RunEntry, prev int64) bool {
	for _, e := range entries {
		if d := r.firstRecvMs() - e.FirstReceivedAtMs; e.Epoch > prev && e.Bridge != b.cfg.BridgeID && e.FirstSeq < r.firstSeq &&
			d >= 0 && d <= continuationWindow.Milliseconds() {
			return true
		}
	}
	return false
}

// mayWait reports whether another bridge may still show that r is a run it recorded or goes on
// storing: some bridge recorded the publisher, and r is a bridge's first run of it (a live bridge's
// FPMs show), a reconnect (a bridge that kept its connection records nothing: only its FPMs show the
// run goes on), or a restart or a resume while another bridge recorded a run newer than the previous
// one (perhaps r, seen first by a bridge that connected earlier, or recorded anew by a bridge that
// started while this one was stalled, whose FPMs show it).
func (b *Bridge) mayWait(r *run, entries []streams.RunEntry, prev int64) bool {
	if len(entries) == 0 {
		return false
	}
	if r.kind == runStart || r.kind == runReconnect {
		return true
	}
	for _, e := range entries {
		if e.Epoch > prev && e.Bridge != b.cfg.BridgeID {
			return true
		}
	}
	return false
}

// placeEpoch chooses the epoch of a new run r: its local epoch, raised above the previous run's and
// every recorded run that began before r ended here, and kept below those that began after (this
// bridge is resolving runs the others have gone past, or agreeing at its stop a run its readers no
// longer read), so a publisher's epochs increase with its runs. A run not over here may go on past
// what has been received of it, so a recorded run that began after its last message bounds it only
// from below.
func (b *Bridge) placeEpoch(r *run, entries []streams.RunEntry, prev int64) int64 {
	ev := b.epochs.evidence(r)
	lower, upper, newest := prev, int64(math.MaxInt64), prev
	for _, e := range entries {
		newest = max(newest, e.Epoch)
		if e.Epoch <= prev {
			continue
		}
		began := e.FirstReceivedAtMs
		if began == 0 {
			began = e.Epoch
		}
		if ev.ended && began > ev.lastMs {
			upper = min(upper, e.Epoch)
		} else {
			lower = max(lower, e.Epoch)
		}
	}
	next := max(r.local, lower+1)
	switch {
	case next < upper:
	case lower+1 < upper:
		next = lower + 1
	default:
		next = newest + 1
		b.log.Error("no epoch left between the runs recorded before and after a publisher run; it is recorded after them: the gap detector reads its FPMs as late copies",
			"key", r.key.String(), "first_seq", r.firstSeq, "epoch", next)
	}
	return next
}

// readRun reads key's record and revision; nil when there is none.
func (b *Bridge) readRun(ctx context.Context, key string) (*streams.RunRecord, uint64, error) {
	e, err := b.runsKV.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("bridge: read run %s: %w", key, err)
	}
	var rec streams.RunRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		// A damaged record is replaced at its revision like an outdated one.
		return &streams.RunRecord{}, e.Revision(), nil
	}
	return &rec, e.Revision(), nil
}

// casConflict reports whether a KV create or update failed because the key changed meanwhile.
func casConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// stamp gives FPM item it its agreed epoch before its first publication: header Fpm-Epoch and its
// message id (streams.FPMMsgID), which its retries keep. Publisher goroutine.
func (b *Bridge) stamp(it *item) error {
	b.routeToShard(it)
	if it.agreed != 0 || it.run == nil {
		return nil
	}
	if _, err := b.runEpoch(it.run); err != nil {
		return err
	}
	if p := b.pub; p != nil && it.run.stalls != p.stalls {
		it.run.stalls = p.stalls
		if p.stallUnanswered != p.stalls && b.afterStall(it.run, it.seq) != nil {
			p.stallUnanswered = p.stalls // the bucket does not answer: the other runs do not ask
		}
	}
	e, str, h := it.run.epochFor(it.seq)
	it.agreed = e
	it.m.Header[streams.HeaderEpoch][0] = str
	it.m.Header[streams.HeaderMsgID][0] = streams.FPMMsgID(it.key, it.seq, it.digest, e)
	if h != nil {
		// Checked against the server's limit like the rest (limits.go): a header added to an FPM that
		// fit only without it is left off, and the gap detector reads that copy as the run going on.
		if m := b.pub.serverMax.Load(); m <= 0 || int64(encodedSize(it.msg)+len(streams.HeaderRunStart)+len(h[0])+4) <= m {
			it.m.Header[streams.HeaderRunStart] = h
		}
	}
	return nil
}

// afterStall looks, once after a stall of this bridge's publishing (a full disk, a broker restart),
// whether another bridge recorded r anew while this one could not store: a redundant bridge that
// started or reconnected meanwhile found none of r's FPMs in time and recorded a run of its own from a
// message this bridge received too. From that message on, r takes that run's epoch, so the two store
// one copy; next is the first FPM of r not yet stamped, and only FPMs from it on can change (a
// stamped FPM may be stored already: its retries keep its id). An answer that does not come, or no
// such record, leaves r as it is; a read that fails is returned, and the runs stamped after it in
// the same stall do not ask (each would hold the publisher for afterStallTimeout). Publisher
// goroutine.
func (b *Bridge) afterStall(r *run, next uint64) error {
	if b.runsKV == nil || r.split != 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), afterStallTimeout)
	defer cancel()
	rec, _, err := b.readRun(ctx, streams.BridgeRunKey(r.key))
	if err != nil || rec == nil {
		return err
	}
	for _, e := range rec.Entries() {
		if e.Epoch <= r.agreed || e.Bridge == b.cfg.BridgeID || e.FirstSeq < next || e.FirstSeq <= r.firstSeq ||
			!b.sameMessage(r, e.FirstSeq, e.FirstDigest, e.FirstReceivedAtMs) {
			continue
		}
		r.before, r.beforeStr, r.beforeHdr = r.agreed, r.agreedStr, r.startHdr
		r.agreed, r.agreedStr, r.split = e.Epoch, strconv.FormatInt(e.Epoch, 10), e.FirstSeq
		r.start, r.startHdr = strongest(parseRunKind(e.Start), runStart), nil
		if r.start != runStart {
			r.startHdr = []string{r.start.String()}
		}
		b.logRun(r, e.Epoch, fmt.Sprintf("recorded anew from seq %d by %s while this bridge's publishing stalled, a message this bridge received", e.FirstSeq, e.Bridge), 0)
		return nil
	}
	return nil
}

// afterStallTimeout bounds afterStall's read of the record.
const afterStallTimeout = 500 * time.Millisecond

// dropRangeEpoch returns the agreed epoch of drop range r's run, recording it in r for the logs, and
// how that run began (Fpm-Run-Start's value: the marker's run_start); the run's local epoch and what
// this bridge saw of its start when it has none or the broker is away (a marker is only built to be
// published once the broker is back, so that is rare; a bridge stopped while its store refused writes
// spools its markers unagreed). A marker may be all that is stored of a run, and its start is what
// tells the gap detector such a run from the one before going on. Publisher goroutine.
func (b *Bridge) dropRangeEpoch(r *dropRange) (int64, string) {
	if r.run == nil {
		return r.epoch, ""
	}
	if _, err := b.runEpoch(r.run); err == nil {
		var hdr []string
		r.epoch, _, hdr = r.run.epochFor(r.first)
		if len(hdr) > 0 {
			return r.epoch, hdr[0]
		}
		return r.epoch, ""
	}
	return r.epoch, r.run.kind.String()
}
