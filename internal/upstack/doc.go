// Package upstack is what `fpmbus up` runs in one process: the embedded JetStream server, the
// components' in-process connection, the consumers (trace writer, gap detector, benchmark merger,
// dataset sealer, predict service), the bridge and, with --demo, the synthetic publishers or a
// recording's replay. It owns their start and stop order (Stages: start in order, stop in reverse; the
// README's order table is generated from it), what each is built on and restarts with, their health
// (the store's state, /healthz through internal/rungroup), the status page's view of them, and the
// checks made before anything starts: the file descriptors the ZMQ sockets need and every address the
// run binds (CheckSockets, CheckPorts), and the ownership of the data directory (OwnDataDir); Prepare
// makes them in the order that leaves no trace on a refusal.
//
// Invariants: nothing starts until every address and the descriptor budget are checked; a failure no
// restart can fix (a taken address, a full disk at stream creation, refused credentials at the first
// connect, the store lost) stops the run instead of being restarted until the limit. Such an error
// that is the user's to fix wraps ErrUsage, which cmd/fpmbus maps to "usage: …" and exit 2.
//
// The flags, their defaults and the checks of their values stay in cmd/fpmbus, which builds a Run.
package upstack

import "errors"

// ErrUsage marks an error the user's settings cause (a taken address, a store too small for the
// streams): cmd/fpmbus exits 2 on it, as on a bad flag. Its text is the binary's "usage" prefix, so
// the message reads the same wherever the error is wrapped (the run group names the component).
var ErrUsage = errors.New("usage")
