package fsutil

import (
	"errors"
	"syscall"
)

// DiskFull reports whether err is a filesystem out of space (ENOSPC) or over its quota (EDQUOT): a
// condition that passes once space is freed, unlike a path that cannot be written at all. A component
// meeting it waits and tries again rather than giving up.
func DiskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}
