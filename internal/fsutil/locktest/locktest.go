// Package locktest is for tests: a second process that holds a lock file the way Dynamo's trace writer
// holds its prefix lock (lib/llm/src/telemetry/jsonl_gz.rs, lock_prefix), or as fpmbus's own
// fsutil.TryLock does, so that tests check refusals across processes, as they happen in production. A
// test binary's TestMain calls MaybeHold first; Start re-runs the test binary as the holder.
//
// Dynamo's way, reproduced exactly: open <prefix>.000000.jsonl.lock for reading (and writing when it
// takes the exclusive lock); if it is missing, create it (create_new, read and write, mode 0666 less the
// umask) and, if another writer created it meanwhile, open it again; then Rust's File::try_lock_shared
// (flock LOCK_SH|LOCK_NB: Dynamo's FPM trace writer, which only counts segments) or File::try_lock
// (flock LOCK_EX|LOCK_NB: a writer that prunes by bytes or age). It writes nothing into the file and
// holds the lock until it exits.
package locktest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/fsutil"
)

// Modes of a holder.
const (
	DynamoShared    = "dynamo-shared"    // Dynamo's FPM trace writer
	DynamoExclusive = "dynamo-exclusive" // Dynamo's writer with byte or age retention
	Fpmbus          = "fpmbus"           // fsutil.TryLock, role "test holder"
)

const envVar = "FPMBUS_LOCKTEST_HOLD"

// MaybeHold makes this process the holder Start asked for, and never returns, when it was started by
// Start; otherwise it does nothing.
func MaybeHold() {
	spec, ok := os.LookupEnv(envVar)
	if !ok {
		return
	}
	mode, path, _ := strings.Cut(spec, ":")
	if err := hold(mode, path); err != nil {
		fmt.Println("refused:", err)
		os.Exit(0)
	}
	fmt.Println("held")
	_, _ = io.Copy(io.Discard, os.Stdin) // until the test closes stdin or kills it
	os.Exit(0)
}

func hold(mode, path string) error {
	if mode == Fpmbus {
		_, err := fsutil.TryLock(path, fsutil.Self("test holder"))
		return err // the lock is held by the open file until the process exits
	}
	exclusive := mode == DynamoExclusive
	flag := os.O_RDONLY
	if exclusive {
		flag = os.O_RDWR
	}
	f, err := os.OpenFile(path, flag, 0)
	if errors.Is(err, os.ErrNotExist) {
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if errors.Is(err, os.ErrExist) {
			f, err = os.OpenFile(path, flag, 0)
		}
	}
	if err != nil {
		return err
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	if err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB); err != nil {
		return fmt.Errorf("locking %s: %w", path, err)
	}
	return nil
}

// holder is a running holder process.
type holder struct {
	Cmd *exec.Cmd
	// Held: the process holds the lock; else Refused says why it could not take it (it has exited).
	Held    bool
	Refused string
	stdin   io.WriteCloser
}

// PID is the holder's process id.
func (h *holder) PID() int { return h.Cmd.Process.Pid }

// Release ends the holder (its lock goes with it) and waits for it.
func (h *holder) Release() {
	if h.stdin != nil {
		h.stdin.Close()
		h.stdin = nil
		_ = h.Cmd.Wait()
	}
}

// Kill ends the holder with SIGKILL, as a crash would, and waits for it.
func (h *holder) Kill() {
	if h.stdin != nil {
		_ = h.Cmd.Process.Kill()
		_ = h.Cmd.Wait()
		h.stdin.Close()
		h.stdin = nil
	}
}

// Start runs the test binary as a holder of path in mode and returns once it holds the lock or has
// been refused. The process ends at the test's cleanup at the latest.
func Start(t testing.TB, path, mode string) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envVar+"="+mode+":"+path)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &holder{Cmd: cmd, stdin: stdin}
	t.Cleanup(h.Release)
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case s := <-line:
		if s == "held" {
			h.Held = true
		} else {
			h.Refused = strings.TrimPrefix(s, "refused: ")
			h.Release()
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("lock holder for %s did not report", path)
	}
	return h
}
