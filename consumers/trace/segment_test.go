package trace

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
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
	} {
		t.Run(name, func(t *testing.T) {
			if got := SanitizeProducerID(tc.in); got != tc.want {
				t.Fatalf("SanitizeProducerID(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestSegmentPrefixAndPath(t *testing.T) {
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
	if got, want := SegmentPath("/tmp/dynamo-fpm.w", 1), "/tmp/dynamo-fpm.w.000001.jsonl.gz"; got != want {
		t.Fatalf("SegmentPath = %q, want %q", got, want)
	}
	if got, want := SegmentPath("/t.w", 1234567), "/t.w.1234567.jsonl.gz"; got != want {
		t.Fatalf("SegmentPath = %q, want %q", got, want)
	}
}

// Producer ids too long for a file name: Dynamo's sanitized name is kept whenever the segment's file
// name fits NAME_MAX (255 bytes, index and suffix included); a longer one is cut and ends with "-" and
// 16 hex digits of the SHA-256 of the full id. With output base "trace" (5 bytes) the sanitized id can
// take 233 bytes.
func TestProducerFileName(t *testing.T) {
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
			got := ProducerFileName(out, tc.id)
			if got != tc.want {
				t.Fatalf("ProducerFileName(%d-byte id) = %q, want %q", len(tc.id), got, tc.want)
			}
			seg := filepath.Base(SegmentPath(SegmentPrefix(out, tc.id), 999999))
			if len(seg) > 255 {
				t.Fatalf("segment name of %d bytes: %s", len(seg), seg)
			}
			if SanitizeProducerID(got) != got || strings.Contains(got, ".") {
				t.Fatalf("%q is not a file name Producers recognises", got)
			}
		})
	}
	if ProducerFileName(out, long300a) == ProducerFileName(out, long300b) ||
		ProducerFileName(out, strings.Repeat("é", 234)) == ProducerFileName(out, strings.Repeat("ü", 234)) {
		t.Fatal("long ids that share their sanitized beginning share a file")
	}
	// The budget is the output base name's: a longer base leaves less.
	if got := ProducerFileName("/d/"+strings.Repeat("b", 100), strings.Repeat("w", 200)); len(got) != 255-17-100 {
		t.Fatalf("with a 100-byte base: a %d-byte producer name, want %d", len(got), 255-17-100)
	}
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestListSegmentsMatchesExactNamesOnly(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "trace.worker1")
	for _, n := range []string{
		"trace.worker1.000000.jsonl.gz",  // ours
		"trace.worker1.000007.jsonl.gz",  // ours
		"trace.worker1.1000000.jsonl.gz", // ours: 7 digits, as %06d formats 1000000
		"trace.worker10.000001.jsonl.gz", // another producer whose id starts with ours
		"trace.worker1.0000002.jsonl.gz", // 7 digits with a leading zero: %06d(2) differs
		"trace.worker1.00003.jsonl.gz",   // 5 digits
		"trace.worker1.000004.jsonl",     // other suffix
		"trace.worker1.000005.jsonl.gz.tmp",
		"trace.worker1.000006.jsonl.gz.repair.tmp",
		"trace.worker1.00000a.jsonl.gz",
		"trace.worker1.x.000008.jsonl.gz", // producer "worker1.x" cannot exist, never ours
		"other.worker1.000009.jsonl.gz",
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
	}
	if want := []uint64{0, 7, 11, 1000000}; !slices.Equal(got, want) {
		t.Fatalf("indexes = %v, want %v", got, want)
	}
	next, err := NextSegmentIndex(prefix)
	if err != nil || next != 1000001 {
		t.Fatalf("NextSegmentIndex = %d, %v; want 1000001", next, err)
	}
	producers, err := Producers(filepath.Join(dir, "trace.jsonl.gz"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"worker1", "worker10"}; !slices.Equal(producers, want) {
		t.Fatalf("Producers = %v, want %v", producers, want)
	}
}

func TestNextSegmentIndex(t *testing.T) {
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
}
