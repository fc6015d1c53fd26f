//go:build unix

package fsutil

import "syscall"

// Open flags the functions of regular.go add: never follow a symbolic link in the last element of a
// path; open a named pipe without waiting for its other end.
const (
	oNoFollow = syscall.O_NOFOLLOW
	oNonBlock = syscall.O_NONBLOCK
)
