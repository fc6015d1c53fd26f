// Package freeport hands out loopback TCP ports for the servers and sockets tests start, from below
// the kernel's ephemeral range (32768 and up on Linux). A port from that range can be taken by any
// outgoing connection or ":0" listener the moment it is free, so a server killed and started again on
// it (a cluster node, a restarted bridge's socket) may find it gone. A port is never handed out twice
// across the test processes of one run: `go test ./...` runs packages as processes side by side, and a
// port one of them has probed but not yet bound (a cluster node started after two others, a node
// stopped and started again) was seen taken by another, which left that node unable to listen. So a
// port is claimed before it is handed out: an exclusive advisory lock on a file named for it under
// the temporary directory, held until the process exits (the kernel releases it then, also after
// kill -9). A port is also probed, since anything else on the machine may hold it.
package freeport

import (
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
)

// The range ports are chosen in: below the usual Linux ephemeral range, which Dynamo also warns about.
const (
	low  = 10000
	high = 32000
)

var (
	mu     sync.Mutex
	handed = map[int]bool{} // ports given out by this process
	// held keeps every claim's file referenced: a collected *os.File closes its descriptor, and so
	// drops its lock, while the port is still in use.
	held []*os.File
)

// claimDir holds one lock file per claimed port; shared by every process of the user's test runs.
var claimDir = filepath.Join(os.TempDir(), "fpmbus-freeport")

// Block returns a base port such that base..base+n-1 are all free on host (127.0.0.1 when "").
func Block(tb testing.TB, host string, n int) int {
	tb.Helper()
	if host == "" {
		host = "127.0.0.1"
	}
	mu.Lock()
	defer mu.Unlock()
	for range 200 {
		base := low + rand.IntN(high-low-n)
		if claims, ok := claim(base, n); ok {
			if probe(host, base, n) {
				for p := base; p < base+n; p++ {
					handed[p] = true
				}
				held = append(held, claims...)
				return base
			}
			release(claims)
		}
	}
	tb.Fatalf("freeport: no %d consecutive free ports on %s in %d..%d", n, host, low, high)
	return 0
}

// Ports returns n distinct free loopback ports, not necessarily consecutive.
func Ports(tb testing.TB, n int) []int {
	tb.Helper()
	ports := make([]int, n)
	for i := range ports {
		ports[i] = Block(tb, "", 1)
	}
	return ports
}

// claim takes the cross-process claim of base..base+n-1, all or none. A port this process handed out
// already, or one another process holds, is refused. Where the claim directory cannot be used (a
// read-only temporary directory), ports are handed out on the probe alone, as before claims existed.
func claim(base, n int) ([]*os.File, bool) {
	claims := make([]*os.File, 0, n)
	for p := base; p < base+n; p++ {
		if handed[p] {
			release(claims)
			return nil, false
		}
		f, err := lockPort(p)
		if err != nil {
			release(claims)
			return nil, false
		}
		claims = append(claims, f) // nil where claims are unavailable
	}
	return claims, true
}

// lockPort returns the held lock file of port p; nil and no error when no claim can be made here.
func lockPort(p int) (*os.File, error) {
	if err := os.MkdirAll(claimDir, 0o777); err != nil {
		return nil, nil
	}
	f, err := os.OpenFile(filepath.Join(claimDir, strconv.Itoa(p)), os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, nil
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, err // another process holds it
	}
	return f, nil
}

func release(claims []*os.File) {
	for _, f := range claims {
		if f != nil {
			f.Close() // closing the descriptor drops its lock
		}
	}
}

func probe(host string, base, n int) bool {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for p := base; p < base+n; p++ {
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			return false
		}
		ls = append(ls, l)
	}
	return true
}
