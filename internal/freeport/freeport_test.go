package freeport

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
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

// Another test process's claim is seen here: a port it holds is not handed out, and the ports handed
// out here are held against it. A second open description of a lock file stands for the other
// process (flock locks belong to the open description, so it conflicts as another process's would).
func TestPortsAreClaimedAcrossProcesses(t *testing.T) {
	t.Parallel()
	lockAsAnotherProcess := func(p int) (*os.File, error) {
		f, err := os.OpenFile(filepath.Join(claimDir, strconv.Itoa(p)), os.O_RDWR|os.O_CREATE, 0o666)
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	}
	for _, p := range Ports(t, 5) {
		if f, err := lockAsAnotherProcess(p); err == nil {
			f.Close()
			t.Fatalf("port %d was handed out but another process could claim it", p)
		}
	}

	// A port another process holds: this process's claim of it is refused.
	mu.Lock()
	defer mu.Unlock()
	for p := low; p < high; p++ {
		if handed[p] {
			continue
		}
		other, err := lockAsAnotherProcess(p)
		if err != nil {
			continue // held by a test process running beside this one
		}
		defer other.Close()
		if claims, ok := claim(p, 1); ok {
			release(claims)
			t.Fatalf("port %d is held by another process, yet it was claimed here", p)
		}
		return
	}
	t.Fatal("no port to test with")
}
