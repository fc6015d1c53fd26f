package partition

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/retrywait"
	"github.com/fpmbus/fpmbus/streams"
)

// Handler processes one owned partition. The member calls it in its own goroutine each time it takes
// the partition, with the partition's messages in stream order (original subjects), and:
//
//   - closes msgs when it gives the partition up gracefully (rebalance, Stop, Consume's context):
//     the handler still owns the partition until it returns, so it makes its output durable, acks,
//     closes its files and returns nil. This is the "on revoked" hook; the call itself is "on assigned".
//   - cancels ctx when the partition is lost (connection closed or cut off, taken by another member, or the graceful
//     release exceeded ReleaseTimeout): the handler stops at once and returns; what it has not acked
//     is redelivered to the next owner.
//
// The handler must Ack (or Term) every message once its output is durable, and never Nak: a message
// it gives back is only redelivered by the next owner. With Config.CumulativeAcks one Ack covers every
// message handed before it in the session, so the handler acks only the end of a durable prefix and
// never Terms. It must keep reading msgs until it is closed
// or ctx is done; returning earlier, or returning an error, stops the whole member (Consume returns
// the error) so that another instance takes the partitions over.
type Handler func(ctx context.Context, partition int, msgs <-chan jetstream.Msg) error

var (
	// errAlreadyRunning is returned by a second Consume on the same Member.
	errAlreadyRunning = errors.New("partition: member already consuming")
	// errHandlerReturned is returned by Consume when a handler returned nil before its partition was
	// revoked.
	errHandlerReturned = errors.New("partition: handler returned before its partition was revoked")
)

// apiTimeout bounds one JetStream API call made by a member.
const apiTimeout = 5 * time.Second

// joinRetryFor bounds how long Join retries server calls that fail only because the cluster cannot
// answer for the moment (no responders, no answer, JetStream temporarily unavailable): an R3 stream or
// bucket whose leader stopped answers again once the others have elected one, within the server's
// longest election timeout (9 s) plus a few round trips.
const joinRetryFor = 30 * time.Second

// Bounds of the retries of Join and of the members watch.
const (
	minRetryWait = 100 * time.Millisecond
	maxRetryWait = 2 * time.Second
)

// Server error codes nats.go names only in its legacy API (the transient ones: natsconn.Unavailable).
const (
	// errCodeSubjectBound: a push consumer's deliver subject cannot move while it has a subscriber
	// (the server reports it as "consumer name already in use").
	errCodeSubjectBound jetstream.ErrorCode = 10013
)

// Option configures a Member beyond Config.
type Option func(*Member) error

// WithMemberID names the member (default <hostname>-<pid>-<random>): letters, digits, '-', '_'.
//
// An id given here is stable: it names the same instance across restarts, and the caller vouches
// that no other running process uses it (derive it from something only one process can hold, such as
// a data directory). Join therefore takes a key of this id left in the members bucket for a previous
// incarnation that died without leaving: it releases at once the partitions that incarnation owned
// (its last announcement lists them), so that the restarted instance (or whoever is assigned them now)
// gets their unacknowledged messages again, in stream order, within a standby poll instead of after
// PinnedTTL.
// Two running members must never share an id: the second one's Join would take the partitions of the
// first.
func WithMemberID(id string) Option {
	return func(m *Member) error {
		if !streams.ValidName(id, MaxNameLen) {
			return fmt.Errorf("%w: member id %q: want 1-64 letters, digits, '-' and '_'", errInvalidConfig, id)
		}
		m.id, m.stable = id, true
		return nil
	}
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(m *Member) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", errInvalidConfig)
		}
		m.log = l
		return nil
	}
}

// Member is one instance of a group. Join declares the group, Consume takes part in it until the
// context ends, Stop is called or an error occurs. A Member consumes once.
type Member struct {
	cfg     Config
	js      jetstream.JetStream
	nc      *nats.Conn
	id      string
	stable  bool // the id names this instance across restarts (WithMemberID)
	key     string
	log     *slog.Logger
	kv      jetstream.KeyValue
	streams []jetstream.Stream // by partition: the stream the partition's consumer lives on

	running  atomic.Bool
	announce chan struct{} // ownership changed: put the member's key now, not at the next heartbeat
	stopReq  chan struct{}
	stopOnce sync.Once
	done     chan struct{}

	mu    sync.Mutex
	owned map[int]bool
	hard  context.CancelFunc // while Consume runs: ends every partition abruptly
}

// Join checks cfg, declares the group on the server (idempotently: the partition stream when
// Partitions > 1, one durable push consumer per partition, the members bucket) and returns a
// Member that takes no partition before Consume. It fails with ErrGroupMismatch if the group exists
// with another partitioning.
func Join(ctx context.Context, js jetstream.JetStream, cfg Config, opts ...Option) (*Member, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if js == nil {
		return nil, fmt.Errorf("%w: nil JetStream", errInvalidConfig)
	}
	cfg = cfg.withDefaults()
	m := &Member{
		cfg:      cfg,
		js:       js,
		nc:       js.Conn(),
		id:       defaultMemberID(),
		log:      slog.Default(),
		announce: make(chan struct{}, 1),
		stopReq:  make(chan struct{}),
		done:     make(chan struct{}),
		owned:    map[int]bool{},
	}
	for _, o := range opts {
		if err := o(m); err != nil {
			return nil, err
		}
	}
	m.key = cfg.Stream + "." + cfg.Group + "." + m.id
	m.log = m.log.With("group", cfg.Group, "stream", cfg.Stream, "member", m.id)
	deadline := time.Now().Add(joinRetryFor)
	waits := retrywait.Doubling(minRetryWait, maxRetryWait)
	for {
		wait := waits.NextBackOff()
		err := m.setUp(ctx)
		if err == nil {
			return m, nil
		}
		if !natsconn.Unavailable(err) || ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			return nil, err
		}
		m.log.Warn("partition: join: the server cannot answer yet; retrying", "err", err, "retry_in", wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, fmt.Errorf("partition: join: %w (after %w)", ctx.Err(), err)
		}
	}
}

// setUp declares the group, opens the members bucket and, for a stable id, reclaims what a previous
// incarnation owned; every step is idempotent, so Join repeats it all after a failure.
func (m *Member) setUp(ctx context.Context) error {
	var err error
	if m.streams, err = declare(ctx, m.js, m.cfg); err != nil {
		return err
	}
	// Shards are defined alike: the first stands for all.
	if m.kv, err = membersBucket(ctx, m.js, m.streams[0].CachedInfo().Config.Replicas); err != nil {
		return err
	}
	if m.stable {
		return m.reclaim(ctx)
	}
	return nil
}

// reclaim hands on at once what a previous incarnation of this member (same stable id) owned when it
// died: its key is still in the members bucket (a graceful leave deletes it) and lists the partitions
// it owned. Each of those whose owner record still names this id is marked released, so that whichever
// member the assignment gives it to now (this one or another) takes it at once instead of waiting
// PinnedTTL; the taker's reset makes every message the dead incarnation did not ack deliverable again,
// in stream order. Nothing else can be delivering those partitions: their subjects were the dead
// incarnation's.
func (m *Member) reclaim(ctx context.Context) error {
	e, err := call(ctx, func(ctx context.Context) (jetstream.KeyValueEntry, error) { return m.kv.Get(ctx, m.key) })
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("partition: read member key %s: %w", m.key, err)
	}
	var rec memberRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		m.log.Warn("partition: previous incarnation's member record unreadable; its partitions are taken over after PinnedTTL", "err", err)
		return nil
	}
	var taken []int
	for _, p := range rec.Owned {
		if p < 0 || p >= m.cfg.Partitions {
			continue
		}
		owner, rev, err := callOwner(ctx, m, p)
		if err != nil {
			return fmt.Errorf("partition: reclaim partition %d: read owner: %w", p, err)
		}
		if owner == nil || owner.Member != m.id || owner.Released {
			continue
		}
		if _, err := call(ctx, func(ctx context.Context) (uint64, error) {
			return m.writeOwner(ctx, p, ownerRecord{Member: m.id, Released: true}, rev)
		}); err != nil && !errors.Is(err, errOwnerTaken) {
			return fmt.Errorf("partition: reclaim partition %d: release: %w", p, err)
		}
		taken = append(taken, p)
	}
	m.log.Info("partition: previous incarnation of this member found; its partitions are released now",
		"partitions", taken, "last_heartbeat", time.UnixMilli(rec.At).UTC(), "pid", rec.PID)
	return nil
}

// callOwner is readOwner bounded by apiTimeout, without the time.
func callOwner(ctx context.Context, m *Member, p int) (*ownerRecord, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	rec, rev, _, err := m.readOwner(ctx, p)
	return rec, rev, err
}

func defaultMemberID() string {
	host, _ := os.Hostname()
	var b strings.Builder
	for i := 0; i < len(host) && b.Len() < 32; i++ {
		c := host[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		b.WriteString("member")
	}
	return b.String() + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatUint(rand.Uint64()&0xffffff, 36)
}

// ID is the member's id in the group.
func (m *Member) ID() string { return m.id }

// Config is the group's configuration, defaults filled in.
func (m *Member) Config() Config { return m.cfg }

// Owned lists the partitions whose handler runs now, ascending.
func (m *Member) Owned() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]int, 0, len(m.owned))
	for p := range m.owned {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// setOwned records that this member owns p now (or no longer) and has the member's key put at once:
// a restarted incarnation with the same stable id reclaims exactly what the key lists.
func (m *Member) setOwned(p int, on bool) {
	m.mu.Lock()
	if on {
		m.owned[p] = true
	} else {
		delete(m.owned, p)
	}
	m.mu.Unlock()
	select {
	case m.announce <- struct{}{}:
	default:
	}
}

// Stop leaves the group gracefully: the member's key is deleted (the others stand by for its
// partitions), every handler's msgs is closed, and each partition is released once its handler has
// returned and its acks are on the server (the next owner takes it at once). If ctx ends first, the
// remaining partitions are given up abruptly (handlers' contexts cancelled, no release: the others
// wait PinnedTTL). Stop returns when Consume has returned.
func (m *Member) Stop(ctx context.Context) error {
	m.stopOnce.Do(func() { close(m.stopReq) })
	if !m.running.Load() {
		return nil
	}
	select {
	case <-m.done:
		return nil
	case <-ctx.Done():
		m.mu.Lock()
		if m.hard != nil {
			m.hard()
		}
		m.mu.Unlock()
		<-m.done
		return ctx.Err()
	}
}

type workerExit struct {
	w   *worker
	err error
}

// Consume takes part in the group until ctx ends or Stop is called (then it leaves gracefully, like
// Stop, and returns nil), or until a handler fails or the connection closes (it returns that error).
// While it runs, the member heartbeats in the members bucket, watches the others, and runs a worker
// for each partition the shared assignment gives it; a worker takes its partition once it has no
// live owner (see worker.mayTake) and then calls h.
func (m *Member) Consume(ctx context.Context, h Handler) error {
	if h == nil {
		return fmt.Errorf("%w: nil handler", errInvalidConfig)
	}
	if !m.running.CompareAndSwap(false, true) {
		return errAlreadyRunning
	}
	defer close(m.done)
	hardCtx, hardCancel := context.WithCancel(context.Background())
	defer hardCancel()
	m.mu.Lock()
	m.hard = hardCancel
	m.mu.Unlock()

	status := m.nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CLOSED)
	defer m.nc.RemoveStatusListener(status)
	if m.nc.IsClosed() {
		return fmt.Errorf("partition: %w", nats.ErrConnectionClosed)
	}
	// The members bucket steers who stands by for which partition: while it cannot be written or watched
	// (its stream electing a leader) the member goes on with what it knows, and the watch is opened
	// again until it is.
	if _, err := m.heartbeat(hardCtx); err != nil {
		if !natsconn.Unavailable(err) {
			return fmt.Errorf("partition: announce member %s: %w", m.id, err)
		}
		m.log.Warn("partition: members bucket not answering; announcing again at the next heartbeat", "err", err)
	}
	prefix := m.cfg.Stream + "." + m.cfg.Group + "."
	mw := newMembersWatch(m.kv, prefix, m.id, max(m.cfg.PinnedTTL/2, time.Second), m.log)
	if err := mw.open(hardCtx); err != nil && !natsconn.Unavailable(err) {
		return fmt.Errorf("partition: watch members: %w", err)
	}
	defer mw.stop()
	var putRev atomic.Uint64 // revision of the member's last key put

	v := newView(m.cfg.PinnedTTL)
	workers := map[int]*worker{}
	exits := make(chan workerExit)
	ready := false
	recompute := func() {
		if !ready {
			return
		}
		want := map[int]bool{}
		for _, p := range assign(v.liveWith(m.id, time.Now()), m.cfg.Partitions)[m.id] {
			want[p] = true
		}
		for p := range want {
			if workers[p] == nil {
				w := newWorker(m, p, hardCtx)
				workers[p] = w
				go func() { exits <- workerExit{w, w.run(h)} }()
			}
		}
		for p, w := range workers {
			if !want[p] {
				w.release()
			}
		}
	}
	hb := time.NewTicker(m.cfg.PinnedTTL / 4)
	defer hb.Stop()
	// beat puts the member's key: never more than one put in flight, never blocking this loop; a beat
	// asked for while one is in flight is put again after it (its snapshot of Owned may be older).
	var beating, rebeat atomic.Bool
	var beats sync.WaitGroup
	defer beats.Wait()
	beat := func() {
		rebeat.Store(true)
		if beating.Swap(true) {
			return
		}
		beats.Add(1)
		go func() {
			defer beats.Done()
			for {
				for rebeat.Swap(false) {
					rev, err := m.heartbeat(hardCtx)
					if err != nil {
						m.log.Warn("partition: heartbeat failed", "err", err)
						continue
					}
					for old := putRev.Load(); rev > old && !putRev.CompareAndSwap(old, rev); old = putRev.Load() {
					}
				}
				beating.Store(false)
				if !rebeat.Load() || beating.Swap(true) {
					return
				}
			}
		}()
	}
	check := time.NewTicker(max(m.cfg.PinnedTTL/10, 100*time.Millisecond))
	defer check.Stop()
	// The partition stream's sources (a group that copies its stream or shards): looked at off this
	// loop, one look at a time. A group reading its shards directly has no sources to watch.
	var sourceTick <-chan time.Time
	if m.cfg.copies() {
		t := time.NewTicker(sourceCheckEvery)
		defer t.Stop()
		sourceTick = t.C
	}
	sw := &sourceWatch{m: m}
	var sourceChecking atomic.Bool
	var sourceChecks sync.WaitGroup
	defer sourceChecks.Wait()

	var fatal error
	closed := false
loop:
	for {
		select {
		case e, ok := <-mw.updates():
			if !ok {
				mw.ended()
				continue
			}
			if e == nil {
				mw.initialDone()
				ready = true
			} else if id, ok := strings.CutPrefix(e.Key(), prefix); ok {
				if e.Operation() == jetstream.KeyValuePut {
					at := time.Now()
					if mw.initial {
						at = e.Created() // a current value, not news: judge its age by when it was written
					}
					v.put(id, at)
					mw.saw(id, e.Revision())
				} else {
					v.del(id)
				}
			}
			recompute()
		case <-hb.C:
			beat()
		case <-m.announce:
			beat()
		case <-sourceTick:
			if !sourceChecking.Swap(true) {
				sourceChecks.Add(1)
				go func() {
					defer sourceChecks.Done()
					defer sourceChecking.Store(false)
					sw.check(hardCtx)
				}()
			}
		case <-check.C:
			if !ready && mw.failing() {
				ready = true // the bucket cannot be watched: go on with this member alone until it can
			}
			mw.maintain(hardCtx, putRev.Load())
			recompute()
		case st := <-status:
			if st == nats.CLOSED {
				fatal = fmt.Errorf("partition: %w", nats.ErrConnectionClosed)
				closed = true
				break loop
			}
			// Disconnected: acks cannot reach the server and deliveries may be lost; end every session
			// now (handlers see ctx cancelled) and take the partitions again once reconnected.
			for _, w := range workers {
				w.interrupt()
			}
		case ex := <-exits:
			delete(workers, ex.w.p)
			if ex.err != nil {
				fatal = ex.err
				break loop
			}
			recompute()
		case <-ctx.Done():
			break loop
		case <-m.stopReq:
			break loop
		}
	}
	mw.stop()

	if closed || m.nc.IsClosed() {
		hardCancel()
	} else {
		beats.Wait() // a heartbeat landing after the delete would resurrect the key
		dctx, cancel := context.WithTimeout(hardCtx, apiTimeout)
		if err := m.kv.Delete(dctx, m.key); err != nil {
			m.log.Warn("partition: delete member key", "err", err)
		}
		cancel()
		for _, w := range workers {
			w.release()
		}
	}
	for len(workers) > 0 {
		ex := <-exits
		delete(workers, ex.w.p)
		if ex.err != nil && fatal == nil {
			fatal = ex.err
		}
	}
	if fatal != nil {
		m.log.Error("partition: member stopped", "err", fatal)
	}
	return fatal
}

// memberRecord is the value of a member's key: for people reading the bucket (`nats kv get`).
type memberRecord struct {
	ID    string `json:"id"`
	Host  string `json:"host"`
	PID   int    `json:"pid"`
	Owned []int  `json:"owned"`
	At    int64  `json:"at_unix_ms"`
}

// heartbeat puts the member's key and returns its revision.
func (m *Member) heartbeat(ctx context.Context) (uint64, error) {
	host, _ := os.Hostname()
	b, err := json.Marshal(memberRecord{ID: m.id, Host: host, PID: os.Getpid(), Owned: m.Owned(), At: time.Now().UnixMilli()})
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.PinnedTTL/2)
	defer cancel()
	return m.kv.Put(ctx, m.key, b)
}
