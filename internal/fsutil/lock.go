package fsutil

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// Ownership locks. One process owns a directory or a set of files (an embedded server's data
// directory, a trace producer's segments) by holding an exclusive lock on a lock file next to them for
// as long as it owns them. The lock is flock(2) with LOCK_EX|LOCK_NB on the open file, which is what
// Rust's File::try_lock does on Linux and what Dynamo's trace writer takes on its prefix lock file
// (try_lock when it owns retention, try_lock_shared otherwise), so fpmbus and a Dynamo worker's own
// trace writer refuse each other. The kernel ends the lock when its process ends, however it ends
// (kill -9 included): a lock left by a dead owner is simply free, and its successor takes it at once.
//
// The owner writes a record of itself into the file (pid, host, start time, command, role), so that a
// refused successor can name who holds it; a lock held with no record (Dynamo writes none) is named by
// the processes /proc/locks lists for the file (Linux). A record found in a free lock is a previous
// owner's that ended without releasing: Lock.Previous, for the new owner to log. The file is never
// removed: removing it would let a new owner lock a fresh inode while an old owner still holds this one.

// ErrLocked is wrapped by every *HeldError.
var ErrLocked = errors.New("fsutil: held by another owner")

// Holder is the record an owner writes into its lock file.
type Holder struct {
	PID     int       `json:"pid"`
	Host    string    `json:"host"`
	Started time.Time `json:"started"`
	Command string    `json:"command"`
	// Role is what holds it ("fpmbus up", "trace writer", "trace verify --repair", …); Group and
	// Member name a consumer group member.
	Role   string `json:"role,omitempty"`
	Group  string `json:"group,omitempty"`
	Member string `json:"member,omitempty"`
}

// String names the holder for a message: "pid 123 on host h, started 2026-…, `fpmbus up` (trace
// writer, group g, member m)".
func (h Holder) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pid %d on host %s, started %s, `%s`", h.PID, h.Host, h.Started.UTC().Format(time.RFC3339), h.Command)
	var what []string
	if h.Role != "" {
		what = append(what, h.Role)
	}
	if h.Group != "" {
		what = append(what, "group "+h.Group)
	}
	if h.Member != "" {
		what = append(what, "member "+h.Member)
	}
	if len(what) > 0 {
		b.WriteString(" (" + strings.Join(what, ", ") + ")")
	}
	return b.String()
}

var (
	selfOnce sync.Once
	self     Holder
	// startedAt is when this process started, as near as a package can tell: its initialisation.
	startedAt = time.Now()
)

// maxCommand bounds the command line a record keeps.
const maxCommand = 512

// Self is this process as a Holder with role.
func Self(role string) Holder {
	selfOnce.Do(func() {
		host, _ := os.Hostname()
		cmd := strings.Join(os.Args, " ")
		if len(cmd) > maxCommand {
			cmd = cmd[:maxCommand] + "…"
		}
		self = Holder{PID: os.Getpid(), Host: host, Started: startedAt, Command: cmd}
	})
	h := self
	h.Role = role
	return h
}

// HeldError says that a lock file is held, and by whom as far as can be told.
type HeldError struct {
	Path string
	// Holder is the record in the file; nil when there is none (a Dynamo trace writer leaves none).
	Holder *Holder
	// Holders are the processes that hold a lock on the file, from /proc/locks (Linux, this host and
	// pid namespace; none where it cannot be read), with their command lines.
	Holders []Process
}

// Process is a process holding a lock.
type Process struct {
	PID     int
	Command string
}

func (e *HeldError) Error() string {
	var b strings.Builder
	b.WriteString(e.Path + " is held by ")
	switch {
	case e.Holder != nil && e.Confirmed():
		b.WriteString(e.Holder.String())
	case e.Holder != nil:
		b.WriteString("another process (the record there names " + e.Holder.String() + ", which no longer holds it)")
	default:
		b.WriteString("another process, which left no record of itself (a Dynamo worker's own trace writer takes this lock and writes none)")
	}
	if len(e.Holders) > 0 && !(e.Holder != nil && e.Confirmed() && len(e.Holders) == 1) {
		var ps []string
		for _, p := range e.Holders {
			ps = append(ps, fmt.Sprintf("pid %d `%s`", p.PID, p.Command))
		}
		b.WriteString("; holding it now: " + strings.Join(ps, ", "))
	}
	return b.String()
}

// Unwrap returns ErrLocked.
func (e *HeldError) Unwrap() error { return ErrLocked }

// Confirmed reports whether the record names a process that holds the lock now: on this host, one that
// /proc/locks lists for the file (or, where it cannot be read, one that is running); on another host
// (a shared file system) the record is taken at its word.
func (e *HeldError) Confirmed() bool {
	if e.Holder == nil {
		return false
	}
	host, _ := os.Hostname()
	if e.Holder.Host != host {
		return true
	}
	if e.Holders != nil {
		for _, p := range e.Holders {
			if p.PID == e.Holder.PID {
				return true
			}
		}
		return false
	}
	return processRunning(e.Holder.PID)
}

// Lock is a held ownership lock.
type Lock struct {
	f    *os.File
	path string
	// Previous is the record a previous owner left in the file without releasing it (it ended with a
	// kill -9, a crash or a power cut); nil when there was none.
	Previous *Holder
	mu       sync.Mutex
}

// Path is the lock file.
func (l *Lock) Path() string { return l.path }

// maxRecord bounds what is read of a lock file's record.
const maxRecord = 4 << 10

// TryLock takes the ownership lock on the file path for me, without waiting (see above): the file is
// created (mode 0644) if missing, never through a symbolic link, and must be a regular file
// (*NotRegularError otherwise); held by another open file, even of this process, it is a *HeldError.
// A lock file another user created that this process may only read is locked all the same (flock needs
// no write access) but gets no record.
func TryLock(path string, me Holder) (*Lock, error) {
	writable := true
	f, err := openNoFollow(path, os.O_RDWR|os.O_CREATE, 0o644)
	if errors.Is(err, os.ErrPermission) {
		writable = false
		f, err = openNoFollow(path, os.O_RDONLY, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := flockExclusive(f); err != nil {
		defer f.Close()
		if errors.Is(err, errWouldBlock) {
			held := &HeldError{Path: path, Holder: readRecord(f)}
			held.Holders = lockHolders(f)
			return nil, held
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	l := &Lock{f: f, path: path, Previous: readRecord(f)}
	if writable {
		rec, _ := json.Marshal(me)
		rec = append(rec, '\n')
		if err := f.Truncate(0); err == nil {
			_, _ = f.WriteAt(rec, 0)
		}
	}
	return l, nil
}

// readRecord returns the record in f, nil when it holds none (or none that parses).
func readRecord(f *os.File) *Holder {
	buf := make([]byte, maxRecord)
	n, _ := f.ReadAt(buf, 0)
	buf = bytes.TrimSpace(buf[:n])
	if len(buf) == 0 {
		return nil
	}
	var h Holder
	if json.Unmarshal(buf, &h) != nil || h.PID == 0 {
		return nil
	}
	return &h
}

// Unlock clears the record and releases the lock; the file stays. A second Unlock does nothing.
func (l *Lock) Unlock() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	_ = l.f.Truncate(0) // a free lock names no owner (fails harmlessly on a read-only lock file)
	err := funlock(l.f)
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	return err
}

// DirLockName is the lock file OwnDir keeps in a directory it owns.
const DirLockName = "fpmbus.lock"

// OwnDir makes this process (as role) the owner of the directory dir, an embedded server's data
// directory: dir is created if missing and must be a directory, not a symbolic link (EnsureDir), and
// dir/fpmbus.lock is locked (TryLock) until Unlock or the process's end. A directory another process
// owns is a *HeldError naming it.
func OwnDir(dir, role string) (*Lock, error) {
	if err := EnsureDir(dir, 0o755); err != nil {
		return nil, err
	}
	return TryLock(dir+string(os.PathSeparator)+DirLockName, Self(role))
}
