//go:build linux

package replay

import (
	"syscall"
	"time"
)

// fineSleep sleeps d (at most fineWindow) precisely: nanosleep(2) on the calling thread wakes within
// about 0.1 ms, where the Go runtime's timers round a sub-millisecond wait up to a whole millisecond
// (its network poller waits in milliseconds). The thread is blocked for d; the runtime runs other
// goroutines on other threads meanwhile.
func fineSleep(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	_ = syscall.Nanosleep(&ts, nil) // an interrupted sleep returns early; the caller re-checks the time
}
