package replay

import (
	"cmp"
	"slices"
	"strconv"
)

// record is one FPM as it was recorded: where it came from, when it was observed, and the fpm object.
type record struct {
	// Namespace, Component and Producer are the trace line's source (from a stream message: its
	// Fpm-Namespace, Fpm-Component and Fpm-Producer headers).
	Namespace, Component, Producer string
	// CaptureMode is the line's capture_mode (schemas.CaptureSampled or CaptureFull; a stream message is
	// full: every FPM is there).
	CaptureMode string
	// ObservedMs is observed_at_unix_ms (a stream message's Fpm-Received-At-Ms): the schedule's clock.
	ObservedMs int64
	// Order is the record's position in its source: line order across the files (in file order) or the
	// stream sequence. It breaks ties between records observed in the same millisecond.
	Order int64
	// WorkerID, DPRank and CounterID are the fpm object's, as recorded.
	WorkerID  string
	DPRank    int64
	CounterID int64
	// Heartbeat: the fpm is an idle heartbeat (wall_time 0, every request count zero).
	Heartbeat bool
	// FPM is the recorded fpm object (canonical JSON, exactly the bytes of the line or message body).
	FPM []byte
}

// Recording is what a source read: the records in schedule order, and what could not be used.
type Recording struct {
	// Records are sorted by ObservedMs, ties by Order: the order they are replayed in.
	Records []record
	// Files are the segment files read, in read order (empty for a stream source).
	Files []string
	// Damaged lists the segments read only up to a torn or corrupt tail.
	Damaged []Damage
	// Invalid counts the lines (or messages) that are dynamo.fpm.trace.v1 records but break one of its
	// rules; InvalidExamples names the first few ("file:line: reason").
	Invalid         int
	InvalidExamples []string
}

// Damage is a segment's torn or corrupt tail: the segment was read up to Offset (the end of its last
// complete gzip member ending with a whole line), and the rest was not used.
type Damage struct {
	File   string `json:"file"`
	Offset int64  `json:"offset"`
	Reason string `json:"reason"`
}

func (d Damage) String() string {
	return d.File + ": read up to byte " + strconv.FormatInt(d.Offset, 10) + ": " + d.Reason
}

// maxExamples bounds the examples kept of each kind of skipped input (all are counted).
const maxExamples = 10

// sortRecords puts records in schedule order: observed time, then source order. The sort is stable
// and total, so the same source always gives the same schedule.
func sortRecords(rs []record) {
	slices.SortStableFunc(rs, func(a, b record) int {
		if c := cmp.Compare(a.ObservedMs, b.ObservedMs); c != 0 {
			return c
		}
		return cmp.Compare(a.Order, b.Order)
	})
}

// interner makes the few distinct strings of a recording (namespaces, producers, worker ids) share
// memory across records.
type interner map[string]string

func (in interner) str(s string) string {
	if v, ok := in[s]; ok {
		return v
	}
	in[s] = s
	return s
}
