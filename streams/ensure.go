package streams

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrIncompatible: an existing stream lacks a setting fpmbus cannot work without. Ensure reports it
// and changes nothing; `fpmbus streams apply` is the way to change the stream.
var ErrIncompatible = errors.New("streams: existing stream cannot serve fpmbus")

// report is what Ensure found: the streams it created, and the settings of existing streams that
// differ from the Config it was given (the server's values are the ones in use).
type report struct {
	Created     []string
	Differences []Change
	// FPMShards is the shard count in use (1: the single stream FPM).
	FPMShards int
	// Atomic names the streams that accept atomic batch publishes (allow_atomic), among those whose
	// definition asks for it; Updated those Ensure turned it on for.
	Atomic  []string
	Updated []string
}

// warned holds the differences this process has logged: `fpmbus up` runs several components, each of
// which calls Ensure, and the operator needs to read about one difference once.
var warned sync.Map

// Ensure is how a component makes sure fpmbus's streams exist before it publishes or consumes: a
// missing stream is created from c; an existing one is used as it is, and each setting that differs
// from c is returned in the Report and logged (one Warn per stream naming each setting with the
// stream's and c's values; once per process for the same differences). Ensure never updates a stream,
// so a component started with default or careless flags cannot shrink an operator's limits and delete
// stored messages; only `fpmbus streams apply` (Plan) changes an existing stream. The one exception
// is additive: a stream whose definition allows atomic batch publish (the FPM streams) and that lacks
// it gets it turned on in place (addAtomic), which deletes nothing and changes nothing a reader sees.
//
// An existing stream that cannot work for fpmbus (see requireUsable) is an ErrIncompatible error
// naming the setting. The FPM streams are the server's shard count's (c.FPMShards 0) or c.FPMShards,
// which must then be the server's (ErrShardMismatch naming both). A nil logger means slog.Default().
func Ensure(ctx context.Context, js jetstream.JetStream, c Config, logger *slog.Logger) (report, error) {
	var r report
	if err := c.Validate(); err != nil {
		return r, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	n, err := resolveShards(ctx, js, c)
	if err != nil {
		return r, err
	}
	r.FPMShards, c.FPMShards = n, n
	for _, want := range c.All() {
		s, err := js.Stream(ctx, want.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			s, err = placed(ctx, "stream "+want.Name, want.Replicas, func(ctx context.Context) (jetstream.Stream, error) {
				return js.CreateStream(ctx, want)
			})
			if err == nil {
				r.Created = append(r.Created, want.Name)
				if want.AllowAtomicPublish {
					r.Atomic = append(r.Atomic, want.Name)
				}
				logger.Info("stream created", "stream", want.Name, "subjects", want.Subjects, "max_age", want.MaxAge,
					"max_bytes", want.MaxBytes, "storage", enumName(want.Storage), "num_replicas", want.Replicas)
				continue
			}
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // another component created it meanwhile
				s, err = js.Stream(ctx, want.Name)
			}
		}
		if err != nil {
			return r, fmt.Errorf("streams: ensure %s: %w", want.Name, err)
		}
		current := s.CachedInfo().Config
		if err := requireUsable(current, want); err != nil {
			return r, err
		}
		if want.AllowAtomicPublish && !current.AllowAtomicPublish {
			if updated, err := addAtomic(ctx, js, current); err != nil {
				logger.Warn("stream keeps atomic batch publish off: the bridge publishes its FPMs one by one (one fsync each "+
					"under sync_interval: always); `fpmbus streams apply` turns it on", "stream", want.Name, "error", err)
			} else {
				current = updated
				r.Updated = append(r.Updated, want.Name)
				logger.Info("stream updated: atomic batch publish turned on (additive: nothing stored changes)", "stream", want.Name)
			}
		}
		if want.AllowAtomicPublish && current.AllowAtomicPublish {
			r.Atomic = append(r.Atomic, want.Name)
		}
		changes := Diff(current, want)
		if len(changes) == 0 {
			continue
		}
		r.Differences = append(r.Differences, changes...)
		attrs := []any{"stream", want.Name}
		key := want.Name
		for _, ch := range changes {
			attrs = append(attrs, slog.Group(ch.Setting, "stream", ch.Current, "flag", ch.Wanted))
			key += "\n" + ch.String()
		}
		if _, dup := warned.LoadOrStore(key, true); dup {
			continue
		}
		logger.Warn("stream settings differ from this component's flags; using the stream as it is "+
			"(only `fpmbus streams apply` changes an existing stream)", attrs...)
	}
	return r, nil
}

// addAtomic turns atomic batch publish on for the existing stream current, every other setting as it
// is, and returns the stream's configuration after the update.
func addAtomic(ctx context.Context, js jetstream.JetStream, current jetstream.StreamConfig) (jetstream.StreamConfig, error) {
	cfg := current
	cfg.AllowAtomicPublish = true
	s, err := js.UpdateStream(ctx, cfg)
	if err != nil {
		return current, fmt.Errorf("streams: turn on atomic publish for %s: %w", current.Name, err)
	}
	return s.CachedInfo().Config, nil
}

// requireUsable checks the settings fpmbus cannot work without; every other difference is the
// operator's choice and is only reported.
//
//   - subjects: every subject fpmbus writes or reads must be captured by the stream, or publishes
//     find no stream and consumers' filters are refused. A stream capturing more is fine.
//   - retention: limits. fpmbus has several independent readers per stream (trace writer, gap
//     detector, backfill, replay, merger) and re-reads old messages by sequence; interest retention
//     deletes a message once the consumers of the moment acked it, and work-queue retention refuses a
//     second reader.
//
// The duplicate window is deliberately not required. A window shorter than the bridge's retries (ack
// timeout plus backoff) costs at most a second copy of a message whose first publish was stored but
// not acknowledged, which the consumers count as a duplicate (it loses nothing); and no window covers
// every retry anyway, since the bridge retries for as long as the server is away. So a short window is
// reported like any other difference, not refused.
func requireUsable(current, want jetstream.StreamConfig) error {
	have := subjectSet(current)
	for _, w := range want.Subjects {
		covered := false
		for _, s := range have {
			covered = covered || server.SubjectMatchesFilter(w, s)
		}
		if !covered {
			return fmt.Errorf("%w: stream %s: setting subjects is %q on the server, which does not capture %q "+
				"(add it with `fpmbus streams apply`)", ErrIncompatible, want.Name, strings.Join(have, ","), w)
		}
	}
	if current.Retention != jetstream.LimitsPolicy {
		return fmt.Errorf("%w: stream %s: setting retention is %q on the server; fpmbus needs %q "+
			"(its readers are independent and re-read old messages)", ErrIncompatible, want.Name,
			enumName(current.Retention), enumName(jetstream.LimitsPolicy))
	}
	return nil
}
