package producer

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/internal/invalid"
)

// WriteStats writes one summary line per rank (`fpmbus publish`).
func WriteStats(w io.Writer, stats []RankStats) {
	for _, st := range stats {
		fmt.Fprintf(w, "rank %d %s: sent %d (heartbeats %d), queue drops %d, send drops %d, send errors %d, last seq %d\n",
			st.Rank, st.Endpoint, st.Sent, st.Heartbeats, st.QueueDrops, st.SendDrops, st.SendErrors, st.LastSeq)
	}
}

// SentLog is `fpmbus publish --sent-log`: one JSON line per message libzmq accepted, written as it is
// sent, so that what a run sent can be compared from the outside with what the pipeline stored:
//
//	{"dp_rank":0,"seq":12,"heartbeat":false,"sent_at_unix_ms":1782777601250,"payload":"<base64 msgpack>"}
//
// Each line is one write(2) to a file opened for appending, so a publisher killed with SIGKILL leaves
// every line of the messages it sent but the one in hand, and never a torn line in the middle. Ranks
// write concurrently; the lock keeps lines whole, and per rank they are in sequence order.
type SentLog struct {
	mu   sync.Mutex
	f    *os.File
	line []byte
	err  error
}

// OpenSentLog opens the log for appending, creating it if missing. It is often a file in a shared
// directory (/tmp), so a symbolic link or named pipe under its name is refused, never written through:
// the flag's value is then unusable, as a bad value of any flag is (an invalid.FlagError).
func OpenSentLog(path string) (*SentLog, error) {
	f, err := fsutil.AppendRegular(path, os.O_CREATE, 0o644)
	if errors.Is(err, fsutil.ErrNotRegular) {
		return nil, invalid.Flagf("--sent-log: %v", err)
	}
	if err != nil {
		return nil, fmt.Errorf("--sent-log: %w", err)
	}
	return &SentLog{f: f}, nil
}

// Record writes the line of one message sent (Config.OnSent).
func (l *SentLog) Record(rank int, seq uint64, heartbeat bool, payload []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	b := append(l.line[:0], `{"dp_rank":`...)
	b = strconv.AppendInt(b, int64(rank), 10)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"heartbeat":`...)
	b = strconv.AppendBool(b, heartbeat)
	b = append(b, `,"sent_at_unix_ms":`...)
	b = strconv.AppendInt(b, time.Now().UnixMilli(), 10)
	b = append(b, `,"payload":"`...)
	b = base64.StdEncoding.AppendEncode(b, payload)
	b = append(b, "\"}\n"...)
	l.line = b
	if _, err := l.f.Write(b); err != nil {
		// The log is the publisher's testimony: a gap in it would read as FPMs never sent. Say so once
		// and stop writing rather than leave a log that looks complete.
		l.err = err
		slog.Error("--sent-log: write failed; the log stops here and no longer lists what was sent", "path", l.f.Name(), "seq", seq, "dp_rank", rank, "err", err)
	}
}

// Close closes the log.
func (l *SentLog) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.f.Close(); err != nil && l.err == nil {
		slog.Error("--sent-log: close", "path", l.f.Name(), "err", err)
	}
}

// Err is the write error that stopped the log, nil while it lists every message sent.
func (l *SentLog) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}
