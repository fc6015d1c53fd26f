//go:build !linux

package replay

import "time"

// fineSleep sleeps d (at most fineWindow); elsewhere than Linux with the runtime's timer.
func fineSleep(d time.Duration) { time.Sleep(d) }
