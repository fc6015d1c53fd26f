package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestPortsAreFreeDistinctAndBelowTheEphemeralRange(t *testing.T) {
	t.Parallel()
	seen := map[int]bool{}
	check := func(p int) {
		t.Helper()
		if p < low || p >= high || seen[p] {
			t.Fatalf("port %d: out of %d..%d or handed out twice", p, low, high)
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		l.Close()
	}
	for _, p := range Ports(t, 50) {
		check(p)
	}
	base := Block(t, "", 8)
	for p := base; p < base+8; p++ {
		check(p)
	}
}
