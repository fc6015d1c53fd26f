package replay

import (
	"github.com/fpmbus/fpmbus/internal/fsutil"
)

// Reading one segment. A segment is a sequence of gzip members (Dynamo's writer and fpmbus's append one
// per flush), each ending with a whole line, except possibly the last after a crash. Lines are
// delivered only once the member that ends them is complete, so a torn or corrupt tail costs exactly
// the lines after the last good member, and the reader (fsutil.ScanGzipLines, shared with the trace
// writer's repair) says where that is.

// maxMemberBytes bounds what one gzip member may decompress to (a guard against decompression bombs:
// writers flush members of about 1 MiB, or one oversized line). A variable so that the fuzz test can
// lower it.
var maxMemberBytes = 64 << 20

// Errors carried in a segmentDamage's cause, next to gzip's own and io.ErrUnexpectedEOF.
var (
	// errTornLine: the data ends inside a line (no trailing newline).
	errTornLine = fsutil.ErrTornLine
	// errMemberTooLarge: a gzip member decompresses to more than the reader accepts.
	errMemberTooLarge = fsutil.ErrMemberTooLarge
)

// scanSegment calls fn with every line of data (the bytes of one segment; newline stripped; the slice
// is valid during the call only) and returns nil, fn's error, or a *Damage when the data has a torn
// or corrupt tail: fn has then seen exactly the lines before Damage.Offset.
func scanSegment(file string, data []byte, fn func(line []byte) error) (*Damage, error) {
	res, err := fsutil.ScanGzipLines(data, maxMemberBytes, fn)
	if err != nil || res.Damage == nil {
		return nil, err
	}
	return &Damage{File: file, Offset: res.Good, Reason: res.Damage.Error()}, nil
}
