package replay

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/tracefile"
)

// A user names segments the way they have them: a directory, files, a glob, Dynamo's output path, or
// one producer's prefix. Only files named like segments are claimed; read order is by producer, then
// segment index.
func TestResolveSegmentsAcceptsEveryWayOfNamingThem(t *testing.T) {
	dir := t.TempDir()
	member := gzMember(t, line{producer: "a", observed: 1, fpm: fpmJSON(t, "a", 0, 1)}.bytes())
	for _, n := range []string{segName("a", 1), segName("a", 0), segName("b", 0), segName("a", 10)} {
		writeFile(t, dir, n, member)
	}
	// Not segments of the prefix: never claimed by a prefix (a directory still takes *.jsonl.gz).
	writeFile(t, dir, "fpm.a.1.jsonl.gz", member)
	writeFile(t, dir, "fpm.a.000002.jsonl.gz.tmp", member)
	writeFile(t, dir, "other.x.000000.jsonl.gz", member)
	abs := func(names ...string) []string {
		var out []string
		for _, n := range names {
			out = append(out, filepath.Join(dir, n))
		}
		return out
	}
	a := abs(segName("a", 0), segName("a", 1), segName("a", 10))
	ab := append(slices.Clone(a), abs(segName("b", 0))...)
	cases := map[string]struct {
		paths []string
		want  []string
	}{
		"an output prefix":                 {abs("fpm"), ab},
		"an output path with .jsonl.gz":    {abs("fpm.jsonl.gz"), ab},
		"a producer prefix":                {abs("fpm.a"), a},
		"a glob":                           {abs("fpm.a.0*.jsonl.gz"), a},
		"files, in any order, named twice": {abs(segName("a", 10), segName("b", 0), segName("a", 0), segName("a", 10)), abs(segName("a", 0), segName("a", 10), segName("b", 0))},
		"a directory":                      {[]string{dir}, append(slices.Clone(a), abs("fpm.a.1.jsonl.gz", segName("b", 0), "other.x.000000.jsonl.gz")...)},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := resolveSegments(c.paths)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(c.want, "\n"))
			}
		})
	}
	for name, p := range map[string]string{
		"a prefix with no segment":  filepath.Join(dir, "nothing"),
		"a glob matching nothing":   filepath.Join(dir, "*.none"),
		"a directory with no trace": t.TempDir(),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := resolveSegments([]string{p})
			if !errors.Is(err, errNoSegments) || !strings.Contains(err.Error(), p) {
				t.Fatalf("got %v, want ErrNoSegments naming %s", err, p)
			}
		})
	}
}

// Which files a prefix claims and in what order they are read follow the trace format's naming rule
// (tracefile.segmentIndex): any u64 index, ordered by value, and nothing that is not exactly a
// segment's name.
func TestResolveSegmentsByTheTraceNamingRule(t *testing.T) {
	longID := strings.Repeat("worker/", 60)
	cases := map[string]struct {
		files []string // created in the directory (a name ending in "/" is a directory)
		paths []string // given to resolveSegments, relative to the directory
		want  []string
	}{
		"huge indexes, by an output prefix": {
			files: []string{"fpm.a.18446744073709551615.jsonl.gz", "fpm.a.1000000000000000000.jsonl.gz", "fpm.a.999999999999999999.jsonl.gz", "fpm.a.000001.jsonl.gz"},
			paths: []string{"fpm"},
			want:  []string{"fpm.a.000001.jsonl.gz", "fpm.a.999999999999999999.jsonl.gz", "fpm.a.1000000000000000000.jsonl.gz", "fpm.a.18446744073709551615.jsonl.gz"},
		},
		"huge indexes, by a producer prefix": {
			files: []string{"fpm.a.9223372036854775808.jsonl.gz", "fpm.a.9223372036854775807.jsonl.gz", "fpm.b.000000.jsonl.gz"},
			paths: []string{"fpm.a"},
			want:  []string{"fpm.a.9223372036854775807.jsonl.gz", "fpm.a.9223372036854775808.jsonl.gz"},
		},
		"huge indexes, named as files, read by value": {
			files: []string{"fpm.a.18446744073709551615.jsonl.gz", "fpm.a.10000000000000000000.jsonl.gz", "fpm.a.2000000.jsonl.gz"},
			paths: []string{"fpm.a.18446744073709551615.jsonl.gz", "fpm.a.2000000.jsonl.gz", "fpm.a.10000000000000000000.jsonl.gz"},
			want:  []string{"fpm.a.2000000.jsonl.gz", "fpm.a.10000000000000000000.jsonl.gz", "fpm.a.18446744073709551615.jsonl.gz"},
		},
		"non-segment files in the directory are not claimed": {
			files: []string{
				"fpm.a.000000.jsonl.gz",
				"fpm.a.000001.jsonl.gz.tmp", "fpm.a.000001.jsonl.gz.repair.tmp", "fpm.a.0000002.jsonl.gz",
				"fpm.a.00003.jsonl.gz", "fpm.a.000004.jsonl", "fpm.a.18446744073709551616.jsonl.gz",
				"fpm.a:b.000000.jsonl.gz", "fpm.a b.000000.jsonl.gz", "fpm.a.b.000000.jsonl.gz", "fpmx.a.000000.jsonl.gz",
				"fpm.a.000005.jsonl.gz/",
			},
			paths: []string{"fpm.jsonl.gz"},
			want:  []string{"fpm.a.000000.jsonl.gz"},
		},
		"a long id's shortened producer name": {
			files: []string{filepath.Base(tracefile.SegmentPath(tracefile.SegmentPrefix("fpm", longID), 1)), filepath.Base(tracefile.SegmentPath(tracefile.SegmentPrefix("fpm", longID), 0))},
			paths: []string{"fpm"},
			want:  []string{filepath.Base(tracefile.SegmentPath(tracefile.SegmentPrefix("fpm", longID), 0)), filepath.Base(tracefile.SegmentPath(tracefile.SegmentPrefix("fpm", longID), 1))},
		},
		"a named file that is not a segment reads before its prefix's segments": {
			files: []string{"fpm.a.000001.jsonl.gz", "fpm.a.000000.jsonl.gz", "fpm.a"},
			paths: []string{"fpm.a.000001.jsonl.gz", "fpm.a.000000.jsonl.gz", "fpm.a"},
			want:  []string{"fpm.a", "fpm.a.000000.jsonl.gz", "fpm.a.000001.jsonl.gz"},
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range c.files {
				if d, ok := strings.CutSuffix(f, "/"); ok {
					if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
						t.Fatal(err)
					}
					continue
				}
				writeFile(t, dir, f)
			}
			abs := func(names []string) []string {
				var out []string
				for _, n := range names {
					out = append(out, filepath.Join(dir, n))
				}
				return out
			}
			got, err := resolveSegments(abs(c.paths))
			if err != nil {
				t.Fatal(err)
			}
			if want := abs(c.want); !slices.Equal(got, want) {
				t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// Records come out in observed_at_unix_ms order across producers and files; records observed in the
// same millisecond keep the order of the lines (files in read order, lines in file order).
func TestReadTraceOrdersByObservedTimeThenLineOrder(t *testing.T) {
	dir := t.TempDir()
	l := func(p string, obs, counter int64) []byte {
		return line{producer: p, observed: obs, fpm: fpmJSON(t, p, 0, counter)}.bytes()
	}
	writeFile(t, dir, segName("a", 0), gzMember(t, l("a", 10, 1), l("a", 30, 2)), gzMember(t, l("a", 20, 3)))
	writeFile(t, dir, segName("a", 1), gzMember(t, l("a", 30, 4)))
	writeFile(t, dir, segName("b", 0), gzMember(t, l("b", 10, 5), l("b", 5, 6), l("b", 30, 7)))
	rec, err := readTrace([]string{filepath.Join(dir, "fpm")})
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, r := range rec.Records {
		got = append(got, r.CounterID)
	}
	if want := []int64{6, 1, 5, 3, 2, 4, 7}; !slices.Equal(got, want) {
		t.Fatalf("counters in replay order %v, want %v", got, want)
	}
	if r := rec.Records[0]; r.Producer != "b" || r.Namespace != "dynamo" || r.Component != "backend" || r.CaptureMode != schemas.CaptureFull || r.ObservedMs != 5 {
		t.Fatalf("first record %+v", r)
	}
}

// A torn or corrupt tail costs exactly the lines after the last whole member: they are reported with
// the file and the byte offset where the good part ends, and reading goes on with the other files.
func TestReadTraceToleratesTornTails(t *testing.T) {
	l := func(counter int64) []byte {
		return line{producer: "a", observed: counter, fpm: fpmJSON(t, "a", 0, counter)}.bytes()
	}
	m1, m2, m3 := gzMember(t, l(1), l(2)), gzMember(t, l(3)), gzMember(t, l(4), l(5))
	good := int64(len(m1) + len(m2))
	corrupt := bytes.Clone(m3)
	corrupt[len(corrupt)/2] ^= 0xff
	spanning := gzMember(t, l(4)[:50]) // a member ending inside a line, nothing after it
	cases := map[string]struct {
		tail     []byte
		counters []int64
		reason   error
	}{
		"cut in the member's header":  {m3[:5], []int64{1, 2, 3}, io.ErrUnexpectedEOF},
		"cut in the member's body":    {m3[:len(m3)-12], []int64{1, 2, 3}, io.ErrUnexpectedEOF},
		"cut in the member's trailer": {m3[:len(m3)-3], []int64{1, 2, 3}, io.ErrUnexpectedEOF},
		"a corrupt member":            {corrupt, []int64{1, 2, 3}, nil},
		"a member ending in a line":   {spanning, []int64{1, 2, 3}, errTornLine},
		"no damage":                   {m3, []int64{1, 2, 3, 4, 5}, nil},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			torn := writeFile(t, dir, segName("a", 0), m1, m2, c.tail)
			writeFile(t, dir, segName("a", 1), gzMember(t, l(6)))
			rec, err := readTrace([]string{dir})
			if err != nil {
				t.Fatal(err)
			}
			var got []int64
			for _, r := range rec.Records {
				got = append(got, r.CounterID)
			}
			if want := append(slices.Clone(c.counters), 6); !slices.Equal(got, want) {
				t.Fatalf("records %v, want %v", got, want)
			}
			if name == "no damage" {
				if len(rec.Damaged) != 0 {
					t.Fatalf("damaged %+v", rec.Damaged)
				}
				return
			}
			if len(rec.Damaged) != 1 || rec.Damaged[0].File != torn || rec.Damaged[0].Offset != good {
				t.Fatalf("damaged %+v, want %s at byte %d", rec.Damaged, torn, good)
			}
			if c.reason != nil && !strings.Contains(rec.Damaged[0].Reason, c.reason.Error()) {
				t.Fatalf("reason %q, want %q", rec.Damaged[0].Reason, c.reason)
			}
		})
	}
}

// What is not a trace is an error naming the file (and line); a trace record breaking one of its
// rules is counted and skipped, named in the examples.
func TestReadTraceRefusesWhatIsNotATrace(t *testing.T) {
	good := line{producer: "a", observed: 1, fpm: fpmJSON(t, "a", 0, 1)}.bytes()
	bad := bytes.Replace(good, []byte(`"capture_mode":"full"`), []byte(`"capture_mode":"bogus"`), 1)
	dir := t.TempDir()
	plain := writeFile(t, dir, "plain/"+segName("a", 0), good)
	logs := writeFile(t, dir, "logs/"+segName("a", 0), gzMember(t, good, []byte("{\"msg\":\"a log line\"}\n")))
	mixed := writeFile(t, dir, "mixed/"+segName("a", 0), gzMember(t, good, bad, good))

	_, err := readTrace([]string{plain})
	if !errors.Is(err, errNotGzip) || !strings.Contains(err.Error(), plain) {
		t.Fatalf("plain JSONL: %v", err)
	}
	_, err = readTrace([]string{logs})
	var le *lineError
	if !errors.Is(err, errNotTrace) || !errors.As(err, &le) || le.File != logs || le.Line != 2 {
		t.Fatalf("a log line: %v", err)
	}
	rec, err := readTrace([]string{mixed})
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Records) != 2 || rec.Invalid != 1 || !strings.HasPrefix(rec.InvalidExamples[0], mixed+":2: event.capture_mode") {
		t.Fatalf("records %d, invalid %d %q", len(rec.Records), rec.Invalid, rec.InvalidExamples)
	}
	if err := os.WriteFile(mixed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if rec, err = readTrace([]string{mixed}); err != nil || len(rec.Records) != 0 || len(rec.Damaged) != 0 {
		t.Fatalf("an empty segment (a crash before its first flush): %v, %+v", err, rec)
	}
}
