// Package fdbudget checks, before a component opens its ZMQ sockets, that the process's file
// descriptor limit (RLIMIT_NOFILE, `ulimit -n`) leaves room for them. libzmq does not fail cleanly when
// it runs out: binding a TCP endpoint resolves the address with getifaddrs, and libzmq asserts that
// this succeeds, so the process aborts (SIGABRT in ip_resolver.cpp) with a goroutine dump instead of
// returning "too many open files". Every place fpmbus opens ZMQ sockets (the bridge's SUB sockets, the
// synthetic publisher's and the replay's PUB sockets, `fpmbus up` before it starts any of them) asks
// Check first, with the descriptors its sockets take (each package states and tests its own cost per
// socket), and refuses to start with an error naming the need, the limit and how to raise it.
//
// Invariants:
//   - Check counts the descriptors open now (Linux: /proc/self/fd) plus Reserve for what the process
//     opens later (connections, log and trace files, the embedded server's store), so a budget that
//     passes leaves the process room to run, not just to bind.
//   - The limit is the soft limit: the one the kernel enforces. Go raises it to the hard limit at start,
//     so it is the most the process can have without a new `ulimit -n` (or LimitNOFILE=).
package fdbudget
