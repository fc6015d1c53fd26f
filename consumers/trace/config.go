package trace

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// The Dynamo variables the trace writer reads; their meaning and defaults are Dynamo's
// (lib/llm/src/fpm_trace/config.rs).
const (
	EnvMode           = "DYN_FPM_MODE"
	EnvOutputPath     = "DYN_FPM_OUTPUT_PATH"
	EnvSampleInterval = "DYN_FPM_SAMPLE_INTERVAL_MS"
	EnvRollBytes      = "DYN_FPM_JSONL_GZ_ROLL_BYTES"
	EnvMaxSegments    = "DYN_FPM_MAX_SEGMENTS"
)

// Mode is the writer's capture mode (DYN_FPM_MODE, --trace-mode). Its text is the capture_mode of every
// line written in it, so the modes are the trace format's values (schemas.CaptureSampled,
// schemas.CaptureFull) and a line records its Mode as it is.
type Mode string

// The capture modes, as Dynamo names them.
const (
	// ModeSampled writes the newest FPM per key once per SampleInterval, when its counter_id changed.
	ModeSampled Mode = schemas.CaptureSampled
	// ModeFull writes every FPM, heartbeats included.
	ModeFull Mode = schemas.CaptureFull
)

// Defaults, as in Dynamo, plus fpmbus's consumer settings.
const (
	defaultMode           = ModeSampled
	defaultOutputPath     = "/tmp/dynamo-fpm"
	defaultSampleInterval = 5000 * time.Millisecond
	defaultRollBytes      = 256 << 20 // uncompressed JSONL bytes
	defaultMaxSegments    = 4
	DefaultGroup          = "fpm-trace"
	defaultPartitions     = 0 // one per FPM shard: 1 on the single stream FPM
	DefaultFilterSubject  = streams.FPMWildcard
	defaultFlushInterval  = time.Second
	defaultBufferSize     = 1 << 20
	defaultStopTimeout    = 10 * time.Second
	defaultMaxAckPending  = 20000
	defaultAckWait        = 60 * time.Second
)

// ErrInvalidConfig is wrapped by every configuration error; the message names the setting (variable
// and flag) and the bad value.
var ErrInvalidConfig = errors.New("trace: invalid configuration")

// Config configures a Consumer (and a Backfill, which uses the settings that shape the files). Start
// from DefaultConfig; the zero value is not valid. The binary reads Dynamo's DYN_FPM_* variables as its
// flags' defaults (cmd/fpmbus), parsing them with ParseMode and ParsePositive.
type Config struct {
	// MaxDeliveries bounds how often one message is delivered, and how often its partition is taken
	// over after a crash without progress, before it is dead-lettered (0: durable.defaultMaxDeliveries).
	MaxDeliveries int
	// Mode is ModeSampled or ModeFull (DYN_FPM_MODE, --trace-mode).
	Mode Mode
	// OutputPath is Dynamo's output path (DYN_FPM_OUTPUT_PATH, --trace-output): a trailing .jsonl.gz
	// or .jsonl is stripped and ".<producer>.<index:06>.jsonl.gz" appended.
	OutputPath string
	// SampleInterval is the sampled-mode interval, whole milliseconds (DYN_FPM_SAMPLE_INTERVAL_MS,
	// --sample-interval). Validated in both modes, as Dynamo does.
	SampleInterval time.Duration
	// RollBytes is the uncompressed size at which a segment rolls (DYN_FPM_JSONL_GZ_ROLL_BYTES,
	// --roll-bytes).
	RollBytes int64
	// MaxSegments is how many segments of one producer are kept, the active one included
	// (DYN_FPM_MAX_SEGMENTS, --max-segments).
	MaxSegments int
	// ProducerID, when set, files every message under this producer id (--producer-id). Empty: the
	// message's Fpm-Producer header, else its worker_id.
	ProducerID string
	// Group names the writer's consumer group (--group): every instance with the same Group shares
	// the work (consumers/partition). With one partition its consumer is <Group> on stream FPM itself.
	// Writers that should not share producers need distinct groups and disjoint FilterSubjects.
	Group string
	// FilterSubject selects the FPM subjects this writer consumes (--filter), e.g. fpm.dynamo.>.
	FilterSubject string
	// Partitions is the number of partitions P of the group (--partitions). 0 (the default): one per
	// FPM shard (1 on the single stream FPM; 1 as well with ProducerID or a FilterSubject naming one
	// worker_id, which leave one key). 1: one instance writes, the others are hot standbys, and the
	// group consumes stream FPM itself; P > 1: the producers (keyed by worker_id) are spread over the
	// instances through the partition stream FPM_PART_<Group>, a server-side copy of FPM — except with
	// FPM shards and P equal to their number, where partition p is shard p, read directly (the shards
	// are keyed by worker_id too). Fixed for the life of the group.
	Partitions int
	// FPMShards is the server's FPM shard count (streams.DiscoverFPMShards; 0: New reads it from the
	// server). With n > 1 shards every FPM of one worker_id is in one shard, so with one partition per
	// shard (the default) each partition reads its shard directly and every producer's files still
	// have one writer; another P reads the partition stream FPM_PART_<Group>, which sources every
	// shard (with P = 1 too). Either way a key's order is its shard's and is kept.
	FPMShards int
	// PinnedTTL bounds crash failover to another instance (--pinned-ttl): how long an instance that
	// stopped pulling keeps its partitions. A restarted instance with the same member id
	// (durable.WithMemberID) takes its partitions back at once.
	PinnedTTL time.Duration
	// FlushInterval bounds how long a received message waits before its line is durable and acked.
	FlushInterval time.Duration
	// BufferSize is the uncompressed bytes one producer buffers before its flush (Dynamo: 1 MiB per
	// writer). All producers also flush every FlushInterval, and when half of MaxAckPending waits.
	BufferSize int
	// StopTimeout bounds the graceful stop of each owned partition: writing and fsyncing what was
	// received, acknowledging it.
	StopTimeout time.Duration
	// MaxAckPending of each partition consumer: how many messages may wait for their line to be
	// durable. A flush starts when a quarter of it is waiting.
	MaxAckPending int
	// AckWait of the partition consumers; 0 = automatic (defaultAckWait, or in sampled mode at least
	// twice SampleInterval + FlushInterval, since a message may wait a whole interval for its line).
	AckWait time.Duration
	// CompressionLevel is the gzip level of new members: 1 fastest … 9 smallest (0:
	// tracefile.DefaultCompressionLevel).
	CompressionLevel int
	// RetryInitial and RetryMax are the backoff of a failed segment write (disk full, I/O error,
	// unwritable directory): exponential from RetryInitial to at most RetryMax, with jitter, retried
	// until it succeeds or the partition is released (0: defaultRetryInitial, defaultRetryMax).
	RetryInitial time.Duration
	RetryMax     time.Duration
	// Segments, when set, is shared among the Consumers that succeed one another in this process on
	// one output (the incarnations of a component its supervisor restarts): a producer's segment is
	// then continued across them as within one Consumer (see processSegments), instead of each
	// incarnation starting a new segment. nil: a processSegments of the Consumer's own. A Backfill
	// ignores it.
	Segments *processSegments
	// Registerer receives the writer's metrics and its runner's (fpmbus_consumer_*{consumer="trace"});
	// nil registers none.
	Registerer prometheus.Registerer
	// Logger receives the writer's logs and its runner's [slog.Default()].
	Logger *slog.Logger
}

// DefaultConfig returns Dynamo's defaults (sampled mode, /tmp/dynamo-fpm, 5 s, 256 MiB, 4 segments)
// and fpmbus's consumer defaults.
func DefaultConfig() Config {
	return Config{
		Mode:           defaultMode,
		OutputPath:     defaultOutputPath,
		SampleInterval: defaultSampleInterval,
		RollBytes:      defaultRollBytes,
		MaxSegments:    defaultMaxSegments,
		Group:          DefaultGroup,
		FilterSubject:  DefaultFilterSubject,
		Partitions:     defaultPartitions,
		PinnedTTL:      durable.DefaultPinnedTTL,
		FlushInterval:  defaultFlushInterval,
		BufferSize:     defaultBufferSize,
		StopTimeout:    defaultStopTimeout,
		MaxAckPending:  defaultMaxAckPending,
	}
}

// ParseMode parses a capture mode: "sampled" or "full", trimmed, case-insensitive.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case ModeSampled, ModeFull:
		return m, nil
	}
	return "", fmt.Errorf("%w: mode %q: want sampled or full", ErrInvalidConfig, s)
}

// ParsePositive parses a positive decimal integer as Dynamo does: its config trims the value and parses
// it with Rust's str::parse for an unsigned integer, which takes an optional leading '+' and nothing
// else (no '-', no inner space, no fraction, no underscore), and then refuses zero. Values above the
// largest int64 are refused too, as Go durations and sizes cannot hold them.
func ParsePositive(s string) (int64, error) {
	s = strings.TrimSpace(s)
	n, err := strconv.ParseUint(strings.TrimPrefix(s, "+"), 10, 63)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%w: %q is not a positive integer", ErrInvalidConfig, s)
	}
	return int64(n), nil
}

// Validate reports the first setting that cannot work, naming its variable or flag and its value.
func (c Config) Validate() error {
	bad := invalid.Reporter(ErrInvalidConfig)
	switch {
	case c.Mode != ModeSampled && c.Mode != ModeFull:
		return bad("mode %q (%s, --trace-mode): want sampled or full", c.Mode, EnvMode)
	case strings.TrimSpace(c.OutputPath) == "":
		return bad("output path %q (%s, --trace-output): blank", c.OutputPath, EnvOutputPath)
	case len(filepath.Base(tracefile.OutputBase(c.OutputPath))) > tracefile.MaxOutputBaseName:
		return bad("output path %q (%s, --trace-output): its file name part %q is %d bytes; segment names (<name>.<producer>.<index>%s) need it to be at most %d",
			c.OutputPath, EnvOutputPath, filepath.Base(tracefile.OutputBase(c.OutputPath)), len(filepath.Base(tracefile.OutputBase(c.OutputPath))), tracefile.SegmentSuffix, tracefile.MaxOutputBaseName)
	case c.SampleInterval < time.Millisecond || c.SampleInterval%time.Millisecond != 0:
		return bad("sample interval %v (%s, --sample-interval): want a positive whole number of milliseconds", c.SampleInterval, EnvSampleInterval)
	case c.RollBytes <= 0:
		return bad("roll bytes %d (%s, --roll-bytes): want a positive integer", c.RollBytes, EnvRollBytes)
	case c.MaxSegments <= 0:
		return bad("max segments %d (%s, --max-segments): want a positive integer", c.MaxSegments, EnvMaxSegments)
	case c.Group == "" || strings.ContainsAny(c.Group, ".*> \t"):
		return bad("group %q (--group): want a non-empty name without '.', '*', '>' or spaces", c.Group)
	case c.FilterSubject == "" || (c.FilterSubject != streams.FPMWildcard && !strings.HasPrefix(c.FilterSubject, streams.FPMRoot+".")):
		return bad("filter subject %q (--filter): want a subject under %s", c.FilterSubject, streams.FPMWildcard)
	case c.Partitions < 0 || c.Partitions > durable.MaxPartitions:
		return bad("partitions %d (--partitions): want 1 to %d (0: one per FPM shard)", c.Partitions, durable.MaxPartitions)
	case c.PinnedTTL < durable.MinPinnedTTL || c.PinnedTTL > durable.MaxPinnedTTL:
		return bad("pinned TTL %v (--pinned-ttl): want %v to %v", c.PinnedTTL, durable.MinPinnedTTL, durable.MaxPinnedTTL)
	case c.FlushInterval <= 0:
		return bad("flush interval %v: want a positive duration", c.FlushInterval)
	case c.BufferSize <= 0:
		return bad("buffer size %d: want a positive number of bytes", c.BufferSize)
	case c.StopTimeout <= 0:
		return bad("stop timeout %v: want a positive duration", c.StopTimeout)
	case c.MaxAckPending < 2:
		return bad("max ack pending %d: want at least 2", c.MaxAckPending)
	case c.CompressionLevel != 0 && (c.CompressionLevel < 1 || c.CompressionLevel > 9):
		return bad("gzip level %d: want 1 to 9", c.CompressionLevel)
	case c.RetryInitial < 0 || c.RetryMax < 0:
		return bad("write retry %v..%v: want 0 < initial <= max", c.RetryInitial, c.RetryMax)
	case c.AckWait < 0:
		return bad("ack wait %v: want 0 (automatic) or a positive duration", c.AckWait)
	case c.AckWait > 0 && c.AckWait < time.Second:
		return bad("ack wait %v: want at least 1s", c.AckWait)
	case c.AckWait > 0 && c.AckWait <= c.holdBound():
		return bad("ack wait %v: must exceed %v, the longest a message waits for its line (flush interval, plus the sample interval in sampled mode)", c.AckWait, c.holdBound())
	}
	if initial, maxWait := c.retryBounds(); maxWait < initial {
		return bad("write retry %v..%v: want 0 < initial <= max", initial, maxWait)
	}
	if _, err := c.PartitionConfig(); err != nil {
		return err
	}
	return nil
}

// holdBound is the longest a received message normally waits before its ack.
func (c Config) holdBound() time.Duration {
	if c.Mode == ModeSampled {
		return c.SampleInterval + c.FlushInterval
	}
	return c.FlushInterval
}

// ackWait is the effective AckWait (see Config.AckWait).
func (c Config) ackWait() time.Duration {
	if c.AckWait > 0 {
		return c.AckWait
	}
	return max(defaultAckWait, 2*c.holdBound())
}
