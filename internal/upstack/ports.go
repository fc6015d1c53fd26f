package upstack

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/fpmbus/fpmbus/internal/natsserver"
)

// `fpmbus up` binds its addresses' ports before it starts anything: the embedded server's (--listen, or
// those of --server-config) and, with --demo, the synthetic ranks' (--fpm-port). An address that cannot
// be bound stays so through any number of restarts, so it is a usage error (exit 2) naming the flag,
// the address, the system's reason ("address already in use") and, when /proc tells, the process
// holding it, never a component restarted until the restart limit; --metrics-addr too, before the data
// directory is created. The components refuse a bind failure at a later restart the same way
// (natsserver.ErrListen, producer.BindError: Permanent).

// CheckPorts checks every address r will bind, and metricsAddr ("" when not served).
func (r *Run) CheckPorts(metricsAddr string) error {
	if metricsAddr != "" {
		if err := natsserver.Bindable(metricsAddr); err != nil {
			return fmt.Errorf("%w: --metrics-addr %q: %v", ErrUsage, metricsAddr, err)
		}
	}
	opts, err := r.Server.Config.Options()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if err := natsserver.CheckListen(opts); err != nil {
		if le, ok := errors.AsType[*natsserver.ListenError](err); ok && le.Listener == "client" {
			return fmt.Errorf("%w: %s: %v", ErrUsage, r.Server.From, err)
		}
		return fmt.Errorf("%w: --server-config: %v", ErrUsage, err)
	}
	host, base, n := "", 0, 0
	switch {
	case r.Demo != nil:
		host, base, n = r.Demo.Host, r.Demo.BasePort, r.Demo.DPSize
	case r.DemoTrace != nil:
		host, base, n = r.DemoTrace.ZMQ.Host, r.DemoTrace.ZMQ.BasePort, r.DemoTrace.Width
	}
	bindHost := host
	if bindHost == "*" {
		bindHost = ""
	}
	for rank := range n {
		port := base + rank
		if err := natsserver.Bindable(net.JoinHostPort(bindHost, strconv.Itoa(port))); err != nil {
			return fmt.Errorf("%w: --demo binds --fpm-port %d + dp_rank: %s (dp_rank %d): %v", ErrUsage, base, net.JoinHostPort(host, strconv.Itoa(port)), rank, err)
		}
	}
	return nil
}
