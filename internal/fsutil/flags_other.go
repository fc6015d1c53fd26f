//go:build !unix

package fsutil

// Where the system has no O_NOFOLLOW, regular.go relies on its Lstat checks and O_EXCL alone.
const (
	oNoFollow = 0
	oNonBlock = 0
)
