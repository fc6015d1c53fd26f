package bridge

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/streams"
)

// The marker spool: the drop markers a bridge could not store before it stopped, kept in a file for
// the next bridge run with the same spool (Config.MarkerSpool), which publishes them before anything
// else. A drop marker is the only record of what the bridge dropped; the store may refuse writes until
// the very end of a run (a full disk, a lost store, a broker away when a stop runs out of time), and
// the spool carries the record past it, so that the gap detector and `gaps report` still name those
// FPMs.
//
// Invariants:
//   - The spool is removed as soon as every marker it held is acknowledged, so a later crash never
//     publishes them again.
//   - A marker is spooled only when it was not acknowledged (publisher.lost), and the spool is
//     rewritten whole at every stop (fsutil.WriteFileAtomic: the old spool or the new one, never a torn
//     one), holding exactly the markers of this run and of the loaded spool that are still unstored;
//     an empty spool is removed. A bridge killed before its stop leaves the spool as it found it: its
//     markers are published again by the next run, and their Nats-Msg-Id (derived from the range)
//     makes JetStream store each once within the duplicate window.
//   - The spool is read, rewritten and removed only as a regular file (internal/fsutil): a symbolic
//     link, named pipe or directory under its name is refused with an error naming it, and never read,
//     written through or removed; the bridge runs on without it.
//   - A spool line that is not a valid drop marker (a damaged file) is reported and skipped; it never
//     stops the bridge. When the spool cannot be written (the same full disk), each marker is in the
//     error log (`drop marker could not be stored`), the last place it survives.
//
// Ownership: Run loads the spool before the publisher goroutine starts and writes it after the
// publisher goroutine has returned; publisher.lost appends to publisher.unstored and spoolStored
// counts the acknowledged ones, on that goroutine.

// errBadMarkerSpool is wrapped by the errors parseMarkerSpool returns for lines it skips.
var errBadMarkerSpool = errors.New("bridge: bad marker spool line")

// parseMarkerSpool decodes a marker spool: one drop marker (streams.DropMarker JSON) per line. It
// returns every valid marker, in order, and one error per line skipped (naming its number).
func parseMarkerSpool(data []byte) ([]streams.DropMarker, []error) {
	var out []streams.DropMarker
	var errs []error
	for i, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		m, err := streams.ParseDropMarker(line)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w %d: %v", errBadMarkerSpool, i+1, err))
			continue
		}
		out = append(out, m)
	}
	return out, errs
}

// loadMarkerSpool reads Config.MarkerSpool and returns its markers as items to publish first.
func (b *Bridge) loadMarkerSpool() []*item {
	path := b.cfg.MarkerSpool
	if path == "" {
		return nil
	}
	// The spool is read before the publisher starts: a named pipe under its name would hold the bridge
	// there, and a symbolic link would publish someone else's file as drop markers. Both are refused.
	data, _, err := fsutil.ReadRegular(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if errors.Is(err, fsutil.ErrNotRegular) {
		b.log.Error("drop marker spool refused: it is not a regular file, so nothing is read from it, and it is left as it is", "spool", path, "error", err)
		return nil
	}
	if err != nil {
		b.log.Error("drop marker spool unreadable: the drops it records are not published", "spool", path, "error", err)
		return nil
	}
	ms, errs := parseMarkerSpool(data)
	for _, err := range errs {
		b.log.Error("drop marker spool: line skipped", "spool", path, "error", err)
	}
	items := make([]*item, 0, len(ms))
	b.spooled = make(map[*item]bool, len(ms))
	for _, m := range ms {
		it := spooledMarkerItem(m)
		items = append(items, it)
		b.spooled[it] = true
	}
	if len(items) > 0 {
		b.log.Warn("publishing the drop markers an earlier run could not store", "spool", path, "markers", len(items))
	}
	return items
}

// spooledMarkerItem is the item of a marker read back from the spool: its message as first built
// (same id, same bridge and epoch).
func spooledMarkerItem(m streams.DropMarker) *item {
	return &item{msg: m.Msg(), kind: kindMarker, slot: -1, key: m.Key, marker: &dropRange{
		key: m.Key, epoch: m.Epoch, first: m.FirstSeq, last: m.LastSeq, count: m.Count, reason: m.Reason,
		firstRecvMs: m.FirstReceivedAtMs, lastRecvMs: m.LastReceivedAtMs,
	}}
}

// spoolStored records that marker item it was acknowledged; once every marker loaded from the spool
// is, the spool is removed.
func (b *Bridge) spoolStored(it *item) {
	if !b.spooled[it] {
		return
	}
	delete(b.spooled, it)
	if len(b.spooled) > 0 {
		return
	}
	if err := fsutil.RemoveRegular(b.cfg.MarkerSpool); err != nil {
		b.log.Error("drop marker spool: cannot remove the spool of markers now stored; they will be published again", "spool", b.cfg.MarkerSpool, "error", err)
		return
	}
	b.log.Info("the drop markers of the spool are stored; spool removed", "spool", b.cfg.MarkerSpool)
}

// writeMarkerSpool replaces Config.MarkerSpool with the markers left unstored (removes it when there
// are none).
func (b *Bridge) writeMarkerSpool(unstored []*item) {
	path := b.cfg.MarkerSpool
	if path == "" {
		return
	}
	if len(unstored) == 0 {
		err := fsutil.RemoveRegular(path)
		switch {
		case errors.Is(err, fsutil.ErrNotRegular):
			b.log.Error("drop marker spool refused: it is not a regular file, and it is left as it is", "spool", path, "error", err)
		case err != nil:
			b.log.Error("drop marker spool: cannot remove the spool of markers now stored; they will be published again", "spool", path, "error", err)
		}
		return
	}
	var sb strings.Builder
	var fpms uint64
	for _, it := range unstored {
		sb.Write(bytes.TrimSpace(it.msg.Data))
		sb.WriteByte('\n')
		fpms += it.marker.count
	}
	if err := fsutil.WriteFileAtomic(path, []byte(sb.String()), 0o600); err != nil {
		b.log.Error("drop marker spool cannot be written: the drops of the markers not stored are only in this log",
			"spool", path, "markers", len(unstored), "fpms", fpms, "error", err)
		return
	}
	b.log.Error("drop markers not stored before the stop were spooled; the next run with this spool publishes them",
		"spool", path, "markers", len(unstored), "fpms", fpms)
}
