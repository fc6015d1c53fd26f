// Package natsconn is how a component reaches a NATS server and talks to JetStream on it: the first
// connection and its failure named, the nats CLI's contexts, the server URL kept out of logs, the reads
// that must come from a stream's leader, the refusals of a user's permissions, and which server errors
// pass with time. It holds no part of the wire contract: subjects, headers, message ids and stream
// definitions are streams/'s, which this package imports and never the reverse.
//
//	connect.go     ConnConfig and Connect: the first connection within a timeout, attempt after attempt
//	               while the server is unreachable; a refused credential or a failed TLS handshake named
//	               at once (ErrAuth, ErrTLS, ErrUnreachable); connection events logged, OnClosed
//	flags.go       Flags: the connection flags of a command (--server, --creds, --nkey, --user, --password,
//	               --token, TLS, --context, --connect-timeout), at parity with the nats CLI; a secret never
//	               shown, a bad value an invalid.FlagError naming its flag, variable or context
//	start.go       ConnectAndEnsure, Watch: how a command starts on a server and ends with its connection
//	faultsignal.go CloseOnSIGUSR1: the drill of a connection closed for good (`up --fault-sigusr1`)
//	natscontext.go LoadNATSContext: the nats CLI's context files, refused when fpmbus cannot honour all of one
//	redact.go      RedactURL: the only way a server URL reaches a log line or an error
//	refusals.go    RefusalContext: an operation ends at the server's permission refusal, not at its timeout
//	leaderget.go   LastMsgFromLeader, NextMsgFromLeader(At): reads from a stream's leader, never a
//	               replica's past
//	unavailable.go Unavailable: the server errors after which the same call can succeed later
//
// Invariants: a URL reaches a log or an error only through RedactURL; Connect never retries what does
// not fix itself (credentials, TLS) and always retries what does (an unreachable server, within the
// timeout); once connected a client reconnects forever.
//
// What stays in streams/: Ensure, Plan, Diff and the bucket and dataset helpers also call a server,
// but each is the declaration of a JetStream resource (its name, subjects and settings) together with
// the one rule about who may change it (a component creates what is missing and uses what exists;
// only `fpmbus streams apply` changes a stream). Splitting the declaration from that rule would let a
// stage create a stream its own way; keeping them together is what makes the streams the contract.
// The fsync policy (SyncPolicy) is a server setting, not a stream's, and lives with the embedded
// server in internal/natsserver.
package natsconn
