package fsutil

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
)

// member is one gzip member holding text.
func member(t *testing.T, text string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write([]byte(text)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestScanGzipLines(t *testing.T) {
	one, two := member(t, "a\nb\n"), member(t, "c\n")
	spanHead, spanTail := member(t, "d\ne"), member(t, "f\n")
	whole := slices.Concat(one, two)
	tests := map[string]struct {
		data       []byte
		maxMember  int
		wantLines  []string
		wantGood   int64
		wantCut    int
		wantDamage error // nil: whole; errors.Is target otherwise
	}{
		"whole members":                {data: whole, maxMember: 1 << 20, wantLines: []string{"a", "b", "c"}, wantGood: int64(len(whole))},
		"a line spanning two members":  {data: slices.Concat(one, spanHead, spanTail), maxMember: 1 << 20, wantLines: []string{"a", "b", "d", "ef"}, wantGood: int64(len(one) + len(spanHead) + len(spanTail))},
		"torn last line":               {data: slices.Concat(one, spanHead), maxMember: 1 << 20, wantLines: []string{"a", "b"}, wantGood: int64(len(one)), wantCut: 1, wantDamage: ErrTornLine},
		"truncated member":             {data: slices.Concat(one, two[:len(two)-3]), maxMember: 1 << 20, wantLines: []string{"a", "b"}, wantGood: int64(len(one)), wantCut: 1, wantDamage: io.ErrUnexpectedEOF},
		"truncated member header":      {data: slices.Concat(one, two[:4]), maxMember: 1 << 20, wantLines: []string{"a", "b"}, wantGood: int64(len(one)), wantDamage: io.ErrUnexpectedEOF},
		"member larger than the limit": {data: slices.Concat(one, member(t, strings.Repeat("x", 64)+"\n")), maxMember: 32, wantLines: []string{"a", "b"}, wantGood: int64(len(one)), wantCut: 1, wantDamage: ErrMemberTooLarge},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var lines []string
			res, err := ScanGzipLines(tc.data, tc.maxMember, func(l []byte) error {
				lines = append(lines, string(l))
				return nil
			})
			if err != nil {
				t.Fatalf("scan: %v", err)
			}
			if !slices.Equal(lines, tc.wantLines) || res.GoodLines != len(tc.wantLines) {
				t.Errorf("lines %q (GoodLines %d), want %q", lines, res.GoodLines, tc.wantLines)
			}
			if res.Good != tc.wantGood || res.CutLines != tc.wantCut {
				t.Errorf("Good %d, CutLines %d; want %d, %d", res.Good, res.CutLines, tc.wantGood, tc.wantCut)
			}
			switch {
			case tc.wantDamage == nil && res.Damage != nil:
				t.Errorf("damage %v, want none", res.Damage)
			case tc.wantDamage != nil && !errors.Is(res.Damage, tc.wantDamage):
				t.Errorf("damage %v, want %v", res.Damage, tc.wantDamage)
			}
		})
	}
}

func TestScanGzipLinesStopsAtTheCallbacksError(t *testing.T) {
	stop := errors.New("stop")
	var seen int
	_, err := ScanGzipLines(member(t, "a\nb\nc\n"), 1<<20, func([]byte) error {
		seen++
		if seen == 2 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || seen != 2 {
		t.Fatalf("err %v after %d lines, want the callback's error after 2", err, seen)
	}
}

func TestLooksGzip(t *testing.T) {
	tests := map[string]struct {
		data []byte
		want bool
	}{
		"gzip":           {data: member(t, "a\n"), want: true},
		"empty":          {data: nil, want: true},
		"first byte":     {data: []byte{0x1f}, want: true},
		"plain text":     {data: []byte("{\"a\":1}\n"), want: false},
		"wrong 2nd byte": {data: []byte{0x1f, 0x00}, want: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := LooksGzip(tc.data); got != tc.want {
				t.Fatalf("LooksGzip = %v, want %v", got, tc.want)
			}
		})
	}
}
