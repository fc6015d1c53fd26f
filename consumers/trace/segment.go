package trace

import "github.com/fpmbus/fpmbus/schemas"

// Segment naming is a rule of the dynamo.fpm.trace.v1 format and lives with it in schemas (see
// schemas/trace_files.go: output base, producer file names, <prefix>.<index:06>.jsonl.gz, which files
// belong to a prefix), so that replay reads by the same rule the trace writer writes by. The names
// below are the trace writer's for that rule, used by its files and by cmd/fpmbus.

// SegmentSuffix ends every segment file name.
const SegmentSuffix = schemas.TraceSegmentSuffix

// maxOutputBaseName is the longest output base name Config.Validate accepts: it leaves room for a
// shortened producer name of at least 8 characters.
const maxOutputBaseName = schemas.MaxTraceOutputBaseName

// Segment is one segment file found on disk.
type Segment = schemas.TraceSegment

// SanitizeProducerID maps a producer id to the form used in file names (schemas.SanitizeProducerID).
func SanitizeProducerID(id string) string { return schemas.SanitizeProducerID(id) }

// ProducerFileName is the producer part of the segment file names of producer id under outputPath
// (schemas.TraceProducerFileName).
func ProducerFileName(outputPath, id string) string {
	return schemas.TraceProducerFileName(outputPath, id)
}

// OutputBase strips a trailing ".jsonl.gz" or ".jsonl" from Dynamo's output path.
func OutputBase(outputPath string) string { return schemas.TraceOutputBase(outputPath) }

// SegmentPrefix is the prefix of one producer's segments under outputPath.
func SegmentPrefix(outputPath, producerID string) string {
	return schemas.TraceSegmentPrefix(outputPath, producerID)
}

// SegmentPath is the file of segment index under prefix.
func SegmentPath(prefix string, index uint64) string { return schemas.TraceSegmentPath(prefix, index) }

// ListSegments returns the segments of prefix, oldest (lowest index) first. A missing directory
// means no segments.
func ListSegments(prefix string) ([]Segment, error) { return schemas.ListTraceSegments(prefix) }

// NextSegmentIndex is the index a new writer of prefix starts at: the highest existing index + 1
// (holes are not filled), or 0.
func NextSegmentIndex(prefix string) (uint64, error) { return schemas.NextTraceSegmentIndex(prefix) }

// Producers returns the producer file names (ProducerFileName) that have segments under outputPath,
// sorted; another writer's files that share the directory are not claimed.
func Producers(outputPath string) ([]string, error) { return schemas.TraceProducers(outputPath) }
