package natsserver_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/fpmbus/fpmbus/internal/freeport"
	"github.com/fpmbus/fpmbus/internal/natsserver"
)

// A client address another process holds is refused before the server starts: an error wrapping
// ErrListen and EADDRINUSE that names the address and the holder (this test's process), instead of a
// server that never becomes ready.
func TestStartServerRefusesATakenAddress(t *testing.T) {
	t.Parallel()
	addr := fmt.Sprintf("127.0.0.1:%d", freeport.Ports(t, 1)[0])
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: addr, StoreDir: t.TempDir()})
	if err == nil {
		_ = srv.NATS()
		t.Fatal("the server started on a taken address")
	}
	le, ok := errors.AsType[*natsserver.ListenError](err)
	if !errors.Is(err, natsserver.ErrListen) || !errors.Is(err, syscall.EADDRINUSE) || !ok || le.Listener != "client" || le.Addr != addr {
		t.Fatalf("error %v (%#v), want a client ListenError for %s wrapping ErrListen and EADDRINUSE", err, le, addr)
	}
	for _, want := range []string{addr, "address already in use", fmt.Sprintf("held by pid %d", os.Getpid())} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not name %q", err, want)
		}
	}
}
