//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package trace

import (
	"fmt"
	"os"
	"syscall"
)

// lockDir takes an exclusive lock on dir (flock on the directory itself: no lock file to leave behind)
// for a repair, so that two repairs of one output never rewrite a segment at once. It fails at once if
// another repair holds it. The lock ends with the process, or when the returned function is called.
func lockDir(dir string) (func(), error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(d.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		d.Close()
		return nil, fmt.Errorf("another trace verify --repair is running on this directory: %w", err)
	}
	return func() {
		_ = syscall.Flock(int(d.Fd()), syscall.LOCK_UN)
		d.Close()
	}, nil
}
