package bridge

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// The broker is away for the whole of a stop that runs out of time: the shutdown drop markers cannot
// be stored, so they go to the marker spool. The next bridge with the same spool publishes them before
// anything else and removes the spool: the drops reach FPM_EVENTS after all, each marker once.
func TestUnstoredDropMarkersAreSpooledAndPublishedByTheNextRun(t *testing.T) {
	t.Parallel()
	const n = 50
	spool := filepath.Join(t.TempDir(), "spool", "markers.jsonl")
	env := natsservertest.Start(t)
	addr, store := listenAddr(t, env.Server), env.StoreDir
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	withSpool := func(c *Config) { c.StopTimeout = 500 * time.Millisecond; c.MarkerSpool = spool }
	h := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, withSpool)
	pub.waitSubscribed()
	env.Stop()
	for seq := uint64(0); seq < n; seq++ {
		pub.send(seq, payload("w", 0, seq))
	}
	h.waitStats(10*time.Second, "all received", func(s stats) bool { return s.Ranks[0].Received == n })
	if err := h.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if s := h.b.Stats(); s.Ranks[0].Dropped != n || s.MarkersPublished != 0 {
		t.Fatalf("stats %s", fmtStats(s))
	}
	data, err := os.ReadFile(spool)
	if err != nil {
		t.Fatalf("no spool after a stop with unstored markers: %v", err)
	}
	spooled, errs := parseMarkerSpool(data)
	var count uint64
	for _, m := range spooled {
		if m.Reason != reasonShutdown || m.Key != fpmKey("w", 0) {
			t.Fatalf("spooled marker %+v", m)
		}
		count += m.Count
	}
	if len(errs) != 0 || count != n {
		t.Fatalf("spool holds %d markers for %d FPMs (errors %v), want %d FPMs", len(spooled), count, errs, n)
	}

	env2 := natsservertest.StartAt(t, addr, store)
	h2 := startBridge(t, env2, []Endpoint{{URL: pub.URL, DPRank: 0}}, withSpool)
	var stored []streams.DropMarker
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		stored = stored[:0]
		for _, m := range messages(t, env2.JS, streams.StreamEvents, streams.DropMarkerWildcard) {
			dm, err := streams.ParseDropMarker(m.Data())
			if err != nil {
				return err
			}
			stored = append(stored, dm)
		}
		if len(stored) != len(spooled) {
			return errors.New("spooled markers not stored yet")
		}
		if _, err := os.Stat(spool); !errors.Is(err, os.ErrNotExist) {
			return errors.New("spool still there")
		}
		return nil
	})
	for i := range stored {
		if stored[i] != spooled[i] {
			t.Fatalf("stored marker %+v, spooled %+v", stored[i], spooled[i])
		}
	}
	if err := h2.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := os.Stat(spool); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a stop with every marker stored left a spool: %v", err)
	}
}

// The marker spool in a data directory someone else may write into: whatever is planted under its
// name is refused at start, naming it, without waiting on a named pipe or publishing the file a link
// points to as drop markers; the stop neither writes through it nor removes it.
func TestMarkerSpoolRefusesAPlantedFile(t *testing.T) {
	t.Parallel()
	m := streams.DropMarker{Type: streams.DropMarkerEvent, Key: fpmKey("w", 0), Epoch: 5, FirstSeq: 3, LastSeq: 9, Count: 7, Reason: reasonShutdown, Bridge: "b"}
	markers := append(bytes.Clone(m.Msg().Data), '\n')
	for name, tc := range map[string]struct {
		plant func(spool, elsewhere string) error
		want  string
	}{
		"a symbolic link to a file of drop markers": {
			plant: func(spool, elsewhere string) error {
				if err := os.WriteFile(elsewhere, markers, 0o600); err != nil {
					return err
				}
				return os.Symlink(elsewhere, spool)
			},
			want: "is a symbolic link to",
		},
		"a named pipe": {
			plant: func(spool, _ string) error { return syscall.Mkfifo(spool, 0o600) },
			want:  "is a named pipe",
		},
		"a directory": {
			plant: func(spool, _ string) error { return os.Mkdir(spool, 0o700) },
			want:  "is a directory",
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			spool := filepath.Join(t.TempDir(), "bridge-drop-markers.jsonl")
			elsewhere := filepath.Join(t.TempDir(), "elsewhere.jsonl")
			if err := tc.plant(spool, elsewhere); err != nil {
				t.Fatal(err)
			}
			before, beforeErr := os.ReadFile(elsewhere)
			var logged bytes.Buffer
			b := &Bridge{cfg: Config{MarkerSpool: spool}, log: slog.New(slog.NewTextHandler(&logged, nil))}
			loaded := make(chan []*item, 1)
			go func() { loaded <- b.loadMarkerSpool() }()
			select {
			case items := <-loaded:
				if len(items) != 0 {
					t.Fatalf("%d drop markers loaded through %s", len(items), spool)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("the bridge's start waits on what was planted at %s", spool)
			}
			if want := spool + " " + tc.want; !strings.Contains(logged.String(), "drop marker spool refused") || !strings.Contains(logged.String(), want) {
				t.Fatalf("log at start, want the spool refused naming %q:\n%s", want, logged.String())
			}

			for _, unstored := range [][]*item{{spooledMarkerItem(m)}, nil} { // a stop with markers to spool, then one without
				logged.Reset()
				b.writeMarkerSpool(unstored)
				if !strings.Contains(logged.String(), spool+" "+tc.want) {
					t.Fatalf("log at a stop with %d markers unstored, want the spool refused naming it:\n%s", len(unstored), logged.String())
				}
				after, afterErr := os.ReadFile(elsewhere)
				if !bytes.Equal(after, before) || (afterErr == nil) != (beforeErr == nil) {
					t.Fatalf("%s changed through %s: %q (%v), was %q (%v)", elsewhere, spool, after, afterErr, before, beforeErr)
				}
				if fi, err := os.Lstat(spool); err != nil || fi.Mode().IsRegular() {
					t.Fatalf("what was planted at %s was replaced or removed: %v, %v", spool, fi, err)
				}
			}
		})
	}
}

func TestParseMarkerSpoolSkipsDamagedLines(t *testing.T) {
	t.Parallel()
	k := fpmKey("w", 0)
	good := streams.DropMarker{Type: streams.DropMarkerEvent, Key: k, Epoch: 5, FirstSeq: 3, LastSeq: 9, Count: 7, Reason: reasonBufferFull, Bridge: "b"}
	line := string(good.Msg().Data)
	for name, tc := range map[string]struct {
		data      string
		want      int
		wantErrAt []string
	}{
		"empty":                  {data: ""},
		"one marker":             {data: line + "\n", want: 1},
		"no final newline":       {data: line + "\n" + line, want: 2},
		"blank lines":            {data: "\n\n" + line + "\n  \n", want: 1},
		"a torn last line":       {data: line + "\n" + line[:len(line)/2], want: 1, wantErrAt: []string{"line 2"}},
		"not JSON in the middle": {data: line + "\nxyz\n" + line + "\n", want: 2, wantErrAt: []string{"line 2"}},
		"a JSON line, no marker": {data: `{"type":"gap"}` + "\n", wantErrAt: []string{"line 1"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ms, errs := parseMarkerSpool([]byte(tc.data))
			if len(ms) != tc.want || len(errs) != len(tc.wantErrAt) {
				t.Fatalf("%d markers, errors %v; want %d markers, errors at %v", len(ms), errs, tc.want, tc.wantErrAt)
			}
			for _, m := range ms {
				if m != good {
					t.Fatalf("marker %+v, want %+v", m, good)
				}
			}
			for i, err := range errs {
				if !errors.Is(err, errBadMarkerSpool) || !strings.Contains(err.Error(), tc.wantErrAt[i]) {
					t.Fatalf("error %v, want ErrBadMarkerSpool at %s", err, tc.wantErrAt[i])
				}
			}
		})
	}
}

// FuzzParseMarkerSpool: any bytes give markers and errors, never a panic; each marker is valid (it
// parses again from its own message) and every non-blank line is either a marker or an error.
func FuzzParseMarkerSpool(f *testing.F) {
	m := streams.DropMarker{Type: streams.DropMarkerEvent, Key: fpmKey("w", 1), Epoch: 1, FirstSeq: 0, LastSeq: 0, Count: 1, Reason: reasonShutdown}
	line := m.Msg().Data
	f.Add(line)
	f.Add(append(append(append([]byte{}, line...), '\n'), line[:10]...))
	f.Add([]byte("\n\n{}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ms, errs := parseMarkerSpool(data)
		lines := 0
		for _, l := range strings.Split(string(data), "\n") {
			if strings.TrimSpace(l) != "" {
				lines++
			}
		}
		if len(ms)+len(errs) != lines {
			t.Fatalf("%d markers + %d errors for %d lines", len(ms), len(errs), lines)
		}
		for _, m := range ms {
			if again, err := streams.ParseDropMarker(m.Msg().Data); err != nil || again != m {
				t.Fatalf("marker %+v does not parse again from its message: %+v, %v", m, again, err)
			}
		}
	})
}
