package partition

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/streams"
)

// Defaults. PinnedTTL bounds crash failover; AckWait only bounds how long a message handed to a
// handler may stay unacked before the server redelivers it (the member drops such redeliveries while
// it owns the partition; see the package comment), so it is generous.
const (
	defaultPartitions     = 16
	defaultAckWait        = 60 * time.Second
	DefaultPinnedTTL      = 10 * time.Second
	defaultMaxAckPending  = 10000
	defaultBatch          = 1000
	defaultReleaseTimeout = 30 * time.Second

	// MinPinnedTTL keeps the consumer's idle heartbeat (PinnedTTL/5, at least 1 s) well inside it.
	MinPinnedTTL = 3 * time.Second
	// MaxPartitions bounds Partitions (one durable consumer each).
	MaxPartitions = 1024
	// MaxPinnedTTL keeps member heartbeats well inside the members bucket's age limit.
	MaxPinnedTTL = 10 * time.Minute

	// MaxNameLen bounds a group name, a member id and a consumer name (streams.ValidName): a partition's
	// consumer is <group>-<p>, its partition stream FPM_PART_<group>, a member's key
	// <stream>.<group>.<member id>, and all of them must stay within the server's name limits.
	MaxNameLen = 64
	// maxStreamNameLen bounds the name of the stream a group consumes.
	maxStreamNameLen = 128
)

// Names shared by every group.
const (
	// MembersBucket is the KV bucket of live members, key <stream>.<group>.<member id> (re-put every
	// PinnedTTL/4, deleted on graceful leave), and of partition owners, key
	// <stream>.<group>.owner.<p> (written only with compare-and-set; see owner.go).
	MembersBucket = "FPM_GROUPS"
	// unownedSubjectPrefix starts the deliver subject of a partition consumer nobody has owned yet:
	// nobody subscribes to it, so the server holds the partition's messages until a member takes it.
	unownedSubjectPrefix = "_FPMBUS.unowned."
	membersBucketTTL     = time.Hour

	// Stream metadata recording how a partition stream was made, checked by every Join.
	metaPartitions = "fpmbus_partitions"
	metaFilters    = "fpmbus_filters"
	metaSource     = "fpmbus_source"
)

// errInvalidConfig is wrapped by every configuration error.
var errInvalidConfig = errors.New("partition: invalid configuration")

// ErrGroupMismatch is returned by Join when the group already exists on the server with a different
// partitioning (partition count, filters or key tokens). Changing it would move keys between partitions
// and break per-key order; Delete the group first (its consumers restart from the stream's start).
var ErrGroupMismatch = errors.New("partition: group exists with a different partitioning")

// errNoPartition is returned by Config.PartitionOf for a subject no filter matches.
var errNoPartition = errors.New("partition: subject matches no filter of the group")

// Filter selects subjects of the stream and says which of their tokens form the partition key.
type Filter struct {
	// Subject is a subject filter on the stream, e.g. "fpm.*.*.*.*". It may end in ">".
	Subject string `json:"subject"`
	// KeyTokens are 1-based indexes of the "*" wildcards of Subject whose values, concatenated, are
	// hashed into the partition (exactly the server's {{partition(n,i...)}} transform). Empty: the whole
	// subject is hashed.
	KeyTokens []int `json:"key_tokens,omitempty"`
}

// Config describes one consumer group: which stream it reads, how keys map to partitions and the
// consumer settings of every partition.
type Config struct {
	// Stream is the stream the group consumes (its subjects and messages are never changed).
	Stream string
	// Group names the group: instances with the same Stream and Group share the work. Letters,
	// digits, '-' and '_'.
	Group string
	// Partitions is the number of partitions P. Fixed for the life of the group. P=1 consumes Stream
	// directly (no copy); P>1 consumes a partition stream that sources Stream and prefixes every
	// subject with its partition number (one extra write per message; see the package comment).
	Partitions int
	// Filters select the subjects consumed and their partition key. At least one; they must not overlap.
	Filters []Filter
	// AckWait of every partition consumer: how long a handed message may stay unacked before the
	// server redelivers it.
	AckWait time.Duration
	// PinnedTTL is how long a partition stays with an owner whose delivery subscription is gone
	// (crashed, or cut off and closed by the server) before another member takes it, and how long a
	// member without heartbeat stays in the membership: crash failover takes about PinnedTTL plus a
	// standby poll (PinnedTTL/10, at most 500 ms).
	PinnedTTL time.Duration
	// MaxAckPending bounds the unacked messages of one partition (and the member's buffer for it).
	MaxAckPending int
	// Batch is the fetch size of a plain pull consumer on the group's consumer settings (the
	// benchmarks' bare side; <= MaxAckPending). Partition consumers push, and the runner bounds what
	// it hands a stage at once with its own durable.Config.Batch.
	Batch int
	// ReleaseTimeout bounds a graceful release: the handler draining and acking what it was given.
	// Past it the handler's context is cancelled and the partition is given up without a release (the
	// next owner takes it after PinnedTTL).
	ReleaseTimeout time.Duration
	// CumulativeAcks declares the partition consumers with the AckAll policy: an ack acknowledges the
	// message and every message handed before it in the session. The handler then acks only the last
	// message of a prefix it has made durable, and never Terms (a Term would acknowledge everything
	// before it as well). It saves the server one ack per message. Fixed for the group's life.
	CumulativeAcks bool
	// Shards > 1 says Stream does not exist as one stream: it is spread over Shards streams
	// <Stream>_0 … <Stream>_<Shards-1> (streams.ShardStreamName), each key in one of them by the
	// shard function (streams.ShardOf). With Partitions == Shards and the group keyed like the shards
	// (ShardKeyed), partition p consumes shard p itself (no copy); otherwise the partition stream
	// sources every shard (see shards.go). 0 or 1: Stream is one stream.
	Shards int
}

// FPMConfig is a group on stream FPM keyed by the whole producer key (namespace, component,
// worker_id, dp_rank): tokens 1-4 of fpm.<namespace>.<component>.<worker_id>.<dp_rank>.
func FPMConfig(group string) Config {
	return defaultConfig(streams.StreamFPM, group, Filter{Subject: streams.FPMRoot + ".*.*.*.*", KeyTokens: []int{1, 2, 3, 4}})
}

// BenchConfig is a group on stream FPM_BENCH keyed by the run: the first '*' of each subject is its
// run token (fpmbench.<kind>.<run>…), so that every artefact of one run shares a partition and one
// owner (a merger sees all the ranks and probe replies of a run). The other settings are the defaults.
func BenchConfig(group string, subjects ...string) Config {
	filters := make([]Filter, len(subjects))
	for i, s := range subjects {
		filters[i] = Filter{Subject: s, KeyTokens: []int{1}}
	}
	return defaultConfig(streams.StreamBench, group, filters...)
}

// defaultConfig is a group on stream reading filters, every other setting at its default.
func defaultConfig(stream, group string, filters ...Filter) Config {
	return Config{
		Stream:         stream,
		Group:          group,
		Partitions:     defaultPartitions,
		Filters:        filters,
		AckWait:        defaultAckWait,
		PinnedTTL:      DefaultPinnedTTL,
		MaxAckPending:  defaultMaxAckPending,
		Batch:          defaultBatch,
		ReleaseTimeout: defaultReleaseTimeout,
	}
}

// withDefaults fills zero durations and sizes.
func (c Config) withDefaults() Config {
	c.Partitions = cmp.Or(c.Partitions, defaultPartitions)
	c.AckWait = cmp.Or(c.AckWait, defaultAckWait)
	c.PinnedTTL = cmp.Or(c.PinnedTTL, DefaultPinnedTTL)
	c.MaxAckPending = cmp.Or(c.MaxAckPending, defaultMaxAckPending)
	c.Batch = cmp.Or(c.Batch, min(defaultBatch, c.MaxAckPending))
	c.ReleaseTimeout = cmp.Or(c.ReleaseTimeout, defaultReleaseTimeout)
	return c
}

// Validate reports the first setting that cannot work. Zero durations and sizes take their defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := invalid.Reporter(errInvalidConfig)
	switch {
	case !streams.ValidName(c.Stream, maxStreamNameLen):
		return bad("stream %q: want letters, digits, '-' and '_'", c.Stream)
	case !streams.ValidName(c.Group, MaxNameLen):
		return bad("group %q: want 1-64 letters, digits, '-' and '_'", c.Group)
	case c.Partitions < 1 || c.Partitions > MaxPartitions:
		return bad("partitions %d: want 1 to %d", c.Partitions, MaxPartitions)
	case len(c.Filters) == 0:
		return bad("no filter: say which subjects of %s the group consumes", c.Stream)
	case c.AckWait < time.Second:
		return bad("ack wait %v: want at least 1s", c.AckWait)
	case c.PinnedTTL < MinPinnedTTL || c.PinnedTTL > MaxPinnedTTL:
		return bad("pinned TTL %v: want %v to %v", c.PinnedTTL, MinPinnedTTL, MaxPinnedTTL)
	case c.MaxAckPending < 1:
		return bad("max ack pending %d: want at least 1", c.MaxAckPending)
	case c.Batch < 1 || c.Batch > c.MaxAckPending:
		return bad("batch %d: want 1 to max ack pending (%d)", c.Batch, c.MaxAckPending)
	case c.ReleaseTimeout <= 0:
		return bad("release timeout %v: want > 0", c.ReleaseTimeout)
	case c.Shards < 0 || c.Shards > MaxPartitions:
		return bad("shards %d: want 0 to %d", c.Shards, MaxPartitions)
	}
	for i, f := range c.Filters {
		toks := strings.Split(f.Subject, ".")
		wild := 0
		for j, t := range toks {
			switch {
			case t == "":
				return bad("filter %d %q: empty token", i, f.Subject)
			case t == ">":
				if j != len(toks)-1 {
					return bad("filter %d %q: '>' must be the last token", i, f.Subject)
				}
			case t == "*":
				wild++
			case strings.ContainsAny(t, "*> \t{}"):
				return bad("filter %d %q: token %q", i, f.Subject, t)
			}
		}
		seen := map[int]bool{}
		for _, k := range f.KeyTokens {
			if k < 1 || k > wild || seen[k] {
				return bad("filter %d %q: key token %d: want distinct indexes 1..%d of its '*' wildcards", i, f.Subject, k, wild)
			}
			seen[k] = true
		}
		for j := range i {
			if subjectsCollide(f.Subject, c.Filters[j].Subject) {
				return bad("filters %q and %q overlap", c.Filters[j].Subject, f.Subject)
			}
		}
	}
	return nil
}

// subjectsCollide reports whether some subject matches both filters.
func subjectsCollide(a, b string) bool {
	ta, tb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; ; i++ {
		switch {
		case i == len(ta) && i == len(tb):
			return true
		case i < len(ta) && ta[i] == ">", i < len(tb) && tb[i] == ">":
			return true
		case i == len(ta) || i == len(tb):
			return false
		case ta[i] != tb[i] && ta[i] != "*" && tb[i] != "*":
			return false
		}
	}
}

// PartitionOf returns the partition of a message subject: the FNV-1a 32-bit hash of the concatenated
// key-token values (no separator; the whole subject when the filter has no key tokens), modulo
// Partitions. This is exactly what the server's {{partition(P,i...)}} subject transform computes, so
// the value is stable across versions and instances and is what the partition stream stores.
func (c Config) PartitionOf(subject string) (int, error) {
	c = c.withDefaults()
	toks := strings.Split(subject, ".")
	for _, f := range c.Filters {
		vals, ok := matchWildcards(f.Subject, toks)
		if !ok {
			continue
		}
		if c.Partitions == 1 {
			return 0, nil
		}
		h := fnv.New32a()
		if len(f.KeyTokens) == 0 {
			_, _ = h.Write([]byte(subject))
		} else {
			for _, k := range f.KeyTokens {
				_, _ = h.Write([]byte(vals[k-1]))
			}
		}
		return int(h.Sum32() % uint32(c.Partitions)), nil
	}
	return 0, fmt.Errorf("%w: %q", errNoPartition, subject)
}

// matchWildcards matches subject tokens against filter and returns the values of its '*' tokens.
func matchWildcards(filter string, toks []string) ([]string, bool) {
	ft := strings.Split(filter, ".")
	var vals []string
	for i, f := range ft {
		if f == ">" {
			return vals, len(toks) > i
		}
		if i >= len(toks) {
			return nil, false
		}
		switch f {
		case "*":
			vals = append(vals, toks[i])
		case toks[i]:
		default:
			return nil, false
		}
	}
	return vals, len(toks) == len(ft)
}

// transformDest is the destination of filter f's subject transform into the partition stream:
// "{{partition(P,i...)}}." followed by the filter with every '*' written back as {{wildcard(n)}}, so
// the stored subject is "<partition>.<original subject>".
func (c Config) transformDest(f Filter) string {
	var b strings.Builder
	if c.Partitions == 1 { // a one-partition copy of shards (copies): every key in partition 0
		b.WriteString("0")
	} else {
		b.WriteString("{{partition(")
		b.WriteString(strconv.Itoa(c.Partitions))
		for _, k := range f.KeyTokens {
			b.WriteByte(',')
			b.WriteString(strconv.Itoa(k))
		}
		b.WriteString(")}}")
	}
	n := 0
	for _, t := range strings.Split(f.Subject, ".") {
		b.WriteByte('.')
		if t == "*" {
			n++
			b.WriteString("{{wildcard(" + strconv.Itoa(n) + ")}}")
		} else {
			b.WriteString(t)
		}
	}
	return b.String()
}

// PartitionStream is the stream a group with Partitions > 1 consumes, "" for Partitions == 1; with
// shards, the one a group that does not read its shards directly consumes (see shards.go).
func (c Config) PartitionStream() string {
	if !c.withDefaults().copies() {
		return ""
	}
	return c.Stream + "_PART_" + c.Group
}

// ConsumerStream is the stream the partition consumers live on; with a group that consumes shards
// directly, each partition's is its shard (ConsumerStreamOf), and this names the first.
func (c Config) ConsumerStream() string { return c.ConsumerStreamOf(0) }

// ConsumerStreamOf is the stream partition p's consumer lives on: the partition stream, the group's
// stream, or shard p when the group consumes shards directly.
func (c Config) ConsumerStreamOf(p int) string {
	if s := c.PartitionStream(); s != "" {
		return s
	}
	if c.withDefaults().direct() {
		return c.shardStream(p)
	}
	return c.Stream
}

// UnownedSubject is partition p's deliver subject before its first owner: one nobody subscribes to.
func (c Config) UnownedSubject(p int) string {
	return unownedSubjectPrefix + c.Stream + "." + c.ConsumerName(p)
}

// idleHeartbeat is the partition consumers' idle heartbeat: an owner whose subscription hears nothing
// for two of them (its subject taken, or the server gone) ends its session.
func (c Config) idleHeartbeat() time.Duration { return max(c.PinnedTTL/5, time.Second) }

// standbyPoll is how often a member looks at a partition assigned to it that it does not own yet.
func (c Config) standbyPoll() time.Duration {
	return min(max(c.PinnedTTL/10, 100*time.Millisecond), 500*time.Millisecond)
}

// ConsumerName is the durable consumer of partition p: the group name itself when Partitions == 1
// (so `nats consumer info FPM <group>` works), else "<group>-<p>".
func (c Config) ConsumerName(p int) string {
	if c.withDefaults().Partitions == 1 {
		return c.Group
	}
	return c.Group + "-" + strconv.Itoa(p)
}

// filterSubjects are the consumer filters of partition p.
func (c Config) filterSubjects(p int) []string {
	if !c.withDefaults().copies() {
		out := make([]string, len(c.Filters))
		for i, f := range c.Filters {
			out[i] = f.Subject
		}
		return out
	}
	return []string{strconv.Itoa(p) + ".>"}
}

// filtersSignature records the partitioning in the partition stream's metadata.
func (c Config) filtersSignature() string {
	parts := make([]string, len(c.Filters))
	for i, f := range c.Filters {
		ks := make([]string, len(f.KeyTokens))
		for j, k := range f.KeyTokens {
			ks[j] = strconv.Itoa(k)
		}
		parts[i] = f.Subject + "[" + strings.Join(ks, ",") + "]"
	}
	return strings.Join(parts, " ")
}
