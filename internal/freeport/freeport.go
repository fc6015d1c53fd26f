// Package freeport hands out loopback TCP ports for the servers and sockets tests start, from below
// the kernel's ephemeral range (32768 and up on Linux). A port from that range can be taken by any
// outgoing connection or ":0" listener the moment it is free, so a server killed and started again on
// it (a cluster node, a restarted bridge's socket) may find it gone. A port is never handed out twice
// in one process; it is probed and released, so another process could still take it before the caller
// binds it, which the random choice makes unlikely.
package freeport

import (
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
)

// The range ports are chosen in: below the usual Linux ephemeral range, which Dynamo also warns about.
const (
	low  = 10000
	high = 32000
)

var (
	mu     sync.Mutex
	handed = map[int]bool{} // ports already given out in this process
)

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
		if probe(host, base, n) {
			for p := base; p < base+n; p++ {
				handed[p] = true
			}
			return base
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

func probe(host string, base, n int) bool {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for p := base; p < base+n; p++ {
		if handed[p] {
			return false
		}
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			return false
		}
		ls = append(ls, l)
	}
	return true
}
