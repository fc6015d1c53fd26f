package fsutil_test

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/internal/fsutil/locktest"
)

func lockPath(t *testing.T) string {
	return filepath.Join(t.TempDir(), "trace.w0.000000.jsonl.lock")
}

// A lock held by another process, taken the way Dynamo's trace writer takes its prefix lock or the way
// fpmbus does, is refused, naming who holds it; one fpmbus holds refuses Dynamo's writer in turn.
func TestLockRefusesAnotherProcess(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		mode       string
		wantRecord bool // the refusal names the holder from its record (fpmbus writes one, Dynamo none)
	}{
		"Dynamo's FPM trace writer (shared)":         {mode: locktest.DynamoShared},
		"Dynamo's writer with retention (exclusive)": {mode: locktest.DynamoExclusive},
		"another fpmbus":                             {mode: locktest.Fpmbus, wantRecord: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := lockPath(t)
			h := locktest.Start(t, path, tc.mode)
			if !h.Held {
				t.Fatalf("holder: %s", h.Refused)
			}
			_, err := fsutil.TryLock(path, fsutil.Self("trace writer"))
			var held *fsutil.HeldError
			if !errors.As(err, &held) || !errors.Is(err, fsutil.ErrLocked) || !strings.Contains(err.Error(), path) {
				t.Fatalf("err %v, want a *HeldError naming %s", err, path)
			}
			if tc.wantRecord != (held.Holder != nil) {
				t.Fatalf("record %+v, want one: %v", held.Holder, tc.wantRecord)
			}
			if tc.wantRecord && (held.Holder.PID != h.PID() || !held.Confirmed() || !strings.Contains(err.Error(), "test holder")) {
				t.Fatalf("holder %+v (confirmed %v), want pid %d: %v", held.Holder, held.Confirmed(), h.PID(), err)
			}
			if runtime.GOOS == "linux" && !slices.ContainsFunc(held.Holders, func(p fsutil.Process) bool { return p.PID == h.PID() }) {
				t.Fatalf("/proc/locks holders %+v, want pid %d", held.Holders, h.PID())
			}
			h.Release()
			l, err := fsutil.TryLock(path, fsutil.Self("trace writer"))
			if err != nil {
				t.Fatalf("after the holder ended: %v", err)
			}
			defer l.Unlock()
			for _, mode := range []string{locktest.DynamoShared, locktest.DynamoExclusive} {
				if d := locktest.Start(t, path, mode); d.Held || !strings.Contains(d.Refused, syscall.EWOULDBLOCK.Error()) {
					t.Fatalf("%s while fpmbus holds the lock: held %v, %q", mode, d.Held, d.Refused)
				}
			}
		})
	}
}

// An owner killed with SIGKILL releases its lock with its process: the next owner takes it at once and
// finds the dead owner's record.
func TestLockOfAKilledOwnerIsTakenOver(t *testing.T) {
	t.Parallel()
	path := lockPath(t)
	h := locktest.Start(t, path, locktest.Fpmbus)
	if !h.Held {
		t.Fatal(h.Refused)
	}
	pid := h.PID()
	h.Kill()
	l, err := fsutil.TryLock(path, fsutil.Self("trace writer"))
	if err != nil {
		t.Fatalf("after kill -9 of the owner: %v", err)
	}
	if l.Previous == nil || l.Previous.PID != pid || l.Previous.Role != "test holder" {
		t.Fatalf("previous owner %+v, want pid %d", l.Previous, pid)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); len(b) != 0 {
		t.Fatalf("a released lock still names an owner: %q", b)
	}
	l, err = fsutil.TryLock(path, fsutil.Self("trace writer"))
	if err != nil || l.Previous != nil {
		t.Fatalf("after a clean release: %v, previous %+v", err, l.Previous)
	}
	_ = l.Unlock()
}

// Within one process a second open of the lock file is a second owner, refused as any other.
func TestLockRefusesASecondOwnerInTheSameProcess(t *testing.T) {
	t.Parallel()
	path := lockPath(t)
	l, err := fsutil.TryLock(path, fsutil.Self("fpmbus up"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	_, err = fsutil.TryLock(path, fsutil.Self("trace verify --repair"))
	var held *fsutil.HeldError
	if !errors.As(err, &held) || held.Holder == nil || held.Holder.PID != os.Getpid() || held.Holder.Role != "fpmbus up" || !held.Confirmed() {
		t.Fatalf("err %v, holder %+v", err, held)
	}
}

func TestLockRefusesANonRegularLockFile(t *testing.T) {
	t.Parallel()
	for _, what := range []string{"symlink", "fifo", "dir"} {
		t.Run(what, func(t *testing.T) {
			t.Parallel()
			path := lockPath(t)
			victim := filepath.Join(t.TempDir(), "victim")
			if err := os.WriteFile(victim, []byte("precious"), 0o644); err != nil {
				t.Fatal(err)
			}
			var err error
			switch what {
			case "symlink":
				err = os.Symlink(victim, path)
			case "fifo":
				err = syscall.Mkfifo(path, 0o644)
			case "dir":
				err = os.Mkdir(path, 0o755)
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := fsutil.TryLock(path, fsutil.Self("x")); !errors.Is(err, fsutil.ErrNotRegular) || !strings.Contains(err.Error(), path) {
				t.Fatalf("err %v, want ErrNotRegular naming %s", err, path)
			}
			if b, _ := os.ReadFile(victim); string(b) != "precious" {
				t.Fatalf("written through the link: %q", b)
			}
		})
	}
}
