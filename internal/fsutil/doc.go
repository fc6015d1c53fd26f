// Package fsutil holds the file helpers every fpmbus stage that writes files shares: directory fsync
// and atomic replacement of a whole file; and the reader of files of gzip members holding whole lines
// (trace segments) that the trace writer and replay share. It is the one copy of them; consumers,
// schemas and replay call it rather than keeping their own.
//
// Invariants:
//   - WriteFileAtomic and WriteAtomic leave either the old file or the complete new one at path, never
//     a torn one, across a crash at any point: the new content is written to a temporary file in the
//     same directory, fsynced, renamed over path, and then the directory is fsynced so the rename
//     itself is durable.
//   - A failed write removes its temporary file; only a crash can leave one behind. Its name is
//     "<base>.tmp-<random>" unless the caller chose a fixed one with TempPath (so that it can find and
//     remove leftovers by name at its next start).
//   - ScanGzipLines hands on a line only once the gzip member that ends it is complete and ends with a
//     newline, so a torn or corrupt tail costs exactly the lines after the last good member; it says
//     where those begin (GzipLinesScan.Good) and never fails on damage.
package fsutil
