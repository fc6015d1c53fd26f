package natsconn

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"
)

// CloseOnSIGUSR1 closes the current connection (current returns it, nil when there is none) for good on
// each SIGUSR1, as a broker-side failure would (`fpmbus up --fault-sigusr1`, a drill of the
// supervision that replaces it), until stop is called.
func CloseOnSIGUSR1(current func() *nats.Conn) (stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGUSR1)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-sigs:
				if nc := current(); nc != nil {
					slog.Warn("SIGUSR1 (--fault-sigusr1): closing the components' NATS connection")
					nc.Close()
				}
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
		<-exited
	}
}
