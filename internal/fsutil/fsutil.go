package fsutil

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// errInvalidOption is wrapped by the error of an option that cannot apply to the write it is given to.
var errInvalidOption = errors.New("fsutil: invalid option")

// SyncDir fsyncs a directory so that entries created, renamed or removed in it are durable. A file
// system that cannot fsync a directory (it answers EINVAL) already makes such entries as durable as it
// can, so that answer is not an error.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if errors.Is(err, fs.ErrInvalid) {
		err = nil
	}
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// option changes how WriteFileAtomic and WriteAtomic write.
type option func(*options)

type options struct {
	tmp string
}

// TempPath makes the write go through the temporary file tmp, which must be in path's directory,
// instead of a random "<base>.tmp-*" name. An existing regular file tmp (the leftover of an interrupted
// write) is removed first and tmp is then created exclusively, so a symbolic link, named pipe or
// directory planted under that name is refused (*NotRegularError), never written through. It is for
// callers that remove the leftover of an interrupted write by name.
func TempPath(tmp string) option {
	return func(o *options) { o.tmp = tmp }
}

// WriteFileAtomic replaces path with data, with permissions perm: see WriteAtomic.
func WriteFileAtomic(path string, data []byte, perm fs.FileMode, opts ...option) error {
	return WriteAtomic(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}, opts...)
}

// WriteAtomic replaces path with what write writes, with permissions perm. It creates path's directory
// if needed, writes a temporary file in it (created exclusively: never through a symbolic link), fsyncs
// and closes it, renames it over path and fsyncs the directory. path must be a regular file or missing:
// a symbolic link, directory or other non-regular file there is refused (*NotRegularError) and left as
// it is. An error from write (returned as it is, for errors.Is) or from any step leaves the old file
// untouched and removes the temporary one.
func WriteAtomic(path string, perm fs.FileMode, write func(io.Writer) error, opts ...option) error {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	dir := filepath.Dir(path)
	if o.tmp != "" && filepath.Dir(o.tmp) != dir {
		return fmt.Errorf("%w: temporary file %s is not in the directory of %s", errInvalidOption, o.tmp, path)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if _, err := CheckRegular(path); err != nil {
		return err
	}
	var f *os.File
	var err error
	if o.tmp != "" {
		if err := RemoveRegular(o.tmp); err != nil {
			return fmt.Errorf("temporary file: %w", err)
		}
		f, err = CreateExclusive(o.tmp, os.O_WRONLY, perm)
	} else {
		f, err = os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	}
	if err != nil {
		return err
	}
	tmp := f.Name()
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := write(f); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(fmt.Errorf("fsync %s: %w", tmp, err))
	}
	if err := f.Chmod(perm); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
