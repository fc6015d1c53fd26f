package trace

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/golden"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// writeTrace writes fs as a writer would (producer from the Fpm-Producer header, else worker_id) under
// out, one flush per flushEvery lines, and returns the segment paths.
func writeTrace(t *testing.T, out, mode string, roll int64, flushEvery int, fs []testFPM) {
	t.Helper()
	sws := map[string]*SegmentWriter{}
	for i, f := range fs {
		m := f.msg(t)
		am := &ackMsg{fakeMsg: fakeMsg{subject: m.Subject, data: m.Data, hdr: m.Header}, seq: uint64(i + 1)}
		r, err := parseRecord(am, tracefile.MsgMeta{Seq: am.seq, Stored: time.UnixMilli(1_782_777_600_000)}, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		prefix := tracefile.SegmentPrefix(out, r.Producer)
		if sws[prefix] == nil {
			if sws[prefix], err = newDefaultSegmentWriter(prefix, roll, 1000); err != nil {
				t.Fatal(err)
			}
		}
		if err := sws[prefix].Append(tracefile.AppendLine(nil, &r.Record, int64(i)*250, mode)); err != nil {
			t.Fatal(err)
		}
		if (i+1)%flushEvery == 0 {
			if err := sws[prefix].Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, sw := range sws {
		if err := sw.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func gzipOf(t *testing.T, s string) []byte { return member(t, s) }

func TestInfo(t *testing.T) {
	const base = 1_782_777_601_000
	a := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "4192", DPRank: 0}
	b := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "4192", DPRank: 1}
	var fs []testFPM
	for c := int64(0); c < 40; c++ {
		if c == 7 || c >= 20 && c <= 24 || c == 31 { // gaps
			continue
		}
		fs = append(fs, testFPM{key: a, counter: c, receivedMs: base + c*25, heartbeat: c%10 == 9})
		if c < 5 {
			fs = append(fs, testFPM{key: b, counter: c, receivedMs: base + c*25 + 1})
		}
	}
	fs = append(fs, testFPM{key: b, counter: 3, receivedMs: base + 2000}) // a duplicate, going back
	validLine := func(mode string) string {
		var buf bytes.Buffer
		r, _ := parseRecord(&ackMsg{fakeMsg: fakeMsg{subject: streams.FPMSubject(a), data: fs[0].body(t), hdr: fs[0].msg(t).Header}}, tracefile.MsgMeta{}, "", nil)
		buf.Write(tracefile.AppendLine(nil, &r.Record, 0, mode))
		return buf.String()
	}

	for name, tc := range map[string]struct {
		setup   func(t *testing.T, dir string) []string // returns the paths to pass
		wantErr error
		errHas  []string // the error names the file (and line)
		golden  string   // testdata/<golden>.txt and .json
		check   func(t *testing.T, r *tracefile.InfoReport)
	}{
		"a full trace over rolled segments, with gaps, heartbeats and damage": {
			setup: func(t *testing.T, dir string) []string {
				out := filepath.Join(dir, "dynamo-fpm")
				writeTrace(t, out, schemas.CaptureFull, 8<<10, 5, fs)
				// Cut the second segment of 4192 in its last member, as a crash leaves it.
				p := tracefile.SegmentPath(tracefile.SegmentPrefix(out, "4192"), 1)
				data, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, data[:len(data)-7], 0o644); err != nil {
					t.Fatal(err)
				}
				// A second producer in another file series, sampled.
				writeTrace(t, out, schemas.CaptureSampled, 1<<20, 1, []testFPM{
					{key: b, counter: 100, receivedMs: base, producer: "conn/7"},
					{key: b, counter: 105, receivedMs: base + 5000, producer: "conn/7"},
				})
				return []string{"."}
			},
			golden: "info_full",
			check: func(t *testing.T, r *tracefile.InfoReport) {
				if len(r.Damaged) != 1 || !strings.HasSuffix(r.Damaged[0].Segment, ".4192.000001.jsonl.gz") || r.Damaged[0].Offset == 0 {
					t.Fatalf("damaged %+v", r.Damaged)
				}
				if len(r.Producers) != 2 || r.Producers[0].Producer != "4192" || len(r.Producers[0].Segments) < 3 {
					t.Fatalf("producers %+v", r.Producers)
				}
				ka := r.Producers[0].Keys[0]
				if ka.Missing == 0 || ka.Heartbeats == 0 || ka.CaptureModes[0] != "full" {
					t.Fatalf("key a %+v", ka)
				}
			},
		},
		"schema violations are counted, not fatal": {
			setup: func(t *testing.T, dir string) []string {
				good := validLine("full")
				bad := strings.Replace(good, `"capture_mode":"full"`, `"capture_mode":"bogus"`, 1)
				extra := strings.Replace(good, `"timestamp":0,`, `"timestamp":0,"x":1,`, 1)
				p := tracefile.SegmentPath(filepath.Join(dir, "t.4192"), 0)
				if err := os.WriteFile(p, gzipOf(t, good+"\n"+bad+"\n"+extra+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return []string{p}
			},
			check: func(t *testing.T, r *tracefile.InfoReport) {
				p := r.Producers[0]
				if p.Lines != 3 || p.Violations != 2 || p.Keys[0].Lines != 1 || p.Keys[0].Violations != 2 {
					t.Fatalf("lines %d violations %d keys %+v", p.Lines, p.Violations, p.Keys[0])
				}
				if !strings.Contains(p.Keys[0].ViolationsFirst[0], "t.4192.000000.jsonl.gz:2: event.capture_mode") {
					t.Fatalf("violation %q does not name file, line and field", p.Keys[0].ViolationsFirst[0])
				}
			},
		},
		"a file that is not gzip": {
			setup: func(t *testing.T, dir string) []string {
				p := filepath.Join(dir, "notes.jsonl.gz")
				if err := os.WriteFile(p, []byte(validLine("full")+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return []string{p}
			},
			wantErr: tracefile.ErrNotGzip, errHas: []string{"notes.jsonl.gz"},
		},
		"a gzip file of other JSON": {
			setup: func(t *testing.T, dir string) []string {
				p := tracefile.SegmentPath(filepath.Join(dir, "t.x"), 0)
				if err := os.WriteFile(p, gzipOf(t, validLine("full")+"\n{\"level\":\"info\",\"msg\":\"hello\"}\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return []string{p}
			},
			wantErr: tracefile.ErrNotTrace, errHas: []string{"t.x.000000.jsonl.gz:2:"},
		},
		"a gzip file of text": {
			setup: func(t *testing.T, dir string) []string {
				p := filepath.Join(dir, "log.jsonl.gz")
				if err := os.WriteFile(p, gzipOf(t, "hello world\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return []string{p}
			},
			wantErr: tracefile.ErrNotTrace, errHas: []string{"log.jsonl.gz:1:"},
		},
		"another schema": {
			setup: func(t *testing.T, dir string) []string {
				p := filepath.Join(dir, "kv.jsonl.gz")
				l := strings.Replace(validLine("full"), schemas.TraceSchema, "dynamo.kv.trace.v1", 1)
				if err := os.WriteFile(p, gzipOf(t, l+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return []string{p}
			},
			wantErr: tracefile.ErrNotTrace, errHas: []string{"kv.jsonl.gz:1:", "dynamo.kv.trace.v1"},
		},
		"an empty segment": {
			setup: func(t *testing.T, dir string) []string {
				p := tracefile.SegmentPath(filepath.Join(dir, "t.w"), 3)
				if err := os.WriteFile(p, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				return []string{p}
			},
			check: func(t *testing.T, r *tracefile.InfoReport) {
				if len(r.Producers) != 1 || r.Producers[0].Lines != 0 || r.Producers[0].Segments[0].Index != 3 || len(r.Damaged) != 0 {
					t.Fatalf("report %+v", r.Producers[0])
				}
			},
		},
		"a directory without segments": {
			setup:   func(t *testing.T, dir string) []string { return []string{dir} },
			wantErr: tracefile.ErrNoSegments,
		},
		"a missing file": {
			setup:   func(t *testing.T, dir string) []string { return []string{filepath.Join(dir, "nope.jsonl.gz")} },
			wantErr: os.ErrNotExist, errHas: []string{"nope.jsonl.gz"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			t.Chdir(dir)
			paths := tc.setup(t, ".")
			r, err := tracefile.Info(paths)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Info = %v, want %v", err, tc.wantErr)
				}
				for _, s := range tc.errHas {
					if !strings.Contains(err.Error(), s) {
						t.Fatalf("error %q does not name %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.check != nil {
				tc.check(t, r)
			}
			if tc.golden == "" {
				return
			}
			var text, js bytes.Buffer
			if err := r.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			if err := r.WriteJSON(&js); err != nil {
				t.Fatal(err)
			}
			t.Chdir(filepath.Join(testdataDir, ".."))
			golden.Check(t, filepath.Join("testdata", tc.golden+".golden.txt"), text.Bytes(), *update)
			golden.Check(t, filepath.Join("testdata", tc.golden+".golden.json"), js.Bytes(), *update)
		})
	}
}

var testdataDir = func() string {
	d, err := filepath.Abs("testdata")
	if err != nil {
		panic(err)
	}
	return d
}()
