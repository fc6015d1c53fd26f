package natsservertest

import (
	"bytes"
	"runtime"
	"testing"
	"time"
)

// sourceSetupFrame is the goroutine in which nats-server waits for the answer to a stream source's
// consumer request. It has no quit channel: a request sent while the source's server was unreachable
// (a leafnode not yet reconnected) keeps it waiting up to 30 s, beyond the server's shutdown.
const sourceSetupFrame = "server.(*stream).trySetupSourceConsumer"

// WaitSourceSetups waits, for at most wait, until no stream source's consumer request is pending in
// this process, so that a test's goroutine leak check sees only what the test itself left behind.
// Register it with t.Cleanup before starting the servers, so that it runs after they shut down.
func WaitSourceSetups(t testing.TB, wait time.Duration) {
	t.Helper()
	deadline := time.Now().Add(wait)
	buf := make([]byte, 1<<20)
	for {
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				buf = buf[:n]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		if !bytes.Contains(buf, []byte(sourceSetupFrame)) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("a stream source's consumer request is still pending after %v", wait)
			return
		}
		buf = buf[:cap(buf)]
		time.Sleep(100 * time.Millisecond)
	}
}
