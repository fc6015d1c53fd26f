//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package trace

// lockDir is a no-op where flock is missing: run one repair per output at a time.
func lockDir(string) (func(), error) { return func() {}, nil }
