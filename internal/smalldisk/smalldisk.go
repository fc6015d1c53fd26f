// Package smalldisk gives tests a real filesystem they can fill: a tmpfs of a chosen size mounted on a
// test's temporary directory, so that a server's writes fail with the kernel's own ENOSPC, exactly as
// on a full disk, without touching the machine's disks. Mounting needs root (CAP_SYS_ADMIN), which the
// test machines and CI have; without it the test fails, naming why, rather than skipping.
//
// Invariants: the filesystem is unmounted at the test's cleanup (lazily, so files a server still holds
// open do not keep it), before the temporary directory under it is removed; Fill leaves no space
// available to unprivileged writers and returns the function that frees it again.
package smalldisk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Mount mounts a tmpfs of size bytes on a new temporary directory and returns that directory.
func Mount(tb testing.TB, size int64) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0755", size)); err != nil {
		tb.Fatalf("smalldisk: mount a %d-byte tmpfs on %s: %v (the full-disk tests need root, as CI has)", size, dir, err)
	}
	tb.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			tb.Errorf("smalldisk: unmount %s: %v", dir, err)
		}
	})
	return dir
}

// Fill writes a filler file in dir until its filesystem has no space left and returns a function that
// removes it again.
func Fill(tb testing.TB, dir string) (free func()) {
	tb.Helper()
	path := filepath.Join(dir, "smalldisk-filler")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		tb.Fatalf("smalldisk: %v", err)
	}
	buf := make([]byte, 64<<10)
	for n := len(buf); n > 0; { // halving at each refusal: the last blocks take smaller writes
		if _, err := f.Write(buf[:n]); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				tb.Fatalf("smalldisk: filling %s: %v, want no space left", dir, err)
			}
			n /= 2
		}
	}
	_ = f.Close() // nothing left to flush: every write went to the file or failed
	return func() {
		if err := os.Remove(path); err != nil {
			tb.Errorf("smalldisk: freeing %s: %v", dir, err)
		}
	}
}
