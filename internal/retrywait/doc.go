// Package retrywait is the wait between two attempts of something that may succeed later (a server
// not reachable yet, a leader being elected, a bucket or a disk that refuses for now): the first wait,
// then each one twice the one before, up to a ceiling, until the caller resets it after a success.
//
// Invariants: the waits are exact (no jitter: logs and health name the wait that follows, and tests
// on a fake clock count on it), they never stop on their own (the caller decides when to give up:
// a deadline, a context, a number of tries), and a first wait above the ceiling is waited once before
// the ceiling holds. The waits come from github.com/cenkalti/backoff/v4, which the trace writer uses
// for its own, randomized, retries.
package retrywait
