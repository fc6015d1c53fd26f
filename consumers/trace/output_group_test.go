package trace

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
)

// A trace output is one consumer group's: the first writer records its group; a writer of another
// group, or of the same group name on another deployment's stream, is refused before it joins, naming
// the record, even while no writer of the first group runs; the first group's writers keep it.
func TestOutputBelongsToOneGroup(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig(t)
	cfg.Group = "first"
	r := startWriter(t, cfg, env.JS)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	rec := outputGroupPath(cfg.OutputPath)
	body, err := os.ReadFile(rec)
	if err != nil || !strings.Contains(string(body), `"group": "first"`) {
		t.Fatalf("record %s: %q, %v", rec, body, err)
	}
	run := func(cfg Config, env *natsservertest.Env) error {
		w, err := New(logTo(cfg, testLogger(t)), env.JS, durable.WithMemberID("m-"+cfg.Group))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		select {
		case err := <-done:
			return err
		case <-w.Ready():
			cancel()
			<-done
			return nil
		}
	}
	other := cfg
	other.Group = "second"
	err = run(other, env)
	if !errors.Is(err, ErrOutputOwned) || !strings.Contains(err.Error(), rec) || !strings.Contains(err.Error(), `group "first"`) {
		t.Fatalf("a second group: %v, want ErrOutputOwned naming %s and group first", err, rec)
	}
	if _, err := env.JS.Consumer(context.Background(), "FPM", "second"); err == nil {
		t.Fatal("the refused group declared its consumer")
	}
	if err := run(cfg, env); err != nil {
		t.Fatalf("the first group again: %v", err)
	}
	elsewhere := natsservertest.Start(t) // the same group name on another deployment's stream
	if err := run(cfg, elsewhere); !errors.Is(err, ErrOutputOwned) {
		t.Fatalf("the same group on another stream: %v, want ErrOutputOwned", err)
	}
	if err := os.WriteFile(rec, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(cfg, env); !errors.Is(err, ErrOutputOwned) || !strings.Contains(err.Error(), "not a group record") {
		t.Fatalf("a damaged record: %v, want ErrOutputOwned", err)
	}
	if entries, _ := filepath.Glob(rec + ".tmp-*"); len(entries) != 0 {
		t.Fatalf("temporary records left: %v", entries)
	}
}
