package tracefile

import (
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// What a reader of a trace (`fpmbus trace info`, replay) is given is a list of files and directories;
// it reads them in the order their lines were written. Both readers take that order from here.

// SegmentFilesIn returns the regular files of directory dir whose names end with
// SegmentSuffix, in directory order; the error of a directory that cannot be read is os.ReadDir's.
func SegmentFilesIn(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.Type().IsRegular() && strings.HasSuffix(e.Name(), SegmentSuffix) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out, nil
}

// ReadOrder returns paths without repeats (the first of each kept), in read order: by producer
// prefix (parseSegmentPath; a path that is not a segment's is its own prefix), a name that is not
// a segment's before the segments of its prefix, then by segment index. Paths that tie keep their
// order.
func ReadOrder(paths []string) []string {
	type named struct {
		path, prefix string
		index        uint64
		segment      bool
	}
	seen := make(map[string]bool, len(paths))
	var files []named
	for _, p := range paths {
		if seen[p] {
			continue
		}
		seen[p] = true
		f := named{path: p, prefix: p}
		if prefix, index, ok := parseSegmentPath(p); ok {
			f.prefix, f.index, f.segment = prefix, index, true
		}
		files = append(files, f)
	}
	slices.SortStableFunc(files, func(a, b named) int {
		return cmp.Or(strings.Compare(a.prefix, b.prefix), compareFalseFirst(a.segment, b.segment), cmp.Compare(a.index, b.index))
	})
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = f.path
	}
	return out
}

// compareFalseFirst orders false before true.
func compareFalseFirst(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}
