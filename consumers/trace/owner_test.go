package trace

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/streams/streamstest"
)

func writerHolder(group string) fsutil.Holder {
	h := fsutil.Self("trace writer")
	h.Group = group
	return h
}

// A prefix has one owner at a time. A member of the same consumer group borrows the lock another member
// still holds (a frozen owner whose partition moved on) and takes it once it is free; a writer of
// another group and the tools are refused, naming the holder.
func TestPrefixOwnership(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		second     fsutil.Holder
		wantBorrow bool
	}{
		"a member of the same group borrows":   {second: writerHolder("fpm-trace@s1"), wantBorrow: true},
		"a writer of another group is refused": {second: writerHolder("fpm-trace@s2")},
		"verify --repair is refused":           {second: fsutil.Self("trace verify --repair")},
		"backfill is refused":                  {second: fsutil.Self("trace backfill")},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			prefix := filepath.Join(t.TempDir(), "fpm.w0")
			first := newOwner(writerHolder("fpm-trace@s1"), testLogger(t))
			if err := first.take(prefix); err != nil {
				t.Fatal(err)
			}
			second := newOwner(tc.second, testLogger(t))
			err := second.take(prefix)
			if tc.wantBorrow {
				if err != nil || second.held[prefix] == nil || second.held[prefix].lock != nil {
					t.Fatalf("take: %v, %+v; want the lock borrowed", err, second.held[prefix])
				}
				second.retry()
				if second.held[prefix].lock != nil {
					t.Fatal("took a lock the other member still holds")
				}
				first.releaseAll()
				second.retry()
				if second.held[prefix].lock == nil {
					t.Fatal("the lock was not taken once the other member let it go")
				}
				second.releaseAll()
				return
			}
			var held *fsutil.HeldError
			if !errors.Is(err, ErrPrefixHeld) || !errors.As(err, &held) || held.Holder == nil || held.Holder.Group != "fpm-trace@s1" ||
				!strings.Contains(err.Error(), PrefixLockPath(prefix)) {
				t.Fatalf("take: %v, want ErrPrefixHeld naming the lock and its holder", err)
			}
			if second.owns(prefix) {
				t.Fatal("a refused prefix is owned")
			}
			first.releaseAll()
			if err := second.take(prefix); !errors.Is(err, ErrPrefixHeld) {
				t.Fatalf("before the next retry the refusal stands: %v", err)
			}
			second.retry()
			if err := second.take(prefix); err != nil {
				t.Fatalf("after the holder let go and a retry: %v", err)
			}
			second.releaseAll()
			if b, _ := os.ReadFile(PrefixLockPath(prefix)); len(b) != 0 {
				t.Fatalf("a released prefix lock names an owner: %q", b)
			}
		})
	}
}

// The lock file is Dynamo's name next to the segments, or a shorter one where that would exceed
// NAME_MAX (no Dynamo writer can open that one).
func TestPrefixLockPath(t *testing.T) {
	t.Parallel()
	if got := PrefixLockPath("/tmp/dynamo-fpm.worker_a_b"); got != "/tmp/dynamo-fpm.worker_a_b.000000.jsonl.lock" {
		t.Fatalf("lock path %s", got)
	}
	long := "/tmp/" + strings.Repeat("p", 255-len(".000000.jsonl.gz"))
	if got := PrefixLockPath(long); got != long+".lock" || len(filepath.Base(got)) > 255 {
		t.Fatalf("lock path of a prefix at the name limit: %s", got)
	}
}

// A backfill owns every producer of its output before it repairs or writes anything: into an output a
// running writer holds it is refused, naming the writer, and nothing there changes; into another output
// it runs.
func TestBackfillIsRefusedWhileAWriterOwnsTheOutput(t *testing.T) {
	t.Parallel()
	env := streamstest.Start(t)
	msgs, _ := manyFPMs(t, testKeys(4), 400, 1_782_777_600_000)
	publish(t, env.JS, msgs)
	cfg := testConfig(t)
	r := startWriter(t, cfg, env.JS)
	waitConsumed(t, env.JS, cfg.Group)
	files := func(output string) map[string]int64 {
		out := map[string]int64{}
		matches, _ := filepath.Glob(OutputBase(output) + ".*" + SegmentSuffix)
		for _, m := range matches {
			fi, err := os.Stat(m)
			if err != nil {
				t.Fatal(err)
			}
			out[m] = fi.Size()
		}
		return out
	}
	before := files(cfg.OutputPath)
	_, err := Backfill(context.Background(), logTo(cfg, testLogger(t)), env.JS, BackfillRange{}, nil)
	var held *fsutil.HeldError
	if !errors.Is(err, ErrPrefixHeld) || !errors.As(err, &held) || held.Holder == nil || held.Holder.Role != "trace writer" || !strings.Contains(err.Error(), "trace backfill") {
		t.Fatalf("backfill into the writer's output: %v, want it refused naming the writer", err)
	}
	if after := files(cfg.OutputPath); !maps.Equal(before, after) {
		t.Fatalf("the refused backfill changed the writer's files: %v, then %v", before, after)
	}
	other := cfg
	other.OutputPath = filepath.Join(t.TempDir(), "backfill", "fpm")
	res, err := Backfill(context.Background(), logTo(other, testLogger(t)), env.JS, BackfillRange{}, nil)
	if err != nil || res.Lines != uint64(len(msgs)) {
		t.Fatalf("backfill into another output: %+v, %v", res, err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
}

// A symbolic link planted as a producer's lock file (in a shared directory such as /tmp) refuses that
// producer alone: it is not followed, and the error is one the writer rejects the producer's messages
// for, not one that ends it.
func TestPrefixLockPlantedAsALinkRefusesTheProducer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	prefix := filepath.Join(dir, "fpm.w0")
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, PrefixLockPath(prefix)); err != nil {
		t.Fatal(err)
	}
	o := newOwner(writerHolder("fpm-trace@s1"), testLogger(t))
	err := o.take(prefix)
	if !errors.Is(err, fsutil.ErrNotRegular) || !refusesProducer(err) || !strings.Contains(err.Error(), PrefixLockPath(prefix)) {
		t.Fatalf("take: %v, want a refusal of the producer naming its lock file", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("written through the link: %q", b)
	}
	if err := o.take(filepath.Join(dir, "fpm.w1")); err != nil {
		t.Fatalf("another producer: %v", err)
	}
	o.releaseAll()
}
