package tracefile

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"sort"

	"github.com/fpmbus/fpmbus/internal/fsutil"
)

// Ownership of a producer's segments. Every process that writes, repairs, rewrites or prunes the
// segments of a prefix owns it first, and owns it for as long as it may touch them: it holds an
// exclusive lock on <prefix>.000000.jsonl.lock, next to the segments — the lock file Dynamo's trace
// writer keeps, taken the way it takes it (flock LOCK_EX|LOCK_NB, fsutil.TryLock). So fpmbus and a
// worker's own in-process trace writer (which takes the same file shared, or exclusive when it prunes
// by bytes or age) refuse each other, two fpmbus processes never write one producer's files unless
// their consumer group made them take turns, and `trace verify --repair` and `trace backfill` never
// touch files a live writer holds. The lock file holds a record of its owner (fsutil.Holder: pid, host,
// start, command, role, group), which a refusal names; the kernel drops the lock of a process killed
// with SIGKILL, so its successor takes it at once and logs the dead owner's record.
//
// Who owns what:
//   - The trace writer (consumers/trace.Consumer) owns a producer's prefix from its first message in an owned
//     partition until the partition is released or lost (every writer of the process shares one
//     owner, so two partitions whose producer ids sanitize alike share the lock). With one partition
//     it also owns, at its first takeover, every producer already under the output while it repairs
//     their newest segments, and lets go of them after. A prefix another process holds refuses that producer: its messages are
//     rejected (dead-lettered, naming the holder) and the other producers go on; it is tried again
//     at the first message after each Tick (every flush interval).
//   - Except within one consumer group. A partition moves to another member when its owner is frozen
//     (SIGSTOP, a hung host) and stops answering, while the frozen process still holds its locks; the
//     group's compare-and-set lease, not the lock, decides who writes then. A lock whose record names a
//     member of the same group that holds it now (/proc/locks) is borrowed: the new owner writes
//     without the lock, as before locks existed (segments are created exclusively, so the two never
//     share a file), takes the lock as soon as it is free (tried at every Tick), and logs both.
//   - `trace verify --repair` owns every producer of the output for its whole run, and `trace backfill`
//     every producer it finds at its start and each one it writes after: either is refused as a whole,
//     naming the holder, before it reads or writes anything.

// ErrPrefixHeld: a producer's segment prefix is owned by another process (its lock file is held).
var ErrPrefixHeld = errors.New("trace: the producer's segments are owned by another writer")

// prefixLockSuffix ends a prefix's lock file: Dynamo's name for it, segment 0's with "gz" replaced by
// "lock" (Path::with_extension).
const prefixLockSuffix = ".000000.jsonl.lock"

// shortLockSuffix ends the lock file of a prefix whose Dynamo lock name would exceed NAME_MAX (255
// bytes; it is 2 bytes longer than a segment's): no Dynamo writer can open that one, so there is
// nothing to agree with, and the segments need an owner all the same.
const shortLockSuffix = ".lock"

// PrefixLockPath is the lock file of prefix's segments (see above).
func PrefixLockPath(prefix string) string {
	if len(filepath.Base(prefix))+len(prefixLockSuffix) > 255 {
		return prefix + shortLockSuffix
	}
	return prefix + prefixLockSuffix
}

// Owner is the prefixes one process part (a trace writer, a repair, a backfill) owns.
type Owner struct {
	me fsutil.Holder
	// group is a trace writer's consumer group, on its deployment (the writer's groupIdentity): a
	// holder of the same group is borrowed from (see above). "" for the tools, which never borrow.
	group string
	log   *slog.Logger
	held  map[string]*ownedPrefix
	// refused are the prefixes refused since the last Retry (the trace writer's Consumer.Tick): their
	// messages are rejected without another look at the lock file until then.
	refused map[string]error
	// logged are the prefixes whose refusal was logged: once, until they are owned.
	logged map[string]bool
}

type ownedPrefix struct {
	lock *fsutil.Lock      // nil while borrowed
	from *fsutil.HeldError // borrowed: the same-group member that holds the lock
	refs int
}

// NewOwner is the owner of nothing yet, as me (its lock records; me.Group set for a trace writer).
func NewOwner(me fsutil.Holder, log *slog.Logger) *Owner {
	return &Owner{me: me, group: me.Group, log: log, held: map[string]*ownedPrefix{}, refused: map[string]error{}, logged: map[string]bool{}}
}

// Take owns prefix (once more, when it is owned already). The error of a prefix another process holds
// wraps ErrPrefixHeld and the *fsutil.HeldError naming the holder; any other is the lock file's.
func (o *Owner) Take(prefix string) error {
	if op := o.held[prefix]; op != nil {
		op.refs++
		return nil
	}
	if err, ok := o.refused[prefix]; ok {
		return err
	}
	path := PrefixLockPath(prefix)
	l, err := fsutil.TryLock(path, o.me)
	var held *fsutil.HeldError
	switch {
	case err == nil:
		delete(o.logged, prefix)
		o.held[prefix] = &ownedPrefix{lock: l, refs: 1}
		if l.Previous != nil {
			o.log.Warn("trace: took over a producer's segments from an owner that ended without releasing them (killed?)",
				"lock", path, "previous_owner", l.Previous.String())
		}
		return nil
	case errors.As(err, &held) && o.group != "" && held.Holder != nil && held.Holder.Group == o.group && held.Confirmed():
		o.held[prefix] = &ownedPrefix{from: held, refs: 1}
		o.log.Warn("trace: a member of this consumer group that no longer owns the partition still holds the producer's lock "+
			"(frozen?); writing without it, in new segments, and taking it once it is free",
			"lock", path, "holder", held.Holder.String())
		return nil
	case held != nil:
		err = fmt.Errorf("%w (%s): %w: a producer's segments have one owner at a time", ErrPrefixHeld, prefix, held)
		o.refused[prefix] = err
		return err
	case RefusesProducer(err):
		err = fmt.Errorf("trace: prefix %s: %w", prefix, err)
		o.refused[prefix] = err
		return err
	default:
		return fmt.Errorf("trace: prefix %s: %w", prefix, err)
	}
}

// RefusesProducer reports an error of Take that concerns one producer alone: its prefix is another
// process's, or its lock file cannot be had (a symbolic link or other non-regular file planted under
// its name, a file this user may not open, a name its file system refuses). That producer is refused;
// the others go on.
func RefusesProducer(err error) bool {
	return errors.Is(err, ErrPrefixHeld) || errors.Is(err, fsutil.ErrNotRegular) || errors.Is(err, fs.ErrPermission) || NameRefused(err)
}

// Rejecting logs, once until the prefix is owned, that a producer's messages are rejected because
// another process owns its prefix (err, from Take).
func (o *Owner) Rejecting(prefix string, err error) {
	if o.logged[prefix] {
		return
	}
	o.logged[prefix] = true
	o.log.Error("trace: a producer's segments are owned by another process: its messages are rejected until it lets go",
		"prefix", prefix, "err", err)
}

// Release gives up one ownership of prefix; the lock goes with the last.
func (o *Owner) Release(prefix string) {
	op := o.held[prefix]
	if op == nil {
		return
	}
	if op.refs--; op.refs > 0 {
		return
	}
	delete(o.held, prefix)
	if op.lock != nil {
		if err := op.lock.Unlock(); err != nil {
			o.log.Warn("trace: release a producer's lock", "lock", op.lock.Path(), "err", err)
		}
	}
}

// ReleaseAll gives up every prefix.
func (o *Owner) ReleaseAll() {
	if o == nil {
		return
	}
	for p, op := range o.held {
		op.refs = 1
		o.Release(p)
	}
}

// Retry takes the locks of borrowed prefixes that have become free, and lets refused prefixes be
// tried again at their next message.
func (o *Owner) Retry() {
	if o == nil {
		return
	}
	clear(o.refused)
	for p, op := range o.held {
		if op.lock != nil {
			continue
		}
		l, err := fsutil.TryLock(PrefixLockPath(p), o.me)
		if err != nil {
			continue
		}
		op.lock, op.from = l, nil
		o.log.Info("trace: took the producer's lock the group member before this one held", "lock", l.Path())
	}
}

// Owns reports whether prefix is owned (held or borrowed).
func (o *Owner) Owns(prefix string) bool { return o.held[prefix] != nil }

// Prefixes are the prefixes owned (held or borrowed), sorted.
func (o *Owner) Prefixes() []string {
	out := make([]string, 0, len(o.held))
	for p := range o.held {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// TakeOutput owns every producer with segments under outputPath, and returns the prefixes taken and
// the refusals, in prefix order.
func (o *Owner) TakeOutput(outputPath string) (taken []string, refused []error, err error) {
	producers, err := Producers(outputPath)
	if err != nil {
		return nil, nil, err
	}
	prefixes := make([]string, 0, len(producers))
	for _, p := range producers {
		prefixes = append(prefixes, OutputBase(outputPath)+"."+p)
	}
	sort.Strings(prefixes)
	for _, p := range prefixes {
		if err := o.Take(p); err != nil {
			if !errors.Is(err, ErrPrefixHeld) {
				return taken, refused, err
			}
			refused = append(refused, err)
			continue
		}
		taken = append(taken, p)
	}
	return taken, refused, nil
}

// OwnOutput is a tool's ownership (role: "trace verify --repair", "trace backfill") of every producer
// under outputPath: refused as a whole, naming every holder, when another process holds any of them.
// The caller ends it with ReleaseAll.
func OwnOutput(outputPath, role string, log *slog.Logger) (*Owner, error) {
	o := NewOwner(fsutil.Self(role), log)
	_, refused, err := o.TakeOutput(outputPath)
	if err == nil && len(refused) > 0 {
		err = fmt.Errorf("%s of %s refused, nothing read or written: %w", role, outputPath, errors.Join(refused...))
	}
	if err != nil {
		o.ReleaseAll()
		return nil, err
	}
	return o, nil
}
