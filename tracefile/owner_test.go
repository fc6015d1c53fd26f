package tracefile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/internal/fsutil"
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
			first := NewOwner(writerHolder("fpm-trace@s1"), testLogger(t))
			if err := first.Take(prefix); err != nil {
				t.Fatal(err)
			}
			second := NewOwner(tc.second, testLogger(t))
			err := second.Take(prefix)
			if tc.wantBorrow {
				if err != nil || second.held[prefix] == nil || second.held[prefix].lock != nil {
					t.Fatalf("take: %v, %+v; want the lock borrowed", err, second.held[prefix])
				}
				second.Retry()
				if second.held[prefix].lock != nil {
					t.Fatal("took a lock the other member still holds")
				}
				first.ReleaseAll()
				second.Retry()
				if second.held[prefix].lock == nil {
					t.Fatal("the lock was not taken once the other member let it go")
				}
				second.ReleaseAll()
				return
			}
			var held *fsutil.HeldError
			if !errors.Is(err, ErrPrefixHeld) || !errors.As(err, &held) || held.Holder == nil || held.Holder.Group != "fpm-trace@s1" ||
				!strings.Contains(err.Error(), PrefixLockPath(prefix)) {
				t.Fatalf("take: %v, want ErrPrefixHeld naming the lock and its holder", err)
			}
			if second.Owns(prefix) {
				t.Fatal("a refused prefix is owned")
			}
			first.ReleaseAll()
			if err := second.Take(prefix); !errors.Is(err, ErrPrefixHeld) {
				t.Fatalf("before the next retry the refusal stands: %v", err)
			}
			second.Retry()
			if err := second.Take(prefix); err != nil {
				t.Fatalf("after the holder let go and a retry: %v", err)
			}
			second.ReleaseAll()
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
	o := NewOwner(writerHolder("fpm-trace@s1"), testLogger(t))
	err := o.Take(prefix)
	if !errors.Is(err, fsutil.ErrNotRegular) || !RefusesProducer(err) || !strings.Contains(err.Error(), PrefixLockPath(prefix)) {
		t.Fatalf("take: %v, want a refusal of the producer naming its lock file", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("written through the link: %q", b)
	}
	if err := o.Take(filepath.Join(dir, "fpm.w1")); err != nil {
		t.Fatalf("another producer: %v", err)
	}
	o.ReleaseAll()
}
