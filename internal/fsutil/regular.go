package fsutil

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Files fpmbus creates, replaces, appends to, reads to rewrite, or removes are regular files it names
// itself, in directories it may share with other users (a trace output under /tmp, a spool directory).
// A symbolic link planted under such a name would make a write land in the file it points to, anywhere
// the process may write, and a named pipe would block a read forever. So every such operation goes
// through the functions below, which never follow a symbolic link in the last element of the path
// (O_NOFOLLOW, or O_EXCL, which fails on any existing entry, a dangling link included) and refuse
// anything that is not a regular file with a *NotRegularError naming the path and what is there.
// Directories above the last element are followed as the operating system resolves them: they are the
// operator's to choose.

// ErrNotRegular is wrapped by every *NotRegularError.
var ErrNotRegular = errors.New("fsutil: not a regular file")

// NotRegularError says that path is not a regular file, and what it is instead.
type NotRegularError struct {
	Path string
	// What is there: "a symbolic link to /etc/passwd", "a directory", "a named pipe (FIFO)", …
	What string
}

func (e *NotRegularError) Error() string {
	return fmt.Sprintf("%s is %s, not a regular file: refused (fpmbus never writes through, reads or replaces anything else)", e.Path, e.What)
}

// Unwrap returns ErrNotRegular.
func (e *NotRegularError) Unwrap() error { return ErrNotRegular }

// describe says what a non-regular file of mode m at path is.
func describe(path string, m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		if to, err := os.Readlink(path); err == nil {
			return "a symbolic link to " + to
		}
		return "a symbolic link"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	default:
		return "not a regular file (mode " + m.String() + ")"
	}
}

// notRegular returns the *NotRegularError of path when it exists and is not a regular file; nil when
// it is one or does not exist (or cannot be examined: the caller's own error then says why).
func notRegular(path string) error {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().IsRegular() {
		return nil
	}
	return &NotRegularError{Path: path, What: describe(path, fi.Mode())}
}

// CheckRegular returns a *NotRegularError when path exists and is anything but a regular file (a
// symbolic link is not followed), and whether it exists.
func CheckRegular(path string) (exists bool, err error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !fi.Mode().IsRegular() {
		return true, &NotRegularError{Path: path, What: describe(path, fi.Mode())}
	}
	return true, nil
}

// openNoFollow opens path with flag plus O_NOFOLLOW and O_NONBLOCK (a named pipe opens at once instead
// of waiting for a writer; on a regular file O_NONBLOCK does nothing) and checks that what it opened
// is a regular file. An error because path is something else is a *NotRegularError.
func openNoFollow(path string, flag int, perm fs.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, flag|oNoFollow|oNonBlock, perm)
	if err != nil {
		if nr := notRegular(path); nr != nil {
			return nil, nr
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, &NotRegularError{Path: path, What: describe(path, fi.Mode())}
	}
	return f, nil
}

// openRegular opens the regular file path for reading; a symbolic link, named pipe, directory or
// device there is refused (*NotRegularError).
func openRegular(path string) (*os.File, error) {
	return openNoFollow(path, os.O_RDONLY, 0)
}

// ReadRegular reads the regular file path (see openRegular) and returns its content and the FileInfo
// of the file it read.
func ReadRegular(path string) ([]byte, os.FileInfo, error) {
	f, err := openRegular(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	data, err := io.ReadAll(f)
	return data, fi, err
}

// CreateExclusive creates the file path, which must not exist: any entry there, a symbolic link
// included (dangling or not), is an error (os.ErrExist; a *NotRegularError when it is not a regular
// file). flag adds to O_CREATE|O_EXCL, e.g. os.O_WRONLY|os.O_APPEND.
func CreateExclusive(path string, flag int, perm fs.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, flag|os.O_CREATE|os.O_EXCL|oNoFollow, perm)
	if err != nil {
		if nr := notRegular(path); nr != nil {
			return nil, fmt.Errorf("%w: %w", err, nr)
		}
		return nil, err
	}
	return f, nil
}

// CreateRegular creates path for writing, or truncates the regular file there; a symbolic link,
// named pipe, directory or device there is refused (*NotRegularError) and left as it is.
func CreateRegular(path string, perm fs.FileMode) (*os.File, error) {
	if _, err := CheckRegular(path); err != nil {
		return nil, err // refused before O_TRUNC could touch anything
	}
	return openNoFollow(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
}

// AppendRegular opens the regular file path for appending (O_WRONLY|O_APPEND plus flag: os.O_CREATE
// creates a missing one with perm); a symbolic link, named pipe, directory or device there is refused
// (*NotRegularError) and left as it is, never written through. The check is made on the file it
// opened, so nothing swapped in under the name after an earlier look at it is appended to either.
func AppendRegular(path string, flag int, perm fs.FileMode) (*os.File, error) {
	return openNoFollow(path, os.O_WRONLY|os.O_APPEND|flag, perm)
}

// RemoveRegular removes the regular file path; a missing one is not an error, anything but a regular
// file is refused (*NotRegularError) and left as it is.
func RemoveRegular(path string) error {
	exists, err := CheckRegular(path)
	if err != nil || !exists {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// EnsureDir creates the directory path (and its parents) if missing and checks that path itself is a
// directory, not a symbolic link to one: a directory fpmbus owns (an embedded server's store) is never
// reached through a link someone may have planted under its name. The error names the path and, for a
// link, its target.
func EnsureDir(path string, perm fs.FileMode) error {
	clean := filepath.Clean(path)
	fi, err := os.Lstat(clean)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(clean, perm); err != nil {
			return err
		}
		fi, err = os.Lstat(clean)
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		what := describe(clean, fi.Mode())
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%s is %s, not a directory: refused (give the directory itself)", path, what)
		}
		return fmt.Errorf("%s is %s, not a directory", path, what)
	}
	return nil
}
