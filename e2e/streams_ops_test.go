package e2e

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/streams"
)

// Stream settings belong to the operator. Components started ad hoc with careless flags (a gap detector
// with --max-bytes 100000, a trace writer with a short --max-age) use the operator's streams as they
// are: the message count and every setting stay. Only `fpmbus streams apply` changes a stream, and it
// refuses a change that deletes stored messages unless given --force.
func TestStreamSettingsBelongToTheOperator(t *testing.T) {
	t.Parallel()
	const stored = 5000
	srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: "127.0.0.1:0", StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	url := srv.ClientURL()
	js := jsClient(t, url)

	// The operator creates the streams with their own limits and the fleet fills FPM.
	if out, err := run(t, 30*time.Second, fpmbusBin, "streams", "apply", "--server", url, "--max-bytes", "8000000", "--max-age", "2h"); err != nil {
		t.Fatalf("operator's streams apply: %v\n%s", err, out)
	}
	fillFPM(t, js, stored, 4, 2, 1_782_777_600_000)
	waitStreamCount(t, js, streams.StreamFPM, stored, 30*time.Second)
	before := streamConfigs(t, js)
	if fpm := before[streams.StreamFPM]; fpm.MaxBytes != 8_000_000 || fpm.MaxAge != 2*time.Hour {
		t.Fatalf("operator's FPM: max_bytes %d max_age %v", fpm.MaxBytes, fpm.MaxAge)
	}
	if st := streamState(t, js, streams.StreamFPM); st.Bytes <= 100_000 {
		t.Fatalf("FPM holds %d bytes: a 100000-byte limit would delete nothing, the test proves nothing", st.Bytes)
	}
	unchanged := func(after string) {
		t.Helper()
		if got := streamConfigs(t, js); !reflect.DeepEqual(got, before) {
			t.Fatalf("after %s the streams changed:\n before %+v\n after  %+v", after, before, got)
		}
		if n := streamState(t, js, streams.StreamFPM).Msgs; n != stored {
			t.Fatalf("after %s FPM holds %d messages, want %d", after, n, stored)
		}
	}

	gaps := startGaps(t, "fpmbus gaps --max-bytes 100000", gapsArgs(url, fmt.Sprintf("127.0.0.1:%d", freePort(t)), "2s",
		"--gaps-group", "other", "--max-bytes", "100000"))
	waitConsumed(t, js, "other", stored)
	if err := gaps.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("gaps: %v", err)
	}
	unchanged("fpmbus gaps --max-bytes 100000")

	trace := fpmbus(t, "fpmbus trace --max-age 1m", "trace", "--server", url, "--max-age", "1m", "--group", "adhoc",
		"--trace-output", filepath.Join(t.TempDir(), "fpm"))
	waitConsumed(t, js, "adhoc", stored)
	if err := trace.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("trace: %v", err)
	}
	unchanged("fpmbus trace --max-age 1m")

	// streams apply: a lower max_bytes is refused (exit 1, naming the setting and --force) and nothing
	// changes; --dry-run prints the plan and changes nothing; --force applies it.
	apply := []string{"streams", "apply", "--server", url, "--max-bytes", "100000", "--max-age", "2h"}
	out, err := run(t, 30*time.Second, fpmbusBin, apply...)
	if code := exitCode(err); code != 1 || !strings.Contains(out, "FPM max_bytes 8000000 -> 100000") || !strings.Contains(out, "--force") {
		t.Fatalf("streams apply without --force: exit %d (%v), want 1 with a message naming FPM max_bytes and --force:\n%s", code, err, out)
	}
	unchanged("streams apply without --force")
	if out, err := run(t, 30*time.Second, fpmbusBin, append(apply, "--dry-run", "--force")...); err != nil || !strings.Contains(out, "FPM max_bytes 8000000 -> 100000") {
		t.Fatalf("streams apply --dry-run: %v, want the plan:\n%s", err, out)
	}
	unchanged("streams apply --dry-run --force")
	if out, err := run(t, 30*time.Second, fpmbusBin, append(apply, "--force")...); err != nil {
		t.Fatalf("streams apply --force: %v\n%s", err, out)
	}
	after := streamConfigs(t, js)[streams.StreamFPM]
	st := streamState(t, js, streams.StreamFPM)
	if after.MaxBytes != 100_000 || st.Bytes > 100_000 || st.Msgs >= stored {
		t.Fatalf("after --force: max_bytes %d, %d messages in %d bytes; want the limit applied", after.MaxBytes, st.Msgs, st.Bytes)
	}
}

func streamConfigs(t *testing.T, js jetstream.JetStream) map[string]jetstream.StreamConfig {
	t.Helper()
	out := map[string]jetstream.StreamConfig{}
	for _, name := range []string{streams.StreamFPM, streams.StreamEvents, streams.StreamBench} {
		s, err := js.Stream(t.Context(), name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		out[name] = s.CachedInfo().Config
	}
	return out
}

func streamState(t *testing.T, js jetstream.JetStream, name string) jetstream.StreamState {
	t.Helper()
	s, err := js.Stream(t.Context(), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	return s.CachedInfo().State
}

// waitConsumed waits until durable consumer name on FPM (a one-partition group) has been delivered
// every one of total messages and has acked them.
func waitConsumed(t *testing.T, js jetstream.JetStream, name string, total uint64) {
	t.Helper()
	eventually(t, 60*time.Second, func() error {
		c, err := js.PushConsumer(t.Context(), streams.StreamFPM, name)
		if err != nil {
			return err
		}
		ci, err := c.Info(t.Context())
		if err != nil {
			return err
		}
		if ci.Delivered.Stream != total || ci.NumPending != 0 || ci.NumAckPending != 0 {
			return fmt.Errorf("consumer %s: delivered up to %d of %d, %d unacked", name, ci.Delivered.Stream, total, ci.NumAckPending)
		}
		return nil
	})
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
