package trace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// Which consumer group writes a trace output. The prefix locks (tracefile.Owner) keep two live
// processes from writing one producer's files at once; they say nothing about a writer of another consumer group
// that starts while the output's writer is down (stopped, restarting, killed). Such a group has its own
// position in the stream, from its beginning: it would write every line of the stream again into the
// same files, and the first group, back, would then be refused its producers. So an output belongs to
// one group, recorded next to it in <output base>.fpmbus-group.json when the group's first writer
// starts: the group's name and the FPM stream it reads (named by when the stream was created, which
// tells one deployment's stream from another's and survives server restarts). A writer of another
// group, or of the same group name on another deployment, is refused at start, naming the record;
// the members of the group (scale-out, restarts, failover) share it. The record is never removed by
// fpmbus: giving an output to another group is the operator's decision (remove the file).

// ErrOutputOwned: the trace output belongs to another consumer group (its record names it).
var ErrOutputOwned = errors.New("trace: the trace output belongs to another consumer group")

// outputGroupSuffix ends the record's file name, after the output base.
const outputGroupSuffix = ".fpmbus-group.json"

// outputGroupPath is the file recording which group writes outputPath.
func outputGroupPath(outputPath string) string {
	return tracefile.OutputBase(outputPath) + outputGroupSuffix
}

// outputGroup is the record.
type outputGroup struct {
	Group string `json:"group"`
	// Stream is the FPM stream the group reads and when it was created (RFC 3339): "FPM@2026-…".
	Stream    string        `json:"stream"`
	CreatedAt time.Time     `json:"created_at"`
	By        fsutil.Holder `json:"created_by"`
}

// streamIdentity names the FPM stream (or its first shard) by name and creation time.
func streamIdentity(ctx context.Context, js jetstream.JetStream) (string, error) {
	var lastErr error
	for _, name := range []string{streams.StreamFPM, streams.ShardStreamName(0)} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			lastErr = err
			continue
		}
		return name + "@" + s.CachedInfo().Created.UTC().Format(time.RFC3339Nano), nil
	}
	return "", fmt.Errorf("trace: the FPM stream: %w", lastErr)
}

// claimOutput records group as the writer of outputPath, or checks that the record names it: a record
// of another group (or deployment) refuses the writer with ErrOutputOwned, naming the record. The
// record is created with its whole content or not at all (written aside, then linked into place, which
// fails when a record is there already: two first writers of two groups cannot both win).
func claimOutput(ctx context.Context, js jetstream.JetStream, outputPath, group string, me fsutil.Holder) error {
	stream, err := streamIdentity(ctx, js)
	if err != nil {
		return err
	}
	path := outputGroupPath(outputPath)
	for range 3 {
		data, _, err := fsutil.ReadRegular(path)
		switch {
		case err == nil:
			var rec outputGroup
			if jerr := json.Unmarshal(data, &rec); jerr != nil || rec.Group == "" {
				return fmt.Errorf("%w: %s is not a group record (%v): remove it if no group writes %s", ErrOutputOwned, path, jerr, outputPath)
			}
			if rec.Group != group || rec.Stream != stream {
				return fmt.Errorf("%w: %s records group %q reading %s since %s (pid %d on %s): a writer of group %q would write every line of the stream into it again; give it --group %s to share that group's producers, or another --trace-output; remove the record only if that group will not write here again",
					ErrOutputOwned, path, rec.Group, rec.Stream, rec.CreatedAt.Format(time.RFC3339), rec.By.PID, rec.By.Host, group, rec.Group)
			}
			return nil
		case !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("trace: read %s: %w", path, err)
		}
		rec := outputGroup{Group: group, Stream: stream, CreatedAt: time.Now().UTC(), By: me}
		body, _ := json.MarshalIndent(rec, "", "  ")
		if err := createWhole(path, append(body, '\n')); err != nil {
			if errors.Is(err, fs.ErrExist) {
				continue // another writer recorded itself meanwhile: read what it wrote
			}
			return fmt.Errorf("trace: record the output's group in %s: %w", path, err)
		}
		return nil
	}
	return fmt.Errorf("trace: record the output's group in %s: it keeps changing", path)
}

// createWhole creates path holding data, durably, only if nothing is at path: data is written and
// fsynced under a temporary name, hard-linked to path (which fails with fs.ErrExist if anything, a
// symbolic link included, is there), and the directory fsynced.
func createWhole(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp-" + strconv.Itoa(os.Getpid())
	f, err := fsutil.CreateExclusive(tmp, os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Link(tmp, path); err != nil {
		return err
	}
	return fsutil.SyncDir(dir)
}
