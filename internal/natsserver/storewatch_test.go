package natsserver_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/smalldisk"
)

// watchedServer starts an embedded server with its store in storeDir and a stream S of 4 MiB, and
// returns it with a publish function (message id = the number, one second to be acknowledged).
func watchedServer(t *testing.T, storeDir string) (*natsserver.Server, jetstream.JetStream, func(i int) error) {
	t.Helper()
	return watchedServerWith(t, storeDir, 4<<20, 400)
}

// watchedServerWith is watchedServer with stream S limited to maxBytes (-1: no limit) and messages of
// about size bytes.
func watchedServerWith(t *testing.T, storeDir string, maxBytes int64, size int) (*natsserver.Server, jetstream.JetStream, func(i int) error) {
	t.Helper()
	srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: "127.0.0.1:0", StoreDir: storeDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, MaxBytes: maxBytes}); err != nil {
		t.Fatal(err)
	}
	pub := func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.Publish(ctx, "s.x", fmt.Appendf(nil, "message %d %0*d", i, size, i), jetstream.WithMsgID(fmt.Sprint(i)))
		return err
	}
	return srv, js, pub
}

func streamMsgs(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// A full disk: nats-server fails the stream at its first refused write and keeps refusing after space
// returns; the watch names the disk and the store while it is full, and once the filesystem has room
// restarts JetStream, after which every write is stored once and nothing acknowledged before is lost.
func TestWatchStoreRestartsJetStreamOnceTheFullDiskHasRoom(t *testing.T) {
	t.Parallel()
	mnt := smalldisk.Mount(t, 32<<20)
	srv, js, pub := watchedServer(t, filepath.Join(mnt, "data", "jetstream"))
	for i := range 100 {
		if err := pub(i); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if err := srv.CheckStore(); err != nil || srv.StoreStatus().State != natsserver.StoreOK {
		t.Fatalf("healthy store: %v, %+v", err, srv.StoreStatus())
	}

	free := smalldisk.Fill(t, mnt)
	acked := 100 // the block file's last page may still take a message or two
	for ; pub(acked) == nil; acked++ {
		if acked == 200 {
			t.Fatal("100 publishes on a full disk were acknowledged")
		}
	}
	if err := srv.CheckStore(); err != nil {
		t.Fatal(err)
	}
	st := srv.StoreStatus()
	if st.State != natsserver.StoreDiskFull || !strings.Contains(st.Reason, "disk full") || !strings.Contains(st.Reason, st.Dir) ||
		st.Mount != mnt || !strings.Contains(st.Reason, mnt) || st.Err() == nil || st.Faults[natsserver.StoreDiskFull] != 1 {
		t.Fatalf("full disk: %+v (mount %s)", st, mnt)
	}

	free()
	if err := pub(acked); err == nil {
		t.Fatal("nats-server recovered by itself: the restart is not needed")
	}
	if err := srv.CheckStore(); err != nil {
		t.Fatal(err)
	}
	if st := srv.StoreStatus(); st.State != natsserver.StoreOK || st.Recoveries != 1 || st.Err() != nil {
		t.Fatalf("after space returned: %+v", st)
	}
	for i := acked; i < acked+10; i++ {
		if err := pub(i); err != nil {
			t.Fatalf("publish %d after the restart: %v", i, err)
		}
	}
	if n := streamMsgs(t, js); n != uint64(acked+10) {
		t.Fatalf("stream holds %d messages, want %d (%d acknowledged before the restart, 10 after)", n, acked+10, acked)
	}
}

// A store directory deleted or replaced under the running server: the watch shuts JetStream down, so
// nothing more is acknowledged into deleted files, and reports the store lost, naming it.
func TestWatchStoreStopsAcknowledgingWhenTheStoreIsGone(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		remove func(dataDir string) error
		want   string
	}{
		"deleted": {remove: os.RemoveAll, want: "was deleted"},
		"deleted and created again": {remove: func(d string) error {
			if err := os.RemoveAll(d); err != nil {
				return err
			}
			return os.MkdirAll(filepath.Join(d, "jetstream", "jetstream"), 0o755)
		}, want: "a new, empty directory is at its path"},
		"moved away": {remove: func(d string) error { return os.Rename(d, d+".old") }, want: "moved away"},
		"another put in its place": {remove: func(d string) error {
			if err := os.Rename(d, d+".old"); err != nil {
				return err
			}
			return os.MkdirAll(filepath.Join(d, "jetstream", "jetstream"), 0o755)
		}, want: "was replaced by another directory"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dataDir := filepath.Join(t.TempDir(), "data")
			srv, _, pub := watchedServer(t, filepath.Join(dataDir, "jetstream"))
			for i := range 10 {
				if err := pub(i); err != nil {
					t.Fatal(err)
				}
			}
			if err := tc.remove(dataDir); err != nil {
				t.Fatal(err)
			}
			err := srv.CheckStore()
			st := srv.StoreStatus()
			if !errors.Is(err, natsserver.ErrStoreLost) || st.State != natsserver.StoreLost || !strings.Contains(st.Reason, tc.want) ||
				!strings.Contains(st.Reason, st.Dir) || !strings.Contains(err.Error(), st.Dir) {
				t.Fatalf("check: %v; status %+v", err, st)
			}
			if srv.NATS().JetStreamEnabled() {
				t.Fatal("JetStream still enabled on a lost store")
			}
			if err := pub(10); err == nil {
				t.Fatal("a publish was acknowledged after the store was lost")
			}
		})
	}
}

// JetStream disabled under the watch (nats-server does so itself on some write errors) is enabled again
// at once; a fault the restart does not clear (here a stream whose metadata is damaged, which
// nats-server then cannot load) is reported as a write error and not restarted again every second.
func TestWatchStoreRestartsADisabledJetStreamButNotInALoop(t *testing.T) {
	t.Parallel()
	srv, js, _ := watchedServer(t, filepath.Join(t.TempDir(), "data", "jetstream"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DAMAGED", Subjects: []string{"d.>"}}); err != nil {
		t.Fatal(err)
	}
	if err := srv.NATS().ShutdownJetStream(); err != nil {
		t.Fatal(err)
	}
	meta := filepath.Join(srv.StoreStatus().Dir, "$G", "streams", "DAMAGED", "meta.inf")
	if err := os.WriteFile(meta, []byte("not a stream"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 { // a fault counts once two checks in a row report it
		if err := srv.CheckStore(); err != nil {
			t.Fatal(err)
		}
	}
	if st := srv.StoreStatus(); st.Recoveries != 1 || !srv.NATS().JetStreamEnabled() {
		t.Fatalf("JetStream not enabled again: %+v", st)
	}
	if _, err := js.Stream(ctx, "S"); err != nil {
		t.Fatalf("stream S after the restart: %v", err)
	}
	for range 3 {
		if err := srv.CheckStore(); err != nil {
			t.Fatal(err)
		}
	}
	st := srv.StoreStatus()
	if st.State != natsserver.StoreWriteError || st.Recoveries != 1 || !strings.Contains(st.Reason, "DAMAGED") || !strings.Contains(st.Reason, "restarting it again at") {
		t.Fatalf("after a restart that did not help: %+v", st)
	}
}

// A stream directory on disk that nats-server has not loaded (yet) is what its health check reports
// for a stream being created; the watch acts only on a fault two checks in a row report, so a stream
// created or deleted between two checks never has JetStream restarted under it.
func TestWatchStoreIgnoresAFaultSeenOnce(t *testing.T) {
	t.Parallel()
	srv, _, pub := watchedServer(t, filepath.Join(t.TempDir(), "data", "jetstream"))
	ghost := filepath.Join(srv.StoreStatus().Dir, "$G", "streams", "BEING_CREATED")
	if err := os.MkdirAll(ghost, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := srv.CheckStore(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(ghost); err != nil {
		t.Fatal(err)
	}
	if err := srv.CheckStore(); err != nil {
		t.Fatal(err)
	}
	if st := srv.StoreStatus(); st.State != natsserver.StoreOK || st.Recoveries != 0 || len(st.Faults) != 0 {
		t.Fatalf("after a fault seen once: %+v", st)
	}
	if err := pub(1); err != nil {
		t.Fatal(err)
	}
}

// The data directory may be shared (an edge directory under /tmp): whatever is planted under the
// store probe's name is refused, never written through or waited on, and left as it is; the status
// names it and says JetStream waits for its removal, and once it is gone JetStream is restarted.
func TestWatchStoreProbeRefusesAPlantedFile(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		plant func(probe, elsewhere string) error
		want  string
	}{
		"a symbolic link to a file elsewhere": {
			plant: func(probe, elsewhere string) error {
				if err := os.WriteFile(elsewhere, []byte("precious"), 0o600); err != nil {
					return err
				}
				return os.Symlink(elsewhere, probe)
			},
			want: "is a symbolic link to",
		},
		"a symbolic link to nothing yet": {
			plant: func(probe, elsewhere string) error { return os.Symlink(elsewhere, probe) },
			want:  "is a symbolic link to",
		},
		"a named pipe": {
			plant: func(probe, _ string) error { return syscall.Mkfifo(probe, 0o600) },
			want:  "is a named pipe",
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			storeDir := filepath.Join(t.TempDir(), "data", "jetstream")
			srv, js, _ := watchedServer(t, storeDir)
			probe := filepath.Join(storeDir, ".fpmbus-store-probe")
			elsewhere := filepath.Join(t.TempDir(), "elsewhere")
			if err := tc.plant(probe, elsewhere); err != nil {
				t.Fatal(err)
			}
			before, beforeErr := os.ReadFile(elsewhere)
			if err := srv.NATS().ShutdownJetStream(); err != nil { // a store fault the watch probes before it restarts
				t.Fatal(err)
			}
			check := func() {
				t.Helper()
				done := make(chan error, 1)
				go func() { done <- srv.CheckStore() }()
				select {
				case err := <-done:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("the store check waits on what was planted at %s", probe)
				}
			}
			for range 2 { // a fault counts once two checks in a row report it
				check()
			}
			st := srv.StoreStatus()
			if st.State != natsserver.StoreWriteError || st.Recoveries != 0 || srv.NATS().JetStreamEnabled() ||
				!strings.Contains(st.Reason, probe+" "+tc.want) || !strings.Contains(st.Reason, "not restarted until it is removed") {
				t.Fatalf("status with %s planted at the probe: %+v", name, st)
			}
			after, afterErr := os.ReadFile(elsewhere)
			if !bytes.Equal(after, before) || (afterErr == nil) != (beforeErr == nil) {
				t.Fatalf("%s changed through the probe's name: %q (%v), was %q (%v)", elsewhere, after, afterErr, before, beforeErr)
			}
			if fi, err := os.Lstat(probe); err != nil || fi.Mode().IsRegular() {
				t.Fatalf("what was planted at %s was replaced: %v, %v", probe, fi, err)
			}

			if err := os.Remove(probe); err != nil {
				t.Fatal(err)
			}
			check()
			if st := srv.StoreStatus(); st.State != natsserver.StoreOK || st.Recoveries != 1 || !srv.NATS().JetStreamEnabled() {
				t.Fatalf("after the planted file was removed: %+v", st)
			}
			if _, err := js.Stream(context.Background(), "S"); err != nil {
				t.Fatalf("stream S after the restart: %v", err)
			}
		})
	}
}

// JetStream started with little space available: nats-server, given no store limit, fixes one at 3/4
// of what the filesystem had available then, and once the store holds that much refuses every publish
// ("insufficient resources"), however much space is freed later; its health check reports nothing. The
// watch sees the limit used up while the filesystem has room for a larger one and restarts JetStream,
// which fixes the limit again from the space there is now: every later publish is stored, and nothing
// acknowledged before is lost.
func TestWatchStoreRestartsJetStreamWhoseStoreLimitWasFixedOnANearlyFullDisk(t *testing.T) {
	t.Parallel()
	mnt := smalldisk.Mount(t, 32<<20)
	// Leave about 2 MiB available.
	filler := filepath.Join(mnt, "filler")
	var st syscall.Statfs_t
	if err := syscall.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, int64(st.Bavail)*st.Bsize-2<<20)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	srv, js, pub := watchedServerWith(t, filepath.Join(mnt, "data", "jetstream"), -1, 4000)
	acked := 0
	for ; pub(acked) == nil; acked++ {
		if acked == 2000 {
			t.Fatal("8 MB acknowledged with a store limit fixed at 3/4 of 2 MiB")
		}
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := pub(acked); err == nil {
		t.Fatal("nats-server took writes again by itself once space was freed: the restart is not needed")
	}
	if err := srv.CheckStore(); err != nil {
		t.Fatal(err)
	}
	if st := srv.StoreStatus(); st.State != natsserver.StoreOK || st.Recoveries != 1 {
		t.Fatalf("after space was freed: %+v", st)
	}
	for i := acked; i < acked+1000; i++ {
		if err := pub(i); err != nil {
			t.Fatalf("publish %d after the restart: %v", i, err)
		}
	}
	if n := streamMsgs(t, js); n != uint64(acked+1000) {
		t.Fatalf("stream holds %d messages, want %d (%d acknowledged before the restart, 1000 after)", n, acked+1000, acked)
	}
}
