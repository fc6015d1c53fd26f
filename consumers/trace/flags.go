package trace

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/flagprefix"
)

// Flags are the trace writer's command-line flags, defined once here next to Config: `fpmbus trace`
// registers them with prefix "" (RegisterFlags and RegisterGroupFlags), `fpmbus trace backfill` only
// those that shape the files (RegisterOutputFlags), `fpmbus up` the writer's with flagprefix.Trace (the
// prefix rule of internal/flagprefix names them and adds the deprecated aliases). After parsing,
// Flags.Config makes a Config of them. The mode and the numbers, which Dynamo's variables also set, are
// kept as text until then, and parsed there as Dynamo parses them (ParseMode, ParsePositive), so that a
// bad value is reported with its flag and variable and, in `up`, disables only the trace writer (a
// flag.Value would refuse a bad mode while the command line is read, and the whole command with it).
type Flags struct {
	cfg            *Config
	cf             *flagprefix.Component
	mode           string
	sampleInterval string
	rollBytes      string
	maxSegments    string
	memberID       string
}

// RegisterOutputFlags defines what shapes the trace files on fs, with c's values as defaults (start
// from DefaultConfig; the caller sets what Dynamo's DYN_FPM_* variables say first): --trace-mode,
// --trace-output, --sample-interval, --roll-bytes, --max-segments, --producer-id, --filter. The caller
// registers its further flags and then calls Done.
func (c *Config) RegisterOutputFlags(fs *flag.FlagSet, prefix string) *Flags {
	f := &Flags{cfg: c, cf: flagprefix.On(fs, prefix), mode: string(c.Mode), sampleInterval: fmt.Sprint(c.SampleInterval.Milliseconds()),
		rollBytes: fmt.Sprint(c.RollBytes), maxSegments: fmt.Sprint(c.MaxSegments)}
	cf := f.cf
	fs.StringVar(&f.mode, cf.Name("trace-mode"), f.mode, "capture mode: sampled (newest FPM per key per interval) or full (every FPM) (env "+EnvMode+")")
	fs.StringVar(&c.OutputPath, cf.Name("trace-output"), c.OutputPath, "output path; files are <path without .jsonl[.gz]>.<producer>.<index:06>.jsonl.gz (env "+EnvOutputPath+")")
	fs.StringVar(&f.sampleInterval, cf.Name("sample-interval"), f.sampleInterval, "sampled mode interval in milliseconds, a positive integer (env "+EnvSampleInterval+")")
	fs.StringVar(&f.rollBytes, cf.Name("roll-bytes"), f.rollBytes, "start a new segment before it exceeds this many uncompressed bytes (env "+EnvRollBytes+")")
	fs.StringVar(&f.maxSegments, cf.Name("max-segments"), f.maxSegments, "segments kept per producer, the active one included (env "+EnvMaxSegments+")")
	fs.StringVar(&c.ProducerID, cf.Name("producer-id"), c.ProducerID, "file every FPM under this producer id (default: the message's Fpm-Producer header, else its worker_id)")
	fs.StringVar(&c.FilterSubject, cf.Name("filter"), c.FilterSubject, "FPM subjects to trace, e.g. fpm.dynamo.backend.>")
	return f
}

// RegisterFlags defines every flag of the writer on fs (RegisterOutputFlags and the durable
// consumer's), with c's values as defaults, and adds the deprecated aliases.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) *Flags {
	f := c.RegisterOutputFlags(fs, prefix)
	cf := f.cf
	fs.StringVar(&c.Group, cf.Name("group"), c.Group, "consumer group: instances with the same name share the producers (consumer <group> on FPM with one partition); split work otherwise with disjoint "+cf.Flag("filter")+" and names")
	fs.DurationVar(&c.StopTimeout, cf.Name("stop-timeout"), c.StopTimeout, "on interrupt, how long to keep writing what was already received")
	fs.DurationVar(&c.FlushInterval, cf.Name("trace-flush-interval"), c.FlushInterval, "longest a received FPM waits before its line is fsynced and the message acked")
	fs.IntVar(&c.MaxAckPending, cf.Name("trace-max-ack-pending"), c.MaxAckPending, "messages the trace consumer may hold unacked (a flush starts at a quarter of it)")
	fs.DurationVar(&c.AckWait, cf.Name("trace-ack-wait"), c.AckWait, "ack wait of the trace consumer: an unacked message is redelivered after it (0: automatic, at least 60s)")
	fs.IntVar(&c.MaxDeliveries, cf.Name("trace-max-deliveries"), c.MaxDeliveries, "a message delivered this often, or whose partition was taken over this often after crashes without progress, is dead-lettered (0: 5)")
	f.Done()
	return f
}

// RegisterGroupFlags defines the group flags of a standalone writer, unprefixed (`fpmbus up` runs one
// partition and derives its member id from its data directory): --partitions, --pinned-ttl,
// --member-id.
func (f *Flags) RegisterGroupFlags(fs *flag.FlagSet) {
	c := f.cfg
	fs.IntVar(&c.Partitions, "partitions", c.Partitions, "partitions of the --group: 0 (default): one per FPM shard, 1 on the single stream FPM. "+
		"1: one active writer, other instances hot standbys (consumer <group> on FPM). N > 1: the instances share N partitions of the producers (keyed by worker_id) through the "+
		"copy stream FPM_PART_<group> (every message stored twice), except with N FPM shards, where partition p reads shard p directly; a producer's files have one writer at a time. "+
		"All instances need the same --trace-output directory (one host or a shared file system) and the same --partitions; not with --producer-id unless 1")
	fs.DurationVar(&c.PinnedTTL, "pinned-ttl", c.PinnedTTL, "how long a crashed instance keeps its partitions before the others take them over (at least 3s)")
	fs.StringVar(&f.memberID, "member-id", "", "this instance's name in the group (default <host>-<pid>-<random>); a stable id makes a restarted instance take its partitions back at once; never two running instances with one id")
}

// Done adds the deprecated aliases of the flags registered so far (RegisterFlags calls it).
func (f *Flags) Done() { f.cf.Done() }

// Options are the runner's options the flags give (--member-id).
func (f *Flags) Options() []durable.Option {
	if f.memberID == "" {
		return nil
	}
	return []durable.Option{durable.WithMemberID(f.memberID)}
}

// Config returns the validated Config the parsed flags describe. An error wraps ErrInvalidConfig and
// names the flag (with its prefix), its variable and the value at fault.
func (f *Flags) Config() (Config, error) {
	c := *f.cfg
	name := f.cf.Flag
	mode, err := ParseMode(f.mode)
	if err != nil {
		return c, flagprefix.Invalid(ErrInvalidConfig, "%s %q (%s): want sampled or full", name("trace-mode"), f.mode, EnvMode)
	}
	c.Mode = mode
	if strings.TrimSpace(c.OutputPath) == "" {
		return c, flagprefix.Invalid(ErrInvalidConfig, "%s %q (%s): blank output path", name("trace-output"), c.OutputPath, EnvOutputPath)
	}
	c.OutputPath = strings.TrimSpace(c.OutputPath)
	ms, err := ParsePositive(f.sampleInterval)
	if err != nil || ms > int64(time.Duration(1<<62)/time.Millisecond) {
		return c, flagprefix.Invalid(ErrInvalidConfig, "%s %q (%s): want a positive integer (milliseconds)", name("sample-interval"), f.sampleInterval, EnvSampleInterval)
	}
	c.SampleInterval = time.Duration(ms) * time.Millisecond
	if c.RollBytes, err = ParsePositive(f.rollBytes); err != nil {
		return c, flagprefix.Invalid(ErrInvalidConfig, "%s %q (%s): want a positive integer (uncompressed bytes)", name("roll-bytes"), f.rollBytes, EnvRollBytes)
	}
	n, err := ParsePositive(f.maxSegments)
	if err != nil || n > 1<<31-1 {
		return c, flagprefix.Invalid(ErrInvalidConfig, "%s %q (%s): want a positive integer", name("max-segments"), f.maxSegments, EnvMaxSegments)
	}
	c.MaxSegments = int(n)
	if c.MaxDeliveries < 0 {
		return c, flagprefix.Invalid(ErrInvalidConfig, "%s %d: want 0 (the default) or more", name("trace-max-deliveries"), c.MaxDeliveries)
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c, nil
}
