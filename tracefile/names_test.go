package tracefile

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestSanitizeProducerID(t *testing.T) {
	for name, tc := range map[string]struct{ in, want string }{
		"clean id is kept":                {"4192", "4192"},
		"dash and underscore are kept":    {"w-1_a", "w-1_a"},
		"slash and colon become _":        {"worker/a:b", "worker_a_b"},
		"dots and spaces become _":        {"a.b c", "a_b_c"},
		"empty becomes unknown":           {"", "unknown"},
		"one _ per non-ASCII character":   {"wörker", "w_rker"},
		"invalid UTF-8 byte is one _":     {"a\xffb", "a_b"},
		"wildcards cannot reach the name": {"*>", "__"},
		"path separators cannot escape":   {"../../etc/passwd", "______etc_passwd"},
		"NUL and newline become _":        {"a\x00b\nc", "a_b_c"},
		"percent-encoding is not decoded": {"w%2F1", "w_2F1"},
	} {
		t.Run(name, func(t *testing.T) {
			got := SanitizeProducerID(tc.in)
			if got != tc.want {
				t.Fatalf("SanitizeProducerID(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if SanitizeProducerID(got) != got || !isSanitizedProducerID(got) {
				t.Fatalf("SanitizeProducerID(%q) = %q is not a fixed point", tc.in, got)
			}
		})
	}
}

func TestTraceSegmentPrefixAndPath(t *testing.T) {
	for name, tc := range map[string]struct{ path, producer, prefix string }{
		"upstream example":         {"/tmp/dynamo-fpm.jsonl.gz", "worker/a:b", "/tmp/dynamo-fpm.worker_a_b"},
		"default path":             {"/tmp/dynamo-fpm", "4192", "/tmp/dynamo-fpm.4192"},
		".jsonl is stripped":       {"/data/trace.jsonl", "w", "/data/trace.w"},
		".gz alone is kept":        {"/data/trace.gz", "w", "/data/trace.gz.w"},
		"only the last suffix":     {"/d/x.jsonl.gz.jsonl", "w", "/d/x.jsonl.gz.w"},
		"empty producer":           {"/d/t", "", "/d/t.unknown"},
		"relative path":            {"trace", "w", "trace.w"},
		"dots in directory stay":   {"/a.jsonl/t", "w", "/a.jsonl/t.w"},
		"suffix only is stripped":  {".jsonl.gz", "w", ".w"},
		"producer with dots in it": {"/d/t", "a.b", "/d/t.a_b"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := SegmentPrefix(tc.path, tc.producer); got != tc.prefix {
				t.Fatalf("SegmentPrefix(%q, %q) = %q, want %q", tc.path, tc.producer, got, tc.prefix)
			}
		})
	}
	for name, tc := range map[string]struct {
		prefix string
		index  uint64
		want   string
	}{
		"six digits, zero padded":       {"/tmp/dynamo-fpm.w", 1, "/tmp/dynamo-fpm.w.000001.jsonl.gz"},
		"seven digits, no padding":      {"/t.w", 1234567, "/t.w.1234567.jsonl.gz"},
		"nineteen digits":               {"/t.w", 1_000_000_000_000_000_000, "/t.w.1000000000000000000.jsonl.gz"},
		"the largest index (20 digits)": {"t.w", ^uint64(0), "t.w.18446744073709551615.jsonl.gz"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := SegmentPath(tc.prefix, tc.index); got != tc.want {
				t.Fatalf("SegmentPath(%q, %d) = %q, want %q", tc.prefix, tc.index, got, tc.want)
			}
		})
	}
}

// Producer ids too long for a file name: Dynamo's sanitized name is kept whenever the segment's file
// name fits NAME_MAX (255 bytes, index and suffix included); a longer one is cut and ends with "-" and
// 16 hex digits of the SHA-256 of the full id. With output base "trace" (5 bytes) the sanitized id can
// take 233 bytes.
func TestTraceProducerFileName(t *testing.T) {
	const out = "/data/trace.jsonl.gz"
	hashed := func(id string) string {
		sum := sha256.Sum256([]byte(id))
		return SanitizeProducerID(id)[:233-17] + "-" + hex.EncodeToString(sum[:8])
	}
	long300a, long300b := strings.Repeat("a", 299)+"1", strings.Repeat("a", 299)+"2"
	for name, tc := range map[string]struct{ id, want string }{
		"short: Dynamo's name":                       {"worker/a:b", "worker_a_b"},
		"233 characters: the longest name that fits": {strings.Repeat("w", 233), strings.Repeat("w", 233)},
		"234 characters: shortened":                  {strings.Repeat("w", 234), hashed(strings.Repeat("w", 234))},
		"300 characters, ending in 1":                {long300a, hashed(long300a)},
		"300 characters, ending in 2: another file":  {long300b, hashed(long300b)},
		"4,100 characters":                           {strings.Repeat("x/", 2050), hashed(strings.Repeat("x/", 2050))},
		"233 two-byte characters: 233 '_', it fits":  {strings.Repeat("é", 233), strings.Repeat("_", 233)},
		"234 two-byte characters: shortened":         {strings.Repeat("é", 234), hashed(strings.Repeat("é", 234))},
		"234 characters sanitizing alike stay apart": {strings.Repeat("ü", 234), hashed(strings.Repeat("ü", 234))},
	} {
		t.Run(name, func(t *testing.T) {
			got := producerFileName(out, tc.id)
			if got != tc.want {
				t.Fatalf("ProducerFileName(%d-byte id) = %q, want %q", len(tc.id), got, tc.want)
			}
			seg := filepath.Base(SegmentPath(SegmentPrefix(out, tc.id), 999999))
			if len(seg) > 255 {
				t.Fatalf("segment name of %d bytes: %s", len(seg), seg)
			}
			if !isSanitizedProducerID(got) {
				t.Fatalf("%q is not a file name Producers recognises", got)
			}
		})
	}
	if producerFileName(out, long300a) == producerFileName(out, long300b) ||
		producerFileName(out, strings.Repeat("é", 234)) == producerFileName(out, strings.Repeat("ü", 234)) {
		t.Fatal("long ids that share their sanitized beginning share a file")
	}
	// The budget is the output base name's: a longer base leaves less.
	if got := producerFileName("/d/"+strings.Repeat("b", 100), strings.Repeat("w", 200)); len(got) != 255-17-100 {
		t.Fatalf("with a 100-byte base: a %d-byte producer name, want %d", len(got), 255-17-100)
	}
	// The longest output base name leaves 8 characters of the id before its hash.
	base := "/d/" + strings.Repeat("b", MaxOutputBaseName)
	if got := producerFileName(base, strings.Repeat("w", 300)); got[:9] != "wwwwwwww-" || len(got) != 8+17 {
		t.Fatalf("with the longest base: producer name %q", got)
	}
}

// The index rule is Dynamo's (jsonl_gz.rs segment_index): at least six ASCII digits, a u64, and the
// name exactly as segment_path writes that index.
func TestTraceSegmentIndex(t *testing.T) {
	for name, tc := range map[string]struct {
		base, file string
		want       uint64
		ok         bool
	}{
		"index 0":                             {"t.w", "t.w.000000.jsonl.gz", 0, true},
		"six digits":                          {"t.w", "t.w.999999.jsonl.gz", 999999, true},
		"seven digits":                        {"t.w", "t.w.1000000.jsonl.gz", 1000000, true},
		"eighteen digits":                     {"t.w", "t.w.999999999999999999.jsonl.gz", 999999999999999999, true},
		"nineteen digits":                     {"t.w", "t.w.1000000000000000000.jsonl.gz", 1000000000000000000, true},
		"above int64":                         {"t.w", "t.w.9223372036854775808.jsonl.gz", 1 << 63, true},
		"the largest u64 (20 digits)":         {"t.w", "t.w.18446744073709551615.jsonl.gz", ^uint64(0), true},
		"one above the largest u64":           {"t.w", "t.w.18446744073709551616.jsonl.gz", 0, false},
		"twenty-one digits":                   {"t.w", "t.w.100000000000000000000.jsonl.gz", 0, false},
		"five digits":                         {"t.w", "t.w.00001.jsonl.gz", 0, false},
		"seven digits with a leading zero":    {"t.w", "t.w.0000001.jsonl.gz", 0, false},
		"a sign":                              {"t.w", "t.w.+00001.jsonl.gz", 0, false},
		"a hex digit":                         {"t.w", "t.w.00000a.jsonl.gz", 0, false},
		"a non-ASCII digit":                   {"t.w", "t.w.00000٣.jsonl.gz", 0, false},
		"another producer starting like ours": {"t.w", "t.w1.000001.jsonl.gz", 0, false},
		"a producer part inside ours":         {"t.w", "t.w.x.000001.jsonl.gz", 0, false},
		"only .jsonl":                         {"t.w", "t.w.000001.jsonl", 0, false},
		"a temporary sibling":                 {"t.w", "t.w.000001.jsonl.gz.tmp", 0, false},
		"a repair leftover":                   {"t.w", "t.w.000001.jsonl.gz.repair.tmp", 0, false},
		"an empty base":                       {"", ".000003.jsonl.gz", 3, true},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := segmentIndex(tc.base, tc.file)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("SegmentIndex(%q, %q) = %d, %v; want %d, %v", tc.base, tc.file, got, ok, tc.want, tc.ok)
			}
			if ok && SegmentPath(tc.base, got) != tc.file {
				t.Fatalf("SegmentPath(%q, %d) = %q, not the name it was read from", tc.base, got, SegmentPath(tc.base, got))
			}
		})
	}
}

func TestParseTraceSegmentPath(t *testing.T) {
	for name, tc := range map[string]struct {
		path, prefix string
		index        uint64
		ok           bool
	}{
		"absolute":                         {"/d/fpm.w.000002.jsonl.gz", "/d/fpm.w", 2, true},
		"relative":                         {"fpm.w.000002.jsonl.gz", "fpm.w", 2, true},
		"a producer prefix without a base": {"d/w.1000000.jsonl.gz", "d/w", 1000000, true},
		"dots in the directory":            {"/a.b/fpm.w.000002.jsonl.gz", "/a.b/fpm.w", 2, true},
		"the largest index":                {"/d/f.w.18446744073709551615.jsonl.gz", "/d/f.w", ^uint64(0), true},
		"a hidden prefix":                  {"/d/.w.000001.jsonl.gz", "/d/.w", 1, true},
		"an empty prefix name":             {"/d/x/.000001.jsonl.gz", "", 0, false},
		"no prefix at all":                 {"/d/000001.jsonl.gz", "", 0, false},
		"a dot only in the directory":      {"/a.b/000001.jsonl.gz", "", 0, false},
		"an index too large for a u64":     {"/d/f.w.18446744073709551616.jsonl.gz", "", 0, false},
		"a leading zero":                   {"/d/f.w.0000001.jsonl.gz", "", 0, false},
		"not gzip":                         {"/d/f.w.000001.jsonl", "", 0, false},
		"no index":                         {"/d/f.w.jsonl.gz", "", 0, false},
	} {
		t.Run(name, func(t *testing.T) {
			prefix, index, ok := parseSegmentPath(tc.path)
			if prefix != tc.prefix || index != tc.index || ok != tc.ok {
				t.Fatalf("ParseSegmentPath(%q) = %q, %d, %v; want %q, %d, %v", tc.path, prefix, index, ok, tc.prefix, tc.index, tc.ok)
			}
			if ok && SegmentPath(prefix, index) != tc.path {
				t.Fatalf("SegmentPath(%q, %d) != %q", prefix, index, tc.path)
			}
		})
	}
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A directory shared with other producers and other files: a prefix claims exactly its own segments,
// a directory with a segment's name occupies its index, and Producers names only producers whose
// segments are there.
func TestListTraceSegmentsMatchesExactNamesOnly(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "trace.worker1")
	for _, n := range []string{
		"trace.worker1.000000.jsonl.gz",               // ours
		"trace.worker1.000007.jsonl.gz",               // ours
		"trace.worker1.1000000.jsonl.gz",              // ours: 7 digits, as %06d formats 1000000
		"trace.worker1.10000000000000000000.jsonl.gz", // ours: 20 digits, a u64
		"trace.worker1.18446744073709551616.jsonl.gz", // above the largest u64
		"trace.worker10.000001.jsonl.gz",              // another producer whose id starts with ours
		"trace.worker1.0000002.jsonl.gz",              // 7 digits with a leading zero: %06d(2) differs
		"trace.worker1.00003.jsonl.gz",                // 5 digits
		"trace.worker1.000004.jsonl",                  // other suffix
		"trace.worker1.000005.jsonl.gz.tmp",
		"trace.worker1.000006.jsonl.gz.repair.tmp",
		"trace.worker1.00000a.jsonl.gz",
		"trace.worker1.x.000008.jsonl.gz", // producer "worker1.x" cannot exist, never ours
		"other.worker1.000009.jsonl.gz",
		"trace.w%3A1.000001.jsonl.gz", // not a sanitized producer: nobody's
		"trace.000001.jsonl.gz",       // no producer part: not a producer of the output
		"trace.jsonl.gz",
		"README",
	} {
		touch(t, filepath.Join(dir, n))
	}
	if err := os.Mkdir(filepath.Join(dir, "trace.worker1.000011.jsonl.gz"), 0o755); err != nil {
		t.Fatal(err)
	}
	segs, err := ListSegments(prefix)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, s := range segs {
		got = append(got, s.Index)
		if s.Regular != (s.Index != 11) {
			t.Errorf("segment %d: Regular = %v", s.Index, s.Regular)
		}
		if s.Path != SegmentPath(prefix, s.Index) {
			t.Errorf("segment %d: Path = %s", s.Index, s.Path)
		}
	}
	if want := []uint64{0, 7, 11, 1000000, 10000000000000000000}; !slices.Equal(got, want) {
		t.Fatalf("indexes = %v, want %v", got, want)
	}
	next, err := NextSegmentIndex(prefix)
	if err != nil || next != 10000000000000000001 {
		t.Fatalf("NextSegmentIndex = %d, %v; want 10000000000000000001", next, err)
	}
	producers, err := Producers(filepath.Join(dir, "trace.jsonl.gz"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"worker1", "worker10"}; !slices.Equal(producers, want) {
		t.Fatalf("Producers = %v, want %v", producers, want)
	}
}

func TestTraceProducers(t *testing.T) {
	for name, tc := range map[string]struct {
		output   string
		existing []string
		want     []string
	}{
		"empty directory":               {"t.jsonl.gz", nil, []string{}},
		"one producer, many segments":   {"t.jsonl.gz", []string{"t.w.000000.jsonl.gz", "t.w.000001.jsonl.gz"}, []string{"w"}},
		"sorted":                        {"t", []string{"t.b.000000.jsonl.gz", "t.a.000003.jsonl.gz", "t.a-1_x.000000.jsonl.gz"}, []string{"a", "a-1_x", "b"}},
		"a huge index still counts":     {"t", []string{"t.w.18446744073709551615.jsonl.gz"}, []string{"w"}},
		"only non-segment names":        {"t", []string{"t.w.000001.jsonl.gz.tmp", "t.w.00001.jsonl.gz", "t.w.0000001.jsonl.gz", "t.w.000001.jsonl"}, []string{}},
		"another output's producers":    {"t", []string{"u.w.000000.jsonl.gz", "tt.w.000000.jsonl.gz"}, []string{}},
		"odd characters are not ours":   {"t", []string{"t.w:1.000000.jsonl.gz", "t.w 1.000000.jsonl.gz", "t.wö.000000.jsonl.gz"}, []string{}},
		"a nested producer is not ours": {"t", []string{"t.a.b.000000.jsonl.gz"}, []string{}},
		"an empty output base":          {".jsonl.gz", []string{".w.000000.jsonl.gz", ".000000.jsonl.gz"}, []string{"w"}},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for _, n := range tc.existing {
				touch(t, filepath.Join(dir, n))
			}
			got, err := Producers(filepath.Join(dir, tc.output))
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("Producers = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	got, err := Producers(filepath.Join(t.TempDir(), "missing", "t"))
	if err != nil || len(got) != 0 {
		t.Fatalf("missing directory: Producers = %q, %v; want none", got, err)
	}
}

func TestNextTraceSegmentIndex(t *testing.T) {
	for name, tc := range map[string]struct {
		existing []string
		want     uint64
	}{
		"empty directory starts at 0":   {nil, 0},
		"after 0 comes 1":               {[]string{"t.w.000000.jsonl.gz"}, 1},
		"holes are not filled":          {[]string{"t.w.000000.jsonl.gz", "t.w.000003.jsonl.gz"}, 4},
		"other producers do not count":  {[]string{"t.w1.000009.jsonl.gz", "t.w.000001.jsonl.gz"}, 2},
		"non-matching names not count":  {[]string{"t.w.000009.jsonl.gz.tmp", "t.w.000001.jsonl.gz"}, 2},
		"only a different suffix":       {[]string{"t.w.000005.jsonl"}, 0},
		"an index above six digits":     {[]string{"t.w.999999.jsonl.gz"}, 1000000},
		"seven digit index keeps going": {[]string{"t.w.1000000.jsonl.gz"}, 1000001},
		"a nineteen digit index":        {[]string{"t.w.000001.jsonl.gz", "t.w.1000000000000000000.jsonl.gz"}, 1000000000000000001},
		"numeric, not name, order":      {[]string{"t.w.999999.jsonl.gz", "t.w.1000000.jsonl.gz", "t.w.000002.jsonl.gz"}, 1000001},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for _, n := range tc.existing {
				touch(t, filepath.Join(dir, n))
			}
			got, err := NextSegmentIndex(filepath.Join(dir, "t.w"))
			if err != nil || got != tc.want {
				t.Fatalf("NextSegmentIndex = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
	got, err := NextSegmentIndex(filepath.Join(t.TempDir(), "missing", "t.w"))
	if err != nil || got != 0 {
		t.Fatalf("missing directory: NextSegmentIndex = %d, %v; want 0, nil", got, err)
	}
	// The largest index leaves none above it: an error naming the prefix, never a wrap to 0.
	dir := t.TempDir()
	touch(t, SegmentPath(filepath.Join(dir, "t.w"), ^uint64(0)))
	if got, err := NextSegmentIndex(filepath.Join(dir, "t.w")); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "t.w")) ||
		!strings.Contains(err.Error(), strconv.FormatUint(^uint64(0), 10)) {
		t.Fatalf("after the largest index: %d, %v; want an error naming the prefix", got, err)
	}
}
