// Package fsutil holds the file helpers every fpmbus stage that writes files shares: directory fsync
// and atomic replacement of a whole file; opening, creating and removing files without following a
// symbolic link and only when they are regular files (regular.go); ownership locks on lock files, taken
// as Dynamo's trace writer takes its prefix lock (lock.go); and the reader of files of gzip members
// holding whole lines (trace segments) that the trace writer and replay share; DiskFull tells a full
// disk, which passes, from a path that cannot be written (diskfull.go). It is the one copy of
// them; consumers, schemas, replay and cmd/fpmbus call it rather than keeping their own.
//
// Invariants:
//   - WriteFileAtomic and WriteAtomic leave either the old file or the complete new one at path, never
//     a torn one, across a crash at any point: the new content is written to a temporary file in the
//     same directory, fsynced, renamed over path, and then the directory is fsynced so the rename
//     itself is durable.
//   - A failed write removes its temporary file; only a crash can leave one behind. Its name is
//     "<base>.tmp-<random>" unless the caller chose a fixed one with TempPath (so that it can find and
//     remove leftovers by name at its next start).
//   - Nothing here writes through a symbolic link, replaces one, or opens a named pipe, directory or
//     device as a file: each is refused with a *NotRegularError naming the path and what is there.
//   - An ownership lock is held exactly as long as its owner holds it open: the kernel drops it when
//     the process ends, so a dead owner's lock is free for its successor, who finds the dead owner's
//     record (Lock.Previous); a live owner's is refused with a *HeldError naming it.
//   - ScanGzipLines hands on a line only once the gzip member that ends it is complete and ends with a
//     newline, so a torn or corrupt tail costs exactly the lines after the last good member; it says
//     where those begin (GzipLinesScan.Good) and never fails on damage.
package fsutil
