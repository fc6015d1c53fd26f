//go:build unix

package fsutil

import (
	"errors"
	"os"
	"syscall"
)

// errWouldBlock: the lock is held by another open file.
var errWouldBlock = syscall.EWOULDBLOCK

// flockExclusive is flock(fd, LOCK_EX|LOCK_NB): Rust's File::try_lock on Linux.
func flockExclusive(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

func funlock(f *os.File) error { return syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }

// processRunning reports whether a process pid exists on this host.
func processRunning(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
