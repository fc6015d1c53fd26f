package replay

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
)

// Reading one segment. A segment is a sequence of gzip members (Dynamo's writer and fpmbus's append one
// per flush), each ending with a whole line, except possibly the last after a crash. Lines are
// delivered only once the member that ends them is complete, so a torn or corrupt tail costs exactly
// the lines after the last good member, and the reader says where that is.

// maxMemberBytes bounds what one gzip member may decompress to (a guard against decompression bombs:
// writers flush members of about 1 MiB, or one oversized line). A variable so that the fuzz test can
// lower it.
var maxMemberBytes = 64 << 20

// Errors carried in a segmentDamage's cause, next to gzip's own and io.ErrUnexpectedEOF.
var (
	// ErrTornLine: the data ends inside a line (no trailing newline).
	ErrTornLine = errors.New("replay: last line is torn (no trailing newline)")
	// ErrMemberTooLarge: a gzip member decompresses to more than the reader accepts.
	ErrMemberTooLarge = errors.New("replay: gzip member too large")
)

// scanSegment calls fn with every line of data (the bytes of one segment; newline stripped; the slice
// is valid during the call only) and returns nil, fn's error, or a *Damage when the data has a torn
// or corrupt tail: fn has then seen exactly the lines before Damage.Offset.
func scanSegment(file string, data []byte, fn func(line []byte) error) (*Damage, error) {
	br := bytes.NewReader(data)
	var zr gzip.Reader
	var good int64 // end of the last member after which the data is line-aligned
	var out []byte // decoded bytes after good: whole lines, then possibly a partial one
	var chunk [32 << 10]byte
	damage := func(err error) *Damage { return &Damage{File: file, Offset: good, Reason: err.Error()} }
	for br.Len() > 0 {
		start := int64(len(data) - br.Len())
		if err := zr.Reset(br); err != nil {
			if err == io.EOF { // bytes were there: a truncated member header
				err = io.ErrUnexpectedEOF
			}
			return damage(fmt.Errorf("gzip member at byte %d: %w", start, err)), nil
		}
		zr.Multistream(false)
		for {
			n, err := zr.Read(chunk[:])
			out = append(out, chunk[:n]...)
			if len(out) > maxMemberBytes {
				return damage(fmt.Errorf("gzip member at byte %d: %w (over %d bytes)", start, ErrMemberTooLarge, maxMemberBytes)), nil
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				return damage(fmt.Errorf("gzip member at byte %d: %w", start, err)), nil
			}
		}
		if len(out) > 0 && out[len(out)-1] != '\n' {
			continue // a line spans into the next member: not a safe boundary yet
		}
		for rest := out; len(rest) > 0; {
			i := bytes.IndexByte(rest, '\n')
			if err := fn(rest[:i]); err != nil {
				return nil, err
			}
			rest = rest[i+1:]
		}
		out = out[:0]
		good = int64(len(data) - br.Len())
	}
	if len(out) > 0 {
		return damage(ErrTornLine), nil
	}
	return nil, nil
}
