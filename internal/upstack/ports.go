package main

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

// checkPorts checks every address r will bind, and metricsAddr ("" when not served).
func (r *upRun) checkPorts(metricsAddr string) error {
	if metricsAddr != "" {
		if err := natsserver.Bindable(metricsAddr); err != nil {
			return fmt.Errorf("%w: --metrics-addr %q: %v", errUsage, metricsAddr, err)
		}
	}
	opts, err := r.server.server.Options()
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if err := natsserver.CheckListen(opts); err != nil {
		if le, ok := errors.AsType[*natsserver.ListenError](err); ok && le.Listener == "client" {
			return fmt.Errorf("%w: %s: %v", errUsage, r.server.from, err)
		}
		return fmt.Errorf("%w: --server-config: %v", errUsage, err)
	}
	host, base, n := "", 0, 0
	switch {
	case r.demo != nil:
		host, base, n = r.demo.Host, r.demo.BasePort, r.demo.DPSize
	case r.demoTrace != nil:
		host, base, n = r.demoTrace.zmq.Host, r.demoTrace.zmq.BasePort, r.demoTrace.width
	}
	bindHost := host
	if bindHost == "*" {
		bindHost = ""
	}
	for rank := range n {
		port := base + rank
		if err := natsserver.Bindable(net.JoinHostPort(bindHost, strconv.Itoa(port))); err != nil {
			return fmt.Errorf("%w: --demo binds --fpm-port %d + dp_rank: %s (dp_rank %d): %v", errUsage, base, net.JoinHostPort(host, strconv.Itoa(port)), rank, err)
		}
	}
	return nil
}
