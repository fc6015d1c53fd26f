package replay

import (
	"context"
	"errors"
	"flag"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/flagprefix"
	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/streams"
)

// SourceFlags are the flags that choose what `fpmbus trace replay` replays: trace segments named as
// arguments, or with --from-stream a range of stream FPM (--filter, --since, --until, --start-seq,
// --end-seq). A bad choice is an invalid.FlagError naming the flag.
type SourceFlags struct {
	fs               *flag.FlagSet
	fromStream       bool
	filter           string
	since, until     string
	startSeq, endSeq uint64
}

// RegisterSourceFlags registers the source flags on fs.
func RegisterSourceFlags(fs *flag.FlagSet) *SourceFlags {
	s := &SourceFlags{fs: fs}
	fs.BoolVar(&s.fromStream, "from-stream", false, "replay a range of stream FPM instead of trace files (needs --since/--until or --start-seq/--end-seq, or replays the whole stream; with FPM shards every shard, by --since/--until only)")
	fs.StringVar(&s.filter, "filter", streams.FPMWildcard, "--from-stream: FPM subjects to read, e.g. fpm.dynamo.backend.>")
	fs.StringVar(&s.since, "since", "", "--from-stream: messages stored at or after this time (RFC 3339 or Unix ms)")
	fs.StringVar(&s.until, "until", "", "--from-stream: messages stored at or before this time")
	fs.Uint64Var(&s.startSeq, "start-seq", 0, "--from-stream: first stream sequence")
	fs.Uint64Var(&s.endSeq, "end-seq", 0, "--from-stream: last stream sequence")
	return s
}

// FromStream reports whether the source is the stream (--from-stream).
func (s *SourceFlags) FromStream() bool { return s.fromStream }

// Check checks the source the flags and the positional arguments paths name: files or the stream,
// never both, and a stream range only with --from-stream.
func (s *SourceFlags) Check(paths []string) error {
	switch {
	case s.fromStream && len(paths) > 0:
		return invalid.Flagf("--from-stream reads the stream: name no files (got %q)", paths[0])
	case !s.fromStream && len(paths) == 0:
		return invalid.Flagf("name trace segments (files, directories, globs or an output prefix), or use --from-stream")
	case !s.fromStream:
		for _, n := range []string{"filter", "since", "until", "start-seq", "end-seq"} {
			if flagprefix.Given(s.fs, n) {
				return invalid.Flagf("--%s selects a range of the stream: it needs --from-stream", n)
			}
		}
	}
	return nil
}

// Read reads the recording: the range of stream FPM through js (--from-stream), else the trace
// segments paths name.
func (s *SourceFlags) Read(ctx context.Context, js jetstream.JetStream, paths []string) (*Recording, error) {
	if !s.fromStream {
		return readTrace(paths)
	}
	rng := StreamRange{StartSeq: s.startSeq, EndSeq: s.endSeq, Filter: s.filter}
	var err error
	if rng.Since, err = streams.ParseTimeBound("--since", s.since); err != nil {
		return nil, err
	}
	if rng.Until, err = streams.ParseTimeBound("--until", s.until); err != nil {
		return nil, err
	}
	rec, err := readStream(ctx, js, rng)
	if errors.Is(err, ErrBadRange) {
		return nil, invalid.Flagf("%v", err)
	}
	return rec, err
}
