package trace

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
