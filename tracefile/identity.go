package tracefile

import (
	"hash/maphash"
	"time"
)

// A line is matched to its stream message by identity, since a line carries nothing fpmbus-specific
// (it must stay Dynamo-identical): its producer's segment prefix, observed_at_unix_ms, and a 64-bit
// hash of namespace, component, producer_id and the fpm object's bytes (the fpm object carries
// worker_id, dp_rank and counter_id, and is the message body verbatim). Two stream messages with the
// same identity are byte-identical lines; each line found accounts for one of them. The trace
// writer's takeover recovery finds by it the lines an earlier owner wrote for redelivered messages;
// Verify matches lines to stream FPM by it.

// RecoverySlack tolerates clock skew between the server (stream timestamps) and this host (mtimes).
const RecoverySlack = time.Minute

// identitySeed hashes line identities; it only has to be stable within one process.
var identitySeed = maphash.MakeSeed()

// LineIdentity identifies a trace line (see above).
type LineIdentity struct {
	prefix   string
	observed int64
	sum      uint64
}

// IdentityOf is the identity of the line of producer prefix with these source fields, observation
// time and fpm object (the message body).
func IdentityOf(prefix, namespace, component, producer string, observed int64, fpm []byte) LineIdentity {
	var h maphash.Hash
	h.SetSeed(identitySeed)
	h.WriteString(namespace)
	h.WriteByte(0)
	h.WriteString(component)
	h.WriteByte(0)
	h.WriteString(producer)
	h.WriteByte(0)
	h.Write(fpm)
	return LineIdentity{prefix: prefix, observed: observed, sum: h.Sum64()}
}
