package merge

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/streams"
)

// DefaultOutputTemplate is where the consumer writes each run's merged artefact (Dynamo's
// /tmp/benchmark_results_merged.json naming, one file per run); the sidecar goes next to it with the
// _worker_probe suffix.
const DefaultOutputTemplate = "/tmp/benchmark_results_" + RunIDPlaceholder + "_merged.json"

// Defaults of Config.
const (
	DefaultDurable     = "fpmbus-merge"
	defaultRankTimeout = 15 * time.Minute
	defaultAckWait     = durable.DefaultHoldingAckWait
	defaultPartitions  = durable.DefaultHoldingPartitions
	defaultPinnedTTL   = durable.DefaultPinnedTTL
)

// ConsumerName names the merger in the runner's metrics (label consumer) and its dead letters
// (durable.RejectedSubject(ConsumerName) = fpmevents.deadletter.consumer.merge).
const ConsumerName = "merge"

const (
	// tickInterval paces the rank-timeout sweep and the retries of merges and messages that failed
	// for a reason that may pass (the server, the disk).
	tickInterval = 250 * time.Millisecond
	// maxAckPending bounds the held and in-flight messages of one partition.
	maxAckPending = 10000
	// batch is how many messages one pull asks for.
	batch = 64
)

// ErrInvalidConfig wraps every Config or Option problem.
var ErrInvalidConfig = errors.New("merge: invalid config")

// Config configures a Consumer. Zero values take the defaults noted.
type Config struct {
	// HoldingConfig is the merger's partition group (durable.HoldingConfig): its name (Durable,
	// DefaultDurable), the partitions of the runs (keyed by run_id), pinned TTL, ack wait, stop
	// timeout and crash-loop bound.
	durable.HoldingConfig
	// RankTimeout: a run whose ranks have not all arrived this long after its first rank (by stream time)
	// is reported incomplete [defaultRankTimeout].
	RankTimeout time.Duration
	// Output is the merged artefact path; RunIDPlaceholder is replaced by the run id [DefaultOutputTemplate].
	Output string
	// SpoolDir holds rank bodies fetched from the object store while a run merges [<tmp>/fpmbus-merge],
	// each run's in a directory of its own; both must be directories, not symbolic links to one (made
	// mode 0700 when missing).
	SpoolDir string
	// InlineMax is the largest body the consumer publishes inline (merged artefact, sidecar) [benchstore.DefaultBenchInlineMax].
	InlineMax int
	// MaxArtefactSize is the largest rank artefact or probe replies body the consumer reads; a rank
	// whose Fpm-Bench-Size is larger rejects its run (RuleArtefactSize) without being fetched
	// [streams.DefaultBenchMaxArtefact].
	MaxArtefactSize int64
	// Streams are applied at start and give the object bucket's settings [streams.DefaultConfig()].
	Streams *streams.Config
	// EventHook, when set, is called on the consumer's loop with every event the consumer has published.
	EventHook func(Event)
	// Registerer receives the merger's metrics and its runner's; nil registers none.
	Registerer prometheus.Registerer
	// Logger receives the merger's logs and its runner's [slog.Default()].
	Logger *slog.Logger
}

func (c *Config) fill() error {
	bad := invalid.Reporter(ErrInvalidConfig)
	if err := c.HoldingConfig.Fill(DefaultDurable, ErrInvalidConfig); err != nil {
		return err
	}
	c.RankTimeout = cmp.Or(c.RankTimeout, defaultRankTimeout)
	c.Output = cmp.Or(c.Output, DefaultOutputTemplate)
	c.SpoolDir = cmp.Or(c.SpoolDir, filepath.Join(os.TempDir(), "fpmbus-merge"))
	c.MaxArtefactSize = cmp.Or(c.MaxArtefactSize, streams.DefaultBenchMaxArtefact)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	if c.Streams == nil {
		sc := streams.DefaultConfig()
		c.Streams = &sc
	}
	switch {
	case c.RankTimeout < 0:
		return bad("rank timeout %v must be positive", c.RankTimeout)
	case !strings.Contains(c.Output, RunIDPlaceholder):
		return bad("output %q must contain %s: the consumer merges many runs", c.Output, RunIDPlaceholder)
	case c.MaxArtefactSize < 0:
		return bad("max artefact size %d must be positive", c.MaxArtefactSize)
	}
	if err := checkOutputTemplate(c.Output); err != nil {
		return bad("%v", err)
	}
	return nil
}

// nameMax and tempSuffix bound a file name: NAME_MAX on Linux file systems, and what
// fsutil.WriteAtomic's temporary file adds to a name (".tmp-" and up to 10 digits).
const (
	nameMax    = 255
	pathMax    = 4095 // PATH_MAX (4096) less the terminating NUL
	tempSuffix = len(".tmp-") + 10
)

// checkOutputTemplate reports an output template whose merged artefact or sidecar, or their temporary
// files, would have a file name over NAME_MAX or a path over PATH_MAX for a run_id of the longest token
// streams.CheckRunID accepts: every valid run then has a path the file system takes.
func checkOutputTemplate(template string) error {
	merged := expandPath(template, strings.Repeat("r", streams.MaxRunIDToken))
	for _, p := range []string{merged, sidecarPathFor(merged)} {
		if abs, err := filepath.Abs(p); err == nil && len(abs)+tempSuffix > pathMax {
			return fmt.Errorf("output %q: a run_id of %d bytes makes the path %d bytes long (with the temporary file's suffix); the limit is %d",
				template, streams.MaxRunIDToken, len(abs)+tempSuffix, pathMax)
		}
		base := filepath.Base(p)
		for _, name := range strings.Split(filepath.ToSlash(p), "/") {
			n := len(name)
			if name == base {
				n += tempSuffix
			}
			if n > nameMax {
				return fmt.Errorf("output %q: a run_id of %d bytes makes the file name %q %d bytes long (with the temporary file's suffix); the limit is %d: shorten the template's text around %s",
					template, streams.MaxRunIDToken, name, n, nameMax, RunIDPlaceholder)
			}
		}
	}
	return nil
}

// Group is the partition group of the merger: FPM_BENCH's rank artefacts fpmbench.rank.<run>.<rank>
// and probe replies fpmbench.probe.<run>, both keyed by the run token, so that a run's ranks and probe
// replies always share a partition and one owner.
func (c Config) Group() durable.GroupConfig {
	return c.HoldingConfig.Group(maxAckPending, batch, streams.BenchRankRoot+".*.*", streams.BenchProbeRoot+".*")
}
