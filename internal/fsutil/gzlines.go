package fsutil

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
)

// Files of gzip members holding whole lines: trace segments, Dynamo's and fpmbus's, which append one
// member per flush, each ending with a whole line, except possibly the last after a crash.
// ScanGzipLines delivers lines only once the member that ends them is complete, so a torn or corrupt
// tail costs exactly the lines after the last good member, and it says where that is.

var (
	// ErrTornLine: the data ends inside a line (no trailing newline).
	ErrTornLine = errors.New("fsutil: last line is torn (no trailing newline)")
	// ErrMemberTooLarge: a gzip member decompresses to more than the reader accepts.
	ErrMemberTooLarge = errors.New("fsutil: gzip member too large")
)

// GzipLinesScan describes one scanned file of gzip members.
type GzipLinesScan struct {
	// Good is the end of the last member after which the data is line-aligned: everything before it
	// is whole members holding whole lines.
	Good int64
	// GoodLines are the lines before Good; CutLines the whole lines decoded after it (in members that
	// are torn or do not end a line).
	GoodLines, CutLines int
	// Damage, when not nil, says why the data after Good cannot be read (a torn or corrupt member,
	// ErrMemberTooLarge, ErrTornLine) and where it was found.
	Damage error
}

// LooksGzip reports whether data starts as a gzip file does (or is too short to tell).
func LooksGzip(data []byte) bool {
	return !(len(data) >= 1 && data[0] != 0x1f || len(data) >= 2 && data[1] != 0x8b)
}

// ScanGzipLines reads data member by member and calls fn, when not nil, with every line, in order,
// without its newline; the slice is valid during the call only. maxMember bounds what one member may
// decompress to (a guard against decompression bombs). An error from fn stops the scan and is returned
// as is; a damaged tail is not an error but the scan's Damage, and fn has then seen exactly the lines
// before Good.
func ScanGzipLines(data []byte, maxMember int, fn func(line []byte) error) (GzipLinesScan, error) {
	var res GzipLinesScan
	br := bytes.NewReader(data)
	var zr gzip.Reader
	var out []byte // decoded bytes after res.Good: whole lines, then possibly a partial one
	var chunk [32 << 10]byte
	damaged := func(err error) (GzipLinesScan, error) {
		res.CutLines += bytes.Count(out, []byte{'\n'})
		res.Damage = err
		return res, nil
	}
	for br.Len() > 0 {
		start := int64(len(data) - br.Len())
		if err := zr.Reset(br); err != nil {
			if err == io.EOF { // bytes were there: a truncated member header
				err = io.ErrUnexpectedEOF
			}
			return damaged(fmt.Errorf("gzip member at byte %d: %w", start, err))
		}
		zr.Multistream(false)
		for {
			n, err := zr.Read(chunk[:])
			out = append(out, chunk[:n]...)
			if len(out) > maxMember {
				return damaged(fmt.Errorf("gzip member at byte %d: %w (over %d bytes)", start, ErrMemberTooLarge, maxMember))
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				return damaged(fmt.Errorf("gzip member at byte %d: %w", start, err))
			}
		}
		if len(out) > 0 && out[len(out)-1] != '\n' {
			continue // a line spans into the next member: not a safe boundary yet
		}
		for rest := out; len(rest) > 0; {
			i := bytes.IndexByte(rest, '\n')
			if fn != nil {
				if err := fn(rest[:i]); err != nil {
					return res, err
				}
			}
			res.GoodLines++
			rest = rest[i+1:]
		}
		out = out[:0]
		res.Good = int64(len(data) - br.Len())
	}
	if len(out) > 0 {
		return damaged(ErrTornLine)
	}
	return res, nil
}
