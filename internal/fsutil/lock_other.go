//go:build !unix

package fsutil

import (
	"errors"
	"os"
)

// Where flock is missing the ownership lock is only its record: nothing excludes a second owner, so
// run one owner per directory and prefix.
var errWouldBlock = errors.New("fsutil: lock held")

func flockExclusive(*os.File) error  { return nil }
func funlock(*os.File) error         { return nil }
func processRunning(int) bool        { return true }
func lockHolders(*os.File) []Process { return nil }
