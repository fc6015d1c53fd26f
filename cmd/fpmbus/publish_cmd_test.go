package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/freeport"
)

// `fpmbus publish --sent-log` in a shared directory: whatever is planted under the log's name is
// refused before anything is sent, exit 2 naming the flag and the path; nothing is written through it,
// it is not waited on, and it is left as it is.
func TestPublishSentLogRefusesAPlantedFile(t *testing.T) {
	t.Setenv(envFPMPort, "")
	for name, tc := range map[string]struct {
		plant func(log, elsewhere string) error
		want  string
	}{
		"a symbolic link to a file elsewhere": {
			plant: func(log, elsewhere string) error {
				if err := os.WriteFile(elsewhere, []byte("precious\n"), 0o644); err != nil {
					return err
				}
				return os.Symlink(elsewhere, log)
			},
			want: "is a symbolic link to",
		},
		"a symbolic link to nothing yet": {
			plant: func(log, elsewhere string) error { return os.Symlink(elsewhere, log) },
			want:  "is a symbolic link to",
		},
		"a named pipe": {
			plant: func(log, _ string) error { return syscall.Mkfifo(log, 0o644) },
			want:  "is a named pipe",
		},
		"a directory": {
			plant: func(log, _ string) error { return os.Mkdir(log, 0o755) },
			want:  "is a directory",
		},
	} {
		t.Run(name, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "sent.jsonl")
			elsewhere := filepath.Join(t.TempDir(), "elsewhere")
			if err := tc.plant(log, elsewhere); err != nil {
				t.Fatal(err)
			}
			before, beforeErr := os.ReadFile(elsewhere)
			port := freeport.Block(t, "127.0.0.1", 1)
			type result struct {
				code int
				out  string
			}
			done := make(chan result, 1)
			go func() {
				code, out := run(t, "publish", "--host", "127.0.0.1", "--fpm-port", strconv.Itoa(port), "--count", "1", "--sent-log", log)
				done <- result{code, out}
			}()
			var res result
			select {
			case res = <-done:
			case <-time.After(20 * time.Second):
				t.Fatalf("publish waits on what was planted at %s", log)
			}
			if want := "--sent-log: " + log + " " + tc.want; res.code != 2 || !strings.Contains(res.out, want) {
				t.Fatalf("exit %d, want 2 with %q:\n%s", res.code, want, res.out)
			}
			after, afterErr := os.ReadFile(elsewhere)
			if !bytes.Equal(after, before) || (afterErr == nil) != (beforeErr == nil) {
				t.Fatalf("%s changed through %s: %q (%v), was %q (%v)", elsewhere, log, after, afterErr, before, beforeErr)
			}
			if fi, err := os.Lstat(log); err != nil || fi.Mode().IsRegular() {
				t.Fatalf("what was planted at %s was replaced: %v, %v", log, fi, err)
			}
		})
	}
}
